//! Keyed limiters: tollgate-sharded's `KeyedLimiter` beside governor's `DefaultKeyedRateLimiter`
//! (DashMap-backed) in the same groups.
//!
//! Groups: one hot key, 1 K keys, 1 M keys uniform, 1 M keys Zipf(1.0), and one hot key carrying
//! half the traffic beside 1 M uniform cold keys (`hot_half_1m_cold`, the hot-key scenario of issue
//! 30); each at 1 and 2 threads (`TOLLGATE_BENCH_THREADS=1,2,4,8,16` for a many-core sweep).
//! Each iteration is one decision per thread (`iter_custom` + scoped threads), so criterion's
//! throughput is decisions per second and `time / threads` is the cost of one decision. Keys are drawn
//! ahead of time into a ring that every thread walks from its own offset; both limiters read their
//! clock (quanta's TSC) once per decision and use the same quota, high enough that nearly every decision
//! admits (the compare-and-swap path, the expensive one). Tables are filled before measuring.
//!
//! Per group: `tollgate` and `governor` decide one key per call (`check_key`); `tollgate_check_keys`
//! hands tollgate the same keys as a stream (`KeyedLimiter::check_keys`, which prefetches each key's
//! slot a few keys ahead; governor has no such API). In the hot-key groups (`hot_key`,
//! `hot_half_1m_cold`) `tollgate_promoted` is `tollgate` built with hot-key promotion on
//! (`Builder::promote_hot_keys`): the hot key moves to a leased striped limiter once its slot's
//! CAS keeps failing. Group `keyed/floor`: one dependent random load
//! per iteration over a 23 MB buffer (the 1 M-key table's size, huge-page advised like it), the
//! latency floor of any lookup that misses the cache and cannot overlap with the next one.
//!
//! Run: `cargo bench -p tollgate-benches --bench keyed -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use governor::{DefaultKeyedRateLimiter, RateLimiter};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use tollgate_benches::on_threads;
use tollgate_core::{Gcra, Quota};
use tollgate_sharded::{HotKeyConfig, KeyedLimiter};

/// Keys drawn ahead of time (a power of two, so walking it is a mask). Uniform rings hold every key
/// equally often; Zipf rings are i.i.d. draws (the distribution itself; its rarest keys may be absent
/// from the ring, but every key is in the table, which is filled first).
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

/// `tollgate` with hot keys promoted automatically (`HotKeyConfig::default()`), for the rows
/// `tollgate_promoted` of the hot-key groups.
fn tollgate_promoted(keys: usize) -> Tollgate {
    let quota = Quota::per_second(u64::from(RATE))
        .and_then(|q| q.with_burst(u64::from(BURST)))
        .expect("valid quota");
    Tollgate(
        KeyedLimiter::builder(quota, keys.max(1_024))
            .promote_hot_keys(HotKeyConfig::default())
            .build()
            .expect("valid limiter"),
    )
}

fn governor() -> Governor {
    let rate = NonZeroU32::new(RATE).expect("non-zero");
    let burst = NonZeroU32::new(BURST).expect("non-zero");
    Governor(RateLimiter::keyed(
        governor::Quota::per_second(rate).allow_burst(burst),
    ))
}

/// Every key equally often (`RING / keys` times, the remainder spread over the first keys), in a
/// random order: the ring covers the whole key space, which i.i.d. draws do not (4 M uniform draws
/// over 1 M keys miss about 1.8 % of them).
fn uniform_ring(keys: u64) -> Vec<u64> {
    let mut rng = SmallRng::seed_from_u64(42);
    let mut ring: Vec<u64> = (0..RING as u64).map(|i| i % keys).collect();
    // Fisher-Yates.
    for i in (1..RING).rev() {
        ring.swap(i, rng.random_range(0..=i));
    }
    ring
}

/// Issue 30's hot-key scenario: every other draw is key 0 (one client or tenant carrying half the
/// traffic), the rest uniform over `cold` further keys (1..=cold), shuffled as i.i.d. draws.
fn hot_half_ring(cold: u64) -> Vec<u64> {
    let mut rng = SmallRng::seed_from_u64(42);
    (0..RING)
        .map(|_| {
            if rng.random_bool(0.5) {
                0
            } else {
                rng.random_range(1..=cold)
            }
        })
        .collect()
}

fn zipf_ring(keys: u64) -> Vec<u64> {
    let mut rng = SmallRng::seed_from_u64(42);
    let zipf = Zipf::new(keys as f64, 1.0).expect("valid Zipf");
    (0..RING)
        .map(|_| zipf.sample(&mut rng) as u64 - 1)
        .collect()
}

/// One `decide` per key, walking `ring` from `start`.
fn one_by_one<'a, L: Keyed>(limiter: &'a L, ring: &'a [u64]) -> impl Fn(usize, u64) + Sync + 'a {
    move |start, iters| {
        for i in start..start + iters as usize {
            black_box(limiter.decide(ring[i % RING]));
        }
    }
}

