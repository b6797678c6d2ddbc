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
        priority: None,
    };
    PolicyConfig {
        dry_run: false,
        metrics: true,
        metric_labels: Default::default(),
        descriptor_match: None,
        concurrency: Vec::new(),
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The `RateLimit` field's `t` that `check_next_at` works out from the admission alone is what
    /// a second look at the deciding rule's state says (`peek_rule_at` of `remaining + 1`), for
    /// every algorithm, a key with an override tier, and a two-stage delay rule.
    #[test]
    fn the_next_unit_from_an_admission_is_what_a_peek_says(
        algorithm in 0..4usize,
        limit in 1u64..20,
        period_ms in 1u64..5000,
        extra_burst in 0u64..10,
        delay in any::<bool>(),
        tier in any::<bool>(),
        steps in proptest::collection::vec((0u64..400, 1u64..4), 1..40),
    ) {
        let algorithm = if delay { ALGORITHMS[algorithm % 2] } else { ALGORITHMS[algorithm] };
        let bucket = algorithm == "gcra" || algorithm == "leaky_bucket";
        let burst = if bucket { format!("burst = {}\n", limit + extra_burst) } else { String::new() };
        let delay_line = if delay { "delay = { max_delay = \"2s\" }\n" } else { "" };
        let overrides = if tier && !delay {
            "[[overrides]]\nrule = \"r\"\nvalues = [\"vip\"]\nlimit = 7\nperiod = \"3s\"\n"
        } else {
            ""
        };
        let config = format!(
            "[[rules]]\nname = \"r\"\nmatch = {{ k = \"any\" }}\nkey = [\"k\"]\nalgorithm = \"{algorithm}\"\n\
             limit = {limit}\nperiod = \"{period_ms}ms\"\ncapacity = 10\n{burst}{delay_line}{overrides}"
        );
        let Ok(config) = PolicyConfig::from_toml(&config) else { return Ok(()) };
        let Ok(policy) = Policy::with_clock(config, ManualClock::new()) else { return Ok(()) };
        let request = [("k", if tier { "vip" } else { "plain" })];
        let mut now = 1_000_000_000u64;
        for (step_ms, cost) in steps {
            now += step_ms * 1_000_000;
            let Ok((decided, next)) = policy.check_next_at(&request, now, cost) else { continue };
            if !decided.is_allowed() {
                prop_assert_eq!(next, decided.decision.retry_after());
                continue;
            }
            let more = decided.decision.remaining() + 1;
            let peeked = match policy.peek_rule_at("r", &request, now, more) {
                Some(Ok(peeked)) => peeked.retry_after(),
                // More than the rule can ever admit at once: no next unit.
                Some(Err(_)) => None,
                None => unreachable!("the rule applies"),
            };
            prop_assert_eq!(next, peeked, "{} after {:?}", algorithm, decided);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// `check_all_at` decides a group as one: an admitted group leaves exactly what deciding its
    /// requests one by one leaves, a refused one leaves no trace in any rule.
    #[test]
    fn a_refused_group_leaves_no_trace(
        groups in proptest::collection::vec(
            (0u64..300, proptest::collection::vec((0usize..4, 1u64..3), 1..4)),
            1..30,
        ),
    ) {
        let config = PolicyConfig::from_toml(
            "[[rules]]\nname = \"per_user\"\nmatch = { user = \"any\" }\nkey = [\"user\"]\n\
             limit = 3\nperiod = \"1s\"\ncapacity = 16\n\
             [[rules]]\nname = \"global\"\nalgorithm = \"fixed_window\"\nlimit = 8\nperiod = \"1s\"\n",
        )
        .unwrap();
        let policy = Policy::with_clock(config.clone(), ManualClock::new()).unwrap();
        let twin = Policy::with_clock(config, ManualClock::new()).unwrap();
        let users = ["a", "b", "c", "d"];
        let mut now = 1_000_000_000u64;
        for (step_ms, group) in groups {
            now += step_ms * 1_000_000;
            let descriptors: Vec<[(&str, &str); 1]> =
                group.iter().map(|&(u, _)| [("user", users[u])]).collect();
            let requests: Vec<(&[(&str, &str)], u64)> = descriptors
                .iter()
                .zip(&group)
                .map(|(d, &(_, cost))| (&d[..], cost))
                .collect();
            let answers = policy.check_all_at(&requests, now);
            let admitted = answers.iter().all(|a| a.as_ref().is_ok_and(|(d, _)| d.is_allowed()));
            if admitted {
                for &(descriptors, cost) in &requests {
                    prop_assert!(twin.check_at(descriptors, now, cost).unwrap().is_allowed());
                }
            }
            for user in users {
                let request = [("user", user)];
                for rule in ["per_user", "global"] {
                    let a = policy.peek_rule_at(rule, &request, now, 1).unwrap().unwrap();
                    let b = twin.peek_rule_at(rule, &request, now, 1).unwrap().unwrap();
                    prop_assert_eq!(a, b, "{} for {} after {:?}", rule, user, answers);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// A pinned policy peeks every rule first after a denial and writes nothing when the request
    /// is denied again (`PinnedPolicy`); its answers, every rule's outcome and the counters are a
    /// plain policy's, fed the same requests, for every algorithm, shadow rules, costs no rule can
    /// admit and a striped global rule (decided plainly).
    #[test]
    fn a_pinned_policy_peeking_first_answers_as_a_plain_one(
        specs in [rule_spec(), rule_spec(), rule_spec()],
        striped in any::<bool>(),
        trace in prop::collection::vec((0u64..400, 0u8..3, 0u8..3, 0u64..=7, any::<bool>()), 1..120),
    ) {
        let config = config(&specs, striped);
        let plain = Policy::with_clock(config.clone(), ManualClock::new()).unwrap();
        let pinned = Policy::with_clock(config, ManualClock::new()).unwrap().pinned();
        let (mut plain_outcomes, mut pinned_outcomes) = (Vec::new(), Vec::new());
        let mut now = 0;
        for (step, user, route, cost, anonymous) in trace {
            now += step * 1_000_000;
            let (user, route) = (format!("u{user}"), format!("/r{route}"));
            let mut descriptors = vec![("route", route.as_str())];
            if !anonymous {
                descriptors.push(("user", user.as_str()));
            }
            let expected = plain.check_detailed_at(&descriptors, now, cost, &mut plain_outcomes);
            let got = pinned.check_detailed_at(&descriptors, now, cost, &mut pinned_outcomes);
            prop_assert_eq!(&got, &expected, "at {} cost {}", now, cost);
            prop_assert_eq!(&pinned_outcomes, &plain_outcomes, "at {} cost {}", now, cost);
        }
        prop_assert_eq!(pinned.policy().snapshot(), plain.snapshot());
    }
}
