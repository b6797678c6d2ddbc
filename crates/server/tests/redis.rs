//! The Redis backend end to end: tollgate-server processes over a private `redis-server` (started
//! on a free loopback port by the test, killed by PID on drop).
//!
//! * Two server processes on one Redis share each rule's quota: exactly in `per_request` mode,
//!   within the lease mode's stated bound in `lease` mode.
//! * Redis killed (SIGKILL) while a client loops: the fail-closed domain denies, the fail-open one
//!   admits, answered by the circuit breaker and counted in `/metrics`; after a restart on the
//!   same port decisions come from Redis again within a bounded deadline.
//!
//! Quotas are 50 per hour, so wall time adds no units while a test runs (one unit per 72 s). Call
//! timeouts are seconds, not the 50 ms default: on a loaded CI machine a slow Redis answer would
//! otherwise be a (correct) fail-closed denial and blur the counts.

mod common;
#[path = "../../redis/tests/common/redis_server.rs"]
mod redis_server;

use std::time::{Duration, Instant};

use common::{Server, descriptor, request, temp_dir};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use redis_server::RedisServer;
use tonic::transport::Channel;

const LIMIT: u64 = 50;

fn shared_config(url: &str, backend_extra: &str) -> String {
    format!(
        r#"
[[domains]]
name = "shared"
backend = {{ redis = {{ url = "{url}", prefix = "t:", timeout = "5s" {backend_extra} }} }}
[domains.policy]
[[domains.policy.rules]]
name = "per_user"
match = {{ user = "any" }}
key = ["user"]
limit = {LIMIT}
period = "1h"
capacity = 1000
"#
    )
}

async fn call(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    user: &str,
) -> RateLimitResponse {
    client
        .should_rate_limit(request(domain, vec![descriptor(&[("user", user)])], 1))
        .await
        .expect("call succeeds")
        .into_inner()
}

fn is_ok(r: &RateLimitResponse) -> bool {
    r.overall_code == Code::Ok as i32
}

/// Whether the rule decided (a Redis answer or a live lease), rather than the fail-open answer
/// (which treats the rule as not applying, so no limit is reported).
fn rule_decided(r: &RateLimitResponse) -> bool {
    r.statuses
        .first()
        .is_some_and(|s| s.current_limit.is_some())
}

