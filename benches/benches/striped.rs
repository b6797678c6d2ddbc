//! One hot global quota shared by threads: governor's direct limiter, Tollgate's plain `GcraLimiter`
//! (one atomic word) and `StripedLimiter` (per-stripe leases), in the same run.
//!
//! * `striped/contended/<limiter>/<threads>`: 1, 2 and 4 threads (4 oversubscribes a 2-core
//!   machine) each calling `check()` on one shared limiter with the real clock, quota 10⁹ per second
//!   (burst 10⁹), so nearly every decision is allowed. `iter_custom` + scoped threads started on a
//!   `Barrier`; throughput is aggregate decisions per second (`Throughput::Elements(threads)` per
//!   iteration, each thread making `iters` decisions).
//! * `striped/deny`, `striped/deny_coarse`: deny mode (1 per hour) at 1 and 2 threads, plain GCRA
//!   beside the striped limiter as built and held on its stripes (`striped_lease`).
//!
//! Run: `cargo bench -p tollgate-benches --bench striped -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tollgate_core::{CoarseClock, GcraLimiter, Limiter, Quota};
use tollgate_striped::{StripedConfig, StripedLimiter};

const RATE: u32 = 1_000_000_000;
const THREADS: [usize; 3] = [1, 2, 4];

/// Runs `decide` `iters` times on each of `threads` scoped threads released together; returns the
/// wall time from release until the last thread finished.
fn run_threads(threads: usize, iters: u64, decide: &(impl Fn() -> bool + Sync)) -> Duration {
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let mut allowed = 0u64;
                    for _ in 0..iters {
                        allowed += u64::from(black_box(decide()));
                    }
                    allowed
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let allowed: u64 = handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .sum();
        let elapsed = start.elapsed();
        black_box(allowed);
        elapsed
    })
}

fn contended(c: &mut Criterion) {
    let quota = Quota::per_second(u64::from(RATE)).expect("valid quota");
    let mut g = c.benchmark_group("striped/contended");
    for threads in THREADS {
        g.throughput(Throughput::Elements(threads as u64));

        let gov = governor::RateLimiter::direct(governor::Quota::per_second(
            NonZeroU32::new(RATE).expect("non-zero"),
        ));
        g.bench_with_input(BenchmarkId::new("governor", threads), &threads, |b, &t| {
            b.iter_custom(|iters| run_threads(t, iters, &|| gov.check().is_ok()));
        });

        let gcra = GcraLimiter::new(quota).expect("valid quota");
        g.bench_with_input(BenchmarkId::new("gcra", threads), &threads, |b, &t| {
            b.iter_custom(|iters| run_threads(t, iters, &|| gcra.check().is_allowed()));
        });

        let striped = StripedLimiter::new(quota).expect("valid quota");
        g.bench_with_input(BenchmarkId::new("striped", threads), &threads, |b, &t| {
            b.iter_custom(|iters| run_threads(t, iters, &|| striped.check().is_allowed()));
        });
    }
    g.finish();
}

/// The same contention with Tollgate's cached clock (one relaxed load instead of a 15 ns TSC read on
/// this VM), to show the limiters' own scaling: with the TSC clock, two threads cannot exceed about
/// 2 / 15 ns ≈ 135 M decisions/s whatever the limiter does. governor is not in this group: its cached
/// clock would need quanta's one upkeep thread, which Tollgate's `CoarseClock` already holds.
fn contended_coarse(c: &mut Criterion) {
    let quota = Quota::per_second(u64::from(RATE)).expect("valid quota");
    let clock = CoarseClock::new(Duration::from_millis(1)).expect("upkeep thread");
    let mut g = c.benchmark_group("striped/contended_coarse");
    for threads in THREADS {
        g.throughput(Throughput::Elements(threads as u64));

        let gcra = GcraLimiter::with_clock(quota, clock.clone()).expect("valid quota");
        g.bench_with_input(BenchmarkId::new("gcra", threads), &threads, |b, &t| {
            b.iter_custom(|iters| run_threads(t, iters, &|| gcra.check().is_allowed()));
        });

        let striped = StripedLimiter::with_clock(quota, clock.clone()).expect("valid quota");
        g.bench_with_input(BenchmarkId::new("striped", threads), &threads, |b, &t| {
            b.iter_custom(|iters| run_threads(t, iters, &|| striped.check().is_allowed()));
        });
    }
    g.finish();
}

/// Deny mode (1 per hour: after the first admission every decision is a denial), on the TSC and the
/// coarse clock: plain GCRA, the striped limiter as built (one thread takes the alone path, two may
/// leave it), and the striped limiter held on its stripes (`striped_lease`: the cached denial, what
/// contended threads pay).
fn deny(c: &mut Criterion) {
    let quota = Quota::per_hour(1).expect("valid quota");
    let coarse = CoarseClock::new(Duration::from_millis(1)).expect("upkeep thread");
    for (group_name, tsc) in [("striped/deny", true), ("striped/deny_coarse", false)] {
        let mut g = c.benchmark_group(group_name);
        for threads in [1usize, 2] {
            g.throughput(Throughput::Elements(threads as u64));
            macro_rules! row {
                ($name:expr, $limiter:expr) => {{
                    let limiter = $limiter;
                    g.bench_with_input(BenchmarkId::new($name, threads), &threads, |b, &t| {
                        b.iter_custom(|iters| {
                            run_threads(t, iters, &|| limiter.check().is_allowed())
                        });
                    });
                }};
            }
            let lease = StripedConfig::default().always_lease(true);
            if tsc {
                let clock = tollgate_core::MonotonicClock::new();
                row!(
                    "gcra",
                    GcraLimiter::with_clock(quota, clock.clone()).expect("quota")
                );
                row!(
                    "striped",
                    StripedLimiter::with_clock(quota, clock.clone()).expect("quota")
                );
                row!(
                    "striped_lease",
                    StripedLimiter::with_config(quota, lease, clock).expect("quota")
                );
            } else {
                row!(
                    "gcra",
                    GcraLimiter::with_clock(quota, coarse.clone()).expect("quota")
                );
                row!(
                    "striped",
                    StripedLimiter::with_clock(quota, coarse.clone()).expect("quota")
                );
                row!(
                    "striped_lease",
                    StripedLimiter::with_config(quota, lease, coarse.clone()).expect("quota")
                );
            }
        }
        g.finish();
    }
}

criterion_group!(benches, contended, contended_coarse, deny);
criterion_main!(benches);
