//! The policy engine: one 3-rule decision against one keyed decision, metrics on against off, and
//! reload under load.
//!
//! * `policy/decision`: 1 M client IPs (strings, drawn uniformly into a ring ahead of time), every
//!   table filled before measuring. `keyed_one` is one `KeyedLimiter<str, Gcra>` decision (1 M
//!   capacity); `policy_one_rule` the same limit as a one-rule policy; `policy_three_rules` a gateway
//!   decision: per IP (keyed, 1 M capacity), per API key (keyed, 10 k capacity, 1 000 keys of which 10
//!   have a tier override), a global striped cap. Quotas are high enough that every decision admits
//!   (the compare-and-swap path, the expensive one), all on the TSC clock read once per decision.
//! * `policy/metrics`: the same three rules over 1 000 IPs (tables in cache, so the counters' cost is
//!   not lost in memory latency), with `metrics = true` (own striped counters plus the `metrics`
//!   facade, no recorder installed) and `metrics = false`. Before criterion's two rows, both
//!   policies are timed in alternating rounds in one process and the median per-round difference is
//!   printed (`policy/metrics/interleaved`): the figure to read, since separate runs drift more.
//! * `policy/threads`: the same 3-rule decision on 1 and 2 threads at once (`TOLLGATE_BENCH_THREADS`
//!   for a many-core sweep) sharing one policy, beside governor doing the same three limits by hand:
//!   three checks in a row (a keyed limiter per IP, one per API key without the tier override, one
//!   direct limiter as the global cap). Governor's three checks are not atomic (a request refused by
//!   a later check has spent the earlier ones; the policy spends nothing on a refusal), so the row is
//!   what the same gateway costs with governor, not the same guarantee. Each iteration is one
//!   decision per thread, so criterion's throughput is decisions per second across threads.
//! * `policy/reload`: a second thread decides in a loop on the 3-rule policy while this one reloads it
//!   (alternating the global cap and an override's quota); each iteration is one `reload` call.
//!   The deciding thread's count of failed decisions is printed (it must be 0).
//!
//! Run: `cargo bench -p tollgate-benches --bench policy -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, RateLimiter};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tollgate_benches::on_threads;
use tollgate_core::{Gcra, Quota};
use tollgate_policy::{Policy, PolicyConfig};
use tollgate_sharded::KeyedLimiter;

const RING: usize = 1 << 20;
const API_KEYS: usize = 1_000;

fn ips(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255))
        .collect()
}

fn ring(n: usize) -> Vec<u32> {
    let mut rng = SmallRng::seed_from_u64(42);
    (0..RING).map(|_| rng.random_range(0..n as u32)).collect()
}

fn config(ip_capacity: usize, global_limit: u64, pro_limit: u64, metrics: bool) -> PolicyConfig {
    let overrides: Vec<String> = (0..10).map(|i| format!("\"key-{i}\"")).collect();
    PolicyConfig::from_toml(&format!(
        r#"
        metrics = {metrics}
        [[rules]]
        name = "per_ip"
        match = {{ remote_address = "any" }}
        key = ["remote_address"]
        limit = 100_000_000
        period = "1s"
        burst = 1_000
        capacity = {ip_capacity}

        [[rules]]
        name = "per_api_key"
        match = {{ api_key = "any" }}
        key = ["api_key"]
        limit = 100_000_000
        period = "1s"
        burst = 1_000
        capacity = 10_000

        [[rules]]
        name = "global"
        storage = "striped"
        limit = {global_limit}
        period = "1s"

        [[overrides]]
        rule = "per_api_key"
        tier = "pro"
        values = [{}]
        limit = {pro_limit}
        period = "1s"
        burst = 2_000
        "#,
        overrides.join(", ")
    ))
    .expect("valid config")
}

fn one_rule(capacity: usize) -> PolicyConfig {
    let mut c = config(capacity, 1_000_000_000, 200_000_000, true);
    c.rules.truncate(1);
    c.overrides.clear();
    c
}

struct Requests {
    ips: Vec<String>,
    keys: Vec<String>,
    ring: Vec<u32>,
}

impl Requests {
    fn new(n: usize) -> Self {
        Requests {
            ips: ips(n),
            keys: (0..API_KEYS).map(|i| format!("key-{i}")).collect(),
            ring: ring(n),
        }
    }

