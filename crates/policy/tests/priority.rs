//! Priority classes: shares of a rule's capacity kept for higher classes (`priority`).

use std::time::Duration;

use tollgate_core::ManualClock;
use tollgate_policy::{ConfigErrorKind, Policy, PolicyConfig, PriorityError};

fn policy(algorithm: &str, priority: &str, extra: &str) -> Policy<ManualClock> {
    let config = PolicyConfig::from_toml(&format!(
        r#"
        {extra}
        [[rules]]
        name = "api"
        match = {{ tenant = "any" }}
        key = ["tenant"]
        algorithm = "{algorithm}"
        limit = 100
        period = "1s"
        capacity = 64
        priority = {priority}
        "#
    ))
    .unwrap();
    Policy::with_clock(config, ManualClock::new()).unwrap()
}

const ONE_CLASS: &str = r#"{ reserve = { critical = "20%" } }"#;
const THREE_CLASSES: &str = r#"{ descriptor = "class", classes = ["critical", "normal", "batch"], reserve = { critical = "20%", normal = "10%" } }"#;

#[test]
fn under_a_flood_of_low_priority_traffic_the_critical_class_keeps_its_share() {
    for algorithm in ["gcra", "sliding_window", "fixed_window"] {
        let policy = policy(algorithm, ONE_CLASS, "");
        let clock = policy.clock().clone();
        let low = [("tenant", "t1")];
        let critical = [("tenant", "t1"), ("priority", "critical")];
        let (mut low_admitted, mut critical_admitted, mut critical_sent) = (0u32, 0u32, 0u32);
        // 10 s; every millisecond 20 low-priority requests (20 000/s, 200 × the rate), and a
        // critical request every 50 ms (20/s: the reserved 20 % of the rate), plus a burst of 20
        // critical requests at once in the middle (the whole reserved share of the capacity).
        for ms in 0..10_000u32 {
            for _ in 0..20 {
                low_admitted += u32::from(policy.check(&low, 1).unwrap().is_allowed());
            }
            let burst = if ms == 5_000 {
                20
            } else {
                u32::from(ms % 50 == 0)
            };
            for _ in 0..burst {
                critical_sent += 1;
                critical_admitted += u32::from(policy.check(&critical, 1).unwrap().is_allowed());
            }
            clock.advance(Duration::from_millis(1));
        }
        assert_eq!(
            critical_admitted, critical_sent,
            "{algorithm}: every critical request got through the flood"
        );
        // No more than the quota allows in all (burst + rate × 10 s), and the flood still got
        // most of what the critical class left: all of it for gcra (a unit kept back and not
        // spent stays in the bucket), less for the windows (a window's unspent reserve expires
        // with it; the sliding window also weighs the previous window's full count).
        let total = low_admitted + critical_admitted;
        assert!(
            total <= 1_100,
            "{algorithm}: {total} admitted in 10 s at 100/s"
        );
        let least = if algorithm == "gcra" { 750 } else { 550 };
        assert!(
            low_admitted >= least,
            "{algorithm}: low class starved: {low_admitted}"
        );
    }
}

#[test]
fn classes_shed_from_the_lowest_up() {
    let policy = policy("gcra", THREE_CLASSES, "");
    let now = policy.now();
    let ask = |class: Option<&'static str>| {
        let mut d = vec![("tenant", "t1")];
        d.extend(class.map(|c| ("class", c)));
        policy.check_at(&d, now, 1).unwrap()
    };
    // 70 units for anyone: batch, requests without a class and unknown classes must leave 30.
    for i in 0..70 {
        let class = [None, Some("batch"), Some("bogus")][i % 3];
        assert!(ask(class).is_allowed(), "unit {i}");
    }
    assert!(!ask(Some("batch")).is_allowed());
    assert!(!ask(None).is_allowed());
    assert!(!ask(Some("bogus")).is_allowed());
    // Normal may go down to the 20 kept for critical.
    for _ in 0..10 {
        let d = ask(Some("normal"));
        assert!(d.is_allowed());
    }
    let refused = ask(Some("normal"));
    assert!(!refused.is_allowed());
    assert_eq!(refused.rule, Some("api"));
    // Critical spends the rest, then the key is empty for everyone.
    for _ in 0..20 {
        assert!(ask(Some("critical")).is_allowed());
    }
    assert!(!ask(Some("critical")).is_allowed());
}

#[test]
fn a_lower_class_sees_its_own_remaining_and_a_denial_writes_nothing() {
    let policy = policy("gcra", ONE_CLASS, "");
    let now = policy.now();
    let low = [("tenant", "t1")];
    let first = policy.check_at(&low, now, 1).unwrap();
    assert_eq!(first.decision.remaining(), 79, "100 − 1 − the 20 kept");
    assert!(policy.check_at(&low, now, 79).unwrap().is_allowed());
    for _ in 0..100 {
        assert!(!policy.check_at(&low, now, 1).unwrap().is_allowed());
    }
    // The refusals consumed nothing: all 20 are still there.
    let critical = [("tenant", "t1"), ("priority", "critical")];
    assert!(policy.check_at(&critical, now, 20).unwrap().is_allowed());
}

