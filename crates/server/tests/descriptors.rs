//! The descriptors of one ShouldRateLimit call: decided as one by default (a call over the limit
//! anywhere consumes nothing), independently with `descriptors = "independent"`; embedded and on
//! Redis.

mod common;

#[path = "../../redis/tests/common/redis_server.rs"]
mod redis_server;

use common::{Server, descriptor, request, temp_dir};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use redis_server::RedisServer;

fn config(mode: Option<&str>, backend: &str) -> String {
    let mode = mode.map_or_else(String::new, |m| format!("descriptors = \"{m}\"\n"));
    format!(
        r#"
[[domains]]
name = "edge"
backend = {backend}
{mode}
[domains.policy]
[[domains.policy.rules]]
name = "per_user"
match = {{ user = "any" }}
key = ["user"]
limit = 1
period = "1h"
capacity = 100
"#
    )
}

/// Calls with descriptors `users` (one per user): whether the call was OK, and each status.
async fn call(server: &Server, users: &[&str]) -> (bool, Vec<bool>) {
    let mut client = server.client().await;
    let descriptors = users.iter().map(|u| descriptor(&[("user", u)])).collect();
    let response = client
        .should_rate_limit(request("edge", descriptors, 1))
        .await
        .expect("answered")
        .into_inner();
    let ok = |code: i32| code == Code::Ok as i32;
    (
        ok(response.overall_code),
        response.statuses.iter().map(|s| ok(s.code)).collect(),
    )
}

async fn a_refused_call_consumes_nothing(backend: &str, name: &str) {
    let server = Server::start(&temp_dir(name), &config(None, backend));
    assert_eq!(
        call(&server, &["b"]).await,
        (true, vec![true]),
        "b spends its one unit"
    );
    // a is admitted, b is over: the call is refused, and a's unit goes back.
    assert_eq!(call(&server, &["a", "b"]).await, (false, vec![true, false]));
    assert_eq!(
        call(&server, &["a"]).await,
        (true, vec![true]),
        "a's unit came back"
    );
    assert_eq!(call(&server, &["a"]).await, (false, vec![false]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_calls_are_decided_as_one() {
    a_refused_call_consumes_nothing("\"embedded\"", "descriptors-embedded").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_calls_are_decided_as_one() {
    let redis = RedisServer::start();
    let backend = format!(
        "{{ redis = {{ url = \"{}\", timeout = \"5s\" }} }}",
        redis.url()
    );
    a_refused_call_consumes_nothing(&backend, "descriptors-redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn independent_descriptors_keep_what_they_admitted() {
    let server = Server::start(
        &temp_dir("descriptors-independent"),
        &config(Some("independent"), "\"embedded\""),
    );
    assert_eq!(call(&server, &["b"]).await, (true, vec![true]));
    assert_eq!(call(&server, &["a", "b"]).await, (false, vec![true, false]));
    assert_eq!(
        call(&server, &["a"]).await,
        (false, vec![false]),
        "a kept its unit spent"
    );
}
