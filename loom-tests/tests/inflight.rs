//! Loom models of the in-flight limits: takes and releases of permits racing each other, across an
//! epoch boundary, and racing an eviction in the keyed table. Each names the invariant it checks.
//!
//! The single limiter's word is a loom atomic; the keyed table's slots, stripe locks and overflow
//! states are loom's doubles (see `crates/sharded/src/sync.rs`), so every access is a point where
//! loom switches threads. Tables are one stripe of 4 slots, every key's window covering all of them.
#![cfg(tollgate_loom)]

use std::time::Duration;

use loom::thread;
use tollgate_core::{InFlight, InFlightLimiter, ManualClock, Nanos, Quota};
use tollgate_sharded::{KeyedInFlight, KeyedLimiter};

const SEC: Nanos = 1_000_000_000;
const HOLD: Duration = Duration::from_secs(10);

fn single(limit: u64) -> std::sync::Arc<InFlightLimiter<ManualClock>> {
    std::sync::Arc::new(InFlightLimiter::from_algorithm(
        InFlight::new(limit, HOLD).unwrap(),
        ManualClock::starting_at(SEC),
    ))
}

fn keyed(limit: u64) -> std::sync::Arc<KeyedInFlight<u64, ManualClock>> {
    let table = KeyedLimiter::<u64, InFlight, _>::builder_with_clock(
        Quota::per(HOLD, limit).unwrap(),
        2,
        ManualClock::starting_at(SEC),
    )
    .stripes(1)
    .window(4)
    .hasher_seed(1)
    .build()
    .unwrap();
    assert_eq!(table.slots(), 4);
    std::sync::Arc::new(KeyedInFlight::from_table(table))
}

#[test]
fn a_release_racing_a_take_at_the_limit_never_lets_both_hold() {
    loom::model(|| {
        let limiter = single(1);
        let held = limiter.try_acquire_at(SEC, 1).unwrap().unwrap();
        let releaser = thread::spawn(move || drop(held));
        let taker = {
            let limiter = limiter.clone();
            thread::spawn(move || limiter.try_acquire_at(SEC, 1).unwrap().ok())
        };
        releaser.join().unwrap();
        let taken = taker.join().unwrap();
        // If the taker got in, the release came first: one holder, never two.
        assert_eq!(limiter.in_flight(), u64::from(taken.is_some()));
        drop(taken);
        assert_eq!(limiter.in_flight(), 0);
        assert_eq!(limiter.late_releases(), 0);
    });
}

#[test]
fn two_takers_at_the_limit_get_one_permit_between_them() {
    loom::model(|| {
        let limiter = single(1);
        let handles = [0, 1].map(|_| {
            let limiter = limiter.clone();
            thread::spawn(move || limiter.try_acquire_at(SEC, 1).unwrap().ok())
        });
        let permits = handles.map(|h| h.join().unwrap());
        assert_eq!(permits.iter().filter(|p| p.is_some()).count(), 1);
        drop(permits);
        assert_eq!(limiter.in_flight(), 0);
    });
}

#[test]
fn takes_and_releases_on_both_sides_of_an_epoch_boundary_return_the_count_to_zero() {
    loom::model(|| {
        let limiter = single(2);
        // One thread's clock reads the end of epoch 0, the other's the start of epoch 1: the
        // lagging taker may be counted in the newer epoch, and its release must still find it.
        let handles = [9 * SEC, 10 * SEC].map(|now| {
            let limiter = limiter.clone();
            thread::spawn(move || {
                let permit = limiter.try_acquire_at(now, 1).unwrap().unwrap();
                drop(permit);
            })
        });
        for handle in handles {
            handle.join().unwrap();
        }
        assert_eq!(limiter.in_flight(), 0);
        assert_eq!(limiter.late_releases(), 0);
    });
}

#[test]
fn a_keyed_release_racing_a_take_on_the_same_key_keeps_the_count_exact() {
    loom::model(|| {
        let limits = keyed(1);
        let held = limits.try_acquire_at(&7, SEC, 1).unwrap().unwrap();
        let releaser = thread::spawn(move || drop(held));
        let taker = {
            let limits = limits.clone();
            thread::spawn(move || limits.try_acquire_at(&7, SEC, 1).unwrap().ok())
        };
        releaser.join().unwrap();
        let taken = taker.join().unwrap();
        assert_eq!(limits.in_flight(&7), u64::from(taken.is_some()));
        drop(taken);
        assert_eq!(limits.in_flight(&7), 0);
        assert_eq!(limits.late_releases(), 0);
    });
}

#[test]
fn a_release_racing_an_eviction_of_its_key_loses_nothing_and_evicts_no_holder() {
    loom::model(|| {
        let limits = keyed(1);
        // Three fillers and key 100 hold permits: the window is full of live keys.
        let fillers: Vec<_> = (1..=3u64)
            .map(|k| limits.try_acquire_at(&k, SEC, 1).unwrap().unwrap())
            .collect();
        let held = limits.try_acquire_at(&100, SEC, 1).unwrap().unwrap();
        assert_eq!(limits.table().len(), 4);
        // Key 100's holder finishes while new key 200 arrives: 200 takes 100's slot if it sees it
        // idle, else the stripe's overflow count.
        let releaser = thread::spawn(move || drop(held));
        let newcomer = {
            let limits = limits.clone();
            thread::spawn(move || limits.try_acquire_at(&200, SEC, 1).unwrap().unwrap())
        };
        releaser.join().unwrap();
        let permit = newcomer.join().unwrap();
        for k in 1..=3u64 {
            assert_eq!(limits.in_flight(&k), 1, "filler {k} kept its permit");
        }
        assert_eq!(limits.in_flight(&100), 0);
        drop(permit);
        assert_eq!(limits.in_flight(&200), 0);
        assert_eq!(limits.late_releases(), 0);
        // Every count is back: key 100 (or 200) gets a permit again, in a slot or the overflow.
        drop(fillers);
        assert!(limits.try_acquire_at(&100, SEC, 1).unwrap().is_ok());
    });
}

#[test]
fn a_take_on_an_idle_key_racing_its_eviction_by_a_new_key_admits_both_and_gives_both_back() {
    loom::model(|| {
        let limits = keyed(1);
        let fillers: Vec<_> = (1..=3u64)
            .map(|k| limits.try_acquire_at(&k, SEC, 1).unwrap().unwrap())
            .collect();
        // Key 100 held a permit and gave it back: idle, evictable.
        drop(limits.try_acquire_at(&100, SEC, 1).unwrap().unwrap());
        let handles = [100u64, 200].map(|key| {
            let limits = limits.clone();
            thread::spawn(move || limits.try_acquire_at(&key, SEC, 1).unwrap().unwrap())
        });
        let permits = handles.map(|h| h.join().unwrap());
        // Exactly one of them found no room and holds the overflow count.
        assert_eq!(permits.iter().filter(|p| p.in_overflow()).count(), 1);
        for k in 1..=3u64 {
            assert_eq!(limits.in_flight(&k), 1);
        }
        drop(permits);
        assert_eq!(limits.late_releases(), 0);
        assert_eq!(limits.in_flight(&100) + limits.in_flight(&200), 0);
        // The idle slot is free again (key 300 takes it) and the overflow count came back too
        // (key 400, finding the window full of holders, gets it).
        let slot = limits.try_acquire_at(&300, SEC, 1).unwrap().unwrap();
        assert!(!slot.in_overflow());
        assert!(
            limits
                .try_acquire_at(&400, SEC, 1)
                .unwrap()
                .unwrap()
                .in_overflow()
        );
        drop((slot, fillers));
    });
}
