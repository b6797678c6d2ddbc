//! Reloading a [`Policy`]: the rule-set build, which carries a kept rule's state over, and the
//! diff between the old rule set and the new one.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, MutexGuard};

use tollgate_core::{Clock, Quota};

use crate::config::{AlgorithmKind, PolicyConfig, RuleConfig, Storage};
use crate::config_error::{ConfigError, ConfigErrorKind};
use crate::limiter::{self, RuleLimiter, Spec};
use crate::policy::{Live, Policy};
use crate::rules::{Rule, RuleSet, descriptor_index, intern};
use crate::stats::Counters;
use crate::store::MemoryStore;
use crate::validate::Validated;
use tollgate_sharded::KeyedError;

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
    pub(crate) algorithm: AlgorithmKind,
    storage: Storage,
    capacity: Option<usize>,
    stripes: Option<usize>,
}

impl Identity {
    pub(crate) fn of(rule: &RuleConfig, algorithm: AlgorithmKind) -> Self {
        Identity {
            key: rule.key.clone(),
            algorithm,
            storage: rule.storage,
            capacity: rule.capacity,
            stripes: rule.stripes,
        }
    }
}

/// Every change a reload makes to state the live policy shares, worked out and checked while
/// preparing and applied only by [`PreparedReload::commit`].
#[derive(Default)]
pub(crate) struct Effects {
    /// Kept keyed limiters whose default quota changes.
    requotas: Vec<(Arc<dyn RuleLimiter>, Quota)>,
    /// Global rules (atomic or striped) rebuilt under a new quota, (new, old): the old one hands
    /// over to the new one.
    takeovers: Vec<(Arc<dyn RuleLimiter>, Arc<dyn RuleLimiter>)>,
    /// Overrides to set on kept tables (their keys pinned while prepared).
    set: Vec<(Arc<dyn RuleLimiter>, String, Quota)>,
    /// Overrides to remove from kept tables.
    remove: Vec<(Arc<dyn RuleLimiter>, String)>,
}

impl Drop for Effects {
    /// Takes back the pins that `set` holds: after the commit placed their overrides, or when the
    /// reload is dropped or fails while being built.
    fn drop(&mut self) {
        for (limiter, value, _) in &self.set {
            limiter.unpin_key(value.as_bytes());
        }
    }
}

/// A reload that has been validated and built but has changed nothing live: from
/// [`Policy::prepare_reload`]. [`commit`](Self::commit) applies it and cannot fail; dropping it
/// leaves the policy exactly as it was.
///
/// It holds the policy's reload lock, so while it exists no other reload (or preparation) starts:
/// commit or drop it promptly. Keys that get a new override in a kept table are pinned in that
/// table while it exists (so that committing can place the override), which is invisible to their
/// decisions.
///
/// ```
/// use tollgate_core::ManualClock;
/// use tollgate_policy::{Policy, PolicyConfig};
/// let config = |limit| PolicyConfig::from_toml(&format!(r#"
///     [[rules]]
///     name = "global"
///     limit = {limit}
///     period = "1s"
/// "#));
/// let policy = Policy::with_clock(config(2)?, ManualClock::new())?;
/// let prepared = policy.prepare_reload(config(5)?)?; // validated and built; nothing live changed
/// assert_eq!(policy.config(), config(2)?);
/// let report = prepared.commit(); // cannot fail
/// assert_eq!(report.kept, ["global"]);
/// assert_eq!(policy.config(), config(5)?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "a prepared reload changes nothing until it is committed"]
pub struct PreparedReload<'a, C> {
    policy: &'a Policy<C>,
    _serial: MutexGuard<'a, ()>,
    set: Live,
    report: ReloadReport,
    effects: Effects,
}

impl<C> fmt::Debug for PreparedReload<'_, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedReload")
            .field("report", &self.report)
            .finish_non_exhaustive()
    }
}

impl<C> PreparedReload<'_, C> {
    /// What committing will do, per rule name.
    pub fn report(&self) -> &ReloadReport {
        &self.report
    }

    /// Applies the reload: quota changes of kept rules (each key's state carried over, see
    /// [`Policy::reload`]), override changes on kept tables, then the new rule set published with
    /// one atomic store. Every step was checked while preparing, so nothing here can fail.
    pub fn commit(self) -> ReloadReport
    where
        C: Clock,
    {
        let PreparedReload {
            policy,
            _serial,
            set,
            report,
            effects,
        } = self;
        for (limiter, quota) in &effects.requotas {
            // Validated: the algorithm holds this quota.
            limiter.set_quota(*quota);
        }
        for (limiter, value, quota) in &effects.set {
            // Cannot fail: the quota's tier was checked to fit while preparing (only reloads set
            // overrides, and they are serialised by the lock we hold) and the key is pinned.
            let placed = limiter.set_override(value.as_bytes(), *quota);
            debug_assert!(placed.is_ok(), "a checked override failed: {placed:?}");
        }
        for (limiter, value) in &effects.remove {
            limiter.remove_override(value.as_bytes());
        }
        let at = policy.clock.now();
        for (new, old) in &effects.takeovers {
            old.hand_over(Arc::clone(new), at);
        }
        set.inflight.commit();
        // Release: see `Policy::published` (the loom build only).
        #[cfg(tollgate_loom)]
        policy
            .published
            .fetch_add(1, crate::sync::Ordering::Release);
        policy.current.store(Arc::new(set));
        // Dropping `effects` takes the pins back; dropping `_serial` lets the next reload in.
        drop(effects);
        report
    }
}