/// The same keys as one `check_keys` stream.
fn streamed<'a>(limiter: &'a Tollgate, ring: &'a [u64]) -> impl Fn(usize, u64) + Sync + 'a {
    move |start, iters| {
        let keys = (start..start + iters as usize).map(|i| &ring[i % RING]);
        for decision in limiter.0.check_keys(keys, 1) {
            black_box(decision.is_ok_and(|d| d.is_allowed()));
        }
    }
}

/// `promoted`: also a row `tollgate_promoted` (hot keys promoted automatically; the hot key is
/// promoted by the first 2-thread iterations' contention, so a 1-thread row is plain until then).
fn group(c: &mut Criterion, name: &str, keys: u64, ring: &[u64], promoted: bool) {
    let ours = tollgate(keys as usize);
    let theirs = governor();
    let hot = promoted.then(|| tollgate_promoted(keys as usize));
    // Fill the tables with every key of the scenario before measuring.
    for key in 0..keys {
        ours.decide(key);
        theirs.decide(key);
        if let Some(hot) = &hot {
            hot.decide(key);
        }
    }
    let mut group = c.benchmark_group(format!("keyed/{name}"));
    for threads in tollgate_benches::thread_counts() {
        group.throughput(Throughput::Elements(threads as u64));
        group.bench_with_input(BenchmarkId::new("tollgate", threads), &threads, |b, &t| {
            b.iter_custom(|iters| on_threads(t, RING / t, iters, one_by_one(&ours, ring)));
        });
        group.bench_with_input(BenchmarkId::new("governor", threads), &threads, |b, &t| {
            b.iter_custom(|iters| on_threads(t, RING / t, iters, one_by_one(&theirs, ring)));
        });
        let id = BenchmarkId::new("tollgate_check_keys", threads);
        group.bench_with_input(id, &threads, |b, &t| {
            b.iter_custom(|iters| on_threads(t, RING / t, iters, streamed(&ours, ring)));
        });
        if let Some(hot) = &hot {
            let id = BenchmarkId::new("tollgate_promoted", threads);
            group.bench_with_input(id, &threads, |b, &t| {
                b.iter_custom(|iters| on_threads(t, RING / t, iters, one_by_one(hot, ring)));
            });
            // Whether the detector promoted the hot key by now (criterion reports only the time).
            eprintln!(
                "keyed/{name}/tollgate_promoted/{threads}: promoted keys {}, promotions {}",
                hot.0.promoted_keys(),
                hot.0.promotions()
            );
        }
    }
    group.finish();
}

/// A buffer the size of the 1 M-key table (1 428 576 slots × 16 B) holding one random cycle through
/// all its 8-byte words, advised for transparent huge pages before first touch as the table is.
fn chase_buffer() -> Vec<usize> {
    let len = 1_428_576 * 2;
    let mut buffer = vec![0usize; len];
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = buffer.as_mut_ptr().addr().next_multiple_of(HUGE);
        let end = (buffer.as_mut_ptr().addr() + len * size_of::<usize>()) & !(HUGE - 1);
        if end > start {
            // SAFETY: `[start, end)` lies inside `buffer`, still untouched zero pages; the advice
            // changes how the kernel backs them, never their contents.
            unsafe {
                libc::madvise(
                    buffer.as_mut_ptr().cast::<u8>().with_addr(start).cast(),
                    end - start,
                    libc::MADV_HUGEPAGE,
                );
            }
        }
    }
    // Sattolo's shuffle: one cycle through every index.
    let mut order: Vec<usize> = (0..len).collect();
    let mut rng = SmallRng::seed_from_u64(7);
    for i in (1..len).rev() {
        order.swap(i, rng.random_range(0..i));
    }
    for (i, &from) in order.iter().enumerate() {
        buffer[from] = order[(i + 1) % len];
    }
    buffer
}

fn floor(c: &mut Criterion) {
    let buffer = chase_buffer();
    let mut group = c.benchmark_group("keyed/floor");
    group.throughput(Throughput::Elements(1));
    group.bench_function("dependent_load_23mb", |b| {
        let mut at = 0;
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                at = buffer[at];
            }
            black_box(at);
            start.elapsed()
        });
    });
    group.finish();
}

fn keyed(c: &mut Criterion) {
    group(c, "hot_key", 1, &vec![0; RING], true);
    group(c, "1k_keys", 1_000, &uniform_ring(1_000), false);
    group(c, "1m_uniform", 1_000_000, &uniform_ring(1_000_000), false);
    group(c, "1m_zipf", 1_000_000, &zipf_ring(1_000_000), false);
    // One hot key with half the traffic plus 1 M cold keys (compare the cold cost with 1m_uniform).
    group(
        c,
        "hot_half_1m_cold",
        1_000_001,
        &hot_half_ring(1_000_000),
        true,
    );
}

criterion_group!(benches, floor, keyed);
criterion_main!(benches);
