//! `RedisPolicy::reserve` / `settle` against a real `redis-server` (started per test on a free
//! loopback port): the settlements are exact (the state in Redis is what the settled costs add up
//! to), an overdraft puts the key in debt by exactly its refill time, a dropped reservation stays
//! at its estimate with no I/O, a rule removed by a reload is a counted no-op, a reservation and a
//! settlement are one round trip each, and an unconfirmed settlement gives nothing back.

#[path = "../../redis/tests/common/redis_server.rs"]
mod redis_server;

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use redis_server::RedisServer;
use tollgate_core::ManualClock;
use tollgate_policy::{Policy, PolicyConfig, RedisPolicy, RedisSettings};
use tollgate_redis::{ConnectionManager, FaultPolicy, LeaseConfig, RedisConfig};

/// An hour boundary (ns since the Unix epoch), so the windows of every test align alike.
const NOW: u64 = 500_000 * 3_600_000_000_000;

fn conn(server: &RedisServer) -> ConnectionManager {
    tollgate_redis::connect(&server.url(), &RedisConfig::default()).expect("connect")
}

async fn raw(server: &RedisServer) -> MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

fn settings() -> RedisSettings {
    RedisSettings {
        prefix: "test:".to_owned(),
        ..RedisSettings::default()
    }
}

fn policy(server: &RedisServer, toml: &str) -> RedisPolicy {
    let config = PolicyConfig::from_toml(toml).unwrap();
    RedisPolicy::new(config, conn(server), settings()).unwrap()
}

/// The same rules in process, on a manual clock (keyed rules with a table of 64 keys), to compare
/// Redis's answers with.
fn in_process(toml: &str) -> Policy<ManualClock> {
    let mut config = PolicyConfig::from_toml(toml).unwrap();
    for rule in &mut config.rules {
        rule.capacity = Some(64);
    }
    Policy::with_clock(config, ManualClock::new()).unwrap()
}

/// The TAT stored under a GCRA key, in ns (`None`: no key).
async fn tat(conn: &mut MultiplexedConnection, key: &str) -> Option<u64> {
    let raw: Option<String> = conn.get(key).await.unwrap();
    raw.map(|r| r.split(';').next().unwrap().parse().unwrap())
}

/// A window key's field (`c`: the current count), 0 when absent.
async fn field(conn: &mut MultiplexedConnection, key: &str, name: &str) -> u64 {
    let v: Option<u64> = conn.hget(key, name).await.unwrap();
    v.unwrap_or(0)
}

/// Round trips the server has answered so far: the calls of the commands a client sends to run a
/// script or a function (`EVALSHA`, `EVAL`, `SCRIPT LOAD`, `FCALL`, `FUNCTION LOAD`, ...: the only
/// ones the policy sends). INFO
/// commandstats also counts the commands a script runs inside (GET, HSET, ...), which are no round
/// trips, so those are left out.
async fn round_trips(conn: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| {
            [
                "cmdstat_eval",
                "cmdstat_script",
                "cmdstat_fcall",
                "cmdstat_function",
            ]
            .iter()
            .any(|p| l.starts_with(p))
        })
        .map(|l| {
            let calls = l.split("calls=").nth(1).unwrap();
            calls.split(',').next().unwrap().parse::<u64>().unwrap()
        })
        .sum()
}

const THREE: &str = r#"
    [[rules]]
    name = "bucket"
    match = { tenant = "any" }
    key = ["tenant"]
    limit = 10000
    period = "1h"

    [[rules]]
    name = "fixed"
    match = { tenant = "any" }
    key = ["tenant"]
    algorithm = "fixed_window"
    limit = 10000
    period = "1h"

    [[rules]]
    name = "sliding"
    match = { tenant = "any" }
    key = ["tenant"]
    algorithm = "sliding_window"
    limit = 10000
    period = "1h"
"#;

