//! `PingoraSettle` end to end: a real HTTP client through two in-process Pingora proxies (free
//! loopback ports; one settles from a response header, one counts a server-sent-event body) to an
//! upstream shaped like an LLM API, with a per-tenant budget of 10 000 tokens per minute on a
//! `ManualClock` (no refill during the test, so every `RateLimit` value is exact):
//!
//! * the surplus of an estimate comes back, a longer response is charged, a malformed usage header
//!   settles at the estimate;
//! * a stream's tokens are counted as it passes (the body unchanged), an overrun puts the tenant
//!   into debt and its next request is refused before the upstream;
//! * a client that leaves mid-stream settles at the estimate (Pingora's logging phase);
//! * 100 requests of random sizes: the tokens settled are exactly what the state shows.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use http::HeaderName;
use pingora_core::server::Server;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_http::ResponseHeader;
use pingora_proxy::{ProxyHttp, Session, http_proxy_service};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate_core::ManualClock;
use tollgate_http::{ActualCost, ClientIp, DescriptorNames, Settled, SseMeter, Usage};
use tollgate_pingora::{PingoraSettle, SettleCtx};
use tollgate_policy::{Policy, PolicyConfig};

const POLICY: &str = r#"
[[rules]]
name = "tokens_per_tenant"
match = { tenant = "any" }
key = ["tenant"]
limit = 10000
period = "1m"
capacity = 1024
"#;

/// A proxy whose filters are `PingoraSettle`'s: the wiring a user's `ProxyHttp` does.
struct SettleProxy {
    settle: PingoraSettle<ManualClock>,
    upstream: String,
}

#[async_trait]
impl ProxyHttp for SettleProxy {
    type CTX = SettleCtx;

    fn new_ctx(&self) -> SettleCtx {
        SettleCtx::default()
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut SettleCtx,
    ) -> pingora_core::Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(
            self.upstream.as_str(),
            false,
            String::new(),
        )))
    }

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut SettleCtx,
    ) -> pingora_core::Result<bool> {
        self.settle.request_filter(session, ctx).await
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut SettleCtx,
    ) -> pingora_core::Result<()> {
        self.settle.response_filter(upstream_response, ctx)
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut SettleCtx,
    ) -> pingora_core::Result<Option<Duration>> {
        self.settle
            .response_body_filter(body.as_ref(), end_of_stream, ctx);
        Ok(None)
    }

    async fn logging(
        &self,
        _session: &mut Session,
        _error: Option<&pingora_core::Error>,
        ctx: &mut SettleCtx,
    ) {
        self.settle.logging(ctx);
    }
}

fn header(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_owned())
    })
}

