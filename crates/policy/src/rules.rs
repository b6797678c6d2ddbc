//! The compiled rule set: everything validation works out, read once, and no storage. Matching,
//! key building, the effective and the shown quota, override tiers and the two-stage delay live
//! here; where a rule's state is kept is a [store](crate::store)'s business.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering as StdOrdering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use smallvec::SmallVec;
use tollgate_core::{Decision, Nanos, Quota};

use crate::config::{AlgorithmKind, MatchSpec, Mode, PolicyConfig, RuleConfig, Storage};
use crate::config_error::{ConfigError, ConfigErrorKind};
use crate::decision::Descriptors;
use crate::descriptor_match::{self, DescriptorMatch};
use crate::priority::Priority;
use crate::reload_plan::Identity;
use crate::short_eq;
use crate::stats::{Counters, Outcome, PolicySnapshot, RuleStats};
use crate::validate::{ValidRule, delay_units};

/// Each descriptor name's value in one request, indexed as [`RuleSet::names`].
pub(crate) type Values<'a> = SmallVec<[Option<&'a str>; 8]>;
/// Scratch for a composite key.
pub(crate) type KeyBuf = SmallVec<[u8; 128]>;

/// The rules decisions read: built once per load or reload, never changed afterwards.
pub(crate) struct RuleSet {
    /// Unique for the process (never reused): what a [`DescriptorSchema`](crate::DescriptorSchema)'s
    /// cached resolution is keyed by.
    pub(crate) id: u64,
    /// Descriptor names the rules use; rules refer to them by index.
    pub(crate) names: Box<[Box<str>]>,
    /// The hash tag descriptor's index in `names` (a Redis policy's `hash_tag`), if any rule uses
    /// it; see [`tag_of`](Self::tag_of).
    pub(crate) tag: Option<usize>,
    pub(crate) rules: Box<[Rule]>,
    pub(crate) dry_run: bool,
    pub(crate) metrics: bool,
    /// Whether every rule's peek decides as its check would (no striped rule, whose leases make
    /// a check admit what a look at the shared word would not, and no priority headroom, which
    /// only a check keeps): `engine::decide_values_peeking_first` relies on it.
    pub(crate) peeks_decide: bool,
    pub(crate) config: PolicyConfig,
}

/// One compiled rule.
pub(crate) struct Rule {
    pub(crate) name: &'static str,
    pub(crate) matches: Box<[(usize, MatchSpec)]>,
    /// The policy's `descriptor_match` (whether entries the rule does not name keep it out).
    pub(crate) descriptor_match: DescriptorMatch,
    pub(crate) key: Box<[usize]>,
    pub(crate) mode: Mode,
    pub(crate) algorithm: AlgorithmKind,
    /// The effective quota (a delay's extra depth included).
    pub(crate) quota: Quota,
    /// The quota as configured, for decisions and headers.
    pub(crate) shown: Quota,
    /// Two-stage delay: extra units beyond the burst, and the burst's depth in nanoseconds.
    pub(crate) delay: Option<(u64, Nanos)>,
    /// `remaining` at or below this is near the limit (20 % of the default capacity).
    pub(crate) near: u64,
    pub(crate) identity: Identity,
    /// Override quotas by key value (single-descriptor keys only).
    pub(crate) overrides: HashMap<String, Quota>,
    pub(crate) counters: Arc<Counters>,
    /// Priority classes and the headroom each must leave (`None`: every request alike).
    pub(crate) priority: Option<Priority>,
    /// Whether `applies` is only "every matched descriptor present": each match is `any`, no
    /// priority, subset matching (worked out at compile time).
    pub(crate) any_match: bool,
}

/// A new identity for a schema or a rule set: unique for the process (64 bits never wrap).
pub(crate) fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    // Relaxed: the RMW alone makes each value unique; it orders nothing else. (Plain std: an
    // identity is not synchronised state, so the loom build needs no model of it.)
    NEXT.fetch_add(1, StdOrdering::Relaxed)
}

