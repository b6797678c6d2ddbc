//! TLS and mutual TLS on the gRPC port, with tonic (rustls) clients and a CA made here; the Envoy
//! side is in `tests/envoy.rs`.

mod common;
#[path = "common/pki.rs"]
mod pki;

use std::path::Path;
use std::time::Duration;

use common::{Server, descriptor, request, start_refused, temp_dir};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use pki::{Ca, Issued};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

const DOMAIN: &str = "[[domains]]\nname = \"edge\"\n[domains.policy]\n[[domains.policy.rules]]\n\
    name = \"per_ip\"\nmatch = { remote_address = \"any\" }\nkey = [\"remote_address\"]\n\
    limit = 1000\nperiod = \"1h\"\ncapacity = 100\n";

/// The config: ports 0, file polling off (reloads by SIGHUP), and `tls` as `[server.tls]`.
fn config(tls: &str) -> String {
    format!(
        "[server]\ngrpc = \"127.0.0.1:0\"\nhttp = \"127.0.0.1:0\"\nreload_poll = \"0s\"\n\n\
         [server.tls]\n{tls}\n{DOMAIN}"
    )
}

/// `[server.tls]` naming `server`'s files and, for mutual TLS, `client_ca` (paths relative to the
/// config file's directory, as the config allows).
fn tls_section(server: &Issued, client_ca: Option<&Path>) -> String {
    let name = |p: &Path| p.file_name().unwrap().to_str().unwrap().to_owned();
    let mut text = format!(
        "cert = \"{}\"\nkey = \"{}\"\n",
        name(&server.cert),
        name(&server.key)
    );
    if let Some(ca) = client_ca {
        text.push_str(&format!("client_ca = \"{}\"\n", name(ca)));
    }
    text
}

async fn connect(
    server: &Server,
    trust: &Path,
    identity: Option<&Issued>,
) -> Result<RateLimitServiceClient<Channel>, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(trust).unwrap()))
        .domain_name("localhost");
    if let Some(id) = identity {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(&id.cert).unwrap(),
            std::fs::read(&id.key).unwrap(),
        ));
    }
    let channel = Channel::from_shared(format!("https://{}", server.grpc))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    Ok(RateLimitServiceClient::new(channel))
}

/// One decided call over `client`: its overall code, or the error.
async fn call(client: &mut RateLimitServiceClient<Channel>) -> Result<i32, String> {
    client
        .should_rate_limit(request(
            "edge",
            vec![descriptor(&[("remote_address", "10.0.0.1")])],
            1,
        ))
        .await
        .map(|r| r.into_inner().overall_code)
        .map_err(|e| format!("{e:?}"))
}

/// A call on a fresh connection (TLS 1.3 finishes the client's side of the handshake before the
/// server has checked its certificate, so a refused client may see its connect succeed and the
/// call fail).
async fn fresh_call(
    server: &Server,
    trust: &Path,
    identity: Option<&Issued>,
) -> Result<i32, String> {
    call(&mut connect(server, trust, identity).await?).await
}

