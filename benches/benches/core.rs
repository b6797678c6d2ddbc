//! Single limiters: every Tollgate algorithm beside governor's direct limiter and the `ratelimit`
//! crate, in the same groups.
//!
//! Groups:
//! * `core/allow`: real clock (quanta TSC), the most generous quota each can represent (10^9/s; the
//!   fixed window 2^29 − 1 per second), so every decision admits: clock read + load + CAS. Window
//!   counters with small limit caps (sliding window, sliding log) cannot admit at this rate on one key
//!   and are measured admitting in `core/allow_stepped` instead.
//! * `core/allow_stepped`: explicit time (`check_at`), advanced by one emission interval per call, so
//!   every algorithm (sliding window and log included) admits every time, with no clock read. governor
//!   reads a stepped clock of the same cost (a `Cell`).
//! * `core/deny`: real clock, one per hour, exhausted first: every decision denies (load, no write).
//! * `core/peek`: real clock, `peek(1)` (no write). governor has no peek.
//! * `core/contended`: 1 and 2 threads (`TOLLGATE_BENCH_THREADS` for more) sharing one limiter in allow mode (`iter_custom` + scoped
//!   threads; each iteration is one decision per thread, so `Throughput::Elements(threads)` makes the
//!   reported rate decisions per second across threads).
//!
//! Every Tollgate row passes its whole `Decision` to `black_box`, so it pays for computing `remaining`
//! and `reset_after` (what the HTTP layer's headers need); governor's success value is `()` and
//! `ratelimit`'s is `Ok(())`, so they compute nothing comparable. `tollgate-bench` (crates/loadgen)
//! measures only the admit/deny bit for every row.
//!
//! Run: `cargo bench -p tollgate-benches --bench core -- --warm-up-time 1 --measurement-time 3`

use std::cell::Cell;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::rc::Rc;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos as GovNanos;
use governor::state::{InMemoryState, NotKeyed};
use tollgate_core::algorithm::Algorithm;
use tollgate_core::{
    AtomicLimiter, FixedWindow, Gcra, LeakyBucket, Limiter, Quota, SlidingLog, SlidingWindow,
};

/// The most generous per-second quota algorithm `A` can represent.
fn allow_quota<A: Algorithm>() -> Quota {
    [1_000_000_000, (1 << 29) - 1, 1 << 20, (1 << 14) - 1]
        .into_iter()
        .filter_map(|n| Quota::per_second(n).ok())
        .find(|q| A::from_quota(*q).is_ok())
        .expect("some quota fits")
}

fn deny_quota() -> Quota {
    Quota::per_hour(1).expect("valid quota")
}

fn governor_allow() -> governor::DefaultDirectRateLimiter {
    governor::RateLimiter::direct(governor::Quota::per_second(NonZeroU32::MAX))
}

fn ratelimit_allow() -> ratelimit::Ratelimiter {
    ratelimit::Ratelimiter::builder(1_000_000_000)
        .max_tokens(1_000_000_000)
        .initial_available(1_000_000_000)
        .build()
        .expect("valid ratelimit parameters")
}

/// A Tollgate single limiter on the default clock, `quota` chosen per algorithm.
fn limiter<A: Algorithm>(quota: Quota) -> AtomicLimiter<A> {
    AtomicLimiter::new(quota).expect("representable quota")
}

fn allow(c: &mut Criterion) {
    let mut g = c.benchmark_group("core/allow");
    g.throughput(Throughput::Elements(1));
    let gcra = limiter::<Gcra>(allow_quota::<Gcra>());
    g.bench_function("gcra", |b| b.iter(|| black_box(gcra.check())));
    // The floor every row above pays: one read of the default clock, no limiter.
    let clock = tollgate_core::MonotonicClock::new();
    g.bench_function("clock_only", |b| {
        b.iter(|| black_box(tollgate_core::Clock::now(&clock)))
    });
    let leaky = limiter::<LeakyBucket>(allow_quota::<LeakyBucket>());
    g.bench_function("leaky_bucket", |b| b.iter(|| black_box(leaky.check())));
    let fixed = limiter::<FixedWindow>(allow_quota::<FixedWindow>());
    g.bench_function("fixed_window", |b| b.iter(|| black_box(fixed.check())));
    let gov = governor_allow();
    g.bench_function("governor", |b| b.iter(|| black_box(gov.check().is_ok())));
    let rl = ratelimit_allow();
    g.bench_function("ratelimit", |b| b.iter(|| black_box(rl.try_wait().is_ok())));
    g.finish();
}

/// A clock governor reads as cheaply as Tollgate reads an explicit `now`: one `Cell`.
#[derive(Clone, Default)]
struct SteppedClock(Rc<Cell<u64>>);

impl governor::clock::Clock for SteppedClock {
    type Instant = GovNanos;
    fn now(&self) -> GovNanos {
        GovNanos::from(self.0.get())
    }
}

fn stepped<L: Limiter>(
    c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    l: &L,
) {
    let step = l.quota().emission_interval_nanos();
    let mut now = 0u64;
    c.bench_function(name, |b| {
        b.iter(|| {
            now += step;
            black_box(l.check_at(now, 1))
        })
    });
}

