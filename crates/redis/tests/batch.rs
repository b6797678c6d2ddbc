//! `RedisBatch`: several keys of mixed algorithms decided as one request in one script call, against
//! a real `redis-server` each test starts on its own loopback port.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{RedisServer, round_up_us};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::aio::MultiplexedConnection;
use tollgate_core::{
    Algorithm, CheckError, Decision, FixedWindow, Gcra, LeakyBucket, Nanos, Quota, SlidingWindow,
    Transition,
};
use tollgate_redis::{
    BatchKey, BatchLimit, BreakerConfig, BreakerState, Error, KeyType, RedisBatch, RedisConfig,
    RedisEncoding, RedisLimiter, admitted, connect,
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

fn batch(server: &RedisServer) -> RedisBatch {
    let cfg = config();
    RedisBatch::new(connect(&server.url(), &cfg).unwrap(), cfg)
}

/// One key's algorithm in process: the oracle.
#[derive(Clone, Debug)]
enum Model {
    Gcra(Gcra),
    Leaky(LeakyBucket),
    Fixed(FixedWindow),
    Sliding(SlidingWindow),
}

macro_rules! each {
    ($m:expr, $a:ident => $e:expr) => {
        match $m {
            Model::Gcra($a) => $e,
            Model::Leaky($a) => $e,
            Model::Fixed($a) => $e,
            Model::Sliding($a) => $e,
        }
    };
}

fn build<A: RedisEncoding>(quota: Quota) -> A {
    A::from_quota(A::redis_quota(quota).unwrap()).unwrap()
}

impl Model {
    /// A random algorithm on a random quota (windows of whole µs, any GCRA interval).
    fn random(rng: &mut StdRng) -> Model {
        match rng.random_range(0..4) {
            0 | 1 => {
                let interval_ns = rng.random_range(1_000..=500_000_000u64);
                let limit = rng.random_range(1..=20u64);
                let quota = Quota::per(Duration::from_nanos(interval_ns * limit), limit)
                    .unwrap()
                    .with_burst(rng.random_range(1..=30))
                    .unwrap();
                if rng.random_bool(0.5) {
                    Model::Gcra(build(quota))
                } else {
                    Model::Leaky(build(quota))
                }
            }
            k => {
                let window_us = rng.random_range(1_000..=3_000_000u64);
                // limit <= window in µs, so the sliding window's µs waits are the core's rounded up.
                let limit = rng.random_range(1..=40u64.min(window_us));
                let quota = Quota::per(Duration::from_micros(window_us), limit).unwrap();
                if k == 2 {
                    Model::Fixed(build(quota))
                } else {
                    Model::Sliding(build(quota))
                }
            }
        }
    }

    fn limit(&self) -> BatchLimit {
        each!(self, a => BatchLimit::new(a).unwrap())
    }

    fn capacity(&self) -> u64 {
        each!(self, a => a.capacity())
    }

    fn decide(&self, word: u64, now: Nanos, cost: u64) -> Transition {
        let mut t = each!(self, a => a.decide(word, now, cost).unwrap());
        if let Model::Sliding(_) = self {
            t.decision = round_up_us(t.decision);
        }
        t
    }

    fn key_type(&self) -> KeyType {
        match self {
            Model::Gcra(_) => Gcra::KEY_TYPE,
            Model::Leaky(_) => LeakyBucket::KEY_TYPE,
            Model::Fixed(_) => FixedWindow::KEY_TYPE,
            Model::Sliding(_) => SlidingWindow::KEY_TYPE,
        }
    }

    fn encode(&self, word: u64) -> Vec<String> {
        each!(self, a => a.encode(word))
    }

    fn decode(&self, values: &[Option<String>]) -> u64 {
        each!(self, a => a.decode(values).unwrap())
    }

    fn ttl(&self, word: u64, now: Nanos) -> Nanos {
        each!(self, a => a.ttl(word, now))
    }
}

/// Adds to `p` the commands that store `word` under `key` as `model` encodes it, with no TTL.
fn seed(p: &mut redis::Pipeline, model: &Model, key: &str, word: u64) {
    p.del(key).ignore();
    if word != 0 {
        let values = model.encode(word);
        match model.key_type() {
            KeyType::String => p.set(key, &values[0]).ignore(),
            KeyType::Hash(fields) => {
                let pairs: Vec<(&str, &String)> = fields.iter().copied().zip(&values).collect();
                p.hset_multiple(key, &pairs).ignore()
            }
        };
    }
}

/// The stored values of `key` as `model` stores them (`None`: absent).
async fn stored(conn: &mut MultiplexedConnection, model: &Model, key: &str) -> Vec<Option<String>> {
    match model.key_type() {
        KeyType::String => {
            let v: Option<String> = redis::cmd("GET").arg(key).query_async(conn).await.unwrap();
            vec![v]
        }
        KeyType::Hash(fields) => redis::cmd("HMGET")
            .arg(key)
            .arg(fields)
            .query_async(conn)
            .await
            .unwrap(),
    }
}

/// The oracle: on random sequences of requests (1-4 keys drawn from a pool of keys of mixed
/// algorithms and quotas, each enforcing or shadow; random costs, including above a key's
/// capacity; explicit `now`s mostly forward, sometimes backwards; some peeks), every key's decision
/// equals the core's `decide` on that key's state, and the keys' states move to the core's next
/// states exactly when every enforcing key admitted (and it is not a peek), else stay as they were.
/// A cost above an enforcing key's capacity is `Error::Cost` and writes nothing. By the function
/// (`FCALL`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_decisions_equal_the_core_deciding_each_key_and_committing_all_or_nothing() {
    let server = RedisServer::start();
    decisions_equal_the_core(&server, batch(&server)).await;
}

/// As above, by the script (`EVALSHA`): a server without `FCALL`, as Redis before 7.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_the_script_batch_decisions_equal_the_core() {
    let server = RedisServer::start_with(&["--rename-command", "FCALL", ""]);
    decisions_equal_the_core(&server, batch(&server)).await;
}

/// As above, with coalescing: each request through the function that decides a group
/// (`batch_many`), here a group of one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_batch_decisions_equal_the_core() {
    let server = RedisServer::start();
    decisions_equal_the_core(&server, batch(&server).with_coalescing()).await;
}

/// As above, coalescing asked for on a server without `FCALL`: each request goes alone, by the
/// script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalescing_without_fcall_goes_alone_by_the_script() {
    let server = RedisServer::start_with(&["--rename-command", "FCALL", ""]);
    decisions_equal_the_core(&server, batch(&server).with_coalescing()).await;
}

