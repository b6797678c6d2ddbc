//! Reserve, then settle (`Policy::reserve` / `Policy::settle`): exact give-backs, debt, drops,
//! denials, bad input, and the stated bound checked against a reference model.

use std::time::Duration;

use proptest::prelude::*;
use tollgate_core::{ManualClock, Nanos};
use tollgate_policy::{Policy, PolicyConfig};

const SECOND: Nanos = 1_000_000_000;
/// A start well away from zero, so that no state word is mistaken for a fresh one.
const T0: Nanos = 1_000 * SECOND;

fn policy(toml: &str) -> Policy<ManualClock> {
    Policy::with_clock(PolicyConfig::from_toml(toml).unwrap(), ManualClock::new()).unwrap()
}

/// One keyed rule `tokens` of `limit` per `period` on `algorithm` (and storage).
fn keyed(algorithm: &str, limit: u64, period: &str) -> Policy<ManualClock> {
    policy(&format!(
        r#"
        [[rules]]
        name = "tokens"
        match = {{ tenant = "any" }}
        key = ["tenant"]
        algorithm = "{algorithm}"
        limit = {limit}
        period = "{period}"
        capacity = 64
        "#
    ))
}

const ACME: [(&str, &str); 1] = [("tenant", "acme")];

/// The most `tenant` could take at once now (a peek of cost 0 reports it).
fn left(policy: &Policy<ManualClock>, now: Nanos) -> u64 {
    policy
        .peek_rule_at("tokens", &ACME, now, 0)
        .unwrap()
        .unwrap()
        .remaining()
}

#[test]
fn the_surplus_comes_back_exactly_on_every_algorithm() {
    for algorithm in ["gcra", "leaky_bucket", "fixed_window", "sliding_window"] {
        let policy = keyed(algorithm, 1000, "1m");
        let reserved = policy.reserve_at(&ACME, T0, 800).unwrap();
        assert!(reserved.decision.is_allowed(), "{algorithm}");
        assert_eq!(left(&policy, T0), 200, "{algorithm}");
        let settled = policy.settle_at(reserved.reservation.unwrap(), T0, 300);
        assert_eq!((settled.rules, settled.stale), (1, 0));
        assert_eq!(left(&policy, T0), 700, "{algorithm}: 500 came back");
    }
}

#[test]
fn a_later_settlement_gives_back_only_what_has_not_refilled_already() {
    // 60 per minute: one unit per second. 50 reserved at T0, settled at 10 after 40 s: the bucket
    // had refilled 40 of the 50 by then, so only 10 of the 40 surplus units are still ahead.
    let policy = keyed("gcra", 60, "1m");
    let reserved = policy.reserve_at(&ACME, T0, 50).unwrap();
    let now = T0 + 40 * SECOND;
    assert_eq!(left(&policy, now), 50);
    policy.settle_at(reserved.reservation.unwrap(), now, 10);
    assert_eq!(
        left(&policy, now),
        60,
        "as if 10 had been reserved at T0: full again"
    );
}

#[test]
fn an_overdraft_puts_the_key_in_debt_for_exactly_its_refill_time() {
    // 60 per minute, burst 60: 1 unit per second.
    let policy = keyed("gcra", 60, "1m");
    let reserved = policy.reserve_at(&ACME, T0, 10).unwrap();
    policy.settle_at(reserved.reservation.unwrap(), T0, 90); // 30 beyond the burst
    let denied = policy.check_at(&ACME, T0, 1).unwrap();
    assert_eq!(denied.decision.retry_after(), Some(Duration::from_secs(31)));
    assert!(
        !policy
            .check_at(&ACME, T0 + 30 * SECOND, 1)
            .unwrap()
            .is_allowed()
    );
    assert!(
        policy
            .check_at(&ACME, T0 + 31 * SECOND, 1)
            .unwrap()
            .is_allowed()
    );
}

#[test]
fn a_window_counts_an_overdraft_beyond_its_limit() {
    let policy = keyed("fixed_window", 100, "1m");
    let reserved = policy.reserve_at(&ACME, T0, 10).unwrap();
    policy.settle_at(reserved.reservation.unwrap(), T0, 150);
    assert_eq!(left(&policy, T0), 0);
    assert!(!policy.check_at(&ACME, T0, 1).unwrap().is_allowed());
    // Next window: a fixed window carries no debt.
    let next = (T0 / (60 * SECOND) + 1) * 60 * SECOND;
    assert!(policy.check_at(&ACME, next, 100).unwrap().is_allowed());
}

#[test]
fn a_dropped_reservation_settles_at_its_estimate() {
    let policy = keyed("gcra", 1000, "1m");
    {
        let reserved = policy.reserve_at(&ACME, T0, 600).unwrap();
        assert!(reserved.reservation.is_some());
        // Dropped here: a cancelled request, a panic unwinding, a lost connection.
    }
    assert_eq!(left(&policy, T0), 400, "the estimate stays taken");
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _reserved = policy.reserve_at(&ACME, T0, 300).unwrap();
        panic!("the handler failed");
    }));
    assert!(result.is_err());
    assert_eq!(left(&policy, T0), 100);
}

