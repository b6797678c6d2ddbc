//! What a reload works out before it changes anything: whether a rule keeps its state
//! ([`Identity`]), what it does per rule name ([`ReloadReport`]), and the changes to state the live
//! policy shares ([`Effects`]), each checked to be applicable, which the commit applies.

use std::collections::HashMap;
use std::sync::Arc;

use tollgate_core::Quota;
use tollgate_sharded::KeyedError;

use crate::config::{AlgorithmKind, RuleConfig, Storage};
use crate::limiter::RuleLimiter;

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
    pub(crate) requotas: Vec<(Arc<dyn RuleLimiter>, Quota)>,
    /// Global rules (atomic or striped) rebuilt under a new quota, (new, old): the old one hands
    /// over to the new one.
    pub(crate) takeovers: Vec<(Arc<dyn RuleLimiter>, Arc<dyn RuleLimiter>)>,
    /// Overrides to set on kept tables (their keys pinned while prepared).
    pub(crate) set: Vec<(Arc<dyn RuleLimiter>, String, Quota)>,
    /// Overrides to remove from kept tables.
    pub(crate) remove: Vec<(Arc<dyn RuleLimiter>, String)>,
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

/// Plans a kept table's override changes from `before` to `after` into `effects`: checks that the
/// new quotas fit the table's tiers and pins each key that gets a new or changed override (so the
/// commit can place it). On an error every pin taken so far stays listed in `effects`, whose owner
/// takes them back.
pub(crate) fn plan_overrides(
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
