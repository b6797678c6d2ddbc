//! `RedisPolicy` on a real Redis Cluster (3 masters + 3 replicas started on loopback; issue 26
//! item 2): the same answers as on one node, whether a request's keys share a slot or not.
//!
//! * With `hash_tag = "tenant"`, the keys of the rules keyed by the tenant share the tenant's slot:
//!   a request touching only those is one script (one `EVALSHA` over the whole cluster).
//! * A request whose keys lie in several slots (a global rule beside them, or no hash tag) is one
//!   script per slot group with compensating refunds: the decisions and the stored counts are those
//!   of the same policy on one node.

/// The cluster harness, which finds `answers_as` and `command_calls` in its parent module.
#[path = "../../redis/tests/common/cluster.rs"]
mod cluster;
#[path = "../../redis/tests/common/redis_server.rs"]
mod redis_server;

use std::time::Duration;

use cluster::RedisCluster;
use redis_server::{RedisServer, answers_as, command, command_calls};
use tollgate_policy::{ConfigErrorKind, PolicyConfig, RedisPolicy, RedisSettings};
use tollgate_redis::{Durability, RedisConfig, slot};

const NOW: u64 = 500_000 * 3_600_000_000_000 + 1_000_000_000;

const TENANT_RULES: &str = r#"
    [[rules]]
    name = "per_tenant"
    match = { tenant = "any" }
    key = ["tenant"]
    limit = 3
    period = "1h"

    [[rules]]
    name = "per_tenant_user"
    match = { tenant = "any", user = "any" }
    key = ["tenant", "user"]
    algorithm = "fixed_window"
    limit = 2
    period = "1h"
"#;

const GLOBAL_RULE: &str = r#"
    [[rules]]
    name = "global"
    algorithm = "sliding_window"
    limit = 100
    period = "1h"
"#;

fn settings(hash_tag: Option<&str>) -> RedisSettings {
    RedisSettings {
        prefix: "c:".to_owned(),
        timeout: Duration::from_secs(2),
        hash_tag: hash_tag.map(str::to_owned),
        ..RedisSettings::default()
    }
}

#[tokio::test]
async fn a_policy_on_a_cluster_answers_as_on_one_node() {
    let cluster = RedisCluster::start(Duration::from_secs(2));
    let node = RedisServer::start();
    let cfg = RedisConfig::default().with_timeout(Duration::from_secs(2));
    let cluster_conn = tollgate_redis::connect_cluster(cluster.urls(), &cfg)
        .await
        .unwrap();
    let node_conn = tollgate_redis::connect(&node.url(), &cfg).unwrap();

    // The exact path: every rule keyed by the tenant, tagged by it: one script per request.
    let tenant = PolicyConfig::from_toml(TENANT_RULES).unwrap();
    let durable = RedisSettings {
        durable: Some(Durability::new(1, Duration::from_millis(5))),
        ..settings(None)
    };
    let refused = RedisPolicy::new(tenant.clone(), cluster_conn.clone(), durable).unwrap_err();
    assert_eq!(refused.kind, ConfigErrorKind::ClusterNotDurable);
    let tagged = RedisPolicy::new(
        tenant.clone(),
        cluster_conn.clone(),
        settings(Some("tenant")),
    )
    .unwrap();
    let request = [("tenant", "acme"), ("user", "u1")];
    assert!(
        tagged
            .check_at(&request, NOW, 1)
            .await
            .unwrap()
            .0
            .is_allowed()
    );
    let keys = [
        format!("c:per_tenant:gcra:{{t{}}}acme", hex("acme")),
        format!(
            "c:per_tenant_user:fixed_window:{{t{}}}{}",
            hex("acme"),
            composite(&["acme", "u1"])
        ),
    ];
    assert_eq!(slot(keys[0].as_bytes()), slot(keys[1].as_bytes()));
    let master = cluster.master_of(slot(keys[0].as_bytes())).port;
    for k in &keys {
        assert_eq!(command(master, &["EXISTS", k]), "1", "{k}");
    }
    for allowed in [true, false] {
        let before = cluster.batch_calls();
        let (d, _) = tagged.check_at(&request, NOW, 1).await.unwrap();
        assert_eq!(d.is_allowed(), allowed);
        assert_eq!(
            cluster.batch_calls() - before,
            1,
            "one script for the request"
        );
    }

    // Split paths, against the same policy on one node: a global rule beside the tagged ones, and
    // the same rules without a hash tag (the tenant's keys then fall in different slots).
    let with_global = PolicyConfig::from_toml(&format!("{TENANT_RULES}{GLOBAL_RULE}")).unwrap();
    for (name, config, tag) in [
        (
            "tagged with a global rule",
            with_global.clone(),
            Some("tenant"),
        ),
        ("untagged", with_global, None),
    ] {
        let prefix = format!("{}:", name.replace(' ', "_"));
        let settings = RedisSettings {
            prefix: prefix.clone(),
            ..settings(tag)
        };
        if tag.is_none() {
            let a = format!("{prefix}per_tenant:gcra:acme");
            let b = format!(
                "{prefix}per_tenant_user:fixed_window:{}",
                composite(&["acme", "u1"])
            );
            assert_ne!(
                slot(a.as_bytes()),
                slot(b.as_bytes()),
                "untagged keys share a slot"
            );
        }
        let on_cluster =
            RedisPolicy::new(config.clone(), cluster_conn.clone(), settings.clone()).unwrap();
        let on_node = RedisPolicy::new(config, node_conn.clone(), settings).unwrap();
        let users = ["u1", "u1", "u1", "u2", "u2", "u3", "u2"];
        for (i, user) in users.iter().enumerate() {
            let request = [("tenant", "acme"), ("user", *user)];
            let (c, _) = on_cluster.check_at(&request, NOW, 1).await.unwrap();
            let (n, _) = on_node.check_at(&request, NOW, 1).await.unwrap();
            assert_eq!(
                (c.is_allowed(), c.rule, c.decision.remaining()),
                (n.is_allowed(), n.rule, n.decision.remaining()),
                "{name}: request {i}"
            );
        }
        // The global rule counted only the admitted requests (3, the tenant's quota): the refused
        // requests' units came back.
        let global = format!("{prefix}global:sliding_window:");
        let at = cluster.master_of(slot(global.as_bytes())).port;
        assert_eq!(command(at, &["HGET", &global, "c"]), "3", "{name}");
        assert_eq!(command(node.port, &["HGET", &global, "c"]), "3", "{name}");
    }
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The hex of the length-prefixed parts: a composite key as the policy names it.
fn composite(parts: &[&str]) -> String {
    let mut key = String::new();
    for part in parts {
        for byte in u32::try_from(part.len()).unwrap().to_le_bytes() {
            key.push_str(&format!("{byte:02x}"));
        }
        key.push_str(&hex(part));
    }
    key
}
