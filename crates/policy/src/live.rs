//! [`Live`]: a rule set with its in-process state (each rule's limiter, the concurrency rules'
//! tables), what a [`Policy`](crate::Policy)'s decisions load; and its build from a validated
//! config, which carries a kept rule's state over from the rule set it replaces.

use std::collections::HashMap;
use std::sync::Arc;

use tollgate_core::{Clock, Quota};
use tollgate_sharded::KeyedError;

use crate::config::PolicyConfig;
use crate::config_error::{ConfigError, ConfigErrorKind};
use crate::inflight_rules::InFlightSet;
use crate::limiter::{self, RuleLimiter, Spec};
use crate::reload_plan::{Effects, Identity, ReloadReport, plan_overrides};
use crate::rules::{Rule, RuleSet, descriptor_index, intern, next_id};
use crate::stats::Counters;
use crate::store::MemoryStore;
use crate::validate::Validated;

/// A rule set with its in-process state: what decisions load.
pub(crate) struct Live {
    pub(crate) rules: RuleSet,
    pub(crate) store: MemoryStore,
    /// The concurrency rules (`inflight.rs`).
    pub(crate) inflight: InFlightSet,
}

impl Live {
    /// Builds a rule set from a validated config, reusing `old`'s state where identities match.
    /// Nothing shared with `old` is changed: what must change there is returned as [`Effects`], every
    /// one of them checked to be applicable (new overrides' keys pinned). The first load ignores
    /// them (there is no `old`).
    pub(crate) fn build<C: Clock + Clone + 'static>(
        config: PolicyConfig,
        validated: &Validated,
        clock: &C,
        old: Option<&Live>,
    ) -> Result<(Live, ReloadReport, Effects), ConfigError> {
        let mut names: Vec<Box<str>> = Vec::new();
        let mut index_of = |name: &str| descriptor_index(&mut names, name);
        let mut report = ReloadReport::default();
        let mut effects = Effects::default();
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
            let err = |kind: ConfigErrorKind| {
                let field = match kind {
                    // A table the allocator cannot provide (or of no keys) is the capacity's fault.
                    ConfigErrorKind::Keyed(
                        KeyedError::CapacityTooLarge { .. } | KeyedError::ZeroCapacity,
                    ) => "capacity",
                    _ => "rule",
                };
                ConfigError::new(Some(&rc.name), field, kind)
            };
            let kept = old.and_then(|old| {
                old.rules
                    .kept(name, &identity)
                    .map(|j| (&old.rules.rules[j], &old.store.limiters[j]))
            });
            let (limiter, counters) = match kept {
                Some((prev, prev_limiter)) => {
                    let limiter = if prev.quota == valid.quota {
                        Arc::clone(prev_limiter)
                    } else if rc.capacity.is_none() {
                        // A global rule (atomic or striped): rebuilt under the new quota; at the
                        // commit it retires the old one and carries its word over.
                        let new: Arc<dyn RuleLimiter> =
                            Arc::from(limiter::build(&spec, clock).map_err(err)?);
                        effects
                            .takeovers
                            .push((Arc::clone(&new), Arc::clone(prev_limiter)));
                        new
                    } else {
                        effects
                            .requotas
                            .push((Arc::clone(prev_limiter), valid.quota));
                        Arc::clone(prev_limiter)
                    };
                    if prev.overrides != overrides {
                        plan_overrides(&mut effects, &limiter, &prev.overrides, &overrides)
                            .map_err(|e| {
                                ConfigError::new(
                                    Some(&rc.name),
                                    "overrides",
                                    ConfigErrorKind::Keyed(e),
                                )
                            })?;
                    }
                    report.kept.push(name);
                    (limiter, Arc::clone(&prev.counters))
                }
                None => {
                    let limiter: Arc<dyn RuleLimiter> =
                        Arc::from(limiter::build(&spec, clock).map_err(err)?);
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
                config.descriptor_match.unwrap_or_default(),
                &mut index_of,
                identity,
                overrides,
                counters,
            )?);
            limiters.push(limiter);
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
        // After the rate rules' `removed` list: this adds the concurrency rules to the report.
        let inflight =
            InFlightSet::build(&config, clock, old.map(|old| &old.inflight), &mut report)?;
        Ok((
            Live {
                rules: RuleSet {
                    id: next_id(),
                    names: names.into_boxed_slice(),
                    // In process every key is in this process: no hash tag.
                    tag: None,
                    rules: rules.into_boxed_slice(),
                    dry_run: config.dry_run,
                    metrics: config.metrics,
                    peeks_decide: RuleSet::peeks_decide(&config),
                    config,
                },
                store: MemoryStore {
                    limiters: limiters.into_boxed_slice(),
                },
                inflight,
            },
            report,
            effects,
        ))
    }
}