async fn decisions_equal_the_core(server: &RedisServer, batch: RedisBatch) {
    let mut conn = raw(server).await;
    let mut rng = StdRng::seed_from_u64(26);
    let (mut admitted_n, mut denied_n, mut cost_errors, mut shadow_saved) = (0, 0, 0, 0);
    for round in 0..6 {
        let pool: Vec<(String, Model)> = (0..6)
            .map(|i| (format!("r{round}k{i}"), Model::random(&mut rng)))
            .collect();
        let limits: Vec<BatchLimit> = pool.iter().map(|(_, m)| m.limit()).collect();
        let mut states = vec![0u64; pool.len()];
        let mut now_us = EPOCH_US + rng.random_range(0..10_000_000);
        for step in 0..250 {
            now_us = match rng.random_range(0..100) {
                0..20 => now_us,
                20..80 => now_us + rng.random_range(0..=200_000),
                80..95 => now_us + rng.random_range(0..=5_000_000),
                _ => now_us.saturating_sub(rng.random_range(0..=300_000)),
            };
            let now = now_us * 1000;
            // 1-4 distinct keys of the pool, in random order.
            let n = rng.random_range(1..=4);
            let mut picked: Vec<usize> = Vec::with_capacity(n);
            while picked.len() < n {
                let i = rng.random_range(0..pool.len());
                if !picked.contains(&i) {
                    picked.push(i);
                }
            }
            let enforcing: Vec<bool> = picked.iter().map(|_| rng.random_bool(0.7)).collect();
            let max_cap = picked.iter().map(|&i| pool[i].1.capacity()).max().unwrap();
            let cost = match rng.random_range(0..100) {
                0..55 => 1,
                55..85 => rng.random_range(1..=max_cap),
                85..92 => 0,
                _ => max_cap + rng.random_range(0..3),
            };
            let peek = rng.random_bool(0.15);

            // Every key of the pool holds the model's state, with no TTL (real time cannot age it).
            let mut p = redis::pipe();
            p.atomic();
            for ((key, model), &state) in pool.iter().zip(&states) {
                seed(&mut p, model, &format!("t:{key}"), state);
            }
            let _: () = p.query_async(&mut conn).await.unwrap();

            let keys: Vec<BatchKey<'_>> = picked
                .iter()
                .zip(&enforcing)
                .map(|(&i, &e)| BatchKey {
                    key: &pool[i].0,
                    limit: &limits[i],
                    enforcing: e,
                })
                .collect();
            let got = if peek {
                batch.try_peek_at(&keys, now, cost).await
            } else {
                batch.try_check_at(&keys, now, cost).await
            };
            let ctx = format!(
                "round {round} step {step}: now_us {now_us} cost {cost} peek {peek} keys {picked:?} \
                 enforcing {enforcing:?}"
            );

            // The oracle: each key decided in process, committed only when every enforcing one admits.
            let too_big = picked
                .iter()
                .zip(&enforcing)
                .find(|&(&i, &e)| e && cost > pool[i].1.capacity());
            let mut next = states.clone();
            match too_big {
                Some((&i, _)) => {
                    let capacity = pool[i].1.capacity();
                    // The first enforcing key that can never admit it is named.
                    assert!(
                        matches!(
                            got,
                            Err(Error::Cost(CheckError::CostExceedsCapacity { cost: c, capacity: k }))
                                if c == cost && k == capacity
                        ),
                        "{ctx}: {got:?}"
                    );
                    cost_errors += 1;
                }
                None => {
                    let got = got.unwrap_or_else(|e| panic!("{ctx}: {e}"));
                    let mut want = Vec::new();
                    let mut transitions = Vec::new();
                    for &i in &picked {
                        let (_, model) = &pool[i];
                        if cost > model.capacity() {
                            want.push(Decision::denied(Nanos::MAX, Nanos::MAX));
                            transitions.push(None);
                        } else {
                            let t = model.decide(states[i], now, cost);
                            want.push(t.decision);
                            transitions.push(t.next);
                        }
                    }
                    assert_eq!(got, want, "{ctx}");
                    let all = admitted(&keys, &got);
                    assert_eq!(
                        all,
                        want.iter()
                            .zip(&enforcing)
                            .all(|(d, &e)| !e || d.is_allowed()),
                        "{ctx}"
                    );
                    if all {
                        admitted_n += 1;
                    } else {
                        denied_n += 1;
                        if picked
                            .iter()
                            .zip(&enforcing)
                            .zip(&got)
                            .any(|((_, &e), d)| !e && d.is_allowed())
                        {
                            shadow_saved += 1;
                        }
                    }
                    if all && !peek {
                        for (&i, t) in picked.iter().zip(&transitions) {
                            if let Some(word) = t {
                                next[i] = *word;
                            }
                        }
                    }
                }
            }

            // Every key of the pool now holds exactly the oracle's state.
            for (i, (key, model)) in pool.iter().enumerate() {
                let full = format!("t:{key}");
                let values = stored(&mut conn, model, &full).await;
                let word = if values.iter().all(Option::is_none) {
                    0
                } else {
                    model.decode(&values)
                };
                if next[i] != states[i] {
                    let pttl: i64 = redis::cmd("PTTL")
                        .arg(&full)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    let want_ms = model.ttl(next[i], now).div_ceil(1_000_000).max(1) as i64;
                    if word == 0 && want_ms <= 100 {
                        // A key that short-lived may be gone in real time already.
                        continue;
                    }
                    assert!(
                        pttl <= want_ms && pttl > want_ms - 1000,
                        "{ctx}: key {i}: PTTL {pttl} ms, want {want_ms} ms"
                    );
                }
                assert_eq!(word, next[i], "{ctx}: key {i} state");
            }
            states = next;
        }
    }
    // The traces must have exercised every outcome to mean anything.
    assert!(
        admitted_n > 200 && denied_n > 100 && cost_errors > 20 && shadow_saved > 5,
        "{admitted_n} admitted, {denied_n} denied, {cost_errors} cost errors, {shadow_saved} \
         denials with an admitting shadow key"
    );
}

/// `INFO commandstats` as (command, calls), `info` itself left out.
async fn command_calls(conn: &mut MultiplexedConnection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            let calls = stats.strip_prefix("calls=")?.split(',').next()?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .filter(|(name, _)| name != "info")
        .collect()
}

/// A `MONITOR` connection: every command the server runs, a client's or a script's, one line each.
struct Monitor(BufReader<TcpStream>);

impl Monitor {
    fn start(server: &RedisServer) -> Monitor {
        let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        stream.write_all(b"MONITOR\r\n").unwrap();
        let mut reader = BufReader::new(stream);
        let mut ok = String::new();
        reader.read_line(&mut ok).unwrap();
        assert_eq!(ok, "+OK\r\n");
        Monitor(reader)
    }

