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