impl<C: Clock + Clone + 'static> Policy<C> {
    /// Replaces the rules with `config`'s while decisions go on: [`prepare_reload`] then
    /// [`PreparedReload::commit`].
    ///
    /// * A rule whose identity — name, key descriptors, algorithm, storage, capacity and stripes —
    ///   is unchanged **keeps its state and counters**, whatever its quota (a window algorithm's
    ///   window length included: the carry-over below converts between state layouts).
    /// * **The carry-over rule.** When a kept rule's quota changes, or a key's override quota does,
    ///   each key's state carries over **as-is in units** at the commit instant
    ///   ([`Algorithm::carry_over`](tollgate_core::Algorithm::carry_over); bucket4j's
    ///   `TokensInheritanceStrategy::AS_IS`): the key keeps `min(the units it could take just
    ///   before, the new quota's burst or limit)` and from then on refills, or counts its window,
    ///   under the new quota alone. So no key can take more at the reload than it could have under
    ///   either quota, and never more than the new quota's bound afterwards; a key that just spent
    ///   its burst gets nothing back, whichever way the quota changed. The one exception is a key
    ///   that was idle and full (a state indistinguishable from a key never seen): it gets the new
    ///   quota's whole burst, as a new key does. This holds for every algorithm (buckets and
    ///   windows), for keyed rules (the table's tier bits mark which quota wrote a word, so the
    ///   carry-over is exact while decisions go on; see `tollgate-sharded`'s
    ///   `KeyedLimiter::set_default`), for atomic global rules (the old word is retired by one
    ///   compare-and-swap that hands its state, carried over, to the new one: an admission on the
    ///   old word either landed before and is carried, or failed its exchange and is decided by the
    ///   new limiter) and for striped global rules (the old limiter is retired and its shared word
    ///   carried over; a decision still running on it uses what its stripes had leased, and beyond
    ///   that is decided by the new limiter). Neither is over-admitted nor denied for the reload. Units given back by a refund that races the commit are given back in
    ///   the quota the key is in when the refund lands.
    /// * Override changes are applied to the kept table; removed rules drop; new ones start fresh.
    /// * An invalid config is a [`ConfigError`] naming the rule and field, and the old policy stays in
    ///   force untouched.
    ///
    /// Decisions are never blocked: they read whichever rule set is current, and the new one is
    /// published with one atomic store. Reloads are serialised with each other.
    ///
    /// [`prepare_reload`]: Self::prepare_reload
    ///
    /// # Errors
    /// As [`prepare_reload`](Self::prepare_reload).
    pub fn reload(&self, config: PolicyConfig) -> Result<ReloadReport, ConfigError> {
        self.prepare_reload(config).map(PreparedReload::commit)
    }

    /// The first half of [`reload`](Self::reload): validates `config` and builds everything the new
    /// rule set needs (new tables allocated, new overrides checked to fit in kept tables) while
    /// changing nothing live. [`PreparedReload::commit`] applies it and cannot fail; dropping the
    /// [`PreparedReload`] changes nothing. For a caller that reloads several policies all or
    /// nothing: prepare each, and commit them only when every one prepared.
    ///
    /// Waits for a reload being prepared elsewhere to be committed or dropped (so a thread holding a
    /// [`PreparedReload`] of this policy must not prepare or reload it again: it would wait for
    /// itself). The guard it holds is a `std` mutex guard, so a `PreparedReload` stays on the
    /// thread that prepared it (it is not `Send`): prepare and commit without an `.await` between.
    ///
    /// # Errors
    /// As [`with_clock`](Self::with_clock), plus [`ConfigErrorKind::Keyed`] when a new override cannot
    /// be placed in a kept table (its key's probe window is full of live keys, or the table's
    /// override quotas are all taken).
    pub fn prepare_reload(
        &self,
        config: PolicyConfig,
    ) -> Result<PreparedReload<'_, C>, ConfigError> {
        let serial = self
            .reloads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let validated = config.validate()?;
        let old = self.current.load_full();
        let (set, report, effects) = Live::build(config, &validated, &self.clock, Some(&old))?;
        Ok(PreparedReload {
            policy: self,
            _serial: serial,
            set,
            report,
            effects,
        })
    }
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
                    .rules
                    .iter()
                    .position(|r| r.name == name && r.identity == identity)
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
        let inflight = crate::inflight_rules::InFlightSet::build(
            &config,
            clock,
            old.map(|old| &old.inflight),
            &mut report,
        )?;
        Ok((
            Live {
                rules: RuleSet {
                    id: crate::schema::next_id(),
                    names: names.into_boxed_slice(),
                    // In process every key is in this process: no hash tag.
                    tag: None,
                    rules: rules.into_boxed_slice(),
                    dry_run: config.dry_run,
                    metrics: config.metrics,
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

/// Plans a kept table's override changes from `before` to `after` into `effects`: checks that the
/// new quotas fit the table's tiers and pins each key that gets a new or changed override (so the
/// commit can place it). On an error every pin taken so far stays listed in `effects`, whose owner
/// takes them back.
fn plan_overrides(
    effects: &mut Effects,
    limiter: &Arc<dyn RuleLimiter>,
    before: &HashMap<String, Quota>,
    after: &HashMap<String, Quota>,
) -> Result<(), KeyedError> {
    let changed: Vec<(&String, Quota)> = after
        .iter()
        .filter(|(value, quota)| before.get(*value) != Some(*quota))
        .map(|(value, quota)| (value, *quota))
        .collect();
    let quotas: Vec<Quota> = changed.iter().map(|(_, quota)| *quota).collect();
    limiter.check_override_quotas(&quotas)?;
    for (value, quota) in changed {
        limiter.pin_key(value.as_bytes())?;
        effects
            .set
            .push((Arc::clone(limiter), value.clone(), quota));
    }
    for value in before.keys().filter(|v| !after.contains_key(*v)) {
        effects.remove.push((Arc::clone(limiter), value.clone()));
    }
    Ok(())
}
