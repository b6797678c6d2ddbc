//! The reload's guarantees: two-phase (prepare changes nothing live; commit cannot fail), the
//! carry-over rule for a kept rule's state, and typed errors for what cannot be built. Manual clock
//! only.

use std::time::Duration;

use proptest::prelude::*;
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

// ---------------------------------------------------------------- the carry-over rule

const SEC: u64 = 1_000_000_000;

/// Where a rule keeps its state.
#[derive(Clone, Copy, Debug)]
enum Store {
    Keyed,
    Atomic,
    Striped,
}

/// One rule `r` with this algorithm, store and quota (`burst` only for the buckets).
fn rule(algorithm: &str, store: Store, limit: u64, period_ms: u64, burst: Option<u64>) -> String {
    let place = match store {
        Store::Keyed => "match = { k = \"any\" }\nkey = [\"k\"]\ncapacity = 64",
        Store::Atomic => "",
        Store::Striped => "storage = \"striped\"\nstripes = 2",
    };
    let burst = burst.map_or(String::new(), |b| format!("burst = {b}"));
    format!(
        "[[rules]]\nname = \"r\"\nalgorithm = \"{algorithm}\"\nlimit = {limit}\n\
         period = \"{period_ms}ms\"\n{burst}\n{place}\n"
    )
}

/// Units key "x" can take one at a time at `now` (consuming them).
fn take_all(p: &Policy<ManualClock>, now: u64) -> u64 {
    let mut n = 0;
    while p.check_at(&[("k", "x")], now, 1).unwrap().is_allowed() {
        n += 1;
        assert!(
            n <= 100_000,
            "no quota here admits this many at one instant"
        );
    }
    n
}

/// A policy on `old` whose key "x" took `spent` units at 1 s (one request each), and its twin.
fn spent_twins(old: &str, spent: u64) -> [Policy<ManualClock>; 2] {
    [0, 1].map(|_| {
        let clock = ManualClock::new();
        let p = Policy::with_clock(config(old), clock.clone()).unwrap();
        for _ in 0..spent {
            p.check_at(&[("k", "x")], SEC, 1).unwrap();
        }
        clock.set(SEC);
        p
    })
}

#[test]
fn a_key_that_spent_its_burst_gets_nothing_at_the_reload_whatever_the_change() {
    let stores = [Store::Keyed, Store::Atomic, Store::Striped];
    for store in stores {
        let algorithms: &[&str] = match store {
            Store::Striped => &["gcra"],
            _ => &["gcra", "leaky_bucket"],
        };
        for &algorithm in algorithms {
            let old = rule(algorithm, store, 10, 1_000, None);
            for new in [
                rule(algorithm, store, 10, 60_000, None), // 10/s -> 10/min (in time: 9)
                rule(algorithm, store, 10, 1_000, Some(30)), // burst 10 -> 30 (in time: 20)
                rule(algorithm, store, 100, 1_000, None), // faster
            ] {
                let [p, _] = spent_twins(&old, 10);
                p.reload(config(&new)).unwrap();
                assert_eq!(take_all(&p, SEC), 0, "{algorithm} {store:?}: {new}");
                // Half spent: keeps its 5 (as-is), whatever the new burst.
                let [p, _] = spent_twins(&old, 5);
                p.reload(config(&new)).unwrap();
                assert_eq!(take_all(&p, SEC), 5, "{algorithm} {store:?}: {new}");
            }
        }
    }
}

#[test]
fn a_new_override_for_a_key_that_spent_its_burst_hands_it_nothing() {
    let old = rule("gcra", Store::Keyed, 10, 1_000, None);
    let new = format!(
        "{old}\n[[overrides]]\nrule = \"r\"\nvalues = [\"x\"]\nlimit = 10\nperiod = \"1m\"\n"
    );
    let [p, _] = spent_twins(&old, 10);
    p.reload(config(&new)).unwrap();
    assert_eq!(take_all(&p, SEC), 0, "in time it had 9 at once");
    // And back: removing the override carries the key over again.
    p.reload(config(&old)).unwrap();
    assert_eq!(take_all(&p, SEC), 0);
    assert_eq!(take_all(&p, SEC + SEC / 10), 1, "then it refills at 10/s");
}

#[test]
fn a_window_rule_raised_keeps_what_the_key_had_left() {
    for algorithm in ["fixed_window", "sliding_window"] {
        for store in [Store::Keyed, Store::Atomic] {
            let old = rule(algorithm, store, 4, 1_000, None);
            let [p, _] = spent_twins(&old, 3);
            p.reload(config(&rule(algorithm, store, 10, 1_000, None)))
                .unwrap();
            // In place the count of 3 against a limit of 10 left 7; as-is it is the 1 it had.
            assert_eq!(take_all(&p, SEC), 1, "{algorithm} {store:?}");
        }
    }
}