#[test]
fn the_class_descriptor_does_not_keep_a_request_from_an_exact_match_rule() {
    let policy = policy("gcra", ONE_CLASS, r#"descriptor_match = "exact""#);
    let now = policy.now();
    let critical = [("tenant", "t1"), ("priority", "critical")];
    assert!(policy.check_at(&critical, now, 100).unwrap().is_allowed());
    let refused = policy.check_at(&critical, now, 1).unwrap();
    assert_eq!(refused.rule, Some("api"), "the rule still applies");
}

#[test]
fn a_bad_priority_is_a_typed_config_error() {
    let reject = |rule: &str| {
        let config = PolicyConfig::from_toml(rule).unwrap();
        Policy::with_clock(config, ManualClock::new()).unwrap_err()
    };
    let error = reject(
        r#"
        [[rules]]
        name = "global"
        limit = 100
        period = "1s"
        priority = { reserve = { critical = "120%" } }
        "#,
    );
    assert_eq!(error.field, "priority");
    assert!(matches!(
        error.kind,
        ConfigErrorKind::Priority(PriorityError::Share { .. })
    ));
    let error = reject(
        r#"
        [[rules]]
        name = "global"
        limit = 100
        period = "1s"
        storage = "striped"
        priority = { reserve = { critical = "20%" } }
        "#,
    );
    assert_eq!(
        error.kind,
        ConfigErrorKind::Priority(PriorityError::Storage)
    );
}

#[test]
fn a_global_rule_keeps_its_share_too() {
    let config = PolicyConfig::from_toml(
        r#"
        [[rules]]
        name = "global"
        limit = 10
        period = "1s"
        priority = { reserve = { critical = "30%" } }
        "#,
    )
    .unwrap();
    let policy = Policy::with_clock(config, ManualClock::new()).unwrap();
    let now = policy.now();
    let admitted = (0..50)
        .filter(|_| policy.check_at(&[], now, 1).unwrap().is_allowed())
        .count();
    assert_eq!(admitted, 7);
    assert!(
        policy
            .check_at(&[("priority", "critical")], now, 3)
            .unwrap()
            .is_allowed()
    );
}

/// A policy with one concurrency rule: 10 in flight per tenant, `priority` as given.
fn in_flight_policy(priority: &str) -> Policy<ManualClock> {
    let config = PolicyConfig::from_toml(&format!(
        r#"
        descriptor_match = "exact"
        [[concurrency]]
        name = "in_flight"
        match = {{ tenant = "any" }}
        key = ["tenant"]
        limit = 10
        max_hold = "60s"
        capacity = 64
        priority = {priority}
        "#
    ))
    .unwrap();
    Policy::with_clock(config, ManualClock::new()).unwrap()
}

#[test]
fn an_in_flight_rule_keeps_its_share_while_a_flood_holds_the_rest() {
    let policy = in_flight_policy(THREE_CLASSES);
    let batch = [("tenant", "t1"), ("class", "batch")];
    let normal = [("tenant", "t1"), ("class", "normal")];
    let critical = [("tenant", "t1"), ("class", "critical")];
    // A flood of batch requests that never finish: they hold 7 of the 10 permits (30 % kept).
    let held: Vec<_> = (0..1_000)
        .map(|_| policy.admit(&batch, 1).unwrap())
        .filter(|a| a.is_allowed())
        .collect();
    assert_eq!(held.len(), 7);
    let refused = policy.admit(&batch, 1).unwrap();
    assert!(refused.denied_by_concurrency());
    // Normal may take one more (it must leave critical's 20 %), then sheds.
    let normal_held = policy.admit(&normal, 1).unwrap();
    assert!(normal_held.is_allowed());
    assert!(!policy.admit(&normal, 1).unwrap().is_allowed());
    // Critical gets the last two, exactly.
    let critical_held: Vec<_> = (0..2)
        .map(|_| policy.admit(&critical, 1).unwrap())
        .collect();
    assert!(critical_held.iter().all(|a| a.is_allowed()));
    assert!(!policy.admit(&critical, 1).unwrap().is_allowed());
    assert_eq!(policy.in_flight("in_flight", &[("tenant", "t1")]), Some(10));
    // The flood's requests finish: their permits come back, and batch is admitted again while
    // the shares above it stay free.
    drop(held);
    assert_eq!(policy.in_flight("in_flight", &[("tenant", "t1")]), Some(3));
    assert!(policy.admit(&batch, 1).unwrap().is_allowed());
    drop(critical_held);
}

#[test]
fn a_bad_in_flight_priority_is_a_typed_config_error() {
    let config = PolicyConfig::from_toml(
        r#"
        [[concurrency]]
        name = "in_flight"
        match = { tenant = "any" }
        key = ["tenant"]
        limit = 10
        capacity = 64
        priority = { reserve = { critical = "120%" } }
        "#,
    )
    .unwrap();
    let error = Policy::with_clock(config, ManualClock::new()).unwrap_err();
    assert_eq!(error.field, "priority");
    assert!(matches!(
        error.kind,
        ConfigErrorKind::Priority(PriorityError::Share { .. })
    ));
}
