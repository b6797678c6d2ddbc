//! A quota changed under the same key: the scripts carry a state written under another quota over
//! as-is, as the core's `Algorithm::carry_over` does, and store the result even when they deny.

mod common;

use std::time::Duration;

use common::RedisServer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tollgate_core::algorithm::Algorithm;
use tollgate_core::{Decision, FixedWindow, Gcra, LeakyBucket, Nanos, Quota, SlidingWindow};
use tollgate_redis::{
    BatchKey, BatchLimit, KeyType, LeaseConfig, LeasedLimiter, RedisBatch, RedisConfig,
    RedisEncoding, RedisLimiter, connect,
};

/// Around 2023 in µs since the Unix epoch, so the scripts see realistic magnitudes.
const EPOCH_US: u64 = 1_700_000_000_000_000;

fn config() -> RedisConfig {
    RedisConfig::default()
        .with_prefix("t:")
        .with_timeout(Duration::from_secs(2))
}

async fn raw(server: &RedisServer) -> MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
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

/// The key's state as `model` reads it (it must carry `model`'s tag, or none).
async fn stored<A: RedisEncoding>(conn: &mut MultiplexedConnection, model: &A, key: &str) -> u64 {
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
    model.decode(&values).unwrap()
}

/// Decisions equal: same verdict and remaining, durations within the µs the scripts round to.
fn same(got: Decision, want: Decision) -> bool {
    let close = |a: Duration, b: Duration| a.abs_diff(b) < Duration::from_micros(1);
    match (got, want) {
        (
            Decision::Allowed {
                remaining: a,
                reset_after: ra,
            },
            Decision::Allowed {
                remaining: b,
                reset_after: rb,
            },
        ) => a == b && close(ra, rb),
        (
            Decision::Denied {
                retry_after: a,
                reset_after: ra,
            },
            Decision::Denied {
                retry_after: b,
                reset_after: rb,
            },
        ) => close(a, b) && close(ra, rb),
        _ => false,
    }
}

/// Random quota pairs of one algorithm: a key spends at random under the first, then calls under
/// the second. The script's decision and the state it stores (on admissions and denials alike)
/// equal the core's on `old.carry_over(state, now, &new)`, and a later call decides on that state.
async fn random_pairs<A: RedisEncoding + Clone>(seed_value: u64, quota: fn(&mut StdRng) -> Quota) {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let mut rng = StdRng::seed_from_u64(seed_value);
    let mut converted = 0;
    for round in 0..150 {
        let old = A::from_quota(quota(&mut rng)).unwrap();
        let new = A::from_quota(quota(&mut rng)).unwrap();
        let key = format!("k{round}");
        // A random history under `old`, from fresh, ending at t0.
        let mut t = EPOCH_US * 1000 + rng.random_range(0..10_000_000) * 1000;
        let mut word = 0;
        for _ in 0..rng.random_range(0..6) {
            let cost = rng.random_range(0..=old.capacity());
            if let Ok(tr) = old.decide(word, t, cost) {
                word = tr.next.unwrap_or(word);
            }
            t += rng.random_range(0..old.quota().period_nanos() / 1000 / 2 + 1) * 1000;
        }
        seed(&mut conn, &old, "t:k", word).await;
        let same_quota =
            old.script_params().unwrap().quota_tag() == new.script_params().unwrap().quota_tag();
        let carried = if same_quota {
            word
        } else {
            old.carry_over(word, t, &new)
        };
        let lim = limiter(&server, new.clone());
        let cost = rng.random_range(0..=new.capacity());
        let got = lim.try_check_at("k", t, cost).await.unwrap();
        let want = new.decide(carried, t, cost).unwrap();
        assert!(
            same(got, want.decision),
            "{key}: {got:?} vs {:?} (old {:?} new {:?})",
            want.decision,
            old.quota(),
            new.quota()
        );
        let expect = want.next.unwrap_or(carried);
        // The key's TTL runs on Redis's real clock while this test's time is simulated: a state
        // whose TTL is short may expire before the next command reads it (then it reads as fresh,
        // which is what the TTL promises by then). Below 100 ms, either answer is accepted.
        let may_vanish = new.ttl(expect, t) < 100_000_000;
        if !same_quota && word != 0 {
            converted += 1;
            // Stored under the new quota, even by a denial: a fresh state as no key.
            let found = stored(&mut conn, &new, "t:k").await;
            assert!(
                found == expect || (may_vanish && found == 0),
                "{key}: stored {found}, want {expect}"
            );
        }
        // A later call decides on what was stored, under the new quota alone.
        let later = t + rng.random_range(0..new.quota().period_nanos() / 1000 + 1) * 1000;
        let cost = rng.random_range(0..=new.capacity());
        let got = lim.try_peek_at("k", later, cost).await.unwrap();
        let want = new.decide(expect, later, cost).unwrap().decision;
        let fresh = new.decide(0, later, cost).unwrap().decision;
        assert!(
            same(got, want) || (may_vanish && same(got, fresh)),
            "{key} later: {got:?} vs {want:?}"
        );
    }
    assert!(converted > 50, "only {converted} rounds converted a state");
}

