//! A fixed number of decisions on one quota, for `perf stat -e instructions:u` (instruction counts
//! are stable on a shared machine where wall-clock figures are not). Plain `GcraLimiter` or
//! `StripedLimiter` (default layout; `striped_lease`: with the alone path off, so every decision
//! takes the stripe path that contended threads take), allow mode (10⁹/s, burst 10⁹) or deny mode (1 per hour, the
//! load generator's deny quota), on the TSC clock, the coarse clock (1 ms) or a fixed instant
//! (`check_at`, no clock read), on 1 or more threads started together.
//!
//! ```sh
//! cargo build --release -p tollgate-striped --example decision_instructions
//! # instructions per decision = (count at 2 M calls − count at 1 M calls) / (1 M × threads)
//! perf stat -e instructions:u -x, target/release/examples/decision_instructions striped deny fixed 2 1000000
//! # or, on a VM without a PMU, the loop alone: Ir / (calls × threads)
//! valgrind --tool=callgrind --toggle-collect='*decide_loop*' --callgrind-out-file=/dev/null \
//!   target/release/examples/decision_instructions striped deny fixed 2 100000
//! ```
//! `crates/striped/examples/instructions.sh` runs the whole table.

use std::hint::black_box;
use std::sync::Barrier;
use std::time::Duration;

use tollgate_core::{CoarseClock, GcraLimiter, Limiter, MonotonicClock, Nanos, Quota};
use tollgate_striped::{StripedConfig, StripedLimiter};

/// The instant of the fixed-clock runs.
const NOW: Nanos = 1 << 40;

/// The measured loop (named, and never inlined, so that `valgrind --tool=callgrind
/// --toggle-collect=*decide_loop*` counts it alone: no clock calibration, no thread start).
#[inline(never)]
fn decide_loop<L: Limiter>(limiter: &L, fixed: bool, calls: u64) -> u64 {
    let mut allowed = 0u64;
    for _ in 0..calls {
        let decision = if fixed {
            limiter.check_at(black_box(NOW), 1)
        } else {
            limiter.check_n(1)
        };
        allowed += u64::from(black_box(decision).is_ok_and(|d| d.is_allowed()));
    }
    allowed
}

fn run<L: Limiter + Sync>(limiter: &L, fixed: bool, threads: usize, calls: u64) -> u64 {
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    decide_loop(limiter, fixed, calls)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("thread")).sum()
    })
}

fn build<C: tollgate_core::Clock + Sync>(
    which: &str,
    quota: Quota,
    clock: C,
    fixed: bool,
    threads: usize,
    calls: u64,
) -> u64 {
    match which {
        "gcra" => run(
            &GcraLimiter::with_clock(quota, clock).expect("quota"),
            fixed,
            threads,
            calls,
        ),
        "striped" => run(
            &StripedLimiter::with_clock(quota, clock).expect("quota"),
            fixed,
            threads,
            calls,
        ),
        // The stripe path alone (as threads take it once contention was seen): leases, and denials
        // answered by the cached denial.
        "striped_lease" => run(
            &StripedLimiter::with_config(quota, StripedConfig::default().always_lease(true), clock)
                .expect("quota"),
            fixed,
            threads,
            calls,
        ),
        other => panic!("limiter {other}: gcra, striped or striped_lease"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [which, mode, clock, threads, calls] = args.as_slice() else {
        eprintln!(
            "usage: decision_instructions gcra|striped|striped_lease allow|deny tsc|coarse|fixed THREADS CALLS"
        );
        std::process::exit(2);
    };
    let quota = match mode.as_str() {
        "allow" => Quota::per_second(1_000_000_000),
        "deny" => Quota::per_hour(1),
        other => panic!("mode {other}: allow or deny"),
    }
    .expect("quota");
    let threads: usize = threads.parse().expect("threads");
    let calls: u64 = calls.parse().expect("calls");
    let allowed = match clock.as_str() {
        "tsc" => build(which, quota, MonotonicClock::new(), false, threads, calls),
        "fixed" => build(which, quota, MonotonicClock::new(), true, threads, calls),
        "coarse" => {
            let clock = CoarseClock::new(Duration::from_millis(1)).expect("upkeep thread");
            build(which, quota, clock, false, threads, calls)
        }
        other => panic!("clock {other}: tsc, coarse or fixed"),
    };
    println!("{which} {mode} {clock} {threads} threads × {calls}: {allowed} allowed");
}