    /// The commands clients sent (not those scripts ran, tagged `lua`) up to the `ECHO` of `marker`,
    /// as their names.
    fn client_commands_until(&mut self, marker: &str) -> Vec<String> {
        let mut names = Vec::new();
        loop {
            let mut line = String::new();
            self.0.read_line(&mut line).unwrap();
            assert!(!line.is_empty(), "MONITOR closed");
            if line.contains(marker) {
                return names;
            }
            // +<time> [<db> <client>] "<command>" "<arg>" ...
            let Some((source, command)) = line.split_once("] ") else {
                continue;
            };
            if !source.ends_with(" lua") {
                names.push(command.split('"').nth(1).unwrap_or("").to_lowercase());
            }
        }
    }
}

/// One request of four keys (every algorithm), admitted or denied, is one Redis command: one
/// `FCALL` of the batch's function (loaded once per server), or where the server refuses functions
/// one `EVALSHA`, in `INFO commandstats` (no other way in: no `EVAL`, no `SCRIPT LOAD`, no
/// `FUNCTION LOAD`; the other commands counted there are the batch's own, which `MONITOR` shows
/// tagged `lua`), and nothing else a client sent. The decisions are the same either way.
async fn one_request_is_one(server: &RedisServer, url: &str, command: &str) {
    let cfg = config();
    let batch = RedisBatch::new(connect(url, &cfg).unwrap(), cfg);
    one_request_is_one_by(server, &batch, command).await;
}

