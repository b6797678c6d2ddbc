//! The layer driven directly as a tower service (no network), on a manual clock.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tollgate_core::{FixedWindowLimiter, Gcra, GcraLimiter, ManualClock, Quota, SlidingLog};
use tollgate_http::{
    GlobalKey, HeaderKey, HeaderMode, KeyExtractor, KeyedCheck, MissingKey, PeerIp, RateLimitBody,
    RateLimitLayer, RequestCost, RequestHead,
};
use tollgate_sharded::KeyedLimiter;
use tower::{Layer, Service, ServiceExt, service_fn};

type Inner = tower::util::BoxCloneService<Request<()>, Response<Full<Bytes>>, Infallible>;

/// An inner service answering 200 "ok", counting its calls.
fn inner(calls: &Arc<AtomicUsize>) -> Inner {
    let calls = Arc::clone(calls);
    tower::util::BoxCloneService::new(service_fn(move |_req: Request<()>| {
        // Relaxed: a test counter read after the calls complete on this thread.
        calls.fetch_add(1, Ordering::Relaxed);
        async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok")))) }
    }))
}

fn get(path: &str, peer: &str) -> Request<()> {
    let mut req = Request::get(path).body(()).unwrap();
    req.extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    req
}

async fn call<S, B>(svc: &mut S, req: Request<()>) -> Response<B>
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible>,
{
    svc.ready().await.unwrap().call(req).await.unwrap()
}

async fn body(resp: Response<RateLimitBody<Full<Bytes>>>) -> Bytes {
    resp.into_body().collect().await.unwrap().to_bytes()
}

fn per_ip(quota: Quota, clock: &ManualClock) -> KeyedLimiter<IpAddr, Gcra, ManualClock> {
    KeyedLimiter::with_clock(quota, 1_000, clock.clone()).unwrap()
}

