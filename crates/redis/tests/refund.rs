//! Refunds against a real `redis-server` (started per test on its own loopback port): the refund
//! scripts against the core's `Algorithm::refund` on random check/refund traces, and the lease
//! mode's local refund.

mod common;

use std::time::Duration;

use common::{RedisServer, round_up_us};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tollgate_core::algorithm::Algorithm;
use tollgate_core::{FixedWindow, Gcra, LeakyBucket, ManualClock, Nanos, Quota, SlidingWindow};
use tollgate_redis::{
    BreakerConfig, Error, KeyType, LeaseConfig, LeasedLimiter, RedisConfig, RedisEncoding,
    RedisLimiter, connect,
};

/// Around 2023 in µs since the Unix epoch, so the scripts see realistic magnitudes.
const EPOCH_US: u64 = 1_700_000_000_000_000;

async fn raw(server: &RedisServer) -> MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

fn config() -> RedisConfig {
    RedisConfig::default()
        .with_prefix("t:")
        .with_timeout(Duration::from_secs(2))
}

fn limiter<A: RedisEncoding>(server: &RedisServer, model: A) -> RedisLimiter<A> {
    let cfg = config();
    RedisLimiter::from_algorithm(connect(&server.url(), &cfg).unwrap(), model, cfg).unwrap()
}

/// Stores core `word` as `A` encodes it, with no TTL (0: no key).
async fn seed<A: RedisEncoding>(conn: &mut MultiplexedConnection, model: &A, key: &str, word: u64) {
    let mut p = redis::pipe();
    p.atomic().del(key).ignore();
    if word != 0 {
        let values = model.encode(word);
        match A::KEY_TYPE {
            KeyType::String => p.set(key, &values[0]).ignore(),
            KeyType::Hash(fields) => {
                let pairs: Vec<(&str, &String)> = fields.iter().copied().zip(&values).collect();
                p.hset_multiple(key, &pairs).ignore()
            }
        };
    }
    let _: () = p.query_async(conn).await.unwrap();
}

/// The key's state word (`None`: no key) and its PTTL in ms.
async fn stored<A: RedisEncoding>(
    conn: &mut MultiplexedConnection,
    model: &A,
    key: &str,
) -> (Option<u64>, i64) {
    let mut read = redis::pipe();
    read.atomic();
    let (values, pttl): (Vec<Option<String>>, i64) = match A::KEY_TYPE {
        KeyType::String => {
            read.get(key);
            read.pttl(key);
            let (v, pttl): (Option<String>, i64) = read.query_async(conn).await.unwrap();
            (vec![v], pttl)
        }
        KeyType::Hash(fields) => {
            let cmd = read.cmd("HMGET").arg(key);
            for f in fields {
                cmd.arg(*f);
            }
            read.pttl(key);
            read.query_async(conn).await.unwrap()
        }
    };
    let word = (pttl != -2).then(|| model.decode(&values).unwrap());
    (word, pttl)
}

