//! `RedisSettings::durable` (issue 26 item 5) on a `RedisPolicy`, against a local primary and its
//! replica (two `redis-server`s the test starts, the replica with `--replicaof`, stopped by PID):
//! admissions confirmed while the replica is up; with it stopped, each admission is answered by the
//! fail policy (closed: denied; open: admitted with no rule deciding) within the `WAIT` timeout
//! and counted as `cause="not_replicated"`. Lease mode refuses it.

#[path = "../../redis/tests/common/redis_server.rs"]
mod redis_server;

use std::time::{Duration, Instant};

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redis_server::{RedisServer, command};
use tollgate_policy::{ConfigErrorKind, PolicyConfig, RedisPolicy, RedisSettings};
use tollgate_redis::{ConnectionManager, Durability, FaultPolicy, LeaseConfig, RedisConfig};

const RULES: &str = r#"
    [[rules]]
    name = "per_user"
    match = { user = "any" }
    key = ["user"]
    limit = 100
    period = "1h"

    [[rules]]
    name = "global"
    algorithm = "fixed_window"
    limit = 1000
    period = "1h"
"#;

const NOW: u64 = 500_000 * 3_600_000_000_000 + 1_000_000_000;
const TIMEOUT: Duration = Duration::from_secs(5);

fn conn(server: &RedisServer) -> ConnectionManager {
    tollgate_redis::connect(&server.url(), &RedisConfig::default().with_timeout(TIMEOUT))
        .expect("connect")
}

fn settings(fail: FaultPolicy, wait: Duration) -> RedisSettings {
    RedisSettings {
        prefix: "d:".to_owned(),
        fail,
        timeout: TIMEOUT,
        durable: Some(Durability::new(1, wait)),
        ..RedisSettings::default()
    }
}

/// `tollgate_policy_store_failures_total{cause="not_replicated"}` counted since the last read.
fn not_replicated(snapshotter: &Snapshotter) -> u64 {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| {
            let key = key.key();
            key.name() == "tollgate_policy_store_failures_total"
                && key
                    .labels()
                    .any(|l| l.key() == "cause" && l.value() == "not_replicated")
        })
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => n,
            other => panic!("{other:?}"),
        })
        .sum()
}

#[test]
fn a_missing_replica_answers_durable_admissions_by_the_fail_policy() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // A local recorder, so that the counts are this test's: the runtime runs on this thread.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(missing_replica(&snapshotter));
    });
}

async fn missing_replica(snapshotter: &Snapshotter) {
    let primary = RedisServer::start();
    let mut replica = RedisServer::start_replica_of(primary.port);
    let config = PolicyConfig::from_toml(RULES).unwrap();
    let closed_fail = FaultPolicy::FailClosed {
        retry_after: Duration::from_secs(7),
    };
    // While the replica is up: a generous wait, confirmed at once.
    let confirmed = RedisPolicy::new(
        config.clone(),
        conn(&primary),
        settings(closed_fail, Duration::from_secs(1)),
    )
    .unwrap();
    for _ in 0..3 {
        let (d, _) = confirmed.check_at(&[("user", "a")], NOW, 1).await.unwrap();
        assert!(d.is_allowed() && d.rule.is_some(), "{d:?}");
    }
    assert_eq!(not_replicated(snapshotter), 0);
    assert_eq!(
        command(replica.port, &["HGET", "d:global:fixed_window:", "c"]),
        "3"
    );

    replica.kill(); // SIGKILL, by PID
    let wait = Duration::from_millis(50);
    let closed =
        RedisPolicy::new(config.clone(), conn(&primary), settings(closed_fail, wait)).unwrap();
    let open = RedisPolicy::new(
        config,
        conn(&primary),
        settings(FaultPolicy::FailOpen, wait),
    )
    .unwrap();
    let started = Instant::now();
    let (d, _) = closed.check_at(&[("user", "a")], NOW, 1).await.unwrap();
    let took = started.elapsed();
    assert!(!d.is_allowed(), "fail closed denies: {d:?}");
    assert_eq!(d.decision.retry_after(), Some(Duration::from_secs(7)));
    assert!(took >= wait && took < wait + TIMEOUT, "{took:?}");
    // Both rules answered by the policy, each counted.
    assert_eq!(not_replicated(snapshotter), 2);
    let (d, _) = open.check_at(&[("user", "a")], NOW, 1).await.unwrap();
    assert!(
        d.is_allowed() && d.rule.is_none(),
        "fail open admits: {d:?}"
    );
    assert_eq!(not_replicated(snapshotter), 2);
    // The admissions were written on the primary (the units stay spent: stricter, never looser).
    assert_eq!(
        command(primary.port, &["HGET", "d:global:fixed_window:", "c"]),
        "5"
    );
    // A denied request waits for nothing: the per_user key spent, answered at once by Redis.
    let tight = PolicyConfig::from_toml(
        "[[rules]]\nname = \"one\"\nmatch = { user = \"any\" }\nkey = [\"user\"]\nlimit = 1\nperiod = \"1h\"\n",
    )
    .unwrap();
    let tight = RedisPolicy::new(tight, conn(&primary), settings(closed_fail, wait)).unwrap();
    let _ = tight.check_at(&[("user", "z")], NOW, 1).await.unwrap();
    let _ = not_replicated(snapshotter);
    let started = Instant::now();
    let (d, _) = tight.check_at(&[("user", "z")], NOW, 1).await.unwrap();
    assert!(!d.is_allowed() && d.rule == Some("one"));
    assert!(started.elapsed() < wait, "a denial waited");
    assert_eq!(not_replicated(snapshotter), 0);
}

#[tokio::test]
async fn lease_mode_refuses_durable() {
    let server = RedisServer::start();
    let settings = RedisSettings {
        lease: Some(LeaseConfig::default()),
        ..settings(FaultPolicy::FailOpen, Duration::from_millis(5))
    };
    let error = RedisPolicy::new(
        PolicyConfig::from_toml(RULES).unwrap(),
        conn(&server),
        settings,
    )
    .unwrap_err();
    assert_eq!(error.kind, ConfigErrorKind::LeaseNotDurable);
    assert!(error.to_string().contains("per request"), "{error}");
}