async fn one_request_is_one_by(server: &RedisServer, batch: &RedisBatch, command: &str) {
    let mut conn = raw(server).await;
    let quota = Quota::per_second(2).unwrap();
    let limits = [
        BatchLimit::new(&Gcra::from_quota(quota).unwrap()).unwrap(),
        BatchLimit::new(&LeakyBucket::from_quota(quota).unwrap()).unwrap(),
        BatchLimit::new(&FixedWindow::from_quota(quota).unwrap()).unwrap(),
        BatchLimit::new(&SlidingWindow::from_quota(quota).unwrap()).unwrap(),
    ];
    let names = ["{u}:g", "{u}:l", "{u}:f", "{u}:s"];
    let keys: Vec<BatchKey<'_>> = names
        .iter()
        .zip(&limits)
        .map(|(k, l)| BatchKey::enforcing(k, l))
        .collect();
    let now = EPOCH_US * 1000;
    // The first call loads the library (FCALL, FUNCTION LOAD, FCALL) or the script (NOSCRIPT,
    // SCRIPT LOAD, EVALSHA), or finds functions refused.
    let first = batch.try_check_at(&keys, now, 1).await.unwrap();
    assert!(admitted(&keys, &first));
    let mut monitor = Monitor::start(server);
    let mut outcomes = Vec::new();
    for round in 0..3 {
        let before = command_calls(&mut conn).await;
        let decisions = batch.try_check_at(&keys, now, 1).await.unwrap();
        let after = command_calls(&mut conn).await;
        let marker = format!("tollgate-marker-{round}");
        let _: String = redis::cmd("ECHO")
            .arg(&marker)
            .query_async(&mut conn)
            .await
            .unwrap();
        outcomes.push(admitted(&keys, &decisions));
        let delta = |name: &str| after.get(name).unwrap_or(&0) - before.get(name).unwrap_or(&0);
        let counts = ["fcall", "evalsha", "eval", "script|load", "function|load"].map(delta);
        let want = ["fcall", "evalsha", "eval", "script|load", "function|load"]
            .map(|name| u64::from(name == command));
        assert_eq!(counts, want, "{decisions:?}");
        // What a client sent since the last marker, the test's INFOs aside: the batch's command.
        let mut sent = monitor.client_commands_until(&marker);
        sent.retain(|name| name != "info");
        assert_eq!(sent, [command], "round {round}");
    }
    // The second of quota 2 passed, then the third was denied: both outcomes were counted.
    assert_eq!(outcomes, [true, false, false]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_is_one_fcall() {
    let server = RedisServer::start();
    one_request_is_one(&server, &server.url(), "fcall").await;
}

/// With coalescing, a request alone is one `FCALL` too (of the group function).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coalesced_request_alone_is_one_fcall() {
    let server = RedisServer::start();
    let batch = batch(&server).with_coalescing();
    one_request_is_one_by(&server, &batch, "fcall").await;
}

/// On a stalled server, every coalesced request times out by its own deadline, the requests that
/// queued behind the two calls in flight included: a group's call is bounded by its oldest
/// request's deadline, not by a fresh timeout from when it was sent (which would let those wait
/// two timeouts).
#[tokio::test(flavor = "current_thread")]
async fn coalesced_requests_on_a_stalled_server_time_out_by_their_own_deadline() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(500);
    let cfg = config().with_timeout(timeout);
    let batch = RedisBatch::new(connect(&server.url(), &cfg).unwrap(), cfg).with_coalescing();
    let limit = BatchLimit::for_quota::<Gcra>(Quota::per_second(10).unwrap()).unwrap();
    // Loads the library.
    batch
        .try_peek(&[BatchKey::enforcing("warm", &limit)], 1)
        .await
        .unwrap();
    server.pause_clients(5_000);
    let spawn = |i: usize| {
        let (batch, limit) = (batch.clone(), limit.clone());
        tokio::spawn(async move {
            let key = format!("k{i}");
            let start = Instant::now();
            let got = batch
                .try_check(&[BatchKey::enforcing(&key, &limit)], 1)
                .await;
            (got, start.elapsed())
        })
    };
    // Two calls in flight (each started by a request alone), then, 50 ms later, ten requests
    // queued behind them: their deadlines come 50 ms after the calls in flight time out, so the
    // call that carries them is still theirs to bound.
    let mut tasks = Vec::new();
    for i in 0..2 {
        tasks.push(spawn(i));
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    tasks.extend((2..12).map(spawn));
    for task in tasks {
        let (got, elapsed) = task.await.unwrap();
        assert!(
            matches!(got, Err(Error::Timeout(t)) if t == timeout),
            "{got:?}"
        );
        // One timeout (500 ms), with room for a slow machine; a call bounded by a fresh timeout
        // from when it was sent would answer the queued ones after 950 ms.
        assert!(
            elapsed < Duration::from_millis(800),
            "answered after {elapsed:?}"
        );
    }
}

/// A group call leaves exactly the state, and answers exactly the decisions, of its requests one
/// after the other: 40 requests at one instant, of costs 1 to 3, on a shared GCRA key, a shared
/// sliding window and a key of their own of every algorithm (a peek among them), coalesced into
/// one `FCALL` on one prefix and sent one by one on another.
#[tokio::test(flavor = "current_thread")]
async fn a_group_call_leaves_the_state_of_its_requests_one_after_the_other() {
    let quota = Quota::per_second(10).unwrap().with_burst(12).unwrap();
    group_call_equals_one_by_one(
        Arc::new([
            BatchLimit::for_quota::<Gcra>(quota).unwrap(),
            BatchLimit::for_quota::<SlidingWindow>(quota).unwrap(),
            BatchLimit::for_quota::<LeakyBucket>(quota).unwrap(),
            BatchLimit::for_quota::<FixedWindow>(quota).unwrap(),
        ]),
        |i| i % 4,
    )
    .await;
}

/// The same where every key is GCRA's (or the leaky bucket's), which a group call holds: each key
/// read once and written once, at the end, with the last request's value and TTL. Each request's
/// own key changes quota from one request to the next: its state is carried over (and the
/// carry-over written even by a denial) within the group.
#[tokio::test(flavor = "current_thread")]
async fn a_group_call_holding_its_gcra_states_leaves_them_as_one_after_the_other() {
    let quota = Quota::per_second(10).unwrap().with_burst(12).unwrap();
    let other = Quota::per_second(20).unwrap().with_burst(5).unwrap();
    group_call_equals_one_by_one(
        Arc::new([
            BatchLimit::for_quota::<Gcra>(quota).unwrap(),
            BatchLimit::for_quota::<LeakyBucket>(other).unwrap(),
            BatchLimit::for_quota::<LeakyBucket>(quota).unwrap(),
            BatchLimit::for_quota::<Gcra>(other).unwrap(),
        ]),
        |i| i % 3,
    )
    .await;
}

/// The same where the requests bring their own times, earlier and later than the states the call
/// holds (a TAT ahead of a request's now, and one already past; one whose cost runs past the
/// scripts' time limit; and a TAT more than 2^52 µs ahead, an error), with costs from 0 to the
/// burst and one above it (refused by the client). Three quotas have a unit of 1 µs (an interval of whole µs), which the call
/// decides without gcra_decide where it holds the key's state (batch.lua; one of them an interval
/// of 1 000 250 µs, not whole ms: its TTLs round up), and one does not (3/s), which it never
/// does.
#[tokio::test(flavor = "current_thread")]
async fn a_group_call_of_requests_at_their_own_times_leaves_them_as_one_after_the_other() {
    let quota = Quota::per_second(10).unwrap().with_burst(6).unwrap();
    let other = Quota::per_second(4).unwrap().with_burst(3).unwrap();
    let odd_ms = Quota::per(Duration::from_micros(2_000_500), 2)
        .unwrap()
        .with_burst(3)
        .unwrap();
    let odd = Quota::per_second(3).unwrap().with_burst(2).unwrap();
    group_call_at_times_equals_one_by_one(
        Arc::new([
            BatchLimit::for_quota::<Gcra>(quota).unwrap(),
            BatchLimit::for_quota::<LeakyBucket>(other).unwrap(),
            BatchLimit::for_quota::<Gcra>(odd_ms).unwrap(),
            BatchLimit::for_quota::<Gcra>(odd).unwrap(),
        ]),
        |i| [0, 2, 3][i % 3],
        |now, i| match i {
            // 50 ms before the scripts' time limit (2^53 µs): the shared key's cost runs past it.
            36 => (1 << 53) * 1_000 - 50_000_000,
            // 10 s before it: admitted, so that the next requests, back at `now`, find the shared
            // key's TAT more than 2^52 µs ahead of their time: an error, as a stored state that
            // far ahead is.
            37 => (1 << 53) * 1_000 - 10_000_000_000,
            // 0 to 600 ms past `now` in steps of 50 ms, out of order.
            _ => now + (i as u64 * 7 % 13) * 50_000_000,
        },
        |i| match i % 9 {
            4 => 0,
            8 => 7,
            _ => 1 + i as u64 % 3,
        },
    )
    .await;
}

/// `limits[0]` is the shared enforcing key's, `limits[1]` the shared shadow key's; request `i`'s
/// own key (one of 8) takes `limits[own(i)]`.
async fn group_call_equals_one_by_one(limits: Arc<[BatchLimit; 4]>, own: fn(usize) -> usize) {
    let answers =
        group_call_at_times_equals_one_by_one(limits, own, |now, _| now, |i| 1 + i as u64 % 3)
            .await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
}

/// As above, request `i` at `time(now, i)`, of cost `cost(i)`. Returns the answers (an error as
/// its text).
async fn group_call_at_times_equals_one_by_one(
    limits: Arc<[BatchLimit; 4]>,
    own: fn(usize) -> usize,
    time: fn(Nanos, usize) -> Nanos,
    cost: fn(usize) -> u64,
) -> Vec<Result<Vec<Decision>, String>> {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let cfg = |prefix: &str| config().with_prefix(prefix);
    let alone = RedisBatch::new(connect(&server.url(), &cfg("a:")).unwrap(), cfg("a:"));
    let grouped =
        RedisBatch::new(connect(&server.url(), &cfg("g:")).unwrap(), cfg("g:")).with_coalescing();
    let now = EPOCH_US * 1000;
    let request = move |batch: RedisBatch, limits: Arc<[BatchLimit; 4]>, i: usize| async move {
        let name = format!("own{}", i % 8);
        let keys = [
            BatchKey::enforcing("shared", &limits[0]),
            BatchKey::shadow("shadow", &limits[1]),
            BatchKey::enforcing(&name, &limits[own(i)]),
        ];
        let (at, cost) = (time(now, i), cost(i));
        if i % 11 == 5 {
            batch.try_peek_at(&keys, at, cost).await
        } else {
            batch.try_check_at(&keys, at, cost).await
        }
        // The same error, naming the key by its own prefix.
        .map_err(|e| e.to_string().replace("g:", "a:"))
    };
    // Loads the library.
    grouped
        .try_peek(&[BatchKey::enforcing("warm", &limits[0])], 1)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut one_by_one = Vec::new();
    for i in 0..40 {
        one_by_one.push(request(alone.clone(), limits.clone(), i).await);
    }
    let before = command_calls(&mut conn).await;
    let tasks: Vec<_> = (0..40)
        .map(|i| tokio::spawn(request(grouped.clone(), limits.clone(), i)))
        .collect();
    let mut coalesced = Vec::new();
    for task in tasks {
        coalesced.push(task.await.unwrap());
    }
    let after = command_calls(&mut conn).await;
    assert_eq!(after["fcall"] - before["fcall"], 1);
    assert_eq!(coalesced, one_by_one);
    // The trace admits and denies.
    let decided: Vec<_> = one_by_one.iter().flatten().flatten().collect();
    assert!(decided.iter().any(|d| d.is_allowed()) && decided.iter().any(|d| !d.is_allowed()));
    let mut names = vec!["shared".to_owned(), "shadow".to_owned()];
    names.extend((0..8).map(|i| format!("own{i}")));
    for name in names {
        let (a, a_ttl) = dump(&mut conn, &format!("a:{name}")).await;
        let (g, g_ttl) = dump(&mut conn, &format!("g:{name}")).await;
        // A key whose every request was denied (by the shared key) or peeked holds nothing.
        assert!(
            a.is_some() || !matches!(name.as_str(), "shared" | "shadow"),
            "{name}"
        );
        assert_eq!(a, g, "{name}");
        // The same TTL, as set at `now`: the group's keys were written at most `elapsed` after
        // those written one by one (a TTL counts down from its write; PTTL is in whole ms).
        let elapsed = i64::try_from(started.elapsed().as_millis()).unwrap();
        assert!(
            (a_ttl - 1..=a_ttl + elapsed + 1).contains(&g_ttl),
            "{name}: {a_ttl} {g_ttl} within {elapsed} ms"
        );
    }
    one_by_one
}

/// With coalescing, concurrent requests go as one `FCALL`, each decided in turn as alone: 39
/// requests on one shared key of burst 10 (and a key of their own each) at one instant (the call's
/// `TIME`) admit exactly 10; a 40th whose second key is a list fails alone, naming that key, and
/// writes nothing, while the others are decided.
#[tokio::test(flavor = "current_thread")]
async fn concurrent_requests_go_as_one_call_each_decided_alone() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let batch = batch(&server).with_coalescing();
    let limit = BatchLimit::for_quota::<Gcra>(Quota::per_second(10).unwrap()).unwrap();
    // Loads the library.
    batch
        .try_peek(&[BatchKey::enforcing("warm", &limit)], 1)
        .await
        .unwrap();
    put_list(&mut conn, "t:list").await;
    let list_before = dump(&mut conn, "t:list").await;
    let before = command_calls(&mut conn).await;
    // One thread: every request is queued before the first group call is sent.
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let (batch, limit) = (batch.clone(), limit.clone());
            tokio::spawn(async move {
                let own = if i == 7 {
                    "list".to_owned()
                } else {
                    format!("own{i}")
                };
                let keys = [
                    BatchKey::enforcing("shared", &limit),
                    BatchKey::enforcing(&own, &limit),
                ];
                batch.try_check(&keys, 1).await.map(|d| admitted(&keys, &d))
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    let after = command_calls(&mut conn).await;
    let delta = |name: &str| after.get(name).unwrap_or(&0) - before.get(name).unwrap_or(&0);
    assert_eq!(delta("fcall"), 1, "{after:?}");
    assert_eq!(delta("evalsha"), 0);
    match &outcomes[7] {
        Err(Error::WrongType { key, .. }) => assert_eq!(key, "t:list"),
        other => panic!("want WRONGTYPE on t:list, got {other:?}"),
    }
    let admissions = outcomes.iter().filter(|o| matches!(o, Ok(true))).count();
    let denials = outcomes.iter().filter(|o| matches!(o, Ok(false))).count();
    assert_eq!((admissions, denials), (10, 29));
    // The admitted requests wrote their own keys; the denied ones and the failed one did not.
    for (i, o) in outcomes.iter().enumerate() {
        let exists: bool = redis::cmd("EXISTS")
            .arg(format!("t:own{i}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(exists, matches!(o, Ok(true)), "request {i}: {o:?}");
    }
    assert_eq!(dump(&mut conn, "t:list").await, list_before);
}

/// Redis before 7 has no `FCALL`: as a server whose `FCALL` is renamed away, the batch goes by
/// `EVALSHA` from the first call on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_fcall_one_request_is_one_evalsha() {
    let server = RedisServer::start_with(&["--rename-command", "FCALL", ""]);
    one_request_is_one(&server, &server.url(), "evalsha").await;
}

/// `FUNCTION` renamed away (FCALL known, the library never loaded): `EVALSHA`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_function_load_one_request_is_one_evalsha() {
    let server = RedisServer::start_with(&["--rename-command", "FUNCTION", ""]);
    one_request_is_one(&server, &server.url(), "evalsha").await;
}

/// A user whose ACL refuses `FCALL` and `FUNCTION` (NOPERM): `EVALSHA`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_refused_functions_gets_one_evalsha_per_request() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "nofn",
            "on",
            ">pw",
            "~*",
            "&*",
            "+@all",
            "-fcall",
            "-function",
        ])
        .query_async(&mut conn)
        .await
        .unwrap();
    let url = format!("redis://nofn:pw@127.0.0.1:{}/", server.port);
    one_request_is_one(&server, &url, "evalsha").await;
}

