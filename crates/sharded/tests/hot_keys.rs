//! Hot-key promotion (`src/hot.rs`): a promoted key's admissions against a lone GCRA limiter.
//!
//! * One thread: the promoted key's striped limiter stays on its alone path (plain GCRA on its
//!   shared word), so promotion and demotion at any point of a random trace change no decision: the
//!   keyed table with promotions decides exactly as a lone GCRA state word does.
//! * Several threads: the admitted stream conforms to the exact GCRA (fed only the admitted
//!   requests, an exact GCRA admits every one), and at a frozen instant a key admits at most its
//!   burst.

use std::sync::Barrier;
use std::time::Duration;

use proptest::prelude::*;
use tollgate_core::{Algorithm, Gcra, ManualClock, Nanos, Quota};
use tollgate_sharded::{HotKeyConfig, KeyedLimiter};

const MS: Nanos = 1_000_000;
const SEC: Nanos = 1_000 * MS;

type Table = KeyedLimiter<u64, Gcra, ManualClock>;

fn table(quota: Quota, config: HotKeyConfig) -> Table {
    KeyedLimiter::builder_with_clock(quota, 1_000, ManualClock::new())
        .hasher_seed(7)
        .promote_hot_keys(config)
        .build()
        .unwrap()
}

/// An exact GCRA fed only the admitted requests: panics (with the step) if it refuses one.
struct Conformance {
    gcra: Gcra,
    tat: u64,
}

impl Conformance {
    fn new(quota: Quota) -> Self {
        Conformance {
            gcra: Gcra::from_quota(quota).unwrap(),
            tat: 0,
        }
    }

    fn admitted(&mut self, now: Nanos, cost: u64) -> bool {
        let transition = self.gcra.decide(self.tat, now, cost).unwrap();
        if let Some(next) = transition.next {
            self.tat = next;
        }
        transition.decision.is_allowed()
    }
}

#[test]
fn promotion_carries_the_slot_state_exactly() {
    let quota = Quota::per_second(10).unwrap();
    let limiter = table(quota, HotKeyConfig::default());
    let now = 5 * SEC;
    for _ in 0..4 {
        assert!(limiter.check_key_at(&1, now, 1).unwrap().is_allowed());
    }
    assert!(limiter.promote_key(&1));
    assert!(!limiter.promote_key(&1), "already promoted");
    assert_eq!(limiter.promoted_keys(), 1);
    assert!(limiter.peek_key_at(&1, now, 6).unwrap().is_allowed());
    assert!(!limiter.peek_key_at(&1, now, 7).unwrap().is_allowed());
    let admitted = (0..20)
        .filter(|_| limiter.check_key_at(&1, now, 1).unwrap().is_allowed())
        .count();
    assert_eq!(admitted, 6, "10 in all, 4 of them before the promotion");
    // Another key is untouched.
    assert!(limiter.check_key_at(&2, now, 10).unwrap().is_allowed());
}

#[test]
fn a_cooled_key_is_demoted_by_its_next_decision_with_a_full_bucket() {
    let quota = Quota::per_second(10).unwrap();
    let limiter = table(quota, HotKeyConfig::default().cool_after(Duration::ZERO));
    assert!(limiter.check_key_at(&1, SEC, 10).unwrap().is_allowed());
    assert!(limiter.promote_key(&1));
    assert!(!limiter.check_key_at(&1, SEC, 1).unwrap().is_allowed());
    // 1 s later the bucket is full: the decision demotes, then admits a whole burst on the slot.
    assert!(limiter.check_key_at(&1, 2 * SEC, 10).unwrap().is_allowed());
    assert_eq!(limiter.promoted_keys(), 0);
    assert_eq!(limiter.promotions(), 1);
    assert!(!limiter.check_key_at(&1, 2 * SEC, 1).unwrap().is_allowed());
}

