//! The response-path charge over the RLS, no Envoy needed: a descriptor carrying the entry
//! `tollgate=charge` is charged its `hits_addend` (the marker taken out before matching) and
//! answered `OK`; the tenant then waits out the debt. A charge and a check in one call are each
//! handled as alone; an explicit `hits_addend` of 0 charges nothing, and decides without taking
//! anything (refused only when overdrawn); the reserved key with another
//! value is `INVALID_ARGUMENT`; explain and reserve refuse a charge; a Redis domain charges the
//! shared state, so a second replica sees the debt.

mod common;
#[path = "../../redis/tests/common/redis_server.rs"]
mod redis_server;

use common::{Server, descriptor, request, temp_dir};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use redis_server::RedisServer;

/// 1 000 tokens an hour per tenant: nothing refills during a test.
fn rules(backend: &str) -> String {
    format!(
        r#"
[[domains]]
name = "llm"
{backend}
[domains.policy]
[[domains.policy.rules]]
name = "tokens"
match = {{ tenant = "any" }}
key = ["tenant"]
algorithm = "fixed_window"
limit = 1000
period = "1h"
capacity = 1000
"#
    )
}

/// A descriptor with its own `hits_addend` (`Some(0)` is an explicit 0).
fn with_hits(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: hits.map(uint64),
        ..descriptor(entries)
    }
}

fn uint64(value: u64) -> envoy_types::pb::google::protobuf::UInt64Value {
    envoy_types::pb::google::protobuf::UInt64Value { value }
}

fn charge(tenant: &str, tokens: u64) -> RateLimitDescriptor {
    with_hits(&[("tenant", tenant), ("tollgate", "charge")], Some(tokens))
}

async fn call(server: &Server, req: RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
    let mut client = server.client().await;
    client.should_rate_limit(req).await.map(|r| r.into_inner())
}

