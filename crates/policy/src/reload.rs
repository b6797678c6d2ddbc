//! Reloading a [`Policy`]: the rule-set build, which carries a kept rule's state over, and the
//! diff between the old rule set and the new one.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Clock, Quota};

use crate::config::{
    AlgorithmKind, ConfigError, ConfigErrorKind, PolicyConfig, RuleConfig, Storage, Validated,
};
use crate::limiter::{self, RuleLimiter, Spec};
use crate::policy::{Live, Policy};
use crate::rules::{Rule, RuleSet, intern};
use crate::stats::Counters;
use crate::store::MemoryStore;

/// What a reload did, per rule name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// Rules whose state (and counters) carried over, under their new quota if it changed.
    pub kept: Vec<&'static str>,
    /// Rules that start fresh (new names, or a changed identity).
    pub fresh: Vec<&'static str>,
    /// Rules that are gone.
    pub removed: Vec<&'static str>,
}

/// What must stay the same for a rule's state to carry over a reload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    key: Vec<String>,
    algorithm: AlgorithmKind,
    storage: Storage,
    capacity: Option<usize>,
    stripes: Option<usize>,
    /// Window algorithms: the window length (their state layout depends on it).
    window: Option<Duration>,
}

impl Identity {
    pub(crate) fn of(rule: &RuleConfig, algorithm: AlgorithmKind) -> Self {
        Identity {
            key: rule.key.clone(),
            algorithm,
            storage: rule.storage,
            capacity: rule.capacity,
            stripes: rule.stripes,
            window: (!algorithm.is_bucket()).then_some(rule.period),
        }
    }
}

/// A kept rule's override change: its limiter, the overrides before and after.
type OverridePlan<'a> = (
    Arc<dyn RuleLimiter>,
    &'a HashMap<String, Quota>,
    HashMap<String, Quota>,
);

impl<C: Clock + Clone + 'static> Policy<C> {
    /// Replaces the rules with `config`'s while decisions go on.
    ///
    /// * A rule whose identity — name, key descriptors, algorithm, storage, capacity, stripes, and
    ///   for the window algorithms the window length — is unchanged **keeps its state and counters**.
    ///   A quota change applies to its existing keys at once, their state words read under the new
    ///   quota (see [`Reloadable`](crate::Reloadable) for what a GCRA timestamp means then: no key is
    ///   handed a fresh burst). A striped rule is rebuilt at its predecessor's shared timestamp.
    /// * Override changes are applied to the kept table; removed rules drop; new ones start fresh.
    /// * An invalid config is a [`ConfigError`] naming the rule and field, and the old policy stays in
    ///   force untouched (override changes are applied last and rolled back if one cannot be placed).
    ///
    /// Decisions are never blocked: they read whichever rule set is current, and the new one is
    /// published with one atomic store. Reloads are serialised with each other.
    ///
    /// # Errors
    /// As [`with_clock`](Self::with_clock), plus [`ConfigErrorKind::Keyed`] when a new override cannot
    /// be placed in a kept table.
    pub fn reload(&self, config: PolicyConfig) -> Result<ReloadReport, ConfigError> {
        let _serial = self
            .reloads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let validated = config.validate()?;
        let old = self.current.load_full();
        let (set, report) = Live::build(config, &validated, &self.clock, Some(&old))?;
        self.current.store(Arc::new(set));
        Ok(report)
    }
}

