//! Std-threads stress tests beside the loom models of `loom-tests/tests/core.rs`: 8 threads, released
//! together by a barrier, hammer one limiter at a frozen `ManualClock` instant, round after round; each
//! round must admit exactly the allowance. A lost update (a read-modify-write of the state word that is
//! not one atomic compare-and-swap) admits more, so plain `cargo test` catches a broken CAS.
//!
//! Each round moves the clock 10 s on, far enough for every algorithm here to be fully refilled, so
//! every round starts from the same allowance.

use std::time::Duration;

use tollgate_core::{
    Algorithm, AtomicLimiter, FixedWindow, Gcra, LeakyBucket, Limiter, ManualClock, Nanos, Quota,
    Shaper, SlidingLog, SlidingWindow,
};
use tollgate_test_support::stress::{Stress, assert_exact_every_round};

const SEC: Nanos = 1_000_000_000;
/// The allowance per round.
const LIMIT: u64 = 2048;
/// Checks per thread per round: the threads together ask for twice the allowance.
const CHECKS: u64 = 2 * LIMIT / Stress::DEFAULT.threads as u64;

fn round_instant(round: usize) -> Nanos {
    (round as Nanos + 1) * 10 * SEC
}

/// Hammers `limiter` (reading `clock`) with cost-1 checks; each round must admit exactly `LIMIT`.
fn hammer(limiter: &impl Limiter, clock: &ManualClock) {
    assert_exact_every_round(
        |round| {
            clock.set(round_instant(round));
            LIMIT
        },
        |_, _| (0..CHECKS).filter(|_| limiter.check().is_allowed()).count() as u64,
    );
}

fn atomic<A: Algorithm>() {
    let clock = ManualClock::new();
    let limiter =
        AtomicLimiter::<A, _>::with_clock(Quota::per_second(LIMIT).unwrap(), clock.clone())
            .unwrap();
    hammer(&limiter, &clock);
}

#[test]
fn gcra_admits_exactly_the_burst_every_round() {
    atomic::<Gcra>();
}

#[test]
fn leaky_bucket_admits_exactly_its_capacity_every_round() {
    atomic::<LeakyBucket>();
}

#[test]
fn fixed_window_admits_exactly_the_limit_every_round() {
    atomic::<FixedWindow>();
}

#[test]
fn sliding_window_admits_exactly_the_limit_every_round() {
    atomic::<SlidingWindow>();
}

#[test]
fn sliding_log_admits_exactly_the_limit_every_round() {
    let clock = ManualClock::new();
    let log = SlidingLog::with_clock(Quota::per_second(LIMIT).unwrap(), clock.clone()).unwrap();
    hammer(&log, &clock);
}

#[test]
fn shaper_books_exactly_the_burst_plus_the_queue_every_round() {
    // Burst 16 at 1 000/s (T = 1 ms) with a 1 s queue: 16 immediate slots, then one slot per T up to
    // 1 s ahead, 1 000 more: exactly 1 016 bookings per round.
    let quota = Quota::per_second(1_000).unwrap().with_burst(16).unwrap();
    let clock = ManualClock::new();
    let shaper = Shaper::with_clock(quota, Duration::from_secs(1), clock.clone()).unwrap();
    assert_exact_every_round(
        |round| {
            clock.set(round_instant(round));
            1_016
        },
        |_, _| (0..CHECKS).filter(|_| shaper.reserve(1).is_ok()).count() as u64,
    );
}
