//! Integration tests against a real `redis-server` that each test starts on its own loopback port.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{RedisServer, round_up_us};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::aio::MultiplexedConnection;
use tokio::task::JoinHandle;
use tollgate_core::algorithm::Algorithm;
use tollgate_core::{
    CheckError, Decision, FixedWindow, Gcra, LeakyBucket, ManualClock, Nanos, Quota, SlidingWindow,
};
use tollgate_redis::{
    ConnectionManager, Error, FaultPolicy, KeyType, LeaseConfig, LeasedLimiter, RedisConfig,
    RedisEncoding, RedisLimiter, TimeSource, connect,
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

fn manager(server: &RedisServer, config: &RedisConfig) -> ConnectionManager {
    connect(&server.url(), config).unwrap()
}

/// Leases of `size` units spendable for `ttl`, 16 keys, minimum grant 1.
fn lease(size: u64, ttl: Duration) -> LeaseConfig {
    LeaseConfig {
        size,
        ttl,
        max_keys: 16,
        renew_below: 0,
        min_grant: 1,
    }
}

/// A leased limiter on its own connection with the tests' [`config`].
fn leased_limiter(server: &RedisServer, quota: Quota, lease: LeaseConfig) -> LeasedLimiter {
    let cfg = config();
    LeasedLimiter::new(manager(server, &cfg), quota, cfg, lease).unwrap()
}

/// Calls `check` `n` times in sequence and counts the admissions (every call must answer).
async fn admitted<F, Fut>(n: usize, mut check: F) -> u64
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Decision, Error>>,
{
    let mut admitted = 0;
    for _ in 0..n {
        if check().await.unwrap().is_allowed() {
            admitted += 1;
        }
    }
    admitted
}

/// Runs `check` `n` times, asserting that each is answered within `within` (where the server holds
/// every command: from local state) and admitted.
async fn admitted_locally<F, Fut>(n: usize, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Decision, Error>>,
{
    for _ in 0..n {
        let d = tokio::time::timeout(within, check())
            .await
            .expect("answered locally");
        assert!(d.unwrap().is_allowed());
    }
}

/// Waits for every task and sums what they admitted.
async fn total(tasks: Vec<JoinHandle<u64>>) -> u64 {
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    admitted
}

/// The Redis commands that store core `word` as `A` encodes it, with no TTL (0: no key).
fn seed<A: RedisEncoding>(model: &A, key: &str, word: u64) -> redis::Pipeline {
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
    p
}

/// The key's stored values (one per field, `None`: absent) and its PTTL.
async fn stored<A: RedisEncoding>(
    conn: &mut MultiplexedConnection,
    key: &str,
) -> (Vec<Option<String>>, i64) {
    let mut read = redis::pipe();
    read.atomic();
    match A::KEY_TYPE {
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
    }
}

/// Runs `steps` random requests through the script (client time, whole µs) and the core's `decide`,
/// seeding the key with the core's state (encoded by [`RedisEncoding`]) before each step, and checks:
/// the decision (exactly; the sliding window's durations rounded up to µs), the state written back
/// (decoded), and its TTL (present, and exactly when the state turns fresh).
async fn trace<M: RedisEncoding>(
    server: &RedisServer,
    model: M,
    rng: &mut StdRng,
    steps: usize,
    key: &str,
) {
    let mut conn = raw(server).await;
    let limiter =
        RedisLimiter::from_algorithm(manager(server, &config()), model.clone(), config()).unwrap();
    let full = format!("t:{key}");
    let capacity = model.capacity();
    let scale = (model
        .quota()
        .period_nanos()
        .max(model.quota().emission_interval_nanos())
        / 1000)
        .max(2);
    let mut state = 0u64;
    let (mut allowed, mut denied) = (0, 0);
    let mut now_us = EPOCH_US + rng.random_range(0..scale * 3);
    for step in 0..steps {
        // Mostly forward in small steps, sometimes frozen, sometimes far, rarely backwards.
        now_us = match rng.random_range(0..100) {
            0..20 => now_us,
            20..75 => now_us + rng.random_range(0..=scale / 4 + 1),
            75..90 => now_us + rng.random_range(0..=scale * 2),
            90..95 => now_us + rng.random_range(0..=scale * 5),
            _ => now_us.saturating_sub(rng.random_range(0..=scale / 2 + 1)),
        };
        let cost = match rng.random_range(0..100) {
            0..60 => 1,
            60..85 => rng.random_range(1..=capacity),
            85..92 => 0,
            _ => capacity,
        };
        let peek = rng.random_bool(0.15);
        let now = now_us * 1000;

        let _: () = seed(&model, &full, state)
            .query_async(&mut conn)
            .await
            .unwrap();
        let got = if peek {
            limiter.try_peek_at(key, now, cost).await
        } else {
            limiter.try_check_at(key, now, cost).await
        }
        .unwrap();
        let t = model.decide(state, now, cost).unwrap();
        let ctx = format!("step {step}: now_us {now_us} cost {cost} peek {peek} state {state:#x}");
        let want = if M::NAME == SlidingWindow::NAME {
            round_up_us(t.decision)
        } else {
            t.decision
        };
        assert_eq!(got, want, "{ctx}");
        if got.is_allowed() {
            allowed += 1;
        } else {
            denied += 1;
        }

        let (values, pttl) = stored::<M>(&mut conn, &full).await;
        let stored = (pttl != -2).then(|| model.decode(&values).unwrap());
        match t.next.filter(|_| !peek) {
            None => {
                // No write: the seeded state is untouched (and has no TTL).
                assert_eq!(
                    stored.unwrap_or(0),
                    state,
                    "{ctx}: a non-write changed the key"
                );
                if state != 0 {
                    assert_eq!(pttl, -1, "{ctx}: a non-write set a TTL");
                }
            }
            Some(next) => {
                let ttl = model.ttl(next, now);
                let want_ms = ttl.div_ceil(1_000_000).max(1) as i64;
                // The TTL ends exactly where the state turns fresh (to the ns)...
                assert!(model.is_fresh(next, now + ttl), "{ctx}");
                assert!(!model.is_fresh(next, now + ttl - 1), "{ctx}");
                match stored {
                    // ... a key that short-lived may already be gone in real time.
                    None => assert!(want_ms <= 100, "{ctx}: key vanished, TTL {want_ms} ms"),
                    Some(word) => {
                        assert_eq!(word, next, "{ctx}: stored state");
                        assert!(
                            pttl <= want_ms && pttl > want_ms - 1000,
                            "{ctx}: PTTL {pttl} ms, want {want_ms} ms"
                        );
                    }
                }
                state = next;
            }
        }
    }
    // The trace must have exercised both outcomes to mean anything.
    assert!(
        allowed > 10 && denied > 10,
        "{key}: {allowed} allowed, {denied} denied"
    );
}

/// A random GCRA quota: any period in ns, so the emission interval is mostly not whole µs (and
/// sometimes under 1 µs, or whole µs); `deep` gives a bucket too deep for exact ns units.
fn gcra_quota(rng: &mut StdRng, round: usize) -> Quota {
    let interval_ns: u64 = match round % 4 {
        0 => rng.random_range(1..=20_000),
        1 => rng.random_range(20_000..=5_000_000),
        2 => rng.random_range(5_000_000..=2_000_000_000),
        _ => rng.random_range(1..=2_000_000u64) * 1000, // whole µs
    };
    let limit = rng.random_range(1..=50u64);
    Quota::per(
        Duration::from_nanos(limit * interval_ns - rng.random_range(0..limit)),
        limit,
    )
    .unwrap()
    .with_burst(rng.random_range(1..=60))
    .unwrap()
}

/// [`trace`] over GCRA-timed algorithms on random quotas: the script follows the requested quota
/// itself (no rounding) whenever its depth is below 2^51 ns.
async fn tat_traces<M: RedisEncoding>(seed: u64, name: &str) {
    let server = RedisServer::start();
    let mut rng = StdRng::seed_from_u64(seed);
    for round in 0..16 {
        let quota = gcra_quota(&mut rng, round);
        assert_eq!(M::redis_quota(quota).unwrap(), quota, "{quota:?}");
        let model = M::from_quota(quota).unwrap();
        trace(&server, model, &mut rng, 300, &format!("{name}{round}")).await;
    }
    // A bucket deeper than 2^51 ns with an interval that is not whole µs: the interval is rounded up
    // to whole µs (the stated bound: < 1 µs per interval, never faster), then followed exactly.
    for round in 0..2 {
        // Odd and not a multiple of 5: the exact unit would be 1 ns.
        let mut interval_ns = rng.random_range(500_000..=500_499u64) * 2 + 1;
        if interval_ns % 5 == 0 {
            interval_ns += 2;
        }
        let burst = (1u64 << 51) / interval_ns + rng.random_range(1..1000);
        let quota = Quota::per(Duration::from_nanos(interval_ns * 10), 10)
            .unwrap()
            .with_burst(burst)
            .unwrap();
        let run = M::redis_quota(quota).unwrap();
        let (asked, got) = (
            quota.emission_interval_nanos(),
            run.emission_interval_nanos(),
        );
        assert!(
            got % 1000 == 0 && got >= asked && got - asked < 1000,
            "{asked} -> {got}"
        );
        assert_eq!((run.limit(), run.burst()), (quota.limit(), quota.burst()));
        let model = M::from_quota(run).unwrap();
        trace(
            &server,
            model,
            &mut rng,
            300,
            &format!("{name}-deep{round}"),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_script_agrees_with_core_on_random_traces() {
    tat_traces::<Gcra>(6, "gcra").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaky_bucket_script_agrees_with_core_on_random_traces() {
    tat_traces::<LeakyBucket>(10, "lb").await;
}

/// A random window quota; every other round its period is not whole µs.
fn window_quota(rng: &mut StdRng, round: usize) -> Quota {
    let window_us: u64 = match round % 3 {
        0 => rng.random_range(1_000..=20_000),
        1 => rng.random_range(20_000..=2_000_000),
        _ => rng.random_range(2_000_000..=120_000_000),
    };
    let window_ns = if round % 2 == 0 {
        window_us * 1000
    } else {
        window_us * 1000 - rng.random_range(1..1000)
    };
    // limit <= window in µs, so the sliding window's µs waits are the core's rounded up.
    let limit = rng.random_range(1..=200u64.min(window_us));
    Quota::per(Duration::from_nanos(window_ns), limit).unwrap()
}

/// 12 rounds of [`trace`] for a window algorithm, each on a fresh [`window_quota`] and key
/// `{name}{round}`: a period that is not whole µs runs rounded up to the next µs (never looser),
/// then exactly.
async fn window_traces<M: RedisEncoding>(seed: u64, name: &str) {
    let server = RedisServer::start();
    let mut rng = StdRng::seed_from_u64(seed);
    for round in 0..12 {
        let quota = window_quota(&mut rng, round);
        let run = M::redis_quota(quota).unwrap();
        let (asked, got) = (quota.period_nanos(), run.period_nanos());
        assert!(
            got % 1000 == 0 && got >= asked && got - asked < 1000,
            "{asked} -> {got}"
        );
        assert_eq!(run.limit(), quota.limit());
        let model = M::from_quota(run).unwrap();
        trace(&server, model, &mut rng, 300, &format!("{name}{round}")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_script_agrees_with_core_on_random_traces() {
    window_traces::<FixedWindow>(7, "fw").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_script_agrees_with_core_on_random_traces() {
    window_traces::<SlidingWindow>(8, "sw").await;
}

/// A lease of `g` units is exactly a GCRA admission of cost `g`, for the largest `g <= k` that fits.
/// Each lease call is one `FCALL` of the function library (its first call also loads it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_grants_match_core_gcra() {
    let server = RedisServer::start();
    let calls = lease_traces(&server).await;
    assert_eq!(command_calls(&server, "evalsha"), 0);
    // Each call's FCALL, and the first one's answered "Function not found" before the load.
    assert_eq!(command_calls(&server, "fcall"), calls + 1);
    assert_eq!(command_calls(&server, "function|load"), 1);
}

/// As above, by the script (`EVALSHA`): a server without `FCALL`, as Redis before 7.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_the_script_lease_grants_match_core_gcra() {
    let server = RedisServer::start_with(&["--rename-command", "FCALL", ""]);
    let calls = lease_traces(&server).await;
    // Each call's EVALSHA, and the first one's answered NOSCRIPT before the load.
    assert_eq!(command_calls(&server, "evalsha"), calls + 1);
    assert_eq!(command_calls(&server, "fcall"), 0);
}

/// The lease calls in flight when the server lacks the function library (a fresh or restarted
/// server) load it once, not once each: the others wait for that load and call again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_lease_calls_load_the_library_once() {
    let server = RedisServer::start();
    let limiter = Arc::new(leased_limiter(
        &server,
        Quota::per_second(1000).unwrap(),
        LeaseConfig {
            max_keys: 64,
            ..LeaseConfig::default()
        },
    ));
    let tasks: Vec<JoinHandle<bool>> = (0..32)
        .map(|i| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                limiter
                    .try_check(&format!("first{i}"), 1)
                    .await
                    .unwrap()
                    .is_allowed()
            })
        })
        .collect();
    for task in tasks {
        assert!(task.await.unwrap());
    }
    assert_eq!(limiter.stats().redis_calls, 32);
    assert_eq!(command_calls(&server, "function|load"), 1);
}

/// [`lease_trace`] on two quotas; the lease calls made.
async fn lease_traces(server: &RedisServer) -> u64 {
    let mut rng = StdRng::seed_from_u64(9);
    // A whole-µs interval, and one of 1 000 001 ns (followed in ns, unrounded).
    let odd = Quota::per(Duration::from_nanos(1_000_000_007), 1000).unwrap();
    let mut calls = 0;
    for quota in [Quota::per_second(1000).unwrap(), odd] {
        let quota = quota.with_burst(50).unwrap();
        calls += lease_trace(server, &mut rng, quota).await;
    }
    calls
}

/// How many times the server ran `command` ([`common::command_calls`]).
fn command_calls(server: &RedisServer, command: &str) -> u64 {
    common::command_calls(server.port, command)
}

/// The lease calls made.
async fn lease_trace(server: &RedisServer, rng: &mut StdRng, quota: Quota) -> u64 {
    let gcra = Gcra::from_quota(quota).unwrap();
    // A 1 ns lease TTL: every call goes to Redis.
    let limiter = leased_limiter(server, quota, lease(7, Duration::from_nanos(1)));
    assert_eq!(limiter.quota(), &quota);
    let key = format!("lease{}", quota.emission_interval_nanos());
    let mut tat = 0u64;
    let mut now_us = EPOCH_US;
    let mut leased = 0;
    for step in 0..400 {
        now_us += rng.random_range(0..=3_000);
        let now = now_us * 1000;
        let d = limiter.try_check_at(&key, now, 1).await.unwrap();
        let after = limiter.stats_at(now).leased;
        let granted = after - leased;
        leased = after;
        // The core: the largest g in 1..=7 that GCRA admits, or a denial of cost 1.
        let want = (1..=7u64).rev().find_map(|g| {
            let t = gcra.decide(tat, now, g).unwrap();
            t.decision.is_allowed().then_some((g, t))
        });
        match want {
            Some((g, t)) => {
                assert_eq!(granted, g, "step {step}");
                assert!(d.is_allowed(), "step {step}");
                // It reports the shared bucket (not this lease): what a per-request check of
                // cost 1 would leave, and the reset of that estimate.
                let one = gcra.decide(tat, now, 1).unwrap().decision;
                assert_eq!(d.remaining(), one.remaining(), "step {step}");
                let interval = quota.emission_interval_nanos();
                assert_eq!(
                    d.reset_after(),
                    Duration::from_nanos((quota.burst() - one.remaining()) * interval),
                    "step {step}"
                );
                tat = t.next.unwrap();
            }
            None => {
                let t = gcra.decide(tat, now, 1).unwrap();
                assert_eq!(granted, 0, "step {step}");
                assert_eq!(d, t.decision, "step {step}");
                now_us += d.retry_after().unwrap().as_micros() as u64; // skip the cached denial
            }
        }
    }
    limiter.stats().redis_calls
}

/// 4 instances (own connections) of 8 tasks, 20 requests each, on one key at one frozen instant.
async fn shared_admissions<A: RedisEncoding>(server: &RedisServer, quota: Quota) -> u64 {
    let now = (EPOCH_US + 12_345) * 1000;
    let mut tasks = Vec::new();
    for _instance in 0..4 {
        let cfg = config();
        let limiter =
            Arc::new(RedisLimiter::<A, _>::new(manager(server, &cfg), quota, cfg).unwrap());
        for _task in 0..8 {
            let limiter = Arc::clone(&limiter);
            tasks.push(tokio::spawn(async move {
                let key = format!("shared-{}", A::NAME);
                admitted(20, || limiter.try_check_at(&key, now, 1)).await
            }));
        }
    }
    total(tasks).await
}

/// Many instances (own connections) and tasks on one key at one frozen instant: exactly the quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_sharing_redis_never_exceed_the_quota() {
    let server = RedisServer::start();
    let quota = Quota::per_minute(100).unwrap();
    // 640 requests for 100 units: all 100 go, none more.
    assert_eq!(shared_admissions::<Gcra>(&server, quota).await, 100, "gcra");
    assert_eq!(
        shared_admissions::<FixedWindow>(&server, quota).await,
        100,
        "fixed"
    );
    assert_eq!(
        shared_admissions::<SlidingWindow>(&server, quota).await,
        100,
        "sliding"
    );

    // Leased instances: every unit admitted came from the bucket, none stranded at a frozen instant.
    let now = (EPOCH_US + 99) * 1000;
    let gcra = Quota::per_minute(100).unwrap();
    let mut tasks = Vec::new();
    let mut instances = Vec::new();
    for _ in 0..4 {
        let limiter = Arc::new(leased_limiter(
            &server,
            gcra,
            lease(10, Duration::from_secs(1)),
        ));
        instances.push(Arc::clone(&limiter));
        for _ in 0..8 {
            let limiter = Arc::clone(&limiter);
            tasks.push(tokio::spawn(async move {
                admitted(20, || limiter.try_check_at("leased", now, 1)).await
            }));
        }
    }
    let admitted = total(tasks).await;
    assert_eq!(admitted, 100);
    let leased: u64 = instances.iter().map(|l| l.stats_at(now).leased).sum();
    assert_eq!(leased, 100);
}

/// Real server time, several instances hammering one GCRA key: admitted <= burst + rate × elapsed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_on_server_time_stay_within_the_gcra_bound() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let quota = Quota::per_second(2000).unwrap().with_burst(20).unwrap();
    let server_us = |t: (u64, u64)| t.0 * 1_000_000 + t.1;
    let start: (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let cfg = config().with_time(TimeSource::Server);
        let limiter = Arc::new(RedisLimiter::gcra(manager(&server, &cfg), quota, cfg).unwrap());
        for _ in 0..4 {
            let limiter = Arc::clone(&limiter);
            tasks.push(tokio::spawn(async move {
                admitted(400, || limiter.try_check("rt", 1)).await
            }));
        }
    }
    let admitted = total(tasks).await;
    let end: (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let elapsed_us = server_us(end) - server_us(start);
    let bound = 20 + elapsed_us / 500 + 1;
    assert!(
        admitted <= bound,
        "admitted {admitted} > bound {bound} over {elapsed_us} µs"
    );
    assert!(admitted >= 20, "the burst alone admits 20, got {admitted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_reload_after_script_flush() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let cfg = config();
    let quota = Quota::per_second(10).unwrap();
    let gcra = RedisLimiter::gcra(manager(&server, &cfg), quota, cfg).unwrap();
    let lease = leased_limiter(&server, quota, LeaseConfig::default());
    assert!(gcra.try_check("k", 1).await.unwrap().is_allowed());
    assert!(lease.try_check("l", 1).await.unwrap().is_allowed());
    assert_eq!(
        noscript_errors(&mut conn).await,
        1,
        "the first GCRA call loads its script (a lease goes by the function library)"
    );
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    // EVALSHA now fails with NOSCRIPT; the limiter reloads and answers.
    assert_eq!(gcra.try_check("k", 1).await.unwrap().remaining(), 8);
    assert!(lease.try_check("l2", 1).await.unwrap().is_allowed());
    assert_eq!(
        noscript_errors(&mut conn).await,
        2,
        "NOSCRIPT was seen and handled"
    );
    // And later calls go by SHA again without errors.
    assert_eq!(gcra.try_check("k", 1).await.unwrap().remaining(), 7);
    assert_eq!(noscript_errors(&mut conn).await, 2);
    // The function library gone, a lease call loads it again (once) and answers.
    let loads = command_calls(&server, "function|load");
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(lease.try_check("l3", 1).await.unwrap().is_allowed());
    assert!(lease.try_check("l4", 1).await.unwrap().is_allowed());
    assert_eq!(command_calls(&server, "function|load"), loads + 1);
    // The GCRA limiter's alone: three calls, the two that met NOSCRIPT sent again after the load.
    assert_eq!(command_calls(&server, "evalsha"), 5);
}

/// How many NOSCRIPT errors the server has replied (`INFO errorstats`, Redis >= 6.2).
async fn noscript_errors(conn: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("errorstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("errorstat_NOSCRIPT:count="))
        .map_or(0, |n| n.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_applies_the_policy_then_recovers() {
    let mut server = RedisServer::start();
    let quota = Quota::per_second(1000).unwrap();
    let base = RedisConfig::default().with_timeout(Duration::from_millis(200));
    let closed_cfg = base.clone().with_policy(FaultPolicy::FailClosed {
        retry_after: Duration::from_millis(250),
    });
    let open_cfg = base.with_policy(FaultPolicy::FailOpen);
    let closed = RedisLimiter::gcra(manager(&server, &closed_cfg), quota, closed_cfg).unwrap();
    let open =
        RedisLimiter::fixed_window(manager(&server, &open_cfg), quota, open_cfg.clone()).unwrap();
    let leased = LeasedLimiter::new(
        manager(&server, &open_cfg),
        quota,
        open_cfg,
        lease(5, Duration::from_secs(60)),
    )
    .unwrap();
    assert!(closed.try_check("a", 1).await.unwrap().is_allowed());
    assert!(open.try_check("b", 1).await.unwrap().is_allowed());
    assert!(leased.try_check("c", 1).await.unwrap().is_allowed());

    server.kill();
    let err = closed.try_check("a", 1).await.unwrap_err();
    assert!(err.is_backend(), "{err}");
    assert!(
        matches!(err, Error::Redis(_) | Error::Timeout(_)),
        "{err:?}"
    );
    assert_eq!(
        closed.check("a", 1).await.unwrap(),
        Decision::denied(250_000_000, 250_000_000)
    );
    assert!(open.check("b", 1).await.unwrap().is_allowed());
    // A bad cost is still an error, not the policy.
    assert!(matches!(
        closed.check("a", 5000).await,
        Err(CheckError::CostExceedsCapacity { .. })
    ));
    // The live lease keeps serving locally (4 units left), then the policy (open) answers.
    for _ in 0..4 {
        assert!(leased.try_check("c", 1).await.unwrap().is_allowed());
    }
    assert!(leased.try_check("c", 1).await.is_err());
    assert!(leased.check("c", 1).await.unwrap().is_allowed());

    server.restart();
    // The connection manager reconnects in the background; poll (bounded) until it answers.
    let mut recovered = false;
    for _ in 0..100 {
        let a = closed.try_peek("a", 1).await.is_ok();
        let b = open.try_peek("b", 1).await.is_ok();
        let c = leased.try_check("probe", 1).await.is_ok();
        if a && b && c {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        recovered,
        "the limiter did not recover after Redis came back"
    );
    // A fresh server: state and scripts are gone; NOSCRIPT is handled, decisions are real again.
    assert_eq!(closed.try_check("a", 1).await.unwrap().remaining(), 999);
    assert_eq!(open.try_check("b", 1).await.unwrap().remaining(), 999);
    assert!(leased.try_check("c", 1).await.unwrap().is_allowed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttls_and_prefix_and_no_writes_on_denial_or_peek() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let cfg = config().with_prefix("app:{t1}:");
    let now = EPOCH_US * 1000 + 250_000_000; // 0.25 s into a second
    let quota = Quota::per_second(2).unwrap();
    let gcra = RedisLimiter::gcra(manager(&server, &cfg), quota, cfg.clone()).unwrap();
    let fw = RedisLimiter::fixed_window(manager(&server, &cfg), quota, cfg.clone()).unwrap();
    let sw = RedisLimiter::sliding_window(manager(&server, &cfg), quota, cfg).unwrap();

    // Peeks and zero costs create nothing.
    assert!(gcra.try_peek_at("g", now, 1).await.unwrap().is_allowed());
    assert!(fw.try_check_at("f", now, 0).await.unwrap().is_allowed());
    let exists: u64 = redis::cmd("EXISTS")
        .arg("app:{t1}:g")
        .arg("app:{t1}:f")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, 0);

    assert!(gcra.try_check_at("g", now, 2).await.unwrap().is_allowed());
    assert!(fw.try_check_at("f", now, 2).await.unwrap().is_allowed());
    assert!(sw.try_check_at("s", now, 2).await.unwrap().is_allowed());
    let pttl_conn = conn.clone();
    let pttl = |k: &'static str| {
        let mut c = pttl_conn.clone();
        async move {
            redis::cmd("PTTL")
                .arg(k)
                .query_async::<i64>(&mut c)
                .await
                .unwrap()
        }
    };
    // GCRA: TAT = now + 2 × 500 ms → 1000 ms. Fixed: window ends in 750 ms. Sliding: 1750 ms.
    let (g, f, s) = (
        pttl("app:{t1}:g").await,
        pttl("app:{t1}:f").await,
        pttl("app:{t1}:s").await,
    );
    assert!((900..=1000).contains(&g), "gcra PTTL {g}");
    assert!((650..=750).contains(&f), "fixed PTTL {f}");
    assert!((1650..=1750).contains(&s), "sliding PTTL {s}");
    // Denials do not touch the key or its TTL.
    let before: String = redis::cmd("GET")
        .arg("app:{t1}:g")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!gcra.try_check_at("g", now, 1).await.unwrap().is_allowed());
    let after: String = redis::cmd("GET")
        .arg("app:{t1}:g")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(before, after);
    assert!(pttl("app:{t1}:g").await <= g);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_mode_serves_locally_and_caches_denials() {
    let server = RedisServer::start();
    let cfg = config();
    let clock = ManualClock::new();
    let quota = Quota::per_second(10).unwrap();
    let leased = LeasedLimiter::with_clock(
        manager(&server, &cfg),
        quota,
        cfg,
        lease(4, Duration::from_secs(10)),
        clock.clone(),
    )
    .unwrap();
    let now: Nanos = EPOCH_US * 1000;
    assert_eq!(admitted(30, || leased.try_check_at("k", now, 1)).await, 10);
    let s = leased.stats_at(now);
    assert_eq!((s.leased, s.admitted), (10, 10));
    // 3 full leases of 4, minus... : calls = ceil(10 / 4) grants + 1 refused; the other 19 denials
    // came from the cache.
    assert_eq!(s.redis_calls, 4);
    assert_eq!(s.cached_denials, 19);
    // Cost above the burst is an error, not a denial.
    assert!(matches!(
        leased.try_check_at("k", now, 11).await,
        Err(Error::Cost(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_grant_waits_for_a_worthwhile_lease_without_losing_capacity() {
    let server = RedisServer::start();
    let quota = Quota::per_second(10).unwrap(); // burst 10, one unit per 100 ms
    let leased = leased_limiter(
        &server,
        quota,
        LeaseConfig {
            min_grant: 4,
            ..lease(4, Duration::from_secs(10))
        },
    );
    let now: Nanos = EPOCH_US * 1000;
    // Two leases of 4; the last 2 units stay in the bucket until 4 are there: 200 ms later.
    assert_eq!(admitted(10, || leased.try_check_at("k", now, 1)).await, 8);
    let d = leased.try_check_at("k", now, 1).await.unwrap();
    assert_eq!(d.retry_after(), Some(Duration::from_millis(200)));
    let later = now + 200_000_000;
    assert!(
        leased
            .try_check_at("k", later, 1)
            .await
            .unwrap()
            .is_allowed()
    );
    let s = leased.stats_at(later);
    assert_eq!((s.leased, s.admitted, s.held), (12, 9, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_leftovers_carry_into_the_next_lease_for_larger_costs() {
    let server = RedisServer::start();
    let quota = Quota::per_second(10).unwrap(); // burst 10
    let leased = leased_limiter(&server, quota, lease(4, Duration::from_secs(10)));
    let now: Nanos = EPOCH_US * 1000;
    let check = |cost| leased.try_check_at("k", now, cost);
    // `remaining` is the shared quota's: the bucket's units plus this lease's.
    assert_eq!(check(1).await.unwrap().remaining(), 9); // lease 4: 6 in the bucket + 3 held
    assert_eq!(check(5).await.unwrap().remaining(), 4); // 3 left + lease 4 − 5: 2 + 2
    assert_eq!(check(3).await.unwrap().remaining(), 1); // 2 left + lease 2 (all the bucket had) − 3
    assert!(!check(2).await.unwrap().is_allowed()); // 1 left, bucket empty: denied ...
    assert!(check(1).await.is_ok()); // ... a cached denial now, the leftover unit kept
    let s = leased.stats_at(now);
    assert_eq!((s.leased, s.admitted, s.held), (10, 9, 1));
    // Cost 0 is answered locally.
    assert!(check(0).await.unwrap().is_allowed());
}

/// Leases of 10 units for `ttl`, the next taken ahead once the live one holds fewer than 5; room
/// for 1 000 keys (16 would leave one per table shard: a second key could find its shard full and
/// be decided untracked).
fn lease_ahead(ttl: Duration) -> LeaseConfig {
    LeaseConfig {
        renew_below: 5,
        max_keys: 1_000,
        ..lease(10, ttl)
    }
}

/// A leased limiter of 1000/s with [`lease_ahead`]'s leases.
fn leased_ahead(server: &RedisServer, ttl: Duration) -> LeasedLimiter {
    leased_limiter(server, Quota::per_second(1000).unwrap(), lease_ahead(ttl))
}

/// With `renew_below`, the admission that leaves the live lease below it takes the next lease, and
/// the requests after it spend the live lease, then the next, without a lease call: here while the
/// server holds every command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_taken_ahead_keeps_a_busy_key_from_waiting_on_a_lease_call() {
    let server = RedisServer::start();
    let leased = leased_ahead(&server, Duration::from_secs(10));
    let now: Nanos = EPOCH_US * 1000;
    // A lease of 10 (1 call); the 6th admission leaves 4 and takes the next 10 (a 2nd call).
    assert_eq!(admitted(6, || leased.try_check_at("k", now, 1)).await, 6);
    let s = leased.stats_at(now);
    assert_eq!((s.redis_calls, s.leased, s.held), (2, 20, 14));
    // 4 from the live lease, 5 from the next (which then holds 5: no call yet), all answered while
    // the server answers nothing.
    server.pause_clients(1_000);
    admitted_locally(9, Duration::from_millis(500), || {
        leased.try_check_at("k", now, 1)
    })
    .await;
    let s = leased.stats_at(now);
    assert_eq!((s.redis_calls, s.admitted, s.held), (2, 15, 5));
    // An admission's `remaining` counts both leases' units (the shared quota's estimate).
    assert_eq!(s.leased - s.admitted, s.held);
}

/// A lease taken ahead lives one lifetime from its grant, as any: spent once the live lease is
/// too few or expired (the live one's units too few for the request travelling into it), and
/// stranded when it expires unspent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_taken_ahead_lives_one_lifetime_from_its_grant() {
    let server = RedisServer::start();
    let leased = leased_ahead(&server, Duration::from_millis(100));
    let t0: Nanos = EPOCH_US * 1000;
    let ms = 1_000_000;
    // Key "a": 5 admissions at t0 and the 6th at t0 + 50 ms, which takes the next lease, live
    // until t0 + 150 ms; the first expires at t0 + 100 ms holding 4.
    assert_eq!(admitted(5, || leased.try_check_at("a", t0, 1)).await, 5);
    assert_eq!(
        admitted(1, || leased.try_check_at("a", t0 + 50 * ms, 1)).await,
        1
    );
    // At t0 + 120 ms the next lease serves (the first's 4 stranded), no call.
    assert_eq!(
        admitted(1, || leased.try_check_at("a", t0 + 120 * ms, 1)).await,
        1
    );
    let s = leased.stats_at(t0 + 120 * ms);
    assert_eq!((s.redis_calls, s.stranded, s.held), (2, 4, 9));
    // At t0 + 150 ms it has expired too: its 9 stranded, a new lease taken.
    assert_eq!(
        admitted(1, || leased.try_check_at("a", t0 + 150 * ms, 1)).await,
        1
    );
    let s = leased.stats_at(t0 + 150 * ms);
    assert_eq!((s.redis_calls, s.stranded, s.held), (3, 13, 9));

    // Key "b": a request of cost 3 finds 2 units in the live lease: they travel into the next
    // (2 + 10 - 3 = 9 left), no call.
    assert_eq!(admitted(8, || leased.try_check_at("b", t0, 1)).await, 8);
    let before = leased.stats_at(t0).redis_calls;
    assert!(leased.try_check_at("b", t0, 3).await.unwrap().is_allowed());
    let s = leased.stats_at(t0);
    assert_eq!(s.redis_calls, before);
    // Every admitted unit was granted: admitted + held + stranded = leased.
    assert_eq!(s.admitted + s.held + s.stranded, s.leased);
}

/// A lease taken ahead and never spent is stranded when it expires, and counted so after the next
/// lease taken ahead replaces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_taken_ahead_and_never_spent_is_stranded() {
    let server = RedisServer::start();
    let leased = leased_ahead(&server, Duration::from_millis(100));
    let t0: Nanos = EPOCH_US * 1000;
    let t1 = t0 + 100_000_000;
    // 6 at t0: a lease of 10 and the next taken ahead, both live until t1.
    assert_eq!(admitted(6, || leased.try_check_at("k", t0, 1)).await, 6);
    // At t1 both have expired (4 + 10 stranded): a new lease, then 5 more take the next ahead.
    assert_eq!(admitted(6, || leased.try_check_at("k", t1, 1)).await, 6);
    let s = leased.stats_at(t1);
    assert_eq!(
        (s.redis_calls, s.leased, s.stranded, s.held),
        (4, 40, 14, 14)
    );
    assert_eq!(s.admitted + s.held + s.stranded, s.leased);
}

/// A lease call ahead that fails leaves the admission that made it admitted, and no next lease;
/// it is not made again for the same lease (the requests below the mark do not each wait on a
/// failing server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_lease_call_ahead_leaves_no_next_lease() {
    let server = RedisServer::start();
    let cfg = config().with_timeout(Duration::from_millis(100));
    let leased = LeasedLimiter::new(
        manager(&server, &cfg),
        Quota::per_second(1000).unwrap(),
        cfg,
        lease_ahead(Duration::from_secs(10)),
    )
    .unwrap();
    let now: Nanos = EPOCH_US * 1000;
    assert_eq!(admitted(5, || leased.try_check_at("k", now, 1)).await, 5);
    server.pause_clients(300);
    // The 6th admission's call ahead times out; the request is admitted all the same.
    assert!(leased.try_check_at("k", now, 1).await.unwrap().is_allowed());
    let s = leased.stats_at(now);
    assert_eq!((s.redis_calls, s.leased, s.held), (2, 10, 4));
    // The 4 left, locally, with no call ahead again, while the server still holds every command.
    admitted_locally(4, Duration::from_millis(50), || {
        leased.try_check_at("k", now, 1)
    })
    .await;
    let s = leased.stats_at(now);
    assert_eq!((s.redis_calls, s.admitted, s.held), (2, 10, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_call_cancelled_puts_its_leftover_back() {
    let server = RedisServer::start();
    let quota = Quota::per_second(10).unwrap(); // burst 10
    let leased = leased_limiter(&server, quota, lease(4, Duration::from_secs(10)));
    let now: Nanos = EPOCH_US * 1000;
    assert_eq!(admitted(3, || leased.try_check_at("k", now, 1)).await, 3); // 1 unit left
    server.pause_clients(1_000);
    // Cost 2: the unit left travels with the request into a lease call that stalls; the caller
    // gives up on it (a cancelled request, a dropped future).
    let cancelled =
        tokio::time::timeout(Duration::from_millis(50), leased.try_check_at("k", now, 2)).await;
    assert!(cancelled.is_err(), "{cancelled:?}");
    // The unit is back in the pool and the key free: a cost-1 request is answered locally, while
    // the server still holds every command.
    admitted_locally(1, Duration::from_millis(500), || {
        leased.try_check_at("k", now, 1)
    })
    .await;
    let s = leased.stats_at(now);
    assert_eq!((s.admitted, s.held, s.redis_calls), (4, 0, 2));
}

#[tokio::test(flavor = "current_thread")]
async fn tasks_waiting_on_a_lease_call_take_over_when_it_is_cancelled() {
    let server = RedisServer::start();
    let leased = Arc::new(leased_limiter(
        &server,
        Quota::per_second(10).unwrap(),
        lease(4, Duration::from_secs(10)),
    ));
    let now: Nanos = EPOCH_US * 1000;
    server.pause_clients(300);
    let check = |leased: &Arc<LeasedLimiter>| {
        let leased = Arc::clone(leased);
        tokio::spawn(async move { leased.try_check_at("k", now, 1).await })
    };
    // One runtime thread: after one yield, the first task is in its lease call (held by the
    // pause) and the second waits for it.
    let first = check(&leased);
    let second = check(&leased);
    tokio::task::yield_now().await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    // The second makes the call itself once the first is gone, and is answered after the pause.
    let got = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("the waiting task was not woken")
        .unwrap();
    assert!(got.unwrap().is_allowed());
    assert_eq!(leased.stats_at(now).redis_calls, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_server_times_out_then_answers_again() {
    let server = RedisServer::start();
    let cfg = config()
        .with_timeout(Duration::from_millis(100))
        .with_policy(FaultPolicy::FailClosed {
            retry_after: Duration::from_millis(100),
        });
    let limiter =
        RedisLimiter::gcra(manager(&server, &cfg), Quota::per_second(100).unwrap(), cfg).unwrap();
    assert!(limiter.try_check("k", 1).await.unwrap().is_allowed());
    // Stall every client's commands for 500 ms.
    let t0 = std::time::Instant::now();
    server.pause_clients(500);
    let got = limiter.try_check("k", 1).await;
    assert!(
        matches!(got, Err(Error::Timeout(d)) if d == Duration::from_millis(100)),
        "{got:?} after {:?}",
        t0.elapsed()
    );
    assert!(!limiter.check("k", 1).await.unwrap().is_allowed());
    let mut answered = false;
    for _ in 0..50 {
        if let Ok(d) = limiter.try_check("k", 1).await {
            answered = d.is_allowed();
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await; // bounded poll while it reconnects
    }
    assert!(
        answered,
        "no answer after the stall ended ({:?})",
        t0.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keys_are_pruned_from_the_local_table() {
    let server = RedisServer::start();
    let quota = Quota::per_second(10).unwrap();
    let leased = leased_limiter(
        &server,
        quota,
        LeaseConfig {
            max_keys: 32,
            ..lease(2, Duration::from_millis(1))
        },
    );
    let mut now: Nanos = EPOCH_US * 1000;
    for i in 0..300 {
        now += 2_000_000; // each earlier key's lease has lapsed
        assert!(
            leased
                .try_check_at(&format!("k{i}"), now, 1)
                .await
                .unwrap()
                .is_allowed()
        );
    }
    // 16 shards of at most 2 live entries each, plus the one being inserted.
    assert!(
        leased.tracked_keys() <= 48,
        "{} keys tracked",
        leased.tracked_keys()
    );
    // Live leases are never pruned: every tracked key still holds its live lease (the table's bound
    // is `lease_table_never_passes_max_keys`).
    let live = leased_limiter(&server, quota, lease(2, Duration::from_secs(60)));
    for i in 0..100 {
        assert!(live.try_check_at(&format!("live{i}"), now, 1).await.is_ok());
    }
    let s = live.stats_at(now);
    assert_eq!(s.held as usize, live.tracked_keys());
    assert_eq!(s.stranded, 0);
}

/// A flood of distinct keys with live leases: the local table stays within `max_keys`, and keys it
/// cannot hold are still decided exactly (by the shared bucket, one call each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_table_never_passes_max_keys() {
    let server = RedisServer::start();
    let quota = Quota::per_second(10).unwrap(); // burst 10 per key
    let leased = leased_limiter(&server, quota, lease(4, Duration::from_secs(60))); // max_keys 16
    let now: Nanos = EPOCH_US * 1000;
    for i in 0..200 {
        let key = format!("flood{i}");
        assert!(
            leased
                .try_check_at(&key, now, 1)
                .await
                .unwrap()
                .is_allowed()
        );
        assert!(
            leased.tracked_keys() <= 16,
            "{} keys tracked",
            leased.tracked_keys()
        );
    }
    // Whether its key is tracked or not, each key admits exactly its burst at one instant.
    for key in ["flood0", "flood150", "flood199"] {
        assert_eq!(
            admitted(20, || leased.try_check_at(key, now, 1)).await,
            9,
            "{key}"
        );
    }
    let s = leased.stats_at(now);
    assert!(s.admitted >= 200 + 27 && s.leased >= s.admitted, "{s:?}");
}

/// Stored values a limiter's script cannot have written, set under `key` by `set`.
async fn corrupt(conn: &mut MultiplexedConnection, key: &str, set: &[(&str, &str)]) {
    let mut p = redis::pipe();
    p.atomic().del(key).ignore();
    match set {
        [("", v)] => p.set(key, *v).ignore(),
        fields => p.hset_multiple(key, fields).ignore(),
    };
    let _: () = p.query_async(conn).await.unwrap();
}

/// The key's value and PTTL, to check that nothing was written.
async fn dump(conn: &mut MultiplexedConnection, key: &str) -> (Vec<u8>, i64) {
    let (v, pttl): (Option<Vec<u8>>, i64) = redis::pipe()
        .cmd("DUMP")
        .arg(key)
        .pttl(key)
        .query_async(conn)
        .await
        .unwrap();
    (v.unwrap(), pttl)
}

fn is_corrupt(got: &Result<Decision, Error>, key: &str) -> bool {
    matches!(got, Err(Error::CorruptState { key: k, .. }) if k == key)
}

/// Corrupt or foreign state under a limiter's key is an error, not a decision: the script writes
/// nothing, `try_check` returns `Error::CorruptState`, `check` answers by the fault policy and
/// counts it apart from outages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_state_is_an_error_not_a_decision() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let cfg = config().with_policy(FaultPolicy::FailClosed {
        retry_after: Duration::from_millis(250),
    });
    let quota = Quota::per_second(10).unwrap();
    let gcra = RedisLimiter::gcra(manager(&server, &cfg), quota, cfg.clone()).unwrap();
    let fw = RedisLimiter::fixed_window(manager(&server, &cfg), quota, cfg.clone()).unwrap();
    let sw = RedisLimiter::sliding_window(manager(&server, &cfg), quota, cfg.clone()).unwrap();
    let leased = LeasedLimiter::new(
        manager(&server, &cfg),
        quota,
        cfg,
        lease(4, Duration::from_nanos(1)),
    )
    .unwrap();
    let now: Nanos = EPOCH_US * 1000;
    let policy = Decision::denied(250_000_000, 250_000_000);
    // 200 years after `now`, in ns: a number, but no state written at `now` can be that far ahead.
    let far = (now + 200 * 365 * 86_400 * 1_000_000_000).to_string();
    let tats = [
        "not-a-number",
        "",
        "-5",
        "1.5e3",
        "99999999999999999999999",
        "18446744073709551615",
        far.as_str(),
    ];
    for (i, tat) in tats.iter().enumerate() {
        corrupt(&mut conn, "t:g", &[("", tat)]).await;
        let before = dump(&mut conn, "t:g").await;
        let got = gcra.try_check_at("g", now, 1).await;
        assert!(is_corrupt(&got, "t:g"), "GCRA {tat:?}: {got:?}");
        let got = gcra.try_peek_at("g", now, 1).await;
        assert!(is_corrupt(&got, "t:g"), "GCRA peek {tat:?}: {got:?}");
        let got = leased.try_check_at("g", now + i as u64 * 1000, 1).await;
        assert!(is_corrupt(&got, "t:g"), "lease {tat:?}: {got:?}");
        assert_eq!(
            dump(&mut conn, "t:g").await,
            before,
            "GCRA {tat:?}: the key was written"
        );
        assert_eq!(gcra.check("g", 1).await.unwrap(), policy, "{tat:?}");
    }
    let n = tats.len() as u64;
    assert_eq!(gcra.faults().corrupt, n);
    assert_eq!(gcra.faults().outages, 0);

    let windows: [&[(&str, &str)]; 6] = [
        &[("i", "x"), ("c", "1")],
        &[("i", "1"), ("c", "99999999999999999999")],
        &[("i", "99999999999999999999"), ("c", "1")],
        &[("i", "1"), ("c", "-1")],
        &[("name", "bob")],
        &[("i", "1")],
    ];
    for fields in windows {
        corrupt(&mut conn, "t:f", fields).await;
        let before = dump(&mut conn, "t:f").await;
        let got = fw.try_check_at("f", now, 1).await;
        assert!(is_corrupt(&got, "t:f"), "fixed {fields:?}: {got:?}");
        assert_eq!(
            dump(&mut conn, "t:f").await,
            before,
            "fixed {fields:?}: the key was written"
        );
        assert_eq!(fw.check("f", 1).await.unwrap(), policy);
    }
    assert_eq!(fw.faults().corrupt, windows.len() as u64);
    let sliding: [&[(&str, &str)]; 4] = [
        &[("i", "1"), ("p", "x"), ("c", "0")],
        &[("i", "1"), ("p", "99999999999999999999"), ("c", "0")],
        &[("i", "1"), ("c", "2")],
        &[("i", "1"), ("p", "1"), ("c", "2"), ("extra", "3")],
    ];
    for fields in sliding {
        corrupt(&mut conn, "t:s", fields).await;
        let before = dump(&mut conn, "t:s").await;
        let got = sw.try_check_at("s", now, 1).await;
        assert!(is_corrupt(&got, "t:s"), "sliding {fields:?}: {got:?}");
        assert_eq!(
            dump(&mut conn, "t:s").await,
            before,
            "sliding {fields:?}: the key was written"
        );
    }
    // A key the limiter wrote itself reads back fine after all that.
    let _: () = redis::cmd("DEL")
        .arg("t:g")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(gcra.try_check_at("g", now, 1).await.unwrap().is_allowed());
}

/// Two limiters of different algorithms under one prefix: a `WRONGTYPE` is a configuration error,
/// reported as such (not as an outage).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_limiters_sharing_a_key_is_a_configuration_error() {
    let server = RedisServer::start();
    let cfg = config().with_policy(FaultPolicy::FailOpen);
    let quota = Quota::per_second(10).unwrap();
    let gcra = RedisLimiter::gcra(manager(&server, &cfg), quota, cfg.clone()).unwrap();
    let fw = RedisLimiter::fixed_window(manager(&server, &cfg), quota, cfg.clone()).unwrap();
    let lease_cfg = lease(4, Duration::from_secs(1));
    let leased = LeasedLimiter::new(manager(&server, &cfg), quota, cfg, lease_cfg).unwrap();
    let now: Nanos = EPOCH_US * 1000;
    assert!(
        fw.try_check_at("shared", now, 1)
            .await
            .unwrap()
            .is_allowed()
    ); // a hash
    assert!(
        gcra.try_check_at("other", now, 1)
            .await
            .unwrap()
            .is_allowed()
    ); // a string
    let wrong = |got: Result<Decision, Error>, key: &str| match got {
        Err(e @ Error::WrongType { .. }) => {
            assert!(e.is_config() && !e.is_outage(), "{e}");
            assert!(
                matches!(&e, Error::WrongType { key: k, .. } if k == key),
                "{e:?}"
            );
        }
        other => panic!("{key}: want WrongType, got {other:?}"),
    };
    wrong(gcra.try_check_at("shared", now, 1).await, "t:shared");
    wrong(leased.try_check_at("shared", now, 1).await, "t:shared");
    wrong(fw.try_check_at("other", now, 1).await, "t:other");
    // `check` answers by the policy and counts a configuration error, not an outage.
    assert!(gcra.check("shared", 1).await.unwrap().is_allowed());
    assert_eq!(
        gcra.faults(),
        tollgate_redis::FaultCounts {
            outages: 0,
            circuit_open: 0,
            corrupt: 0,
            config: 1
        }
    );
    assert!(leased.check("shared", 1).await.unwrap().is_allowed());
    assert_eq!(leased.faults().config, 1);
}
