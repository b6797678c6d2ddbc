//! AUTH and TLS against a real `redis-server` started by each test: `--requirepass`, an ACL user,
//! and `--tls-port` with a CA, a server and a client certificate made by the test (`openssl`).
//! Needs the `tls` feature (rustls) and a `redis-server` built with TLS (Debian's is).

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tollgate_core::Quota;
use tollgate_redis::{
    ConnectOptions, Error, RedisConfig, RedisLimiter, Secret, TlsFiles, connect_with,
};

/// A `redis-server` with extra arguments, killed (by its PID) on drop.
struct Server {
    child: Child,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("no free loopback port")
        .port()
}

impl Server {
    /// Listening on `port` (a TCP accept is the readiness check: PING needs AUTH here).
    fn start(port: u16, args: &[&str]) -> Server {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not listen");
            std::thread::sleep(Duration::from_millis(10)); // polling for readiness, not a race
        }
        Server { child }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn config() -> RedisConfig {
    RedisConfig::default()
        .with_prefix("auth:")
        .with_timeout(Duration::from_secs(2))
}

/// One check through a limiter on a connection made with `options`.
async fn check(url: &str, options: &ConnectOptions) -> Result<bool, Error> {
    let conn = connect_with(url, options, &config())?;
    let limiter = RedisLimiter::gcra(conn, Quota::per_second(10).unwrap(), config()).unwrap();
    limiter.try_check("k", 1).await.map(|d| d.is_allowed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_and_an_acl_user_authenticate() {
    let port = free_port();
    let p = port.to_string();
    let _server = Server::start(
        port,
        &[
            "--port",
            &p,
            "--requirepass",
            "s3cret-pass",
            "--user",
            "limiter",
            "on",
            ">acl-pass",
            "~auth:*",
            "+@all",
        ],
    );
    let url = format!("redis://127.0.0.1:{port}/");
    // No password: refused (an error the fault policy would answer, not a decision).
    assert!(check(&url, &ConnectOptions::default()).await.is_err());
    let wrong = ConnectOptions {
        password: Some(Secret::new("nope")),
        ..Default::default()
    };
    assert!(check(&url, &wrong).await.is_err());
    let password = ConnectOptions {
        password: Some(Secret::new("s3cret-pass")),
        ..Default::default()
    };
    assert!(check(&url, &password).await.unwrap());
    let acl = ConnectOptions {
        username: Some("limiter".to_owned()),
        password: Some(Secret::new("acl-pass")),
        tls: None,
    };
    assert!(check(&url, &acl).await.unwrap());
    // The secret never prints.
    for shown in [
        format!("{acl:?}"),
        format!("{}", acl.password.as_ref().unwrap()),
    ] {
        assert!(!shown.contains("acl-pass"), "{shown}");
        assert!(shown.contains("[redacted]"), "{shown}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_comes_from_a_file_or_the_environment() {
    let dir = scratch("secret");
    let file = dir.join("password");
    std::fs::write(&file, "from-file\n").unwrap();
    assert_eq!(Secret::from_file(&file).unwrap().expose(), "from-file");
    let missing = Secret::from_file(dir.join("absent")).unwrap_err();
    assert!(missing.to_string().contains("absent"), "{missing}");
    // A variable the test's environment has (setting one is `unsafe` in edition 2024).
    let path = std::env::var("PATH").unwrap();
    assert_eq!(Secret::from_env("PATH").unwrap().expose(), path);
    let unset = Secret::from_env("TOLLGATE_REDIS_AUTH_TEST_UNSET").unwrap_err();
    assert!(
        unset.to_string().contains("TOLLGATE_REDIS_AUTH_TEST_UNSET"),
        "{unset}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A scratch directory of this test process.
fn scratch(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-auth-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn openssl(dir: &Path, args: &[&str]) {
    let ok = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl must be installed")
        .success();
    assert!(ok, "openssl {args:?}");
}

/// A CA, and a certificate it signed for `name` (IP 127.0.0.1): `<name>.crt`, `<name>.key`.
fn certificates(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=test-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .unwrap();
    for name in ["server", "client"] {
        let (key, csr, crt) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
        );
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                &format!("/CN={name}"),
                "-keyout",
                &key,
                "-out",
                &csr,
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                "ext.cnf",
                "-out",
                &crt,
            ],
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_ca_file_and_a_client_certificate() {
    let dir = scratch("tls");
    certificates(&dir);
    let path = |f: &str| dir.join(f).to_string_lossy().into_owned();
    let port = free_port();
    let p = port.to_string();
    let _server = Server::start(
        port,
        &[
            "--port",
            "0",
            "--tls-port",
            &p,
            "--tls-cert-file",
            &path("server.crt"),
            "--tls-key-file",
            &path("server.key"),
            "--tls-ca-cert-file",
            &path("ca.crt"),
            "--tls-auth-clients",
            "yes",
            "--requirepass",
            "tls-pass",
        ],
    );
    let url = format!("rediss://127.0.0.1:{port}/");
    let files = TlsFiles {
        ca_file: Some(dir.join("ca.crt")),
        client_cert: Some(dir.join("client.crt")),
        client_key: Some(dir.join("client.key")),
    };
    let options = ConnectOptions {
        username: None,
        password: Some(Secret::new("tls-pass")),
        tls: Some(files.clone()),
    };
    assert!(
        check(&url, &options).await.unwrap(),
        "TLS, client certificate and AUTH"
    );
    // Without the client certificate the server refuses the handshake.
    let no_client = ConnectOptions {
        tls: Some(TlsFiles {
            client_cert: None,
            client_key: None,
            ..files.clone()
        }),
        ..options.clone()
    };
    assert!(check(&url, &no_client).await.is_err());
    // Without our CA the server's certificate is not trusted.
    let no_ca = ConnectOptions {
        tls: Some(TlsFiles {
            ca_file: None,
            ..files.clone()
        }),
        ..options.clone()
    };
    assert!(check(&url, &no_ca).await.is_err());
    // TLS files with a plain URL, or half a client certificate: refused before any connection.
    assert!(connect_with(&format!("redis://127.0.0.1:{port}/"), &options, &config()).is_err());
    let half = ConnectOptions {
        tls: Some(TlsFiles {
            client_key: None,
            ..files
        }),
        ..options
    };
    assert!(connect_with(&url, &half, &config()).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}