/// `tasks_per_server` concurrent loops on each server, `calls` calls each, on one key; the number
/// of admissions per server.
async fn hammer(servers: &[&Server], tasks_per_server: usize, calls: usize) -> Vec<u64> {
    let mut handles = Vec::new();
    for server in servers {
        let mut per_server = Vec::new();
        for _ in 0..tasks_per_server {
            let mut client = server.client().await;
            per_server.push(tokio::spawn(async move {
                let mut admitted = 0;
                for _ in 0..calls {
                    if is_ok(&call(&mut client, "shared", "alice").await) {
                        admitted += 1;
                    }
                }
                admitted
            }));
        }
        handles.push(per_server);
    }
    let mut out = Vec::new();
    for per_server in handles {
        let mut sum = 0;
        for h in per_server {
            sum += h.await.expect("task");
        }
        out.push(sum);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_share_one_quota_exactly_in_per_request_mode() {
    let redis = RedisServer::start();
    let dir = temp_dir("redis-shared-per-request");
    let config = shared_config(&redis.url(), r#", mode = "per_request""#);
    let a = Server::start(&subdir(&dir, "a"), &config);
    let b = Server::start(&subdir(&dir, "b"), &config);
    // 4 × 2 loops of 20 calls: 160 requests for 50 units, all racing on one key.
    let admitted = hammer(&[&a, &b], 4, 20).await;
    let total: u64 = admitted.iter().sum();
    eprintln!("per_request: admitted {admitted:?} of 160 requests");
    assert_eq!(total, LIMIT, "per-server admissions {admitted:?}");
    assert!(
        admitted.iter().all(|&n| n > 0),
        "both replicas admitted: {admitted:?}"
    );
    // Each server counts its own decisions in the policy's per-rule counters.
    let counted = |s: &Server, outcome: &str| {
        let (_, _, text) = s.http("GET", "/metrics", "");
        metric(
            &text,
            "tollgate_policy_decisions_total",
            &["rule=\"per_user\"", &format!("outcome=\"{outcome}\"")],
        )
    };
    let faults = |s: &Server| {
        let (_, _, text) = s.http("GET", "/metrics", "");
        metric(&text, "tollgate_policy_store_failures_total", &[])
    };
    assert_eq!(
        faults(&a) + faults(&b),
        0.0,
        "every call was decided by Redis"
    );
    assert_eq!(
        counted(&a, "allowed") + counted(&b, "allowed"),
        LIMIT as f64
    );
    assert_eq!(
        counted(&a, "denied") + counted(&b, "denied"),
        (160 - LIMIT) as f64
    );
    // Another key has its own quota, on either server.
    let mut client = b.client().await;
    assert!(is_ok(&call(&mut client, "shared", "bob").await));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_share_one_quota_within_the_lease_bound() {
    const K: u64 = 5;
    const N: u64 = 2;
    let redis = RedisServer::start();
    let dir = temp_dir("redis-shared-lease");
    // Leases live 30 s: longer than the test, so ⌈T / ttl⌉ = 1.
    let config = shared_config(
        &redis.url(),
        &format!(r#", mode = "lease", lease = {{ size = {K}, ttl = "30s" }}"#),
    );
    let a = Server::start(&subdir(&dir, "a"), &config);
    let b = Server::start(&subdir(&dir, "b"), &config);
    let admitted = hammer(&[&a, &b], 4, 20).await;
    let total: u64 = admitted.iter().sum();
    eprintln!("lease: admitted {admitted:?} of 160 requests");
    // LeasedLimiter's stated bound: never above burst + rate × (T + ttl) (rate × 31 s < 1 unit at
    // 50 per hour), and at least the per-request count minus n × k × (⌈T / ttl⌉ + 1).
    let floor = LIMIT - N * K * 2;
    assert!(
        (floor..=LIMIT).contains(&total),
        "lease mode admitted {total} ({admitted:?}); bound [{floor}, {LIMIT}]"
    );
    assert!(
        admitted.iter().all(|&n| n > 0),
        "both replicas admitted: {admitted:?}"
    );
}

/// `dir/name`, created.
fn subdir(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let sub = dir.join(name);
    std::fs::create_dir_all(&sub).expect("mkdir");
    sub
}

/// Polls `f` until it is true or `within` passes.
async fn eventually<F, Fut>(within: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if f().await {
            return true;
        }
    }
    false
}

fn metric(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_run_gets_the_fail_policy_fast_and_recovers_after_restart() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let dir = temp_dir("redis-killed");
    let rule = |domain: &str| {
        format!(
            "[domains.policy]\n[[domains.policy.rules]]\nname = \"{domain}_user\"\nmatch = {{ user = \"any\" }}\nkey = [\"user\"]\nlimit = 1000\nperiod = \"1h\"\ncapacity = 1000\n"
        )
    };
    // Closed: lease mode (a live lease is still spent during the outage). Open: per request.
    // The timeout is long enough that only the breaker can make outage answers fast.
    let config = format!(
        "[[domains]]\nname = \"closed\"\nbackend = {{ redis = {{ url = \"{url}\", mode = \"lease\", fail = \"closed\", fail_retry_after = \"2s\", timeout = \"2s\", breaker = {{ failures = 1, probe_interval = \"1s\" }}, lease = {{ size = 5, ttl = \"50ms\" }} }} }}\n{}\n[[domains]]\nname = \"open\"\nbackend = {{ redis = {{ url = \"{url}\", fail = \"open\", timeout = \"2s\", breaker = {{ failures = 1, probe_interval = \"1s\" }} }} }}\n{}",
        rule("closed"),
        rule("open")
    );
    let server = Server::start(&dir, &config);
    let mut client = server.client().await;
    // Both decided by Redis while it is up.
    for domain in ["closed", "open"] {
        let r = call(&mut client, domain, "u").await;
        assert!(
            is_ok(&r) && rule_decided(&r),
            "{domain} before the kill: {r:?}"
        );
    }

    redis.kill(); // SIGKILL
    let mut c2 = client.clone();
    assert!(
        eventually(Duration::from_secs(5), || {
            let mut c = c2.clone();
            async move { !is_ok(&call(&mut c, "closed", "u").await) }
        })
        .await,
        "the fail-closed domain denies once Redis is gone (after its live lease)"
    );
    assert!(
        eventually(Duration::from_secs(5), || {
            let mut c = c2.clone();
            async move {
                let r = call(&mut c, "open", "u").await;
                is_ok(&r) && !rule_decided(&r)
            }
        })
        .await,
        "the fail-open domain admits without the rule once Redis is gone"
    );
    // Now the breaker answers: every call gets the policy at once, without trying Redis, except
    // one probe per breaker per second (which may pay a refused connect).
    // The breakers open on the first failure (`failures = 1`), which the polls above have seen.
    let circuit_open = |text: &str| {
        metric(
            text,
            "tollgate_policy_store_failures_total",
            &["cause=\"circuit_open\""],
        )
    };
    let before = circuit_open(&server.http("GET", "/metrics", "").2);
    let started = Instant::now();
    let mut slow = 0;
    for _ in 0..20 {
        for domain in ["closed", "open"] {
            let t = Instant::now();
            let r = call(&mut c2, domain, "u").await;
            slow += usize::from(t.elapsed() > Duration::from_secs(1));
            if domain == "closed" {
                assert!(!is_ok(&r), "closed while down: {r:?}");
                let retry = r
                    .response_headers_to_add
                    .iter()
                    .find(|h| h.key == "retry-after")
                    .map(|h| h.value.clone());
                assert_eq!(retry.as_deref(), Some("2"), "fail_retry_after advertised");
            } else {
                assert!(is_ok(&r) && !rule_decided(&r), "open while down: {r:?}");
            }
        }
    }
    let probes = 2 * (started.elapsed().as_secs() as usize + 1);
    let answered_open = circuit_open(&server.http("GET", "/metrics", "").2) - before;
    assert!(
        slow <= probes && answered_open >= (40 - probes) as f64,
        "40 outage calls in {:?}: {slow} slower than 1 s, {answered_open} answered by the open \
         breaker (at most {probes} probes)",
        started.elapsed()
    );
    let (status, _, text) = server.http("GET", "/metrics", "");
    assert_eq!(status, 200);
    for (domain, answer) in [("closed", "closed"), ("open", "open")] {
        let d = format!("domain=\"{domain}\"");
        let a = format!("answer=\"{answer}\"");
        let open_circuit = metric(
            &text,
            "tollgate_policy_store_failures_total",
            &[&d, &a, "cause=\"circuit_open\""],
        );
        assert!(
            open_circuit >= 1.0,
            "{domain}: circuit_open answers counted:\n{text}"
        );
        // Lease mode: the rule's own limiter's breaker. Per request: the domain's one-script
        // batch, whose prefix is the domain's.
        let prefix = match domain {
            "closed" => format!("prefix=\"tollgate:{domain}:{domain}_user:gcra:\""),
            _ => format!("prefix=\"tollgate:{domain}:\""),
        };
        let breaker = metric(&text, "tollgate_redis_breaker_open{", &[&prefix]);
        assert_eq!(breaker, 1.0, "{domain}: breaker open gauge:\n{text}");
    }

    redis.restart(); // same port, empty data
    for domain in ["closed", "open"] {
        let c = client.clone();
        assert!(
            eventually(Duration::from_secs(10), || {
                let mut c = c.clone();
                async move {
                    let r = call(&mut c, domain, "u").await;
                    is_ok(&r) && rule_decided(&r)
                }
            })
            .await,
            "{domain}: decisions come from Redis again after the restart"
        );
    }
    let (_, _, text) = server.http("GET", "/metrics", "");
    for domain in ["closed", "open"] {
        // Lease mode: the rule's own limiter's breaker. Per request: the domain's one-script
        // batch, whose prefix is the domain's.
        let prefix = match domain {
            "closed" => format!("prefix=\"tollgate:{domain}:{domain}_user:gcra:\""),
            _ => format!("prefix=\"tollgate:{domain}:\""),
        };
        let breaker = metric(&text, "tollgate_redis_breaker_open{", &[&prefix]);
        assert_eq!(breaker, 0.0, "{domain}: breaker closed again:\n{text}");
    }
}

/// Replaces the file in one rename, as editors and ConfigMap updates do.
fn write_atomically(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

async fn admitted_of(client: &mut RateLimitServiceClient<Channel>, calls: usize) -> u64 {
    let mut n = 0;
    for _ in 0..calls {
        n += u64::from(is_ok(&call(client, "shared", "alice").await));
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_keeps_the_redis_state_and_a_new_url_gets_a_new_client() {
    let first = RedisServer::start();
    let second = RedisServer::start();
    let dir = temp_dir("redis-reload");
    let config = |url: &str, limit: u64| {
        shared_config(url, "").replace(&format!("limit = {LIMIT}"), &format!("limit = {limit}"))
    };
    let server = Server::start(&dir, &config(&first.url(), 5));
    let path = server.config.clone();
    let mut client = server.client().await;
    assert_eq!(admitted_of(&mut client, 3).await, 3);

    // Same Redis, limit 5 -> 6 per hour: the key's bucket is read under the new quota (3 units of
    // 720 s used = a TAT 2 160 s ahead; at 600 s per unit 2 of 6 are left), not a fresh 6.
    write_atomically(&path, &common::with_ports(&config(&first.url(), 6)));
    assert!(
        server
            .wait_log("config reloaded", Duration::from_secs(10))
            .is_some()
    );
    assert_eq!(admitted_of(&mut client, 6).await, 2, "no fresh burst");

    // Another Redis: a new client on the new URL, whose empty state admits the whole quota.
    write_atomically(&path, &common::with_ports(&config(&second.url(), 6)));
    assert!(
        server
            .wait_log("config reloaded", Duration::from_secs(10))
            .is_some()
    );
    assert_eq!(
        admitted_of(&mut client, 8).await,
        6,
        "the second Redis decides"
    );
    drop(first); // the old URL's server is not needed any more: nothing depends on it
    let mut more = server.client().await;
    assert_eq!(admitted_of(&mut more, 1).await, 0, "still the second Redis");
}

/// Several rules on Redis are decided as one, as embedded: a denial gives back what the other rules
/// admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_rules_on_redis_are_decided_as_one_and_a_denial_gives_units_back() {
    let redis = RedisServer::start();
    let dir = temp_dir("redis-rules-in-order");
    let config = format!(
        r#"
[[domains]]
name = "shared"
backend = {{ redis = {{ url = "{}", timeout = "5s" }} }}
[domains.policy]
descriptor_match = "subset"    # "wide" (no match) applies to every descriptor
[[domains.policy.rules]]
name = "wide"
limit = 5
period = "1h"
[[domains.policy.rules]]
name = "narrow"
match = {{ user = "any" }}
key = ["user"]
limit = 2
period = "1h"
capacity = 100
"#,
        redis.url()
    );
    let server = Server::start(&dir, &config);
    let mut client = server.client().await;
    let mut answers = Vec::new();
    for user in ["u", "u", "u", "v", "v", "v"] {
        let r = call(&mut client, "shared", user).await;
        let rule = r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.name.clone())
            .unwrap_or_default();
        answers.push((is_ok(&r), rule));
    }
    let expect = |ok: bool, rule: &str| (ok, rule.to_owned());
    // u's third call is denied by `narrow`, and `wide` (decided first) gets that unit back: after
    // u's two and v's two, `wide` has 1 left, so v's third call is denied by `narrow`, as the
    // embedded backend decides it (without the refund `wide` would have run out first).
    assert_eq!(
        answers,
        [
            expect(true, "narrow"),
            expect(true, "narrow"),
            expect(false, "narrow"),
            // `wide` has 2 left (u's third unit came back), `narrow` 1: `narrow` is the tighter.
            expect(true, "narrow"),
            // `wide` has 1 left, `narrow` 0.
            expect(true, "narrow"),
            expect(false, "narrow"),
        ]
    );
}
