//! The policy layer driven as a tower service (no network), on a manual clock: several rules per
//! request decided as one, override quotas advertised, shadow rules, two-stage delays, live reload.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate_core::ManualClock;
use tollgate_http::{ClientIp, PolicyLayer};
use tollgate_policy::{Policy, PolicyConfig};
use tower::{Layer, Service, ServiceExt, service_fn};

type Inner = tower::util::BoxCloneService<Request<()>, Response<Full<Bytes>>, Infallible>;

/// An inner service answering 200 "ok", counting its calls.
fn inner(calls: &Arc<AtomicUsize>) -> Inner {
    let calls = Arc::clone(calls);
    tower::util::BoxCloneService::new(service_fn(move |_req: Request<()>| {
        // Relaxed: a test counter, read after the calls complete.
        calls.fetch_add(1, Ordering::Relaxed);
        async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok")))) }
    }))
}

fn request(path: &str, peer: &str, api_key: Option<&str>) -> Request<()> {
    let mut builder = Request::get(path);
    if let Some(key) = api_key {
        builder = builder.header("x-api-key", key);
    }
    let mut req = builder.body(()).unwrap();
    req.extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    req
}

fn header<'r, B>(response: &'r Response<B>, name: &str) -> Option<&'r str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

const GATEWAY: &str = r#"
    [[rules]]
    name = "per_ip"
    match = { remote_address = "any" }
    key = ["remote_address"]
    limit = 2
    period = "1s"
    capacity = 1000

    [[rules]]
    name = "per_api_key"
    match = { api_key = "any" }
    key = ["api_key"]
    limit = 3
    period = "1m"
    capacity = 1000

    [[rules]]
    name = "global"
    limit = 3
    period = "1s"

    [[rules]]
    name = "trial"
    mode = "shadow"
    match = { route = { prefix = "/trial" } }
    limit = 1
    period = "1h"

    [[overrides]]
    rule = "per_api_key"
    tier = "pro"
    values = ["key-pro"]
    limit = 600
    period = "1m"
"#;

fn gateway(clock: &ManualClock) -> (Arc<Policy<ManualClock>>, Inner, Arc<AtomicUsize>) {
    let policy = Arc::new(
        Policy::with_clock(PolicyConfig::from_toml(GATEWAY).unwrap(), clock.clone()).unwrap(),
    );
    let calls = Arc::new(AtomicUsize::new(0));
    (policy, inner(&calls), calls)
}

async fn send<S>(
    svc: &mut S,
    req: Request<()>,
) -> Response<tollgate_http::RateLimitBody<Full<Bytes>>>
where
    S: Service<
            Request<()>,
            Response = Response<tollgate_http::RateLimitBody<Full<Bytes>>>,
            Error = Infallible,
        >,
{
    svc.ready().await.unwrap().call(req).await.unwrap()
}