/// The library gone from the server (a restart without persistence, `FUNCTION FLUSH`): the next
/// call loads it again and decides on the state as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_library_is_loaded_again() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let batch = batch(&server);
    let limit = BatchLimit::for_quota::<Gcra>(Quota::per_second(2).unwrap()).unwrap();
    let keys = [BatchKey::enforcing("{f}:a", &limit)];
    let now = EPOCH_US * 1000;
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        let _: () = redis::cmd("FUNCTION")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .unwrap();
        let decisions = batch.try_check_at(&keys, now, 1).await.unwrap();
        outcomes.push(admitted(&keys, &decisions));
    }
    assert_eq!(outcomes, [true, true, false]);
    let calls = command_calls(&mut conn).await;
    assert_eq!(calls.get("function|load"), Some(&3), "{calls:?}");
    assert_eq!(calls.get("evalsha"), None, "{calls:?}");
}

/// On a read-only replica the server refuses `FCALL` of a function that may write before it runs,
/// where the script is refused only at its first write: a peek (no write) is still answered there,
/// by the script, as before functions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_replica_a_peek_is_still_answered() {
    let primary = RedisServer::start();
    let replica = RedisServer::start_replica_of(primary.port);
    let on_primary = batch(&primary);
    let on_replica = batch(&replica);
    let limit = BatchLimit::for_quota::<Gcra>(Quota::per_second(2).unwrap()).unwrap();
    let keys = [BatchKey::enforcing("{r}:a", &limit)];
    let now = EPOCH_US * 1000;
    let peeked = on_replica.try_peek_at(&keys, now, 1).await.unwrap();
    assert!(admitted(&keys, &peeked));
    let e = on_replica.try_check_at(&keys, now, 1).await.unwrap_err();
    assert!(
        matches!(&e, Error::Redis(r) if r.code() == Some("READONLY")),
        "{e:?}"
    );
    // The primary still goes by its function, and its write reaches the replica.
    assert!(admitted(
        &keys,
        &on_primary.try_check_at(&keys, now, 1).await.unwrap()
    ));
    let mut conn = raw(&primary).await;
    let _: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let peeked = on_replica.try_peek_at(&keys, now, 2).await.unwrap();
    assert!(!admitted(&keys, &peeked), "{peeked:?}");
    let calls = command_calls(&mut conn).await;
    assert_eq!(calls.get("evalsha"), None, "{calls:?}");
}

