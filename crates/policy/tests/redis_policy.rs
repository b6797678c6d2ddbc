//! `RedisPolicy` against a real `redis-server` (started per test on a free loopback port): the
//! same engine as the in-process `Policy`, so the same answers.

#[path = "../../redis/tests/common/redis_server.rs"]
mod redis_server;

use std::time::Duration;

use redis_server::{RedisServer, command_calls};
use tollgate_core::ManualClock;
use tollgate_policy::{Policy, PolicyConfig, PolicyError, RedisPolicy, RedisSettings};
use tollgate_redis::{ConnectionManager, FaultPolicy, RedisConfig};

/// Long periods: Redis runs on its own clock, and a test that takes a few milliseconds must not
/// see a unit come back.
const RULES: &str = r#"
    [[rules]]
    name = "per_user"
    match = { user = "any" }
    key = ["user"]
    limit = 2
    period = "1h"

    [[rules]]
    name = "per_user_route"
    match = { user = "any", route = { prefix = "/api/" } }
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
    limit = 1
    period = "1h"

    [[overrides]]
    rule = "per_user"
    values = ["vip"]
    limit = 4
    period = "1h"
"#;

fn conn(server: &RedisServer) -> ConnectionManager {
    tollgate_redis::connect(&server.url(), &RedisConfig::default()).expect("connect")
}

fn settings() -> RedisSettings {
    RedisSettings {
        prefix: "test:".to_owned(),
        ..RedisSettings::default()
    }
}

#[tokio::test]
async fn decides_exactly_as_the_in_process_policy() {
    let server = RedisServer::start();
    let config = PolicyConfig::from_toml(RULES).unwrap();
    let mut in_process_config = config.clone();
    for rule in in_process_config
        .rules
        .iter_mut()
        .filter(|r| !r.key.is_empty())
    {
        rule.capacity = Some(1000);
    }
    let redis = RedisPolicy::new(config, conn(&server), settings()).expect("redis policy");
    let local = Policy::with_clock(in_process_config, ManualClock::new()).expect("policy");
    // One instant for both (an hour boundary and a second, so the windows align alike).
    let now = 500_000 * 3_600_000_000_000 + 1_000_000_000;
    // Keys that share rules, a tier, a composite key, a cost that one rule can never admit, and
    // enough traffic for every rule to deny at least once (and the global rule's refunds to matter).
    let users = [
        "a", "b", "vip", "a", "vip", "c", "b", "vip", "a", "d", "vip", "e", "f", "g", "h", "i",
        "j", "k", "l",
    ];
    let routes = ["/api/x", "/other", "/api/y"];
    let mut denied_by = std::collections::BTreeSet::new();
    for (i, user) in users.iter().cycle().take(60).enumerate() {
        let request = [("user", *user), ("route", routes[i % routes.len()])];
        let cost = if i % 7 == 6 { 3 } else { 1 };
        let expected = local.check_next_at(&request, now, cost);
        let got = redis.check_at(&request, now, cost).await;
        match (&expected, &got) {
            (Ok((want, _)), Ok((have, _))) => {
                assert_eq!(
                    have.is_allowed(),
                    want.is_allowed(),
                    "request {i}: {request:?}"
                );
                assert_eq!(have.rule, want.rule, "request {i}");
                assert_eq!(have.quota, want.quota, "request {i}");
                assert_eq!(have.shadow_denied, want.shadow_denied, "request {i}");
                if want.is_allowed() {
                    assert_eq!(
                        have.decision.remaining(),
                        want.decision.remaining(),
                        "request {i}"
                    );
                } else {
                    denied_by.insert(want.rule.unwrap());
                }
            }
            (Err(want), Err(have)) => assert_eq!(have, want, "request {i}"),
            _ => panic!("request {i}: in process {expected:?}, on Redis {got:?}"),
        }
    }
    assert!(
        denied_by.contains("per_user") && denied_by.contains("global"),
        "{denied_by:?}"
    );
    // Counted as in process.
    let (a, b) = (local.snapshot(), redis.snapshot());
    assert_eq!(a, b);
}