impl Live {
    /// Builds a rule set from a validated config, reusing `old`'s state where identities match.
    /// Nothing shared with `old` is changed unless the whole build succeeds.
    pub(crate) fn build<C: Clock + Clone + 'static>(
        config: PolicyConfig,
        validated: &Validated,
        clock: &C,
        old: Option<&Live>,
    ) -> Result<(Live, ReloadReport), ConfigError> {
        let mut names: Vec<Box<str>> = Vec::new();
        let mut index_of = |name: &str| match names.iter().position(|n| **n == *name) {
            Some(i) => i,
            None => {
                names.push(name.into());
                names.len() - 1
            }
        };
        let mut report = ReloadReport::default();
        let mut requotas: Vec<(Arc<dyn RuleLimiter>, Quota)> = Vec::new();
        let mut override_plans: Vec<OverridePlan<'_>> = Vec::new();
        let mut rules = Vec::with_capacity(config.rules.len());
        let mut limiters: Vec<Arc<dyn RuleLimiter>> = Vec::with_capacity(config.rules.len());
        for (rc, valid) in config.rules.iter().zip(&validated.rules) {
            let name = intern(&rc.name);
            let identity = Identity::of(rc, valid.algorithm);
            let overrides: HashMap<String, Quota> = valid.overrides.iter().cloned().collect();
            let spec = Spec {
                algorithm: valid.algorithm,
                storage: rc.storage,
                quota: valid.quota,
                capacity: rc.capacity,
                stripes: rc.stripes,
            };
            let err = |kind| ConfigError::new(Some(&rc.name), "rule", kind);
            let kept = old.and_then(|old| {
                old.rules
                    .rules
                    .iter()
                    .position(|r| r.name == name && r.identity == identity)
                    .map(|j| (&old.rules.rules[j], &old.store.limiters[j]))
            });
            let (limiter, counters) = match kept {
                Some((prev, prev_limiter)) => {
                    let limiter = if prev.quota == valid.quota {
                        Arc::clone(prev_limiter)
                    } else if let Some(tat) = prev_limiter.shared_tat() {
                        // Striped: rebuilt at the predecessor's place on the timeline.
                        Arc::from(limiter::build(&spec, clock, Some(tat)).map_err(err)?)
                    } else {
                        requotas.push((Arc::clone(prev_limiter), valid.quota));
                        Arc::clone(prev_limiter)
                    };
                    if prev.overrides != overrides {
                        override_plans.push((
                            Arc::clone(&limiter),
                            &prev.overrides,
                            overrides.clone(),
                        ));
                    }
                    report.kept.push(name);
                    (limiter, Arc::clone(&prev.counters))
                }
                None => {
                    let limiter: Arc<dyn RuleLimiter> =
                        Arc::from(limiter::build(&spec, clock, None).map_err(err)?);
                    for (value, quota) in &overrides {
                        limiter
                            .set_override(value.as_bytes(), *quota)
                            .map_err(|e| {
                                ConfigError::new(
                                    Some(&rc.name),
                                    "overrides",
                                    ConfigErrorKind::Keyed(e),
                                )
                            })?;
                    }
                    report.fresh.push(name);
                    (
                        limiter,
                        Arc::new(Counters::new(name, &config.metric_labels)),
                    )
                }
            };
            rules.push(Rule::compile(
                rc,
                valid,
                &mut index_of,
                identity,
                overrides,
                counters,
            )?);
            limiters.push(limiter);
        }
        // Everything that can fail has been built. Overrides on kept tables next, with rollback.
        let mut applied: Vec<(Arc<dyn RuleLimiter>, String, Option<Quota>)> = Vec::new();
        for (limiter, before, after) in &override_plans {
            for (value, quota) in after {
                if before.get(value) == Some(quota) {
                    continue;
                }
                if let Err(e) = limiter.set_override(value.as_bytes(), *quota) {
                    for (limiter, value, previous) in applied.into_iter().rev() {
                        match previous {
                            Some(q) => {
                                let _ = limiter.set_override(value.as_bytes(), q);
                            }
                            None => {
                                limiter.remove_override(value.as_bytes());
                            }
                        }
                    }
                    let rule = limiters
                        .iter()
                        .position(|l| Arc::ptr_eq(l, limiter))
                        .map(|j| rules[j].name);
                    return Err(ConfigError::new(
                        rule,
                        "overrides",
                        ConfigErrorKind::Keyed(e),
                    ));
                }
                applied.push((
                    Arc::clone(limiter),
                    value.clone(),
                    before.get(value).copied(),
                ));
            }
        }
        for (limiter, before, after) in &override_plans {
            for value in before.keys().filter(|v| !after.contains_key(*v)) {
                limiter.remove_override(value.as_bytes());
            }
        }
        for (limiter, quota) in requotas {
            // Validated: the algorithm holds this quota.
            limiter.set_quota(quota);
        }
        if let Some(old) = old {
            report.removed = old
                .rules
                .rules
                .iter()
                .map(|r| r.name)
                .filter(|name| !report.kept.contains(name))
                .collect();
        }
        Ok((
            Live {
                rules: RuleSet {
                    names: names.into_boxed_slice(),
                    rules: rules.into_boxed_slice(),
                    dry_run: config.dry_run,
                    metrics: config.metrics,
                    config,
                },
                store: MemoryStore {
                    limiters: limiters.into_boxed_slice(),
                },
            },
            report,
        ))
    }
}
