//! Std-threads stress tests beside the loom models of `loom-tests/tests/striped.rs`: 8 threads,
//! started together, two or four per stripe, take and use leases of one shared GCRA word at a frozen
//! `ManualClock` instant, round after round; each round must admit exactly the burst. A lost update
//! on the shared word or on a stripe's lease word (a read-modify-write that is not one
//! compare-and-swap) admits more, so plain `cargo test` catches a broken CAS on either.
//!
//! Why exactly the burst: every thread checks cost 1 until its first denial. At a frozen instant a
//! denial means the shared word had no unit left, and stays so (nothing expires, and a cost-1 request
//! only refills a lease with no live unit, so nothing is given back). A stripe's last writer leaves
//! its lease empty (it checks again after its last write, and would have used a live unit), so no unit
//! is stranded in a lease: every granted unit was admitted. Each round moves the clock 10 s on, so the
//! burst is whole again and old leases have expired.

use tollgate_core::{ManualClock, Nanos, Quota};
use tollgate_striped::{LeaseSize, StripedConfig, StripedLimiter};
use tollgate_test_support::stress::assert_exact_every_round;

const SEC: Nanos = 1_000_000_000;
const BURST: u64 = 8192;

fn round_instant(round: usize) -> Nanos {
    (round as Nanos + 1) * 10 * SEC
}

/// Checks cost 1 on `stripe` at `now` until the first denial; returns the admissions.
fn until_denied(limiter: &StripedLimiter<ManualClock>, stripe: usize, now: Nanos) -> u64 {
    let mut admitted = 0;
    while limiter
        .check_on_stripe(stripe, now, 1)
        .unwrap()
        .is_allowed()
    {
        admitted += 1;
    }
    admitted
}

/// 8 threads over `stripes` stripes (thread `t` on stripe `t % stripes`).
fn hammer(stripes: usize, lease: LeaseSize) {
    let quota = Quota::per_second(BURST).unwrap();
    let config = StripedConfig::default().stripes(stripes).lease(lease);
    let clock = ManualClock::new();
    let limiter = StripedLimiter::with_config(quota, config, clock.clone()).unwrap();
    assert_exact_every_round(
        |round| {
            clock.set(round_instant(round));
            BURST
        },
        // Several threads share each stripe: the lease word's fast-path CAS races its refill lock.
        |round, thread| until_denied(&limiter, thread % stripes, round_instant(round)),
    );
    assert_eq!(limiter.held_units(round_instant(0)), 0);
}

#[test]
fn small_fixed_leases_admit_exactly_the_burst_every_round() {
    // Leases of 8: hundreds of refills per round, each a CAS on the shared word racing the others;
    // four threads per stripe racing on each lease word.
    hammer(2, LeaseSize::Fixed(8));
}

#[test]
fn adaptive_leases_admit_exactly_the_burst_every_round() {
    hammer(4, LeaseSize::Adaptive { max: 128 });
}