#[tokio::test]
async fn the_state_in_redis_is_the_sum_of_the_settled_costs() {
    let server = RedisServer::start();
    let mut c = raw(&server).await;
    let policy = policy(&server, THREE);
    let tenant = [("tenant", "acme")];
    let mut rng = StdRng::seed_from_u64(28);
    // 360 ms per unit; every call at one instant of one window, so nothing refills or rolls.
    let interval = 360_000_000u64;
    let (mut settled, mut admitted, mut denied, mut over, mut under) = (0u64, 0, 0, 0, 0);
    for i in 0..300 {
        let estimate = rng.random_range(1..=100u64);
        let actual = match rng.random_range(0..10) {
            0 => 0,
            1..4 => estimate,
            _ => rng.random_range(0..=2 * estimate),
        };
        let reserved = policy.reserve_at(&tenant, NOW, estimate).await.unwrap();
        let Some(reservation) = reserved.reservation else {
            assert!(!reserved.decision.is_allowed());
            denied += 1;
            continue;
        };
        admitted += 1;
        assert_eq!(reservation.rules(), 3);
        assert_eq!(reservation.reserved_at(), Some(NOW));
        let s = policy.settle_at(reservation, NOW, actual).await.unwrap();
        assert_eq!(
            (s.estimate, s.actual, s.rules, s.stale),
            (estimate, actual, 3, 0)
        );
        over += u64::from(actual > estimate);
        under += u64::from(actual < estimate);
        settled += actual;
        // Exact after every settlement, in every rule.
        let want_tat = (settled > 0).then_some(NOW + settled * interval);
        assert_eq!(tat(&mut c, "test:bucket:gcra:acme").await, want_tat, "{i}");
        assert_eq!(
            field(&mut c, "test:fixed:fixed_window:acme", "c").await,
            settled
        );
        assert_eq!(
            field(&mut c, "test:sliding:sliding_window:acme", "c").await,
            settled
        );
    }
    assert!(admitted > 100 && denied > 10 && over > 30 && under > 30);
    // Each request passed whole or not at all: at most one overshoot beyond the quota.
    assert!(settled <= 10_000 + 200, "{settled}");
}

/// Every algorithm, short periods, so that on the simulated clock buckets refill and windows roll
/// between a reservation and its settlement.
const MIXED: &str = r#"
    [[rules]]
    name = "bucket"
    match = { tenant = "any" }
    key = ["tenant"]
    limit = 20
    period = "10s"

    [[rules]]
    name = "leaky"
    match = { tenant = "any" }
    key = ["tenant"]
    algorithm = "leaky_bucket"
    limit = 30
    period = "12s"

    [[rules]]
    name = "fixed"
    match = { tenant = "any" }
    key = ["tenant"]
    algorithm = "fixed_window"
    limit = 50
    period = "30s"

    [[rules]]
    name = "sliding"
    match = { tenant = "any", route = "any" }
    key = ["tenant", "route"]
    algorithm = "sliding_window"
    limit = 40
    period = "20s"
"#;

/// Random reservations, settlements (surplus, exact, overdraft, zero) and drops on a simulated
/// clock, several reservations outstanding at once, settled seconds later: Redis answers every
/// reservation as the in-process `Policy::reserve` does (the same model: `crates/policy/src/settle.rs`)
/// and every settlement alike, so the Redis state evolves as the in-process one.
#[tokio::test]
async fn reserves_and_settles_exactly_as_the_in_process_policy() {
    let server = RedisServer::start();
    let redis = policy(&server, MIXED);
    let local = in_process(MIXED);
    let mut rng = StdRng::seed_from_u64(2028);
    let tenants = ["a", "b"];
    let routes = ["/x", "/y"];
    let mut now = NOW + 7_000_000; // not on a window boundary
    let mut held = Vec::new();
    let (mut admitted, mut denied, mut settled) = (0, 0, 0);
    for step in 0..500 {
        now += rng.random_range(0..=1_500_000u64) * 1000; // whole µs
        let roll = rng.random_range(0..10);
        if roll < 5 || held.is_empty() {
            let request = [
                ("tenant", tenants[rng.random_range(0..2)]),
                ("route", routes[rng.random_range(0..2)]),
            ];
            let estimate = rng.random_range(1..=12u64);
            let want = local.reserve_at(&request, now, estimate).unwrap();
            let got = redis.reserve_at(&request, now, estimate).await.unwrap();
            let (w, g) = (&want.decision, &got.decision);
            assert_eq!(g.is_allowed(), w.is_allowed(), "step {step}: {request:?}");
            assert_eq!(g.rule, w.rule, "step {step}");
            assert_eq!(
                g.decision.remaining(),
                w.decision.remaining(),
                "step {step}"
            );
            match (want.reservation, got.reservation) {
                (Some(w), Some(g)) => {
                    assert_eq!(g.rules(), w.rules(), "step {step}");
                    admitted += 1;
                    held.push((w, g));
                }
                (None, None) => denied += 1,
                _ => panic!("step {step}: one reserved, the other not"),
            }
        } else {
            let (w, g) = held.swap_remove(rng.random_range(0..held.len()));
            if roll == 9 {
                // Dropped: both stay at the estimate.
                continue;
            }
            let estimate = w.estimate();
            let actual = match rng.random_range(0..4) {
                0 => 0,
                1 => estimate,
                _ => rng.random_range(0..=2 * estimate),
            };
            let want = local.settle_at(w, now, actual);
            let got = redis.settle_at(g, now, actual).await.unwrap();
            assert_eq!(got, want, "step {step}");
            settled += 1;
        }
    }
    assert!(
        admitted > 100 && denied > 30 && settled > 100,
        "{admitted} {denied} {settled}"
    );
}

