//! Per-request overhead of the HTTP rate-limit layer, allowed and denied, beside `tower_governor`.
//!
//! No network: each iteration builds a request, readies the service, calls it once and drops the
//! response; the inner service is always ready and answers an empty 200 at once, so its cost is what
//! `inner_only` measures, and `layer - inner_only` is the layer's overhead. All layers key by peer IP
//! (axum `ConnectInfo<SocketAddr>`), one hot key, on their default clocks.
//!
//! * `allowed`: a quota that never runs out (the allowed path, fields and all).
//! * `denied`: a quota of 1 per hour, spent before measuring (every call is a 429).
//!
//! `tollgate` sends the IETF `RateLimit`/`RateLimit-Policy` fields (its default); `tollgate_bare`
//! sends none on allowed responses (a 429 still carries Retry-After and the fields). `tower_governor`
//! is its default configuration (no headers on allowed responses; `Retry-After` and
//! `x-ratelimit-after` on a 429); `tower_governor_headers` adds its `x-ratelimit-*` on allowed ones.

use std::convert::Infallible;
use std::fmt::Debug;
use std::future::{Future, Ready, ready};
use std::net::{IpAddr, SocketAddr};
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use axum::body::Body;
use axum::extract::ConnectInfo;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response, StatusCode};
use tollgate_core::{Gcra, Quota};
use tollgate_http::{HeaderMode, PeerIp, RateLimitLayer};
use tollgate_sharded::KeyedLimiter;
use tower::{Layer, Service};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

/// An inner service that is always ready and answers an empty 200 without yielding.
#[derive(Clone, Copy)]
struct Ok200;

impl Service<Request<Body>> for Ok200 {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Body>) -> Self::Future {
        ready(Ok(Response::new(Body::empty())))
    }
}

fn request() -> Request<Body> {
    let mut req = Request::new(Body::empty());
    *req.uri_mut() = http::Uri::from_static("/api/items");
    req.extensions_mut()
        .insert(ConnectInfo(SocketAddr::from(([192, 0, 2, 1], 40_000))));
    req
}

/// Readies `svc`, calls it with `req` and polls the future once (every service here completes on the
/// first poll).
fn drive<S, B>(svc: &mut S, req: Request<Body>) -> Response<B>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    match svc.poll_ready(&mut cx) {
        Poll::Ready(Ok(())) => {}
        other => panic!("inner service not ready: {:?}", other.map(|r| r.err())),
    }
    let mut future = pin!(svc.call(req));
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(response)) => response,
        Poll::Ready(Err(e)) => panic!("service error: {e:?}"),
        Poll::Pending => panic!("the benchmark's services never wait"),
    }
}

fn bench<S, B>(
    c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    mut svc: S,
    expect: StatusCode,
) where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: Debug,
{
    assert_eq!(drive(&mut svc, request()).status(), expect, "{name}");
    // The request is built (and the response dropped) inside the timed loop, as in `inner_only`:
    // the difference is the layer's own cost, including dropping what it allocated.
    c.bench_function(name, |b| b.iter(|| drive(&mut svc, request())));
}

fn tollgate_layer(
    quota: Quota,
    headers: HeaderMode,
) -> RateLimitLayer<PeerIp, KeyedLimiter<IpAddr, Gcra>> {
    RateLimitLayer::builder(PeerIp::new())
        .policy("api", KeyedLimiter::new(quota, 1024).unwrap())
        .unwrap()
        .headers(headers)
        .build()
}

fn allowed(c: &mut Criterion) {
    let mut g = c.benchmark_group("http/allowed");
    // One unit per ns with a burst of 10^9: never runs out.
    let unlimited = Quota::per_second(1_000_000_000)
        .unwrap()
        .with_burst(1_000_000_000)
        .unwrap();
    let bare = HeaderMode {
        on_allowed: false,
        ..HeaderMode::default()
    };
    bench(&mut g, "inner_only", Ok200, StatusCode::OK);
    bench(
        &mut g,
        "tollgate",
        tollgate_layer(unlimited, HeaderMode::default()).layer(Ok200),
        StatusCode::OK,
    );
    bench(
        &mut g,
        "tollgate_bare",
        tollgate_layer(unlimited, bare).layer(Ok200),
        StatusCode::OK,
    );
    let config = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(u32::MAX)
        .finish()
        .unwrap();
    bench(
        &mut g,
        "tower_governor",
        GovernorLayer::new(config).layer(Ok200),
        StatusCode::OK,
    );
    let config = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(u32::MAX)
        .use_headers()
        .finish()
        .unwrap();
    bench(
        &mut g,
        "tower_governor_headers",
        GovernorLayer::new(config).layer(Ok200),
        StatusCode::OK,
    );
    g.finish();
}

fn denied(c: &mut Criterion) {
    let mut g = c.benchmark_group("http/denied");
    let hourly = Quota::per_hour(1).unwrap();
    bench(&mut g, "inner_only", Ok200, StatusCode::OK);
    // Spend the one unit first: every measured call is denied.
    let mut svc = tollgate_layer(hourly, HeaderMode::default()).layer(Ok200);
    drive(&mut svc, request());
    bench(&mut g, "tollgate", svc, StatusCode::TOO_MANY_REQUESTS);
    let config = GovernorConfigBuilder::default()
        .per_second(3600)
        .burst_size(1)
        .finish()
        .unwrap();
    let mut svc = GovernorLayer::new(config).layer(Ok200);
    drive(&mut svc, request());
    bench(&mut g, "tower_governor", svc, StatusCode::TOO_MANY_REQUESTS);
    g.finish();
}

criterion_group!(benches, allowed, denied);
criterion_main!(benches);
