//! Keyed limiters: tollgate-sharded's `KeyedLimiter` beside governor's `DefaultKeyedRateLimiter`
//! (DashMap-backed) in the same groups.
//!
//! Groups: one hot key, 1 K keys, 1 M keys uniform, 1 M keys Zipf(1.0); each at 1 and 2 threads.
//! Each iteration is one decision per thread (`iter_custom` + scoped threads), so criterion's
//! throughput is decisions per second and `time / threads` is the cost of one decision. Keys are drawn
//! ahead of time into a ring that every thread walks from its own offset; both limiters read their
//! clock (quanta's TSC) once per decision and use the same quota, high enough that nearly every decision
//! admits (the compare-and-swap path, the expensive one). Tables are filled before measuring.
//!
//! Run: `cargo bench -p tollgate-benches --bench keyed -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::num::NonZeroU32;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use governor::{DefaultKeyedRateLimiter, RateLimiter};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use tollgate_core::{Gcra, Quota};
use tollgate_sharded::KeyedLimiter;

/// Keys drawn ahead of time (a power of two, so walking it is a mask).
const RING: usize = 1 << 22;
/// 100 M per second, burst 1 000: effectively always admitting.
const RATE: u32 = 100_000_000;
const BURST: u32 = 1_000;

trait Keyed: Sync {
    fn decide(&self, key: u64) -> bool;
}

struct Tollgate(KeyedLimiter<u64, Gcra>);

impl Keyed for Tollgate {
    #[inline]
    fn decide(&self, key: u64) -> bool {
        self.0.check_key(&key, 1).is_ok_and(|d| d.is_allowed())
    }
}

struct Governor(DefaultKeyedRateLimiter<u64>);

impl Keyed for Governor {
    #[inline]
    fn decide(&self, key: u64) -> bool {
        self.0.check_key(&key).is_ok()
    }
}

fn tollgate(keys: usize) -> Tollgate {
    let quota = Quota::per_second(u64::from(RATE))
        .and_then(|q| q.with_burst(u64::from(BURST)))
        .expect("valid quota");
    Tollgate(KeyedLimiter::new(quota, keys.max(1_024)).expect("valid limiter"))
}

fn governor() -> Governor {
    let rate = NonZeroU32::new(RATE).expect("non-zero");
    let burst = NonZeroU32::new(BURST).expect("non-zero");
    Governor(RateLimiter::keyed(
        governor::Quota::per_second(rate).allow_burst(burst),
    ))
}

fn uniform_ring(keys: u64) -> Vec<u64> {
    let mut rng = SmallRng::seed_from_u64(42);
    (0..RING).map(|_| rng.random_range(0..keys)).collect()
}

fn zipf_ring(keys: u64) -> Vec<u64> {
    let mut rng = SmallRng::seed_from_u64(42);
    let zipf = Zipf::new(keys as f64, 1.0).expect("valid Zipf");
    (0..RING)
        .map(|_| zipf.sample(&mut rng) as u64 - 1)
        .collect()
}

/// `iters` decisions on each of `threads` threads, walking `ring` from per-thread offsets; wall time.
fn run<L: Keyed>(limiter: &L, ring: &[u64], threads: usize, iters: u64) -> Duration {
    let mask = ring.len() - 1;
    thread::scope(|scope| {
        let start = Instant::now();
        for t in 0..threads {
            scope.spawn(move || {
                let mut i = t * (ring.len() / threads.max(1)) + t * 7_919;
                for _ in 0..iters {
                    black_box(limiter.decide(ring[i & mask]));
                    i = i.wrapping_add(1);
                }
            });
        }
        // The scope joins every thread before returning.
        start
    })
    .elapsed()
}

fn group(c: &mut Criterion, name: &str, keys: u64, ring: &[u64]) {
    let ours = tollgate(keys as usize);
    let theirs = governor();
    // Fill both tables with every key of the scenario before measuring.
    for key in 0..keys {
        ours.decide(key);
        theirs.decide(key);
    }
    let mut group = c.benchmark_group(format!("keyed/{name}"));
    for threads in [1usize, 2] {
        group.throughput(Throughput::Elements(threads as u64));
        group.bench_with_input(BenchmarkId::new("tollgate", threads), &threads, |b, &t| {
            b.iter_custom(|iters| run(&ours, ring, t, iters));
        });
        group.bench_with_input(BenchmarkId::new("governor", threads), &threads, |b, &t| {
            b.iter_custom(|iters| run(&theirs, ring, t, iters));
        });
    }
    group.finish();
}

fn keyed(c: &mut Criterion) {
    group(c, "hot_key", 1, &vec![0; RING]);
    group(c, "1k_keys", 1_000, &uniform_ring(1_000));
    group(c, "1m_uniform", 1_000_000, &uniform_ring(1_000_000));
    group(c, "1m_zipf", 1_000_000, &zipf_ring(1_000_000));
}

criterion_group!(benches, keyed);
criterion_main!(benches);
