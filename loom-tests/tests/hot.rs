//! Loom models of hot-key promotion in tollgate-sharded's keyed table (`crates/sharded/src/hot.rs`):
//! a key handed from its slot to a striped limiter and back while decisions on it go on. Each checks
//! that the key never admits more than its burst at a frozen instant, and that the hand-over loses
//! nothing: after the race, draining the key at the same instant makes the total exactly the burst.
//!
//! Tables are tiny (one stripe of 4 slots) and each promoted key's striped limiter has one stripe
//! (under loom every thread is on stripe 0 anyway).
#![cfg(tollgate_loom)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use tollgate_core::{Gcra, ManualClock, Nanos, Quota};
use tollgate_sharded::{HotKeyConfig, KeyedLimiter};

const SEC: Nanos = 1_000_000_000;

type Table = KeyedLimiter<u64, Gcra, ManualClock>;

/// A table whose key `7` has burst `burst` per second; promotion by hand only unless `failures`.
fn table(burst: u64, failures: u64) -> Arc<Table> {
    let quota = Quota::per_second(1).unwrap().with_burst(burst).unwrap();
    let limiter = KeyedLimiter::builder_with_clock(quota, 2, ManualClock::new())
        .stripes(1)
        .window(4)
        .hasher_seed(1)
        .promote_hot_keys(
            HotKeyConfig::default()
                .failures(failures)
                .within(Duration::from_secs(3_600))
                .stripes(1)
                .cool_after(Duration::ZERO),
        )
        .build()
        .unwrap();
    Arc::new(limiter)
}

/// Cost-1 checks of key 7 at `now` until the first denial (at most `max`); how many were admitted.
fn drain(limiter: &Table, now: Nanos, max: u64) -> u64 {
    let mut admitted = 0;
    while admitted < max && limiter.check_key_at(&7, now, 1).unwrap().is_allowed() {
        admitted += 1;
    }
    admitted
}

fn admitted_by(limiter: &Arc<Table>, now: Nanos, checks: usize) -> thread::JoinHandle<u64> {
    let limiter = limiter.clone();
    thread::spawn(move || {
        (0..checks)
            .filter(|_| limiter.check_key_at(&7, now, 1).unwrap().is_allowed())
            .count() as u64
    })
}

#[test]
fn promotion_racing_decisions_carries_the_state_exactly() {
    loom::model(|| {
        let limiter = table(3, u64::MAX);
        let now = 5 * SEC;
        assert!(limiter.check_key_at(&7, now, 1).unwrap().is_allowed());
        let promoter = {
            let limiter = limiter.clone();
            thread::spawn(move || limiter.promote_key(&7))
        };
        let decider = admitted_by(&limiter, now, 2);
        assert!(
            promoter.join().unwrap(),
            "the key is in the table: it is promoted"
        );
        let raced = decider.join().unwrap();
        assert_eq!(
            raced, 2,
            "two of the three units were left, before or after the promotion"
        );
        assert_eq!(limiter.promoted_keys(), 1);
        assert_eq!(drain(&limiter, now, 4), 0, "never more than the burst");
    });
}

#[test]
fn a_cooled_demotion_racing_a_decision_hands_back_a_full_bucket() {
    loom::model(|| {
        let limiter = table(2, u64::MAX);
        assert!(limiter.check_key_at(&7, SEC, 2).unwrap().is_allowed());
        assert!(limiter.promote_key(&7));
        // Two seconds on the bucket is full again (and cool, cool_after 0): each thread's decision
        // may demote; the other decides on the slot or on the retired limiter.
        let now = 3 * SEC;
        let a = admitted_by(&limiter, now, 1);
        let b = admitted_by(&limiter, now, 1);
        let raced = a.join().unwrap() + b.join().unwrap();
        let rest = drain(&limiter, now, 4);
        assert_eq!(
            raced + rest,
            2,
            "exactly the burst: nothing lost, nothing duplicated"
        );
    });
}

#[test]
fn a_promotion_by_detection_racing_a_decision_never_admits_more_than_the_burst() {
    loom::model(|| {
        // The first failed exchange on the key's slot promotes it, under the racing decisions.
        let limiter = table(3, 1);
        let now = 5 * SEC;
        assert!(limiter.check_key_at(&7, now, 1).unwrap().is_allowed());
        let a = admitted_by(&limiter, now, 1);
        let b = admitted_by(&limiter, now, 1);
        let raced = a.join().unwrap() + b.join().unwrap();
        assert_eq!(raced, 2);
        assert!(limiter.promotions() <= 1);
        if limiter.promoted_keys() == 1 {
            PROMOTED_BY_DETECTION.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        assert_eq!(drain(&limiter, now, 4), 0, "never more than the burst");
    });
    // Some explored interleaving had the failed exchange that promotes (the model races it).
    assert!(PROMOTED_BY_DETECTION.load(std::sync::atomic::Ordering::Relaxed));
}

/// Set by an interleaving of the detection model in which the key was promoted (std, outside loom).
static PROMOTED_BY_DETECTION: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);
