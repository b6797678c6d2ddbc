//! Criterion benchmarks for Tollgate live in this crate's `benches/` folder; this library holds the
//! one setting they share.

/// The thread counts of the benches' contended groups: `TOLLGATE_BENCH_THREADS` as a comma-separated
/// list (`1,2,4,8,16` for a many-core sweep), else 1 and 2 (this repository's 2-core machines).
///
/// # Panics
/// On a list that is not comma-separated positive integers: a benchmark setting, read before
/// anything is measured.
///
/// ```
/// // SAFETY: a doctest is its own process, with no other thread reading the environment.
/// unsafe { std::env::set_var("TOLLGATE_BENCH_THREADS", "1,4,16") };
/// assert_eq!(tollgate_benches::thread_counts(), [1, 4, 16]);
/// ```
pub fn thread_counts() -> Vec<usize> {
    let Ok(list) = std::env::var("TOLLGATE_BENCH_THREADS") else {
        return vec![1, 2];
    };
    list.split(',')
        .map(|n| match n.trim().parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => panic!("TOLLGATE_BENCH_THREADS: {n:?} is not a positive thread count"),
        })
        .collect()
}

/// Runs `work(start, iters)` on `threads` threads at once and returns the wall time until the last
/// is done: the contended groups' iteration (one decision per thread each, so criterion's
/// throughput with `Throughput::Elements(threads)` is decisions per second). Thread `t` starts at
/// `t × stride + t × 7 919`: its own offset into a ring of keys drawn ahead (the prime keeps threads
/// apart when `stride` is 0).
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// let done = AtomicU64::new(0);
/// tollgate_benches::on_threads(4, 100, 10, |_, iters| {
///     done.fetch_add(iters, Ordering::Relaxed);
/// });
/// assert_eq!(done.into_inner(), 40);
/// ```
pub fn on_threads(
    threads: usize,
    stride: usize,
    iters: u64,
    work: impl Fn(usize, u64) + Sync,
) -> std::time::Duration {
    let work = &work;
    std::thread::scope(|scope| {
        let start = std::time::Instant::now();
        for t in 0..threads {
            scope.spawn(move || work(t * stride + t * 7_919, iters));
        }
        // The scope joins every thread before returning.
        start
    })
    .elapsed()
}
