//! Bytes per key at 1 M keys, measured with a counting global allocator: tollgate-sharded's
//! `KeyedLimiter` (sized for 1 M keys) beside governor's `DefaultKeyedRateLimiter` holding 1 M keys.
//!
//! Run: `cargo bench -p tollgate-benches --bench keyed_memory`
//! (a plain program, not criterion; it prints a Markdown table and one JSON line).

use std::num::NonZeroU32;

use governor::{DefaultKeyedRateLimiter, RateLimiter};
use tollgate_core::{Gcra, Quota};
use tollgate_sharded::KeyedLimiter;
use tollgate_test_support::alloc::{CountingAlloc, live_bytes, peak_bytes, reset_peak};

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

const KEYS: u64 = 1_000_000;

/// Heap bytes held after `build` and `fill`, and the peak reached meanwhile, relative to the start.
fn measure<T>(build: impl FnOnce() -> T, fill: impl Fn(&T, u64)) -> (usize, usize, T) {
    let base = live_bytes();
    reset_peak();
    let value = build();
    for key in 0..KEYS {
        fill(&value, key.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    }
    let held = live_bytes() - base;
    let peak = peak_bytes() - base;
    (held, peak, value)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench -- --list` probes every bench target
    }
    // Per hour, so no key goes idle (and gets its slot reused) while the table fills.
    let quota = Quota::per_hour(10).expect("valid quota");
    let (ours_held, ours_peak, ours) = measure(
        || KeyedLimiter::<u64, Gcra>::new(quota, KEYS as usize).expect("valid limiter"),
        |l, key| {
            let _ = l.check_key(&key, 1);
        },
    );
    let len = ours.len();
    let overflowed = ours.overflow_decisions();
    drop(ours);
    let rate = NonZeroU32::new(10).expect("non-zero");
    let (theirs_held, theirs_peak, theirs) = measure(
        || -> DefaultKeyedRateLimiter<u64> { RateLimiter::keyed(governor::Quota::per_hour(rate)) },
        |l, key| {
            let _ = l.check_key(&key);
        },
    );
    let theirs_len = theirs.len();
    drop(theirs);

    let per_key = |bytes: usize| bytes as f64 / KEYS as f64;
    println!("| limiter | keys held | heap held (B) | B/key | peak heap (B) | peak B/key |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| tollgate KeyedLimiter (capacity 1 M) | {len} (+{overflowed} overflow) | {ours_held} | {:.1} | {ours_peak} | {:.1} |",
        per_key(ours_held),
        per_key(ours_peak)
    );
    println!(
        "| governor DefaultKeyedRateLimiter | {theirs_len} | {theirs_held} | {:.1} | {theirs_peak} | {:.1} |",
        per_key(theirs_held),
        per_key(theirs_peak)
    );
    println!(
        "{{\"keys\":{KEYS},\"tollgate\":{{\"held\":{ours_held},\"peak\":{ours_peak},\"len\":{len},\"overflow\":{overflowed}}},\"governor\":{{\"held\":{theirs_held},\"peak\":{theirs_peak},\"len\":{theirs_len}}}}}"
    );
}
