//! The tower layers over Redis, against a real `redis-server` (started per test on a free
//! loopback port): a `RedisPolicy` behind `RedisPolicyLayer`, and a `RedisLimiter` behind
//! `AsyncRateLimitLayer`. The same 429s and fields as in process.

#[path = "../../redis/tests/common/redis_server.rs"]
mod redis_server;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use redis_server::RedisServer;
use tollgate_core::Quota;
use tollgate_http::{AsyncRateLimitLayer, ClientIp, PeerIp, RedisPolicyLayer};
use tollgate_policy::{PolicyConfig, RedisPolicy, RedisSettings};
use tollgate_redis::{RedisConfig, RedisLimiter};
use tower::{Layer, ServiceExt, service_fn};

fn get(peer: &str) -> Request<()> {
    let mut req = Request::get("/api").body(()).unwrap();
    req.extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    req
}

fn ok() -> impl tower::Service<
    Request<()>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    })
}

#[tokio::test]
async fn a_redis_policy_behind_the_tower_layer_answers_as_in_process() {
    let server = RedisServer::start();
    let config = PolicyConfig::from_toml(
        r#"
        [[rules]]
        name = "per_ip"
        match = { remote_address = "any" }
        key = ["remote_address"]
        limit = 2
        period = "1h"
    "#,
    )
    .unwrap();
    let conn = tollgate_redis::connect(&server.url(), &RedisConfig::default()).unwrap();
    let policy = Arc::new(RedisPolicy::new(config, conn, RedisSettings::default()).unwrap());
    let layer = RedisPolicyLayer::builder(policy)
        .client_ip(ClientIp::trusting([]))
        .build();
    let service = layer.layer(ok());
    let mut statuses = Vec::new();
    let mut last = None;
    for _ in 0..3 {
        let response = service
            .clone()
            .oneshot(get("192.0.2.1:5000"))
            .await
            .unwrap();
        statuses.push(response.status());
        last = Some(response);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let denied = last.unwrap();
    let header = |name: &str| {
        denied
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    assert_eq!(header("retry-after").as_deref(), Some("1800"));
    assert_eq!(
        header("ratelimit-policy").as_deref(),
        Some("\"per_ip\";q=2;w=3600")
    );
    assert_eq!(
        header("ratelimit").as_deref(),
        Some("\"per_ip\";r=0;t=1800")
    );
    // Another client has its own quota.
    let other = service
        .clone()
        .oneshot(get("192.0.2.2:5000"))
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_redis_limiter_behind_the_async_layer() {
    let server = RedisServer::start();
    let config = RedisConfig::default().with_prefix("per_ip:");
    let conn = tollgate_redis::connect(&server.url(), &config).unwrap();
    let limiter = RedisLimiter::gcra(conn, Quota::per_hour(1).unwrap(), config).unwrap();
    let layer = AsyncRateLimitLayer::builder(PeerIp::new(), "per_ip", limiter)
        .unwrap()
        .build();
    let service = layer.layer(ok());
    let first = service.clone().oneshot(get("192.0.2.1:1")).await.unwrap();
    let second = service.clone().oneshot(get("192.0.2.1:1")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        second
            .headers()
            .get("retry-after")
            .unwrap()
            .to_str()
            .unwrap(),
        "3600"
    );
}
