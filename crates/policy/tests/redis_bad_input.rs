//! Issue 26 item 8 on a `RedisPolicy` (against a real `redis-server` started per test): bad input
//! never breaks the one script a request is decided by.
//!
//! * A key of a foreign Redis type (a list where a rule stores a string or a hash) among a
//!   request's keys, wherever it stands: the whole request is answered by the fail policy (closed:
//!   denied with its `retry_after`; open: no rule applies), counted as a `config` failure, and no
//!   key is written, neither by this request nor (as a group) by the other requests of the same
//!   call, whose admissions are given back.
//! * Descriptor values of any characters (NUL, CR LF, braces, Redis's own error text, any Unicode)
//!   and any length (a table, a 1 MiB value, and generated values) are decided like any other value,
//!   each under exactly its own key.

#[path = "../../redis/tests/common/redis_server.rs"]
mod redis_server;

use std::collections::BTreeSet;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redis_server::RedisServer;
use tollgate_policy::{PolicyConfig, RedisPolicy, RedisSettings};
use tollgate_redis::{ConnectionManager, FaultPolicy, RedisConfig};

/// Long periods: Redis answers on the test's clock (`check_at`) and no unit comes back mid-test.
const RULES: &str = r#"
    [[rules]]
    name = "per_user"
    match = { user = "any" }
    key = ["user"]
    limit = 2
    period = "1h"

    [[rules]]
    name = "per_user_route"
    match = { user = "any", route = "any" }
    key = ["user", "route"]
    algorithm = "fixed_window"
    limit = 5
    period = "1h"

    [[rules]]
    name = "global"
    algorithm = "sliding_window"
    limit = 20
    period = "1h"

    [[rules]]
    name = "watch"
    mode = "shadow"
    limit = 10
    period = "1h"
"#;

/// An hour boundary plus a second (the windows align alike on every run).
const NOW: u64 = 500_000 * 3_600_000_000_000 + 1_000_000_000;

/// Seconds, not the default 50 ms, for the connection's response timeout too: a request of
/// megabytes (the 1 MiB value, its 2 MiB composite key) on a loaded machine would otherwise be a
/// (correct) timeout, answered by the fail policy.
const TIMEOUT: Duration = Duration::from_secs(5);

fn conn(server: &RedisServer) -> ConnectionManager {
    tollgate_redis::connect(&server.url(), &RedisConfig::default().with_timeout(TIMEOUT))
        .expect("connect")
}

fn settings(prefix: &str, fail: FaultPolicy) -> RedisSettings {
    RedisSettings {
        prefix: prefix.to_owned(),
        fail,
        timeout: TIMEOUT,
        ..RedisSettings::default()
    }
}

/// The hex of the length-prefixed parts: a composite key as the policy names it.
fn composite(parts: &[&str]) -> String {
    let mut key = String::new();
    for part in parts {
        for byte in u32::try_from(part.len()).unwrap().to_le_bytes() {
            key.push_str(&format!("{byte:02x}"));
        }
        for byte in part.bytes() {
            key.push_str(&format!("{byte:02x}"));
        }
    }
    key
}

/// Every key of `RULES` for a request of `user` on `route`, under `prefix`.
fn keys_of(prefix: &str, user: &str, route: &str) -> [String; 4] {
    [
        format!("{prefix}per_user:gcra:{user}"),
        format!(
            "{prefix}per_user_route:fixed_window:{}",
            composite(&[user, route])
        ),
        format!("{prefix}global:sliding_window:"),
        format!("{prefix}watch:gcra:"),
    ]
}

/// The key's DUMP and PTTL (`None`: absent): equal before and after means nothing was written.
async fn dump(conn: &mut ConnectionManager, key: &str) -> (Option<Vec<u8>>, i64) {
    redis::pipe()
        .cmd("DUMP")
        .arg(key)
        .pttl(key)
        .query_async(conn)
        .await
        .unwrap()
}

/// The key's value as a script reads it (a string, or a hash's fields in order), TTL aside.
async fn value(conn: &mut ConnectionManager, key: &str) -> Vec<String> {
    let kind: String = redis::cmd("TYPE").arg(key).query_async(conn).await.unwrap();
    match kind.as_str() {
        "none" => Vec::new(),
        "string" => vec![redis::cmd("GET").arg(key).query_async(conn).await.unwrap()],
        "hash" => {
            let mut fields: Vec<(String, String)> = redis::cmd("HGETALL")
                .arg(key)
                .query_async(conn)
                .await
                .unwrap();
            fields.sort();
            fields.into_iter().flat_map(|(f, v)| [f, v]).collect()
        }
        other => panic!("{key}: {other}"),
    }
}

/// `tollgate_policy_store_failures_total{cause="config"}` counted since the last read, for the
/// rules of `RULES`.
fn config_failures(snapshotter: &Snapshotter) -> u64 {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| {
            let key = key.key();
            key.name() == "tollgate_policy_store_failures_total"
                && key
                    .labels()
                    .any(|l| l.key() == "cause" && l.value() == "config")
        })
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => n,
            other => panic!("{other:?}"),
        })
        .sum()
}

