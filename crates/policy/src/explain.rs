//! Why a request was allowed or denied: [`Policy::explain_at`] decides as
//! [`check_at`](Policy::check_at) does and returns, beside the decision, each rule's part in it.
//!
//! A separate entry point, so the plain decision path carries nothing for it: it reads the compiled
//! rules, peeks each applicable rule's state before and after, and runs the same engine decision
//! (one [`engine::decide`] with per-rule outcomes). Before and after are separate reads: under
//! concurrent traffic on the same key they include other requests' decisions.

use std::fmt;
use std::time::Duration;

use serde::Serialize;
use tollgate_core::{Clock, Decision, Nanos, Quota};

use crate::config::MatchSpec;
use crate::decision::{Descriptors, PolicyDecision, PolicyError, RuleOutcome};
use crate::descriptor_match::DescriptorMatch;
use crate::engine;
use crate::inflight::Admission;
use crate::policy::Policy;
use crate::rules::{KeyBuf, Rule, RuleSet};

/// A decision's trace: every rule in evaluation order, and which decided.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Explanation {
    /// Each rule of the policy, in evaluation order.
    pub rules: Vec<RuleTrace>,
    /// The rule that decided (see [`PolicyDecision::rule`]).
    pub deciding: Option<&'static str>,
    /// Whether the request was admitted.
    pub allowed: bool,
    /// Whether every rule ran as shadow (dry run).
    pub dry_run: bool,
}

/// One rule's part in a decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuleTrace {
    /// The rule.
    pub rule: &'static str,
    /// Why it did not apply; `None` when it applied.
    pub skipped: Option<Skipped>,
    /// Its key for this request (values joined by `,`; empty for a global rule).
    pub key: Option<String>,
    /// The quota for that key.
    pub quota: Option<QuotaView>,
    /// The override tier the key is in, when it has one (its label, or `"override"`).
    pub tier: Option<String>,
    /// Whether its denial counts (false for shadow rules and under dry run).
    pub enforced: bool,
    /// Its state before the decision: `remaining` is the units available then (a look at one
    /// unit, plus that unit).
    pub before: Option<StateView>,
    /// Its own verdict (a rule after an enforcing denial is only peeked).
    pub decision: Option<StateView>,
    /// Its state after the decision (refunds included), as `before`.
    pub after: Option<StateView>,
    /// Units given back: it admitted, and the request was denied (or could not be decided).
    pub refunded: u64,
}

/// Why a rule did not apply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Skipped {
    /// A descriptor its `match` names is missing.
    Missing {
        /// The descriptor.
        descriptor: String,
    },
    /// A descriptor's value does not match.
    NoMatch {
        /// The descriptor.
        descriptor: String,
        /// Its value in the request.
        value: String,
        /// What the rule wants (`exact:GET`, `prefix:/api/`).
        wants: String,
    },
    /// `descriptor_match = "exact"` and the request has an entry the rule does not name.
    Unnamed {
        /// The entry.
        descriptor: String,
    },
}

/// A quota as shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct QuotaView {
    /// Units per period.
    pub limit: u64,
    /// The period, in milliseconds.
    pub period_ms: u64,
    /// Bucket depth.
    pub burst: u64,
}

impl From<Quota> for QuotaView {
    fn from(q: Quota) -> Self {
        QuotaView {
            limit: q.limit(),
            period_ms: millis(q.period()),
            burst: q.burst(),
        }
    }
}

/// A rule's answer or state, as numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct StateView {
    /// Whether it admits (for a state: whether one more unit would pass).
    pub allowed: bool,
    /// Units left (0 when denied).
    pub remaining: u64,
    /// Until the state is fresh again, in milliseconds.
    pub reset_after_ms: u64,
    /// On a denial, the wait in milliseconds.
    pub retry_after_ms: Option<u64>,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl From<Decision> for StateView {
    fn from(d: Decision) -> Self {
        StateView {
            allowed: d.is_allowed(),
            remaining: d.remaining(),
            reset_after_ms: millis(d.reset_after()),
            retry_after_ms: d.retry_after().map(millis),
        }
    }
}