#[tokio::test]
async fn a_denial_gives_back_what_other_rules_admitted_on_redis() {
    let server = RedisServer::start();
    let config = PolicyConfig::from_toml(
        r#"
        [[rules]]
        name = "global"
        limit = 3
        period = "1h"

        [[rules]]
        name = "per_ip"
        match = { ip = "any" }
        key = ["ip"]
        limit = 2
        period = "1h"
    "#,
    )
    .unwrap();
    let policy = RedisPolicy::new(config, conn(&server), settings()).unwrap();
    let a = [("ip", "192.0.2.1")];
    let b = [("ip", "192.0.2.2")];
    assert!(policy.check(&a, 1).await.unwrap().0.is_allowed());
    assert!(policy.check(&a, 1).await.unwrap().0.is_allowed());
    // per_ip denies after global admitted: global gets its unit back.
    let (denied, next) = policy.check(&a, 1).await.unwrap();
    assert_eq!(denied.rule, Some("per_ip"));
    assert!(next.is_some(), "a denial says when to come back");
    assert!(policy.check(&b, 1).await.unwrap().0.is_allowed());
    // The third unit of global is still there only if the denied request gave it back.
    let (last, _) = policy.check(&b, 1).await.unwrap();
    assert!(!last.is_allowed());
    assert_eq!(last.rule, Some("global"));

    // A cost no rule can ever admit is an error, and what global admitted goes back.
    let big = policy.check(&[("ip", "192.0.2.9")], 3).await;
    assert_eq!(
        big.unwrap_err(),
        PolicyError::CostExceedsCapacity {
            rule: "per_ip",
            cost: 3,
            capacity: 2
        }
    );
}

#[tokio::test]
async fn redis_down_answers_by_the_fault_policy() {
    let mut server = RedisServer::start();
    let config = PolicyConfig::from_toml(
        r#"
        [[rules]]
        name = "global"
        limit = 100
        period = "1h"
    "#,
    )
    .unwrap();
    let fast = |fail| RedisSettings {
        fail,
        timeout: Duration::from_millis(200),
        ..settings()
    };
    let closed = RedisPolicy::new(
        config.clone(),
        conn(&server),
        fast(FaultPolicy::FailClosed {
            retry_after: Duration::from_secs(7),
        }),
    )
    .unwrap();
    let open = RedisPolicy::new(config, conn(&server), fast(FaultPolicy::FailOpen)).unwrap();
    assert!(closed.check(&[], 1).await.unwrap().0.is_allowed());
    server.kill();
    let (answer, _) = closed.check(&[], 1).await.unwrap();
    assert!(!answer.is_allowed(), "fail closed denies");
    assert_eq!(answer.decision.retry_after(), Some(Duration::from_secs(7)));
    let (answer, _) = open.check(&[], 1).await.unwrap();
    assert!(answer.is_allowed(), "fail open lets the request through");
    assert_eq!(answer.rule, None, "no rule decided it");
}

#[tokio::test]
async fn keyed_rules_need_no_capacity_and_a_composite_key_is_hex() {
    let server = RedisServer::start();
    let config = PolicyConfig::from_toml(
        r#"
        [[rules]]
        name = "pair"
        match = { user = "any", route = "any" }
        key = ["user", "route"]
        limit = 5
        period = "1h"
    "#,
    )
    .unwrap();
    assert!(
        Policy::new(config.clone()).is_err(),
        "in process, a table needs a capacity"
    );
    let policy = RedisPolicy::new(config, conn(&server), settings()).unwrap();
    assert!(
        policy
            .check(&[("user", "u"), ("route", "/r")], 1)
            .await
            .unwrap()
            .0
            .is_allowed()
    );
    let mut key = String::from("test:pair:gcra:");
    for part in ["u", "/r"] {
        for byte in u32::try_from(part.len()).unwrap().to_le_bytes() {
            key.push_str(&format!("{byte:02x}"));
        }
        for byte in part.bytes() {
            key.push_str(&format!("{byte:02x}"));
        }
    }
    let mut conn = conn(&server);
    let exists: bool = redis::cmd("EXISTS")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(exists, "{key}");
}

#[tokio::test]
async fn a_reload_keeps_the_state_in_redis_and_the_counters() {
    let server = RedisServer::start();
    let rules = |limit: u64| {
        PolicyConfig::from_toml(&format!(
            "[[rules]]\nname = \"global\"\nlimit = {limit}\nperiod = \"1h\"\n"
        ))
        .unwrap()
    };
    let policy = RedisPolicy::new(rules(3), conn(&server), settings()).unwrap();
    for _ in 0..3 {
        assert!(policy.check(&[], 1).await.unwrap().0.is_allowed());
    }
    policy.reload(rules(4)).unwrap();
    // The state stayed in Redis: the key that spent its bucket gets no fresh one.
    assert!(!policy.check(&[], 1).await.unwrap().0.is_allowed());
    let stats = policy.snapshot();
    assert_eq!(
        (stats.rules[0].allowed, stats.rules[0].denied),
        (3, 1),
        "the rule kept its counters"
    );
    assert!(
        policy
            .reload(
                PolicyConfig::from_toml("[[rules]]\nname = \"x\"\nlimit = 0\nperiod = \"1s\"\n")
                    .unwrap()
            )
            .is_err()
    );
    assert_eq!(policy.rules(), ["global"], "a bad config changes nothing");
}

