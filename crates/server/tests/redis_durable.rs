//! `durable = { replicas, timeout }` on a Redis domain (issue 26 item 5) end to end: a
//! tollgate-server over a local primary and its replica (two `redis-server`s started by the test,
//! the replica with `--replicaof`, stopped by PID). While the replica is up, admissions are
//! confirmed and answered by Redis; with it stopped, each admission is answered by the domain's fail
//! policy (closed: `OVER_LIMIT`; open: OK) within the `WAIT` timeout, and counted in `/metrics`.

mod common;
#[path = "../../redis/tests/common/redis_server.rs"]
mod redis_server;

use std::time::{Duration, Instant};

use common::{Server, descriptor, request, temp_dir};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use redis_server::{RedisServer, command};
use tonic::transport::Channel;

fn config(url: &str) -> String {
    let domain = |name: &str, fail: &str| {
        format!(
            r#"
[[domains]]
name = "{name}"
backend = {{ redis = {{ url = "{url}", prefix = "t:", fail = "{fail}", fail_retry_after = "3s", timeout = "5s", durable = {{ replicas = 1, timeout = "50ms" }} }} }}
[domains.policy]
[[domains.policy.rules]]
name = "per_user"
match = {{ user = "any" }}
key = ["user"]
limit = 100
period = "1h"
"#
        )
    };
    format!("{}{}", domain("closed", "closed"), domain("open", "open"))
}

async fn call(client: &mut RateLimitServiceClient<Channel>, domain: &str) -> RateLimitResponse {
    client
        .should_rate_limit(request(domain, vec![descriptor(&[("user", "u")])], 1))
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
async fn a_durable_domain_answers_by_its_fail_policy_when_the_replica_is_gone() {
    let primary = RedisServer::start();
    let mut replica = RedisServer::start_replica_of(primary.port);
    let server = Server::start(&temp_dir("redis-durable"), &config(&primary.url()));
    let mut client = server.client().await;
    for domain in ["closed", "open"] {
        for _ in 0..2 {
            let r = call(&mut client, domain).await;
            assert_eq!(r.overall_code, Code::Ok as i32, "{domain}: {r:?}");
            assert!(r.statuses[0].current_limit.is_some(), "decided by the rule");
        }
        // Confirmed: the replica holds both admissions.
        let key = format!("t:{domain}:per_user:gcra:u");
        assert_eq!(
            command(replica.port, &["GET", &key]),
            command(primary.port, &["GET", &key])
        );
    }

    replica.kill(); // SIGKILL, by PID
    for _ in 0..3 {
        let started = Instant::now();
        let r = call(&mut client, "closed").await;
        let took = started.elapsed();
        assert_eq!(r.overall_code, Code::OverLimit as i32, "fail closed: {r:?}");
        let retry = r
            .response_headers_to_add
            .iter()
            .find(|h| h.key == "retry-after")
            .map(|h| h.value.clone());
        assert_eq!(retry.as_deref(), Some("3"), "fail_retry_after advertised");
        assert!(
            took >= Duration::from_millis(50) && took < Duration::from_secs(5),
            "{took:?}"
        );
        let r = call(&mut client, "open").await;
        assert_eq!(r.overall_code, Code::Ok as i32, "fail open: {r:?}");
        assert!(
            r.statuses[0].current_limit.is_none(),
            "no rule decided: {r:?}"
        );
    }
    let (_, _, text) = server.http("GET", "/metrics", "");
    for (domain, answer) in [("closed", "closed"), ("open", "open")] {
        let counted = metric(
            &text,
            "tollgate_policy_store_failures_total",
            &[
                &format!("domain=\"{domain}\""),
                &format!("answer=\"{answer}\""),
                "cause=\"not_replicated\"",
            ],
        );
        assert_eq!(counted, 3.0, "{domain}:\n{text}");
    }
}
