//! Concurrency rules in the policy: one decision with the rate rules, config errors, reload.

use tollgate_core::{ManualClock, QuotaError};
use tollgate_policy::{ConfigErrorKind, Policy, PolicyConfig, PolicyError};

fn policy(toml: &str) -> Policy<ManualClock> {
    Policy::with_clock(PolicyConfig::from_toml(toml).unwrap(), ManualClock::new()).unwrap()
}

const ALICE: [(&str, &str); 1] = [("client", "alice")];

#[test]
fn a_rate_denial_gives_the_permits_back() {
    let policy = policy(
        r#"
        [[rules]]
        name = "rate"
        limit = 1
        period = "1s"

        [[concurrency]]
        name = "in_flight"
        match = { client = "any" }
        key = ["client"]
        limit = 5
        capacity = 100
        "#,
    );
    let first = policy.admit(&ALICE, 1).unwrap();
    assert!(first.is_allowed());
    assert_eq!(first.permits(), 1);
    assert_eq!(policy.in_flight("in_flight", &ALICE), Some(1));
    let second = policy.admit(&ALICE, 1).unwrap();
    assert!(!second.is_allowed());
    assert!(!second.denied_by_concurrency());
    assert_eq!(second.decision.rule, Some("rate"));
    assert_eq!(second.permits(), 0);
    assert_eq!(policy.in_flight("in_flight", &ALICE), Some(1));
    drop(first);
    assert_eq!(policy.in_flight("in_flight", &ALICE), Some(0));
}

#[test]
fn a_concurrency_denial_consumes_no_rate_quota_and_gives_earlier_permits_back() {
    let policy = policy(
        r#"
        [[rules]]
        name = "rate"
        limit = 2
        period = "1h"

        [[concurrency]]
        name = "everyone"
        limit = 10

        [[concurrency]]
        name = "per_client"
        match = { client = "any" }
        key = ["client"]
        limit = 1
        capacity = 100
        retry_after = "3s"
        "#,
    );
    let first = policy.admit(&ALICE, 1).unwrap();
    assert!(first.is_allowed());
    assert_eq!(first.permits(), 2);
    let busy = policy.admit(&ALICE, 1).unwrap();
    assert!(busy.denied_by_concurrency());
    assert_eq!(busy.decision.rule, Some("per_client"));
    assert_eq!(busy.decision.quota, None);
    assert_eq!(
        busy.decision.decision.retry_after(),
        Some(std::time::Duration::from_secs(3))
    );
    // The global rule's permit taken before the denial went back.
    assert_eq!(policy.in_flight("everyone", &ALICE), Some(1));
    drop(first);
    // The denied request took no rate unit: two more fit the rate of 2 per hour.
    let again = policy.admit(&ALICE, 1).unwrap();
    assert!(again.is_allowed());
    drop(again);
    assert!(!policy.admit(&ALICE, 1).unwrap().is_allowed());
    assert_eq!(policy.in_flight("everyone", &ALICE), Some(0));
    assert_eq!(policy.in_flight("per_client", &ALICE), Some(0));
}

#[test]
fn a_shadow_rule_never_denies_and_reports_what_it_would_have_done() {
    let policy = policy(
        r#"
        [[concurrency]]
        name = "trial"
        limit = 1
        mode = "shadow"
        "#,
    );
    let first = policy.admit(&ALICE, 1).unwrap();
    let second = policy.admit(&ALICE, 1).unwrap();
    assert!(first.is_allowed() && second.is_allowed());
    assert!(!first.decision.shadow_denied);
    assert!(second.decision.shadow_denied);
}

#[test]
fn a_cost_a_rule_can_never_hold_is_an_error_and_holds_nothing() {
    let policy = policy(
        r#"
        [[concurrency]]
        name = "small"
        limit = 2
        "#,
    );
    assert_eq!(
        policy.admit(&ALICE, 3).unwrap_err(),
        PolicyError::CostExceedsCapacity {
            rule: "small",
            cost: 3,
            capacity: 2
        }
    );
    assert_eq!(policy.in_flight("small", &ALICE), Some(0));
}

fn config_error(toml: &str) -> (Option<String>, &'static str, ConfigErrorKind) {
    let error = PolicyConfig::from_toml(toml)
        .unwrap()
        .validate()
        .unwrap_err();
    (error.rule, error.field, error.kind)
}

