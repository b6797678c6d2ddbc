//! Reloading a [`Policy`]: [`Policy::reload`] and [`Policy::prepare_reload`], which validate a
//! config and build its rule set while changing nothing live (the build is `live.rs`, what it plans
//! `reload_plan.rs`), and [`PreparedReload::commit`], which applies the plan and publishes the new
//! rule set.

use std::fmt;
use std::sync::{Arc, MutexGuard};

use tollgate_core::Clock;

use crate::config::PolicyConfig;
use crate::config_error::ConfigError;
use crate::live::Live;
use crate::policy::Policy;
use crate::reload_plan::{Effects, ReloadReport};

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
    /// As [`with_clock`](Self::with_clock), plus
    /// [`ConfigErrorKind::Keyed`](crate::ConfigErrorKind::Keyed) when a new override cannot be
    /// placed in a kept table (its key's probe window is full of live keys, or the table's
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