fn tat_quota(rng: &mut StdRng) -> Quota {
    Quota::per(
        Duration::from_millis(rng.random_range(1..=5_000)),
        rng.random_range(1..=20),
    )
    .unwrap()
    .with_burst(rng.random_range(1..=30))
    .unwrap()
}

fn window_quota(rng: &mut StdRng) -> Quota {
    Quota::per(
        Duration::from_millis(rng.random_range(1..=5_000)),
        rng.random_range(1..=30),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_carries_over_as_is_on_random_quota_pairs() {
    random_pairs::<Gcra>(41, tat_quota).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaky_bucket_carries_over_as_is_on_random_quota_pairs() {
    random_pairs::<LeakyBucket>(42, tat_quota).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_carries_over_as_is_on_random_quota_pairs() {
    random_pairs::<FixedWindow>(43, window_quota).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_carries_over_as_is_on_random_quota_pairs() {
    random_pairs::<SlidingWindow>(44, window_quota).await;
}

/// The case, per algorithm and in every script: a burst of 10 spent at 10/s, then 10/min.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_burst_stays_spent_after_a_tightening_in_every_script() {
    let server = RedisServer::start();
    let now: Nanos = EPOCH_US * 1000;
    let fast = Quota::per_second(10).unwrap();
    let slow = Quota::per_minute(10).unwrap();
    let wider = Quota::per_second(10).unwrap().with_burst(30).unwrap();

    // Single-key scripts, each algorithm, tightened and widened.
    for to in [slow, wider] {
        let g = limiter(&server, Gcra::from_quota(fast).unwrap());
        assert!(g.try_check_at("g", now, 10).await.unwrap().is_allowed());
        let g = limiter(&server, Gcra::from_quota(to).unwrap());
        assert!(
            !g.try_check_at("g", now, 1).await.unwrap().is_allowed(),
            "{to:?}"
        );
        let f = limiter(&server, FixedWindow::from_quota(fast).unwrap());
        assert!(f.try_check_at("f", now, 10).await.unwrap().is_allowed());
        let f = limiter(&server, FixedWindow::from_quota(slow).unwrap());
        assert!(!f.try_check_at("f", now, 1).await.unwrap().is_allowed());
        let s = limiter(&server, SlidingWindow::from_quota(fast).unwrap());
        assert!(s.try_check_at("s", now, 10).await.unwrap().is_allowed());
        let s = limiter(&server, SlidingWindow::from_quota(slow).unwrap());
        assert!(!s.try_check_at("s", now, 1).await.unwrap().is_allowed());
        let mut conn = raw(&server).await;
        let _: () = conn.del(&["t:g", "t:f", "t:s"]).await.unwrap();
    }

    // The denial stored the carried state: 1 s later the key has refilled under 10/min (nothing),
    // not under the 10/s it left (10 units).
    let g = limiter(&server, Gcra::from_quota(fast).unwrap());
    assert!(g.try_check_at("g2", now, 10).await.unwrap().is_allowed());
    let g = limiter(&server, Gcra::from_quota(slow).unwrap());
    assert!(!g.try_check_at("g2", now, 1).await.unwrap().is_allowed());
    let second = now + 1_000_000_000;
    assert!(!g.try_check_at("g2", second, 1).await.unwrap().is_allowed());
    assert!(
        g.try_check_at("g2", now + 6_000_000_000, 1)
            .await
            .unwrap()
            .is_allowed()
    );

    // A refund under the new quota carries over first, then gives back in the new quota's units.
    let g = limiter(&server, Gcra::from_quota(fast).unwrap());
    assert!(g.try_check_at("g3", now, 10).await.unwrap().is_allowed());
    let g = limiter(&server, Gcra::from_quota(slow).unwrap());
    g.try_refund_at("g3", now, 1).await.unwrap();
    assert_eq!(g.try_peek_at("g3", now, 1).await.unwrap().remaining(), 0);
    assert!(g.try_check_at("g3", now, 1).await.unwrap().is_allowed());
    assert!(!g.try_check_at("g3", now, 1).await.unwrap().is_allowed());

    // The lease script: a new leased limiter under 10/min gets nothing.
    let cfg = config();
    let g = limiter(&server, Gcra::from_quota(fast).unwrap());
    assert!(g.try_check_at("l", now, 10).await.unwrap().is_allowed());
    let lease = LeaseConfig {
        size: 5,
        ttl: Duration::from_secs(1),
        min_grant: 1,
        max_keys: 16,
        renew_below: 0,
    };
    let leased =
        LeasedLimiter::new(connect(&server.url(), &cfg).unwrap(), slow, cfg, lease).unwrap();
    assert!(!leased.try_check_at("l", now, 1).await.unwrap().is_allowed());
    let leased2 = LeasedLimiter::new(
        connect(&server.url(), &config()).unwrap(),
        slow,
        config(),
        lease,
    )
    .unwrap();
    assert!(
        !leased2
            .try_check_at("l", second, 1)
            .await
            .unwrap()
            .is_allowed()
    );
}

/// In a batch, a key's carry-over is stored even when another key denies the request, and nothing
/// else is written; a peek converts without writing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_stores_carry_overs_and_no_admission_when_denied() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let now: Nanos = EPOCH_US * 1000;
    let fast = Quota::per_second(10).unwrap();
    let slow = Quota::per_minute(10).unwrap();
    let cfg = config();
    let batch = RedisBatch::new(connect(&server.url(), &cfg).unwrap(), cfg);
    let old = BatchLimit::for_quota::<Gcra>(fast).unwrap();
    let new = BatchLimit::for_quota::<Gcra>(slow).unwrap();
    let other = BatchLimit::for_quota::<FixedWindow>(fast).unwrap();
    let d = batch
        .try_check_at(&[BatchKey::enforcing("a", &old)], now, 10)
        .await
        .unwrap();
    assert!(d[0].is_allowed());
    let before: String = conn.get("t:a").await.unwrap();
    // A peek under the new quota sees the carried state and writes nothing.
    let d = batch
        .try_peek_at(&[BatchKey::enforcing("a", &new)], now, 1)
        .await
        .unwrap();
    assert!(!d[0].is_allowed());
    assert_eq!(conn.get::<_, String>("t:a").await.unwrap(), before);
    // Denied by "a": "b" is not written, "a" holds its carried state under the new quota.
    let keys = [
        BatchKey::enforcing("b", &other),
        BatchKey::enforcing("a", &new),
    ];
    let d = batch.try_check_at(&keys, now, 1).await.unwrap();
    assert!(d[0].is_allowed() && !d[1].is_allowed());
    assert!(!conn.exists::<_, bool>("t:b").await.unwrap());
    let after: String = conn.get("t:a").await.unwrap();
    assert_ne!(after, before);
    let model = Gcra::from_quota(slow).unwrap();
    let spent = Gcra::from_quota(fast)
        .unwrap()
        .decide(0, now, 10)
        .unwrap()
        .next
        .unwrap();
    let carried = Gcra::from_quota(fast)
        .unwrap()
        .carry_over(spent, now, &model);
    assert_eq!(model.decode(&[Some(after)]).unwrap(), carried);
}