fn allow_stepped(c: &mut Criterion) {
    let mut g = c.benchmark_group("core/allow_stepped");
    g.throughput(Throughput::Elements(1));
    let q = Quota::per_second(10_000).expect("valid quota");
    stepped(&mut g, "gcra", &limiter::<Gcra>(q));
    stepped(&mut g, "leaky_bucket", &limiter::<LeakyBucket>(q));
    stepped(&mut g, "fixed_window", &limiter::<FixedWindow>(q));
    stepped(&mut g, "sliding_window", &limiter::<SlidingWindow>(q));
    stepped(
        &mut g,
        "sliding_log",
        &SlidingLog::new(q).expect("valid quota"),
    );
    let clock = SteppedClock::default();
    let gov: governor::RateLimiter<
        NotKeyed,
        InMemoryState,
        SteppedClock,
        NoOpMiddleware<GovNanos>,
    > = governor::RateLimiter::direct_with_clock(
        governor::Quota::per_second(NonZeroU32::new(10_000).expect("non-zero")),
        clock.clone(),
    );
    let step = q.emission_interval_nanos();
    g.bench_function("governor", |b| {
        b.iter(|| {
            clock.0.set(clock.0.get() + step);
            black_box(gov.check().is_ok())
        })
    });
    g.finish();
}

fn deny(c: &mut Criterion) {
    let mut g = c.benchmark_group("core/deny");
    g.throughput(Throughput::Elements(1));
    fn exhausted<L: Limiter>(l: L) -> L {
        let _ = l.check();
        assert!(!l.check().is_allowed(), "the quota of one is spent");
        l
    }
    let gcra = exhausted(limiter::<Gcra>(deny_quota()));
    g.bench_function("gcra", |b| b.iter(|| black_box(gcra.check())));
    let leaky = exhausted(limiter::<LeakyBucket>(deny_quota()));
    g.bench_function("leaky_bucket", |b| b.iter(|| black_box(leaky.check())));
    let fixed = exhausted(limiter::<FixedWindow>(deny_quota()));
    g.bench_function("fixed_window", |b| b.iter(|| black_box(fixed.check())));
    let sliding = exhausted(limiter::<SlidingWindow>(deny_quota()));
    g.bench_function("sliding_window", |b| b.iter(|| black_box(sliding.check())));
    let log = exhausted(SlidingLog::new(deny_quota()).expect("valid quota"));
    g.bench_function("sliding_log", |b| b.iter(|| black_box(log.check())));
    let gov = governor::RateLimiter::direct(governor::Quota::per_hour(NonZeroU32::MIN));
    let _ = gov.check();
    g.bench_function("governor", |b| b.iter(|| black_box(gov.check().is_ok())));
    let rl = ratelimit::Ratelimiter::builder(1)
        .period(Duration::from_secs(3600))
        .max_tokens(1)
        .initial_available(0)
        .build()
        .expect("valid ratelimit parameters");
    g.bench_function("ratelimit", |b| b.iter(|| black_box(rl.try_wait().is_ok())));
    g.finish();
}

fn peek(c: &mut Criterion) {
    let mut g = c.benchmark_group("core/peek");
    g.throughput(Throughput::Elements(1));
    let gcra = limiter::<Gcra>(allow_quota::<Gcra>());
    g.bench_function("gcra", |b| b.iter(|| black_box(gcra.peek(1))));
    let leaky = limiter::<LeakyBucket>(allow_quota::<LeakyBucket>());
    g.bench_function("leaky_bucket", |b| b.iter(|| black_box(leaky.peek(1))));
    let fixed = limiter::<FixedWindow>(allow_quota::<FixedWindow>());
    g.bench_function("fixed_window", |b| b.iter(|| black_box(fixed.peek(1))));
    let sliding = limiter::<SlidingWindow>(allow_quota::<SlidingWindow>());
    g.bench_function("sliding_window", |b| b.iter(|| black_box(sliding.peek(1))));
    let log = SlidingLog::new(Quota::per_second(1_000).expect("valid quota")).expect("valid quota");
    g.bench_function("sliding_log", |b| b.iter(|| black_box(log.peek(1))));
    g.finish();
}

/// `threads` threads each make `iters` decisions on `decide`; returns the wall time of the slowest.
fn contended(threads: usize, iters: u64, decide: &(dyn Fn() -> bool + Sync)) -> Duration {
    let barrier = Barrier::new(threads);
    thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        black_box(decide());
                    }
                    start.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .max()
            .unwrap_or_default()
    })
}

fn contention(c: &mut Criterion) {
    let mut g = c.benchmark_group("core/contended");
    let gcra = limiter::<Gcra>(allow_quota::<Gcra>());
    let leaky = limiter::<LeakyBucket>(allow_quota::<LeakyBucket>());
    let fixed = limiter::<FixedWindow>(allow_quota::<FixedWindow>());
    let sliding = limiter::<SlidingWindow>(allow_quota::<SlidingWindow>());
    let log =
        SlidingLog::new(Quota::per_second(1 << 20).expect("valid quota")).expect("valid quota");
    let gov = governor_allow();
    let rl = ratelimit_allow();
    let cases: [(&str, &(dyn Fn() -> bool + Sync)); 7] = [
        ("gcra", &|| gcra.check().is_allowed()),
        ("leaky_bucket", &|| leaky.check().is_allowed()),
        ("fixed_window", &|| fixed.check().is_allowed()),
        // Mostly denials after the first 16 383 per second: the window's limit cap.
        ("sliding_window", &|| sliding.check().is_allowed()),
        ("sliding_log", &|| log.check().is_allowed()),
        ("governor", &|| gov.check().is_ok()),
        ("ratelimit", &|| rl.try_wait().is_ok()),
    ];
    for threads in tollgate_benches::thread_counts() {
        g.throughput(Throughput::Elements(threads as u64));
        for (name, decide) in cases {
            g.bench_with_input(BenchmarkId::new(name, threads), &threads, |b, &t| {
                b.iter_custom(|iters| contended(t, iters, decide))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, allow, allow_stepped, deny, peek, contention);
criterion_main!(benches);
