//! Issue 26 item 8 end to end: a Redis domain never breaks on its input.
//!
//! * Descriptor values of any characters (NUL, CR LF, braces, Redis's own error text, any Unicode)
//!   and any length up to what the server states it takes (one request message of at most
//!   `MAX_REQUEST_BYTES`) are decided like any other value, by Redis, never by the fail policy.
//! * A key of a foreign Redis type among a call's keys: the whole call is answered by the domain's
//!   fail policy (closed: over the limit; open: OK), counted as a `config` failure, and no other key
//!   of the call is written.

mod common;
#[path = "../../redis/tests/common/redis_server.rs"]
mod redis_server;

use common::{Server, descriptor, request, temp_dir};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use redis_server::RedisServer;
use tollgate_server::grpc::MAX_REQUEST_BYTES;
use tonic::transport::Channel;

fn config(url: &str) -> String {
    let domain = |name: &str, fail: &str| {
        format!(
            r#"
[[domains]]
name = "{name}"
backend = {{ redis = {{ url = "{url}", prefix = "t:", fail = "{fail}", timeout = "5s" }} }}
[domains.policy]
descriptor_match = "subset"    # both rules apply to a descriptor of user and route
[[domains.policy.rules]]
name = "per_user"
match = {{ user = "any" }}
key = ["user"]
limit = 2
period = "1h"
[[domains.policy.rules]]
name = "pair"
match = {{ user = "any", route = "any" }}
key = ["user", "route"]
algorithm = "sliding_window"
limit = 3
period = "1h"
"#
        )
    };
    format!("{}{}", domain("closed", "closed"), domain("open", "open"))
}

async fn call(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    descriptors: &[&[(&str, &str)]],
) -> RateLimitResponse {
    let descriptors = descriptors.iter().map(|d| descriptor(d)).collect();
    client
        .should_rate_limit(request(domain, descriptors, 1))
        .await
        .expect("call succeeds")
        .into_inner()
}

fn metric(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_values_are_decided_by_redis_and_a_foreign_key_fails_the_call_by_the_policy() {
    let redis = RedisServer::start();
    let server = Server::start(&temp_dir("redis-bad-input"), &config(&redis.url()));
    let mut client = server.client().await;
    let mut raw = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let failures = |server: &Server, cause: &str| {
        let (_, _, text) = server.http("GET", "/metrics", "");
        metric(
            &text,
            "tollgate_policy_store_failures_total",
            &[&format!("cause=\"{cause}\"")],
        )
    };

    // The largest value a request can carry twice (as `user` and `route`) within the stated
    // message limit, less room for the rest of the message.
    let longest = "k".repeat((MAX_REQUEST_BYTES - 4096) / 2);
    let mut values: Vec<String> = [
        "",
        "\0",
        "a\0b",
        "a\r\nb",
        "\r\n*1\r\n$4\r\nPING\r\n",
        "{tag}",
        "}{",
        "\"'%s%d\\",
        "a: b script: c, on @user_script:1.",
        "TOLLGATE_KEY 1 WRONGTYPE",
        "-ERR x",
        "ключ🔑",
        "\u{202e}\u{feff}\u{fffd}\u{10ffff}",
    ]
    .iter()
    .map(|v| (*v).to_owned())
    .collect();
    values.push(longest);
    for v in &values {
        let shown: String = v.chars().take(40).collect();
        for round in 0..3 {
            let r = call(&mut client, "closed", &[&[("user", v), ("route", v)]]).await;
            let want = if round < 2 { Code::Ok } else { Code::OverLimit };
            assert_eq!(
                r.overall_code,
                want as i32,
                "{shown:?} ({} bytes) round {round}",
                v.len()
            );
        }
        let exists: bool = redis::cmd("EXISTS")
            .arg(format!("t:closed:per_user:gcra:{v}"))
            .query_async(&mut raw)
            .await
            .unwrap();
        assert!(exists, "{shown:?}: its key is the value verbatim");
    }
    assert_eq!(
        failures(&server, ""),
        0.0,
        "every call was decided by Redis"
    );

    // A list where `per_user` stores a GCRA string, in the call's second descriptor.
    for domain in ["closed", "open"] {
        let _: () = redis::cmd("RPUSH")
            .arg(format!("t:{domain}:per_user:gcra:bad"))
            .arg("x")
            .query_async(&mut raw)
            .await
            .unwrap();
    }
    let good: &[(&str, &str)] = &[("user", "good")];
    assert_eq!(
        call(&mut client, "closed", &[good]).await.overall_code,
        Code::Ok as i32
    );
    let before: Option<String> = redis::cmd("GET")
        .arg("t:closed:per_user:gcra:good")
        .query_async(&mut raw)
        .await
        .unwrap();
    let r = call(&mut client, "closed", &[good, &[("user", "bad")]]).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "fail closed: {r:?}");
    let after: Option<String> = redis::cmd("GET")
        .arg("t:closed:per_user:gcra:good")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(after, before, "the call's other key kept nothing");
    assert!(failures(&server, "config") >= 1.0);
    let r = call(&mut client, "open", &[good, &[("user", "bad")]]).await;
    assert_eq!(r.overall_code, Code::Ok as i32, "fail open: {r:?}");
    // The good key is untouched by the refused call: its second unit is still there.
    assert_eq!(
        call(&mut client, "closed", &[good]).await.overall_code,
        Code::Ok as i32
    );
    assert_eq!(
        call(&mut client, "closed", &[good]).await.overall_code,
        Code::OverLimit as i32
    );
}