#[tokio::test]
async fn an_overdraft_puts_the_key_in_debt_by_exactly_its_refill_time() {
    let server = RedisServer::start();
    let policy = policy(
        &server,
        r#"
        [[rules]]
        name = "tokens"
        match = { tenant = "any" }
        key = ["tenant"]
        limit = 10
        period = "10s"

        [[rules]]
        name = "window"
        match = { tenant = "any" }
        key = ["tenant"]
        algorithm = "fixed_window"
        limit = 100
        period = "1h"
    "#,
    );
    let tenant = [("tenant", "t")];
    let second = 1_000_000_000;
    // The whole bucket of 10 (one unit per second), then 3 more than that.
    let reserved = policy.reserve_at(&tenant, NOW, 10).await.unwrap();
    let s = policy
        .settle_at(reserved.reservation.unwrap(), NOW, 13)
        .await
        .unwrap();
    assert_eq!((s.estimate, s.actual), (10, 13));
    // An empty bucket waits 1 s for a unit; 3 units of debt add 3 s: exactly 4 s.
    let (denied, _) = policy.check_at(&tenant, NOW, 1).await.unwrap();
    assert_eq!(denied.rule, Some("tokens"));
    assert_eq!(denied.decision.retry_after(), Some(Duration::from_secs(4)));
    let (early, _) = policy
        .check_at(&tenant, NOW + 4 * second - 1000, 1)
        .await
        .unwrap();
    assert!(!early.is_allowed());
    let (on_time, _) = policy.check_at(&tenant, NOW + 4 * second, 1).await.unwrap();
    assert!(on_time.is_allowed());
    // The window counted the 13 beyond nothing (a window carries no debt), and the admission since.
    let mut c = raw(&server).await;
    assert_eq!(field(&mut c, "test:window:fixed_window:t", "c").await, 14);
}

#[tokio::test]
async fn a_dropped_reservation_stays_at_its_estimate_without_io() {
    let server = RedisServer::start();
    let mut c = raw(&server).await;
    let policy = policy(&server, THREE);
    let tenant = [("tenant", "gone")];
    let reserved = policy.reserve_at(&tenant, NOW, 40).await.unwrap();
    let before = round_trips(&mut c).await;
    drop(reserved.reservation);
    assert_eq!(round_trips(&mut c).await, before, "dropping sends nothing");
    // The 40 stay spent, in every rule.
    assert_eq!(
        tat(&mut c, "test:bucket:gcra:gone").await,
        Some(NOW + 40 * 360_000_000)
    );
    assert_eq!(field(&mut c, "test:fixed:fixed_window:gone", "c").await, 40);
    assert_eq!(
        field(&mut c, "test:sliding:sliding_window:gone", "c").await,
        40
    );
    // A task cancelled while it held one: the same.
    let task = {
        let reserved = policy.reserve_at(&tenant, NOW, 2).await.unwrap();
        async move {
            let _held = reserved.reservation;
            std::future::pending::<()>().await;
        }
    };
    drop(tokio::spawn(task));
    assert_eq!(field(&mut c, "test:fixed:fixed_window:gone", "c").await, 42);
}

