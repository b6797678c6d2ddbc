//! `Policy::charge`: a cost charged after the fact with no reservation (the response-path call of
//! a proxy). It reaches every rule that applies, shadow ones included; a key with nothing left goes
//! into debt by exactly the overdraft's refill time; a window counts beyond its limit; a cost of 0
//! changes nothing; an absurd one saturates and keeps the key denied without a panic.

use std::time::Duration;

use tollgate_core::ManualClock;
use tollgate_policy::{Charged, Policy, PolicyConfig};

const SECOND: u64 = 1_000_000_000;

fn policy(toml: &str) -> Policy<ManualClock> {
    Policy::with_clock(PolicyConfig::from_toml(toml).unwrap(), ManualClock::new()).unwrap()
}

const TOKENS: &str = r#"
    [[rules]]
    name = "tokens"
    match = { tenant = "any" }
    key = ["tenant"]
    limit = 10
    period = "10s"
    capacity = 16

    [[rules]]
    name = "window"
    match = { tenant = "any" }
    key = ["tenant"]
    algorithm = "fixed_window"
    limit = 100
    period = "1h"
    capacity = 16

    [[rules]]
    name = "watch"
    match = { tenant = "any" }
    key = ["tenant"]
    limit = 5
    period = "10s"
    mode = "shadow"
    capacity = 16

    [[rules]]
    name = "other"
    match = { route = "any" }
    key = ["route"]
    limit = 1
    period = "1h"
    capacity = 16
"#;

#[test]
fn an_overdraft_puts_the_key_in_debt_by_exactly_its_refill_time() {
    let policy = policy(TOKENS);
    let tenant = [("tenant", "t")];
    let now = policy.now();
    // The whole bucket of 10 (one unit per second), then 13 charged after the fact.
    assert!(policy.check_at(&tenant, now, 10).unwrap().is_allowed());
    let charged = policy.charge_at(&tenant, now, 3);
    assert_eq!(
        charged,
        Charged { cost: 3, rules: 3 },
        "tokens, window, watch"
    );
    // An empty bucket waits 1 s for a unit; 3 units of debt add 3 s: exactly 4 s.
    let denied = policy.check_at(&tenant, now, 1).unwrap();
    assert_eq!(denied.rule, Some("tokens"));
    assert_eq!(denied.decision.retry_after(), Some(Duration::from_secs(4)));
    assert!(
        !policy
            .check_at(&tenant, now + 4 * SECOND - 1, 1)
            .unwrap()
            .is_allowed()
    );
    assert!(
        policy
            .check_at(&tenant, now + 4 * SECOND, 1)
            .unwrap()
            .is_allowed()
    );
    // Another tenant is untouched.
    assert!(
        policy
            .check_at(&[("tenant", "u")], now, 10)
            .unwrap()
            .is_allowed()
    );
}

#[test]
fn a_window_counts_the_charge_beyond_its_limit_and_denies_until_it_resets() {
    let policy = policy(
        r#"
        [[rules]]
        name = "window"
        match = { tenant = "any" }
        key = ["tenant"]
        algorithm = "fixed_window"
        limit = 100
        period = "1h"
        capacity = 16
    "#,
    );
    let tenant = [("tenant", "t")];
    let now = policy.now();
    assert_eq!(policy.charge_at(&tenant, now, 150).rules, 1);
    let denied = policy.check_at(&tenant, now, 1).unwrap();
    assert!(!denied.is_allowed());
    assert_eq!(denied.decision.remaining(), 0);
}

#[test]
fn the_shadow_rule_counts_the_charge_and_shadow_denies_after_it() {
    let policy = policy(TOKENS);
    let tenant = [("tenant", "t")];
    let now = policy.now();
    policy.charge_at(&tenant, now, 5);
    let decided = policy.check_at(&tenant, now, 1).unwrap();
    assert!(decided.is_allowed(), "shadow never denies");
    assert!(
        decided.shadow_denied,
        "the shadow bucket of 5 was spent by the charge"
    );
}

#[test]
fn only_the_rules_that_apply_are_charged() {
    let policy = policy(TOKENS);
    let now = policy.now();
    assert_eq!(policy.charge_at(&[("route", "/a")], now, 1).rules, 1);
    assert!(
        !policy
            .check_at(&[("route", "/a")], now, 1)
            .unwrap()
            .is_allowed()
    );
    assert_eq!(policy.charge_at(&[("nothing", "x")], now, 7).rules, 0);
    assert_eq!(policy.charge_at(&[], now, 7).rules, 0);
}

#[test]
fn a_cost_of_zero_changes_nothing_and_an_absurd_one_saturates() {
    let policy = policy(TOKENS);
    let tenant = [("tenant", "t")];
    let now = policy.now();
    assert_eq!(
        policy.charge_at(&tenant, now, 0),
        Charged { cost: 0, rules: 3 }
    );
    assert_eq!(
        policy
            .check_at(&tenant, now, 1)
            .unwrap()
            .decision
            .remaining(),
        9
    );
    policy.charge_at(&tenant, now, u64::MAX);
    policy.charge_at(&tenant, now, u64::MAX);
    for later in [0, SECOND, 3_600 * SECOND, 365 * 86_400 * SECOND] {
        assert!(
            !policy
                .check_at(&tenant, now + later, 1)
                .unwrap()
                .is_allowed()
        );
    }
}
