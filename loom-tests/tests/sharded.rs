//! Loom models of tollgate-sharded's keyed table: each a named scenario with the invariant it checks.
//!
//! Under `--cfg tollgate_loom` the table's 128-bit slot cell is a loom mutex around a `u128` (loom has no
//! 128-bit atomic; see `crates/sharded/src/sync.rs`), the stripe insert lock a loom mutex, and the core's
//! overflow state a loom atomic, so every access to them is a point where loom switches threads.
//! Tables are tiny (one stripe of 4 slots, every key's probe window covering all of them) so the models
//! stay small and a full table is easy to arrange.
#![cfg(tollgate_loom)]

use loom::sync::Arc;
use loom::thread;
use tollgate_core::{Decision, Gcra, ManualClock, Nanos, Quota};
use tollgate_sharded::KeyedLimiter;

const SEC: Nanos = 1_000_000_000;

type Table = KeyedLimiter<u64, Gcra, ManualClock>;

fn table(quota: Quota) -> Arc<Table> {
    let limiter = KeyedLimiter::builder_with_clock(quota, 2, ManualClock::new())
        .stripes(1)
        .window(4)
        .hasher_seed(1)
        .build()
        .unwrap();
    assert_eq!(limiter.slots(), 4);
    Arc::new(limiter)
}

/// Runs one `check_key_at(key, now, 1)` per entry of `keys`, each on its own thread.
fn race(limiter: &Arc<Table>, keys: [u64; 2], now: Nanos) -> [Decision; 2] {
    let handles = keys.map(|key| {
        let limiter = limiter.clone();
        thread::spawn(move || limiter.check_key_at(&key, now, 1).unwrap())
    });
    handles.map(|h| h.join().unwrap())
}

#[test]
fn two_threads_inserting_one_new_key_make_one_slot_and_count_both_admissions() {
    loom::model(|| {
        let limiter = table(Quota::per_second(1).unwrap().with_burst(3).unwrap());
        let [a, b] = race(&limiter, [7, 7], 5 * SEC);
        assert!(a.is_allowed() && b.is_allowed());
        // The two admissions were applied one after the other to one state: 2 then 1 left.
        let mut remaining = [a.remaining(), b.remaining()];
        remaining.sort_unstable();
        assert_eq!(remaining, [1, 2]);
        assert_eq!(limiter.len(), 1);
        assert_eq!(limiter.overflow_decisions(), 0);
        assert_eq!(limiter.check_key_at(&7, 5 * SEC, 1).unwrap().remaining(), 0);
        assert!(!limiter.check_key_at(&7, 5 * SEC, 1).unwrap().is_allowed());
    });
}

#[test]
fn eviction_racing_an_admission_on_the_evicted_key_loses_nothing_and_never_over_admits() {
    loom::model(|| {
        // Burst 1 per second: a key admitted at t is fresh again at t + 1 s.
        let limiter = table(Quota::per_second(1).unwrap());
        // Key 100 goes idle at 1 s; three fillers stay live until 1.5 s; the table is full.
        assert!(limiter.check_key_at(&100, 0, 1).unwrap().is_allowed());
        for filler in 1..=3u64 {
            assert!(
                limiter
                    .check_key_at(&filler, SEC / 2, 1)
                    .unwrap()
                    .is_allowed()
            );
        }
        assert_eq!(limiter.len(), 4);
        // At 1 s: an admission on key 100 races new key 200, whose insert may evict key 100.
        let [old, new] = race(&limiter, [100, 200], SEC);
        // Both are owed one admission (key 100 is fresh, key 200 new): neither may be lost...
        assert!(old.is_allowed() && new.is_allowed());
        // ...and exactly one of them found no room and used the stripe's overflow state.
        assert_eq!(limiter.overflow_decisions(), 1);
        // No over-admission: each key has used its burst of 1 at this instant, wherever it lives.
        assert!(!limiter.check_key_at(&100, SEC, 1).unwrap().is_allowed());
        assert!(!limiter.check_key_at(&200, SEC, 1).unwrap().is_allowed());
        // Live keys were neither evicted nor reset.
        for filler in 1..=3u64 {
            assert!(!limiter.check_key_at(&filler, SEC, 1).unwrap().is_allowed());
        }
        assert_eq!(limiter.len(), 4);
    });
}

