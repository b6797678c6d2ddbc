//! The reload's guarantees: two-phase (prepare changes nothing live; commit cannot fail), the
//! carry-over rule for a kept rule's state, and typed errors for what cannot be built. Manual clock
//! only.

use std::time::Duration;

use tollgate_core::{Decision, ManualClock};
use tollgate_policy::{Policy, PolicyConfig};

fn config(toml: &str) -> PolicyConfig {
    PolicyConfig::from_toml(toml).unwrap()
}

/// One keyed rule with an override, an atomic global, a striped global and a window rule: every
/// storage a reload changes.
const ALL: &str = r#"
[[rules]]
name = "per_ip"
match = { ip = "any" }
key = ["ip"]
limit = 3
period = "1s"
capacity = 1000

[[rules]]
name = "per_user"
match = { user = "any" }
key = ["user"]
algorithm = "fixed_window"
limit = 4
period = "1s"
capacity = 1000

[[rules]]
name = "global"
limit = 20
period = "1s"

[[rules]]
name = "striped"
storage = "striped"
stripes = 2
limit = 20
period = "1s"

[[overrides]]
rule = "per_ip"
values = ["10.0.0.9"]
limit = 5
period = "1s"
"#;

/// Every way `ALL` can change on a reload: quotas of every rule, an override added for a key that
/// is in the table, one for a key that is not, one removed, a rule removed and one added.
const CHANGED: &str = r#"
[[rules]]
name = "per_ip"
match = { ip = "any" }
key = ["ip"]
limit = 1
period = "1s"
capacity = 1000

[[rules]]
name = "per_user"
match = { user = "any" }
key = ["user"]
algorithm = "fixed_window"
limit = 1
period = "1s"
capacity = 1000

[[rules]]
name = "global"
limit = 2
period = "1s"

[[rules]]
name = "striped"
storage = "striped"
stripes = 2
limit = 2
period = "1s"

[[rules]]
name = "new"
limit = 1
period = "1h"

[[overrides]]
rule = "per_ip"
values = ["10.0.0.1", "10.0.0.2"]
limit = 1
period = "1h"
"#;

/// A fixed sequence of requests over every rule, at `now`; the decisions in order.
fn drive(p: &Policy<ManualClock>, now: u64) -> Vec<(bool, Option<&'static str>, u64)> {
    let mut out = Vec::new();
    for ip in ["10.0.0.1", "10.0.0.2", "10.0.0.9"] {
        for user in ["ann", "bob"] {
            for _ in 0..3 {
                let d = p.check_at(&[("ip", ip), ("user", user)], now, 1).unwrap();
                let remaining = match d.decision {
                    Decision::Allowed { remaining, .. } => remaining,
                    Decision::Denied { retry_after, .. } => retry_after.as_nanos() as u64,
                };
                out.push((d.is_allowed(), d.rule, remaining));
            }
        }
    }
    out
}

#[test]
fn a_prepared_then_dropped_reload_changes_no_decision() {
    let clock = ManualClock::new();
    let a = Policy::with_clock(config(ALL), clock.clone()).unwrap();
    let b = Policy::with_clock(config(ALL), clock.clone()).unwrap();
    let t0 = a.now();
    // Some state in every rule (10.0.0.1 is in the table, 10.0.0.2 is not until the drive below).
    for p in [&a, &b] {
        for _ in 0..2 {
            p.check_at(&[("ip", "10.0.0.1"), ("user", "ann")], t0, 1)
                .unwrap();
        }
    }
    let prepared = a.prepare_reload(config(CHANGED)).unwrap();
    assert_eq!(prepared.report().fresh, ["new"]);
    assert_eq!(a.config(), config(ALL), "preparing changes nothing live");
    // Decisions while it is prepared, and after it is dropped, are the twin's.
    let step = Duration::from_millis(150).as_nanos() as u64;
    assert_eq!(drive(&a, t0 + step), drive(&b, t0 + step));
    drop(prepared);
    for i in 2..12 {
        assert_eq!(
            drive(&a, t0 + i * step),
            drive(&b, t0 + i * step),
            "step {i}"
        );
    }
    assert_eq!(a.config(), config(ALL));
    assert_eq!(a.snapshot(), b.snapshot());
    // The lock is free again, and the same reload commits.
    let report = a.prepare_reload(config(CHANGED)).unwrap().commit();
    assert_eq!(report.removed, Vec::<&str>::new());
    assert_eq!(a.config(), config(CHANGED));
    let vip = a
        .check_at(&[("ip", "10.0.0.2")], t0 + 100 * step, 1)
        .unwrap();
    assert_eq!(
        vip.quota.map(|q| q.period()),
        Some(Duration::from_secs(3600))
    );
}

#[test]
fn reload_is_prepare_then_commit_and_a_failed_prepare_holds_nothing() {
    let p = Policy::with_clock(config(ALL), ManualClock::new()).unwrap();
    let bad = ALL.replace("limit = 3", "limit = 0");
    assert!(p.prepare_reload(config(&bad)).is_err());
    // Not deadlocked: the failed prepare let the lock go.
    let report = p.reload(config(CHANGED)).unwrap();
    assert_eq!(report.kept, ["per_ip", "per_user", "global", "striped"]);
    assert_eq!(report.fresh, ["new"]);
}