    #[inline]
    fn descriptors(&self, i: usize) -> [(&str, &str); 2] {
        let ip = self.ring[i & (RING - 1)] as usize;
        [
            ("remote_address", &self.ips[ip]),
            ("api_key", &self.keys[ip % API_KEYS]),
        ]
    }

    fn fill(&self, policy: &Policy) {
        for i in 0..self.ips.len() {
            let d = [
                ("remote_address", self.ips[i].as_str()),
                ("api_key", self.keys[i % API_KEYS].as_str()),
            ];
            black_box(policy.check(&d, 1).expect("valid cost"));
        }
    }
}

fn decision(c: &mut Criterion) {
    let requests = Requests::new(1_000_000);
    let mut group = c.benchmark_group("policy/decision");
    group.throughput(Throughput::Elements(1));

    let quota = Quota::per_second(100_000_000)
        .and_then(|q| q.with_burst(1_000))
        .expect("valid quota");
    let keyed = KeyedLimiter::<str, Gcra>::new(quota, 1_000_000).expect("valid limiter");
    for ip in &requests.ips {
        black_box(keyed.check_key(ip.as_str(), 1).expect("valid cost"));
    }
    let mut i = 0usize;
    group.bench_function("keyed_one", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            let ip = requests.ring[i & (RING - 1)] as usize;
            black_box(keyed.check_key(requests.ips[ip].as_str(), 1))
        })
    });
    drop(keyed);

    let policy = Policy::new(one_rule(1_000_000)).expect("valid policy");
    requests.fill(&policy);
    group.bench_function("policy_one_rule", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            black_box(policy.check(&requests.descriptors(i), 1))
        })
    });
    drop(policy);

    let policy = Policy::new(config(1_000_000, 1_000_000_000, 200_000_000, true)).expect("valid");
    requests.fill(&policy);
    group.bench_function("policy_three_rules", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            black_box(policy.check(&requests.descriptors(i), 1))
        })
    });
    group.finish();
}

fn metrics(c: &mut Criterion) {
    let requests = Requests::new(1_000);
    interleaved_metrics(&requests);
    let mut group = c.benchmark_group("policy/metrics");
    group.throughput(Throughput::Elements(1));
    for (name, on) in [("metrics_on", true), ("metrics_off", false)] {
        let policy = Policy::new(config(1_000, 1_000_000_000, 200_000_000, on)).expect("valid");
        requests.fill(&policy);
        let mut i = 0usize;
        group.bench_function(name, |b| {
            b.iter(|| {
                i = i.wrapping_add(1);
                black_box(policy.check(&requests.descriptors(i), 1))
            })
        });
    }
    group.finish();
}

/// Both policies alive at once, timed in alternating rounds (the order flips every round) of
/// `BATCH` decisions each: on this VM criterion's separate runs of the two move by tens of ns
/// between runs of the same binary, more than the difference being measured. Prints each side's
/// median ns/decision and the median of the per-round differences.
fn interleaved_metrics(requests: &Requests) {
    const ROUNDS: usize = 41;
    const BATCH: usize = 200_000;
    let on = Policy::new(config(1_000, 1_000_000_000, 200_000_000, true)).expect("valid");
    let off = Policy::new(config(1_000, 1_000_000_000, 200_000_000, false)).expect("valid");
    requests.fill(&on);
    requests.fill(&off);
    let run = |policy: &Policy, start: usize| {
        let t = Instant::now();
        for i in start..start + BATCH {
            black_box(policy.check(&requests.descriptors(i), 1).ok());
        }
        t.elapsed().as_nanos() as f64 / BATCH as f64
    };
    run(&on, 0);
    run(&off, 0);
    let (mut ons, mut offs, mut diffs) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let start = round * BATCH;
        let (a, b) = if round % 2 == 0 {
            let a = run(&on, start);
            (a, run(&off, start))
        } else {
            let b = run(&off, start);
            (run(&on, start), b)
        };
        ons.push(a);
        offs.push(b);
        diffs.push(a - b);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    eprintln!(
        "policy/metrics/interleaved: {ROUNDS} rounds of {BATCH} decisions each: metrics on {:.1} ns, off {:.1} ns, median per-round difference (on - off) {:+.2} ns",
        median(&mut ons),
        median(&mut offs),
        median(&mut diffs)
    );
}

