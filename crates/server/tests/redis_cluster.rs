//! A Redis domain on a Redis Cluster end to end (issue 26 item 2): tollgate-server with
//! `cluster = true` over a local 3-master + 3-replica cluster the test starts on loopback.
//!
//! * `hash_tag = "tenant"`: a call's tenant-keyed rules share the tenant's slot, one script per
//!   call over the whole cluster, exact.
//! * A global rule beside them (another slot): one script per slot with compensating refunds; the
//!   global rule counts only the admitted calls.

/// The cluster harness, which finds `answers_as` and `command_calls` in its parent module.
#[path = "../../redis/tests/common/cluster.rs"]
mod cluster;
mod common;
#[path = "../../redis/tests/common/redis_server.rs"]
mod redis_server;

use std::time::Duration;

use cluster::{RedisCluster, slot};
use common::{Server, descriptor, request, temp_dir};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use redis_server::{answers_as, command, command_calls, ping};

fn config(url: &str) -> String {
    let domain = |name: &str, tag: &str, global: bool| {
        let global = if global {
            "[[domains.policy.rules]]\nname = \"global\"\nmatch = { tenant = \"any\" }\nalgorithm = \"sliding_window\"\nlimit = 100\nperiod = \"1h\"\n"
        } else {
            ""
        };
        format!(
            r#"
[[domains]]
name = "{name}"
backend = {{ redis = {{ url = "{url}", cluster = true, timeout = "5s" {tag} }} }}
[domains.policy]
descriptor_match = "subset"
[[domains.policy.rules]]
name = "per_tenant"
match = {{ tenant = "any" }}
key = ["tenant"]
limit = 3
period = "1h"
[[domains.policy.rules]]
name = "per_tenant_user"
match = {{ tenant = "any", user = "any" }}
key = ["tenant", "user"]
algorithm = "fixed_window"
limit = 2
period = "1h"
{global}"#
        )
    };
    format!(
        "{}{}",
        domain("tagged", r#", hash_tag = "tenant""#, false),
        domain("split", "", true)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_on_a_cluster_decides_each_call_as_one() {
    let cluster = RedisCluster::start(Duration::from_secs(2));
    assert!(ping(cluster.live_ports()[0]));
    let url = cluster.urls().remove(0);
    let server = Server::start(&temp_dir("redis-cluster"), &config(&url));
    let mut client = server.client().await;
    let users = ["u1", "u1", "u1", "u2", "u2", "u3"];
    // per_tenant_user (2) refuses u1's third call; per_tenant (3) refuses after u1, u1, u2.
    let want = [true, true, false, true, false, false];
    for domain in ["tagged", "split"] {
        let mut got = Vec::new();
        for (i, user) in users.into_iter().enumerate() {
            let before = cluster.batch_calls();
            let r = client
                .should_rate_limit(request(
                    domain,
                    vec![descriptor(&[("tenant", "acme"), ("user", user)])],
                    1,
                ))
                .await
                .expect("call succeeds")
                .into_inner();
            got.push(r.overall_code == Code::Ok as i32);
            // After the first call, which loads the script (NOSCRIPT, SCRIPT LOAD, EVALSHA).
            if domain == "tagged" && i > 0 {
                assert_eq!(cluster.batch_calls() - before, 1, "one script per call");
            }
        }
        assert_eq!(got, want, "{domain}");
    }
    // The tagged keys share the tenant's slot.
    let tag = "{t61636d65}";
    let a = format!("tollgate:tagged:per_tenant:gcra:{tag}acme");
    let master = cluster.master_of(slot(&a)).port;
    assert_eq!(command(master, &["EXISTS", &a]), "1", "{a}");
    // The split domain's global rule counted the 3 admitted calls only.
    let global = "tollgate:split:global:sliding_window:";
    let at = cluster.master_of(slot(global)).port;
    assert_eq!(command(at, &["HGET", global, "c"]), "3");
}
