//! The async layer with a limiter whose decisions are real pending futures (a yield and a counted
//! poll, standing in for a Redis round trip), on a manual clock.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate_core::{CheckError, Decision, Gcra, ManualClock, Quota};
use tollgate_http::{AsyncKeyedCheck, AsyncRateLimitLayer, MissingKey, PeerIp, RateLimitBody};
use tollgate_sharded::KeyedLimiter;
use tower::{Layer, Service, ServiceExt, service_fn};

type Inner = tower::util::BoxCloneService<Request<()>, Response<Full<Bytes>>, Infallible>;

fn inner(calls: &Arc<AtomicUsize>) -> Inner {
    let calls = Arc::clone(calls);
    tower::util::BoxCloneService::new(service_fn(move |_req: Request<()>| {
        // Relaxed: a test counter, read after the calls complete.
        calls.fetch_add(1, Ordering::Relaxed);
        async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok")))) }
    }))
}

/// A keyed limiter behind a hop: every decision first yields to the runtime (so the layer must
/// really await it) and is counted.
struct Remote {
    table: KeyedLimiter<IpAddr, Gcra, ManualClock>,
    round_trips: Arc<AtomicUsize>,
}

impl AsyncKeyedCheck<IpAddr> for Remote {
    async fn check_key(&self, key: &IpAddr, cost: u64) -> Result<Decision, CheckError> {
        tokio::task::yield_now().await;
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        self.table.check_key(key, cost)
    }

    async fn peek_key(&self, key: &IpAddr, cost: u64) -> Result<Decision, CheckError> {
        tokio::task::yield_now().await;
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        self.table.peek_key(key, cost)
    }

    fn quota(&self) -> &Quota {
        self.table.quota()
    }
}

fn get(peer: Option<&str>) -> Request<()> {
    let mut req = Request::get("/").body(()).unwrap();
    if let Some(peer) = peer {
        req.extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
    }
    req
}

async fn send<S>(svc: &mut S, req: Request<()>) -> Response<RateLimitBody<Full<Bytes>>>
where
    S: Service<Request<()>, Response = Response<RateLimitBody<Full<Bytes>>>, Error = Infallible>,
{
    svc.ready().await.unwrap().call(req).await.unwrap()
}

fn header<'r, B>(response: &'r Response<B>, name: &str) -> Option<&'r str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test]
async fn an_awaited_denial_never_reaches_the_inner_service() {
    let clock = ManualClock::new();
    let round_trips = Arc::new(AtomicUsize::new(0));
    let remote = Remote {
        table: KeyedLimiter::with_clock(Quota::per_minute(3).unwrap(), 100, clock).unwrap(),
        round_trips: Arc::clone(&round_trips),
    };
    let calls = Arc::new(AtomicUsize::new(0));
    let mut svc = AsyncRateLimitLayer::builder(PeerIp::new(), "remote", remote)
        .unwrap()
        .build()
        .layer(inner(&calls));
    for _ in 0..3 {
        let ok = send(&mut svc, get(Some("192.0.2.1:1"))).await;
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(
            header(&ok, "ratelimit-policy"),
            Some(r#""remote";q=3;w=60"#)
        );
    }
    let denied = send(&mut svc, get(Some("192.0.2.1:1"))).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "retry-after"), Some("20"));
    assert_eq!(header(&denied, "ratelimit"), Some(r#""remote";r=0;t=20"#));
    assert_eq!(
        calls.load(Ordering::Relaxed),
        3,
        "the denied request was not forwarded"
    );
    // Each allowed response: a check and a peek (for t); the denial: a check only.
    assert_eq!(round_trips.load(Ordering::Relaxed), 3 * 2 + 1);
    // Another client is independent.
    let other = send(&mut svc, get(Some("192.0.2.2:1"))).await;
    assert_eq!(other.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_sync_limiter_works_behind_the_async_layer_and_missing_keys_follow_the_policy() {
    let clock = ManualClock::new();
    let table: KeyedLimiter<IpAddr, Gcra, ManualClock> =
        KeyedLimiter::with_clock(Quota::per_second(1).unwrap(), 100, clock).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut svc = AsyncRateLimitLayer::builder(PeerIp::new(), "sync", table)
        .unwrap()
        .build()
        .layer(inner(&calls));
    assert_eq!(
        send(&mut svc, get(Some("192.0.2.1:1"))).await.status(),
        StatusCode::OK
    );
    let denied = send(&mut svc, get(Some("192.0.2.1:1"))).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    // No peer address: rejected with 400 by default, never forwarded.
    assert_eq!(
        send(&mut svc, get(None)).await.status(),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(calls.load(Ordering::Relaxed), 1);

    let table: KeyedLimiter<IpAddr, Gcra, ManualClock> =
        KeyedLimiter::with_clock(Quota::per_second(1).unwrap(), 100, ManualClock::new()).unwrap();
    let mut allow = AsyncRateLimitLayer::builder(PeerIp::new(), "sync", table)
        .unwrap()
        .on_missing_key(MissingKey::Allow)
        .build()
        .layer(inner(&calls));
    let passed = send(&mut allow, get(None)).await;
    assert_eq!(passed.status(), StatusCode::OK);
    assert!(passed.headers().get("ratelimit").is_none());
    assert_eq!(calls.load(Ordering::Relaxed), 2);
}