#[test]
fn a_quota_change_demotes_and_carries_the_promoted_key() {
    let limiter = table(Quota::per_second(10).unwrap(), HotKeyConfig::default());
    let now = limiter.now();
    assert!(limiter.check_key_at(&1, now, 10).unwrap().is_allowed());
    assert!(limiter.promote_key(&1));
    limiter.set_quota(Quota::per_minute(10).unwrap()).unwrap();
    assert_eq!(limiter.promoted_keys(), 0);
    // It had nothing left, so it has nothing now.
    assert!(!limiter.check_key_at(&1, now, 1).unwrap().is_allowed());
    assert!(limiter.check_key_at(&2, now, 10).unwrap().is_allowed());
}

#[test]
fn an_override_change_demotes_and_carries_the_promoted_key() {
    let limiter = table(Quota::per_second(10).unwrap(), HotKeyConfig::default());
    let now = limiter.now();
    assert!(limiter.check_key_at(&1, now, 10).unwrap().is_allowed());
    assert!(limiter.promote_key(&1));
    limiter
        .set_override(&1, Quota::per_second(20).unwrap())
        .unwrap();
    assert_eq!(limiter.promoted_keys(), 0);
    assert!(!limiter.check_key_at(&1, now, 1).unwrap().is_allowed());
}

#[test]
fn refunds_are_refused_and_charges_counted_while_promoted() {
    let limiter = table(Quota::per_second(10).unwrap(), HotKeyConfig::default());
    let now = 5 * SEC;
    assert!(limiter.check_key_at(&1, now, 5).unwrap().is_allowed());
    assert!(limiter.promote_key(&1));
    assert!(
        !limiter.refund_key_at(&1, now, 5),
        "stricter: not given back"
    );
    assert!(limiter.charge_key_at(&1, now, 3));
    assert!(limiter.check_key_at(&1, now, 2).unwrap().is_allowed());
    assert!(!limiter.check_key_at(&1, now, 1).unwrap().is_allowed());
}

#[test]
fn promotion_off_or_used_up_changes_nothing() {
    let plain = KeyedLimiter::<u64, Gcra, _>::builder_with_clock(
        Quota::per_second(10).unwrap(),
        100,
        ManualClock::new(),
    )
    .build()
    .unwrap();
    assert!(plain.check_key_at(&1, SEC, 1).unwrap().is_allowed());
    assert!(!plain.promote_key(&1));
    let none = table(
        Quota::per_second(10).unwrap(),
        HotKeyConfig::default().max_promotions(0),
    );
    assert!(none.check_key_at(&1, SEC, 1).unwrap().is_allowed());
    assert!(!none.promote_key(&1));
    let one = table(
        Quota::per_second(10).unwrap(),
        HotKeyConfig::default().max_promotions(1),
    );
    assert!(one.check_key_at(&1, SEC, 1).unwrap().is_allowed());
    assert!(one.check_key_at(&2, SEC, 1).unwrap().is_allowed());
    assert!(one.promote_key(&1));
    assert!(!one.promote_key(&2));
    assert!(one.demote_key_at(&1, SEC));
    assert!(!one.promote_key(&1), "entries are not reused");
}

#[derive(Clone, Debug)]
enum Op {
    Check { dt: Nanos, cost: u64, reserve: u64 },
    Promote,
    Demote,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            8 => (0..40 * MS, 1..4u64, prop_oneof![3 => Just(0u64), 1 => 1..3u64])
                .prop_map(|(dt, cost, reserve)| Op::Check { dt, cost, reserve }),
            1 => Just(Op::Promote),
            1 => Just(Op::Demote),
        ],
        1..200,
    )
}