#[tokio::test]
async fn a_group_is_decided_as_one_on_redis_too() {
    let server = RedisServer::start();
    let config = PolicyConfig::from_toml(
        r#"
        [[rules]]
        name = "per_user"
        match = { user = "any" }
        key = ["user"]
        limit = 1
        period = "1h"
    "#,
    )
    .unwrap();
    let policy = RedisPolicy::new(config, conn(&server), settings()).unwrap();
    let (a, b) = ([("user", "a")], [("user", "b")]);
    assert!(policy.check(&b, 1).await.unwrap().0.is_allowed());
    let answers = policy.check_all(&[(&a, 1), (&b, 1)]).await;
    assert!(answers[0].as_ref().unwrap().0.is_allowed());
    assert!(!answers[1].as_ref().unwrap().0.is_allowed());
    // Refused as a group: a's unit went back.
    assert!(policy.check(&a, 1).await.unwrap().0.is_allowed());
    assert!(!policy.check(&a, 1).await.unwrap().0.is_allowed());
}

/// Script calls Redis has counted so far: `evalsha` and `fcall` (a batch goes by FCALL on Redis 7
/// and later, by EVALSHA before).
fn evalsha_calls(server: &RedisServer) -> u64 {
    command_calls(server.port, "evalsha") + command_calls(server.port, "fcall")
}

#[tokio::test]
async fn a_request_is_one_script_call_whatever_its_rules() {
    let server = RedisServer::start();
    let policy = RedisPolicy::new(
        PolicyConfig::from_toml(RULES).unwrap(),
        conn(&server),
        settings(),
    )
    .unwrap();
    let request = [("user", "a"), ("route", "/api/x")];
    // Warm: the batch's function is loaded on first use (FCALL, FUNCTION LOAD, FCALL).
    assert!(policy.check(&request, 1).await.unwrap().0.is_allowed());
    for expected_allowed in [true, false, false] {
        let before = evalsha_calls(&server);
        let (decided, _) = policy.check(&request, 1).await.unwrap();
        assert_eq!(decided.is_allowed(), expected_allowed);
        // Four rules apply (per_user, per_user_route, global, watch): one call decides them all.
        assert_eq!(evalsha_calls(&server) - before, 1);
    }
}

#[tokio::test]
async fn lease_mode_refuses_a_rule_that_is_not_gcra() {
    let server = RedisServer::start();
    let config = PolicyConfig::from_toml(
        r#"
        [[rules]]
        name = "windowed"
        algorithm = "fixed_window"
        limit = 5
        period = "1m"
    "#,
    )
    .unwrap();
    let settings = RedisSettings {
        lease: Some(tollgate_redis::LeaseConfig::default()),
        ..settings()
    };
    let error = RedisPolicy::new(config, conn(&server), settings).unwrap_err();
    assert_eq!(error.rule.as_deref(), Some("windowed"));
    assert_eq!(error.kind, tollgate_policy::ConfigErrorKind::LeaseNeedsGcra);
}

/// One keyed rule of `algorithm`: `limit` per `period`, `burst` for the buckets, and an override
/// for `"vip"` when given.
fn one_rule(
    algorithm: &str,
    limit: u64,
    period: &str,
    burst: Option<u64>,
    vip: Option<(u64, &str)>,
) -> PolicyConfig {
    let mut toml = format!(
        "[[rules]]\nname = \"r\"\nmatch = {{ user = \"any\" }}\nkey = [\"user\"]\n\
         algorithm = \"{algorithm}\"\nlimit = {limit}\nperiod = \"{period}\"\n"
    );
    if let Some(burst) = burst {
        toml.push_str(&format!("burst = {burst}\n"));
    }
    if let Some((limit, period)) = vip {
        toml.push_str(&format!(
            "[[overrides]]\nrule = \"r\"\nvalues = [\"vip\"]\nlimit = {limit}\nperiod = \"{period}\"\n"
        ));
    }
    PolicyConfig::from_toml(&toml).unwrap()
}

