//! One config's side of a replay: its policy on the simulated clock and, per rule, the tally
//! (allowed, denied, shadow-denied, denied keys, first denial, timeline).

use std::collections::HashMap;

use tollgate_core::ManualClock;
use tollgate_policy::{ConfigError, Policy, PolicyConfig, RuleOutcome};

use crate::{ReplayBounds, Request, Retained};

/// One rule's tally.
#[derive(Clone, Debug, Default)]
pub struct RuleReport {
    /// The rule's name.
    pub rule: String,
    /// Its own admissions.
    pub allowed: u64,
    /// Its enforced denials.
    pub denied: u64,
    /// What it would have denied, as a shadow rule (or under dry run).
    pub shadow_denied: u64,
    /// Denials (enforced or shadow) per key; at most [`ReplayBounds::tracked_keys`] keys, each
    /// at most [`ReplayBounds::key_bytes`] long.
    pub denied_keys: HashMap<Box<str>, u64>,
    /// Whether more keys were denied than tracked.
    pub keys_overflowed: bool,
    /// The first denial: line number, seconds since the first request, key.
    pub first_denial: Option<(u64, f64, String)>,
    /// Per second: (admitted, denied including shadow); at most [`ReplayBounds::seconds`].
    pub timeline: Vec<(u32, u32)>,
    key_names: Vec<String>,
}

impl RuleReport {
    /// The `n` keys with the most denials, most first (ties by key).
    pub fn top_denied(&self, n: usize) -> Vec<(&str, u64)> {
        let mut keys: Vec<(&str, u64)> = self.denied_keys.iter().map(|(k, v)| (&**k, *v)).collect();
        keys.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        keys.truncate(n);
        keys
    }
}

/// One config's replay.
pub struct Side {
    policy: Policy<ManualClock>,
    outcomes: Vec<RuleOutcome>,
    /// Per rule, in the config's order.
    pub rules: Vec<RuleReport>,
    /// Requests admitted overall.
    pub admitted: u64,
    /// Requests denied overall.
    pub denied: u64,
    /// Requests no enforcing rule could ever admit (cost too large).
    pub errors: u64,
    key: String,
    bounds: ReplayBounds,
}

impl Side {
    /// Builds the policy for `config` on a manual clock.
    ///
    /// # Errors
    /// The config's [`ConfigError`].
    pub fn new(config: PolicyConfig) -> Result<Self, ConfigError> {
        Side::with_bounds(config, ReplayBounds::default())
    }

    /// [`new`](Self::new), keeping at most what `bounds` allows.
    ///
    /// # Errors
    /// The config's [`ConfigError`].
    pub fn with_bounds(config: PolicyConfig, bounds: ReplayBounds) -> Result<Self, ConfigError> {
        let rules = config
            .rules
            .iter()
            .map(|r| RuleReport {
                rule: r.name.clone(),
                key_names: r.key.clone(),
                ..RuleReport::default()
            })
            .collect();
        Ok(Side {
            policy: Policy::with_clock(config, ManualClock::new())?,
            outcomes: Vec::with_capacity(8),
            rules,
            admitted: 0,
            denied: 0,
            errors: 0,
            key: String::new(),
            bounds,
        })
    }

    #[inline]
    pub(crate) fn decide(
        &mut self,
        request: &Request<'_>,
        now: u64,
        line: u64,
        second: Option<usize>,
    ) {
        let decided = self.policy.check_detailed_at(
            &request.descriptors,
            now,
            request.cost,
            &mut self.outcomes,
        );
        match decided {
            Ok(d) if d.is_allowed() => self.admitted += 1,
            Ok(_) => self.denied += 1,
            Err(_) => self.errors += 1,
        }
        for outcome in &self.outcomes {
            let Some(rule) = self.rules.iter_mut().find(|r| r.rule == outcome.rule) else {
                continue;
            };
            let allowed = outcome.decision.is_allowed();
            if allowed {
                rule.allowed += 1;
            } else if outcome.enforced {
                rule.denied += 1;
            } else {
                rule.shadow_denied += 1;
            }
            if let Some(s) = second {
                if rule.timeline.len() <= s {
                    rule.timeline.resize(s + 1, (0, 0));
                }
                let slot = &mut rule.timeline[s];
                if allowed {
                    slot.0 += 1;
                } else {
                    slot.1 += 1;
                }
            }
            if !allowed {
                self.key.clear();
                for (k, name) in rule.key_names.iter().enumerate() {
                    if k > 0 {
                        self.key.push(',');
                    }
                    let value = request
                        .descriptors
                        .iter()
                        .find(|(n, _)| n == name)
                        .map_or("", |(_, v)| v);
                    self.key.push_str(value);
                }
                cut(&mut self.key, self.bounds.key_bytes);
                if let Some(count) = rule.denied_keys.get_mut(self.key.as_str()) {
                    *count += 1;
                } else if rule.denied_keys.len() < self.bounds.tracked_keys {
                    rule.denied_keys.insert(self.key.as_str().into(), 1);
                } else {
                    rule.keys_overflowed = true;
                }
                if rule.first_denial.is_none() {
                    #[allow(clippy::cast_precision_loss)]
                    let secs = now as f64 / 1e9;
                    rule.first_denial = Some((line, secs, self.key.clone()));
                }
            }
        }
    }

    pub(crate) fn retained(&self) -> Retained {
        let mut held = Retained::default();
        for rule in &self.rules {
            held.denied_keys += rule.denied_keys.len();
            held.key_bytes += rule.denied_keys.keys().map(|k| k.len()).sum::<usize>();
            held.timeline_slots += rule.timeline.len();
        }
        held
    }
}

/// Cuts `key` to at most `max` bytes (on a character boundary), ending in `...` when cut.
fn cut(key: &mut String, max: usize) {
    if key.len() <= max {
        return;
    }
    let mut end = max.saturating_sub(3);
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    key.truncate(end);
    key.push_str("...");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Format, Replay, ReplayBounds};
    use tollgate_policy::PolicyConfig;

    #[test]
    fn a_long_key_is_cut_on_a_character_boundary() {
        let mut key = "é".repeat(10); // 20 bytes
        cut(&mut key, 8);
        assert_eq!(key, "éé...");
        let mut short = "abcd".to_owned();
        cut(&mut short, 4);
        assert_eq!(short, "abcd");
    }

    #[test]
    fn a_denied_key_past_the_bound_is_tracked_cut() {
        let config = PolicyConfig::from_toml(
            r#"
            [[rules]]
            name = "per_user"
            match = { user = "any" }
            key = ["user"]
            limit = 1
            period = "1h"
            capacity = 10
            "#,
        )
        .expect("config");
        let bounds = ReplayBounds {
            key_bytes: 8,
            ..ReplayBounds::default()
        };
        let mut replay = Replay::with_bounds(config, None, bounds).expect("replay");
        let line = r#"{"ts":1,"descriptors":{"user":"abcdefghijkl"}}"#;
        let log = format!("{line}\n{line}\n");
        replay.run(log.as_bytes(), Format::Json).expect("read");
        let rule = &replay.new.rules[0];
        assert_eq!(rule.top_denied(1), [("abcde...", 1)]);
        assert_eq!(
            rule.first_denial.as_ref().map(|d| d.2.as_str()),
            Some("abcde...")
        );
    }
}
