//! Behaviour of the policy engine: matching, atomic decisions, shadow and dry run, two-stage delay,
//! overrides, errors, counters and reload. Manual clock only.

use std::time::Duration;

use tollgate_core::{Decision, ManualClock, Quota};
use tollgate_policy::{ConfigError, ConfigErrorKind, Policy, PolicyConfig, PolicyError};

const SEC: u64 = 1_000_000_000;

fn policy(toml: &str) -> Policy<ManualClock> {
    Policy::with_clock(PolicyConfig::from_toml(toml).unwrap(), ManualClock::new()).unwrap()
}

fn err(toml: &str) -> ConfigError {
    let config = PolicyConfig::from_toml(toml).unwrap();
    Policy::with_clock(config, ManualClock::new()).unwrap_err()
}

const TWO_RULES: &str = r#"
[[rules]]
name = "per_ip"
match = { remote_address = "any" }
key = ["remote_address"]
limit = 2
period = "1s"
capacity = 100

[[rules]]
name = "api"
match = { route = { prefix = "/api/" }, method = { exact = "POST" } }
limit = 3
period = "1s"
"#;

#[test]
fn a_rule_applies_only_when_its_match_holds_and_its_descriptors_are_present() {
    let p = policy(TWO_RULES);
    let post = [
        ("remote_address", "a"),
        ("route", "/api/x"),
        ("method", "POST"),
    ];
    let get = [
        ("remote_address", "b"),
        ("route", "/api/x"),
        ("method", "GET"),
    ];
    let mut out = Vec::new();
    p.check_detailed(&post, 1, &mut out).unwrap();
    assert_eq!(
        out.iter().map(|o| o.rule).collect::<Vec<_>>(),
        ["per_ip", "api"]
    );
    p.check_detailed(&get, 1, &mut out).unwrap();
    assert_eq!(out.iter().map(|o| o.rule).collect::<Vec<_>>(), ["per_ip"]);
    // No remote_address: per_ip does not apply (documented fail-open for that rule).
    let anonymous = [("route", "/other")];
    let d = p.check_detailed(&anonymous, 1, &mut out).unwrap();
    assert!(out.is_empty());
    assert_eq!(d.rule, None);
    assert_eq!(d.decision.remaining(), u64::MAX);
}

#[test]
fn a_denial_gives_back_what_the_other_rules_admitted() {
    let p = policy(TWO_RULES);
    let a = [
        ("remote_address", "a"),
        ("route", "/api/x"),
        ("method", "POST"),
    ];
    let b = [
        ("remote_address", "b"),
        ("route", "/api/x"),
        ("method", "POST"),
    ];
    assert!(p.check_at(&a, SEC, 1).unwrap().is_allowed());
    assert!(p.check_at(&a, SEC, 1).unwrap().is_allowed());
    // per_ip denies "a" three times; api admitted each and must have been refunded each time.
    for _ in 0..3 {
        let d = p.check_at(&a, SEC, 1).unwrap();
        assert!(!d.is_allowed());
        assert_eq!(d.rule, Some("per_ip"));
        assert_eq!(d.decision.retry_after(), Some(Duration::from_millis(500)));
    }
    // api has exactly one unit left.
    let d = p.check_at(&b, SEC, 1).unwrap();
    assert!(d.is_allowed());
    assert_eq!(
        d.rule,
        Some("api"),
        "the tightest rule decides: api has 0 left, per_ip 1"
    );
    assert_eq!(d.decision.remaining(), 0);
    assert_eq!(d.quota, Some(Quota::per_second(3).unwrap()));
    assert_eq!(p.check_at(&b, SEC, 1).unwrap().rule, Some("api"));
}

#[test]
fn retry_after_is_the_longest_over_the_denying_rules() {
    let p = policy(
        r#"
        [[rules]]
        name = "fast"
        limit = 10
        period = "1s"
        burst = 1
        [[rules]]
        name = "slow"
        limit = 1
        period = "10s"
        "#,
    );
    assert!(p.check_at(&[], 0, 1).unwrap().is_allowed());
    let d = p.check_at(&[], 0, 1).unwrap();
    assert_eq!(d.rule, Some("slow"));
    assert_eq!(d.decision.retry_after(), Some(Duration::from_secs(10)));
}

