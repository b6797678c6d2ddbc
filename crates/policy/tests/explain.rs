//! `Policy::explain_at`: the same decision as `check_at`, with each rule's part in it.

use tollgate_core::ManualClock;
use tollgate_policy::{Policy, PolicyConfig, Skipped};

const CONFIG: &str = r#"
[[rules]]
name = "global"
limit = 100
period = "1s"

[[rules]]
name = "per_user"
match = { user = "any" }
key = ["user"]
limit = 2
period = "1s"
capacity = 100

[[rules]]
name = "login"
match = { path = { exact = "/login" }, user = "any" }
key = ["user"]
limit = 1
period = "1m"
capacity = 100
mode = "shadow"

[[rules]]
name = "by_method"
match = { method = "any", user = "any" }
key = ["method", "user"]
limit = 50
period = "1s"
capacity = 100

[[overrides]]
rule = "per_user"
tier = "gold"
values = ["vip"]
limit = 20
period = "1s"
"#;

fn policies() -> (Policy<ManualClock>, Policy<ManualClock>) {
    let config = PolicyConfig::from_toml(CONFIG).expect("config");
    (
        Policy::with_clock(config.clone(), ManualClock::new()).expect("explained"),
        Policy::with_clock(config, ManualClock::new()).expect("plain"),
    )
}

#[test]
fn a_trace_says_which_rules_applied_why_not_and_which_decided() {
    let (explained, plain) = policies();
    let alice = [("user", "alice"), ("path", "/home"), ("method", "GET")];
    for _ in 0..2 {
        let (decision, _) = explained.explain_at(&alice, 0, 1).expect("decided");
        assert_eq!(decision, plain.check_at(&alice, 0, 1).expect("decided"));
    }
    let (decision, why) = explained.explain_at(&alice, 0, 1).expect("decided");
    assert_eq!(decision, plain.check_at(&alice, 0, 1).expect("decided"));
    assert!(!why.allowed);
    assert_eq!(why.deciding, Some("per_user"));

    let global = &why.rules[0];
    assert_eq!(global.skipped, None);
    assert_eq!(global.key.as_deref(), Some(""));
    // global admitted (98 before this request; it is checked first), then per_user denied: the
    // unit went back.
    assert_eq!(global.before.map(|s| s.remaining), Some(98));
    assert_eq!(global.decision.map(|s| s.allowed), Some(true));
    assert_eq!(global.refunded, 1);
    assert_eq!(global.after.map(|s| s.remaining), Some(98), "nothing kept");

    let per_user = &why.rules[1];
    assert_eq!(per_user.key.as_deref(), Some("alice"));
    assert_eq!(per_user.quota.map(|q| q.limit), Some(2));
    assert_eq!(per_user.tier, None);
    assert_eq!(per_user.before.map(|s| s.allowed), Some(false));
    assert_eq!(per_user.decision.map(|s| s.allowed), Some(false));
    assert_eq!(per_user.refunded, 0);

    assert_eq!(
        why.rules[2].skipped,
        Some(Skipped::NoMatch {
            descriptor: "path".into(),
            value: "/home".into(),
            wants: "exact:/login".into()
        })
    );
    // After the enforcing denial, by_method is only peeked: decided, nothing to give back.
    let by_method = &why.rules[3];
    assert_eq!(by_method.key.as_deref(), Some("GET,alice"));
    assert_eq!(by_method.decision.map(|s| s.allowed), Some(true));
    assert_eq!(by_method.refunded, 0);
    let text = why.to_string();
    assert!(text.starts_with("denied by per_user"), "{text}");
    assert!(
        text.contains("login: skipped, `path` = `/home` is not exact:/login"),
        "{text}"
    );
}

#[test]
fn a_trace_shows_the_tier_a_shadow_denial_and_a_missing_descriptor() {
    let (explained, _) = policies();
    let vip = [("user", "vip"), ("path", "/login")];
    assert!(
        explained
            .explain_at(&vip, 0, 1)
            .expect("decided")
            .0
            .is_allowed()
    );
    let (decision, why) = explained.explain_at(&vip, 0, 1).expect("decided");
    assert!(decision.is_allowed(), "the shadow rule does not deny");
    let per_user = &why.rules[1];
    assert_eq!(per_user.tier.as_deref(), Some("gold"));
    assert_eq!(per_user.quota.map(|q| q.limit), Some(20));
    assert_eq!(
        (per_user.before, per_user.after).0.map(|s| s.remaining),
        Some(19)
    );
    assert_eq!(per_user.after.map(|s| s.remaining), Some(18));
    let login = &why.rules[2];
    assert!(!login.enforced);
    assert_eq!(login.decision.map(|s| s.allowed), Some(false));
    assert!(why.to_string().contains("login: key `vip` shadow-denied"));
    assert_eq!(
        why.rules[3].skipped,
        Some(Skipped::Missing {
            descriptor: "method".into()
        })
    );
}