impl<C: Clock + Clone + 'static> Policy<C> {
    /// [`check_at`](Self::check_at) with its trace: the same decision (it consumes as `check_at`
    /// does), and per rule whether it applied (and why not), its key, quota and tier, its state
    /// before and after, its own verdict and what it was refunded.
    ///
    /// ```
    /// use tollgate_core::ManualClock;
    /// use tollgate_policy::{Policy, PolicyConfig};
    /// let config = PolicyConfig::from_toml(r#"
    ///     [[rules]]
    ///     name = "per_ip"
    ///     match = { remote_address = "any" }
    ///     key = ["remote_address"]
    ///     limit = 1
    ///     period = "1s"
    ///     capacity = 100
    ///     [[rules]]
    ///     name = "api"
    ///     match = { path = { prefix = "/api/" } }
    ///     limit = 10
    ///     period = "1s"
    /// "#)?;
    /// let policy = Policy::with_clock(config, ManualClock::new())?;
    /// let ip = [("remote_address", "192.0.2.1"), ("path", "/")];
    /// policy.check_at(&ip, 0, 1)?;
    /// let (decision, why) = policy.explain_at(&ip, 0, 1)?;
    /// assert!(!decision.is_allowed());
    /// assert_eq!(why.deciding, Some("per_ip"));
    /// assert_eq!(why.rules[0].key.as_deref(), Some("192.0.2.1"));
    /// assert!(why.rules[1].skipped.is_some()); // "/" is not under "/api/"
    /// println!("{why}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`check_at`](Self::check_at).
    pub fn explain_at(
        &self,
        descriptors: &Descriptors<'_>,
        now: Nanos,
        cost: u64,
    ) -> Result<(PolicyDecision, Explanation), PolicyError> {
        let live = self.current.load();
        let set = &live.rules;
        let dry = self.dry_run();
        let values = set.resolve(descriptors);
        let mut rules: Vec<RuleTrace> = Vec::with_capacity(set.rules.len());
        let mut keys: Vec<Option<KeyBuf>> = Vec::with_capacity(set.rules.len());
        for rule in set.rules.iter() {
            let skipped = why_not(set, rule, &values);
            let mut buf = KeyBuf::new();
            let key = match skipped {
                None => rule.key(&values, &mut buf).map(KeyBuf::from_slice),
                Some(_) => None,
            };
            let shown_key = key.as_ref().map(|k| show_key(rule, k));
            let tier = key
                .as_ref()
                .and_then(|k| rule.override_for(k))
                .map(|_| tier_of(set, rule, &values));
            rules.push(RuleTrace {
                rule: rule.name,
                skipped,
                quota: key.as_ref().map(|k| {
                    QuotaView::from(if rule.delay.is_some() {
                        rule.shown
                    } else {
                        rule.effective_for(k)
                    })
                }),
                key: shown_key,
                tier,
                enforced: rule.enforced(dry),
                before: None,
                decision: None,
                after: None,
                refunded: 0,
            });
            keys.push(key);
        }
        let look = |i: usize| -> Option<StateView> {
            let key = keys[i].as_ref()?;
            let peeked = live.store.limiters[i].peek(key, now, 1).ok()?;
            let mut state = StateView::from(set.rules[i].shown(peeked).0);
            // A look at one unit answers what would be left after it: the state has one more.
            if state.allowed {
                state.remaining = state.remaining.saturating_add(1);
            }
            Some(state)
        };
        for (i, trace) in rules.iter_mut().enumerate() {
            trace.before = look(i);
        }
        let mut outcomes: Vec<RuleOutcome> = Vec::with_capacity(set.rules.len());
        let decided = engine::decide(
            set,
            &live.store,
            descriptors,
            dry,
            now,
            cost,
            Some(&mut outcomes),
            false,
        );
        let refused = !matches!(&decided, Ok((d, _)) if d.is_allowed());
        for outcome in &outcomes {
            if let Some(trace) = rules.iter_mut().find(|t| t.rule == outcome.rule) {
                trace.decision = Some(outcome.decision.into());
            }
        }
        for (i, trace) in rules.iter_mut().enumerate() {
            trace.after = look(i);
            // The engine gives back what every rule checked before the denial admitted; the
            // rules after it were only peeked and kept nothing.
            if refused && trace.decision.is_some_and(|d| d.allowed) {
                let denied_at = outcomes
                    .iter()
                    .position(|o| !o.decision.is_allowed() && o.enforced);
                let position = outcomes.iter().position(|o| o.rule == trace.rule);
                if denied_at.is_none() || position < denied_at {
                    trace.refunded = cost;
                }
            }
        }
        let (decision, _) = decided?;
        let explanation = Explanation {
            rules,
            deciding: decision.rule,
            allowed: decision.is_allowed(),
            dry_run: dry,
        };
        Ok((decision, explanation))
    }
}