/// The `remaining` of one check of `tenant` (`None` when over the limit).
async fn remaining(server: &Server, tenant: &str) -> Option<u32> {
    let r = call(
        server,
        request("llm", vec![descriptor(&[("tenant", tenant)])], 1),
    )
    .await
    .expect("check");
    (r.overall_code == Code::Ok as i32).then(|| r.statuses[0].limit_remaining)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_is_counted_answered_ok_and_puts_the_tenant_in_debt() {
    let server = Server::start(&temp_dir("charge"), &rules(""));
    assert_eq!(remaining(&server, "acme").await, Some(999));
    let r = call(&server, request("llm", vec![charge("acme", 900)], 0))
        .await
        .unwrap();
    assert_eq!(r.overall_code, Code::Ok as i32, "a charge is never denied");
    assert_eq!(r.statuses[0].code, Code::Ok as i32);
    assert!(r.statuses[0].current_limit.is_none(), "no rule decided it");
    assert_eq!(
        remaining(&server, "acme").await,
        Some(98),
        "1 + 900 + this one"
    );
    // 98 left, 150 used: 52 in debt, denied from now on.
    call(&server, request("llm", vec![charge("acme", 150)], 0))
        .await
        .unwrap();
    assert_eq!(remaining(&server, "acme").await, None);
    assert_eq!(
        remaining(&server, "globex").await,
        Some(999),
        "another tenant"
    );
    let (_, _, metrics) = server.http("GET", "/metrics", "");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tollgate_server_charged_units_total{")
                && l.contains("\"llm\"")
                && l.ends_with(" 1050")),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_mixing_a_charge_and_a_check_handles_each_as_alone() {
    let server = Server::start(&temp_dir("charge-mixed"), &rules(""));
    // The check is decided after the charge and sees it: 1 000 - 400 - 1.
    let r = call(
        &server,
        request(
            "llm",
            vec![charge("acme", 400), descriptor(&[("tenant", "acme")])],
            0,
        ),
    )
    .await
    .unwrap();
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses.len(), 2);
    assert_eq!(r.statuses[1].limit_remaining, 599);
    // A check over the limit does not undo a charge in the same call.
    let r = call(
        &server,
        request(
            "llm",
            vec![
                charge("acme", 100),
                with_hits(&[("tenant", "acme")], Some(600)),
            ],
            0,
        ),
    )
    .await
    .unwrap();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].code, Code::Ok as i32);
    assert_eq!(
        remaining(&server, "acme").await,
        Some(498),
        "599 - 100 - this one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_zero_charges_nothing_and_the_reserved_key_is_checked() {
    let server = Server::start(&temp_dir("charge-bad"), &rules(""));
    call(&server, request("llm", vec![charge("acme", 0)], 0))
        .await
        .unwrap();
    assert_eq!(
        remaining(&server, "acme").await,
        Some(999),
        "nothing was charged"
    );
    // A decision of 0 units (a descriptor's explicit hits_addend 0, as Envoy's AI gateways send on
    // the request path) takes nothing: admitted unless the tenant is overdrawn.
    let peek = |tenant: &str| request("llm", vec![with_hits(&[("tenant", tenant)], Some(0))], 0);
    let r = call(&server, peek("acme")).await.unwrap();
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, 999, "nothing taken");
    call(&server, request("llm", vec![charge("debtor", 1_000)], 0))
        .await
        .unwrap();
    let r = call(&server, peek("debtor")).await.unwrap();
    assert_eq!(
        r.overall_code,
        Code::Ok as i32,
        "spent to the unit, not overdrawn"
    );
    call(&server, request("llm", vec![charge("debtor", 1)], 0))
        .await
        .unwrap();
    let r = call(&server, peek("debtor")).await.unwrap();
    assert_eq!(r.overall_code, Code::OverLimit as i32, "overdrawn: refused");

    let bad = with_hits(&[("tenant", "acme"), ("tollgate", "yes")], Some(5));
    let status = call(&server, request("llm", vec![bad], 0))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("reserved"),
        "{}",
        status.message()
    );
    assert_eq!(
        remaining(&server, "acme").await,
        Some(998),
        "the bad call took nothing"
    );

    // JSON: explain and reserve take decisions, not charges.
    let body = r#"{"domain":"llm","descriptors":[{"entries":{"tenant":"acme","tollgate":"charge"}}],"explain":true}"#;
    let (status, _, text) = server.http("POST", "/v1/check", body);
    assert_eq!(status, 400, "{text}");
    let body = r#"{"domain":"llm","descriptors":[{"entries":{"tenant":"acme","tollgate":"charge"}}],"estimate":5}"#;
    let (status, _, text) = server.http("POST", "/v1/reserve", body);
    assert_eq!(status, 400, "{text}");
    // ... and /v1/check charges as the RLS does.
    let body = r#"{"domain":"llm","descriptors":[{"entries":{"tenant":"acme","tollgate":"charge"},"hits_addend":97}]}"#;
    let (status, _, text) = server.http("POST", "/v1/check", body);
    assert_eq!(status, 200, "{text}");
    assert_eq!(remaining(&server, "acme").await, Some(900));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_domain_charges_the_shared_state() {
    let redis = RedisServer::start();
    let backend = format!(
        r#"backend = {{ redis = {{ url = "{}", mode = "per_request" }} }}"#,
        redis.url()
    );
    let dir = temp_dir("charge-redis");
    let (dir_a, dir_b) = (dir.join("a"), dir.join("b"));
    for d in [&dir_a, &dir_b] {
        std::fs::create_dir_all(d).expect("dir");
    }
    let a = Server::start(&dir_a, &rules(&backend));
    let b = Server::start(&dir_b, &rules(&backend));
    assert_eq!(remaining(&a, "acme").await, Some(999));
    call(&a, request("llm", vec![charge("acme", 990)], 0))
        .await
        .unwrap();
    assert_eq!(
        remaining(&b, "acme").await,
        Some(8),
        "the other replica sees the charge"
    );
    call(&b, request("llm", vec![charge("acme", 20)], 0))
        .await
        .unwrap();
    assert_eq!(remaining(&a, "acme").await, None, "in debt on both");
    assert_eq!(remaining(&b, "acme").await, None);
}