#[tokio::test]
async fn a_settlement_after_a_reload_removed_its_rule_is_a_counted_no_op() {
    let server = RedisServer::start();
    let mut c = raw(&server).await;
    let policy = policy(&server, THREE);
    let tenant = [("tenant", "r")];
    let reserved = policy.reserve_at(&tenant, NOW, 50).await.unwrap();
    // The fixed window rule goes; the others stay.
    let without: String = THREE
        .split("[[rules]]")
        .filter(|r| !r.contains("\"fixed\""))
        .collect::<Vec<_>>()
        .join("[[rules]]");
    policy
        .reload(PolicyConfig::from_toml(&without).unwrap())
        .unwrap();
    let s = policy
        .settle_at(reserved.reservation.unwrap(), NOW, 20)
        .await
        .unwrap();
    assert_eq!((s.rules, s.stale), (3, 1));
    // The removed rule's key is untouched; the others gave 30 back.
    assert_eq!(field(&mut c, "test:fixed:fixed_window:r", "c").await, 50);
    assert_eq!(
        field(&mut c, "test:sliding:sliding_window:r", "c").await,
        20
    );
    assert_eq!(
        tat(&mut c, "test:bucket:gcra:r").await,
        Some(NOW + 20 * 360_000_000)
    );
    // Every rule gone: nothing to send.
    let reserved = policy.reserve_at(&tenant, NOW, 5).await.unwrap();
    policy
        .reload(
            PolicyConfig::from_toml(
                r#"
                [[rules]]
                name = "other"
                limit = 1
                period = "1h"
            "#,
            )
            .unwrap(),
        )
        .unwrap();
    let before = round_trips(&mut c).await;
    let s = policy
        .settle_at(reserved.reservation.unwrap(), NOW, 100)
        .await
        .unwrap();
    assert_eq!((s.rules, s.stale), (2, 2));
    assert_eq!(round_trips(&mut c).await, before);
}

#[tokio::test]
async fn a_reservation_and_a_settlement_are_one_round_trip_each() {
    let server = RedisServer::start();
    let mut c = raw(&server).await;
    let policy = policy(&server, THREE);
    let tenant = [("tenant", "rt")];
    // Load the scripts first (a script's first call also loads it).
    let warm = policy.reserve(&tenant, 1).await.unwrap();
    policy.settle(warm.reservation.unwrap(), 2).await.unwrap();
    let warm = policy.reserve(&tenant, 2).await.unwrap();
    policy.settle(warm.reservation.unwrap(), 1).await.unwrap();
    for (estimate, actual) in [(10, 4), (10, 25), (10, 0), (7, 7)] {
        let before = round_trips(&mut c).await;
        let reserved = policy.reserve(&tenant, estimate).await.unwrap();
        let reservation = reserved.reservation.unwrap();
        assert_eq!(reservation.rules(), 3);
        let reserving = round_trips(&mut c).await - before;
        assert_eq!(reserving, 1, "reserve: one call for three rules");
        policy.settle(reservation, actual).await.unwrap();
        let settling = round_trips(&mut c).await - before - reserving;
        let want = u64::from(actual != estimate);
        assert_eq!(settling, want, "settle {estimate} -> {actual}");
    }
}