/// Rule names live for the process: decisions hand out `&'static str` without a reference count.
/// One allocation per distinct name ever configured.
pub(crate) fn intern(name: &str) -> &'static str {
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(&name) = names.get(name) {
        return name;
    }
    let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.insert(leaked);
    leaked
}

impl Rule {
    /// Compiles one validated rule; `index_of` numbers the descriptor names of its rule set.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn compile(
        rc: &RuleConfig,
        valid: &ValidRule,
        descriptor_match: DescriptorMatch,
        index_of: &mut impl FnMut(&str) -> usize,
        identity: Identity,
        overrides: HashMap<String, Quota>,
        counters: Arc<Counters>,
    ) -> Result<Rule, ConfigError> {
        let shown = match rc.delay {
            Some(_) => Quota::per(rc.period, rc.limit)
                .and_then(|q| rc.burst.map_or(Ok(q), |b| q.with_burst(b)))
                .map_err(|e| {
                    ConfigError::new(Some(&rc.name), "limit", ConfigErrorKind::Quota(e))
                })?,
            None => valid.quota,
        };
        let delay = rc
            .delay
            .map(|d| (delay_units(&shown, d.max_delay), shown.burst_nanos()));
        let priority = rc
            .priority
            .as_ref()
            .and_then(|p| Priority::compile(p, index_of));
        let capacity = match valid.algorithm {
            AlgorithmKind::Gcra | AlgorithmKind::LeakyBucket => shown.burst(),
            _ => shown.limit(),
        };
        let any_match = priority.is_none()
            && descriptor_match == DescriptorMatch::Subset
            && rc
                .matches
                .values()
                .all(|spec| matches!(spec, MatchSpec::Any));
        Ok(Rule {
            any_match,
            name: intern(&rc.name),
            matches: rc
                .matches
                .iter()
                .map(|(d, spec)| (index_of(d), spec.clone()))
                .collect(),
            descriptor_match,
            key: rc.key.iter().map(|d| index_of(d)).collect(),
            mode: rc.mode,
            algorithm: valid.algorithm,
            quota: valid.quota,
            shown,
            delay,
            near: capacity / 5,
            identity,
            overrides,
            counters,
            priority,
        })
    }

    #[inline(always)]
    pub(crate) fn applies(&self, values: &[Option<&str>]) -> bool {
        // Loops rather than `Iterator::all`, which was left a call per rule (not inlined).
        if self.any_match {
            for &(i, _) in &self.matches {
                if values.get(i).is_none_or(Option::is_none) {
                    return false;
                }
            }
            return true;
        }
        for (i, spec) in &self.matches {
            if !values
                .get(*i)
                .copied()
                .flatten()
                .is_some_and(|v| spec.matches(v))
            {
                return false;
            }
        }
        match &self.priority {
            None => descriptor_match::admits(self.descriptor_match, &self.matches, values),
            Some(p) => p.admits(self.descriptor_match, &self.matches, values),
        }
    }

    /// Whether this rule's denials count for the request (not shadow, not a dry run).
    #[inline]
    pub(crate) fn enforced(&self, dry: bool) -> bool {
        self.mode == Mode::Enforce && !dry
    }

    /// The key bytes: nothing for a global rule, the value for one descriptor, and length-prefixed
    /// values for several (so no two tuples share an encoding). `None`: a key descriptor is missing.
    #[inline(always)]
    pub(crate) fn key<'a>(
        &self,
        values: &[Option<&'a str>],
        buf: &'a mut KeyBuf,
    ) -> Option<&'a [u8]> {
        match *self.key {
            [] => Some(&[]),
            [one] => values[one].map(str::as_bytes),
            ref many => {
                buf.clear();
                for &i in many {
                    let value = values[i]?;
                    let len = u32::try_from(value.len()).unwrap_or(u32::MAX);
                    buf.extend_from_slice(&len.to_le_bytes());
                    buf.extend_from_slice(value.as_bytes());
                }
                Some(&buf[..])
            }
        }
    }

    /// The decision as configured (a delayed rule's extra depth taken off `remaining`), and the wait.
    #[inline]
    pub(crate) fn shown(&self, decision: Decision) -> (Decision, Duration) {
        match (self.delay, decision) {
            (
                Some((extra, depth)),
                Decision::Allowed {
                    remaining,
                    reset_after,
                },
            ) => {
                let wait = reset_after.saturating_sub(Duration::from_nanos(depth));
                (
                    Decision::Allowed {
                        remaining: remaining.saturating_sub(extra),
                        reset_after,
                    },
                    wait,
                )
            }
            _ => (decision, Duration::ZERO),
        }
    }

    /// The override quota for this key, if it has one.
    #[inline(always)]
    pub(crate) fn override_for(&self, key: &[u8]) -> Option<Quota> {
        if self.overrides.is_empty() {
            return None;
        }
        std::str::from_utf8(key)
            .ok()
            .and_then(|value| self.overrides.get(value))
            .copied()
    }

    /// The quota this key is limited by, as a store must apply it: its override, or the effective
    /// quota (a delay's extra depth included).
    #[inline(always)]
    pub(crate) fn effective_for(&self, key: &[u8]) -> Quota {
        self.override_for(key).unwrap_or(self.quota)
    }

    /// Counts one of this rule's own decisions.
    #[inline]
    pub(crate) fn count(&self, enforced: bool, decision: &Decision) {
        self.count_code(self.counted(enforced, decision));
    }

    /// What [`count`](Self::count) counts for a decision, as a code of at most 3 bits (never 0),
    /// for a pass that counts only once it is the answer (`engine::Tally`).
    #[inline]
    pub(crate) fn counted(&self, enforced: bool, decision: &Decision) -> u64 {
        match decision {
            Decision::Allowed { remaining, .. } if *remaining <= self.near => 2,
            Decision::Allowed { .. } => 1,
            Decision::Denied { .. } if enforced => 3,
            Decision::Denied { .. } => 4,
        }
    }

    /// Counts what [`counted`](Self::counted) coded.
    #[inline]
    pub(crate) fn count_code(&self, code: u64) {
        match code {
            1 => self.counters.count(Outcome::Allowed),
            2 => {
                self.counters.count(Outcome::Allowed);
                self.counters.count(Outcome::NearLimit);
            }
            3 => self.counters.count(Outcome::Denied),
            4 => self.counters.count(Outcome::ShadowDenied),
            _ => {}
        }
    }
}