/// A list in place of each of a request's four keys in turn (a GCRA string, a fixed window's hash,
/// a sliding window's hash, a shadow rule's string), both fail policies: the request is answered by
/// the policy, every rule counted as a `config` failure, and no key is written (DUMP and PTTL
/// unchanged). As the second request of a group (one RLS call), the first request's admissions are
/// given back too: its keys hold the values they held before.
#[test]
fn a_key_of_a_foreign_type_fails_the_request_by_the_fail_policy_writing_nothing() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // A local recorder, so that the counts are this test's: the runtime runs on this thread.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(foreign_type_among_the_keys(&snapshotter));
    });
}

async fn foreign_type_among_the_keys(snapshotter: &Snapshotter) {
    let server = RedisServer::start();
    let mut raw = conn(&server);
    let config = PolicyConfig::from_toml(RULES).unwrap();
    let closed = RedisPolicy::new(
        config.clone(),
        conn(&server),
        settings(
            "t:",
            FaultPolicy::FailClosed {
                retry_after: Duration::from_secs(7),
            },
        ),
    )
    .unwrap();
    // The same keys (same prefix), answering open.
    let open =
        RedisPolicy::new(config, conn(&server), settings("t:", FaultPolicy::FailOpen)).unwrap();
    let request = [("user", "a"), ("route", "/r")];
    let other = [("user", "b"), ("route", "/r")];
    // One admission each, so that every key holds state; then without TTLs, so that DUMP and
    // PTTL compare exactly.
    for r in [&request[..], &other[..]] {
        assert!(closed.check_at(r, NOW, 1).await.unwrap().0.is_allowed());
    }
    let keys = keys_of("t:", "a", "/r");
    let other_keys = keys_of("t:", "b", "/r");
    for k in keys.iter().chain(&other_keys[..2]) {
        let persisted: bool = redis::cmd("PERSIST")
            .arg(k)
            .query_async(&mut raw)
            .await
            .unwrap();
        assert!(persisted, "{k}");
    }
    let _ = config_failures(snapshotter);
    for foreign in &keys {
        // The key's state set aside, a list in its place.
        let saved = dump(&mut raw, foreign).await.0.unwrap();
        let _: () = redis::pipe()
            .del(foreign)
            .rpush(foreign, "x")
            .query_async(&mut raw)
            .await
            .unwrap();
        let mut before = Vec::new();
        for k in keys.iter().chain(&other_keys[..2]) {
            before.push(dump(&mut raw, k).await);
        }
        let unchanged = |after: &[(Option<Vec<u8>>, i64)]| {
            for ((k, b), a) in keys.iter().chain(&other_keys[..2]).zip(&before).zip(after) {
                assert_eq!(a, b, "{k} was written (foreign {foreign})");
            }
        };

        let (d, _) = closed.check_at(&request, NOW, 1).await.unwrap();
        assert!(!d.is_allowed(), "fail closed denies ({foreign})");
        assert_eq!(d.decision.retry_after(), Some(Duration::from_secs(7)));
        // Every rule of the request answered by the policy, each counted as a configuration error.
        assert_eq!(config_failures(snapshotter), 4, "{foreign}");
        let (d, _) = open.check_at(&request, NOW, 1).await.unwrap();
        assert!(d.is_allowed(), "fail open admits ({foreign})");
        assert_eq!(d.rule, None, "no rule decided it");
        assert_eq!(config_failures(snapshotter), 4, "{foreign}");
        let mut after = Vec::new();
        for k in keys.iter().chain(&other_keys[..2]) {
            after.push(dump(&mut raw, k).await);
        }
        unchanged(&after);

        // As one RLS call: `other` admitted first, then the request fails closed, so the group is
        // refused and what `other` admitted goes back (its values as before; the refund sets TTLs).
        let mut other_before = Vec::new();
        for k in other_keys.iter().filter(|k| *k != foreign) {
            other_before.push(value(&mut raw, k).await);
        }
        let answers = closed
            .check_all_at(&[(&other, 1), (&request, 1)], NOW)
            .await;
        assert!(!answers[1].as_ref().unwrap().0.is_allowed());
        let _ = config_failures(snapshotter);
        for (k, b) in other_keys
            .iter()
            .filter(|k| *k != foreign)
            .zip(&other_before)
        {
            assert_eq!(&value(&mut raw, k).await, b, "{k} kept a refused admission");
        }
        for k in &keys {
            if k != foreign && !other_keys.contains(k) {
                let i = keys.iter().position(|x| x == k).unwrap();
                assert_eq!(dump(&mut raw, k).await, before[i], "{k} was written");
            }
        }
        // The state back, and every key without a TTL (the refunds set some), for the next round.
        let _: () = redis::pipe()
            .del(foreign)
            .cmd("RESTORE")
            .arg(foreign)
            .arg(0)
            .arg(saved)
            .query_async(&mut raw)
            .await
            .unwrap();
        for k in keys.iter().chain(&other_keys) {
            let _: () = redis::cmd("PERSIST")
                .arg(k)
                .query_async(&mut raw)
                .await
                .unwrap();
        }
    }
    // Without a foreign key the request goes through again (its second unit of `per_user`).
    assert!(
        closed
            .check_at(&request, NOW, 1)
            .await
            .unwrap()
            .0
            .is_allowed()
    );
}