#[test]
fn a_receipt_refund_racing_the_eviction_of_its_key_gives_the_new_key_nothing() {
    loom::model(|| {
        // Burst 2 per second: key 100 spends it at 0 and is fresh again at 2 s.
        let limiter = table(Quota::per_second(1).unwrap().with_burst(2).unwrap());
        let (spent, receipt) = limiter.check_key_at_with_receipt(&100, 0, 2).unwrap();
        assert!(spent.is_allowed());
        for filler in 1..=3u64 {
            assert!(
                limiter
                    .check_key_at(&filler, 2 * SEC, 2)
                    .unwrap()
                    .is_allowed()
            );
        }
        // At 2 s (key 100 fresh, the fillers live): the refund of key 100's admission, made at 0,
        // races new key 200, whose insert evicts key 100 and spends key 200's burst.
        let refund = {
            let limiter = limiter.clone();
            thread::spawn(move || limiter.refund_receipt_at(receipt, 0, 2))
        };
        let insert = {
            let limiter = limiter.clone();
            thread::spawn(move || limiter.check_key_at(&200, 2 * SEC, 2).unwrap())
        };
        let _ = refund.join().unwrap();
        assert!(insert.join().unwrap().is_allowed());
        assert_eq!(limiter.overflow_decisions(), 0);
        // Whichever came first, key 200's slot got none of key 100's units back.
        assert!(!limiter.check_key_at(&200, 2 * SEC, 1).unwrap().is_allowed());
        for filler in 1..=3u64 {
            assert!(
                !limiter
                    .check_key_at(&filler, 2 * SEC, 1)
                    .unwrap()
                    .is_allowed()
            );
        }
    });
}

#[test]
fn a_stripe_insert_racing_a_lookup_of_another_key_disturbs_neither() {
    loom::model(|| {
        let limiter = table(Quota::per_second(1).unwrap().with_burst(3).unwrap());
        assert_eq!(limiter.check_key_at(&1, 0, 1).unwrap().remaining(), 2);
        // Key 1 is looked up lock-free while key 2 is inserted under the stripe lock.
        let [known, inserted] = race(&limiter, [1, 2], 0);
        assert_eq!(known.remaining(), 1);
        assert_eq!(inserted.remaining(), 2);
        assert_eq!(limiter.len(), 2);
        assert_eq!(limiter.overflow_decisions(), 0);
        assert_eq!(limiter.check_key_at(&1, 0, 1).unwrap().remaining(), 0);
        assert_eq!(limiter.check_key_at(&2, 0, 1).unwrap().remaining(), 1);
    });
}

// ---- Override tiers: the slot's orderings ----------------------------------------------------------
//
// Under `--cfg tollgate_loom` the slot is a loom atomic (see crates/sharded/src/sync.rs), the override
// quota cells are loom-visible, and reading a tier whose quota is not yet visible panics, so these
// models fail when the edge that publishes an override tier's quota is missing.

#[test]
fn a_lookup_racing_set_override_decides_with_a_published_quota() {
    loom::model(|| {
        let limiter = table(Quota::per_second(1).unwrap().with_burst(3).unwrap());
        assert!(limiter.check_key_at(&7, 0, 1).unwrap().is_allowed());
        let premium = Quota::per_second(1).unwrap().with_burst(10).unwrap();
        let setter = {
            let limiter = limiter.clone();
            thread::spawn(move || limiter.set_override(&7, premium))
        };
        // The lookup finds the slot with or without the tier (or its CAS fails on the re-tagged word
        // and re-decides with the tier it got back): either way its quota must be readable.
        let decision = limiter.check_key_at(&7, 0, 1).unwrap();
        setter.join().unwrap().unwrap();
        assert!(decision.is_allowed());
        // The override carries the key over as-is in units (it had 2 of 3 left, or 1 after the
        // lookup, and keeps that under burst 10), so the lookup leaves 1 whichever quota decided it.
        assert_eq!(decision.remaining(), 1);
        assert_eq!(*limiter.quota_for(&7), premium);
        // Both admissions are in the state word, whichever quota decided the second.
        assert_eq!(limiter.check_key_at(&7, 0, 1).unwrap().remaining(), 0);
        assert_eq!(limiter.len(), 1);
    });
}