#[tokio::test]
async fn a_request_denied_by_one_rule_consumes_nothing_in_the_others() {
    let clock = ManualClock::new();
    let (policy, inner, calls) = gateway(&clock);
    let mut svc = PolicyLayer::builder(Arc::clone(&policy))
        .client_ip(ClientIp::trusting([]))
        .build()
        .layer(inner);

    // Client A: two pass, the third is per_ip's (2/s); global (3/s) gets that unit back.
    for _ in 0..2 {
        let ok = send(&mut svc, request("/", "192.0.2.1:1000", None)).await;
        assert_eq!(ok.status(), StatusCode::OK);
    }
    let denied = send(&mut svc, request("/", "192.0.2.1:1000", None)).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "retry-after"), Some("1"));
    assert_eq!(
        header(&denied, "ratelimit-policy"),
        Some(r#""per_ip";q=2;w=1"#)
    );
    assert_eq!(header(&denied, "ratelimit"), Some(r#""per_ip";r=0;t=1"#));
    assert_eq!(
        calls.load(Ordering::Relaxed),
        2,
        "the upstream never sees a denial"
    );

    // Client B: global's third unit is still there (the denied request was refunded), then global
    // denies, naming itself.
    let ok = send(&mut svc, request("/", "192.0.2.2:1000", None)).await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(header(&ok, "ratelimit-policy"), Some(r#""global";q=3;w=1"#));
    let denied = send(&mut svc, request("/", "192.0.2.2:1000", None)).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&denied, "ratelimit-policy"),
        Some(r#""global";q=3;w=1"#)
    );
    assert_eq!(calls.load(Ordering::Relaxed), 3);
}

#[tokio::test]
async fn a_keys_override_quota_is_the_one_advertised() {
    let clock = ManualClock::new();
    let (policy, inner, _) = gateway(&clock);
    let mut svc = PolicyLayer::builder(policy)
        .route_descriptor(None)
        .header("x-api-key", "api_key")
        .unwrap()
        .build()
        .layer(inner);
    // No client_ip source: per_ip does not apply; the API key rule is the tightest (3 per minute
    // for the free plan, below global's 3 per second after one request).
    let free = send(&mut svc, request("/", "192.0.2.1:1", Some("key-free"))).await;
    assert_eq!(
        header(&free, "ratelimit-policy"),
        Some(r#""per_api_key";q=3;w=60"#)
    );
    clock.advance(Duration::from_secs(1));
    let pro = send(&mut svc, request("/", "192.0.2.1:1", Some("key-pro"))).await;
    assert_eq!(pro.status(), StatusCode::OK);
    // The pro key's 600 per minute is looser than global (3/s with 2 left): global decides.
    assert_eq!(
        header(&pro, "ratelimit-policy"),
        Some(r#""global";q=3;w=1"#)
    );
}

#[tokio::test]
async fn t_on_an_allowed_response_is_the_wait_the_next_denial_reports() {
    let clock = ManualClock::new();
    let (policy, inner, _) = gateway(&clock);
    let mut svc = PolicyLayer::builder(policy)
        .route_descriptor(None)
        .header("x-api-key", "api_key")
        .unwrap()
        .build()
        .layer(inner);
    // 3 per minute: one unit every 20 s. Spend all three at once.
    let mut last = None;
    for _ in 0..3 {
        let ok = send(&mut svc, request("/", "192.0.2.1:1", Some("k"))).await;
        assert_eq!(ok.status(), StatusCode::OK);
        last = header(&ok, "ratelimit").map(str::to_owned);
    }
    assert_eq!(last.as_deref(), Some(r#""per_api_key";r=0;t=20"#));
    let denied = send(&mut svc, request("/", "192.0.2.1:1", Some("k"))).await;
    assert_eq!(
        header(&denied, "ratelimit"),
        Some(r#""per_api_key";r=0;t=20"#)
    );
    assert_eq!(header(&denied, "retry-after"), Some("20"));
}

#[tokio::test]
async fn shadow_rules_never_deny_and_dry_run_lets_everything_through() {
    let clock = ManualClock::new();
    let (policy, inner, calls) = gateway(&clock);
    let mut svc = PolicyLayer::builder(Arc::clone(&policy))
        .client_ip(ClientIp::trusting([]))
        .build()
        .layer(inner);
    // `trial` (shadow, 1 per hour) would deny the second: it does not.
    for i in 0..2 {
        let ok = send(&mut svc, request("/trial", &format!("192.0.2.{i}:1"), None)).await;
        assert_eq!(ok.status(), StatusCode::OK);
    }
    policy.set_dry_run(true);
    for _ in 0..5 {
        let ok = send(&mut svc, request("/", "192.0.2.9:1", None)).await;
        assert_eq!(ok.status(), StatusCode::OK, "dry run never denies");
    }
    assert_eq!(calls.load(Ordering::Relaxed), 7);
    let trial = policy
        .snapshot()
        .rules
        .into_iter()
        .find(|r| r.rule == "trial")
        .unwrap();
    assert!(trial.shadow_denied >= 1, "{trial:?}");
}

#[tokio::test]
async fn a_cost_no_rule_can_admit_is_413_and_reaches_nothing() {
    let clock = ManualClock::new();
    let (policy, inner, calls) = gateway(&clock);
    let mut svc = PolicyLayer::builder(policy)
        .client_ip(ClientIp::trusting([]))
        .cost(|_: &tollgate_http::RequestHead<'_>| 50)
        .build()
        .layer(inner);
    let response = send(&mut svc, request("/", "192.0.2.1:1", None)).await;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(response.headers().get("retry-after").is_none());
    assert_eq!(calls.load(Ordering::Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn a_two_stage_rule_holds_the_request_for_its_delay() {
    let clock = ManualClock::new();
    let config = PolicyConfig::from_toml(
        r#"
        [[rules]]
        name = "search"
        limit = 10
        period = "1s"
        burst = 1
        delay = { max_delay = "500ms" }
    "#,
    )
    .unwrap();
    let policy = Arc::new(Policy::with_clock(config, clock.clone()).unwrap());
    let calls = Arc::new(AtomicUsize::new(0));
    let mut svc = PolicyLayer::builder(policy).build().layer(inner(&calls));
    let first = send(&mut svc, request("/", "192.0.2.1:1", None)).await;
    assert_eq!(first.status(), StatusCode::OK);
    // The second waits 100 ms on tokio's (paused) timer before the upstream sees it.
    let started = tokio::time::Instant::now();
    let second = send(&mut svc, request("/", "192.0.2.1:1", None)).await;
    assert_eq!(second.status(), StatusCode::OK);
    assert_eq!(started.elapsed(), Duration::from_millis(100));
    assert_eq!(calls.load(Ordering::Relaxed), 2);
    // Past max_delay: denied at once.
    for _ in 0..5 {
        let _ = send(&mut svc, request("/", "192.0.2.1:1", None)).await;
    }
    let denied = send(&mut svc, request("/", "192.0.2.1:1", None)).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_reload_applies_new_limits_to_the_running_layer_without_a_fresh_burst() {
    let clock = ManualClock::new();
    let (policy, inner, _) = gateway(&clock);
    let mut svc = PolicyLayer::builder(Arc::clone(&policy))
        .client_ip(ClientIp::trusting([]))
        .build()
        .layer(inner);
    for _ in 0..2 {
        let ok = send(&mut svc, request("/", "192.0.2.1:1", None)).await;
        assert_eq!(ok.status(), StatusCode::OK);
    }
    // per_ip goes from 2/s to 4/s: the client that spent its burst gets no fresh one at once.
    policy
        .reload(PolicyConfig::from_toml(&GATEWAY.replacen("limit = 2", "limit = 4", 1)).unwrap())
        .unwrap();
    let after = send(&mut svc, request("/", "192.0.2.1:1", None)).await;
    assert_eq!(after.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&after, "ratelimit-policy"),
        Some(r#""per_ip";q=4;w=1"#)
    );
}
