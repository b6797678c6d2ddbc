//! Instructions per denial, one thread, at a fixed instant: plain GCRA (`GcraLimiter`), the striped
//! limiter on its alone path (one thread deciding: plain GCRA on the shared word), the striped
//! limiter on its stripes (`always_lease`: the cached denial), and governor's direct limiter. Each
//! stage is a named, never-inlined loop calling `check()` through the `Limiter` trait, as the suite
//! does, so callgrind counts it alone:
//!
//! ```sh
//! cargo build --release -p tollgate-benches --example striped_deny_instructions
//! valgrind --tool=callgrind --toggle-collect='*stage_striped_alone*' --callgrind-out-file=/dev/null \
//!   target/release/examples/striped_deny_instructions 200000 striped_alone
//! ```
//! `results/striped/deny_floor.sh` runs every stage under callgrind and divides by the calls; `...
//! 100000000 time` times the four loops one after the other instead.

#[path = "common/governor_direct.rs"]
mod governor_direct;

use std::hint::black_box;
use std::num::NonZeroU32;

use governor::clock::FakeRelativeClock;
use governor_direct::GovDirect;
use tollgate_core::{Clock, GcraLimiter, Limiter, Nanos, Quota};
use tollgate_striped::{StripedConfig, StripedLimiter};

/// The suite's fixed clock: a plain field, no clock read.
struct FixedClock(Nanos);

impl Clock for FixedClock {
    #[inline]
    fn now(&self) -> Nanos {
        self.0
    }
}

const NOW: Nanos = 1 << 40;

#[inline(never)]
fn stage_gcra(limiter: &GcraLimiter<FixedClock>, calls: usize) -> u64 {
    (0..calls)
        .filter(|_| black_box(limiter).check().is_allowed())
        .count() as u64
}

#[inline(never)]
fn stage_striped_alone(limiter: &StripedLimiter<FixedClock>, calls: usize) -> u64 {
    (0..calls)
        .filter(|_| black_box(limiter).check().is_allowed())
        .count() as u64
}

#[inline(never)]
fn stage_striped_leasing(limiter: &StripedLimiter<FixedClock>, calls: usize) -> u64 {
    // Counts denials (the alone stage counts admissions), so that the linker does not fold the two
    // identical loops into one symbol.
    (0..calls)
        .filter(|_| !black_box(limiter).check().is_allowed())
        .count() as u64
}

#[inline(never)]
fn stage_governor(limiter: &GovDirect, calls: usize) -> u64 {
    (0..calls)
        .filter(|_| black_box(limiter).check().is_ok())
        .count() as u64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let calls: usize = args.next().map_or(Ok(200_000), |n| n.parse())?;
    let only = args.next();
    let quota = Quota::per_hour(1)?;
    let gcra = GcraLimiter::with_clock(quota, FixedClock(NOW))?;
    let striped = |always_lease| {
        StripedLimiter::with_config(
            quota,
            StripedConfig::default()
                .stripes(2)
                .always_lease(always_lease),
            FixedClock(NOW),
        )
    };
    let alone = striped(false)?;
    let leasing = striped(true)?;
    let governor = GovDirect::direct_with_clock(
        governor::Quota::per_hour(NonZeroU32::MIN),
        FakeRelativeClock::default(),
    );
    // Each stage: (name, the loop, whether it counts admissions; the leasing loop counts denials).
    let stages: [(&str, &dyn Fn(usize) -> u64); 4] = [
        ("gcra", &|n| stage_gcra(&gcra, n)),
        ("striped_alone", &|n| stage_striped_alone(&alone, n)),
        ("striped_leasing", &|n| {
            n as u64 - stage_striped_leasing(&leasing, n)
        }),
        ("governor", &|n| stage_governor(&governor, n)),
    ];
    for (name, stage) in stages {
        match only.as_deref() {
            // Wall clock, one stage after the other on the calling thread (pin it with taskset).
            Some("time") => {
                let start = std::time::Instant::now();
                black_box(stage(calls));
                let ns = start.elapsed().as_secs_f64() * 1e9 / calls as f64;
                println!("{name} {ns:.2} ns");
            }
            Some(one) if one != name => {}
            // The first call of each limiter is admitted (a burst of 1), every other one denied.
            _ => println!("{name}: admitted {} of {calls}", stage(calls)),
        }
    }
    Ok(())
}