/// The function library keeps tables and memos from call to call: a request after a longer one,
/// after one that failed on a foreign key (WRONGTYPE, nothing written) or under another quota, is
/// decided and replied on its own keys only, as by a fresh script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_by_the_function_are_independent() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let batch = batch(&server);
    let two = BatchLimit::for_quota::<Gcra>(Quota::per_second(2).unwrap()).unwrap();
    let one = BatchLimit::for_quota::<Gcra>(Quota::per_second(1).unwrap()).unwrap();
    let fixed = BatchLimit::for_quota::<FixedWindow>(Quota::per_second(1).unwrap()).unwrap();
    let now = EPOCH_US * 1000;
    let four = [
        BatchKey::enforcing("{i}:a", &two),
        BatchKey::shadow("{i}:b", &one),
        BatchKey::enforcing("{i}:c", &fixed),
        BatchKey::enforcing("{i}:d", &two),
    ];
    let decisions = batch.try_check_at(&four, now, 1).await.unwrap();
    assert_eq!(decisions.len(), 4);
    assert!(admitted(&four, &decisions));
    // One key, after four: its own decision only (the reply ends after it).
    let single = [BatchKey::enforcing("{i}:b", &two)];
    let decisions = batch.try_check_at(&single, now, 1).await.unwrap();
    assert_eq!(decisions.len(), 1);
    // `b` was admitted under 1/s above (its one unit spent): carried over to 2/s as-is, nothing
    // left to admit now.
    assert!(!decisions[0].is_allowed(), "{decisions:?}");
    // A foreign key in the middle: the call fails, the keys before and after it are not written.
    put_list(&mut conn, "t:{i}:list").await;
    let failing = [
        BatchKey::enforcing("{i}:e", &two),
        BatchKey::enforcing("{i}:list", &two),
        BatchKey::enforcing("{i}:f", &one),
    ];
    let e = batch.try_check_at(&failing, now, 1).await.unwrap_err();
    assert!(
        matches!(&e, Error::WrongType { key, .. } if key == "t:{i}:list"),
        "{e:?}"
    );
    let exists: u64 = redis::cmd("EXISTS")
        .arg(&["t:{i}:e", "t:{i}:f"])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, 0, "nothing written");
    // Two keys after the failed call: both decided on their own (fresh) state and written.
    let after = [
        BatchKey::enforcing("{i}:e", &two),
        BatchKey::enforcing("{i}:f", &one),
    ];
    let decisions = batch.try_check_at(&after, now, 1).await.unwrap();
    assert_eq!(decisions.len(), 2);
    assert_eq!(
        decisions
            .iter()
            .map(Decision::remaining)
            .collect::<Vec<_>>(),
        [1, 0]
    );
    let exists: u64 = redis::cmd("EXISTS")
        .arg(&["t:{i}:e", "t:{i}:f"])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, 2);
    // All of it by the function.
    let calls = command_calls(&mut conn).await;
    assert_eq!(calls.get("fcall"), Some(&5), "{calls:?}");
    assert_eq!(calls.get("evalsha"), None, "{calls:?}");
}

/// Over `maxmemory` (noeviction) the server refuses `FCALL` of a function that may write before it
/// runs, where the script was refused only at its first write: the batch then goes by the script,
/// so that a denial (which writes nothing) is still answered, and an admission is refused as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_maxmemory_a_denial_is_still_answered() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let batch = batch(&server);
    let limit = BatchLimit::for_quota::<Gcra>(Quota::per_second(1).unwrap()).unwrap();
    let spent = [BatchKey::enforcing("{m}:spent", &limit)];
    let now = EPOCH_US * 1000;
    assert!(admitted(
        &spent,
        &batch.try_check_at(&spent, now, 1).await.unwrap()
    ));
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", "1", "maxmemory-policy", "noeviction"])
        .query_async(&mut conn)
        .await
        .unwrap();
    let denied = batch.try_check_at(&spent, now, 1).await.unwrap();
    assert!(!admitted(&spent, &denied), "{denied:?}");
    let fresh = [BatchKey::enforcing("{m}:fresh", &limit)];
    let refused = batch.try_check_at(&fresh, now, 1).await.unwrap_err();
    assert!(refused.to_string().contains("OOM"), "{refused}");
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", "0"])
        .query_async(&mut conn)
        .await
        .unwrap();
    // Functions were not given up: the next call goes by FCALL again.
    let before = command_calls(&mut conn).await;
    assert!(admitted(
        &fresh,
        &batch.try_check_at(&fresh, now, 1).await.unwrap()
    ));
    let after = command_calls(&mut conn).await;
    assert_eq!(
        after.get("fcall").unwrap_or(&0) - before.get("fcall").unwrap_or(&0),
        1
    );
}

/// A list at `key`: a type no limiter stores.
async fn put_list(conn: &mut MultiplexedConnection, key: &str) {
    let _: () = redis::cmd("RPUSH")
        .arg(key)
        .arg("x")
        .query_async(conn)
        .await
        .unwrap();
}

/// The key's DUMP and PTTL (`None`: absent), to check that nothing was written.
async fn dump(conn: &mut MultiplexedConnection, key: &str) -> (Option<Vec<u8>>, i64) {
    redis::pipe()
        .cmd("DUMP")
        .arg(key)
        .pttl(key)
        .query_async(conn)
        .await
        .unwrap()
}

/// A key of a foreign type, or holding state no script can have written, among a request's keys
/// fails the whole call naming that key, wherever it stands, and leaves every key as it was (the
/// keys before it would have admitted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_or_corrupt_key_fails_the_call_and_writes_nothing() {
    let server = RedisServer::start();
    foreign_or_corrupt_key_fails_and_writes_nothing(&server, batch(&server)).await;
}

/// As above, coalesced (the error comes back in the group's reply, for its request only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_a_foreign_or_corrupt_key_fails_the_call_and_writes_nothing() {
    let server = RedisServer::start();
    foreign_or_corrupt_key_fails_and_writes_nothing(&server, batch(&server).with_coalescing())
        .await;
}