/// Values that look like what the scripts and the error parsing deal in, and what Redis keys can
/// hold: every one decided under exactly its own key, admitted twice (limit 2) and then denied.
#[tokio::test]
async fn descriptor_values_of_any_characters_and_length_are_decided_like_any_other() {
    let server = RedisServer::start();
    let mut raw = conn(&server);
    let config = PolicyConfig::from_toml(
        r#"
        [[rules]]
        name = "one"
        match = { user = "any" }
        key = ["user"]
        limit = 2
        period = "1h"

        [[rules]]
        name = "pair"
        match = { user = "any", route = "any" }
        key = ["user", "route"]
        algorithm = "fixed_window"
        limit = 3
        period = "1h"

        [[rules]]
        name = "window"
        match = { user = "any" }
        key = ["user"]
        algorithm = "sliding_window"
        limit = 3
        period = "1h"
    "#,
    )
    .unwrap();
    let policy = RedisPolicy::new(
        config,
        conn(&server),
        settings(
            "v:",
            FaultPolicy::FailClosed {
                retry_after: Duration::from_secs(7),
            },
        ),
    )
    .unwrap();
    let long = "\u{1F511}".repeat(256 * 1024); // 1 MiB of 4-byte characters
    let mut values: Vec<String> = [
        "",
        "\0",
        "a\0b",
        "a\r\nb",
        "\r\n*1\r\n$4\r\nPING\r\n",
        " ",
        "{tag}",
        "}{",
        "{}",
        "\"'%s%d\\",
        "a: b script: c, on @user_script:1.",
        "TOLLGATE_KEY 1 WRONGTYPE",
        "TOLLGATE_CORRUPT x",
        "-ERR x",
        "ключ🔑",
        "\u{202e}\u{feff}\u{fffd}\u{10ffff}",
        "e\u{301}",
    ]
    .iter()
    .map(|v| (*v).to_owned())
    .collect();
    values.push(long);
    values.push("k".repeat(64 * 1024));
    // Generated: any Unicode scalar (surrogates excluded by `char`), ASCII controls and the
    // characters above weighted in, lengths 0..40.
    let mut rng = SplitMix(0x26_08);
    let special = ['\0', '\r', '\n', '{', '}', ' ', ':', '\\', '"', '\u{7f}'];
    let mut seen: BTreeSet<String> = values.iter().cloned().collect();
    let fixed = values.len();
    while values.len() < fixed + 200 {
        let len = rng.below(40);
        let v: String = (0..len)
            .map(|_| match rng.below(4) {
                0 => special[rng.below(special.len() as u64) as usize],
                1 => char::from(rng.below(0x80) as u8),
                _ => loop {
                    if let Some(c) = char::from_u32(rng.below(0x11_0000) as u32) {
                        break c;
                    }
                },
            })
            .collect();
        if seen.insert(v.clone()) {
            values.push(v);
        }
    }
    assert!(values.len() >= 200);
    for v in &values {
        let request = [("user", v.as_str()), ("route", v.as_str())];
        for round in 0..3 {
            let (d, _) = policy
                .check_at(&request, NOW, 1)
                .await
                .unwrap_or_else(|e| panic!("{:?}: {e}", abbreviated(v)));
            assert_eq!(
                d.is_allowed(),
                round < 2,
                "{:?} round {round}: {d:?}",
                abbreviated(v)
            );
            if round == 2 {
                assert_eq!(d.rule, Some("one"), "{:?}", abbreviated(v));
            }
        }
        // Under exactly its own keys: `one` and `window` the value verbatim, `pair` its hex.
        let one: Option<String> = redis::cmd("GET")
            .arg(format!("v:one:gcra:{v}"))
            .query_async(&mut raw)
            .await
            .unwrap();
        assert!(one.is_some(), "{:?}", abbreviated(v));
        for (key, count) in [
            (format!("v:pair:fixed_window:{}", composite(&[v, v])), "2"),
            (format!("v:window:sliding_window:{v}"), "2"),
        ] {
            let c: Option<String> = redis::cmd("HGET")
                .arg(&key)
                .arg("c")
                .query_async(&mut raw)
                .await
                .unwrap();
            assert_eq!(c.as_deref(), Some(count), "{:?}", abbreviated(v));
        }
    }
    // Nothing else was written: three keys per value.
    let size: usize = redis::cmd("DBSIZE").query_async(&mut raw).await.unwrap();
    assert_eq!(size, values.len() * 3);
}

/// The first characters of `v`, for a failure message that a 1 MiB value does not drown.
fn abbreviated(v: &str) -> String {
    let head: String = v.chars().take(40).collect();
    if head.len() < v.len() {
        format!("{head}... ({} bytes)", v.len())
    } else {
        head
    }
}

/// A small deterministic generator (splitmix64).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// In `0..n` (uniform enough for test inputs).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