proptest! {
    /// One thread: the promoted key decides exactly as a lone limiter over any trace of checks,
    /// promotions and demotions (its striped limiter stays on the alone path; hand-overs are exact).
    #[test]
    fn one_thread_decides_exactly_as_a_lone_limiter(ops in ops(), cool in 0..50 * MS) {
        let quota = Quota::per_second(20).unwrap().with_burst(5).unwrap();
        let limiter = table(quota, HotKeyConfig::default().cool_after(Duration::from_nanos(cool)));
        // The lone limiter: one GCRA state word, decided in place.
        let gcra = Gcra::from_quota(quota).unwrap();
        let mut lone_tat = 0;
        let mut conformance = Conformance::new(quota);
        let mut now = SEC;
        for op in ops {
            match op {
                Op::Check { dt, cost, reserve } => {
                    now += dt;
                    let keyed = limiter.check_key_reserving_at(&9, now, cost, reserve).unwrap();
                    let transition = gcra.decide_reserving(lone_tat, now, cost, reserve).unwrap();
                    lone_tat = transition.next.unwrap_or(lone_tat);
                    let alone = transition.decision;
                    prop_assert_eq!(keyed.is_allowed(), alone.is_allowed(), "at {} cost {}", now, cost);
                    if keyed.is_allowed() {
                        prop_assert!(conformance.admitted(now, cost));
                    }
                }
                Op::Promote => { limiter.promote_key(&9); }
                Op::Demote => { limiter.demote_key_at(&9, now); }
            }
        }
    }
}

proptest! {
    /// Cold keys beside a promoted one decide exactly as lone limiters (one per key), and so does the
    /// promoted key: promotion touches no other key's slot.
    #[test]
    fn cold_keys_beside_a_promoted_key_are_unchanged(
        steps in prop::collection::vec((0..20 * MS, 0..6u64, 1..3u64), 1..200),
    ) {
        let quota = Quota::per_second(20).unwrap().with_burst(4).unwrap();
        let limiter = table(quota, HotKeyConfig::default());
        let gcra = Gcra::from_quota(quota).unwrap();
        let mut lone = [0u64; 6];
        let mut now = SEC;
        assert!(limiter.check_key_at(&0, now, 1).unwrap().is_allowed());
        lone[0] = gcra.decide(0, now, 1).unwrap().next.unwrap();
        prop_assert!(limiter.promote_key(&0));
        for (dt, key, cost) in steps {
            now += dt;
            let keyed = limiter.check_key_at(&key, now, cost).unwrap();
            let transition = gcra.decide(lone[key as usize], now, cost).unwrap();
            lone[key as usize] = transition.next.unwrap_or(lone[key as usize]);
            prop_assert_eq!(keyed.is_allowed(), transition.decision.is_allowed(), "key {} at {}", key, now);
        }
    }
}

/// Several threads on one promoted key (and on a key promoted by detection): at a frozen instant at
/// most the burst, and the whole admitted stream conforms to the exact GCRA.
#[test]
fn many_threads_on_a_hot_key_never_admit_more_than_a_lone_limiter() {
    const THREADS: usize = 4;
    let quota = Quota::per_second(1_000).unwrap().with_burst(200).unwrap();
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<u64, Gcra, _>::builder_with_clock(quota, 1_000, clock.clone())
        .hasher_seed(3)
        .promote_hot_keys(HotKeyConfig::default().failures(2).stripes(4))
        .build()
        .unwrap();
    let mut conformance = Conformance::new(quota);
    for round in 0..40u64 {
        // Rounds 0.05 s apart: 50 units refill between rounds (a quarter of the burst).
        let now = SEC + round * 50 * MS;
        clock.set(now);
        if round == 10 {
            assert!(limiter.promote_key(&1) || limiter.promoted_keys() == 1);
        }
        let barrier = Barrier::new(THREADS);
        let admitted: u64 = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..THREADS)
                .map(|_| {
                    scope.spawn(|| {
                        barrier.wait();
                        (0..150)
                            .filter(|_| limiter.check_key_at(&1, now, 1).unwrap().is_allowed())
                            .count() as u64
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        for _ in 0..admitted {
            assert!(
                conformance.admitted(now, 1),
                "round {round}: {admitted} admitted, more than an exact GCRA allows"
            );
        }
    }
    assert!(limiter.promotions() >= 1);
}
