//! Charges against a real `redis-server` (started per test on its own loopback port): the charge
//! scripts against the core's `Algorithm::charge` on random states, costs and times (the core's own
//! states, debts included, seeded under this quota or another one), and the multi-key settle
//! script's give-backs and charges against the single-key scripts.

mod common;

use std::time::Duration;

use common::RedisServer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tollgate_core::algorithm::Algorithm;
use tollgate_core::{FixedWindow, Gcra, LeakyBucket, Nanos, Quota, SlidingWindow};
use tollgate_redis::{
    BatchKey, BatchLimit, Error, KeyType, RedisBatch, RedisConfig, RedisEncoding, RedisLimiter,
    SettleKey, SettleOp, connect,
};

/// Around 2023 in µs since the Unix epoch, so the scripts see realistic magnitudes.
const EPOCH_US: u64 = 1_700_000_000_000_000;
/// The furthest ahead of now a stored TAT may be, in the script's units (tat.lua's AHEAD_MAX).
const AHEAD_MAX: u64 = 1 << 52;

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

/// Stores core `word` as `model` encodes it (its quota tag included), with no TTL (0: no key).
async fn seed<A: RedisEncoding>(conn: &mut MultiplexedConnection, model: &A, key: &str, word: u64) {
    let _: () = conn.del(key).await.unwrap();
    if word == 0 {
        return;
    }
    let values = model.encode(word);
    match A::KEY_TYPE {
        KeyType::String => conn.set::<_, _, ()>(key, &values[0]).await.unwrap(),
        KeyType::Hash(fields) => {
            let pairs: Vec<(&str, &String)> = fields.iter().copied().zip(&values).collect();
            conn.hset_multiple::<_, _, _, ()>(key, &pairs)
                .await
                .unwrap()
        }
    }
}

/// The key's state word as `model` reads it (`None`: no key) and its PTTL in ms.
async fn stored<A: RedisEncoding>(
    conn: &mut MultiplexedConnection,
    model: &A,
    key: &str,
) -> (Option<u64>, i64) {
    let values: Vec<Option<String>> = match A::KEY_TYPE {
        KeyType::String => vec![conn.get(key).await.unwrap()],
        KeyType::Hash(fields) => {
            let mut cmd = redis::cmd("HMGET");
            cmd.arg(key);
            for f in fields {
                cmd.arg(*f);
            }
            cmd.query_async(conn).await.unwrap()
        }
    };
    let pttl: i64 = conn.pttl(key).await.unwrap();
    let word = (pttl != -2).then(|| model.decode(&values).unwrap());
    (word, pttl)
}