#[tokio::test]
async fn lease_mode_gives_a_surplus_to_the_lease_and_charges_redis() {
    let server = RedisServer::start();
    let mut c = raw(&server).await;
    let config = PolicyConfig::from_toml(
        r#"
        [[rules]]
        name = "tokens"
        match = { tenant = "any" }
        key = ["tenant"]
        limit = 10
        period = "10s"
    "#,
    )
    .unwrap();
    let policy = RedisPolicy::new(
        config,
        conn(&server),
        RedisSettings {
            lease: Some(LeaseConfig {
                size: 5,
                ttl: Duration::from_secs(60),
                min_grant: 1,
                // Room for both keys whatever their shards: at 16 (one key per shard) "warm" and
                // "l" shared a shard once in 16 runs and "l" was decided untracked, without a lease.
                max_keys: 1_024,
                renew_below: 0,
            }),
            ..settings()
        },
    )
    .unwrap();
    // Load the settle script first (a script's first call also loads it), on another key.
    let warm = policy
        .reserve_at(&[("tenant", "warm")], NOW, 1)
        .await
        .unwrap();
    policy
        .settle_at(warm.reservation.unwrap(), NOW, 2)
        .await
        .unwrap();
    let tenant = [("tenant", "l")];
    let key = "test:tokens:gcra:l";
    let second = 1_000_000_000;
    // A lease of 5 from the bucket of 10; 4 of it reserved.
    let reserved = policy.reserve_at(&tenant, NOW, 4).await.unwrap();
    assert_eq!(tat(&mut c, key).await, Some(NOW + 5 * second));
    // 3 of the 4 come back to the lease, locally.
    let before = round_trips(&mut c).await;
    policy
        .settle_at(reserved.reservation.unwrap(), NOW, 1)
        .await
        .unwrap();
    assert_eq!(
        round_trips(&mut c).await,
        before,
        "a surplus goes to the lease"
    );
    // The lease holds 4 again: spent without a call.
    let reserved = policy.reserve_at(&tenant, NOW, 4).await.unwrap();
    assert!(reserved.decision.is_allowed());
    assert_eq!(round_trips(&mut c).await, before);
    // 6 more than reserved: charged to the shared bucket, one call.
    policy
        .settle_at(reserved.reservation.unwrap(), NOW, 10)
        .await
        .unwrap();
    assert_eq!(round_trips(&mut c).await, before + 1);
    assert_eq!(tat(&mut c, key).await, Some(NOW + 11 * second));
}