#[test]
fn a_denied_reservation_takes_nothing_from_any_rule() {
    let policy = policy(
        r#"
        [[rules]]
        name = "tokens"
        match = { tenant = "any" }
        key = ["tenant"]
        limit = 1000
        period = "1m"
        capacity = 64
        [[rules]]
        name = "global"
        limit = 500
        period = "1m"
        "#,
    );
    let bob = [("tenant", "bob")];
    assert!(policy.check_at(&bob, T0, 300).unwrap().is_allowed());
    let reserved = policy.reserve_at(&ACME, T0, 400).unwrap();
    assert!(!reserved.decision.is_allowed());
    assert_eq!(reserved.decision.rule, Some("global"));
    assert!(reserved.reservation.is_none());
    assert_eq!(left(&policy, T0), 1000, "tokens got its 400 back");
    // Both rules settle when admitted.
    let reserved = policy.reserve_at(&ACME, T0, 200).unwrap();
    let reservation = reserved.reservation.unwrap();
    assert_eq!(reservation.rules(), 2);
    assert_eq!(policy.settle_at(reservation, T0, 50).rules, 2);
    assert!(policy.check_at(&ACME, T0, 150).unwrap().is_allowed());
    assert!(!policy.check_at(&ACME, T0, 1).unwrap().is_allowed());
}

#[test]
fn global_and_striped_rules_settle_too() {
    for storage in ["atomic", "striped"] {
        let policy = policy(&format!(
            r#"
            [[rules]]
            name = "tokens"
            limit = 1000
            period = "1m"
            storage = "{storage}"
            stripes = 1
            "#
        ));
        let reserved = policy.reserve_at(&[], T0, 800).unwrap();
        policy.settle_at(reserved.reservation.unwrap(), T0, 100);
        assert!(
            policy.check_at(&[], T0, 900).unwrap().is_allowed(),
            "{storage}"
        );
        assert!(
            !policy.check_at(&[], T0, 1).unwrap().is_allowed(),
            "{storage}"
        );
        let reserved = policy.reserve_at(&[], T0 + 60 * SECOND, 10).unwrap();
        policy.settle_at(reserved.reservation.unwrap(), T0 + 60 * SECOND, 1010);
        assert!(
            !policy
                .check_at(&[], T0 + 60 * SECOND, 1)
                .unwrap()
                .is_allowed(),
            "{storage}: in debt"
        );
    }
}

#[test]
fn bad_actual_costs_never_over_admit_nor_panic() {
    let policy = keyed("gcra", 1000, "1m");
    // Zero: the whole estimate comes back.
    let reserved = policy.reserve_at(&ACME, T0, 700).unwrap();
    policy.settle_at(reserved.reservation.unwrap(), T0, 0);
    assert_eq!(left(&policy, T0), 1000);
    // Absurd: charged saturating; the key stays denied, nothing panics.
    for algorithm in ["gcra", "leaky_bucket", "fixed_window", "sliding_window"] {
        let policy = keyed(algorithm, 1000, "1m");
        let reserved = policy.reserve_at(&ACME, T0, 1).unwrap();
        policy.settle_at(reserved.reservation.unwrap(), T0, u64::MAX);
        let denied = policy.check_at(&ACME, T0 + 10 * SECOND, 1).unwrap();
        assert!(!denied.is_allowed(), "{algorithm}");
    }
    // An estimate of zero still settles every applicable rule.
    let policy = keyed("gcra", 1000, "1m");
    let reserved = policy.reserve_at(&ACME, T0, 0).unwrap();
    policy.settle_at(reserved.reservation.unwrap(), T0, 250);
    assert_eq!(left(&policy, T0), 750);
}

#[test]
fn a_settlement_after_a_reload_that_removed_the_rule_is_a_counted_no_op() {
    let two = r#"
        [[rules]]
        name = "tokens"
        match = { tenant = "any" }
        key = ["tenant"]
        limit = 1000
        period = "1m"
        capacity = 64
        [[rules]]
        name = "global"
        limit = 5000
        period = "1m"
    "#;
    let one = r#"
        [[rules]]
        name = "global"
        limit = 5000
        period = "1m"
    "#;
    let policy = policy(two);
    let reserved = policy.reserve_at(&ACME, T0, 500).unwrap();
    policy
        .reload(PolicyConfig::from_toml(one).unwrap())
        .unwrap();
    let settled = policy.settle_at(reserved.reservation.unwrap(), T0, 100);
    assert_eq!((settled.rules, settled.stale), (2, 1));
    // The kept rule got its 400 back: 4 900 left.
    assert!(policy.check_at(&ACME, T0, 4900).unwrap().is_allowed());
    assert!(!policy.check_at(&ACME, T0, 1).unwrap().is_allowed());
}