#[tokio::test]
async fn allowed_responses_carry_fields_and_denials_skip_the_inner_service() {
    let clock = ManualClock::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = RateLimitLayer::builder(PeerIp::new())
        .policy("ip", per_ip(Quota::per_second(2).unwrap(), &clock))
        .unwrap()
        .build();
    let mut svc = layer.layer(inner(&calls));

    let ok = call(&mut svc, get("/", "192.0.2.1:1")).await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(ok.headers()["ratelimit-policy"], r#""ip";q=2;w=1"#);
    assert_eq!(ok.headers()["ratelimit"], r#""ip";r=1;t=1"#);
    assert!(ok.headers().get("retry-after").is_none());
    assert_eq!(body(ok).await, "ok");
    assert!(
        call(&mut svc, get("/", "192.0.2.1:1"))
            .await
            .status()
            .is_success()
    );

    let denied = call(&mut svc, get("/", "192.0.2.1:1")).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["retry-after"], "1");
    assert_eq!(denied.headers()["ratelimit"], r#""ip";r=0;t=1"#);
    assert_eq!(
        body(denied).await,
        r#"{"error":"rate limit exceeded","retry_after":1}"#
    );
    // Relaxed: see `inner`.
    assert_eq!(
        calls.load(Ordering::Relaxed),
        2,
        "a 429 never reaches the inner service"
    );

    // Another peer has its own bucket.
    assert!(
        call(&mut svc, get("/", "192.0.2.2:1"))
            .await
            .status()
            .is_success()
    );
}

#[tokio::test]
async fn retry_after_rounds_up_and_agrees_with_legacy_reset() {
    let clock = ManualClock::new();
    let calls = Arc::new(AtomicUsize::new(0));
    // One unit per 1.5 s: a denial waits 1.5 s, advertised as 2 s.
    let quota = Quota::per(Duration::from_millis(1500), 1).unwrap();
    let layer = RateLimitLayer::builder(GlobalKey)
        .policy(
            "slow",
            GcraLimiter::with_clock(quota, clock.clone()).unwrap(),
        )
        .unwrap()
        .headers(HeaderMode {
            ietf: true,
            legacy: true,
            on_allowed: true,
        })
        .build();
    let mut svc = layer.layer(inner(&calls));
    let ok = call(&mut svc, get("/", "192.0.2.1:1")).await;
    // The window is whole seconds, never promising more: 1 per 1.5 s → 1 per 2 s.
    assert_eq!(ok.headers()["ratelimit-policy"], r#""slow";q=1;w=2"#);
    assert_eq!(ok.headers()["x-ratelimit-limit"], "1");
    assert_eq!(ok.headers()["x-ratelimit-remaining"], "0");
    assert_eq!(ok.headers()["x-ratelimit-reset"], "2");

    clock.advance(Duration::from_millis(400));
    let denied = call(&mut svc, get("/", "192.0.2.1:1")).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    // 1.1 s left → 2.
    assert_eq!(denied.headers()["retry-after"], "2");
    assert_eq!(denied.headers()["ratelimit"], r#""slow";r=0;t=2"#);
    assert_eq!(denied.headers()["x-ratelimit-reset"], "2");
    assert_eq!(denied.headers()["x-ratelimit-remaining"], "0");

    clock.advance(Duration::from_millis(1100));
    assert!(
        call(&mut svc, get("/", "192.0.2.1:1"))
            .await
            .status()
            .is_success()
    );
}

#[tokio::test]
async fn routes_pick_the_longest_prefix_on_segment_boundaries() {
    let clock = ManualClock::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let q = |n| per_ip(Quota::per_minute(n).unwrap(), &clock);
    let layer = RateLimitLayer::builder(PeerIp::new())
        .route("/api", "api", q(10))
        .unwrap()
        .route("/api/search", "search", q(2))
        .unwrap()
        .build();
    let mut svc = layer.layer(inner(&calls));
    let policy = |r: &Response<_>| r.headers().get("ratelimit-policy").cloned();

    let r = call(&mut svc, get("/api/search/x", "192.0.2.1:1")).await;
    assert_eq!(policy(&r).unwrap(), r#""search";q=2;w=60"#);
    let r = call(&mut svc, get("/api/other", "192.0.2.1:1")).await;
    assert_eq!(policy(&r).unwrap(), r#""api";q=10;w=60"#);
    let r = call(&mut svc, get("/api", "192.0.2.1:1")).await;
    assert_eq!(policy(&r).unwrap(), r#""api";q=10;w=60"#);
    // `/apix` is not under `/api`, and there is no default policy: unlimited, no fields.
    let r = call(&mut svc, get("/apix", "192.0.2.1:1")).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(policy(&r).is_none());
}

#[tokio::test]
async fn missing_keys_get_the_configured_outcome() {
    let clock = ManualClock::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let no_peer = || Request::get("/").body(()).unwrap();
    let limiter = || per_ip(Quota::per_minute(1).unwrap(), &clock);

    let reject = RateLimitLayer::builder(PeerIp::new())
        .policy("p", limiter())
        .unwrap()
        .build();
    let r = call(&mut reject.layer(inner(&calls)), no_peer()).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(body(r).await, r#"{"error":"rate limit key missing"}"#);

    let allow = RateLimitLayer::builder(PeerIp::new())
        .policy("p", limiter())
        .unwrap()
        .on_missing_key(MissingKey::Allow)
        .build();
    let mut svc = allow.layer(inner(&calls));
    for _ in 0..3 {
        let r = call(&mut svc, no_peer()).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert!(r.headers().get("ratelimit").is_none());
    }

    let fallback = RateLimitLayer::builder(PeerIp::new())
        .policy("p", limiter())
        .unwrap()
        .on_missing_key(MissingKey::Fallback(IpAddr::from([0, 0, 0, 0])))
        .build();
    let mut svc = fallback.layer(inner(&calls));
    assert_eq!(call(&mut svc, no_peer()).await.status(), StatusCode::OK);
    // Every key-less request shares one bucket of 1...
    assert_eq!(
        call(&mut svc, no_peer()).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // ...which real keys do not touch.
    assert_eq!(
        call(&mut svc, get("/", "192.0.2.1:1")).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn cost_functions_charge_units_and_impossible_costs_are_not_429() {
    let clock = ManualClock::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let cost = |req: &RequestHead<'_>| -> u64 {
        req.headers
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    };
    let layer = RateLimitLayer::builder(GlobalKey)
        .policy(
            "units",
            GcraLimiter::with_clock(Quota::per_second(10).unwrap(), clock.clone()).unwrap(),
        )
        .unwrap()
        .cost(cost)
        .build();
    let mut svc = layer.layer(inner(&calls));
    let with_cost = |n: &str| {
        let mut req = get("/", "192.0.2.1:1");
        req.headers_mut()
            .insert("x-cost", HeaderValue::from_str(n).unwrap());
        req
    };
    let r = call(&mut svc, with_cost("7")).await;
    assert_eq!(r.headers()["ratelimit"], r#""units";r=3;t=1"#);
    let r = call(&mut svc, with_cost("11")).await;
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(r.headers().get("retry-after").is_none());
    let r = call(&mut svc, with_cost("4")).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["retry-after"], "1");
    // Denied, yet 3 units are there: `r` says so, and `t` is the wait for a 4th (100 ms).
    assert_eq!(r.headers()["ratelimit"], r#""units";r=3;t=1"#);
    let r = call(&mut svc, with_cost("3")).await;
    assert_eq!(r.headers()["ratelimit"], r#""units";r=0;t=1"#);
}

#[tokio::test]
async fn header_keys_and_stacked_layers() {
    let clock = ManualClock::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let per_key = KeyedLimiter::<HeaderValue, Gcra, _>::with_clock(
        Quota::per_minute(1).unwrap(),
        100,
        clock.clone(),
    )
    .unwrap();
    let by_key =
        RateLimitLayer::builder(HeaderKey::new(http::HeaderName::from_static("x-api-key")))
            .policy("key", per_key)
            .unwrap()
            .build();
    let global = RateLimitLayer::builder(GlobalKey)
        .policy(
            "global",
            GcraLimiter::with_clock(Quota::per_minute(100).unwrap(), clock.clone()).unwrap(),
        )
        .unwrap()
        .build();
    let mut svc = global.layer(by_key.layer(inner(&calls)));
    let with_key = |k: &'static str| {
        let mut req = get("/", "192.0.2.1:1");
        req.headers_mut()
            .insert("x-api-key", HeaderValue::from_static(k));
        req
    };
    let r = call(&mut svc, with_key("alpha")).await;
    assert_eq!(r.status(), StatusCode::OK);
    // Both layers' policies, as two members of one list.
    let members: Vec<_> = r.headers().get_all("ratelimit").iter().collect();
    assert_eq!(members, [r#""key";r=0;t=60"#, r#""global";r=99;t=1"#]);
    assert_eq!(
        call(&mut svc, with_key("alpha")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        call(&mut svc, with_key("beta")).await.status(),
        StatusCode::OK
    );
}

#[test]
fn custom_extractors_and_costs_are_plain_traits() {
    struct Tenant;
    impl KeyExtractor for Tenant {
        type Key = u32;
        fn extract(&self, req: &RequestHead<'_>) -> Result<u32, tollgate_http::KeyError> {
            req.uri
                .path()
                .trim_start_matches('/')
                .parse()
                .map_err(|_| tollgate_http::KeyError::Custom)
        }
    }
    struct Double;
    impl RequestCost for Double {
        fn cost(&self, _: &RequestHead<'_>) -> u64 {
            2
        }
    }
    let req = Request::get("/42").body(()).unwrap();
    assert_eq!(Tenant.extract(&RequestHead::of(&req)), Ok(42));
    assert_eq!(Double.cost(&RequestHead::of(&req)), 2);
    let limiter = GcraLimiter::new(Quota::per_second(1).unwrap()).unwrap();
    assert!(
        KeyedCheck::<u32>::check_key(&limiter, &42, 1)
            .unwrap()
            .is_allowed()
    );
}

/// Issue 11, point 7: `t` has one meaning on both paths, the whole seconds until the key's quota
/// admits more than `r` units (the draft's "time until additional quota is made available"; "the
/// time within which the client can use no more than the available quota"). The response that
/// spends the last unit and the denial right after it describe the same wait, so a client pacing
/// itself on the allowed response waits 20 s, not the 60 s until the bucket is full again.
#[tokio::test]
async fn t_is_the_same_wait_on_allowed_and_denied_responses() {
    let clock = ManualClock::new();
    let calls = Arc::new(AtomicUsize::new(0));
    // 3 per minute: one unit comes back every 20 s.
    let layer = RateLimitLayer::builder(PeerIp::new())
        .policy("search", per_ip(Quota::per_minute(3).unwrap(), &clock))
        .unwrap()
        .headers(HeaderMode {
            ietf: true,
            legacy: true,
            on_allowed: true,
        })
        .build();
    let mut svc = layer.layer(inner(&calls));
    let peer = "192.0.2.1:1";

    let mut last_allowed = None;
    for r in [2, 1, 0] {
        let ok = call(&mut svc, get("/", peer)).await;
        assert_eq!(ok.status(), StatusCode::OK);
        // Whatever is left, the next unit comes back 20 s after the first one was spent.
        assert_eq!(
            ok.headers()["ratelimit"],
            format!(r#""search";r={r};t=20"#).as_str()
        );
        assert_eq!(ok.headers()["x-ratelimit-reset"], "20");
        last_allowed = Some(ok);
    }
    let last_allowed = last_allowed.unwrap();

    let denied = call(&mut svc, get("/", peer)).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["retry-after"], "20");
    // The same `t` as the allowed response just before it: both describe the same wait.
    assert_eq!(
        denied.headers()["ratelimit"],
        last_allowed.headers()["ratelimit"]
    );

    // The client side: pacing on the allowed response gives the denial's Retry-After.
    let pause = tollgate_client::pause_hint(last_allowed.headers()).unwrap();
    let retry = tollgate_client::retry_after(denied.headers(), std::time::UNIX_EPOCH).unwrap();
    assert_eq!(pause, Duration::from_secs(20));
    assert_eq!(pause, retry);
    // And that wait is exact: 1 ns short is still denied, the full pause passes.
    clock.advance(pause - Duration::from_nanos(1));
    assert_eq!(
        call(&mut svc, get("/", peer)).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    clock.advance(Duration::from_nanos(1));
    let ok = call(&mut svc, get("/", peer)).await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(ok.headers()["ratelimit"], r#""search";r=0;t=20"#);

    // Part-way through a wait, both paths count down together.
    clock.advance(Duration::from_secs(5));
    let denied = call(&mut svc, get("/", peer)).await;
    assert_eq!(denied.headers()["retry-after"], "15");
    assert_eq!(denied.headers()["ratelimit"], r#""search";r=0;t=15"#);
}

/// `t` is asked of the limiter, so it follows each algorithm: a fixed window gives every unit back
/// at its end, a sliding log one by one as the logged requests age out.
#[tokio::test]
async fn t_follows_the_algorithm() {
    let clock = ManualClock::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let quota = Quota::per_minute(3).unwrap();
    let fixed = RateLimitLayer::builder(GlobalKey)
        .policy(
            "fixed",
            FixedWindowLimiter::with_clock(quota, clock.clone()).unwrap(),
        )
        .unwrap()
        .build();
    let log = RateLimitLayer::builder(GlobalKey)
        .policy("log", SlidingLog::with_clock(quota, clock.clone()).unwrap())
        .unwrap()
        .build();
    let mut fixed = fixed.layer(inner(&calls));
    let mut log = log.layer(inner(&calls));
    let expect = [
        // (advance s, fixed, log)
        (0, r#""fixed";r=2;t=60"#, r#""log";r=2;t=60"#),
        (10, r#""fixed";r=1;t=50"#, r#""log";r=1;t=50"#),
        (10, r#""fixed";r=0;t=40"#, r#""log";r=0;t=40"#),
    ];
    for (advance, f, l) in expect {
        clock.advance(Duration::from_secs(advance));
        assert_eq!(
            call(&mut fixed, get("/", "192.0.2.1:1")).await.headers()["ratelimit"],
            f
        );
        assert_eq!(
            call(&mut log, get("/", "192.0.2.1:1")).await.headers()["ratelimit"],
            l
        );
    }
    // At 60 s the window restarts whole; the log has given back only its first request.
    clock.advance(Duration::from_secs(40));
    let f = call(&mut fixed, get("/", "192.0.2.1:1")).await;
    assert_eq!(f.headers()["ratelimit"], r#""fixed";r=2;t=60"#);
    let l = call(&mut log, get("/", "192.0.2.1:1")).await;
    assert_eq!(l.headers()["ratelimit"], r#""log";r=0;t=10"#);
    let l = call(&mut log, get("/", "192.0.2.1:1")).await;
    assert_eq!(l.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(l.headers()["retry-after"], "10");
    assert_eq!(l.headers()["ratelimit"], r#""log";r=0;t=10"#);
}