impl<C: Clock + Clone + 'static> Policy<C> {
    /// [`check_next_at`](Self::check_next_at) with its trace: [`explain_at`](Self::explain_at),
    /// and the deciding rule's wait for one unit more than it left (the `RateLimit` field's `t`),
    /// from a read-only look at that rule as `check_next_at` works it out. For an edge that
    /// renders an explained decision as it renders a plain one.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_core::ManualClock;
    /// use tollgate_policy::{Policy, PolicyConfig};
    /// let config = PolicyConfig::from_toml(r#"
    ///     [[rules]]
    ///     name = "global"
    ///     limit = 2
    ///     period = "1s"
    /// "#)?;
    /// let policy = Policy::with_clock(config, ManualClock::new())?;
    /// let (decided, next, why) = policy.explain_next_at(&[], 0, 1)?;
    /// assert_eq!(decided.decision.remaining(), 1);
    /// assert_eq!(next, Some(Duration::from_millis(500)));
    /// assert_eq!(why.deciding, Some("global"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`check_at`](Self::check_at).
    #[allow(clippy::type_complexity)]
    pub fn explain_next_at(
        &self,
        descriptors: &Descriptors<'_>,
        now: Nanos,
        cost: u64,
    ) -> Result<(PolicyDecision, Option<Duration>, Explanation), PolicyError> {
        let (decision, why) = self.explain_at(descriptors, now, cost)?;
        let next = match (decision.rule, decision.decision) {
            (Some(rule), Decision::Allowed { remaining, .. }) => remaining
                .checked_add(1)
                .and_then(|more| self.peek_rule_at(rule, descriptors, now, more))
                .and_then(Result::ok)
                .and_then(|d| d.retry_after()),
            _ => None,
        };
        Ok((decision, next, why))
    }

    /// [`admit_at`](Self::admit_at) with its trace: the same admission (permits held, units
    /// consumed), the rate rules decided by [`explain_next_at`](Self::explain_next_at). When a
    /// concurrency rule denies, the rate rules are not checked, and the trace names only the
    /// deciding concurrency rule (no rule traces).
    ///
    /// ```
    /// use tollgate_core::ManualClock;
    /// use tollgate_policy::{Policy, PolicyConfig};
    /// let config = PolicyConfig::from_toml(r#"
    ///     [[concurrency]]
    ///     name = "one_at_a_time"
    ///     limit = 1
    ///     [[rules]]
    ///     name = "global"
    ///     limit = 10
    ///     period = "1s"
    /// "#)?;
    /// let policy = Policy::with_clock(config, ManualClock::new())?;
    /// let (held, why) = policy.admit_explained_at(&[], 0, 1)?;
    /// assert!(held.is_allowed());
    /// assert_eq!(why.deciding, Some("global"));
    /// let (busy, why) = policy.admit_explained_at(&[], 0, 1)?;
    /// assert!(busy.denied_by_concurrency());
    /// assert_eq!(why.to_string(), "denied by one_at_a_time");
    /// # drop(held);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`admit_at`](Self::admit_at).
    pub fn admit_explained_at(
        &self,
        descriptors: &Descriptors<'_>,
        now: Nanos,
        cost: u64,
    ) -> Result<(Admission, Explanation), PolicyError> {
        let mut trace = None;
        let admission = self.admit_with(descriptors, now, cost, || {
            let (decision, next, why) = self.explain_next_at(descriptors, now, cost)?;
            trace = Some(why);
            Ok((decision, next))
        })?;
        let why = trace.unwrap_or_else(|| Explanation {
            rules: Vec::new(),
            deciding: admission.decision.rule,
            allowed: admission.is_allowed(),
            dry_run: self.dry_run(),
        });
        Ok((admission, why))
    }
}