#[test]
fn shadow_rules_count_but_never_deny_and_dry_run_makes_every_rule_shadow() {
    let p = policy(
        r#"
        [[rules]]
        name = "trial"
        mode = "shadow"
        limit = 1
        period = "1s"
        [[rules]]
        name = "cap"
        limit = 3
        period = "1s"
        "#,
    );
    for _ in 0..3 {
        assert!(p.check_at(&[], 0, 1).unwrap().is_allowed());
    }
    let d = p.check_at(&[], 0, 1).unwrap();
    assert!(!d.is_allowed());
    assert_eq!(d.rule, Some("cap"));
    assert!(d.shadow_denied);
    let s = p.snapshot();
    let trial = s.rule("trial").unwrap();
    assert_eq!(
        (trial.allowed, trial.shadow_denied, trial.denied),
        (1, 3, 0)
    );
    let cap = s.rule("cap").unwrap();
    assert_eq!((cap.allowed, cap.denied, cap.near_limit), (3, 1, 1));
    p.set_dry_run(true);
    assert!(p.dry_run());
    let d = p.check_at(&[], 0, 1).unwrap();
    assert!(d.is_allowed());
    assert!(d.shadow_denied);
    assert_eq!(d.rule, None);
    p.set_dry_run(false);
    assert!(!p.check_at(&[], 0, 1).unwrap().is_allowed());
}

#[test]
fn two_stage_delay_passes_the_burst_then_asks_to_wait_then_denies() {
    // 10/s, burst 2 at once, then up to 300 ms of waiting (3 more units), then deny.
    let p = policy(
        r#"
        [[rules]]
        name = "paced"
        match = { client = "any" }
        key = ["client"]
        limit = 10
        period = "1s"
        burst = 2
        capacity = 10
        delay = { max_delay = "300ms" }
        "#,
    );
    let c = [("client", "x")];
    let waits: Vec<Option<Duration>> = (0..6)
        .map(|_| {
            let d = p.check_at(&c, SEC, 1).unwrap();
            d.is_allowed().then_some(d.delay)
        })
        .collect();
    let ms = Duration::from_millis;
    assert_eq!(
        waits,
        [
            Some(ms(0)),
            Some(ms(0)),
            Some(ms(100)),
            Some(ms(200)),
            Some(ms(300)),
            None
        ]
    );
    let d = p.check_at(&c, SEC, 1).unwrap();
    assert_eq!(d.decision.retry_after(), Some(ms(100)));
    assert_eq!(
        d.quota,
        Some(Quota::per_second(10).unwrap().with_burst(2).unwrap())
    );
}

#[test]
fn overrides_give_listed_keys_their_tier_quota() {
    let p = policy(
        r#"
        [[rules]]
        name = "per_key"
        match = { api_key = "any" }
        key = ["api_key"]
        limit = 1
        period = "1m"
        capacity = 1000

        [[overrides]]
        rule = "per_key"
        tier = "pro"
        values = ["k-pro"]
        limit = 5
        period = "1m"
        "#,
    );
    let free = [("api_key", "k-free")];
    let pro = [("api_key", "k-pro")];
    assert!(p.check_at(&free, 0, 1).unwrap().is_allowed());
    assert!(!p.check_at(&free, 0, 1).unwrap().is_allowed());
    let d = p.check_at(&pro, 0, 1).unwrap();
    assert_eq!(d.decision.remaining(), 4);
    assert_eq!(d.quota, Some(Quota::per_minute(5).unwrap()));
}

#[test]
fn a_cost_no_enforcing_rule_can_admit_is_an_error_that_consumes_nothing() {
    let p = policy(TWO_RULES);
    let a = [
        ("remote_address", "a"),
        ("route", "/api/x"),
        ("method", "POST"),
    ];
    // per_ip (first) admits 2 at most.
    assert_eq!(
        p.check_at(&a, 0, 3),
        Err(PolicyError::CostExceedsCapacity {
            rule: "per_ip",
            cost: 3,
            capacity: 2
        })
    );
    // Nothing was consumed: "a" still has its two.
    assert!(p.check_at(&a, 0, 2).unwrap().is_allowed());
}

#[test]
fn a_global_error_after_a_keyed_admission_refunds_the_keyed_rule() {
    let p = policy(
        r#"
        [[rules]]
        name = "per_ip"
        match = { remote_address = "any" }
        key = ["remote_address"]
        limit = 10
        period = "1s"
        capacity = 100
        [[rules]]
        name = "global"
        limit = 5
        period = "1s"
        "#,
    );
    let a = [("remote_address", "a")];
    assert!(matches!(
        p.check_at(&a, 0, 6),
        Err(PolicyError::CostExceedsCapacity {
            rule: "global",
            capacity: 5,
            ..
        })
    ));
    let mut out = Vec::new();
    p.check_detailed(&a, 0, &mut out).unwrap();
    assert_eq!(out[0].decision.remaining(), 10, "per_ip got its 6 back");
}