/// The index of descriptor `name` in `names`, added when new: rules refer to descriptors by index.
pub(crate) fn descriptor_index(names: &mut Vec<Box<str>>, name: &str) -> usize {
    match names.iter().position(|n| **n == *name) {
        Some(i) => i,
        None => {
            names.push(name.into());
            names.len() - 1
        }
    }
}

impl RuleSet {
    /// The position of the rule a reload keeps for a new rule `name` of `identity`: the one of the
    /// same name and identity (`reload_plan.rs`), whose counters, and in process limiter, carry over.
    pub(crate) fn kept(&self, name: &str, identity: &Identity) -> Option<usize> {
        self.rules
            .iter()
            .position(|r| r.name == name && r.identity == *identity)
    }

    /// The rule names, in evaluation order.
    pub(crate) fn names(&self) -> Vec<&'static str> {
        self.rules.iter().map(|r| r.name).collect()
    }

    /// Every rule's counters, with `overflow(i)` the decisions rule `i`'s store made in a shared
    /// overflow state (published to the `metrics` facade too).
    pub(crate) fn snapshot(&self, overflow: impl Fn(usize) -> u64) -> PolicySnapshot {
        PolicySnapshot {
            rules: self
                .rules
                .iter()
                .enumerate()
                .map(|(i, rule)| {
                    let overflow = overflow(i);
                    if self.metrics {
                        rule.counters.publish_overflow(overflow);
                    }
                    RuleStats {
                        rule: rule.name,
                        allowed: rule.counters.total(Outcome::Allowed),
                        denied: rule.counters.total(Outcome::Denied),
                        shadow_denied: rule.counters.total(Outcome::ShadowDenied),
                        near_limit: rule.counters.total(Outcome::NearLimit),
                        overflow,
                    }
                })
                .collect(),
        }
    }

    /// Compiles `config` with no storage (for a store that keeps state elsewhere), keeping the
    /// counters of `old`'s rules of the same name and identity.
    #[cfg(feature = "redis")]
    pub(crate) fn compile(
        config: PolicyConfig,
        validated: &crate::validate::Validated,
        old: Option<&RuleSet>,
    ) -> Result<RuleSet, ConfigError> {
        let mut names: Vec<Box<str>> = Vec::new();
        let mut index_of = |name: &str| descriptor_index(&mut names, name);
        let mut rules = Vec::with_capacity(config.rules.len());
        for (rc, valid) in config.rules.iter().zip(&validated.rules) {
            let name = intern(&rc.name);
            let identity = Identity::of(rc, valid.algorithm);
            let counters = old
                .and_then(|old| old.kept(name, &identity).map(|j| &old.rules[j]))
                .map_or_else(
                    || Arc::new(Counters::new(name, &config.metric_labels)),
                    |kept| Arc::clone(&kept.counters),
                );
            let overrides = valid.overrides.iter().cloned().collect();
            rules.push(Rule::compile(
                rc,
                valid,
                config.descriptor_match.unwrap_or_default(),
                &mut index_of,
                identity,
                overrides,
                counters,
            )?);
        }
        Ok(RuleSet {
            id: next_id(),
            names: names.into_boxed_slice(),
            tag: None,
            rules: rules.into_boxed_slice(),
            dry_run: config.dry_run,
            metrics: config.metrics,
            peeks_decide: RuleSet::peeks_decide(&config),
            config,
        })
    }

    /// Whether every rule of `config` peeks as it checks (the field of that name).
    pub(crate) fn peeks_decide(config: &PolicyConfig) -> bool {
        // The peek pass's counts wait in 4 bits per rule (`engine::Tally`).
        config.rules.len() <= 16
            && config
                .rules
                .iter()
                .all(|r| r.storage != Storage::Striped && r.priority.is_none())
    }

    /// Tags the keys of the rules keyed by descriptor `name` with its value
    /// ([`tag_of`](Self::tag_of)); nothing when no rule uses `name`.
    #[cfg(feature = "redis")]
    pub(crate) fn set_hash_tag(&mut self, name: &str) {
        self.tag = self.names.iter().position(|n| **n == *name);
    }

    /// Rule `i`'s hash tag value in this request: the tag descriptor's value when the rule is keyed
    /// by it (its key already holds that value, so the tag changes where the key lives, never what
    /// it counts); `None` for the other rules.
    #[inline]
    pub(crate) fn tag_of<'a>(&self, i: usize, values: &[Option<&'a str>]) -> Option<&'a str> {
        let t = self.tag?;
        if self.rules[i].key.contains(&t) {
            values.get(t).copied().flatten()
        } else {
            None
        }
    }

    /// Each descriptor name's value in this request (first occurrence wins), and one slot more at
    /// the end, set when the request has a name no rule uses (for `descriptor_match = "exact"`).
    pub(crate) fn resolve<'a>(&self, descriptors: &Descriptors<'a>) -> Values<'a> {
        let mut values: Values<'a> = SmallVec::from_elem(None, self.names.len() + 1);
        self.resolve_pairs_into(descriptors, &mut values);
        values
    }

    /// [`resolve`](Self::resolve) into `values`: one slot per name and the unknown slot, all
    /// `None`. (A hot caller keeps them in an array on its stack: a returned `Values` is copied
    /// with a `memcpy` call.)
    #[inline]
    pub(crate) fn resolve_pairs_into<'a>(
        &self,
        descriptors: &Descriptors<'a>,
        values: &mut [Option<&'a str>],
    ) {
        let unknown = self.names.len();
        for &(name, value) in descriptors {
            let at = self
                .names
                .iter()
                .position(|n| short_eq::same(n.as_bytes(), name.as_bytes()));
            let (slot, value) = match at {
                Some(i) => (i, value),
                None => (unknown, name),
            };
            if let Some(slot) = values.get_mut(slot) {
                slot.get_or_insert(value);
            }
        }
    }
}