#[tokio::test]
async fn redis_down_settles_nothing_and_fail_closed_hands_an_overdraft_back() {
    let mut server = RedisServer::start();
    let config = PolicyConfig::from_toml(
        r#"
        [[rules]]
        name = "tokens"
        match = { tenant = "any" }
        key = ["tenant"]
        limit = 100
        period = "1h"
    "#,
    )
    .unwrap();
    let with = |fail| RedisSettings {
        fail,
        timeout: Duration::from_millis(200),
        ..settings()
    };
    let closed = RedisPolicy::new(
        config.clone(),
        conn(&server),
        with(FaultPolicy::FailClosed {
            retry_after: Duration::from_secs(1),
        }),
    )
    .unwrap();
    let open = RedisPolicy::new(config, conn(&server), with(FaultPolicy::FailOpen)).unwrap();
    let tenant = [("tenant", "d")];
    let a = closed
        .reserve_at(&tenant, NOW, 10)
        .await
        .unwrap()
        .reservation
        .unwrap();
    let b = closed
        .reserve_at(&tenant, NOW, 10)
        .await
        .unwrap()
        .reservation
        .unwrap();
    let d = open
        .reserve_at(&tenant, NOW, 10)
        .await
        .unwrap()
        .reservation
        .unwrap();
    server.kill();
    // A surplus: not confirmed, not given back, nothing to retry.
    let e = closed.settle_at(a, NOW, 2).await.unwrap_err();
    assert!(e.error.is_outage(), "{e}");
    assert_eq!((e.unconfirmed, e.retry.is_some()), (1, false));
    // An overdraft: fail closed hands the reservation back to settle again.
    let e = closed.settle_at(b, NOW, 15).await.unwrap_err();
    assert_eq!(e.unconfirmed, 1);
    let retry = e.retry.expect("fail closed keeps what is owed");
    // Fail open forgives it.
    let e = open.settle_at(d, NOW, 15).await.unwrap_err();
    assert!(e.retry.is_none());
    // Back up (empty: persistence is off), the retry charges what was owed.
    server.restart();
    let mut c = raw(&server).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut pending = retry;
    let settled = loop {
        match closed.settle_at(pending, NOW, 15).await {
            Ok(s) => break s,
            Err(e) => {
                assert!(e.error.is_outage(), "{e}");
                pending = e.retry.expect("still owed");
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "redis never came back"
        );
        // Polling for the reconnection and the breaker's next probe, not a race.
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((settled.estimate, settled.actual), (10, 15));
    // The 5 owed, on a fresh key: 36 s per unit.
    assert_eq!(
        tat(&mut c, "test:tokens:gcra:d").await,
        Some(NOW + 5 * 36_000_000_000)
    );
}

/// Random checks and after-the-fact charges (no reservation) on a simulated clock: Redis answers
/// every check as the in-process policy does, so a charge moves the Redis state as
/// `Policy::charge` moves the in-process one (debt included); each charge is one round trip for
/// all its rules.
#[tokio::test]
async fn charges_exactly_as_the_in_process_policy_in_one_round_trip() {
    let server = RedisServer::start();
    let mut c = raw(&server).await;
    let redis = policy(&server, MIXED);
    let local = in_process(MIXED);
    let mut rng = StdRng::seed_from_u64(2029);
    let tenants = ["a", "b"];
    let routes = ["/x", "/y"];
    let mut now = NOW + 7_000_000;
    // Load the settle script first (a script's first call also loads it).
    let warm = [("tenant", "warm"), ("route", "/x")];
    redis.charge_at(&warm, now, 1).await.unwrap();
    local.charge_at(&warm, now, 1);
    let (mut allowed, mut denied, mut charged) = (0, 0, 0);
    for step in 0..400 {
        now += rng.random_range(0..=2_000_000u64) * 1000; // whole µs
        let request = [
            ("tenant", tenants[rng.random_range(0..2)]),
            ("route", routes[rng.random_range(0..2)]),
        ];
        if rng.random_range(0..3) == 0 {
            let cost = rng.random_range(0..=14u64);
            let want = local.charge_at(&request, now, cost);
            let before = round_trips(&mut c).await;
            let got = redis.charge_at(&request, now, cost).await.unwrap();
            let trips = round_trips(&mut c).await - before;
            assert_eq!(got, want, "step {step}");
            assert_eq!(got.rules, 4);
            assert_eq!(
                trips,
                u64::from(cost > 0),
                "step {step}: one call for four rules"
            );
            charged += u64::from(cost > 0);
        } else {
            let cost = rng.random_range(1..=4u64);
            let want = local.check_at(&request, now, cost).unwrap();
            let (got, _) = redis.check_at(&request, now, cost).await.unwrap();
            assert_eq!(
                got.is_allowed(),
                want.is_allowed(),
                "step {step}: {request:?}"
            );
            assert_eq!(got.rule, want.rule, "step {step}");
            assert_eq!(
                got.decision.remaining(),
                want.decision.remaining(),
                "step {step}"
            );
            if want.is_allowed() {
                allowed += 1;
            } else {
                denied += 1;
            }
        }
    }
    assert!(
        allowed > 100 && denied > 20 && charged > 80,
        "{allowed} {denied} {charged}"
    );
}

/// A decision of 0 units (what tollgate-server makes of an RLS descriptor's explicit
/// `hits_addend` of 0) takes nothing on Redis as in process: admitted on a fresh or spent key,
/// refused once the key is overdrawn, and nothing written.
#[tokio::test]
async fn a_decision_of_nothing_is_refused_only_when_overdrawn_as_in_process() {
    let server = RedisServer::start();
    let mut c = raw(&server).await;
    let redis = policy(&server, MIXED);
    let local = in_process(MIXED);
    let request = [("tenant", "z"), ("route", "/x")];
    let now = NOW + 5_000_000;
    for (step, charge) in [0u64, 20, 1].into_iter().enumerate() {
        if charge > 0 {
            local.charge_at(&request, now, charge);
            redis.charge_at(&request, now, charge).await.unwrap();
        }
        let want = local.check_at(&request, now, 0).unwrap();
        let (got, _) = redis.check_at(&request, now, 0).await.unwrap();
        assert_eq!(got.is_allowed(), want.is_allowed(), "step {step}");
        assert_eq!(got.rule, want.rule, "step {step}");
        assert_eq!(
            got.decision.remaining(),
            want.decision.remaining(),
            "step {step}"
        );
        if step == 0 {
            assert!(got.is_allowed());
            assert_eq!(
                tat(&mut c, "test:bucket:gcra:z").await,
                None,
                "nothing written"
            );
        }
    }
    // Charged 21 against the bucket's 20: overdrawn, so the last decision of nothing was refused.
    assert!(!local.check_at(&request, now, 0).unwrap().is_allowed());
}