#[test]
fn invalid_configs_are_typed_errors_naming_rule_and_field() {
    let kind = |toml: &str| {
        let e = err(toml);
        (e.rule, e.field, e.kind)
    };
    assert_eq!(
        kind("[[rules]]\nname = \"r\"\nalgorithm = \"magic\"\nlimit = 1\nperiod = \"1s\""),
        (
            Some("r".into()),
            "algorithm",
            ConfigErrorKind::UnknownAlgorithm("magic".into())
        )
    );
    assert_eq!(
        kind("[[rules]]\nname = \"r\"\nlimit = 0\nperiod = \"1s\""),
        (
            Some("r".into()),
            "limit",
            ConfigErrorKind::Quota(tollgate_core::QuotaError::ZeroLimit)
        )
    );
    assert_eq!(
        kind("[[rules]]\nname = \"r\"\nlimit = 1\nperiod = \"1s\"\n[[rules]]\nname = \"r\"\nlimit = 1\nperiod = \"1s\"").2,
        ConfigErrorKind::DuplicateName
    );
    assert_eq!(
        kind(
            "[[rules]]\nname = \"r\"\nlimit = 1\nperiod = \"1s\"\n[[overrides]]\nrule = \"nope\"\nvalues = [\"x\"]\nlimit = 2\nperiod = \"1s\""
        ),
        (
            Some("nope".into()),
            "overrides",
            ConfigErrorKind::UnknownRule
        )
    );
    assert_eq!(
        kind(
            "[[rules]]\nname = \"r\"\nkey = [\"user\"]\ncapacity = 10\nlimit = 1\nperiod = \"1s\""
        ),
        (
            Some("r".into()),
            "key",
            ConfigErrorKind::KeyNotMatched("user".into())
        )
    );
    assert_eq!(
        kind("[[rules]]\nname = \"r\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1s\"\ndelay = { max_delay = \"1s\" }").2,
        ConfigErrorKind::Delay
    );
    assert_eq!(
        kind("[[rules]]\nname = \"r\"\nmatch = { u = \"any\" }\nkey = [\"u\"]\nlimit = 1\nperiod = \"1s\"").2,
        ConfigErrorKind::Capacity
    );
    let e =
        PolicyConfig::from_toml("[[rules]]\nname = \"r\"\nlimit = 1\nperiod = \"1s\"\nlimitt = 3")
            .unwrap_err();
    assert!(matches!(e.kind, ConfigErrorKind::Parse(_)), "{e}");
    assert!(
        err("[[rules]]\nname = \"r\"\nlimit = 1\nperiod = \"1s\"\nalgorithm = \"magic\"")
            .to_string()
            .contains("rule `r`, field `algorithm`")
    );
}

#[test]
fn toml_and_yaml_are_one_schema() {
    let yaml = r#"
rules:
  - name: per_ip
    match: { remote_address: any }
    key: [remote_address]
    limit: 2
    period: 1s
    capacity: 100
  - name: api
    match:
      route: { prefix: /api/ }
      method: { exact: POST }
    limit: 3
    period: 1s
"#;
    assert_eq!(
        PolicyConfig::from_yaml(yaml).unwrap(),
        PolicyConfig::from_toml(TWO_RULES).unwrap()
    );
}

// ---------------------------------------------------------------- reload

const KEYED: &str = r#"
[[rules]]
name = "per_ip"
match = { remote_address = "any" }
key = ["remote_address"]
limit = 10
period = "1s"
capacity = 100
"#;

