//! In-flight permits against rate checks: what a concurrency limit costs beside a rate limit.
//!
//! Each group runs at 1 and 2 threads (`TOLLGATE_BENCH_THREADS` for more). One iteration per thread is one *request*: for a rate
//! limit, one decision; for an in-flight limit, a permit taken and dropped (two compare-and-swaps of
//! the same word or slot). Criterion's `time / threads` is then the cost of one request. Every
//! limit is high enough that nearly every request is admitted (the write path, the expensive one).
//!
//! * `inflight/keyed`: `KeyedLimiter<u64, Gcra>::check_key` vs `KeyedInFlight<u64>::try_acquire`
//!   and a drop (`in_flight`: the permit shares the table's `Arc`) and `try_acquire_scoped` and a
//!   drop (`in_flight_scoped`: the permit borrows the table), over 1 024 keys walked from a ring
//!   (each thread from its own offset).
//! * `inflight/single`: `GcraLimiter::check` vs `InFlightLimiter::try_acquire` + drop (one word).
//! * `inflight/policy`: `Policy::check` on one keyed rate rule vs `Policy::admit` on that rule and
//!   one keyed concurrency rule (the whole engine path, descriptors included).
//!
//! The issue's bar: take + release at most 2x one keyed rate check, at 1 and 2 threads
//! (`keyed/in_flight` over `keyed/rate`).
//!
//! Run: `cargo bench -p tollgate-benches --bench inflight -- --warm-up-time 1 --measurement-time 3`
//! (or `results/concurrency/run.sh`). Smoke check without a release build:
//! `cargo test -p tollgate-benches --bench inflight` (every case once).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tollgate_benches::on_threads;
use tollgate_core::{Gcra, GcraLimiter, InFlightLimiter, Limiter, Quota};
use tollgate_policy::{Policy, PolicyConfig};
use tollgate_sharded::{KeyedInFlight, KeyedLimiter};

const KEYS: u64 = 1_024;
/// Far above what the benchmark can reach: nearly every request is admitted.
const RATE: u64 = 1_000_000_000;
/// Each thread holds at most one permit at a time; this leaves room for all.
const IN_FLIGHT: u64 = 1_000;
const HOLD: Duration = Duration::from_secs(60);

fn keyed(c: &mut Criterion) {
    let rate: KeyedLimiter<u64, Gcra> =
        KeyedLimiter::new(Quota::per_second(RATE).unwrap(), KEYS as usize * 2).unwrap();
    let permits: Arc<KeyedInFlight<u64>> =
        Arc::new(KeyedInFlight::new(IN_FLIGHT, HOLD, KEYS as usize * 2).unwrap());
    for key in 0..KEYS {
        let _ = rate.check_key(&key, 1);
        drop(permits.try_acquire(&key, 1));
    }
    let mut group = c.benchmark_group("inflight/keyed");
    for threads in tollgate_benches::thread_counts() {
        group.throughput(Throughput::Elements(threads as u64));
        group.bench_function(BenchmarkId::new("rate", threads), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, 0, iters, |start, iters| {
                    let start = start as u64;
                    for i in start..start + iters {
                        black_box(rate.check_key(&(i % KEYS), 1).is_ok());
                    }
                })
            });
        });
        group.bench_function(BenchmarkId::new("in_flight", threads), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, 0, iters, |start, iters| {
                    let start = start as u64;
                    for i in start..start + iters {
                        // Taken and dropped at once: a take and a release.
                        black_box(permits.try_acquire(&(i % KEYS), 1).is_ok());
                    }
                })
            });
        });
        group.bench_function(BenchmarkId::new("in_flight_scoped", threads), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, 0, iters, |start, iters| {
                    let start = start as u64;
                    for i in start..start + iters {
                        // The same, the permit borrowing the table (no shared reference count).
                        black_box(permits.try_acquire_scoped(&(i % KEYS), 1).is_ok());
                    }
                })
            });
        });
    }
    group.finish();
}

fn single(c: &mut Criterion) {
    let rate = GcraLimiter::new(Quota::per_second(RATE).unwrap()).unwrap();
    let permits = Arc::new(InFlightLimiter::new(IN_FLIGHT, HOLD).unwrap());
    let mut group = c.benchmark_group("inflight/single");
    for threads in tollgate_benches::thread_counts() {
        group.throughput(Throughput::Elements(threads as u64));
        group.bench_function(BenchmarkId::new("rate", threads), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, 0, iters, |_, iters| {
                    for _ in 0..iters {
                        black_box(rate.check().is_allowed());
                    }
                })
            });
        });
        group.bench_function(BenchmarkId::new("in_flight", threads), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, 0, iters, |_, iters| {
                    for _ in 0..iters {
                        black_box(permits.try_acquire(1).is_ok());
                    }
                })
            });
        });
    }
    group.finish();
}

fn policy(c: &mut Criterion) {
    let rule = format!(
        r#"
        [[rules]]
        name = "rate"
        match = {{ client = "any" }}
        key = ["client"]
        limit = {RATE}
        period = "1s"
        capacity = {capacity}
        "#,
        capacity = KEYS * 2
    );
    let concurrency = format!(
        r#"
        [[concurrency]]
        name = "in_flight"
        match = {{ client = "any" }}
        key = ["client"]
        limit = {IN_FLIGHT}
        capacity = {capacity}
        "#,
        capacity = KEYS * 2
    );
    let rate_only = Policy::new(PolicyConfig::from_toml(&rule).unwrap()).unwrap();
    let both =
        Policy::new(PolicyConfig::from_toml(&format!("{rule}{concurrency}")).unwrap()).unwrap();
    let clients: Vec<String> = (0..KEYS).map(|k| format!("client-{k}")).collect();
    let mut group = c.benchmark_group("inflight/policy");
    for threads in tollgate_benches::thread_counts() {
        group.throughput(Throughput::Elements(threads as u64));
        group.bench_function(BenchmarkId::new("check_rate", threads), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, 0, iters, |start, iters| {
                    let start = start as u64;
                    for i in start..start + iters {
                        let client = clients[(i % KEYS) as usize].as_str();
                        black_box(rate_only.check(&[("client", client)], 1).is_ok());
                    }
                })
            });
        });
        group.bench_function(BenchmarkId::new("admit_rate_and_in_flight", threads), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, 0, iters, |start, iters| {
                    let start = start as u64;
                    for i in start..start + iters {
                        let client = clients[(i % KEYS) as usize].as_str();
                        black_box(both.admit(&[("client", client)], 1).is_ok());
                    }
                })
            });
        });
    }
    group.finish();
}

criterion_group!(benches, keyed, single, policy);
criterion_main!(benches);
