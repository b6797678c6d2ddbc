//! A rate-limited axum server: two routes with different per-client quotas.
//!
//! ```text
//! cargo run -p tollgate-http --example server -- 127.0.0.1:3000
//! TOLLGATE_ADDR=0.0.0.0:8080 TOLLGATE_TRUSTED_PROXIES=10.0.0.0/8,::1/128 \
//!     cargo run -p tollgate-http --example server
//! curl -i http://127.0.0.1:3000/search   # the 4th call within a minute gets a 429
//! ```
//!
//! * `GET /hello`: 5 per second per client (burst 5).
//! * `GET /search`: 3 per minute per client.
//!
//! Clients are keyed by peer address, or, when the peer is one of `TOLLGATE_TRUSTED_PROXIES`, by the
//! right-most untrusted `X-Forwarded-For` hop; IPv6 clients are grouped by /64.
//!
//! The integration tests reuse [`app`] on a manual clock.

use std::error::Error;
use std::net::{IpAddr, SocketAddr};

use axum::Router;
use axum::routing::get;
use ipnet::IpNet;
use tollgate_core::{Clock, Gcra, MonotonicClock, Quota};
use tollgate_http::{ClientIp, IpGrouping, RateLimitLayer};
use tollgate_sharded::KeyedLimiter;

/// Keys the table holds per route before it evicts idle ones.
const CLIENTS: usize = 100_000;

/// The example's router, its limiters reading `clock`, trusting forwarding headers from `trusted`.
pub fn app<C: Clock + Clone + 'static>(
    clock: C,
    trusted: Vec<IpNet>,
) -> Result<Router, Box<dyn Error>> {
    let per_client =
        |quota| KeyedLimiter::<IpAddr, Gcra, C>::with_clock(quota, CLIENTS, clock.clone());
    let limits =
        RateLimitLayer::builder(ClientIp::trusting(trusted).grouping(IpGrouping::ipv6_prefix(64)))
            .route("/hello", "hello", per_client(Quota::per_second(5)?)?)?
            .route("/search", "search", per_client(Quota::per_minute(3)?)?)?
            .build();
    Ok(Router::new()
        .route("/hello", get(|| async { "hello\n" }))
        .route("/search", get(|| async { "results\n" }))
        .layer(limits))
}

/// Serves `router` on `listener`, recording each connection's peer address for the key extractor.
pub async fn serve(listener: tokio::net::TcpListener, router: Router) -> std::io::Result<()> {
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}

#[allow(dead_code)] // the tests include this file as a module and use only `app` and `serve`
#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let addr = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("TOLLGATE_ADDR").ok())
        .unwrap_or_else(|| "127.0.0.1:3000".to_owned());
    let trusted = std::env::var("TOLLGATE_TRUSTED_PROXIES")
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse::<IpNet>())
        .collect::<Result<Vec<_>, _>>()?;
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    serve(listener, app(MonotonicClock::new(), trusted)?).await?;
    Ok(())
}