#[test]
fn reload_keeps_state_so_a_quota_change_hands_out_no_fresh_burst() {
    let p = policy(KEYED);
    let a = [("remote_address", "a")];
    assert!(p.check_at(&a, SEC, 10).unwrap().is_allowed());
    // Halve the quota at 1 s (the carry-over instant is the policy clock's): "a" spent its whole
    // bucket and must not get 5 more now.
    p.clock().set(SEC);
    let report = p
        .reload(PolicyConfig::from_toml(&KEYED.replace("limit = 10", "limit = 5")).unwrap())
        .unwrap();
    assert_eq!(report.kept, ["per_ip"]);
    let d = p.check_at(&a, SEC, 1).unwrap();
    assert!(!d.is_allowed());
    // It kept its 0 units (as-is): the first unit comes back one new interval (200 ms) after the
    // reload, not a nanosecond sooner.
    assert!(
        !p.check_at(&a, SEC + 200_000_000 - 1, 1)
            .unwrap()
            .is_allowed()
    );
    assert_eq!(
        p.check_at(&a, SEC + 200_000_000, 1)
            .unwrap()
            .decision
            .remaining(),
        0
    );
    // A new key gets the new quota; the counters carried over.
    assert_eq!(
        p.check_at(&[("remote_address", "b")], 2 * SEC, 1)
            .unwrap()
            .decision
            .remaining(),
        4
    );
    assert_eq!(p.snapshot().rule("per_ip").unwrap().allowed, 3);
}

#[test]
fn raising_a_quota_hands_a_spent_key_nothing_at_the_reload() {
    let p = policy(KEYED);
    let a = [("remote_address", "a")];
    assert!(p.check_at(&a, SEC, 10).unwrap().is_allowed());
    p.clock().set(SEC);
    p.reload(PolicyConfig::from_toml(&KEYED.replace("limit = 10", "limit = 100")).unwrap())
        .unwrap();
    // 100/s, burst 100: "a" keeps its 0 units at 1 s; at 1.5 s 50 have come back.
    assert!(!p.check_at(&a, SEC, 1).unwrap().is_allowed());
    assert_eq!(
        p.check_at(&a, SEC + SEC / 2, 1)
            .unwrap()
            .decision
            .remaining(),
        49
    );
}

#[test]
fn reload_drops_removed_rules_starts_new_ones_fresh_and_a_changed_identity_is_new() {
    let p = policy(TWO_RULES);
    let a = [
        ("remote_address", "a"),
        ("route", "/api/x"),
        ("method", "POST"),
    ];
    assert!(p.check_at(&a, 0, 2).unwrap().is_allowed());
    let changed = TWO_RULES
        .replace("capacity = 100", "capacity = 200")
        .replace("name = \"api\"", "name = \"api2\"");
    let report = p
        .reload(PolicyConfig::from_toml(&changed).unwrap())
        .unwrap();
    assert_eq!(report.fresh, ["per_ip", "api2"]);
    assert_eq!(report.removed, ["per_ip", "api"]);
    assert_eq!(p.rules(), ["per_ip", "api2"]);
    assert!(
        p.check_at(&a, 0, 2).unwrap().is_allowed(),
        "per_ip with a new capacity starts fresh"
    );
}

#[test]
fn an_invalid_reload_is_an_error_and_the_old_policy_stays() {
    let p = policy(KEYED);
    let a = [("remote_address", "a")];
    assert!(p.check_at(&a, 0, 9).unwrap().is_allowed());
    let bad = PolicyConfig::from_toml(&KEYED.replace("limit = 10", "limit = 0")).unwrap();
    let e = p.reload(bad).unwrap_err();
    assert_eq!((e.rule.as_deref(), e.field), (Some("per_ip"), "limit"));
    assert_eq!(
        p.check_at(&a, 0, 1).unwrap().decision,
        Decision::allowed(0, SEC)
    );
    assert_eq!(p.config(), PolicyConfig::from_toml(KEYED).unwrap());
}

#[test]
fn reload_applies_override_changes_to_the_kept_table() {
    let base = r#"
        [[rules]]
        name = "per_key"
        match = { api_key = "any" }
        key = ["api_key"]
        limit = 1
        period = "1m"
        capacity = 1000
    "#;
    let with = |limit: u64| {
        format!(
            "{base}\n[[overrides]]\nrule = \"per_key\"\nvalues = [\"k\"]\nlimit = {limit}\nperiod = \"1m\"\n"
        )
    };
    let p = policy(&with(5));
    let k = [("api_key", "k")];
    assert!(p.check_at(&k, 0, 3).unwrap().is_allowed());
    p.reload(PolicyConfig::from_toml(&with(10)).unwrap())
        .unwrap();
    let d = p.check_at(&k, 0, 1).unwrap();
    assert_eq!(d.quota, Some(Quota::per_minute(10).unwrap()));
    assert!(d.is_allowed());
    p.reload(PolicyConfig::from_toml(base).unwrap()).unwrap();
    assert_eq!(
        p.check_at(&k, 0, 1).unwrap().quota,
        Some(Quota::per_minute(1).unwrap())
    );
}

