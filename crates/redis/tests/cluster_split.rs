//! `RedisBatch::with_slot_groups` on a real Redis Cluster (3 masters + 3 replicas started on
//! loopback; issue 26 item 2): a request whose keys lie in several slots is one script per slot
//! group, sent concurrently, and the groups that committed get compensating refunds when another
//! denies.
//!
//! * Differential: the same requests through a split batch on the cluster and a plain batch on one
//!   `redis-server` give the same decisions and leave the same stored states (TTLs aside: a refund
//!   sets its own).
//! * The bound under concurrency: tasks racing on two keys in two slots never admit beyond the
//!   tighter quota; once every refund has landed each key holds exactly the admitted requests, so
//!   the units a refused request held for a moment are all admissible again.
//! * The crate's `slot` agrees with the cluster's `CLUSTER KEYSLOT`.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::cluster::RedisCluster;
use common::{RedisServer, command};
use tollgate_core::{FixedWindow, Gcra, Nanos, Quota, SlidingWindow};
use tollgate_redis::{
    BatchKey, BatchLimit, RedisBatch, RedisConfig, admitted, connect, connect_cluster, slot,
};

/// One frozen instant (ns), around 2023: exact counting.
const NOW: Nanos = 1_700_000_000_012_345 * 1000;

fn config() -> RedisConfig {
    RedisConfig::default()
        .with_prefix("s:")
        .with_timeout(Duration::from_secs(2))
}

/// The key's value on the Redis at `port` as a script reads it (a string, or a hash's fields
/// sorted), TTL aside.
fn value(port: u16, key: &str) -> String {
    match command(port, &["TYPE", key]).as_str() {
        "string" => command(port, &["GET", key]),
        "hash" => {
            let out = command(port, &["HGETALL", key]);
            let lines: Vec<&str> = out.lines().collect();
            let mut pairs: Vec<String> = lines.chunks(2).map(|p| p.join("=")).collect();
            pairs.sort();
            pairs.join(",")
        }
        other => other.to_owned(),
    }
}

/// Names `stem0`, `stem1`, ... whose slots are on `n` different masters.
fn on_different_masters(cluster: &RedisCluster, stem: &str, n: usize) -> Vec<String> {
    let mut masters = HashSet::new();
    let mut names = Vec::new();
    for i in 0.. {
        let name = format!("{stem}{i}");
        let master = cluster.master_of(slot(format!("s:{name}").as_bytes())).port;
        if masters.insert(master) {
            names.push(name);
            if names.len() == n {
                break;
            }
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_across_slots_is_decided_as_on_one_node_with_refunds() {
    let cluster = RedisCluster::start(Duration::from_secs(2));
    let node = RedisServer::start();
    let cfg = config();
    let split = RedisBatch::new(
        connect_cluster(cluster.urls(), &cfg).await.unwrap(),
        cfg.clone(),
    )
    .with_slot_groups();
    let one = RedisBatch::new(connect(&node.url(), &cfg).unwrap(), cfg.clone());
    let port = cluster.live_ports()[0];
    for k in ["foo", "{user1000}.following", "s:\0{}x", "ключ🔑"] {
        let keyslot = command(port, &["CLUSTER", "KEYSLOT", k]);
        assert_eq!(keyslot, slot(k.as_bytes()).to_string(), "{k:?}");
    }

    let gcra = BatchLimit::for_quota::<Gcra>(Quota::per_minute(3).unwrap()).unwrap();
    let fixed = BatchLimit::for_quota::<FixedWindow>(Quota::per_minute(5).unwrap()).unwrap();
    let sliding = BatchLimit::for_quota::<SlidingWindow>(Quota::per_minute(2).unwrap()).unwrap();
    let watch = BatchLimit::for_quota::<Gcra>(Quota::per_minute(1).unwrap()).unwrap();
    // Four keys on three masters (the fourth shares a master, not a slot).
    let mut names = on_different_masters(&cluster, "k", 3);
    names.push("w".to_owned());
    let slots: HashSet<u16> = names
        .iter()
        .map(|n| slot(format!("s:{n}").as_bytes()))
        .collect();
    assert_eq!(slots.len(), 4, "{names:?}");
    let keys = [
        BatchKey::enforcing(&names[0], &gcra),
        BatchKey::enforcing(&names[1], &fixed),
        BatchKey::enforcing(&names[2], &sliding),
        BatchKey::shadow(&names[3], &watch),
    ];
    // The sliding window (2) denies the third request and the GCRA (3) the fourth, so the other
    // groups' admissions are refunded; a cost of 2 is denied by the sliding window at once.
    let costs = [1, 1, 1, 2, 1, 1];
    let mut refused = 0;
    for (step, cost) in costs.into_iter().enumerate() {
        let on_cluster = split.try_check_at(&keys, NOW, cost).await.unwrap();
        let on_node = one.try_check_at(&keys, NOW, cost).await.unwrap();
        assert_eq!(on_cluster, on_node, "step {step}");
        refused += usize::from(!admitted(&keys, &on_cluster));
        for name in &names {
            let key = format!("s:{name}");
            let master = cluster.master_of(slot(key.as_bytes())).port;
            assert_eq!(
                value(master, &key),
                value(node.port, &key),
                "step {step}: {key}"
            );
        }
    }
    assert_eq!(refused, 4, "two admitted, then four refused");
    // Peeks across slots write nothing and answer as one node does.
    assert_eq!(
        split.try_peek_at(&keys, NOW, 1).await.unwrap(),
        one.try_peek_at(&keys, NOW, 1).await.unwrap()
    );

    // The bound under concurrency: 4 tasks × 10 requests on two keys in two slots, quotas 10 and 12.
    let pair = on_different_masters(&cluster, "p", 2);
    let ten = BatchLimit::for_quota::<FixedWindow>(Quota::per_minute(10).unwrap()).unwrap();
    let twelve = BatchLimit::for_quota::<FixedWindow>(Quota::per_minute(12).unwrap()).unwrap();
    let split = Arc::new(split);
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (split, pair, ten, twelve) = (
            Arc::clone(&split),
            pair.clone(),
            ten.clone(),
            twelve.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let keys = [
                BatchKey::enforcing(&pair[0], &ten),
                BatchKey::enforcing(&pair[1], &twelve),
            ];
            let mut admitted_here = 0;
            for _ in 0..10 {
                let d = split.try_check_at(&keys, NOW, 1).await.unwrap();
                admitted_here += u64::from(admitted(&keys, &d));
            }
            admitted_here
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert!(total <= 10, "admitted {total} beyond the quota of 10");
    for name in &pair {
        let key = format!("s:{name}");
        let master = cluster.master_of(slot(key.as_bytes())).port;
        let count = command(master, &["HGET", &key, "c"]);
        assert_eq!(count, total.to_string(), "{key} holds what was admitted");
    }
    // Every unit a refused request held for a moment is admissible again.
    let keys = [
        BatchKey::enforcing(&pair[0], &ten),
        BatchKey::enforcing(&pair[1], &twelve),
    ];
    let mut more = 0;
    for _ in 0..12 {
        more += u64::from(admitted(
            &keys,
            &split.try_check_at(&keys, NOW, 1).await.unwrap(),
        ));
    }
    assert_eq!(total + more, 10, "raced {total}, then {more}");
}
