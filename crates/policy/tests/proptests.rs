//! Property tests of the multi-rule decision against independent per-rule reference limiters fed
//! only the requests the policy admitted.
//!
//! * Every rule's verdict on every request equals its reference's: so a request the policy denied
//!   left every rule's state exactly as if it had not come (otherwise a later verdict would differ).
//! * Every admitted request is admitted by every applicable enforcing rule's reference: no rule ever
//!   admits beyond its own bound (for the striped rule, whose `remaining` is approximate, this is the
//!   property checked).
//!
//! Fake time; all rules of one check decide at one instant.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use tollgate_core::{
    Algorithm, Decision, FixedWindow, Gcra, LeakyBucket, ManualClock, Nanos, Quota, SlidingWindow,
};
use tollgate_policy::{MatchSpec, Mode, Policy, PolicyConfig, RuleConfig, Storage};

const ALGORITHMS: [&str; 4] = ["gcra", "leaky_bucket", "fixed_window", "sliding_window"];

/// A plain single-state reference for one rule's algorithm.
#[derive(Clone)]
enum Reference {
    Gcra(Gcra),
    Leaky(LeakyBucket),
    Fixed(FixedWindow),
    Sliding(SlidingWindow),
}

impl Reference {
    fn new(algorithm: &str, quota: Quota) -> Self {
        match algorithm {
            "gcra" => Reference::Gcra(Gcra::from_quota(quota).unwrap()),
            "leaky_bucket" => Reference::Leaky(LeakyBucket::from_quota(quota).unwrap()),
            "fixed_window" => Reference::Fixed(FixedWindow::from_quota(quota).unwrap()),
            _ => Reference::Sliding(SlidingWindow::from_quota(quota).unwrap()),
        }
    }

    fn decide(&self, state: u64, now: Nanos, cost: u64) -> (Decision, Option<u64>) {
        let t = match self {
            Reference::Gcra(a) => a.decide(state, now, cost),
            Reference::Leaky(a) => a.decide(state, now, cost),
            Reference::Fixed(a) => a.decide(state, now, cost),
            Reference::Sliding(a) => a.decide(state, now, cost),
        }
        .unwrap();
        (t.decision, t.next)
    }
}

#[derive(Clone, Debug)]
struct RuleSpec {
    algorithm: &'static str,
    limit: u64,
    period_ms: u64,
    burst: u64,
    shadow: bool,
}

fn rule_spec() -> impl Strategy<Value = RuleSpec> {
    (
        0usize..4,
        1u64..=5,
        1u64..=3,
        1u64..=6,
        prop::bool::weighted(0.25),
    )
        .prop_map(|(a, limit, secs, burst, shadow)| RuleSpec {
            algorithm: ALGORITHMS[a],
            limit,
            period_ms: secs * 1000,
            burst,
            shadow,
        })
}

/// Three rules: keyed by user, keyed by route, global (atomic or striped).
fn config(specs: &[RuleSpec; 3], striped: bool) -> PolicyConfig {
    let rule = |name: &str, key: Option<&str>, s: &RuleSpec, storage: Storage| RuleConfig {
        name: name.into(),
        matches: key
            .map(|k| (k.to_owned(), MatchSpec::Any))
            .into_iter()
            .collect(),
        key: key.map(str::to_owned).into_iter().collect(),
        algorithm: if storage == Storage::Striped {
            "gcra".into()
        } else {
            s.algorithm.into()
        },
        limit: s.limit,
        period: Duration::from_millis(s.period_ms),
        burst: Some(s.burst),
        capacity: key.map(|_| 64),
        mode: if s.shadow {
            Mode::Shadow
        } else {
            Mode::Enforce
        },
        storage,
        stripes: (storage == Storage::Striped).then_some(1),
        delay: None,
    };
    PolicyConfig {
        dry_run: false,
        metrics: true,
        metric_labels: Default::default(),
        descriptor_match: None,
        rules: vec![
            rule("user", Some("user"), &specs[0], Storage::Atomic),
            rule("route", Some("route"), &specs[1], Storage::Atomic),
            rule(
                "global",
                None,
                &specs[2],
                if striped {
                    Storage::Striped
                } else {
                    Storage::Atomic
                },
            ),
        ],
        overrides: Vec::new(),
    }
}

fn quota_of(rule: &RuleConfig) -> Quota {
    Quota::per(rule.period, rule.limit)
        .unwrap()
        .with_burst(rule.burst.unwrap())
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn every_rule_decides_as_its_reference_fed_only_the_admitted_requests(
        specs in [rule_spec(), rule_spec(), rule_spec()],
        striped in any::<bool>(),
        trace in prop::collection::vec((0u64..400, 0u8..3, 0u8..3, 0u64..=4, any::<bool>()), 1..80),
    ) {
        let config = config(&specs, striped);
        let policy = Policy::with_clock(config.clone(), ManualClock::new()).unwrap();
        let refs: Vec<Reference> = config
            .rules
            .iter()
            .map(|r| Reference::new(&r.algorithm, quota_of(r)))
            .collect();
        let mut states: Vec<HashMap<String, u64>> = vec![HashMap::new(); 3];
        let mut now = 0;
        let mut outcomes = Vec::new();
        for (step, user, route, cost, anonymous) in trace {
            now += step * 1_000_000;
            let user = format!("u{user}");
            let route = format!("/r{route}");
            let mut descriptors = vec![("route", route.as_str())];
            if !anonymous {
                descriptors.push(("user", user.as_str()));
            }
            let keys = [
                (!anonymous).then(|| user.clone()),
                Some(route.clone()),
                Some(String::new()),
            ];
            // Errors (a cost above an enforcing rule's capacity) consume nothing: skip them.
            let Ok(decision) = policy.check_detailed_at(&descriptors, now, cost, &mut outcomes) else {
                continue;
            };
            let mut verdicts = Vec::new();
            for o in &outcomes {
                let i = ["user", "route", "global"].iter().position(|n| *n == o.rule).unwrap();
                let key = keys[i].clone().expect("a rule without its descriptor does not apply");
                let state = states[i].get(&key).copied().unwrap_or(0);
                let (expected, next) = refs[i].decide(state, now, cost);
                if config.rules[i].storage == Storage::Striped {
                    if o.decision.is_allowed() {
                        prop_assert!(expected.is_allowed(), "striped over-admitted");
                    }
                } else {
                    prop_assert_eq!(o.decision, expected, "rule {} at {} cost {}", o.rule, now, cost);
                }
                verdicts.push((i, key, o.enforced, o.decision.is_allowed(), next));
            }
            if anonymous {
                prop_assert!(outcomes.iter().all(|o| o.rule != "user"));
            }
            let all = verdicts.iter().filter(|v| v.2).all(|v| v.3);
            prop_assert_eq!(decision.is_allowed(), all);
            if decision.is_allowed() {
                // Feed the admitted request to every rule that admitted it.
                for (i, key, _, allowed, next) in verdicts {
                    if allowed {
                        if let Some(next) = next {
                            states[i].insert(key, next);
                        }
                    }
                }
            }
        }
    }
}