/// The reference: GCRA with reserve / settle written from the module docs, on `u128`.
struct Model {
    interval: u128,
    depth: u128,
    tat: u128,
}

impl Model {
    /// `Some(end)` when admitted.
    fn reserve(&mut self, now: u128, cost: u128) -> Option<u128> {
        let new = self.tat.max(now) + cost * self.interval;
        if new > now + self.depth {
            return None;
        }
        if cost > 0 {
            self.tat = new;
        }
        Some(new)
    }

    fn settle(&mut self, now: u128, end: u128, estimate: u128, actual: u128) {
        if actual < estimate {
            let ahead = end.saturating_sub(now) / self.interval;
            let back = (estimate - actual).min(ahead);
            if back > 0 && self.tat > 0 {
                self.tat = self.tat.saturating_sub(back * self.interval);
            }
        } else if actual > estimate {
            self.tat = self.tat.max(now) + (actual - estimate) * self.interval;
        }
    }
}

#[derive(Clone, Debug)]
struct Request {
    gap_ms: u64,
    estimate: u64,
    actual: u64,
    settle_after_ms: u64,
}

fn requests() -> impl Strategy<Value = Vec<Request>> {
    prop::collection::vec(
        (0u64..3_000, 1u64..=100, 0u64..=250, 0u64..5_000).prop_map(
            |(gap_ms, estimate, actual, settle_after_ms)| Request {
                gap_ms,
                estimate,
                actual,
                settle_after_ms,
            },
        ),
        1..120,
    )
}

proptest! {
    /// One key, 100 per minute (burst 100, `T` = 600 ms), requests one after another (each settles
    /// before the next reserves). Every decision matches the reference, and in every interval
    /// `[a, b]` the actual costs of the requests admitted in it total at most
    /// `burst + (b − a) / T + the overshoot of the last of them`.
    #[test]
    fn reserve_and_settle_match_the_reference_and_keep_the_bound(reqs in requests()) {
        let policy = keyed("gcra", 100, "1m");
        let interval: u64 = 600_000_000;
        let mut model = Model { interval: interval.into(), depth: (100 * interval).into(), tat: 0 };
        let mut now = T0;
        let mut admitted: Vec<(Nanos, u64, u64)> = Vec::new(); // (at, actual, overshoot)
        for r in &reqs {
            now += r.gap_ms * 1_000_000;
            let reserved = policy.reserve_at(&ACME, now, r.estimate).unwrap();
            let end = model.reserve(now.into(), r.estimate.into());
            prop_assert_eq!(reserved.decision.is_allowed(), end.is_some());
            let (Some(reservation), Some(end)) = (reserved.reservation, end) else {
                continue;
            };
            admitted.push((now, r.actual, r.actual.saturating_sub(r.estimate)));
            now += r.settle_after_ms * 1_000_000;
            policy.settle_at(reservation, now, r.actual);
            model.settle(now.into(), end, r.estimate.into(), r.actual.into());
            // The state agrees with the reference: the same wait for one more unit.
            let peek = policy.peek_rule_at("tokens", &ACME, now, 1).unwrap().unwrap();
            let expected = (model.tat + model.interval).saturating_sub(u128::from(now) + model.depth);
            let wait = peek.retry_after().map_or(0, |d| d.as_nanos());
            prop_assert_eq!(wait, expected);
        }
        for (i, &(a, ..)) in admitted.iter().enumerate() {
            let mut total = 0u64;
            for &(b, actual, overshoot) in &admitted[i..] {
                total += actual;
                let bound = 100 + (b - a) / interval + overshoot;
                prop_assert!(total <= bound, "{} in [{}, {}] > {}", total, a, b, bound);
            }
        }
    }

    /// Fixed window, 100 per minute: in every aligned window, the actual costs of the requests
    /// admitted in it total at most `limit + the overshoot of the last of them`.
    #[test]
    fn a_fixed_window_keeps_its_bound(reqs in requests()) {
        let policy = keyed("fixed_window", 100, "1m");
        let window = 60 * SECOND;
        let mut now = T0;
        let mut admitted: Vec<(u64, u64, u64)> = Vec::new(); // (window, actual, overshoot)
        for r in &reqs {
            now += r.gap_ms * 1_000_000;
            let reserved = policy.reserve_at(&ACME, now, r.estimate).unwrap();
            let Some(reservation) = reserved.reservation else { continue };
            admitted.push((now / window, r.actual, r.actual.saturating_sub(r.estimate)));
            now += r.settle_after_ms * 1_000_000;
            policy.settle_at(reservation, now, r.actual);
        }
        let mut i = 0;
        while i < admitted.len() {
            let w = admitted[i].0;
            let run: Vec<_> = admitted[i..].iter().take_while(|x| x.0 == w).collect();
            let total: u64 = run.iter().map(|x| x.1).sum();
            let last = run.last().map_or(0, |x| x.2);
            prop_assert!(total <= 100 + last, "window {}: {} > 100 + {}", w, total, last);
            i += run.len();
        }
    }
}
