//! End to end: `tollgate-client`'s retry layer against the example router, on tokio's paused clock.
//!
//! The router's limiters read a [`Clock`] over tokio's (paused) time, so the client's backoff sleeps
//! and the server's quota refill run on the same virtual clock: a retry that waits `Retry-After`
//! (exactly, or plus the client's bounded extra) must pass, and the test measures that wait
//! exactly, without sleeping for real.
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
use tollgate_client::{Backoff, Jitter, RetryLayer, RetryPolicy, ServerJitter};
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

fn policy(server_jitter: ServerJitter) -> RetryPolicy {
    let backoff = Backoff::builder()
        .base(Duration::from_millis(100))
        .cap(Duration::from_secs(60))
        .max_attempts(4)
        .jitter(Jitter::Full)
        .server_jitter(server_jitter)
        .build()
        .unwrap();
    RetryPolicy::new(backoff).seed(7)
}

#[tokio::test(start_paused = true)]
async fn the_client_waits_retry_after_and_then_passes() {
    // Exactly `Retry-After` with no extra configured; with the default extra, between it and 1 s
    // more (never earlier), and still a single retry.
    for (server_jitter, at_least, at_most) in [
        (ServerJitter::NONE, 20, 20),
        (ServerJitter::DEFAULT, 20, 21),
    ] {
        let clock = TokioClock {
            origin: Instant::now(),
        };
        let router = server::app(clock, vec![]).unwrap();
        let client = client_over_router(router, policy(server_jitter));

        // Spend the /search quota (3 per minute) at t = 0.
        for _ in 0..3 {
            let ok = client.clone().oneshot(request("/search")).await.unwrap();
            assert_eq!(ok.status(), StatusCode::OK);
        }
        // The fourth call is refused (Retry-After: 20); the client honours it and the retry
        // passes.
        let start = Instant::now();
        let ok = client.clone().oneshot(request("/search")).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        let took = start.elapsed();
        assert!(
            (Duration::from_secs(at_least)..=Duration::from_secs(at_most)).contains(&took),
            "{server_jitter:?}: {took:?}"
        );
    }
}

/// Issue 11, point 7 from the client's side: pausing for the `t` of the response that spent the
/// last unit (20 s for 3 per minute, not the 60 s until the quota is whole) is exactly enough.
#[tokio::test(start_paused = true)]
async fn pacing_on_an_allowed_responses_t_needs_no_retry() {
    let clock = TokioClock {
        origin: Instant::now(),
    };
    let router = server::app(clock, vec![]).unwrap();
    // One attempt: any 429 would come back to the test.
    let backoff = Backoff::builder().max_attempts(1).build().unwrap();
    let client = client_over_router(router, RetryPolicy::new(backoff).seed(7));
    let mut last = None;
    for _ in 0..3 {
        let ok = client.clone().oneshot(request("/search")).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        last = Some(ok);
    }
    let pause = tollgate_client::pause_hint(last.unwrap().headers()).unwrap();
    assert_eq!(pause, Duration::from_secs(20));
    tokio::time::sleep(pause - Duration::from_millis(1)).await;
    let early = client.clone().oneshot(request("/search")).await.unwrap();
    assert_eq!(early.status(), StatusCode::TOO_MANY_REQUESTS);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let ok = client.clone().oneshot(request("/search")).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn sub_second_refills_cost_the_client_one_second_not_a_hot_loop() {
    let clock = TokioClock {
        origin: Instant::now(),
    };
    let router = server::app(clock, vec![]).unwrap();
    let client = client_over_router(router, policy(ServerJitter::NONE));
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
