//! Loom models of a settlement racing a check on the same key (`Policy::reserve` / `settle`): the
//! give-back and the overdraft charge go through the same CAS loop as decisions, so in every
//! interleaving the check sees the state either before or after the settlement, never a torn or
//! lost update, and the final state counts exactly what was settled plus what the check admitted.
#![cfg(tollgate_loom)]

use loom::sync::Arc;
use loom::thread;
use tollgate_core::{ManualClock, Nanos};
use tollgate_policy::{Policy, PolicyConfig};

const NOW: Nanos = 5_000_000_000;
const USER: [(&str, &str); 1] = [("user", "a")];

/// One keyed GCRA rule: 10 per second (`T` = 100 ms), burst 4.
fn policy() -> Arc<Policy<ManualClock>> {
    let config = PolicyConfig::from_toml(
        r#"
        metrics = false
        [[rules]]
        name = "per_user"
        match = { user = "any" }
        key = ["user"]
        limit = 10
        period = "1s"
        burst = 4
        capacity = 4
        "#,
    )
    .unwrap();
    Arc::new(Policy::with_clock(config, ManualClock::new()).unwrap())
}

/// Reserves `estimate`, then races `settle(actual)` against `check(2)` at `NOW`. Returns whether
/// the check was admitted and the wait for one more unit afterwards, in intervals.
fn race(estimate: u64, actual: u64) -> (bool, u64) {
    let p = policy();
    let reservation = p
        .reserve_at(&USER, NOW, estimate)
        .unwrap()
        .reservation
        .unwrap();
    let settler = {
        let p = p.clone();
        thread::spawn(move || {
            p.settle_at(reservation, NOW, actual);
        })
    };
    let checker = {
        let p = p.clone();
        thread::spawn(move || p.check_at(&USER, NOW, 2).unwrap().is_allowed())
    };
    settler.join().unwrap();
    let admitted = checker.join().unwrap();
    let wait = p
        .peek_rule_at("per_user", &USER, NOW, 1)
        .unwrap()
        .unwrap()
        .retry_after()
        .map_or(0, |d| d.as_nanos() as u64 / 100_000_000);
    (admitted, wait)
}

#[test]
fn a_give_back_racing_a_check_is_seen_whole_or_not_at_all() {
    loom::model(|| {
        // 3 of 4 reserved, 1 used: 2 come back. The check of 2 passes only after the settlement.
        let (admitted, wait) = race(3, 1);
        let counted: u64 = 1 + if admitted { 2 } else { 0 };
        // A unit is free now unless all 4 are counted.
        let expected_wait = (counted + 1).saturating_sub(4);
        assert_eq!(wait, expected_wait, "counted {counted}");
    });
}

#[test]
fn an_overdraft_racing_a_check_is_never_lost() {
    loom::model(|| {
        // 2 of 4 reserved, 4 used: 2 charged. The check of 2 passes only before the charge.
        let (admitted, wait) = race(2, 4);
        let counted = 4 + if admitted { 2 } else { 0 };
        assert!(counted <= 4 + 2, "quota + one request's overshoot");
        assert_eq!(
            wait,
            counted + 1 - 4,
            "counted {counted}: every unit is in the state"
        );
    });
}