#[test]
fn bad_concurrency_rules_are_typed_errors_naming_the_rule_and_field() {
    let (rule, field, kind) = config_error(
        r#"
        [[concurrency]]
        name = "zero"
        limit = 0
        "#,
    );
    assert_eq!(
        (rule.as_deref(), field, kind),
        (
            Some("zero"),
            "limit",
            ConfigErrorKind::Quota(QuotaError::ZeroLimit)
        )
    );
    let (_, field, kind) = config_error(
        r#"
        [[concurrency]]
        name = "huge"
        limit = 2000000
        "#,
    );
    assert_eq!(
        (field, kind),
        (
            "limit",
            ConfigErrorKind::Quota(QuotaError::LimitTooLarge {
                max: tollgate_core::MAX_IN_FLIGHT
            })
        )
    );
    let (_, field, _) = config_error(
        r#"
        [[concurrency]]
        name = "no_hold"
        limit = 1
        max_hold = "0s"
        "#,
    );
    assert_eq!(field, "max_hold");
    let (_, field, kind) = config_error(
        r#"
        [[rules]]
        name = "same"
        limit = 1
        period = "1s"
        [[concurrency]]
        name = "same"
        limit = 1
        "#,
    );
    assert_eq!((field, kind), ("name", ConfigErrorKind::DuplicateName));
    let (_, field, kind) = config_error(
        r#"
        [[concurrency]]
        name = "keyed"
        key = ["client"]
        limit = 1
        capacity = 10
        "#,
    );
    assert_eq!(
        (field, kind),
        ("key", ConfigErrorKind::KeyNotMatched("client".into()))
    );
    let (_, field, kind) = config_error(
        r#"
        [[concurrency]]
        name = "keyed"
        match = { client = "any" }
        key = ["client"]
        limit = 1
        "#,
    );
    assert_eq!((field, kind), ("capacity", ConfigErrorKind::Capacity));
}

#[cfg(feature = "redis")]
#[test]
fn a_redis_policy_refuses_concurrency_rules() {
    let config = PolicyConfig::from_toml(
        r#"
        [[concurrency]]
        name = "in_flight"
        limit = 1
        "#,
    )
    .unwrap();
    let error = config.validate_shared().unwrap_err();
    assert_eq!(error.kind, ConfigErrorKind::ConcurrencyUnsupported);
    assert!(error.to_string().contains("in process"));
}

#[test]
fn a_reload_keeps_a_rules_permits_and_a_permit_of_a_removed_rule_goes_back_to_its_old_table() {
    let config = |limit: u64, key: &str| {
        PolicyConfig::from_toml(&format!(
            r#"
            [[concurrency]]
            name = "in_flight"
            match = {{ client = "any", route = "any" }}
            key = ["{key}"]
            limit = {limit}
            capacity = 100
            "#
        ))
        .unwrap()
    };
    let request = [("client", "alice"), ("route", "/a")];
    let policy = Policy::with_clock(config(2, "client"), ManualClock::new()).unwrap();
    let held = policy.admit(&request, 1).unwrap();
    // Kept (same name, key, capacity) under a new limit: the permit stays counted, and the new
    // limit of 1 is full.
    let report = policy.reload(config(1, "client")).unwrap();
    assert_eq!(report.kept, ["in_flight"]);
    assert_eq!(policy.in_flight("in_flight", &request), Some(1));
    assert!(policy.admit(&request, 1).unwrap().denied_by_concurrency());
    // Rebuilt (a new key): a fresh table; the old permit, dropped later, goes back to the old
    // table and never frees a slot in the new one.
    let report = policy.reload(config(1, "route")).unwrap();
    assert_eq!(report.fresh, ["in_flight"]);
    let new_holder = policy.admit(&request, 1).unwrap();
    assert!(new_holder.is_allowed());
    drop(held);
    assert_eq!(policy.in_flight("in_flight", &request), Some(1));
    assert!(policy.admit(&request, 1).unwrap().denied_by_concurrency());
    // Removed: reported, and its permits may still be dropped safely.
    let report = policy.reload(PolicyConfig::from_toml("").unwrap()).unwrap();
    assert_eq!(report.removed, ["in_flight"]);
    drop(new_holder);
    assert!(policy.admit(&request, 1).unwrap().is_allowed());
}