/// Issue 24 item 4 on Redis: a key that spent a burst of 10 at 10/s gets nothing at the reload
/// instant when the rule becomes 10/min, when its burst (a window's limit) becomes 30, or when an
/// override of 10/min is added for it; in both modes and for every algorithm each mode runs.
#[tokio::test]
async fn a_spent_burst_gets_nothing_back_at_a_reload_on_redis() {
    let server = RedisServer::start();
    let now = 500_000 * 3_600_000_000_000 + 1_000_000_000;
    let lease = RedisSettings {
        prefix: "lease:".to_owned(),
        lease: Some(tollgate_redis::LeaseConfig::default()),
        ..settings()
    };
    let modes = [
        (
            settings(),
            &["gcra", "leaky_bucket", "fixed_window", "sliding_window"][..],
        ),
        (lease, &["gcra"][..]),
    ];
    for (mode, algorithms) in modes {
        for algorithm in algorithms {
            let bucket = matches!(*algorithm, "gcra" | "leaky_bucket");
            let before = one_rule(algorithm, 10, "1s", None, None);
            let wider = if bucket {
                one_rule(algorithm, 10, "1s", Some(30), None)
            } else {
                one_rule(algorithm, 30, "1s", None, None)
            };
            let afters = [
                ("10/min", one_rule(algorithm, 10, "1m", None, None), "u"),
                ("burst 30", wider, "u"),
                (
                    "override",
                    one_rule(algorithm, 10, "1s", None, Some((10, "1m"))),
                    "vip",
                ),
            ];
            for (case, after, user) in afters {
                let policy = RedisPolicy::new(before.clone(), conn(&server), mode.clone()).unwrap();
                let request = [("user", user)];
                for _ in 0..10 {
                    let (d, _) = policy.check_at(&request, now, 1).await.unwrap();
                    assert!(d.is_allowed(), "{algorithm} {case}: the burst");
                }
                assert!(
                    !policy
                        .check_at(&request, now, 1)
                        .await
                        .unwrap()
                        .0
                        .is_allowed()
                );
                policy.reload(after).unwrap();
                let (d, _) = policy.check_at(&request, now, 1).await.unwrap();
                assert!(
                    !d.is_allowed(),
                    "{algorithm} {case} ({:?}): a unit at the reload instant",
                    mode.lease
                );
                // Clean up for the next case (the same key names).
                let mut c = conn(&server);
                let _: () = redis::cmd("FLUSHALL").query_async(&mut c).await.unwrap();
            }
        }
    }
}

/// Random quota pairs of random algorithms, a random spend, a reload, then requests at the reload
/// instant: the Redis policy answers exactly as the in-process policy, whose reload carries each
/// key over as-is (so never more than either quota allows).
#[tokio::test]
async fn a_reload_on_redis_carries_over_as_the_in_process_policy_does() {
    let server = RedisServer::start();
    let mut rng = SplitMix(24);
    let algorithms = ["gcra", "leaky_bucket", "fixed_window", "sliding_window"];
    let periods = ["1s", "10s", "1m", "1h"];
    let now = 500_000 * 3_600_000_000_000 + 1_000_000_000;
    let mut compared = 0;
    for round in 0..60 {
        let algorithm = algorithms[rng.random_range(0..4) as usize];
        let bucket = matches!(algorithm, "gcra" | "leaky_bucket");
        let quota = |rng: &mut SplitMix| {
            let limit = rng.random_range(1..=20);
            let period = periods[rng.random_range(0..4) as usize];
            let burst = (bucket && rng.random_range(0..2) == 1).then(|| rng.random_range(1..=30));
            (limit, period, burst)
        };
        let (a, b) = (quota(&mut rng), quota(&mut rng));
        let old = one_rule(algorithm, a.0, a.1, a.2, None);
        let new = one_rule(algorithm, b.0, b.1, b.2, None);
        let mut local_old = old.clone();
        local_old.rules[0].capacity = Some(64);
        let mut local_new = new.clone();
        local_new.rules[0].capacity = Some(64);
        let prefix = RedisSettings {
            prefix: format!("p{round}:"),
            ..settings()
        };
        let redis = RedisPolicy::new(old, conn(&server), prefix).unwrap();
        let clock = ManualClock::starting_at(now);
        let local = Policy::with_clock(local_old, clock.clone()).unwrap();
        let request = [("user", "u")];
        for _ in 0..rng.random_range(0..25) {
            let cost = rng.random_range(1..=3);
            let want = local
                .check_next_at(&request, now, cost)
                .map(|(d, _)| d.is_allowed());
            let have = redis
                .check_at(&request, now, cost)
                .await
                .map(|(d, _)| d.is_allowed());
            assert_eq!(have, want, "round {round}: before the reload");
        }
        clock.set(now);
        local.reload(local_new).unwrap();
        redis.reload(new).unwrap();
        for i in 0..rng.random_range(1..8) {
            let cost = rng.random_range(1..=3);
            let want = local.check_next_at(&request, now, cost);
            let have = redis.check_at(&request, now, cost).await;
            match (want, have) {
                (Ok((w, _)), Ok((h, _))) => {
                    assert_eq!(
                        h.is_allowed(),
                        w.is_allowed(),
                        "round {round} request {i}: {a:?} -> {b:?} {algorithm}"
                    );
                    assert_eq!(
                        h.decision.remaining(),
                        w.decision.remaining(),
                        "round {round} request {i}"
                    );
                    compared += 1;
                }
                (Err(w), Err(h)) => assert_eq!(h, w),
                (w, h) => panic!("round {round}: in process {w:?}, on Redis {h:?}"),
            }
        }
    }
    assert!(compared > 100, "{compared}");
}

