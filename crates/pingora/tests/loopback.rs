//! A real HTTP client through a Pingora proxy (in-process, free loopback port) to an upstream
//! started here that counts what reaches it: per-client limits, well-formed 429s, and no denied
//! request at the upstream; a two-stage rule's delay held before the request goes upstream.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pingora_core::server::Server;
use pingora_proxy::http_proxy_service;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate_http::ClientIp;
use tollgate_pingora::{PingoraLimiter, SingleUpstreamProxy};
use tollgate_policy::{Policy, PolicyConfig};

const POLICY: &str = r#"
[[rules]]
name = "per_client"
match = { remote_address = "any" }
key = ["remote_address"]
limit = 3
period = "60s"
capacity = 1024

[[rules]]
name = "paced"
match = { remote_address = "any", route = { prefix = "/paced" } }
key = ["remote_address"]
limit = 1
period = "2s"
capacity = 1024
delay = { max_delay = "4s" }
"#;

/// A tiny HTTP/1.1 upstream: answers every request `200 ok` and counts them.
async fn upstream(count: Arc<AtomicU64>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let count = Arc::clone(&count);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut have = 0;
                loop {
                    let Ok(n) = sock.read(&mut buf[have..]).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    have += n;
                    while let Some(end) = buf[..have].windows(4).position(|w| w == b"\r\n\r\n") {
                        // Relaxed: a counter read after the client saw the responses.
                        count.fetch_add(1, Ordering::Relaxed);
                        buf.copy_within(end + 4..have, 0);
                        have -= end + 4;
                        let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if sock.write_all(reply).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_per_client_and_upstream_never_sees_denials() {
    let seen = Arc::new(AtomicU64::new(0));
    let upstream_addr = upstream(Arc::clone(&seen)).await;
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let policy =
        Arc::new(Policy::new(PolicyConfig::from_toml(POLICY).expect("config")).expect("policy"));
    let limiter = PingoraLimiter::new(
        policy,
        ClientIp::trusting(["127.0.0.0/8".parse().expect("net")]),
    );
    let proxy_listen = listen.clone();
    // The proxy runs in-process for the rest of the test binary's life (Pingora's server owns its
    // own runtime and never returns); it is gone when the test process exits.
    std::thread::spawn(move || {
        let mut server = Server::new(None).expect("server");
        server.bootstrap();
        let mut service = http_proxy_service(
            &server.configuration,
            SingleUpstreamProxy::new(limiter, upstream_addr),
        );
        service.add_tcp(&proxy_listen);
        server.add_service(service);
        server.run_forever();
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(&listen).await.is_err() {
        assert!(Instant::now() < deadline, "proxy did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let client = reqwest::Client::new();
    let url = format!("http://{listen}/x");
    let mut admitted = [0u64; 2];
    for round in 0..5 {
        for (i, ip) in ["198.51.100.1", "198.51.100.2"].iter().enumerate() {
            let resp = client
                .get(&url)
                .header("x-forwarded-for", *ip)
                .send()
                .await
                .expect("request");
            let status = resp.status().as_u16();
            let headers = resp.headers().clone();
            let ratelimit = headers
                .get("ratelimit")
                .expect("ratelimit")
                .to_str()
                .expect("ascii")
                .to_owned();
            assert_eq!(
                headers.get("ratelimit-policy").expect("policy"),
                "\"per_client\";q=3;w=60"
            );
            if round < 3 {
                assert_eq!(status, 200, "round {round} client {ip}");
                assert!(
                    ratelimit.starts_with(&format!("\"per_client\";r={};t=", 2 - round)),
                    "{ratelimit}"
                );
                admitted[i] += 1;
            } else {
                assert_eq!(status, 429, "round {round} client {ip}");
                let retry: u64 = headers
                    .get("retry-after")
                    .expect("retry-after")
                    .to_str()
                    .expect("ascii")
                    .parse()
                    .expect("secs");
                assert!((1..=60).contains(&retry), "{retry}");
                assert_eq!(ratelimit, format!("\"per_client\";r=0;t={retry}"));
                let body = resp.text().await.expect("body");
                assert_eq!(
                    body,
                    format!(r#"{{"error":"rate limit exceeded","retry_after":{retry}}}"#)
                );
            }
        }
    }
    assert_eq!(admitted, [3, 3]);
    // Relaxed: every upstream response was read by the client before this load.
    assert_eq!(
        seen.load(Ordering::Relaxed),
        6,
        "the upstream saw exactly the admitted requests"
    );

    // One request per 2 s on /paced, later ones held up to 4 s: the second is admitted after the
    // proxy holds it for the rest of the 2 s (less the time since the first; 1 s is a margin).
    let paced = format!("http://{listen}/paced");
    for held in [false, true] {
        let started = Instant::now();
        let resp = client
            .get(&paced)
            .header("x-forwarded-for", "198.51.100.3")
            .send()
            .await
            .expect("request");
        assert_eq!(resp.status(), 200);
        if held {
            assert!(
                started.elapsed() >= Duration::from_secs(1),
                "held {:?}",
                started.elapsed()
            );
        }
    }
    // Relaxed: as above.
    assert_eq!(seen.load(Ordering::Relaxed), 8, "both went upstream");
}
