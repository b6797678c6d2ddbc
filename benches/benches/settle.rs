//! Reserve, then settle, against one check: what a cost known only after the response adds.
//!
//! The rule set is `policy.rs`'s gateway decision: per IP (keyed), per API key (keyed, 10 keys
//! with a tier override), a global striped cap. Here over 1 024 IPs, so the tables stay in cache
//! and the engine's own cost is what is measured, not memory latency. Every quota is high enough
//! that every request is admitted (the write path, the expensive one). One iteration per thread is
//! one *request*; criterion's `time / threads` is the cost of one request:
//!
//! * `check`: `Policy::check` of 10 units.
//! * `reserve_settle_back`: `Policy::reserve` of 10, then `Policy::settle` at 7. Three units go
//!   back to each rule through its refund path.
//! * `reserve_settle_charge`: `Policy::reserve` of 10, then `Policy::settle` at 13. Three more
//!   units are charged to each rule.
//!
//! Each runs at 1 and 2 threads, each thread walking the keys from its own offset. The issue's bar:
//! reserve + settle in process at most 2x one check of the same rule set.
//!
//! Run: `cargo bench -p tollgate-benches --bench settle -- --warm-up-time 1 --measurement-time 3`
//! (or `results/settle/run.sh`). Smoke check without a release build:
//! `cargo test -p tollgate-benches --bench settle` (every case once).

use std::hint::black_box;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tollgate_policy::{Policy, PolicyConfig};

const IPS: usize = 1_024;
const API_KEYS: usize = 100;
const ESTIMATE: u64 = 10;

/// The gateway rule set of `policy.rs`, at quotas no run reaches.
fn config() -> PolicyConfig {
    let overrides: Vec<String> = (0..10).map(|i| format!("\"key-{i}\"")).collect();
    PolicyConfig::from_toml(&format!(
        r#"
        [[rules]]
        name = "per_ip"
        match = {{ remote_address = "any" }}
        key = ["remote_address"]
        limit = 100_000_000
        period = "1s"
        burst = 100_000
        capacity = 2_048

        [[rules]]
        name = "per_api_key"
        match = {{ api_key = "any" }}
        key = ["api_key"]
        limit = 100_000_000
        period = "1s"
        burst = 100_000
        capacity = 256

        [[rules]]
        name = "global"
        storage = "striped"
        limit = 1_000_000_000
        period = "1s"

        [[overrides]]
        rule = "per_api_key"
        tier = "pro"
        values = [{}]
        limit = 200_000_000
        period = "1s"
        burst = 200_000
        "#,
        overrides.join(", ")
    ))
    .expect("valid config")
}

struct Requests {
    ips: Vec<String>,
    keys: Vec<String>,
}

impl Requests {
    fn new() -> Self {
        Requests {
            ips: (0..IPS)
                .map(|i| format!("10.0.{}.{}", i >> 8, i & 255))
                .collect(),
            keys: (0..API_KEYS).map(|i| format!("key-{i}")).collect(),
        }
    }

    #[inline]
    fn descriptors(&self, i: u64) -> [(&str, &str); 2] {
        let ip = (i % IPS as u64) as usize;
        [
            ("remote_address", &self.ips[ip]),
            ("api_key", &self.keys[ip % API_KEYS]),
        ]
    }
}

/// Runs `work(offset, iters)` on `threads` threads at once; wall time.
fn run(threads: usize, iters: u64, work: impl Fn(u64, u64) + Sync) -> Duration {
    let work = &work;
    thread::scope(|scope| {
        let start = Instant::now();
        for t in 0..threads as u64 {
            scope.spawn(move || work(t * 7_919, iters));
        }
        start
    })
    .elapsed()
}

/// One request reserved at `ESTIMATE` and settled at `actual`; whether it was admitted.
#[inline]
fn reserve_settle(policy: &Policy, descriptors: &[(&str, &str)], actual: u64) -> bool {
    match policy.reserve(descriptors, ESTIMATE) {
        Ok(reserved) => match reserved.reservation {
            Some(reservation) => {
                black_box(policy.settle(reservation, actual));
                true
            }
            None => false,
        },
        Err(_) => false,
    }
}

fn settle(c: &mut Criterion) {
    let requests = Requests::new();
    let policy = Policy::new(config()).expect("valid policy");
    for i in 0..IPS as u64 {
        assert!(reserve_settle(&policy, &requests.descriptors(i), ESTIMATE));
    }
    let mut group = c.benchmark_group("settle/policy");
    for threads in [1, 2] {
        group.throughput(Throughput::Elements(threads as u64));
        group.bench_function(BenchmarkId::new("check", threads), |b| {
            b.iter_custom(|iters| {
                run(threads, iters, |start, iters| {
                    for i in start..start + iters {
                        black_box(policy.check(&requests.descriptors(i), ESTIMATE).is_ok());
                    }
                })
            });
        });
        for (name, actual) in [
            ("reserve_settle_back", ESTIMATE - 3),
            ("reserve_settle_charge", ESTIMATE + 3),
        ] {
            group.bench_function(BenchmarkId::new(name, threads), |b| {
                b.iter_custom(|iters| {
                    run(threads, iters, |start, iters| {
                        for i in start..start + iters {
                            black_box(reserve_settle(&policy, &requests.descriptors(i), actual));
                        }
                    })
                });
            });
        }
    }
    group.finish();
    // The rows measure admissions only if nothing is denied at this pace: checked at the same
    // pace, right after (printed; it must be 0).
    let denied = (0..100_000u64)
        .filter(|&i| !reserve_settle(&policy, &requests.descriptors(i), ESTIMATE + 3))
        .count();
    eprintln!("settle/policy: of 100 000 reserve + settle right after the run, {denied} denied");
}

criterion_group!(benches, settle);
criterion_main!(benches);