#[test]
fn a_striped_rule_rebuilt_for_a_new_quota_keeps_its_place_on_the_timeline() {
    let config = r#"
        [[rules]]
        name = "cap"
        limit = 10
        period = "1s"
        storage = "striped"
        stripes = 1
    "#;
    let p = policy(config);
    for _ in 0..10 {
        assert!(p.check_at(&[], SEC, 1).unwrap().is_allowed());
    }
    assert!(!p.check_at(&[], SEC, 1).unwrap().is_allowed());
    p.clock().set(SEC);
    p.reload(PolicyConfig::from_toml(&config.replace("limit = 10", "limit = 20")).unwrap())
        .unwrap();
    // The shared word had 0 units at 1 s, so it keeps 0 under 20/s.
    assert!(!p.check_at(&[], SEC, 1).unwrap().is_allowed());
    assert!(p.check_at(&[], 2 * SEC, 20).unwrap().is_allowed());
}

#[test]
fn reloads_under_load_lose_no_decision_and_admit_the_global_burst_exactly() {
    // Two threads decide at one frozen instant while the main thread reloads 100 times, changing a
    // keyed rule's override each time (the global rule's identity and quota stay): every decision is
    // answered, and the global rule admits exactly its burst, refunds included.
    let config = |pro: u64| {
        PolicyConfig::from_toml(&format!(
            r#"
            [[rules]]
            name = "per_worker"
            match = {{ worker = "any" }}
            key = ["worker"]
            limit = 100000
            period = "1s"
            capacity = 16
            [[rules]]
            name = "global"
            limit = 1000
            period = "1s"
            [[overrides]]
            rule = "per_worker"
            values = ["pro"]
            limit = {pro}
            period = "1s"
            "#
        ))
        .unwrap()
    };
    let p = std::sync::Arc::new(Policy::with_clock(config(1), ManualClock::new()).unwrap());
    let workers: Vec<_> = ["w0", "w1"]
        .into_iter()
        .map(|w| {
            let p = p.clone();
            std::thread::spawn(move || {
                (0..800)
                    .filter(|_| p.check_at(&[("worker", w)], SEC, 1).unwrap().is_allowed())
                    .count()
            })
        })
        .collect();
    for i in 0..100 {
        p.reload(config(2 + i % 2)).unwrap();
    }
    let admitted: usize = workers.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(admitted, 1000);
    let stats = p.snapshot();
    assert_eq!(stats.rule("global").unwrap().allowed, 1000);
    assert_eq!(stats.rule("global").unwrap().denied, 600);
    // Every denied request was refunded by per_worker: each worker's key spent only its admissions.
    let mut out = Vec::new();
    let total_left: u64 = ["w0", "w1"]
        .iter()
        .map(|w| {
            p.check_detailed_at(&[("worker", w)], SEC, 1, &mut out)
                .unwrap();
            out[0].decision.remaining() + 1
        })
        .sum();
    assert_eq!(total_left, 2 * 100_000 - 1000);
}

#[test]
fn check_next_says_what_a_peek_of_the_deciding_rule_says() {
    let p = policy(TWO_RULES);
    let now = p.now();
    let post = [
        ("remote_address", "a"),
        ("route", "/api/x"),
        ("method", "POST"),
    ];
    // per_ip (2/s) is the tighter rule: after one admission 1 is left, a second unit in 0.5 s.
    let (first, next) = p.check_next_at(&post, now, 1).unwrap();
    assert_eq!(first.rule, Some("per_ip"));
    assert_eq!(first.decision.remaining(), 1);
    assert_eq!(next, Some(Duration::from_millis(500)));
    let peeked = p.peek_rule_at("per_ip", &post, now, 2).unwrap().unwrap();
    assert_eq!(next, peeked.retry_after());
    // Nothing left: the next unit in 0.5 s still; then a denial says its own wait.
    let (_, next) = p.check_next_at(&post, now, 1).unwrap();
    assert_eq!(next, Some(Duration::from_millis(500)));
    let (denied, next) = p.check_next_at(&post, now, 1).unwrap();
    assert!(!denied.is_allowed());
    assert_eq!(next, denied.decision.retry_after());
    // No rule applies: nothing to say.
    let (none, next) = p.check_next_at(&[("route", "/")], now, 1).unwrap();
    assert_eq!((none.rule, next), (None, None));
    // A zero cost leaves the whole quota: no more can become available.
    let (zero, next) = p.check_next_at(&[("remote_address", "b")], now, 0).unwrap();
    assert_eq!((zero.decision.remaining(), next), (2, None));
}
