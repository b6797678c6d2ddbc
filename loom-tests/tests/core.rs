//! Loom models of tollgate-core's atomic state machines: every interleaving of 2–3 threads, each a
//! named scenario with the invariant it checks.
#![cfg(tollgate_loom)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use tollgate_core::algorithm::fixed_window::FixedState;
use tollgate_core::algorithm::sliding_window::SlidingState;
use tollgate_core::{
    Algorithm, AtomicLimiter, FixedWindow, Gcra, LeakyBucket, Limiter, ManualClock, Nanos, Quota,
    Shaper, SlidingLog, SlidingWindow,
};

const SEC: Nanos = 1_000_000_000;

/// Runs `threads` closures concurrently against `limiter`, each making `checks` checks of cost 1 at
/// `now(i)`, and returns how many were admitted in total.
fn race<L: Limiter + 'static>(
    limiter: Arc<L>,
    threads: usize,
    checks: usize,
    now: fn(usize) -> Nanos,
) -> usize {
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let limiter = limiter.clone();
            thread::spawn(move || {
                (0..checks)
                    .filter(|_| limiter.check_at(now(i), 1).unwrap().is_allowed())
                    .count()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).sum()
}

fn limiter<A: Algorithm>(quota: Quota) -> Arc<AtomicLimiter<A, ManualClock>> {
    Arc::new(AtomicLimiter::<A, _>::with_clock(quota, ManualClock::new()).unwrap())
}

#[test]
fn gcra_three_threads_at_a_frozen_instant_admit_exactly_the_burst() {
    loom::model(|| {
        let quota = Quota::per_second(10).unwrap().with_burst(2).unwrap();
        let admitted = race(limiter::<Gcra>(quota), 3, 1, |_| 5 * SEC);
        assert_eq!(admitted, 2);
    });
}

#[test]
fn gcra_failed_cas_loses_no_admission() {
    loom::model(|| {
        let quota = Quota::per_second(10).unwrap().with_burst(4).unwrap();
        let l = limiter::<Gcra>(quota);
        let admitted = race(l.clone(), 2, 2, |_| 5 * SEC);
        // Every one of the four fits, so every one must be admitted and recorded exactly once.
        assert_eq!(admitted, 4);
        let interval = quota.emission_interval_nanos();
        assert_eq!(l.state_word(), 5 * SEC + 4 * interval);
        assert!(!l.check_at(5 * SEC, 1).unwrap().is_allowed());
    });
}

#[test]
fn leaky_bucket_meter_two_threads_filling_the_last_room_admit_exactly_it() {
    loom::model(|| {
        // Capacity 3: one thread pours 2, the other 2; exactly one of them fits after the first.
        let quota = Quota::per_second(10).unwrap().with_burst(3).unwrap();
        let bucket = Arc::new(
            AtomicLimiter::<LeakyBucket, _>::with_clock(quota, ManualClock::new()).unwrap(),
        );
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let bucket = bucket.clone();
                thread::spawn(move || bucket.check_at(0, 2).unwrap().is_allowed())
            })
            .collect();
        let admitted = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|&a| a)
            .count();
        assert_eq!(admitted, 1);
        assert_eq!(bucket.state_word(), 2 * quota.emission_interval_nanos());
    });
}

#[test]
fn gcra_denial_racing_an_admission_writes_nothing() {
    loom::model(|| {
        let quota = Quota::per_second(10).unwrap().with_burst(1).unwrap();
        let l = limiter::<Gcra>(quota);
        let admitted = race(l.clone(), 2, 1, |_| 0);
        assert_eq!(admitted, 1);
        // Exactly one interval booked: the loser's denial left the word alone.
        assert_eq!(l.state_word(), quota.emission_interval_nanos());
    });
}

/// Seeds `state` through a [`tollgate_core::AtomicState`] and races `threads` single checks at `now`.
fn race_on_state<A: Algorithm>(
    algorithm: A,
    state: u64,
    threads: usize,
    now: Nanos,
) -> (usize, u64) {
    let cell = Arc::new(tollgate_core::AtomicState::new(state));
    let algorithm = Arc::new(algorithm);
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (cell, algorithm) = (cell.clone(), algorithm.clone());
            thread::spawn(move || cell.apply(&*algorithm, now, 1).unwrap().is_allowed())
        })
        .collect();
    let admitted = handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .filter(|&allowed| allowed)
        .count();
    (admitted, cell.load())
}

#[test]
fn fixed_window_rollover_racing_admissions_keeps_the_count_exact() {
    loom::model(|| {
        let fw = FixedWindow::from_quota(Quota::per_second(2).unwrap()).unwrap();
        // Window 0 is full; three threads arrive in window 1 and race the rollover.
        let full = fw.layout().pack(FixedState { index: 0, count: 2 });
        let (admitted, word) = race_on_state(fw.clone(), full, 3, SEC + 1);
        assert_eq!(admitted, 2);
        assert_eq!(fw.layout().unpack(word), FixedState { index: 1, count: 2 });
    });
}

#[test]
fn sliding_window_rollover_racing_admissions_keeps_the_counts_exact() {
    loom::model(|| {
        let sw = SlidingWindow::from_quota(Quota::per_second(4).unwrap()).unwrap();
        // Window 0 admitted 4; at 75 % into window 1 its weight is ⌈4 × 0.25⌉ = 1, leaving room for 3.
        // Two threads race the rollover: both fit and both must be counted in window 1.
        let word = sw.layout().pack(SlidingState {
            index: 0,
            previous: 0,
            current: 4,
        });
        let (admitted, word) = race_on_state(sw.clone(), word, 2, SEC + 3 * SEC / 4);
        assert_eq!(admitted, 2);
        assert_eq!(
            sw.layout().unpack(word),
            SlidingState {
                index: 1,
                previous: 4,
                current: 2
            }
        );
    });
}

#[test]
fn sliding_window_three_threads_at_a_frozen_instant_admit_exactly_the_room() {
    loom::model(|| {
        let sw = SlidingWindow::from_quota(Quota::per_second(4).unwrap()).unwrap();
        let word = sw.layout().pack(SlidingState {
            index: 1,
            previous: 4,
            current: 1,
        });
        // Estimate at 50 %: 1 + ⌈4 × 0.5⌉ = 3, room for exactly one of three.
        let (admitted, word) = race_on_state(sw.clone(), word, 3, SEC + SEC / 2);
        assert_eq!(admitted, 1);
        assert_eq!(sw.layout().unpack(word).current, 2);
    });
}

#[test]
fn shaper_racing_reservations_get_distinct_slots() {
    loom::model(|| {
        let quota = Quota::per_second(10).unwrap().with_burst(1).unwrap();
        let shaper = Arc::new(
            Shaper::with_clock(quota, Duration::from_secs(1), ManualClock::new()).unwrap(),
        );
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let shaper = shaper.clone();
                thread::spawn(move || shaper.reserve_at(0, 1).unwrap())
            })
            .collect();
        let mut delays: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        delays.sort();
        assert_eq!(delays, [Duration::ZERO, Duration::from_millis(100)]);
    });
}

#[test]
fn sliding_log_two_threads_for_the_last_unit_admit_one() {
    loom::model(|| {
        let log =
            SlidingLog::with_clock(Quota::per_second(1).unwrap(), ManualClock::new()).unwrap();
        let admitted = race(Arc::new(log), 2, 1, |_| 0);
        assert_eq!(admitted, 1);
    });
}
