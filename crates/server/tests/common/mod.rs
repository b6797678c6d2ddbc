//! Starts `tollgate-server` as a child process on loopback ports chosen by the OS, and stops it by
//! PID on drop.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

/// A running server.
pub struct Server {
    child: Child,
    /// Bound gRPC address.
    pub grpc: SocketAddr,
    /// Bound HTTP address.
    pub http: SocketAddr,
    /// The config file it reads.
    pub config: PathBuf,
    /// Its stderr (logs), collected on a thread.
    pub logs: mpsc::Receiver<String>,
}

/// A fresh temp directory for one test.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-server-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

impl Server {
    /// Writes `config` (TOML, its `[server]` section is prepended with port 0) and starts the server.
    pub fn start(dir: &Path, config: &str) -> Server {
        Self::start_with_args(dir, config, &[])
    }

    /// [`start`](Self::start) with more command-line arguments.
    pub fn start_with_args(dir: &Path, config: &str, args: &[&str]) -> Server {
        let path = dir.join("server.toml");
        std::fs::write(&path, with_ports(config)).expect("write config");
        Self::spawn(&path, args)
    }

    /// Starts the server on an existing file.
    pub fn start_file(path: &Path) -> Server {
        Self::spawn(path, &[])
    }

    fn spawn(path: &Path, args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate-server"))
            .arg("--config")
            .arg(path)
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tollgate-server");
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        let (log_tx, logs) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = log_tx.send(line);
            }
        });
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let (mut grpc, mut http) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(30);
        while grpc.is_none() || http.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match rx.recv_timeout(left) {
                Ok(line) => line,
                Err(_) => {
                    let _ = child.kill();
                    let logs: Vec<String> = logs.try_iter().collect();
                    panic!("server did not print its addresses; logs: {logs:#?}");
                }
            };
            if let Some(a) = line.strip_prefix("grpc listening on ") {
                grpc = a.parse().ok();
            } else if let Some(a) = line.strip_prefix("http listening on ") {
                http = a.parse().ok();
            }
        }
        Server {
            child,
            grpc: grpc.expect("grpc"),
            http: http.expect("http"),
            config: path.to_owned(),
            logs,
        }
    }

    /// A gRPC client.
    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        let channel = Channel::from_shared(format!("http://{}", self.grpc))
            .expect("uri")
            .connect()
            .await
            .expect("connect");
        RateLimitServiceClient::new(channel)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal to the process.
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits (bounded) for the process to exit; its status.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Waits (bounded) for a log line containing `needle`.
    pub fn wait_log(&self, needle: &str, within: Duration) -> Option<String> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.logs.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return Some(line),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }

    /// One HTTP/1.1 request; `(status, headers, body)`.
    pub fn http(&self, method: &str, path: &str, body: &str) -> (u16, String, String) {
        self.http_raw(
            format!(
                "{method} {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes(),
        )
    }

    /// One HTTP/1.1 exchange of exactly `request`'s bytes; `(status, headers, body)`. The bytes are
    /// written on a thread whose write errors are ignored: a server may answer (and close) before
    /// it has read a body it refuses.
    pub fn http_raw(&self, request: Vec<u8>) -> (u16, String, String) {
        let mut stream = std::net::TcpStream::connect(self.http).expect("connect http");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut writer = stream.try_clone().expect("clone stream");
        let written = std::thread::spawn(move || {
            let _ = writer.write_all(&request);
        });
        let mut raw = Vec::new();
        // A reset after the answer (the refused body left unread) ends the read; what came is kept.
        let _ = stream.read_to_end(&mut raw);
        let _ = written.join();
        let out = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, head.to_ascii_lowercase(), body.to_owned())
    }
}

/// Runs the server on `path` expecting it to refuse to start: its exit status and stderr (the
/// process is killed, and the test fails, if it is still running after 30 s).
pub fn start_refused(path: &Path) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate-server"))
        .arg("--config")
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tollgate-server");
    let mut stderr = child.stderr.take().expect("stderr");
    // Reading to the end returns when the process exits (or is killed below).
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server did not exit: it started on {}", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, reader.join().expect("stderr reader"))
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `config` with a `[server]` section on port 0 in front.
pub fn with_ports(config: &str) -> String {
    format!(
        "[server]\ngrpc = \"127.0.0.1:0\"\nhttp = \"127.0.0.1:0\"\nreload_poll = \"100ms\"\n\n{config}"
    )
}

/// A descriptor from `(key, value)` pairs.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A request.
pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: hits,
    }
}