#[test]
fn set_override_racing_an_eviction_of_its_key_pins_it_or_reports_the_full_window() {
    loom::model(|| {
        // Key 100 is idle (fresh) at 1 s, three fillers are live until 1.5 s: the window is full.
        let limiter = table(Quota::per_second(1).unwrap());
        assert!(limiter.check_key_at(&100, 0, 1).unwrap().is_allowed());
        for filler in 1..=3u64 {
            assert!(
                limiter
                    .check_key_at(&filler, SEC / 2, 1)
                    .unwrap()
                    .is_allowed()
            );
        }
        limiter.clock().set(SEC);
        let premium = Quota::per_second(1).unwrap().with_burst(5).unwrap();
        let setter = {
            let limiter = limiter.clone();
            thread::spawn(move || limiter.set_override(&100, premium))
        };
        // New key 200 needs a slot: it may evict key 100 only while 100 is unpinned.
        let new = limiter.check_key_at(&200, SEC, 1).unwrap();
        let pinned = setter.join().unwrap();
        assert!(new.is_allowed());
        match pinned {
            Ok(()) => {
                // Pinned first: 200 found no room and went to the overflow state.
                assert_eq!(*limiter.quota_for(&100), premium);
                assert_eq!(limiter.overflow_decisions(), 1);
                assert_eq!(limiter.check_key_at(&100, SEC, 1).unwrap().remaining(), 4);
            }
            Err(error) => {
                // Evicted first: no slot left for 100, and nothing was pinned or lost.
                assert_eq!(error, tollgate_sharded::KeyedError::WindowFull);
                assert_eq!(*limiter.quota_for(&100), *limiter.quota());
                assert_eq!(limiter.overflow_decisions(), 0);
                assert!(!limiter.check_key_at(&200, SEC, 1).unwrap().is_allowed());
            }
        }
        assert_eq!(limiter.len(), 4);
    });
}

// ---- Changing the default quota: the carry-over's tiers and orderings -------------------------------
//
// `set_default` publishes a new generation under the stripe lock and carries every word over; a word
// still in the old generation's tier is decided as its carried-over state. Any decision that read the
// generation before the word, or a word without the edge that publishes its generation, would decide
// a carried word under the old quota (or an old word under the new one) and could over-admit.

/// A key of `old` that spent all but one unit at a frozen instant; two threads take a unit each while
/// the main thread changes the quota to `new`. The key had 1 left: at most 1 more is admitted.
fn racing_a_quota_change(old: Quota, new: Quota) {
    loom::model(move || {
        let limiter = table(old);
        assert!(
            limiter
                .check_key_at(&7, 0, old.burst() - 1)
                .unwrap()
                .is_allowed()
        );
        let deciders: Vec<_> = (0..2)
            .map(|_| {
                let limiter = limiter.clone();
                thread::spawn(move || limiter.check_key_at(&7, 0, 1).unwrap().is_allowed())
            })
            .collect();
        limiter.set_quota(new).unwrap();
        let admitted = deciders
            .into_iter()
            .filter_map(|h| h.join().unwrap().then_some(()))
            .count();
        assert!(admitted <= 1, "{admitted} admitted; the key had 1 left");
        assert!(!limiter.check_key_at(&7, 0, 1).unwrap().is_allowed() || admitted == 0);
    });
}

/// Tighter and deeper (1/s burst 3 to 1/min burst 10): the old word read in place under the new
/// quota would hand the key 9 more at once; carried over as-is it keeps its 1.
#[test]
fn a_lookup_racing_a_tightening_quota_change_never_admits_more_than_the_key_had() {
    racing_a_quota_change(
        Quota::per_second(1).unwrap().with_burst(3).unwrap(),
        Quota::per_minute(1).unwrap().with_burst(10).unwrap(),
    );
}

/// Looser and shallower (1/min burst 10 to 1/s burst 3): a carried word read under the old quota
/// (a decision that saw the new word but not the new generation) would hand the key 9 more, so this
/// needs the Release of a tier-changing exchange and the reader's word-then-generation order.
#[test]
fn a_lookup_racing_a_loosening_quota_change_never_admits_more_than_the_key_had() {
    racing_a_quota_change(
        Quota::per_minute(1).unwrap().with_burst(10).unwrap(),
        Quota::per_second(1).unwrap().with_burst(3).unwrap(),
    );
}
