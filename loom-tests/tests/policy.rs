//! Loom models of tollgate-policy's multi-rule decision: two threads racing through two rules at one
//! frozen instant. After every interleaving,
//! * exactly the admissions the tightest rule allows happen (no rule over-admits), and
//! * a denied request left no trace: the rule that admitted it and was refunded decides the next
//!   request exactly as if the denied one had never come.
#![cfg(tollgate_loom)]

use loom::sync::Arc;
use loom::thread;
use tollgate_core::{ManualClock, Nanos};
use tollgate_policy::{Policy, PolicyConfig};

const NOW: Nanos = 5_000_000_000;

fn policy(toml: &str) -> Arc<Policy<ManualClock>> {
    let config = PolicyConfig::from_toml(toml).unwrap();
    Arc::new(Policy::with_clock(config, ManualClock::new()).unwrap())
}

/// One thread per user, each making one check of cost 1 at `NOW`; returns who was admitted.
fn race(policy: &Arc<Policy<ManualClock>>, users: [&'static str; 2]) -> [bool; 2] {
    let handles = users.map(|user| {
        let policy = policy.clone();
        thread::spawn(move || {
            policy
                .check_at(&[("user", user)], NOW, 1)
                .unwrap()
                .is_allowed()
        })
    });
    handles.map(|h| h.join().unwrap())
}

/// `per_user` (keyed, checked first) and `global` (checked second), both GCRA.
fn two_rules(per_user_burst: u64, global_burst: u64) -> String {
    format!(
        r#"
        metrics = false
        [[rules]]
        name = "per_user"
        match = {{ user = "any" }}
        key = ["user"]
        limit = 10
        period = "1s"
        burst = {per_user_burst}
        capacity = 8
        [[rules]]
        name = "global"
        limit = 10
        period = "1s"
        burst = {global_burst}
        "#
    )
}

#[test]
fn the_global_rule_admits_one_and_the_losers_key_is_refunded() {
    loom::model(|| {
        // Each user may pass once; the global cap lets only one of them through.
        let p = policy(&two_rules(1, 1));
        let admitted = race(&p, ["a", "b"]);
        assert_eq!(admitted.iter().filter(|&&a| a).count(), 1);
        let loser = if admitted[0] { "b" } else { "a" };
        let winner = if admitted[0] { "a" } else { "b" };
        let mut out = Vec::new();
        // The loser's own key is as fresh as if it had never asked: per_user admits it again (and
        // is refunded again, since global is spent), with the whole burst's remaining.
        let d = p
            .check_detailed_at(&[("user", loser)], NOW, 1, &mut out)
            .unwrap();
        assert!(!d.is_allowed());
        assert_eq!(d.rule, Some("global"));
        assert!(
            out[0].decision.is_allowed(),
            "the loser's key kept a refunded unit"
        );
        assert_eq!(out[0].decision.remaining(), 0);
        // The winner's key is spent.
        p.check_detailed_at(&[("user", winner)], NOW, 1, &mut out)
            .unwrap();
        assert!(!out[0].decision.is_allowed());
    });
}

#[test]
fn the_keyed_rule_admits_one_and_the_global_rule_is_refunded() {
    loom::model(|| {
        // Same user twice: per_user (burst 1, first) admits one; the other racer is denied there and
        // global (burst 2) only peeks it, so global spends exactly the winner's unit.
        let p = policy(&two_rules(1, 2));
        let admitted = race(&p, ["a", "a"]);
        assert_eq!(admitted.iter().filter(|&&a| a).count(), 1);
        // Global spent exactly one unit: another user gets the second, and then nothing.
        let d = p.check_at(&[("user", "c")], NOW, 1).unwrap();
        assert!(d.is_allowed());
        assert_eq!(d.decision.remaining(), 0);
        assert!(!p.check_at(&[("user", "d")], NOW, 1).unwrap().is_allowed());
    });
}

#[test]
fn a_global_rule_first_is_refunded_when_the_keyed_rule_behind_it_denies() {
    loom::model(|| {
        // Global (burst 2) is evaluated first and admits both racers; per_user (burst 1, same user)
        // then denies one, whose global unit must come back even while the other thread races.
        let config = r#"
            metrics = false
            [[rules]]
            name = "global"
            limit = 10
            period = "1s"
            burst = 2
            [[rules]]
            name = "per_user"
            match = { user = "any" }
            key = ["user"]
            limit = 10
            period = "1s"
            burst = 1
            capacity = 8
        "#;
        let p = policy(config);
        let admitted = race(&p, ["a", "a"]);
        assert_eq!(admitted.iter().filter(|&&a| a).count(), 1);
        let d = p.check_at(&[("user", "c")], NOW, 1).unwrap();
        assert!(d.is_allowed(), "the denied racer's global unit came back");
        assert_eq!(d.decision.remaining(), 0);
        assert!(!p.check_at(&[("user", "d")], NOW, 1).unwrap().is_allowed());
    });
}

/// One global rule on atomic storage, GCRA burst `burst` at 10/s.
fn global(burst: u64) -> PolicyConfig {
    PolicyConfig::from_toml(&format!(
        r#"
        metrics = false
        [[rules]]
        name = "global"
        limit = 10
        period = "1s"
        burst = {burst}
        "#
    ))
    .unwrap()
}

#[test]
fn a_global_rule_reloaded_while_a_decision_runs_hands_over_exactly_what_was_left() {
    loom::model(|| {
        // Burst 2 with one unit spent; a reload to burst 3 races a check. As-is in units: one
        // unit in all, whether the check lands before the retire (and is carried), after it (and
        // is forwarded to the new word), or fails its exchange against the retire.
        // The reload happens at NOW too (the clock's reading), so as-is means what was left then.
        let clock = ManualClock::new();
        clock.set(NOW);
        let p = Arc::new(Policy::with_clock(global(2), clock).unwrap());
        assert!(p.check_at(&[], NOW, 1).unwrap().is_allowed());
        let racer = {
            let p = p.clone();
            thread::spawn(move || p.check_at(&[], NOW, 1).unwrap().is_allowed())
        };
        p.reload(global(3)).unwrap();
        let mut admitted = u64::from(racer.join().unwrap());
        while p.check_at(&[], NOW, 1).unwrap().is_allowed() {
            admitted += 1;
            assert!(admitted <= 1, "more than the unit that was left");
        }
        assert_eq!(admitted, 1);
    });
}