/// A small deterministic generator for the property test (splitmix64).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform enough in `range` for test inputs.
    fn random_range<R: std::ops::RangeBounds<u64>>(&mut self, range: R) -> u64 {
        use std::ops::Bound::*;
        let lo = match range.start_bound() {
            Included(&x) => x,
            Excluded(&x) => x + 1,
            Unbounded => 0,
        };
        let hi = match range.end_bound() {
            Included(&x) => x + 1,
            Excluded(&x) => x,
            Unbounded => u64::MAX,
        };
        lo + self.next() % (hi - lo)
    }
}

/// Issue 26 item 6: a lease-mode answer reports the shared quota, not the replica's lease. Quota
/// 200 with leases of 10: the answers count down from 199 and never say 0 while the quota has room;
/// the first admission on a 10/s key reports what the per-request and embedded modes report
/// (remaining 9, reset 100 ms, next unit in 100 ms: the RateLimit field's `t=1`).
#[tokio::test]
async fn lease_mode_reports_the_shared_quota() {
    let server = RedisServer::start();
    let now = 500_000 * 3_600_000_000_000 + 1_000_000_000;
    let lease = |prefix: &str| RedisSettings {
        prefix: prefix.to_owned(),
        lease: Some(tollgate_redis::LeaseConfig {
            size: 10,
            ..Default::default()
        }),
        ..settings()
    };
    let big =
        PolicyConfig::from_toml("[[rules]]\nname = \"g\"\nlimit = 200\nperiod = \"1h\"\n").unwrap();
    let policy = RedisPolicy::new(big, conn(&server), lease("big:")).unwrap();
    for expected in (170..200).rev() {
        let (d, _) = policy.check_at(&[], now, 1).await.unwrap();
        assert!(d.is_allowed());
        assert_eq!(
            d.decision.remaining(),
            expected,
            "the shared quota, not the lease"
        );
    }

    let small =
        PolicyConfig::from_toml("[[rules]]\nname = \"g\"\nlimit = 10\nperiod = \"1s\"\n").unwrap();
    let leased = RedisPolicy::new(small.clone(), conn(&server), lease("l:")).unwrap();
    let per_request = RedisPolicy::new(small.clone(), conn(&server), settings()).unwrap();
    let embedded = Policy::with_clock(small, ManualClock::starting_at(now)).unwrap();
    let (l, l_next) = leased.check_at(&[], now, 1).await.unwrap();
    let (p, p_next) = per_request.check_at(&[], now, 1).await.unwrap();
    let (e, e_next) = embedded.check_next_at(&[], now, 1).unwrap();
    for (d, next, mode) in [(&l, l_next, "lease"), (&p, p_next, "per request")] {
        assert_eq!(d.decision.remaining(), e.decision.remaining(), "{mode}");
        assert_eq!(d.decision.reset_after(), e.decision.reset_after(), "{mode}");
        assert_eq!(next, e_next, "{mode}");
    }
    assert_eq!(
        (l.decision.remaining(), l.decision.reset_after(), l_next),
        (
            9,
            Duration::from_millis(100),
            Some(Duration::from_millis(100))
        )
    );
}