fn bucket_quota() -> impl Strategy<Value = (u64, u64, u64)> {
    (1u64..=20, 1u64..=4_000, 1u64..=30)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random quota pairs: right after the reload a key can take at most what it could have taken
    /// under the old quota at that instant, capped by the new burst; and from then on, in every
    /// interval from the reload, at most the new quota's bound (burst + elapsed / interval for the
    /// buckets, the limit per aligned window for the fixed window).
    #[test]
    fn after_a_reload_a_key_has_at_most_min_of_old_and_new_and_then_the_new_bound(
        (l0, p0, b0) in bucket_quota(),
        (l1, p1, b1) in bucket_quota(),
        which in 0usize..7,
        spent in 0u64..40,
        trace in prop::collection::vec((0u64..300, 1u64..4), 0..40),
    ) {
        let (algorithm, store) = [
            ("gcra", Store::Keyed), ("gcra", Store::Atomic), ("gcra", Store::Striped),
            ("leaky_bucket", Store::Keyed), ("leaky_bucket", Store::Atomic),
            ("fixed_window", Store::Keyed), ("sliding_window", Store::Atomic),
        ][which];
        let bucket = matches!(algorithm, "gcra" | "leaky_bucket");
        let burst = |b| bucket.then_some(b);
        let old = rule(algorithm, store, l0, p0, burst(b0));
        let new = rule(algorithm, store, l1, p1, burst(b1));
        let [p, twin] = spent_twins(&old, spent);
        p.reload(config(&new)).unwrap();
        let new_quota = p.check_at(&[("k", "y")], SEC, 0).unwrap().quota.unwrap();
        let capacity = if bucket { new_quota.burst() } else { new_quota.limit() };
        // The twin, not reloaded, says what the old quota had left at the reload instant.
        let before = take_all(&twin, SEC);
        // Probe the reloaded one without consuming: the largest cost a peek admits.
        let now_has = (0..=capacity)
            .take_while(|&c| p.peek_rule_at("r", &[("k", "x")], SEC, c).unwrap()
                .is_ok_and(|d| d.is_allowed()))
            .last()
            .unwrap_or(0);
        // A key that never spent anything is a new key (it has no state): the new burst.
        let bound = if spent == 0 { capacity } else { before.min(capacity) };
        prop_assert!(now_has <= bound, "{now_has} > {bound} (had {before}, new {capacity})");
        // Then the new quota's bound, over a random trace of requests from the reload on.
        let interval = new_quota.emission_interval_nanos();
        let window = new_quota.period_nanos();
        let (mut now, mut admitted) = (SEC, Vec::new());
        for (step_ms, cost) in trace {
            now += step_ms * 1_000_000;
            let cost = cost.min(capacity);
            if p.check_at(&[("k", "x")], now, cost).is_ok_and(|d| d.is_allowed()) {
                admitted.push((now, cost));
            }
        }
        match algorithm {
            "gcra" | "leaky_bucket" => {
                let total: u64 = admitted.iter().map(|(_, c)| c).sum();
                prop_assert!(total <= capacity + (now - SEC) / interval);
                for &(t, _) in &admitted {
                    let upto: u64 = admitted.iter().filter(|(u, _)| *u <= t).map(|(_, c)| c).sum();
                    prop_assert!(upto <= capacity + (t - SEC) / interval);
                }
            }
            "fixed_window" => {
                for &(t, _) in &admitted {
                    let same: u64 = admitted.iter()
                        .filter(|(u, _)| u / window == t / window).map(|(_, c)| c).sum();
                    prop_assert!(same <= capacity);
                }
            }
            _ => {}
        }
    }
}

#[test]
fn alternating_quotas_of_burst_3_under_4_threads_never_admit_more_than_3() {
    // Four threads take from one key at a frozen instant while the main thread alternates two
    // quotas of burst 3 (3/s and 3/min). At one instant no reload can add a unit: 3 in all.
    for store in [Store::Keyed, Store::Atomic, Store::Striped] {
        let a = config(&rule("gcra", store, 3, 1_000, None));
        let b = config(&rule("gcra", store, 3, 60_000, None));
        for round in 0..10 {
            let clock = ManualClock::new();
            clock.set(SEC);
            let p = std::sync::Arc::new(Policy::with_clock(a.clone(), clock).unwrap());
            let admitted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    let (p, admitted) = (p.clone(), admitted.clone());
                    std::thread::spawn(move || {
                        for _ in 0..300 {
                            if p.check_at(&[("k", "x")], SEC, 1).unwrap().is_allowed() {
                                admitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                        }
                    })
                })
                .collect();
            for i in 0..60 {
                p.reload(if i % 2 == 0 { b.clone() } else { a.clone() })
                    .unwrap();
            }
            for thread in threads {
                thread.join().unwrap();
            }
            let admitted = admitted.load(std::sync::atomic::Ordering::Relaxed);
            assert!(
                admitted <= 3,
                "{store:?} round {round}: {admitted} admitted"
            );
        }
    }
}

// ---------------------------------------------------------------- tables that cannot be built

