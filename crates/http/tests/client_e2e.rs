//! End to end: `tollgate-client`'s retry layer against the example router, on tokio's paused clock.
//!
//! The router's limiters read a [`Clock`] over tokio's (paused) time, so the client's backoff sleeps
//! and the server's quota refill run on the same virtual clock: a retry that waits exactly
//! `Retry-After` must pass, and the test measures that wait exactly, without sleeping for real.
//! The router is called in process as a tower service (no sockets: with paused time, tokio would
//! auto-advance the clock while a socket waits, making timings depend on the scheduler).

#[allow(dead_code, clippy::duplicate_mod)]
#[path = "../examples/server.rs"]
mod server;

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{Request, StatusCode};
use tokio::time::Instant;
use tollgate_client::{Backoff, Jitter, RetryLayer, RetryPolicy};
use tollgate_core::{Clock, Nanos};
use tower::{Layer, ServiceBuilder, ServiceExt};

/// Tokio's clock (virtual when paused), as a limiter clock.
#[derive(Clone)]
struct TokioClock {
    origin: Instant,
}

impl Clock for TokioClock {
    fn now(&self) -> Nanos {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(Nanos::MAX)
    }
}

fn request(path: &str) -> Request<String> {
    let mut req = Request::get(path).body(String::new()).unwrap();
    req.extensions_mut()
        .insert(ConnectInfo(SocketAddr::from(([192, 0, 2, 7], 5555))));
    req
}

/// The example router behind the client's retry layer, with a body type the policy can clone.
fn client_over_router(
    router: axum::Router,
    policy: RetryPolicy,
) -> impl tower::Service<
    Request<String>,
    Response = http::Response<Body>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone {
    let service = ServiceBuilder::new()
        .map_request(|req: Request<String>| req.map(Body::from))
        .service(router);
    RetryLayer::new(policy).layer(service)
}

fn policy() -> RetryPolicy {
    let backoff = Backoff::builder()
        .base(Duration::from_millis(100))
        .cap(Duration::from_secs(60))
        .max_attempts(4)
        .jitter(Jitter::Full)
        .build()
        .unwrap();
    RetryPolicy::new(backoff).seed(7)
}

#[tokio::test(start_paused = true)]
async fn the_client_waits_exactly_retry_after_and_then_passes() {
    let clock = TokioClock {
        origin: Instant::now(),
    };
    let router = server::app(clock, vec![]).unwrap();
    let client = client_over_router(router, policy());

    // Spend the /search quota (3 per minute) at t = 0.
    for _ in 0..3 {
        let ok = client.clone().oneshot(request("/search")).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
    }
    // The fourth call is refused (Retry-After: 20); the client honours it to the second and the
    // retry passes.
    let start = Instant::now();
    let ok = client.clone().oneshot(request("/search")).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_secs(20));
}

#[tokio::test(start_paused = true)]
async fn sub_second_refills_cost_the_client_one_second_not_a_hot_loop() {
    let clock = TokioClock {
        origin: Instant::now(),
    };
    let router = server::app(clock, vec![]).unwrap();
    let client = client_over_router(router, policy());
    for _ in 0..5 {
        let ok = client.clone().oneshot(request("/hello")).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
    }
    // 5 per second: the next unit is 200 ms away, advertised as `Retry-After: 1` (never 0), so the
    // client makes exactly one retry, one second later.
    let start = Instant::now();
    let ok = client.clone().oneshot(request("/hello")).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
}