/// Why `rule` does not apply to a request with these resolved values (`None`: it applies).
fn why_not(set: &RuleSet, rule: &Rule, values: &[Option<&str>]) -> Option<Skipped> {
    for (i, spec) in rule.matches.iter() {
        let descriptor = set.names[*i].to_string();
        match values[*i] {
            None => return Some(Skipped::Missing { descriptor }),
            Some(value) if !spec.matches(value) => {
                return Some(Skipped::NoMatch {
                    descriptor,
                    value: value.to_owned(),
                    wants: match spec {
                        MatchSpec::Exact(v) => format!("exact:{v}"),
                        MatchSpec::Prefix(p) => format!("prefix:{p}"),
                        MatchSpec::Any => "any".to_owned(),
                    },
                });
            }
            Some(_) => {}
        }
    }
    if rule.descriptor_match == DescriptorMatch::Exact {
        for (i, value) in values.iter().enumerate() {
            if value.is_some() && !rule.matches.iter().any(|&(j, _)| j == i) {
                let descriptor = match set.names.get(i) {
                    Some(name) => name.to_string(),
                    // The slot past the names holds the first entry no rule names.
                    None => (*value).unwrap_or_default().to_owned(),
                };
                return Some(Skipped::Unnamed { descriptor });
            }
        }
    }
    None
}

/// The key as text: the values, joined by `,`.
fn show_key(rule: &Rule, key: &[u8]) -> String {
    if rule.key.len() <= 1 {
        return String::from_utf8_lossy(key).into_owned();
    }
    let mut parts = Vec::new();
    let mut rest = key;
    while rest.len() >= 4 {
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let end = (4 + len).min(rest.len());
        parts.push(String::from_utf8_lossy(&rest[4..end]).into_owned());
        rest = &rest[end..];
    }
    parts.join(",")
}

/// The override tier label of the request's key for `rule`.
fn tier_of(set: &RuleSet, rule: &Rule, values: &[Option<&str>]) -> String {
    let value = rule
        .key
        .first()
        .and_then(|&i| values[i])
        .unwrap_or_default();
    set.config
        .overrides
        .iter()
        .find(|o| o.rule == rule.name && o.values.iter().any(|v| v == value))
        .and_then(|o| o.tier.clone())
        .unwrap_or_else(|| "override".to_owned())
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} by {}{}",
            if self.allowed { "allowed" } else { "denied" },
            self.deciding.unwrap_or("no enforcing rule"),
            if self.dry_run { " (dry run)" } else { "" }
        )?;
        for t in &self.rules {
            write!(f, "; {}: ", t.rule)?;
            if let Some(skipped) = &t.skipped {
                match skipped {
                    Skipped::Missing { descriptor } => write!(f, "skipped, no `{descriptor}`")?,
                    Skipped::NoMatch {
                        descriptor,
                        value,
                        wants,
                    } => write!(f, "skipped, `{descriptor}` = `{value}` is not {wants}")?,
                    Skipped::Unnamed { descriptor } => {
                        write!(f, "skipped, `{descriptor}` is not in its match (exact)")?;
                    }
                }
                continue;
            }
            let verdict = match t.decision {
                Some(d) if d.allowed => "allowed",
                Some(_) if t.enforced => "denied",
                Some(_) => "shadow-denied",
                None => "not decided",
            };
            write!(f, "key `{}` {verdict}", t.key.as_deref().unwrap_or(""))?;
            if let Some(q) = t.quota {
                write!(f, ", quota {}/{}ms burst {}", q.limit, q.period_ms, q.burst)?;
            }
            if let Some(tier) = &t.tier {
                write!(f, " (tier {tier})")?;
            }
            if let (Some(b), Some(a)) = (t.before, t.after) {
                write!(f, ", remaining {} -> {}", b.remaining, a.remaining)?;
            }
            if t.refunded > 0 {
                write!(f, ", refunded {}", t.refunded)?;
            }
        }
        Ok(())
    }
}
