//! Decisions per CPU-second of `GcraLimiter` and `StripedLimiter` on one hot quota, by thread count.
//!
//! On a shared or oversubscribed machine, wall-clock throughput depends on the load; dividing the
//! decisions by the threads' own CPU time (`CLOCK_THREAD_CPUTIME_ID`) does not. `results/striped`
//! quotes this program's output. Run:
//!
//! ```sh
//! cargo run --release -p tollgate-benches --example striped_cpu_time            # 1, 2, 4 threads
//! cargo run --release -p tollgate-benches --example striped_cpu_time -- fixed   # no clock read
//! ```

use std::hint::black_box;
use std::time::Instant;

use tollgate_core::{GcraLimiter, Limiter, Quota};
use tollgate_striped::StripedLimiter;

/// Decisions per thread in each run.
const CALLS: u64 = 50_000_000;

/// This thread's CPU time in seconds.
#[cfg(target_os = "linux")]
fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable `timespec` for the duration of the call, and
    // CLOCK_THREAD_CPUTIME_ID is a clock every Linux kernel this crate supports provides.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Elsewhere: wall time stands in for CPU time (the per-CPU figure then equals the wall figure).
#[cfg(not(target_os = "linux"))]
fn thread_cpu_seconds() -> f64 {
    use std::sync::OnceLock;
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// `threads` threads make `CALLS` `check()` calls each on `limiter`; prints wall and per-CPU rates.
fn run<L: Limiter>(name: &str, limiter: &L, threads: usize) {
    let start = Instant::now();
    let per_thread: Vec<(u64, f64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let cpu_start = thread_cpu_seconds();
                    let mut allowed = 0u64;
                    for _ in 0..CALLS {
                        allowed += u64::from(black_box(limiter.check().is_allowed()));
                    }
                    (allowed, thread_cpu_seconds() - cpu_start)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker panicked"))
            .collect()
    });
    let wall = start.elapsed().as_secs_f64();
    let calls = (threads as u64 * CALLS) as f64;
    let allowed: u64 = per_thread.iter().map(|r| r.0).sum();
    let cpu: f64 = per_thread.iter().map(|r| r.1).sum();
    println!(
        "{name} threads={threads}: wall {:.1} M/s, per-cpu-second {:.1} M/s, allowed={:.4}",
        calls / wall / 1e6,
        calls / cpu / 1e6,
        allowed as f64 / calls
    );
}

/// One thread, an explicit advancing `now` (no clock read), then the clock read alone.
fn fixed_time(quota: Quota) {
    let gcra = GcraLimiter::new(quota).expect("valid quota");
    let striped = StripedLimiter::new(quota).expect("valid quota");
    let t0 = gcra.now();
    let per_op = |start: Instant| start.elapsed().as_nanos() as f64 / CALLS as f64;

    let start = Instant::now();
    let mut allowed = 0u64;
    for i in 0..CALLS {
        allowed += u64::from(black_box(
            gcra.check_at(t0 + i * 10, 1).is_ok_and(|d| d.is_allowed()),
        ));
    }
    println!(
        "gcra fixed-time: {:.1} ns/op ({allowed} allowed)",
        per_op(start)
    );

    let start = Instant::now();
    let mut allowed = 0u64;
    for i in 0..CALLS {
        allowed += u64::from(black_box(
            striped
                .check_at(t0 + i * 10, 1)
                .is_ok_and(|d| d.is_allowed()),
        ));
    }
    println!(
        "striped fixed-time: {:.1} ns/op ({allowed} allowed)",
        per_op(start)
    );

    let start = Instant::now();
    let mut sum = 0u64;
    for _ in 0..CALLS {
        sum = sum.wrapping_add(black_box(gcra.now()));
    }
    println!("clock: {:.1} ns/op ({})", per_op(start), sum & 1);
}

fn main() {
    // A quota no run can exhaust: every decision is an admission (the striped fast path).
    let quota = Quota::per_second(1_000_000_000).expect("valid quota");
    if std::env::args().nth(1).as_deref() == Some("fixed") {
        fixed_time(quota);
        return;
    }
    for threads in [1, 2, 4] {
        run(
            "gcra",
            &GcraLimiter::new(quota).expect("valid quota"),
            threads,
        );
        run(
            "striped",
            &StripedLimiter::new(quota).expect("valid quota"),
            threads,
        );
    }
}