/// How long after `now` state `word` turns fresh.
fn fresh_after<A: Algorithm>(model: &A, word: u64, now: Nanos) -> Nanos {
    let (mut lo, mut hi) = (0u64, 1u64 << 62);
    if !model.is_fresh(word, now.saturating_add(hi)) {
        return hi;
    }
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

/// What the script stores for the core's `charged` word: the same, except where the core's count
/// goes beyond the script's largest state (see `RedisLimiter::try_charge`).
trait Capped: RedisEncoding {
    fn capped(&self, charged: u64, now: Nanos) -> u64;
}

fn tat_cap<A: RedisEncoding>(model: &A, charged: u64, now: Nanos) -> u64 {
    let per_us: u64 = model.script_params().unwrap().args()[0].parse().unwrap();
    charged.min(now + AHEAD_MAX * (1000 / per_us))
}

impl Capped for Gcra {
    fn capped(&self, charged: u64, now: Nanos) -> u64 {
        tat_cap(self, charged, now)
    }
}

impl Capped for LeakyBucket {
    fn capped(&self, charged: u64, now: Nanos) -> u64 {
        tat_cap(self, charged, now)
    }
}

fn max_count<A: RedisEncoding>(model: &A) -> u64 {
    model.script_params().unwrap().args()[2].parse().unwrap()
}

impl Capped for FixedWindow {
    fn capped(&self, charged: u64, _: Nanos) -> u64 {
        let mut s = self.layout().unpack(charged);
        s.count = s.count.min(max_count(self));
        self.layout().pack(s)
    }
}

impl Capped for SlidingWindow {
    fn capped(&self, charged: u64, _: Nanos) -> u64 {
        let mut s = self.layout().unpack(charged);
        s.current = s.current.min(max_count(self));
        self.layout().pack(s)
    }
}

#[derive(Debug, Default)]
struct Tally {
    /// Charges that left the key in debt (denying a request of cost 1 at once).
    into_debt: u64,
    /// Charges the script capped below the core's count.
    capped: u64,
    /// Charges of a state written under another quota.
    carried: u64,
    /// Charges of 0 (no round trip, nothing written).
    zero: u64,
}

/// `steps` random charges on random states: each step seeds a state the core could hold (made by
/// the core's own decisions and charges from a fresh key, under `model`'s quota or under `other`'s,
/// at times around now), charges a random cost at a random whole-µs now, and compares the key with
/// the core's `charge` (after `carry_over` for a state of the other quota): the state word (up to
/// the script's cap), the quota tag (the stored value decodes under `model`), and the TTL.
async fn differential<A: Capped>(
    server: &RedisServer,
    model: A,
    other: A,
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
    for step in 0..steps {
        let now_us = EPOCH_US + rng.random_range(0..period_us * 20);
        let now = now_us * 1000;
        // A state of the core: a short random history of decisions and charges before now.
        let foreign = rng.random_range(0..5) == 0;
        let writer = if foreign { &other } else { &model };
        let mut word = 0u64;
        let mut t_us = now_us.saturating_sub(rng.random_range(0..period_us * 3));
        for _ in 0..rng.random_range(0..6) {
            let at = t_us * 1000;
            if rng.random_range(0..3) == 0 {
                let cost = rng.random_range(1..=writer.capacity() * 2);
                word = writer.charge(word, at, cost).unwrap_or(word);
            } else {
                let cost = rng.random_range(1..=writer.capacity());
                word = writer.decide(word, at, cost).unwrap().next.unwrap_or(word);
            }
            t_us = (t_us + rng.random_range(0..=period_us / 2)).min(now_us);
        }
        seed(&mut conn, writer, &full, word).await;
        let cost = match rng.random_range(0..20) {
            0 => 0,
            1 => u64::MAX,
            2 => rng.random_range(1u64 << 40..1 << 62),
            3..10 => 1,
            _ => rng.random_range(1..=capacity * 3),
        };
        let before = if foreign {
            tally.carried += 1;
            other.carry_over(word, now, &model)
        } else {
            word
        };
        limiter.try_charge_at(key, now, cost).await.unwrap();
        let ctx = format!(
            "{key} step {step}: charge {cost} at {now_us} on {word:#x} (foreign {foreign}, \
             carried {before:#x})"
        );
        let Some(charged) = model.charge(before, now, cost) else {
            tally.zero += 1;
            // Nothing to count, nothing sent: the key is as seeded.
            let (got, _) = stored(&mut conn, writer, &full).await;
            assert_eq!(got, (word != 0).then_some(word), "{ctx}");
            continue;
        };
        let (got, pttl) = stored(&mut conn, &model, &full).await;
        let want = model.capped(charged, now);
        if want != charged {
            tally.capped += 1;
        }
        let got = got.unwrap_or_else(|| panic!("{ctx}: no key after a charge"));
        assert_eq!(got, want, "{ctx}: stored {got:#x}, want {want:#x}");
        // Fresh exactly when it expires (rounded up to whole ms).
        let want_ms = fresh_after(&model, want, now).div_ceil(1_000_000).max(1);
        let want_ms = i64::try_from(want_ms).unwrap_or(i64::MAX);
        assert!(
            pttl <= want_ms && pttl > want_ms.saturating_sub(1000),
            "{ctx}: PTTL {pttl} ms, want {want_ms} ms"
        );
        // The next decision is the core's on the charged state (up to the cap).
        let next = model.decide(want, now, 1).unwrap().decision;
        if !next.is_allowed() {
            tally.into_debt += 1;
        }
        let peeked = limiter.try_peek_at(key, now, 1).await.unwrap();
        assert_eq!(peeked.is_allowed(), next.is_allowed(), "{ctx}");
    }
}

/// A GCRA quota with an emission interval of 1-5 s in any ns, limit 1-20, burst 1-30.
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

/// A window quota of 1-60 s, every other one not whole µs (rounded up by `redis_quota`).
fn window_quota(rng: &mut StdRng) -> Quota {
    let window_us = rng.random_range(1_000_000..=60_000_000u64);
    let window_ns = if rng.random_bool(0.5) {
        window_us * 1000
    } else {
        window_us * 1000 - rng.random_range(1..1000)
    };
    let limit = rng.random_range(1..=50u64);
    Quota::per(Duration::from_nanos(window_ns), limit).unwrap()
}

async fn rounds<A: Capped>(seed: u64, name: &str, quota: fn(&mut StdRng) -> Quota) {
    let server = RedisServer::start();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tally = Tally::default();
    for round in 0..6 {
        let model = A::from_quota(A::redis_quota(quota(&mut rng)).unwrap()).unwrap();
        let other = A::from_quota(A::redis_quota(quota(&mut rng)).unwrap()).unwrap();
        differential(
            &server,
            model,
            other,
            &mut rng,
            120,
            &format!("{name}{round}"),
            &mut tally,
        )
        .await;
    }
    // The states and costs must have exercised every case to mean anything.
    assert!(
        tally.into_debt > 100 && tally.carried > 50 && tally.zero > 10,
        "{name}: {tally:?}"
    );
    // Only a bucket's debt can go beyond the script's exact integers before the core saturates.
    if A::KEY_TYPE == KeyType::String {
        assert!(tally.capped > 10, "{name}: {tally:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_charges_agree_with_core() {
    rounds::<Gcra>(31, "gcra", tat_quota).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaky_bucket_charges_agree_with_core() {
    rounds::<LeakyBucket>(32, "lb", tat_quota).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_charges_agree_with_core() {
    rounds::<FixedWindow>(33, "fw", window_quota).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_charges_agree_with_core() {
    rounds::<SlidingWindow>(34, "sw", window_quota).await;
}

/// The settle script does to each key what the single-key refund and charge scripts do (the
/// give-back of a bucket capped at its segment still ahead of now), all keys in one call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_settle_call_refunds_and_charges_as_the_single_key_scripts() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let cfg = config();
    let batch = RedisBatch::new(connect(&server.url(), &cfg).unwrap(), cfg.clone());
    let quota = Quota::per_second(10).unwrap(); // burst 10, one unit per 100 ms
    let gcra = Gcra::from_quota(quota).unwrap();
    let fixed = FixedWindow::from_quota(quota).unwrap();
    let sliding = SlidingWindow::from_quota(quota).unwrap();
    let (g, f, s) = (
        BatchLimit::new(&gcra).unwrap(),
        BatchLimit::new(&fixed).unwrap(),
        BatchLimit::new(&sliding).unwrap(),
    );
    let at = EPOCH_US * 1000 + 100_000_000; // 0.1 s into a second
    let keys = [
        BatchKey::enforcing("g", &g),
        BatchKey::enforcing("f", &f),
        BatchKey::enforcing("s", &s),
    ];
    let (decided, when) = batch.try_check_timed_at(&keys, at, 8).await.unwrap();
    assert_eq!(when, Some(at), "the batch says when it decided");
    assert!(decided.iter().all(|d| d.is_allowed()));
    let segment_end = at + u64::try_from(decided[0].reset_after().as_nanos()).unwrap();
    assert_eq!(segment_end, at + 800_000_000);
    // 300 ms later: 3 of the bucket's 8 units have passed, so 5 at most come back of 6 surplus.
    let later = at + 300_000_000;
    let back = |units| SettleOp::GiveBack {
        units,
        reserved_at: at,
        segment_end,
    };
    let settle = [
        SettleKey {
            key: "g",
            limit: &g,
            op: back(6),
        },
        SettleKey {
            key: "f",
            limit: &f,
            op: back(6),
        },
        SettleKey {
            key: "s",
            limit: &s,
            op: SettleOp::Charge { units: 7 },
        },
        // Nothing to do: not sent.
        SettleKey {
            key: "none",
            limit: &g,
            op: SettleOp::Charge { units: 0 },
        },
    ];
    let answers = batch.try_settle_at(&settle, later).await.unwrap();
    let answers: Vec<bool> = answers.into_iter().map(Result::unwrap).collect();
    assert_eq!(answers, [true, true, true, false]);
    // GCRA: TAT at `at + 800 ms − 5 × 100 ms` = later: a full bucket at `later`.
    let (word, _) = stored(&mut conn, &gcra, "t:g").await;
    assert!(word.is_none_or(|w| gcra.is_fresh(w, later)), "{word:?}");
    let (word, _) = stored(&mut conn, &fixed, "t:f").await;
    assert_eq!(fixed.layout().unpack(word.unwrap()).count, 2);
    let (word, _) = stored(&mut conn, &sliding, "t:s").await;
    assert_eq!(sliding.layout().unpack(word.unwrap()).current, 15);

    // A key of another type: that key's error, the others settled.
    let _: () = conn.set("t:f", "x").await.unwrap();
    let answers = batch
        .try_settle_at(
            &[
                SettleKey {
                    key: "f",
                    limit: &f,
                    op: SettleOp::Charge { units: 1 },
                },
                SettleKey {
                    key: "g",
                    limit: &g,
                    op: SettleOp::Charge { units: 1 },
                },
            ],
            later,
        )
        .await
        .unwrap();
    assert!(
        matches!(answers[0], Err(Error::WrongType { .. })),
        "{answers:?}"
    );
    assert!(matches!(answers[1], Ok(true)), "{answers:?}");
    // A key twice: refused before any round trip.
    let twice = [settle[0], settle[0]];
    assert!(matches!(
        batch.try_settle_at(&twice, later).await,
        Err(Error::DuplicateKey { .. })
    ));
}