/// Groups of one to three requests (an RLS call's descriptors) on a simulated clock: Redis
/// answers each group as the in-process `Policy::check_all_at` does, request by request, so the
/// two states evolve alike; a group of equal costs whose rules and keys are all distinct is one
/// script call (every rule of every request at once), and the others are decided request by
/// request (different costs, or a key two requests share).
#[tokio::test]
async fn groups_are_decided_as_the_in_process_policy_decides_them_one_script_when_they_can() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    // Exact matching, as tollgate-server sets it: each descriptor shape has its own rules.
    const GROUPS: &str = r#"
        descriptor_match = "exact"

        [[rules]]
        name = "per_ip"
        match = { ip = "any" }
        key = ["ip"]
        limit = 6
        period = "10s"

        [[rules]]
        name = "per_ip_path"
        match = { ip = "any", path = "any" }
        key = ["ip", "path"]
        algorithm = "fixed_window"
        limit = 4
        period = "20s"

        [[rules]]
        name = "global"
        match = { generic_key = { exact = "global" } }
        algorithm = "sliding_window"
        limit = 12
        period = "10s"

        [[rules]]
        name = "watch"
        match = { ip = "any" }
        key = ["ip"]
        mode = "shadow"
        limit = 2
        period = "10s"
    "#;
    const NOW: u64 = 500_000 * 3_600_000_000_000;
    let server = RedisServer::start();
    let redis = RedisPolicy::new(
        PolicyConfig::from_toml(GROUPS).unwrap(),
        conn(&server),
        settings(),
    )
    .unwrap();
    let mut config = PolicyConfig::from_toml(GROUPS).unwrap();
    for rule in config.rules.iter_mut().filter(|r| !r.key.is_empty()) {
        rule.capacity = Some(64);
    }
    let local = Policy::with_clock(config, ManualClock::new()).unwrap();
    let mut rng = StdRng::seed_from_u64(26);
    let ips = ["10.0.0.1", "10.0.0.2"];
    let paths = ["/a", "/b"];
    let mut now = NOW + 3_000_000;
    redis.check_at(&[("ip", "warm")], now, 1).await.unwrap(); // load the script
    local.check_at(&[("ip", "warm")], now, 1).unwrap();
    let (mut allowed, mut denied, mut batched) = (0, 0, 0);
    for step in 0..300 {
        now += rng.random_range(0..=800_000u64) * 1000; // whole µs
        let ip = ips[rng.random_range(0..2)];
        let path = paths[rng.random_range(0..2)];
        let shapes: [&[(&str, &str)]; 4] = [
            &[("ip", ip)],
            &[("ip", ip), ("path", path)],
            &[("generic_key", "global")],
            &[("ip", ips[rng.random_range(0..2)])],
        ];
        let n = rng.random_range(1..=3);
        let group: Vec<(&[(&str, &str)], u64)> = (0..n)
            .map(|_| {
                let shape = shapes[rng.random_range(0..4)];
                let cost = if rng.random_range(0..5) == 0 { 2 } else { 1 };
                (shape, cost)
            })
            .collect();
        let requests = group;
        let want = local.check_all_at(&requests, now);
        let before = evalsha_calls(&server);
        let got = redis.check_all_at(&requests, now).await;
        let calls = evalsha_calls(&server) - before;
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            let ((w, _), (g, _)) = (w.as_ref().unwrap(), g.as_ref().unwrap());
            assert_eq!(
                g.is_allowed(),
                w.is_allowed(),
                "step {step} request {i}: {requests:?}"
            );
            assert_eq!(g.rule, w.rule, "step {step} request {i}");
            assert_eq!(
                g.decision.remaining(),
                w.decision.remaining(),
                "step {step} request {i}"
            );
            assert_eq!(g.shadow_denied, w.shadow_denied, "step {step} request {i}");
        }
        if want.iter().all(|w| w.as_ref().unwrap().0.is_allowed()) {
            allowed += 1;
        } else {
            denied += 1;
        }
        let same_cost = requests.iter().all(|r| r.1 == requests[0].1);
        let distinct = (0..requests.len())
            .all(|a| (a + 1..requests.len()).all(|b| requests[a].0 != requests[b].0));
        if n > 1 && same_cost && distinct {
            assert_eq!(
                calls, 1,
                "step {step}: one script for the whole group {requests:?}"
            );
            batched += 1;
        }
    }
    assert!(
        allowed > 60 && denied > 60 && batched > 60,
        "{allowed} {denied} {batched}"
    );
}
