//! `PingoraRedisLimiter` against a real `redis-server` (started per test on a free loopback port):
//! two limiters on one Redis (two proxies in front of one upstream) share each client's quota and
//! answer as the in-process limiter does.

#[path = "../../redis/tests/common/redis_server.rs"]
mod redis_server;

use std::net::IpAddr;
use std::sync::Arc;

use http::HeaderMap;
use redis_server::RedisServer;
use tollgate_http::ClientIp;
use tollgate_pingora::{PingoraLimiter, PingoraRedisLimiter};
use tollgate_policy::{PolicyConfig, RedisPolicy, RedisSettings};
use tollgate_redis::RedisConfig;

const POLICY: &str = r#"
[[rules]]
name = "per_client"
match = { remote_address = "any" }
key = ["remote_address"]
limit = 3
period = "1h"
"#;

fn limiter(server: &RedisServer) -> PingoraRedisLimiter {
    let conn = tollgate_redis::connect(&server.url(), &RedisConfig::default()).expect("connect");
    let config = PolicyConfig::from_toml(POLICY).expect("config");
    let policy = RedisPolicy::new(config, conn, RedisSettings::default()).expect("policy");
    PingoraRedisLimiter::new(Arc::new(policy), ClientIp::trusting([]))
}

#[tokio::test]
async fn two_proxies_on_one_redis_share_a_clients_quota() {
    let server = RedisServer::start();
    let (a, b) = (limiter(&server), limiter(&server));
    let client: IpAddr = [198, 51, 100, 7].into();
    let other: IpAddr = [198, 51, 100, 8].into();
    let headers = HeaderMap::new();
    let mut allowed = Vec::new();
    for proxy in [&a, &b, &a, &b] {
        allowed.push(
            proxy
                .decide(Some(client), "GET", "/", &headers)
                .await
                .allowed,
        );
    }
    assert_eq!(
        allowed,
        [true, true, true, false],
        "3 per hour across both proxies"
    );
    let denied = b.decide(Some(client), "GET", "/", &headers).await;
    let (head, body) = PingoraLimiter::denial_response(&denied).expect("429");
    assert_eq!(head.status.as_u16(), 429);
    assert_eq!(
        head.headers.get("retry-after").expect("retry-after"),
        "1200"
    );
    assert_eq!(
        head.headers.get("ratelimit-policy").expect("policy"),
        "\"per_client\";q=3;w=3600"
    );
    assert!(body.starts_with(br#"{"error":"rate limit exceeded""#));
    assert!(a.decide(Some(other), "GET", "/", &headers).await.allowed);
}