/// How long after `now` state `word` turns fresh (the least such time; freshness only ever
/// begins as time goes forward).
fn fresh_after<A: Algorithm>(model: &A, word: u64, now: Nanos) -> Nanos {
    let (mut lo, mut hi) = (0u64, 1u64 << 52);
    assert!(model.is_fresh(word, now + hi));
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if model.is_fresh(word, now + mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// What a trace did, so that a test can insist it exercised something.
#[derive(Debug, Default)]
struct Tally {
    allowed: u64,
    denied: u64,
    /// Refunds that changed what the state decides (the core's, normalised at the clock).
    effective_refunds: u64,
    /// Refunds that gave nothing back.
    idle_refunds: u64,
}

/// The oracle: `steps` random checks, peeks and refunds on a manual clock (client time, whole µs,
/// never going back), run through the scripts on one continuously evolving Redis key and through
/// the core's `decide`/`refund` on a state word. Refunds are of admissions made earlier, at the
/// admission's own `now` (as a multi-limit decision makes them) or at the current time, or of
/// arbitrary costs. After every call:
/// * a check or peek decided the same (the sliding window's durations rounded up to µs);
/// * the key holds the core's state, up to freshness at the clock (a fresh core state is the
///   absent key, or a state that is fresh too);
/// * a key the call wrote has the TTL at which its state turns fresh, measured from the call's now.
///
/// Then the key is stored back as read, without its TTL, so that real time does not expire it under
/// the simulated clock.
async fn oracle<A: RedisEncoding>(
    server: &RedisServer,
    model: A,
    rng: &mut StdRng,
    steps: usize,
    key: &str,
    tally: &mut Tally,
) {
    let mut conn = raw(server).await;
    let limiter = limiter(server, model.clone());
    let full = format!("t:{key}");
    let capacity = model.capacity();
    let period_us = model.quota().period_nanos() / 1000;
    let sliding = A::NAME == SlidingWindow::NAME;
    let mut state = 0u64;
    let mut now_us = EPOCH_US + rng.random_range(0..period_us * 3);
    // Admissions not yet refunded: (now, cost).
    let mut admissions: Vec<(Nanos, u64)> = Vec::new();
    for step in 0..steps {
        now_us += match rng.random_range(0..100) {
            0..35 => 0,
            35..85 => rng.random_range(0..=period_us / 8),
            85..97 => rng.random_range(0..=period_us * 2),
            _ => rng.random_range(0..=period_us * 4),
        };
        let clock = now_us * 1000;
        let before = state;
        let (op_now, what) = match rng.random_range(0..100) {
            0..50 => {
                let cost = match rng.random_range(0..10) {
                    0..6 => 1,
                    6..9 => rng.random_range(1..=capacity),
                    _ => 0,
                };
                let got = limiter.try_check_at(key, clock, cost).await.unwrap();
                let t = model.decide(state, clock, cost).unwrap();
                let want = if sliding {
                    round_up_us(t.decision)
                } else {
                    t.decision
                };
                assert_eq!(got, want, "{key} step {step}: check {cost} at {now_us}");
                if got.is_allowed() {
                    tally.allowed += 1;
                    if cost > 0 {
                        admissions.push((clock, cost));
                    }
                } else {
                    tally.denied += 1;
                }
                state = t.next.unwrap_or(state);
                (clock, format!("check {cost}"))
            }
            50..60 => {
                let cost = rng.random_range(0..=capacity);
                let got = limiter.try_peek_at(key, clock, cost).await.unwrap();
                let t = model.decide(state, clock, cost).unwrap();
                let want = if sliding {
                    round_up_us(t.decision)
                } else {
                    t.decision
                };
                assert_eq!(got, want, "{key} step {step}: peek {cost} at {now_us}");
                (clock, format!("peek {cost}"))
            }
            roll => {
                let (at, cost) = match roll {
                    // One of the latest admissions, at its own now (the core's exact case) ...
                    60..85 if !admissions.is_empty() => {
                        let i = admissions.len() - 1 - rng.random_range(0..admissions.len().min(4));
                        admissions.remove(i)
                    }
                    // ... or at the current time ...
                    85..93 if !admissions.is_empty() => {
                        let i = admissions.len() - 1 - rng.random_range(0..admissions.len().min(4));
                        (clock, admissions.remove(i).1)
                    }
                    // ... or any cost, more than was admitted included.
                    _ => {
                        let cost = match rng.random_range(0..10) {
                            0 => 0,
                            1 => u64::MAX,
                            _ => rng.random_range(1..=capacity * 3),
                        };
                        (clock, cost)
                    }
                };
                limiter.try_refund_at(key, at, cost).await.unwrap();
                state = model.refund(state, at, cost).unwrap_or(state);
                let norm = |w| if model.is_fresh(w, clock) { 0 } else { w };
                if norm(state) != norm(before) {
                    tally.effective_refunds += 1;
                } else {
                    tally.idle_refunds += 1;
                }
                (at, format!("refund {cost} at {}", at / 1000))
            }
        };
        let ctx =
            format!("{key} step {step}: {what}, clock {now_us}, state {before:#x} -> {state:#x}");

        let norm = |w: u64| if model.is_fresh(w, clock) { 0 } else { w };
        let (word, pttl) = stored(&mut conn, &model, &full).await;
        match word {
            Some(word) => {
                assert_eq!(norm(word), norm(state), "{ctx}: stored {word:#x}");
                if pttl >= 0 {
                    // Written by this call (earlier TTLs were stripped): fresh exactly when it expires.
                    let want_ms =
                        fresh_after(&model, word, op_now).div_ceil(1_000_000).max(1) as i64;
                    assert!(
                        pttl <= want_ms && pttl > want_ms - 1000,
                        "{ctx}: PTTL {pttl} ms, want {want_ms} ms"
                    );
                } else {
                    assert_eq!(pttl, -1, "{ctx}");
                }
                seed(&mut conn, &model, &full, word).await;
            }
            None if norm(state) == 0 => {}
            None => {
                // Only a key that short-lived may have expired in real time since it was written.
                let ttl = fresh_after(&model, state, op_now);
                assert!(ttl <= 100_000_000, "{ctx}: key gone, fresh after {ttl} ns");
                seed(&mut conn, &model, &full, state).await;
            }
        }
    }
}

/// A GCRA quota with an emission interval of 1-5 s in any ns (so TTLs outlast the test's real
/// time), limit 1-20, burst 1-30.
fn tat_quota(rng: &mut StdRng) -> Quota {
    let interval_ns = rng.random_range(1_000_000_000..=5_000_000_000u64);
    let limit = rng.random_range(1..=20u64);
    Quota::per(
        Duration::from_nanos(limit * interval_ns - rng.random_range(0..limit)),
        limit,
    )
    .unwrap()
    .with_burst(rng.random_range(1..=30))
    .unwrap()
}

/// A window quota of 1-60 s, every other round not whole µs (rounded up by `redis_quota`).
fn window_quota(rng: &mut StdRng, round: usize) -> Quota {
    let window_us = rng.random_range(1_000_000..=60_000_000u64);
    let window_ns = if round % 2 == 0 {
        window_us * 1000
    } else {
        window_us * 1000 - rng.random_range(1..1000)
    };
    let limit = rng.random_range(1..=50u64);
    Quota::per(Duration::from_nanos(window_ns), limit).unwrap()
}

async fn oracle_rounds<A: RedisEncoding>(
    seed: u64,
    name: &str,
    quota: fn(&mut StdRng, usize) -> Quota,
) {
    let server = RedisServer::start();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tally = Tally::default();
    for round in 0..6 {
        let q = A::redis_quota(quota(&mut rng, round)).unwrap();
        let model = A::from_quota(q).unwrap();
        oracle(
            &server,
            model,
            &mut rng,
            250,
            &format!("{name}{round}"),
            &mut tally,
        )
        .await;
    }
    // The traces must have exercised every outcome to mean anything.
    assert!(
        tally.allowed > 100 && tally.denied > 50,
        "{name}: {tally:?}"
    );
    assert!(
        tally.effective_refunds > 50 && tally.idle_refunds > 20,
        "{name}: {tally:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_refunds_agree_with_core() {
    oracle_rounds::<Gcra>(21, "gcra", |rng, _| tat_quota(rng)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaky_bucket_refunds_agree_with_core() {
    oracle_rounds::<LeakyBucket>(22, "lb", |rng, _| tat_quota(rng)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_refunds_agree_with_core() {
    oracle_rounds::<FixedWindow>(23, "fw", window_quota).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_refunds_agree_with_core() {
    oracle_rounds::<SlidingWindow>(24, "sw", window_quota).await;
}

/// The raw stored values and PTTL of a key.
async fn dump(conn: &mut MultiplexedConnection, key: &str) -> (Vec<(String, String)>, i64) {
    let values: Vec<(String, String)> = conn.hgetall(key).await.unwrap();
    let pttl: i64 = conn.pttl(key).await.unwrap();
    (values, pttl)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_after_the_window_rolled_gives_nothing_back() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let quota = Quota::per_second(5).unwrap();
    let start = EPOCH_US * 1000 + 900_000_000; // 0.9 s into a second
    let next = start + 200_000_000; // the next window

    let fixed = limiter(&server, FixedWindow::from_quota(quota).unwrap());
    assert!(
        fixed
            .try_check_at("f", start, 3)
            .await
            .unwrap()
            .is_allowed()
    );
    let before = dump(&mut conn, "t:f").await;
    fixed.try_refund_at("f", next, 3).await.unwrap();
    assert_eq!(
        dump(&mut conn, "t:f").await.0,
        before.0,
        "rolled: untouched"
    );
    // The count it was in has reset anyway: the new window holds the whole limit.
    assert_eq!(
        fixed.try_peek_at("f", next, 5).await.unwrap().remaining(),
        0
    );
    // In its own window the same refund gives the units back.
    fixed.try_refund_at("f", start, 2).await.unwrap();
    assert_eq!(
        fixed.try_peek_at("f", start, 1).await.unwrap().remaining(),
        3
    );

    let sliding = limiter(&server, SlidingWindow::from_quota(quota).unwrap());
    assert!(
        sliding
            .try_check_at("s", start, 3)
            .await
            .unwrap()
            .is_allowed()
    );
    let before = dump(&mut conn, "t:s").await;
    let weighted = sliding.try_peek_at("s", next, 1).await.unwrap();
    sliding.try_refund_at("s", next, 3).await.unwrap();
    assert_eq!(
        dump(&mut conn, "t:s").await.0,
        before.0,
        "rolled: untouched"
    );
    // The previous window's count still weighs as it did (3 × 0.8 → 3 of 5 taken).
    assert_eq!(sliding.try_peek_at("s", next, 1).await.unwrap(), weighted);
    assert_eq!(weighted.remaining(), 1);
    // Refunded at the admission's own time after a later admission moved the state on, the units
    // come off the previous count (the core's exact case).
    assert!(
        sliding
            .try_check_at("s", next, 1)
            .await
            .unwrap()
            .is_allowed()
    );
    sliding.try_refund_at("s", start, 3).await.unwrap();
    assert_eq!(
        sliding.try_peek_at("s", next, 1).await.unwrap().remaining(),
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_never_makes_a_key_fresher_than_fresh() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let now = EPOCH_US * 1000;
    let quota = Quota::per_second(10).unwrap(); // burst 10, one unit per 100 ms

    let gcra = limiter(&server, Gcra::from_quota(quota).unwrap());
    // On no key: nothing is created.
    gcra.try_refund_at("g", now, 5).await.unwrap();
    assert!(!conn.exists::<_, bool>("t:g").await.unwrap());
    // Back by 2 intervals of the 3 taken: 1 taken, the TTL follows the TAT.
    assert!(gcra.try_check_at("g", now, 3).await.unwrap().is_allowed());
    gcra.try_refund_at("g", now, 2).await.unwrap();
    let tat: String = conn.get("t:g").await.unwrap();
    // The TAT in ns, then the quota it was written under.
    assert_eq!(
        tat.split_once(';').map(|(t, _)| t),
        Some(&*(now + 100_000_000).to_string())
    );
    let pttl: i64 = conn.pttl("t:g").await.unwrap();
    assert!(pttl <= 100 && pttl > 0, "PTTL {pttl}");
    // A cost whose `cost × interval` overflows gives nothing back, as in the core.
    let model = Gcra::from_quota(quota).unwrap();
    assert_eq!(model.refund(now + 100_000_000, now, u64::MAX), None);
    gcra.try_refund_at("g", now, u64::MAX).await.unwrap();
    assert_eq!(conn.get::<_, String>("t:g").await.unwrap(), tat);
    // More than was taken: the bucket is full again (the key is gone), not fuller.
    gcra.try_refund_at("g", now, 1_000_000_000).await.unwrap();
    assert!(!conn.exists::<_, bool>("t:g").await.unwrap());
    assert_eq!(
        gcra.try_check_at("g", now, 10).await.unwrap().remaining(),
        0
    );
    assert!(!gcra.try_check_at("g", now, 1).await.unwrap().is_allowed());
    // A TAT already in the past is a full bucket: a refund there writes nothing.
    let later = now + 5_000_000_000;
    let before: String = conn.get("t:g").await.unwrap();
    gcra.try_refund_at("g", later, 4).await.unwrap();
    assert_eq!(conn.get::<_, String>("t:g").await.unwrap(), before);
    assert_eq!(
        gcra.try_peek_at("g", later, 10).await.unwrap().remaining(),
        0
    );

    for (key, name) in [("fw", "fixed"), ("sw", "sliding")] {
        let full = format!("t:{key}");
        let (admit, refund) = if name == "fixed" {
            let l = limiter(&server, FixedWindow::from_quota(quota).unwrap());
            assert!(l.try_check_at(key, now, 4).await.unwrap().is_allowed());
            l.try_refund_at(key, now, 1000).await.unwrap();
            (
                l.try_check_at(key, now, 10).await.unwrap(),
                l.try_check_at(key, now, 1).await.unwrap(),
            )
        } else {
            let l = limiter(&server, SlidingWindow::from_quota(quota).unwrap());
            assert!(l.try_check_at(key, now, 4).await.unwrap().is_allowed());
            l.try_refund_at(key, now, 1000).await.unwrap();
            assert!(!conn.exists::<_, bool>(&full).await.unwrap(), "{name}");
            (
                l.try_check_at(key, now, 10).await.unwrap(),
                l.try_check_at(key, now, 1).await.unwrap(),
            )
        };
        assert_eq!(admit.remaining(), 0, "{name}: exactly the limit");
        assert!(!refund.is_allowed(), "{name}: not one more");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_of_nothing_need_no_round_trip_and_lost_ones_are_counted() {
    let mut server = RedisServer::start();
    let cfg = RedisConfig::default()
        .with_timeout(Duration::from_millis(200))
        .with_breaker(BreakerConfig::disabled());
    let gcra = RedisLimiter::gcra(
        connect(&server.url(), &cfg).unwrap(),
        Quota::per_second(10).unwrap(),
        cfg,
    )
    .unwrap();
    assert!(gcra.try_check("k", 1).await.unwrap().is_allowed());
    server.kill();
    // Cost 0 answers without touching the (dead) server.
    gcra.try_refund("k", 0).await.unwrap();
    let err = gcra.try_refund("k", 1).await.unwrap_err();
    assert!(err.is_outage(), "{err:?}");
    assert!(!matches!(err, Error::Cost(_)));
    // With the fault handling: dropped (the units stay spent) and counted as an outage.
    let before = gcra.faults().outages;
    gcra.refund("k", 1).await;
    gcra.refund("k", 0).await;
    assert_eq!(gcra.faults().outages, before + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_refunds_return_units_to_the_live_lease_locally() {
    let server = RedisServer::start();
    let cfg = config();
    let clock = ManualClock::new();
    let leased = LeasedLimiter::with_clock(
        connect(&server.url(), &cfg).unwrap(),
        Quota::per_second(10).unwrap(), // burst 10
        cfg,
        LeaseConfig {
            size: 4,
            ttl: Duration::from_secs(10),
            min_grant: 1,
            max_keys: 16,
            renew_below: 0,
        },
        clock,
    )
    .unwrap();
    let now: Nanos = EPOCH_US * 1000;
    // Never leased here: nothing comes back.
    assert_eq!(leased.refund_at("k", now, 1), 0);
    // A lease of 4 from the burst of 10; an answer reports the shared quota's estimate: the 6 the
    // bucket kept plus the 2 the lease still holds.
    assert_eq!(
        leased.try_check_at("k", now, 2).await.unwrap().remaining(),
        6 + 2
    );
    assert_eq!(leased.refund_at("k", now, 1), 1);
    let s = leased.stats_at(now);
    assert_eq!(
        (s.redis_calls, s.leased, s.admitted, s.refunded, s.held),
        (1, 4, 1, 1, 3)
    );
    // At most what the lease admitted comes back: the lease never holds more than its grant.
    assert_eq!(leased.refund_at("k", now, 5), 1);
    assert_eq!(leased.stats_at(now).held, 4);
    // The units are spent again locally, without a round trip.
    for left in (0..4).rev() {
        assert_eq!(
            leased.try_check_at("k", now, 1).await.unwrap().remaining(),
            6 + left
        );
    }
    let s = leased.stats_at(now);
    assert_eq!(
        (s.redis_calls, s.admitted, s.refunded, s.held),
        (1, 4, 2, 0)
    );
    assert_eq!(s.leased, s.admitted + s.stranded + s.held);
    // Once the lease has expired nothing comes back (stricter): the units stay spent.
    let expired = now + 10_000_000_000;
    assert_eq!(leased.refund_at("k", expired, 2), 0);
    assert_eq!(leased.stats_at(expired).refunded, 2);
    assert_eq!(leased.refund_at("k", now, 0), 0);
}
