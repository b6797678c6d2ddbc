//! One config's side of a replay: its policy on the simulated clock and, per rule, the tally
//! (allowed, denied, shadow-denied, denied keys, first denial, timeline).

use std::collections::HashMap;

use tollgate_core::ManualClock;
use tollgate_policy::{ConfigError, PinnedPolicy, Policy, PolicyConfig, RuleOutcome};

use crate::{LoggedRequest, ReplayBounds, Retained};

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
    pub denied_keys: HashMap<Box<str>, u64, foldhash::fast::RandomState>,
    /// Whether more keys were denied than tracked.
    pub keys_overflowed: bool,
    /// The first denial: line number, seconds since the first request, key.
    pub first_denial: Option<(u64, f64, String)>,
    /// Per second: (admitted, denied including shadow); at most [`ReplayBounds::seconds`].
    pub timeline: Vec<(u32, u32)>,
    key_names: Vec<String>,
    /// Where a one-descriptor key's name was last found among a request's descriptors.
    key_at: usize,
}

impl RuleReport {
    /// Counts a denial of `request` (read from line `line`, decided at `now` ns) under its key for
    /// this rule; `scratch` holds the key's text when it is not one descriptor's value.
    #[inline]
    fn count_denial(
        &mut self,
        request: &LoggedRequest<'_>,
        scratch: &mut String,
        bounds: ReplayBounds,
        (line, now): (u64, u64),
    ) {
        let value_of = |name: &str| {
            request
                .descriptors
                .iter()
                .find(|(n, _)| *n == name)
                .map_or("", |(_, v)| v)
        };
        // A one-descriptor key within the bound (the common case) is that value, borrowed from
        // the line; any other is built (and cut) in `scratch`. Logs write their descriptors in
        // one order, so the position where the name was last found is tried first.
        let single = match self.key_names.as_slice() {
            [name] => Some(match request.descriptors.get(self.key_at) {
                Some((n, v)) if n == name => v,
                _ => {
                    let at = request.descriptors.iter().position(|(n, _)| n == name);
                    self.key_at = at.unwrap_or(0);
                    at.and_then(|at| request.descriptors.get(at))
                        .map_or("", |(_, v)| v)
                }
            }),
            _ => None,
        };
        let key = match single {
            Some(value) if value.len() <= bounds.key_bytes => value,
            _ => {
                scratch.clear();
                match single {
                    Some(value) => scratch.push_str(value),
                    None => {
                        for (k, name) in self.key_names.iter().enumerate() {
                            if k > 0 {
                                scratch.push(',');
                            }
                            scratch.push_str(value_of(name));
                        }
                    }
                }
                cut(scratch, bounds.key_bytes);
                scratch.as_str()
            }
        };
        if let Some(count) = self.denied_keys.get_mut(key) {
            *count += 1;
        } else if self.denied_keys.len() < bounds.tracked_keys {
            self.denied_keys.insert(key.into(), 1);
        } else {
            self.keys_overflowed = true;
        }
        if self.first_denial.is_none() {
            #[allow(clippy::cast_precision_loss)]
            let secs = now as f64 / 1e9;
            self.first_denial = Some((line, secs, key.to_owned()));
        }
    }

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
    /// Pinned: a replay never reloads, so no decision loads the rule set.
    policy: PinnedPolicy<ManualClock>,
    outcomes: Vec<RuleOutcome>,
    /// Per rule, in the config's order.
    pub rules: Vec<RuleReport>,
    /// Requests admitted overall.
    pub admitted: u64,
    /// Requests denied overall.
    pub denied: u64,
    /// Requests no enforcing rule could ever admit (cost too large).
    pub errors: u64,
    /// Per rule of the policy (evaluation order): its name as the engine's outcomes carry it
    /// and the index of its report in `rules`.
    by_name: Vec<(&'static str, usize)>,
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
    pub fn with_bounds(
        mut config: PolicyConfig,
        bounds: ReplayBounds,
    ) -> Result<Self, ConfigError> {
        // The tally below is made from each decision's outcomes; the policy's own counters (and
        // the `metrics` facade) would be a second copy nobody reads.
        config.metrics = false;
        let rules: Vec<RuleReport> = config
            .rules
            .iter()
            .map(|r| RuleReport {
                rule: r.name.clone(),
                key_names: r.key.clone(),
                ..RuleReport::default()
            })
            .collect();
        let policy = Policy::with_clock(config, ManualClock::new())?;
        let by_name = policy
            .rules()
            .into_iter()
            .filter_map(|name| {
                let at = rules.iter().position(|r: &RuleReport| r.rule == name)?;
                Some((name, at))
            })
            .collect();
        Ok(Side {
            policy: policy.pinned(),
            outcomes: Vec::with_capacity(8),
            rules,
            by_name,
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
        request: &LoggedRequest<'_>,
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
        let Side {
            outcomes,
            rules,
            by_name,
            key,
            bounds,
            ..
        } = self;
        for outcome in outcomes.iter() {
            let Some(rule) = report_of(by_name, outcome.rule).map(|at| &mut rules[at]) else {
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
                rule.count_denial(request, key, *bounds, (line, now));
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

/// The index of the report of the rule an outcome names: found by the name's address (the engine
/// hands out the names it compiled, the ones `by_name` holds), by its text otherwise.
#[inline]
fn report_of(by_name: &[(&'static str, usize)], rule: &str) -> Option<usize> {
    let same = |name: &str| std::ptr::eq(name, rule);
    by_name
        .iter()
        .find(|(name, _)| same(name))
        .or_else(|| by_name.iter().find(|(name, _)| *name == rule))
        .map(|&(_, at)| at)
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
