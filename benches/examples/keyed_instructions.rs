//! Instructions per keyed decision, split into stages, for Tollgate's keyed table and governor's
//! keyed limiter (its default DashMap store), at a fixed instant on one thread: the hash alone, the
//! lookup without a write (Tollgate: `peek_key_at`), the whole decision, and the one-word decision
//! of each library's direct limiter (the GCRA arithmetic and the CAS without a map). Each stage is a
//! named, never-inlined loop, so callgrind counts it alone:
//!
//! ```sh
//! cargo build --release -p tollgate-benches --example keyed_instructions
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/keyed.cg \
//!   target/release/examples/keyed_instructions allow 10000 200000
//! callgrind_annotate --inclusive=yes /tmp/keyed.cg | grep stage_
//! ```
//! (or `perf stat -e instructions:u` on one stage at a time: `... allow 10000 200000 tg_check`).
//! `results/keyed/floor.md` divides each count by the calls and explains the breakdown. Instruction
//! counts show the work, not the latency of the locked instructions (`lock cmpxchg16b` for
//! Tollgate's slot, DashMap's shard lock and unlock plus `lock cmpxchg` for governor): those need the
//! wall-clock suite on a quiet machine.

#[path = "common/governor_direct.rs"]
mod governor_direct;

use std::hash::BuildHasher;
use std::hint::black_box;
use std::num::NonZeroU32;

use governor::clock::FakeRelativeClock;
use governor::state::keyed::DefaultHasher;
use governor_direct::GovDirect;
use tollgate_core::{GcraLimiter, Limiter, ManualClock, Nanos, Quota};
use tollgate_sharded::KeyedLimiter;

/// The fixed instant of every Tollgate decision (governor's fake clock never advances either).
const NOW: Nanos = 1 << 40;

type GovKeyed = governor::RateLimiter<
    u64,
    governor::state::keyed::DashMapStateStore<u64>,
    FakeRelativeClock,
    governor::middleware::NoOpMiddleware<governor::nanos::Nanos>,
>;

#[inline(never)]
fn stage_tg_hash(hasher: &foldhash::quality::FixedState, keys: &[u64]) -> u64 {
    keys.iter()
        .fold(0, |acc, key| acc ^ hasher.hash_one(black_box(key)))
}

#[inline(never)]
fn stage_tg_peek(
    limiter: &KeyedLimiter<u64, tollgate_core::Gcra, ManualClock>,
    keys: &[u64],
) -> u64 {
    keys.iter()
        .filter(|key| {
            let decision = limiter.peek_key_at(black_box(*key), NOW, 1);
            black_box(decision).is_ok_and(|d| d.is_allowed())
        })
        .count() as u64
}

#[inline(never)]
fn stage_tg_check(
    limiter: &KeyedLimiter<u64, tollgate_core::Gcra, ManualClock>,
    keys: &[u64],
) -> u64 {
    keys.iter()
        .filter(|key| {
            let decision = limiter.check_key_at(black_box(*key), NOW, 1);
            black_box(decision).is_ok_and(|d| d.is_allowed())
        })
        .count() as u64
}

#[inline(never)]
fn stage_tg_direct(limiter: &GcraLimiter<ManualClock>, calls: usize) -> u64 {
    (0..calls)
        .filter(|_| {
            let decision = limiter.check_at(black_box(NOW), 1);
            black_box(decision).is_ok_and(|d| d.is_allowed())
        })
        .count() as u64
}

#[inline(never)]
fn stage_gov_hash(hasher: &DefaultHasher, keys: &[u64]) -> u64 {
    keys.iter()
        .fold(0, |acc, key| acc ^ hasher.hash_one(black_box(key)))
}

#[inline(never)]
fn stage_gov_check(limiter: &GovKeyed, keys: &[u64]) -> u64 {
    keys.iter()
        .filter(|key| black_box(limiter.check_key(black_box(*key))).is_ok())
        .count() as u64
}

#[inline(never)]
fn stage_gov_direct(limiter: &GovDirect, calls: usize) -> u64 {
    (0..calls)
        .filter(|_| black_box(limiter.check()).is_ok())
        .count() as u64
}

/// `calls` keys drawn uniformly from `0..space` (xorshift; `space` 1: one key).
fn keys(space: u64, calls: usize) -> Vec<u64> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..calls)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % space
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, space, calls, only) = match args.as_slice() {
        [mode, space, calls] => (mode, space, calls, None),
        [mode, space, calls, only] => (mode, space, calls, Some(only.as_str())),
        _ => {
            eprintln!("usage: keyed_instructions allow|deny KEY_SPACE CALLS [STAGE]");
            std::process::exit(2);
        }
    };
    let space: u64 = space.parse().expect("key space");
    let calls: usize = calls.parse().expect("calls");
    let (quota, gov_quota) = match mode.as_str() {
        "allow" => (
            Quota::per_second(1_000_000_000),
            governor::Quota::per_second(NonZeroU32::MAX),
        ),
        "deny" => (
            Quota::per_hour(1),
            governor::Quota::per_hour(NonZeroU32::MIN),
        ),
        other => panic!("mode {other}: allow or deny"),
    };
    let quota = quota.expect("quota");
    let stream = keys(space, calls);
    let run = |stage: &str| only.is_none_or(|only| only == stage);
    let capacity = usize::try_from(space).unwrap_or(usize::MAX).max(1024);
    let clock = ManualClock::starting_at(NOW);
    let tg = KeyedLimiter::<u64, tollgate_core::Gcra, ManualClock>::with_clock(
        quota,
        capacity,
        clock.clone(),
    )
    .expect("keyed limiter");
    let gov = GovKeyed::new(
        gov_quota,
        governor::state::keyed::DashMapStateStore::default(),
        FakeRelativeClock::default(),
    );
    // Every key present before the measured stages (the prefilled rows of the suite).
    for key in 0..space {
        let _ = tg.check_key_at(&key, NOW, 1);
        let _ = gov.check_key(&key);
    }
    let mut out = 0u64;
    if run("tg_hash") {
        out ^= stage_tg_hash(&foldhash::quality::FixedState::with_seed(1), &stream);
    }
    if run("tg_peek") {
        out ^= stage_tg_peek(&tg, &stream);
    }
    if run("tg_check") {
        out ^= stage_tg_check(&tg, &stream);
    }
    if run("tg_direct") {
        out ^= stage_tg_direct(
            &GcraLimiter::with_clock(quota, clock).expect("quota"),
            calls,
        );
    }
    if run("gov_hash") {
        out ^= stage_gov_hash(&DefaultHasher::default(), &stream);
    }
    if run("gov_check") {
        out ^= stage_gov_check(&gov, &stream);
    }
    if run("gov_direct") {
        let direct = GovDirect::direct_with_clock(gov_quota, FakeRelativeClock::default());
        out ^= stage_gov_direct(&direct, calls);
    }
    println!("{mode} {space} keys, {calls} calls per stage: {out}");
}