fn refused(server: &Server, reason: &str) -> f64 {
    let (_, _, body) = server.http("GET", "/metrics", "");
    body.lines()
        .filter(|l| {
            l.starts_with("tollgate_server_tls_refused_total")
                && l.contains(&format!("reason=\"{reason}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

const OK: i32 = 1;

#[tokio::test]
async fn mutual_tls_admits_a_valid_client_certificate_and_refuses_and_counts_the_rest() {
    let dir = temp_dir("tls-mutual");
    let ca = Ca::new(&dir, "a");
    let other = Ca::new(&dir, "other");
    let server_cert = ca.server("server");
    let path = dir.join("server.toml");
    std::fs::write(&path, config(&tls_section(&server_cert, Some(&ca.cert)))).unwrap();
    let server = Server::start_file(&path);

    let client = ca.client("client");
    assert_eq!(fresh_call(&server, &ca.cert, Some(&client)).await, Ok(OK));

    let none = fresh_call(&server, &ca.cert, None).await;
    assert!(none.is_err(), "no client certificate: {none:?}");
    assert!(refused(&server, "no_client_certificate") >= 1.0);

    let stranger = other.client("client");
    let bad = fresh_call(&server, &ca.cert, Some(&stranger)).await;
    assert!(bad.is_err(), "a certificate from another CA: {bad:?}");
    // At least once: a client may try the handshake again before giving up.
    let strangers = refused(&server, "bad_client_certificate");
    assert!(strangers >= 1.0, "{strangers}");

    // A server certificate is not a client certificate (wrong extended key usage).
    let wrong_usage = fresh_call(&server, &ca.cert, Some(&ca.server("not-client"))).await;
    assert!(wrong_usage.is_err(), "{wrong_usage:?}");
    assert!(refused(&server, "bad_client_certificate") > strangers);

    // A plaintext gRPC client on the TLS port.
    let plain = Channel::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .timeout(Duration::from_secs(10))
        .connect()
        .await;
    if let Ok(channel) = plain {
        let answer = call(&mut RateLimitServiceClient::new(channel)).await;
        assert!(answer.is_err(), "plaintext on the TLS port: {answer:?}");
    }
    assert!(refused(&server, "protocol") >= 1.0);

    // And the valid client still gets its answers.
    assert_eq!(fresh_call(&server, &ca.cert, Some(&client)).await, Ok(OK));
}

#[tokio::test]
async fn server_only_tls_asks_for_no_client_certificate() {
    let dir = temp_dir("tls-server-only");
    let ca = Ca::new(&dir, "a");
    let path = dir.join("server.toml");
    std::fs::write(&path, config(&tls_section(&ca.server("server"), None))).unwrap();
    let server = Server::start_file(&path);
    assert_eq!(fresh_call(&server, &ca.cert, None).await, Ok(OK));
    // A client that does not trust the server's CA gives up on its own side.
    let other = Ca::new(&dir, "other");
    assert!(fresh_call(&server, &other.cert, None).await.is_err());
}

#[tokio::test]
async fn a_reload_gives_new_connections_the_new_certificates_and_a_bad_one_keeps_the_old() {
    let dir = temp_dir("tls-reload");
    let (a, b) = (Ca::new(&dir, "a"), Ca::new(&dir, "b"));
    let path = dir.join("server.toml");
    std::fs::write(
        &path,
        config(&tls_section(&a.server("server"), Some(&a.cert))),
    )
    .unwrap();
    let server = Server::start_file(&path);
    let a_client = a.client("client");
    let mut open = connect(&server, &a.cert, Some(&a_client)).await.unwrap();
    assert_eq!(call(&mut open).await, Ok(OK));

    // Rotate everything to CA b: its server certificate, and b as the client CA.
    let b_server = b.server("server");
    std::fs::write(&path, config(&tls_section(&b_server, Some(&b.cert)))).unwrap();
    server.signal("HUP");
    assert!(
        server
            .wait_log("config reloaded", Duration::from_secs(10))
            .is_some(),
        "reloaded"
    );
    let b_client = b.client("client");
    assert_eq!(fresh_call(&server, &b.cert, Some(&b_client)).await, Ok(OK));
    assert!(
        fresh_call(&server, &a.cert, Some(&a_client)).await.is_err(),
        "new connections get b's certificate and need a client certificate from b"
    );
    assert_eq!(
        call(&mut open).await,
        Ok(OK),
        "a connection opened before the reload keeps its session"
    );

    // A key that does not match the certificate: the reload is refused, b's config stays.
    let stray = b.server("stray");
    std::fs::copy(&stray.key, &b_server.key).unwrap();
    server.signal("HUP");
    let line = server
        .wait_log("reload rejected", Duration::from_secs(10))
        .expect("the bad reload is reported");
    assert!(line.contains("tls"), "{line}");
    assert_eq!(fresh_call(&server, &b.cert, Some(&b_client)).await, Ok(OK));

    // Turning TLS off is a restart, not a reload.
    std::fs::write(
        &path,
        format!("[server]\ngrpc = \"127.0.0.1:0\"\nhttp = \"127.0.0.1:0\"\nreload_poll = \"0s\"\n\n{DOMAIN}"),
    )
    .unwrap();
    server.signal("HUP");
    let line = server
        .wait_log("reload rejected", Duration::from_secs(10))
        .expect("refused");
    assert!(line.contains("restart"), "{line}");
}

#[tokio::test]
async fn the_server_refuses_to_start_on_tls_files_it_cannot_use() {
    let dir = temp_dir("tls-start");
    let ca = Ca::new(&dir, "a");
    let server = ca.server("server");
    let path = dir.join("server.toml");
    let missing = Issued {
        cert: dir.join("missing.pem"),
        key: server.key.clone(),
    };
    std::fs::write(&path, config(&tls_section(&missing, None))).unwrap();
    let (status, stderr) = start_refused(&path);
    assert!(!status.success());
    assert!(stderr.contains("missing.pem"), "{stderr}");
    // A key file with no key in it.
    std::fs::write(
        &path,
        config(&tls_section(
            &Issued {
                cert: server.cert.clone(),
                key: server.cert.clone(),
            },
            None,
        )),
    )
    .unwrap();
    let (status, stderr) = start_refused(&path);
    assert!(!status.success());
    assert!(stderr.contains("private key"), "{stderr}");
}