fn reload(c: &mut Criterion) {
    let requests = Arc::new(Requests::new(1_000_000));
    let policy =
        Arc::new(Policy::new(config(1_000_000, 1_000_000_000, 200_000_000, true)).expect("valid"));
    requests.fill(&policy);
    let configs = [
        config(1_000_000, 1_000_000_000, 200_000_000, true),
        config(1_000_000, 900_000_000, 300_000_000, true),
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let decided = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let worker = {
        let (policy, requests) = (policy.clone(), requests.clone());
        let (stop, decided, failed) = (stop.clone(), decided.clone(), failed.clone());
        thread::spawn(move || {
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..256 {
                    i = i.wrapping_add(1);
                    match policy.check(&requests.descriptors(i), 1) {
                        Ok(d) if d.is_allowed() => {}
                        _ => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                decided.fetch_add(256, Ordering::Relaxed);
            }
        })
    };
    let mut group = c.benchmark_group("policy/reload");
    let mut n = 0usize;
    group.bench_function("reload_under_load", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                n += 1;
                let next = configs[n % 2].clone();
                let start = Instant::now();
                black_box(policy.reload(next).expect("valid reload"));
                total += start.elapsed();
            }
            total
        })
    });
    group.finish();
    stop.store(true, Ordering::Relaxed);
    worker.join().expect("worker");
    eprintln!(
        "policy/reload: {} reloads; the deciding thread made {} decisions during the run, {} failed or denied",
        n,
        decided.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed)
    );
}

/// Governor with the 3-rule policy's limits, checked one after another (see `policy/threads`).
struct GovernorThree {
    per_ip: DefaultKeyedRateLimiter<String>,
    per_api_key: DefaultKeyedRateLimiter<String>,
    global: DefaultDirectRateLimiter,
}

impl GovernorThree {
    fn new() -> Self {
        let keyed = || {
            let quota =
                governor::Quota::per_second(NonZeroU32::new(100_000_000).expect("non-zero"))
                    .allow_burst(NonZeroU32::new(1_000).expect("non-zero"));
            RateLimiter::keyed(quota)
        };
        let global = governor::Quota::per_second(NonZeroU32::new(1_000_000_000).expect("non-zero"));
        GovernorThree {
            per_ip: keyed(),
            per_api_key: keyed(),
            global: RateLimiter::direct(global),
        }
    }

    #[inline]
    fn check(&self, ip: &String, api_key: &String) -> bool {
        self.per_ip.check_key(ip).is_ok()
            && self.per_api_key.check_key(api_key).is_ok()
            && self.global.check().is_ok()
    }
}

fn threads(c: &mut Criterion) {
    let requests = Requests::new(1_000_000);
    let policy = Policy::new(config(1_000_000, 1_000_000_000, 200_000_000, true)).expect("valid");
    requests.fill(&policy);
    let theirs = GovernorThree::new();
    for i in 0..requests.ips.len() {
        black_box(theirs.check(&requests.ips[i], &requests.keys[i % API_KEYS]));
    }
    let mut group = c.benchmark_group("policy/threads");
    for threads in tollgate_benches::thread_counts() {
        group.throughput(Throughput::Elements(threads as u64));
        let id = BenchmarkId::new("policy_three_rules", threads);
        group.bench_with_input(id, &threads, |b, &t| {
            b.iter_custom(|iters| {
                on_threads(t, RING / t, iters, |start, iters| {
                    for i in start..start + iters as usize {
                        black_box(policy.check(&requests.descriptors(i), 1).ok());
                    }
                })
            })
        });
        let id = BenchmarkId::new("governor_three_checks", threads);
        group.bench_with_input(id, &threads, |b, &t| {
            b.iter_custom(|iters| {
                on_threads(t, RING / t, iters, |start, iters| {
                    for i in start..start + iters as usize {
                        let ip = requests.ring[i & (RING - 1)] as usize;
                        black_box(theirs.check(&requests.ips[ip], &requests.keys[ip % API_KEYS]));
                    }
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, decision, metrics, threads, reload);
criterion_main!(benches);