/// The LLM-shaped upstream: `/complete` answers `x-usage-tokens` (the request's `x-test-tokens`,
/// or `x-test-usage-raw` verbatim); `/stream` sends that many `data: tok` events and a final
/// `data: [DONE]`, chunked; `/hang` sends them and then never ends. Counts the requests.
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
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end + 4);
                    // Relaxed: a counter read after the client saw the responses.
                    count.fetch_add(1, Ordering::Relaxed);
                    let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
                    let tokens: u64 = header(&head, "x-test-tokens")
                        .and_then(|t| t.parse().ok())
                        .unwrap_or(0);
                    if path == "/complete" {
                        let usage =
                            header(&head, "x-test-usage-raw").unwrap_or_else(|| tokens.to_string());
                        let reply = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-usage-tokens: {usage}\r\n\r\nok"
                        );
                        if sock.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                                transfer-encoding: chunked\r\n\r\n";
                    if sock.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    for _ in 0..tokens {
                        if sock.write_all(b"b\r\ndata: tok\n\n\r\n").await.is_err() {
                            return;
                        }
                    }
                    if path == "/hang" {
                        // Never ends: waits for the proxy to go away.
                        let _ = sock.read(&mut chunk).await;
                        return;
                    }
                    if sock
                        .write_all(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
                        .await
                        .is_err()
                    {
                        return;
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

/// `r` of a `RateLimit` field.
fn remaining(ratelimit: &str) -> u64 {
    ratelimit
        .split(';')
        .find_map(|p| p.strip_prefix("r="))
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no r in {ratelimit}"))
}

struct Harness {
    client: reqwest::Client,
    header_proxy: String,
    body_proxy: String,
    settled: Mutex<mpsc::Receiver<Settled>>,
    seen: Arc<AtomicU64>,
}

impl Harness {
    /// `(status, r of RateLimit, body)` of one request through `proxy`.
    async fn send(
        &self,
        proxy: &str,
        path: &str,
        tenant: &str,
        estimate: u64,
        tokens: u64,
    ) -> (u16, Option<u64>, String) {
        let resp = self
            .client
            .get(format!("http://{proxy}{path}"))
            .header("x-tenant", tenant)
            .header("x-max-tokens", estimate.to_string())
            .header("x-test-tokens", tokens.to_string())
            .send()
            .await
            .expect("request");
        let status = resp.status().as_u16();
        let r = resp
            .headers()
            .get("ratelimit")
            .map(|v| remaining(v.to_str().expect("ascii")));
        (status, r, resp.text().await.expect("body"))
    }

    fn next_settled(&self) -> Settled {
        self.settled
            .lock()
            .expect("receiver")
            .recv_timeout(Duration::from_secs(10))
            .expect("a settlement")
    }

    fn seen(&self) -> u64 {
        // Relaxed: read after the client saw the responses.
        self.seen.load(Ordering::Relaxed)
    }
}

async fn start() -> Harness {
    let seen = Arc::new(AtomicU64::new(0));
    let upstream_addr = upstream(Arc::clone(&seen)).await;
    let policy = Arc::new(
        Policy::with_clock(
            PolicyConfig::from_toml(POLICY).expect("config"),
            ManualClock::new(),
        )
        .expect("policy"),
    );
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let on_settled = Arc::new(move |s: &Settled| {
        let _ = tx.lock().expect("sender").send(*s);
    });
    let settle = |actual: ActualCost| {
        let on_settled = Arc::clone(&on_settled);
        PingoraSettle::new(Arc::clone(&policy), ClientIp::trusting([]))
            .descriptor_names(
                DescriptorNames::default()
                    .client(None)
                    .route(None)
                    .method(None)
                    .header("x-tenant", "tenant")
                    .expect("names"),
            )
            .estimate(|facts| {
                facts
                    .headers
                    .get("x-max-tokens")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(1)
            })
            .actual(actual)
            .on_settled(move |s| on_settled(s))
    };
    let header_proxy = SettleProxy {
        settle: settle(ActualCost::Header(HeaderName::from_static(
            "x-usage-tokens",
        ))),
        upstream: upstream_addr.clone(),
    };
    let body_proxy = SettleProxy {
        settle: settle(ActualCost::Header(HeaderName::from_static("unused"))).meter(|| {
            SseMeter::new(|data| {
                if data == "[DONE]" {
                    Usage::None
                } else {
                    Usage::Add(1)
                }
            })
        }),
        upstream: upstream_addr,
    };
    let (header_listen, body_listen) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let listens = (header_listen.clone(), body_listen.clone());
    // The proxies run in-process for the rest of the test binary's life (Pingora's server owns
    // its own runtime and never returns); they are gone when the test process exits.
    std::thread::spawn(move || {
        let mut server = Server::new(None).expect("server");
        server.bootstrap();
        for (proxy, listen) in [(header_proxy, listens.0), (body_proxy, listens.1)] {
            let mut service = http_proxy_service(&server.configuration, proxy);
            service.add_tcp(&listen);
            server.add_service(service);
        }
        server.run_forever();
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    for listen in [&header_listen, &body_listen] {
        while tokio::net::TcpStream::connect(listen).await.is_err() {
            assert!(Instant::now() < deadline, "proxy did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Harness {
        client: reqwest::Client::new(),
        header_proxy: header_listen,
        body_proxy: body_listen,
        settled: Mutex::new(rx),
        seen,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pingora_settles_after_the_response() {
    let h = start().await;
    let (hp, bp) = (h.header_proxy.clone(), h.body_proxy.clone());

    // The usage header: 1000 reserved, 300 used, 700 back.
    let (status, r, body) = h.send(&hp, "/complete", "a", 1000, 300).await;
    assert_eq!((status, r, body.as_str()), (200, Some(9000), "ok"));
    let s = h.next_settled();
    assert_eq!(
        (s.settlement.estimate, s.settlement.actual, s.cancelled),
        (1000, 300, false)
    );
    let (status, r, _) = h.send(&hp, "/complete", "a", 1000, 1000).await;
    assert_eq!((status, r), (200, Some(8700)));
    assert_eq!(h.next_settled().settlement.actual, 1000);

    // A malformed usage header settles at the estimate.
    let resp = h
        .client
        .get(format!("http://{hp}/complete"))
        .header("x-tenant", "b")
        .header("x-max-tokens", "500")
        .header("x-test-usage-raw", "-5")
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 200);
    let s = h.next_settled();
    assert_eq!((s.settlement.estimate, s.settlement.actual), (500, 500));

    // A stream of 250 tokens against an estimate of 100: counted as it passes, body unchanged.
    let (status, r, body) = h.send(&bp, "/stream", "c", 100, 250).await;
    assert_eq!((status, r), (200, Some(9900)));
    assert_eq!(body.matches("data: tok\n\n").count(), 250);
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    let s = h.next_settled();
    assert_eq!(
        (s.settlement.estimate, s.settlement.actual, s.cut),
        (100, 250, false)
    );
    let (status, r, _) = h.send(&hp, "/complete", "c", 1, 1).await;
    assert_eq!((status, r), (200, Some(10_000 - 250 - 1)));
    h.next_settled();

    // An overrun: 10 500 tokens on a 100 estimate; the tenant is in debt and refused before the
    // upstream.
    let (status, _, _) = h.send(&bp, "/stream", "d", 100, 10_500).await;
    assert_eq!(status, 200);
    assert_eq!(h.next_settled().settlement.actual, 10_500);
    let before = h.seen();
    let (status, r, body) = h.send(&hp, "/complete", "d", 1, 1).await;
    assert_eq!((status, r), (429, Some(0)), "{body}");
    assert!(body.contains("rate limit exceeded"), "{body}");
    assert_eq!(
        h.seen(),
        before,
        "a refused request never reaches the upstream"
    );

    // A client that leaves mid-stream: settled at the estimate in the logging phase.
    let mut resp = h
        .client
        .get(format!("http://{bp}/hang"))
        .header("x-tenant", "e")
        .header("x-max-tokens", "400")
        .header("x-test-tokens", "5")
        .send()
        .await
        .expect("request");
    let mut got = Vec::new();
    while got.windows(11).filter(|w| w == b"data: tok\n\n").count() < 5 {
        let chunk = resp.chunk().await.expect("chunk").expect("more");
        got.extend_from_slice(&chunk);
    }
    drop(resp);
    let s = h.next_settled();
    assert_eq!(
        (s.settlement.estimate, s.settlement.actual, s.cancelled),
        (400, 400, true)
    );
    let (status, r, _) = h.send(&hp, "/complete", "e", 1, 1).await;
    assert_eq!((status, r), (200, Some(10_000 - 400 - 1)));
    h.next_settled();

    // 100 requests of random sizes through both proxies: what was settled is what the state
    // shows.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut random = |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    let mut settled = 0;
    for i in 0..100 {
        let (estimate, tokens) = (1 + random(100), random(90));
        let (proxy, path) = if i % 2 == 0 {
            (&hp, "/complete")
        } else {
            (&bp, "/stream")
        };
        let (status, r, _) = h.send(proxy, path, "f", estimate, tokens).await;
        assert_eq!((status, r), (200, Some(10_000 - settled - estimate)), "{i}");
        let s = h.next_settled();
        assert_eq!(s.settlement.actual, tokens);
        settled += tokens;
    }
    let (_, r, _) = h.send(&hp, "/complete", "f", 1, 0).await;
    assert_eq!(r, Some(10_000 - settled - 1));
}
