//! The HTTP side (`POST /v1/check`, `/metrics`, `/healthz`), the gRPC health service, and graceful
//! SIGTERM (the call in flight finishes; HTTP/2 clients see GOAWAY with NO_ERROR).

mod common;

use std::time::Duration;

use common::{Server, descriptor, request, temp_dir};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const CONFIG: &str = r#"
[[domains]]
name = "edge"
[domains.policy]
[[domains.policy.rules]]
name = "per_user"
match = { user = "any" }
key = ["user"]
limit = 2
period = "10s"
capacity = 1000

[[domains]]
name = "inner"
[domains.policy]
[[domains.policy.rules]]
name = "per_user"
match = { user = "any" }
key = ["user"]
limit = 5
period = "10s"
capacity = 1000
"#;

/// The value of the sample of `name` that carries every one of `labels` (any order).
fn sample(metrics: &str, name: &str, labels: &[&str]) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_check_metrics_health_and_sigterm() {
    let dir = temp_dir("ops");
    let mut server = Server::start(&dir, CONFIG);

    let body = r#"{"domain":"edge","descriptors":[{"entries":{"user":"u"}}]}"#;
    let (status, head, json) = server.http("POST", "/v1/check", body);
    assert_eq!(status, 200, "{json}");
    assert!(
        head.contains("ratelimit-policy: \"per_user\";q=2;w=10"),
        "{head}"
    );
    assert!(head.contains("ratelimit: \"per_user\";r=1;t=5"), "{head}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["overall_code"], "OK");
    assert_eq!(v["statuses"][0]["rule"], "per_user");
    assert_eq!(v["statuses"][0]["remaining"], 1);
    assert_eq!(v["headers"]["ratelimit"], "\"per_user\";r=1;t=5");

    // hits_addend 2 on one unit left: 429, with Retry-After; then the JSON error cases.
    let over = r#"{"domain":"edge","descriptors":[{"entries":{"user":"u"},"hits_addend":2}]}"#;
    let (status, head, json) = server.http("POST", "/v1/check", over);
    assert_eq!(status, 429, "{json}");
    assert!(head.contains("retry-after: "), "{head}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["overall_code"], "OVER_LIMIT");
    assert!(v["statuses"][0]["retry_after_ms"].as_u64().unwrap() > 0);
    let (status, _, json) = server.http(
        "POST",
        "/v1/check",
        r#"{"domain":"zzz","descriptors":[{"entries":{"user":"u"}}]}"#,
    );
    assert_eq!(status, 404, "{json}");
    let (status, _, _) = server.http("POST", "/v1/check", "{not json");
    assert_eq!(status, 400);
    let (status, _, json) =
        server.http("POST", "/v1/check", r#"{"domain":"edge","descriptors":[]}"#);
    assert_eq!(status, 400, "{json}");

    // gRPC too, so its counters exist.
    let mut client = server.client().await;
    let r = client
        .should_rate_limit(request("edge", vec![descriptor(&[("user", "g")])], 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
    // Another domain with a rule of the same name: its policy counters are its own.
    let r = client
        .should_rate_limit(request("inner", vec![descriptor(&[("user", "g")])], 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);

    let (status, _, body) = server.http("GET", "/healthz", "");
    assert_eq!((status, body.trim()), (200, "ok"));
    let (status, _, metrics) = server.http("GET", "/metrics", "");
    assert_eq!(status, 200);
    for needle in [
        r#"tollgate_server_requests_total{api="http",domain="edge",code="ok"} 1"#,
        r#"tollgate_server_requests_total{api="http",domain="edge",code="over_limit"} 1"#,
        r#"tollgate_server_requests_total{api="grpc",domain="edge",code="ok"} 1"#,
        r#"tollgate_server_errors_total{api="http",reason="unknown_domain"} 1"#,
        "tollgate_server_decision_seconds",
        // The policy engine's own per-rule counters, through the same recorder.
        "per_user",
    ] {
        assert!(metrics.contains(needle), "missing {needle} in:\n{metrics}");
    }
    let decisions = |domain: &str, outcome: &str| {
        sample(
            &metrics,
            "tollgate_policy_decisions_total",
            &[
                r#"rule="per_user""#,
                &format!(r#"outcome="{outcome}""#),
                &format!(r#"domain="{domain}""#),
            ],
        )
    };
    assert_eq!(decisions("edge", "allowed"), Some(2.0), "{metrics}");
    assert_eq!(decisions("edge", "denied"), Some(1.0), "{metrics}");
    assert_eq!(decisions("inner", "allowed"), Some(1.0), "{metrics}");

    // The standard gRPC health service: the RLS service and the server as a whole.
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let s = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .expect("health")
            .into_inner();
        assert_eq!(s.status, ServingStatus::Serving as i32, "{service:?}");
    }

    // SIGTERM while clients loop: every call either completes with a decision or fails only
    // after shutdown began (connection refused/closed); the process exits 0 and says so.
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let mut loops = Vec::new();
    for i in 0..4 {
        let mut c = client.clone();
        let calls = std::sync::Arc::clone(&calls);
        loops.push(tokio::spawn(async move {
            let mut ok = 0u32;
            for _ in 0..10_000 {
                let user = format!("loop{i}");
                match c
                    .should_rate_limit(request("edge", vec![descriptor(&[("user", &user)])], 1))
                    .await
                {
                    Ok(_) => {
                        ok += 1;
                        // Relaxed: a progress count for the test's own polling; publishes nothing.
                        calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Err(_) => break,
                }
            }
            ok
        }));
    }
    // Signal once the loops are well under way (bounded wait).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    // Relaxed: see above.
    while calls.load(std::sync::atomic::Ordering::Relaxed) < 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "clients made no progress"
        );
        tokio::task::yield_now().await;
    }
    server.signal("TERM");
    let exit = tokio::task::spawn_blocking(move || {
        let exit = server.wait_exit(Duration::from_secs(20));
        let stopped = server.wait_log("stopped", Duration::from_secs(5));
        (exit, stopped)
    })
    .await
    .unwrap();
    let mut total = 0;
    for l in loops {
        total += l.await.unwrap();
    }
    assert!(total > 0, "the clients made calls before SIGTERM");
    let (exit, stopped) = exit;
    assert!(exit.expect("exited within 20 s").success());
    assert!(stopped.is_some(), "logged its graceful stop");
}

/// SIGTERM while a call is in flight, not only between calls: the call is held inside the server
/// (its domain's Redis is a test listener that reads the server's commands and never answers),
/// the signal arrives and the server says it is draining, only then does the listener drop the
/// connection, and the call still gets its decision (the domain's fail-closed answer) before the
/// process exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_call_in_flight_finish() {
    use std::io::Read;
    let stall = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = stall.local_addr().expect("addr").port();
    let config = format!(
        r#"
[[domains]]
name = "slow"
backend = {{ redis = {{ url = "redis://127.0.0.1:{port}/", fail = "closed", fail_retry_after = "7s", timeout = "20s", breaker = {{ failures = 0 }} }} }}
[domains.policy]
descriptor_match = "subset"    # "global" (no match) applies to every descriptor
[[domains.policy.rules]]
name = "global"
limit = 10
period = "1s"
"#
    );
    let dir = temp_dir("sigterm-in-flight");
    let server = Server::start(&dir, &config);
    let mut client = server.client().await;
    let (got_tx, got_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        // The connection is lazy: it is made for our call, so any byte here is our call at work.
        let (mut conn, _) = stall.accept().expect("the server connects");
        let mut buf = [0u8; 1024];
        let n = conn.read(&mut buf).unwrap_or(0);
        let _ = got_tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
        let _ = release_rx.recv();
        drop(conn);
        drop(stall); // a reconnect is refused: the call ends with an outage, not a wait
    });
    let call = tokio::spawn(async move {
        client
            .should_rate_limit(request("slow", vec![descriptor(&[("user", "u")])], 1))
            .await
    });
    let got = tokio::task::spawn_blocking(move || got_rx.recv_timeout(Duration::from_secs(20)))
        .await
        .unwrap()
        .expect("the call reached the backend");
    eprintln!("the backend received: {got:?}");
    assert!(!got.is_empty());
    assert!(!call.is_finished(), "the call is in flight");
    server.signal("TERM");
    let (mut server, draining) = tokio::task::spawn_blocking(move || {
        let line = server.wait_log("finishing in-flight calls", Duration::from_secs(10));
        (server, line)
    })
    .await
    .unwrap();
    assert!(draining.is_some(), "the server got the signal");
    assert!(
        !call.is_finished(),
        "still in flight after the signal was handled"
    );
    release_tx.send(()).unwrap();
    let response = call
        .await
        .unwrap()
        .expect("the in-flight call gets its answer, not a transport error")
        .into_inner();
    assert_eq!(response.overall_code, Code::OverLimit as i32);
    let retry = response
        .response_headers_to_add
        .iter()
        .find(|h| h.key == "retry-after")
        .map(|h| h.value.as_str());
    assert_eq!(retry, Some("7"), "the domain's fail-closed answer");
    let exit = tokio::task::spawn_blocking(move || server.wait_exit(Duration::from_secs(20)))
        .await
        .unwrap();
    assert!(exit.expect("exited after the call").success());
}

/// SIGTERM at the HTTP/2 level, with a raw h2 client: a call whose request is half sent when the
/// signal arrives (so the server holds it open) still completes after the server has said GOAWAY,
/// and that GOAWAY, like every one the connection ends with, carries NO_ERROR (not
/// PROTOCOL_ERROR): h2 reports any other code as the connection's error. The signal comes right
/// after the server is up, so this also shows the handler is installed by then (the process used
/// to install it last, and die undrained on an early SIGTERM).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_sends_goaway_no_error_and_the_call_in_flight_completes() {
    use bytes::{BufMut, Bytes, BytesMut};
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    use prost::Message;

    let dir = temp_dir("sigterm-goaway");
    let server = Server::start(&dir, CONFIG);
    let tcp = tokio::net::TcpStream::connect(server.grpc)
        .await
        .expect("connect");
    let (mut send, mut connection) = h2::client::handshake(tcp).await.expect("handshake");
    let mut ping = connection.ping_pong().expect("ping handle");
    let connection = tokio::spawn(connection);

    let message = request("edge", vec![descriptor(&[("user", "inflight")])], 1).encode_to_vec();
    let mut frame = BytesMut::new();
    frame.put_u8(0);
    frame.put_u32(u32::try_from(message.len()).unwrap());
    frame.put_slice(&message);
    let frame: Bytes = frame.freeze();
    let head = http::Request::builder()
        .method(http::Method::POST)
        .uri(format!(
            "http://{}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            server.grpc
        ))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(())
        .unwrap();
    std::future::poll_fn(|cx| send.poll_ready(cx))
        .await
        .expect("ready");
    let (response, mut body) = send.send_request(head, false).expect("send");
    // Half the message: the server has the stream and waits for the rest.
    body.send_data(frame.slice(..3), false).expect("first half");
    // The server answers a PING after the frames before it: once the PONG is back, it has the
    // stream open.
    ping.ping(h2::Ping::opaque()).await.expect("pong");

    server.signal("TERM");
    let server = tokio::task::spawn_blocking(move || {
        let draining = server.wait_log("finishing in-flight calls", Duration::from_secs(10));
        assert!(draining.is_some(), "the server got the signal");
        server
    })
    .await
    .unwrap();
    // Polls (bounded) until the server's GOAWAY has arrived: the client then refuses new streams
    // with the server's reason.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let goaway = loop {
        match std::future::poll_fn(|cx| send.poll_ready(cx)).await {
            Err(e) => break e,
            Ok(()) => {
                assert!(std::time::Instant::now() < deadline, "no GOAWAY came");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    assert!(
        goaway.is_go_away() && goaway.is_remote(),
        "the server said GOAWAY: {goaway:?}"
    );
    assert_eq!(goaway.reason(), Some(h2::Reason::NO_ERROR), "{goaway:?}");
    assert!(
        !connection.is_finished(),
        "the call in flight holds it open"
    );

    // The rest of the message: the call is decided.
    body.send_data(frame.slice(3..), true).expect("second half");
    let (parts, mut recv) = response.await.expect("the answer").into_parts();
    assert!(parts.status.is_success());
    let mut answer = BytesMut::new();
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.expect("answer body");
        let _ = recv.flow_control().release_capacity(chunk.len());
        answer.extend_from_slice(&chunk);
    }
    let trailers = recv.trailers().await.expect("trailers").expect("trailers");
    assert_eq!(
        trailers.get("grpc-status").map(http::HeaderValue::as_bytes),
        Some(&b"0"[..])
    );
    let decided = RateLimitResponse::decode(&answer[5..]).expect("a response");
    assert_eq!(decided.overall_code, Code::Ok as i32);

    // Then the connection closes gracefully: Ok means the last GOAWAY was NO_ERROR on both sides.
    drop(send);
    let closed = tokio::time::timeout(Duration::from_secs(10), connection)
        .await
        .expect("the connection closes")
        .unwrap();
    assert!(closed.is_ok(), "{closed:?}");
    let mut server = server;
    let exit = tokio::task::spawn_blocking(move || server.wait_exit(Duration::from_secs(20)))
        .await
        .unwrap();
    assert!(exit.expect("exited after the call").success());
}

/// SIGTERM while health watchers are connected (`Watch` streams, which have no end of their own):
/// each is told NOT_SERVING, then its stream ends, and the process exits. Before, the graceful
/// shutdown waited on the open streams for as long as their clients kept them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_health_watches_and_exits() {
    let dir = temp_dir("sigterm-watch");
    let server = Server::start(&dir, CONFIG);
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut watches = Vec::new();
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let mut stream = HealthClient::new(channel.clone())
            .watch(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .expect("watch")
            .into_inner();
        let first = stream.message().await.expect("status").expect("a status");
        assert_eq!(first.status, ServingStatus::Serving as i32, "{service:?}");
        watches.push((service, stream));
    }
    server.signal("TERM");
    for (service, mut stream) in watches {
        let next = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("told within 10 s")
            .expect("a status")
            .expect("not yet ended");
        assert_eq!(next.status, ServingStatus::NotServing as i32, "{service:?}");
        let end = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("ended within 10 s");
        assert!(matches!(end, Ok(None)), "{service:?}: {end:?}");
    }
    let mut server = server;
    let exit = tokio::task::spawn_blocking(move || server.wait_exit(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(exit.expect("exited with the watchers connected").success());
}