async fn foreign_or_corrupt_key_fails_and_writes_nothing(server: &RedisServer, batch: RedisBatch) {
    let mut conn = raw(server).await;
    let quota = Quota::per_second(5).unwrap();
    let gcra = BatchLimit::new(&Gcra::from_quota(quota).unwrap()).unwrap();
    let fixed = BatchLimit::new(&FixedWindow::from_quota(quota).unwrap()).unwrap();
    let sliding = BatchLimit::new(&SlidingWindow::from_quota(quota).unwrap()).unwrap();
    let now = EPOCH_US * 1000;
    // Three keys with admissions on them already (so they hold state and TTLs).
    let good = [
        BatchKey::enforcing("a", &gcra),
        BatchKey::shadow("b", &fixed),
        BatchKey::enforcing("c", &sliding),
    ];
    assert!(admitted(
        &good,
        &batch.try_check_at(&good, now, 1).await.unwrap()
    ));
    // Without their TTLs, so that DUMP and PTTL compare exactly.
    for k in ["t:a", "t:b", "t:c"] {
        let persisted: bool = redis::cmd("PERSIST")
            .arg(k)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(persisted, "{k}");
    }
    // A list where a GCRA string or a window hash is stored: WRONGTYPE.
    put_list(&mut conn, "t:list").await;
    // A hash a fixed window cannot have written.
    let _: () = redis::cmd("HSET")
        .arg("t:bad")
        .arg("i")
        .arg("x")
        .arg("c")
        .arg("1")
        .query_async(&mut conn)
        .await
        .unwrap();
    let all = ["t:a", "t:b", "t:c", "t:list", "t:bad"];
    let mut before = Vec::new();
    for k in all {
        before.push(dump(&mut conn, k).await);
    }
    for position in 0..=3 {
        for (foreign, limit, want) in [
            ("list", &gcra, "wrong"),
            ("list", &fixed, "wrong"),
            ("list", &sliding, "wrong"),
            ("bad", &fixed, "corrupt"),
            ("bad", &sliding, "corrupt"),
        ] {
            let mut keys = good.to_vec();
            keys.insert(position, BatchKey::enforcing(foreign, limit));
            for peek in [false, true] {
                let got = if peek {
                    batch.try_peek_at(&keys, now, 1).await
                } else {
                    batch.try_check_at(&keys, now, 1).await
                };
                let full = format!("t:{foreign}");
                match (&got, want) {
                    (Err(e @ Error::WrongType { key, .. }), "wrong") => {
                        assert_eq!(key, &full);
                        assert!(e.is_config() && !e.is_outage(), "{e}");
                    }
                    (Err(Error::CorruptState { key, reason }), "corrupt") => {
                        assert_eq!(key, &full);
                        assert!(!reason.is_empty() && !reason.contains(&full), "{reason}");
                    }
                    _ => panic!("{foreign} at {position}: want {want}, got {got:?}"),
                }
            }
            for (k, b) in all.iter().zip(&before) {
                assert_eq!(&dump(&mut conn, k).await, b, "{k} was written");
            }
        }
    }
    // Without the foreign key the same request goes through, and a shadow foreign key fails it too.
    assert!(admitted(
        &good,
        &batch.try_check_at(&good, now, 1).await.unwrap()
    ));
    let mut keys = good.to_vec();
    keys.push(BatchKey::shadow("list", &gcra));
    assert!(matches!(
        batch.try_check_at(&keys, now, 1).await,
        Err(Error::WrongType { .. })
    ));
}

/// A cost above an enforcing key's capacity is `Error::Cost` with nothing written, however many
/// other keys would admit it; above a shadow key's capacity it is that key's denial "never", and
/// the others decide. The same key twice is refused before any round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_an_enforcing_key_can_never_admit_writes_nothing() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let batch = batch(&server);
    let small = BatchLimit::new(&Gcra::from_quota(Quota::per_second(3).unwrap()).unwrap()).unwrap();
    let big = BatchLimit::new(&FixedWindow::from_quota(Quota::per_second(100).unwrap()).unwrap())
        .unwrap();
    assert_eq!((small.capacity(), big.capacity()), (3, 100));
    let now = EPOCH_US * 1000;
    let keys = [
        BatchKey::enforcing("big", &big),
        BatchKey::enforcing("small", &small),
    ];
    for peek in [false, true] {
        let got = if peek {
            batch.try_peek_at(&keys, now, 4).await
        } else {
            batch.try_check_at(&keys, now, 4).await
        };
        assert!(
            matches!(
                got,
                Err(Error::Cost(CheckError::CostExceedsCapacity {
                    cost: 4,
                    capacity: 3
                }))
            ),
            "{got:?}"
        );
    }
    let size: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    assert_eq!(size, 0, "something was written");
    // The small key as a shadow: denied for good, not sent; the big one admits and is written.
    let keys = [
        BatchKey::enforcing("big", &big),
        BatchKey::shadow("small", &small),
    ];
    let got = batch.try_check_at(&keys, now, 4).await.unwrap();
    assert_eq!(
        got,
        [
            Decision::allowed(96, 1_000_000_000 - (EPOCH_US * 1000) % 1_000_000_000),
            Decision::denied(Nanos::MAX, Nanos::MAX),
        ]
    );
    let keys_now: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(keys_now, ["t:big"]);
    // Only shadow keys that can never admit: no round trip, all denied for good.
    let keys = [BatchKey::shadow("small", &small)];
    assert_eq!(
        batch.try_check_at(&keys, now, 4).await.unwrap(),
        [Decision::denied(Nanos::MAX, Nanos::MAX)]
    );
    // The same key twice.
    let keys = [
        BatchKey::enforcing("x", &big),
        BatchKey::shadow("x", &small),
    ];
    match batch.try_check_at(&keys, now, 1).await {
        Err(e @ Error::DuplicateKey { .. }) => assert!(e.is_config(), "{e}"),
        other => panic!("want DuplicateKey, got {other:?}"),
    }
    let size: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    assert_eq!(size, 1);
}