#[test]
fn a_capacity_that_cannot_be_allocated_is_a_typed_error_and_the_old_policy_stays() {
    use tollgate_policy::{ConfigErrorKind, MAX_CAPACITY};
    let keyed = |capacity: u64| {
        config(&format!(
            "[[rules]]\nname = \"r\"\nmatch = {{ k = \"any\" }}\nkey = [\"k\"]\nlimit = 1\n\
             period = \"1s\"\ncapacity = {capacity}\n"
        ))
    };
    // At start: 2^40 keys.
    let e = Policy::with_clock(keyed(1 << 40), ManualClock::new()).unwrap_err();
    assert_eq!((e.rule.as_deref(), e.field), (Some("r"), "capacity"));
    assert_eq!(
        e.kind,
        ConfigErrorKind::CapacityTooLarge {
            capacity: 1 << 40,
            max: MAX_CAPACITY
        }
    );
    // On a live reload: 4 000 000 000 keys (91 GB); the running policy keeps deciding.
    let clock = ManualClock::new();
    let p = Policy::with_clock(keyed(100), clock.clone()).unwrap();
    let now = p.now();
    assert!(p.check_at(&[("k", "x")], now, 1).unwrap().is_allowed());
    let e = p.reload(keyed(4_000_000_000)).unwrap_err();
    assert!(
        matches!(e.kind, ConfigErrorKind::CapacityTooLarge { .. }),
        "{e}"
    );
    assert_eq!(p.config(), keyed(100));
    assert!(
        !p.check_at(&[("k", "x")], now, 1).unwrap().is_allowed(),
        "state kept"
    );
    assert!(p.check_at(&[("k", "y")], now, 1).unwrap().is_allowed());
}

// ---------------------------------------------------------------- overrides

#[test]
fn one_key_value_in_two_overrides_of_a_rule_is_an_error_naming_rule_and_value() {
    use tollgate_policy::ConfigErrorKind;
    let base = rule("gcra", Store::Keyed, 10, 1_000, None);
    let tier = |values: &str, limit: u64| {
        format!(
            "[[overrides]]\nrule = \"r\"\nvalues = [{values}]\nlimit = {limit}\nperiod = \"1s\"\n"
        )
    };
    for bad in [
        format!(
            "{base}{}{}",
            tier("\"a\", \"vip\"", 100),
            tier("\"vip\"", 5)
        ),
        format!("{base}{}", tier("\"vip\", \"b\", \"vip\"", 100)),
    ] {
        let e = config(&bad).validate().unwrap_err();
        assert_eq!((e.rule.as_deref(), e.field), (Some("r"), "overrides"));
        assert_eq!(e.kind, ConfigErrorKind::DuplicateOverride("vip".into()));
        assert!(e.to_string().contains("`vip`"), "{e}");
        // Refused on a live reload too, and the old policy stays.
        let p = Policy::with_clock(config(&base), ManualClock::new()).unwrap();
        assert!(p.reload(config(&bad)).is_err());
        assert_eq!(p.config(), config(&base));
    }
    // The same value for two different rules is fine.
    let two = format!(
        "{base}{}\n[[rules]]\nname = \"s\"\nmatch = {{ k = \"any\" }}\nkey = [\"k\"]\nlimit = 1\n\
         period = \"1s\"\ncapacity = 8\n\n[[overrides]]\nrule = \"s\"\nvalues = [\"vip\"]\n\
         limit = 2\nperiod = \"1s\"\n",
        tier("\"vip\"", 100)
    );
    config(&two).validate().unwrap();
}

#[test]
fn a_prepared_override_is_placed_at_the_commit_even_if_its_window_filled_up_meanwhile() {
    // Capacity 1: one stripe whose 32 slots are one probe window. Keys at 1/min stay live.
    let base = "[[rules]]\nname = \"r\"\nmatch = { k = \"any\" }\nkey = [\"k\"]\nlimit = 1\n\
                period = \"1m\"\ncapacity = 1\n";
    let vip = format!(
        "{base}\n[[overrides]]\nrule = \"r\"\nvalues = [\"vip\"]\nlimit = 100\nperiod = \"1m\"\n"
    );
    let p = Policy::with_clock(config(base), ManualClock::new()).unwrap();
    let now = p.now();
    let prepared = p.prepare_reload(config(&vip)).unwrap();
    // The window fills with live keys while the reload is prepared ("vip" holds a pinned slot).
    for i in 0..64 {
        p.check_at(&[("k", &format!("user{i}"))], now, 1).unwrap();
    }
    assert!(
        p.snapshot().rule("r").unwrap().overflow > 0,
        "the window is full"
    );
    prepared.commit();
    let d = p.check_at(&[("k", "vip")], now, 1).unwrap();
    assert_eq!(d.quota.map(|q| q.limit()), Some(100));
    assert_eq!(d.decision.remaining(), 99);
    // Preparing the same change on a full window now is a typed error; the policy stays.
    let p = Policy::with_clock(config(base), ManualClock::new()).unwrap();
    for i in 0..64 {
        p.check_at(&[("k", &format!("user{i}"))], now, 1).unwrap();
    }
    let e = p.prepare_reload(config(&vip)).unwrap_err();
    assert_eq!((e.rule.as_deref(), e.field), (Some("r"), "overrides"));
    assert_eq!(p.config(), config(base));
}