/// Keys of any bytes and any length (CR LF, spaces, braces, quotes, `: ` and ` script: ` as in
/// Redis's error text, non-ASCII, 64 KiB) are decided like any other, and a corrupt one is still
/// named exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_any_bytes_and_length_never_break_it() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let batch = batch(&server);
    let limit = BatchLimit::new(&SlidingWindow::from_quota(Quota::per_second(2).unwrap()).unwrap())
        .unwrap();
    let long = "k".repeat(64 * 1024);
    let names = [
        "a\r\nb",
        " ",
        "",
        "{x}}{",
        "\"'%s%d\\",
        "a: b script: c, on @user_script:1.",
        "TOLLGATE_KEY 1 WRONGTYPE",
        "ключ🔑",
        "\0nul",
        long.as_str(),
    ];
    let keys: Vec<BatchKey<'_>> = names
        .iter()
        .map(|n| BatchKey::enforcing(n, &limit))
        .collect();
    let now = EPOCH_US * 1000;
    for round in 0..3 {
        let got = batch.try_check_at(&keys, now, 1).await.unwrap();
        assert_eq!(admitted(&keys, &got), round < 2, "round {round}: {got:?}");
    }
    for n in names {
        let c: Option<String> = redis::cmd("HGET")
            .arg(format!("t:{n}"))
            .arg("c")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(c.as_deref(), Some("2"), "{n:?}");
    }
    // Many keys in one call.
    let many: Vec<String> = (0..300).map(|i| format!("{{m}}:{i}")).collect();
    let keys_many: Vec<BatchKey<'_>> = many
        .iter()
        .map(|n| BatchKey::enforcing(n, &limit))
        .collect();
    let got = batch.try_check_at(&keys_many, now, 2).await.unwrap();
    assert!(admitted(&keys_many, &got));
    assert_eq!(got.len(), 300);
    assert!(!admitted(
        &keys_many,
        &batch.try_check_at(&keys_many, now, 1).await.unwrap()
    ));
    // Each odd key made corrupt in turn: the error names it.
    for (i, n) in names.iter().enumerate() {
        let full = format!("t:{n}");
        let _: () = redis::cmd("HSET")
            .arg(&full)
            .arg("c")
            .arg("x")
            .query_async(&mut conn)
            .await
            .unwrap();
        match batch.try_peek_at(&keys, now, 1).await {
            Err(Error::CorruptState { key, .. }) => assert_eq!(key, full, "key {i}"),
            other => panic!("key {i}: {other:?}"),
        }
        let _: () = redis::cmd("HSET")
            .arg(&full)
            .arg("c")
            .arg("2")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

/// A request of more keys than the script's reply formats by shape (40) replies every value: 45
/// GCRA and fixed-window keys in one request are decided as the same keys in three requests of 15,
/// admitted (cost 1) and then denied (cost 3: beyond what is left of GCRA's burst of 3, within
/// the windows' 10).
#[tokio::test(flavor = "current_thread")]
async fn a_request_of_45_keys_is_decided_as_three_of_15() {
    let server = RedisServer::start();
    let cfg = |prefix: &str| config().with_prefix(prefix);
    let whole = RedisBatch::new(connect(&server.url(), &cfg("w:")).unwrap(), cfg("w:"));
    let parts = RedisBatch::new(connect(&server.url(), &cfg("p:")).unwrap(), cfg("p:"));
    let quota = Quota::per_second(10).unwrap().with_burst(3).unwrap();
    let gcra = BatchLimit::for_quota::<Gcra>(quota).unwrap();
    let window = BatchLimit::for_quota::<FixedWindow>(quota).unwrap();
    let names: Vec<String> = (0..45).map(|i| format!("{{m}}:{i}")).collect();
    let keys: Vec<BatchKey<'_>> = names
        .iter()
        .enumerate()
        .map(|(i, n)| BatchKey::enforcing(n, if i % 2 == 0 { &gcra } else { &window }))
        .collect();
    let now = EPOCH_US * 1000;
    for (cost, allowed) in [(1, true), (3, false)] {
        let got = whole.try_check_at(&keys, now, cost).await.unwrap();
        let mut by_parts = Vec::new();
        for chunk in keys.chunks(15) {
            by_parts.extend(parts.try_check_at(chunk, now, cost).await.unwrap());
        }
        assert_eq!(got, by_parts, "cost {cost}");
        assert_eq!(admitted(&keys, &got), allowed, "cost {cost}: {got:?}");
        let gcra_allowed = got.iter().step_by(2).map(Decision::is_allowed);
        assert!(
            gcra_allowed.clone().all(|a| a == allowed),
            "cost {cost}: {got:?}"
        );
        assert!(got.iter().skip(1).step_by(2).all(Decision::is_allowed));
    }
}

/// A batch and a `RedisLimiter` with the same prefix and quota share the key's state:
/// `RedisLimiter::batch_limit` is the limiter's own script parameters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_and_a_limiter_share_state() {
    let server = RedisServer::start();
    let batch = batch(&server);
    let cfg = config();
    // 3/s: an emission interval that is not whole µs.
    let limiter = RedisLimiter::<LeakyBucket>::new(
        connect(&server.url(), &cfg).unwrap(),
        Quota::per_second(3).unwrap(),
        cfg,
    )
    .unwrap();
    let limit = limiter.batch_limit();
    let now = EPOCH_US * 1000;
    assert!(
        limiter
            .try_check_at("k", now, 2)
            .await
            .unwrap()
            .is_allowed()
    );
    let keys = [BatchKey::enforcing("k", &limit)];
    let got = batch.try_check_at(&keys, now, 1).await.unwrap();
    assert_eq!(got[0].remaining(), 0, "{got:?}");
    assert!(!limiter.try_peek_at("k", now, 1).await.unwrap().is_allowed());
    assert_eq!(
        batch.try_peek_at(&keys, now, 1).await.unwrap()[0],
        limiter.try_peek_at("k", now, 1).await.unwrap()
    );
}

/// A batch runs under the circuit breaker like a limiter: a dead server gives outage errors, then,
/// after `failures` of them, `CircuitOpen` without touching the network; once the server is back,
/// a probe closes the breaker and the batch decides again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_runs_under_the_circuit_breaker() {
    let mut server = RedisServer::start();
    let cfg = config()
        .with_timeout(Duration::from_millis(300))
        .with_breaker(BreakerConfig {
            failures: 3,
            probe_interval: Duration::from_millis(20),
        });
    let batch = RedisBatch::new(connect(&server.url(), &cfg).unwrap(), cfg);
    let limit = BatchLimit::for_quota::<Gcra>(Quota::per_second(100).unwrap()).unwrap();
    let keys = [
        BatchKey::enforcing("{b}:1", &limit),
        BatchKey::shadow("{b}:2", &limit),
    ];
    assert!(batch.try_check(&keys, 1).await.unwrap()[0].is_allowed());
    server.kill();
    for i in 0..3 {
        match batch.try_check(&keys, 1).await {
            Err(e) if e.is_outage() && !matches!(e, Error::CircuitOpen) => {}
            other => panic!("call {i}: want an outage, got {other:?}"),
        }
    }
    assert!(matches!(
        batch.try_check(&keys, 1).await,
        Err(Error::CircuitOpen)
    ));
    assert_eq!(batch.breaker().state, BreakerState::Open);
    server.restart();
    let t0 = Instant::now();
    loop {
        match batch.try_check(&keys, 1).await {
            Ok(d) => {
                assert!(d[0].is_allowed(), "{d:?}");
                break;
            }
            Err(e) => assert!(
                e.is_outage() && t0.elapsed() < Duration::from_secs(5),
                "not back after {:?}: {e}",
                t0.elapsed()
            ),
        }
        tokio::time::sleep(Duration::from_millis(5)).await; // bounded poll for the restart
    }
    assert_eq!(batch.breaker().state, BreakerState::Closed);
}
