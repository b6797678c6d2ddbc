//! [`Policy`]: the live rule set, its one-decision check and its reload.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use smallvec::SmallVec;
use tollgate_core::{CheckError, Clock, Decision, MonotonicClock, Nanos, Quota};

use crate::config::{
    AlgorithmKind, ConfigError, ConfigErrorKind, MatchSpec, Mode, PolicyConfig, RuleConfig,
    Storage, Validated, delay_units,
};
use crate::descriptor_match::{self, DescriptorMatch};
use crate::limiter::{self, Receipt, RuleLimiter, Spec};
use crate::stats::{Counters, Outcome, PolicySnapshot, RuleStats};
use crate::sync::{AtomicBool, Ordering};

/// A request's descriptors: `(name, value)` pairs such as `("remote_address", "192.0.2.1")`. When a
/// name occurs twice the first pair counts.
pub type Descriptors<'a> = [(&'a str, &'a str)];

/// One decision over every rule that applies to a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyDecision {
    /// Allowed (with `remaining`/`reset_after` of the tightest enforcing rule) or denied (with the
    /// largest `retry_after` of the denying rules, and that rule's `reset_after`). With no enforcing
    /// rule applying: allowed, `remaining` = `u64::MAX`, `reset_after` = 0.
    pub decision: Decision,
    /// The rule that decided (the tightest admitting one, or the denying one with the longest wait),
    /// for headers and logs; `None` when no enforcing rule applied.
    pub rule: Option<&'static str>,
    /// The deciding rule's quota for this request's key: its override when the key has one.
    pub quota: Option<Quota>,
    /// Two-stage rules: how long the caller should hold the request before forwarding it (zero when
    /// no rule asks for a wait).
    pub delay: Duration,
    /// Whether a shadow rule (or any rule under dry run) would have denied.
    pub shadow_denied: bool,
}

impl PolicyDecision {
    /// Whether the request is admitted.
    #[inline]
    pub fn is_allowed(&self) -> bool {
        self.decision.is_allowed()
    }
}

/// One rule's part in a decision, from [`Policy::check_detailed`]: what a gRPC server needs per
/// descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleOutcome {
    /// The rule.
    pub rule: &'static str,
    /// Whether it was enforcing for this decision (false for shadow rules and under dry run).
    pub enforced: bool,
    /// Its own verdict (a rule evaluated after another denied is only peeked, and its admission
    /// would be given back anyway).
    pub decision: Decision,
    /// Its quota for this request's key.
    pub quota: Quota,
}

/// One rule that applies to a request, as [`Policy::applicable`] lists them: for a caller that keeps
/// the rules' state itself (tollgate-server's Redis backend) and uses the policy only for matching
/// and key building.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applicable {
    /// The rule.
    pub rule: &'static str,
    /// Whether it enforces (false for shadow rules and under dry run).
    pub enforced: bool,
    /// The rule's algorithm.
    pub algorithm: AlgorithmKind,
    /// The key bytes, exactly as the policy's own limiters key it: empty for a global rule, the
    /// value for one key descriptor, length-prefixed values (4-byte little-endian lengths, so not
    /// always UTF-8) for several.
    pub key: Vec<u8>,
    /// The quota for this key: its override when it has one, else the rule's effective quota.
    pub quota: Quota,
    /// Whether `quota` is an override.
    pub overridden: bool,
}

/// Why a check could not be decided (as opposed to denied). Nothing is consumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyError {
    /// An enforcing rule can never admit this cost at once; retrying cannot help. (A shadow rule in
    /// this position counts as shadow-denied and is otherwise skipped.)
    CostExceedsCapacity {
        /// The rule.
        rule: &'static str,
        /// The cost asked for.
        cost: u64,
        /// The most the rule admits at once.
        capacity: u64,
    },
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::CostExceedsCapacity {
                rule,
                cost,
                capacity,
            } => write!(
                f,
                "rule `{rule}`: cost {cost} exceeds the most it can ever admit at once ({capacity})"
            ),
        }
    }
}

impl std::error::Error for PolicyError {}

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

/// A set of rate-limiting rules over request descriptors, decided as one, reloadable while in use.
///
/// * [`check`](Self::check): every applicable rule is decided at one clock reading; the request is
///   admitted only if every enforcing rule admits, and when any denies, every rule that admitted it
///   is given its units back ([`tollgate_core::Algorithm::refund`]), so a denied request leaves no
///   trace in any rule's state. Rules after the first denial are only peeked.
/// * A rule applies when every descriptor in its `match` is present and matches, and every key
///   descriptor is present: a request **missing a descriptor is simply not limited by that rule**
///   (fails open for that rule; add an `any` rule without the descriptor to cap such requests).
///   With `descriptor_match = "exact"` ([`DescriptorMatch`](crate::DescriptorMatch)) the request
///   must also carry no descriptor the rule's `match` does not name (Envoy's one-descriptor-per-limit
///   model).
/// * [`reload`](Self::reload) swaps the rule set in one atomic pointer store; decisions load it
///   lock-free ([`arc_swap`]).
///
/// # Exactness of the rollback
/// At one instant the rollback is exact for every storage (property tests and the loom model). The
/// stated bounds otherwise: a GCRA refund raced by another admission on the same key at a time more
/// than `cost × T` later frees at most `cost` units too many; a striped rule's refund into a lease
/// that another thread replaced in between gives nothing back (stricter, at most `cost`); a keyed
/// refund racing an eviction in the key's window is resolved towards strictness except as described
/// on `KeyedLimiter::refund_key_at`; a refund racing a reload that changed the rule's quota gives
/// back `cost` units of the new quota.
///
/// ```
/// use tollgate_core::ManualClock;
/// use tollgate_policy::{Policy, PolicyConfig};
///
/// let config = PolicyConfig::from_toml(r#"
///     [[rules]]
///     name = "per_ip"
///     match = { remote_address = "any" }
///     key = ["remote_address"]
///     limit = 2
///     period = "1s"
///     capacity = 1000
///
///     [[rules]]
///     name = "global"
///     limit = 3
///     period = "1s"
/// "#)?;
/// let policy = Policy::with_clock(config, ManualClock::new())?;
/// let a = [("remote_address", "192.0.2.1")];
/// let b = [("remote_address", "192.0.2.2")];
/// assert!(policy.check(&a, 1)?.is_allowed());
/// assert!(policy.check(&a, 1)?.is_allowed());
/// let denied = policy.check(&a, 1)?; // per_ip denies; "global" gets its unit back
/// assert_eq!(denied.rule, Some("per_ip"));
/// assert!(policy.check(&b, 1)?.is_allowed()); // global's third unit is still there
/// assert_eq!(policy.check(&b, 1)?.rule, Some("global"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Policy<C = MonotonicClock> {
    current: ArcSwap<RuleSet>,
    clock: C,
    dry_run: AtomicBool,
    reloads: Mutex<()>,
}

impl<C> fmt::Debug for Policy<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = self.current.load();
        f.debug_struct("Policy")
            .field(
                "rules",
                &set.rules.iter().map(|r| r.name).collect::<Vec<_>>(),
            )
            .field("dry_run", &set.dry_run)
            .finish_non_exhaustive()
    }
}

/// The rule set decisions read: built once per load or reload, never changed afterwards.
struct RuleSet {
    /// Descriptor names the rules use; rules refer to them by index.
    names: Box<[Box<str>]>,
    rules: Box<[Rule]>,
    dry_run: bool,
    metrics: bool,
    config: PolicyConfig,
}

struct Rule {
    name: &'static str,
    matches: Box<[(usize, MatchSpec)]>,
    /// The policy's `descriptor_match` (whether entries the rule does not name keep it out).
    descriptor_match: DescriptorMatch,
    key: Box<[usize]>,
    mode: Mode,
    /// The effective quota (a delay's extra depth included).
    quota: Quota,
    /// The quota as configured, for decisions and headers.
    shown: Quota,
    /// Two-stage delay: extra units beyond the burst, and the burst's depth in nanoseconds.
    delay: Option<(u64, Nanos)>,
    /// `remaining` at or below this is near the limit (20 % of the default capacity).
    near: u64,
    identity: Identity,
    overrides: HashMap<String, Quota>,
    limiter: Arc<dyn RuleLimiter>,
    counters: Arc<Counters>,
}

/// What must stay the same for a rule's state to carry over a reload.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Identity {
    key: Vec<String>,
    algorithm: AlgorithmKind,
    storage: Storage,
    capacity: Option<usize>,
    stripes: Option<usize>,
    /// Window algorithms: the window length (their state layout depends on it).
    window: Option<Duration>,
}

impl Identity {
    fn of(rule: &RuleConfig, algorithm: AlgorithmKind) -> Self {
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

/// Rule names live for the process: decisions hand out `&'static str` without a reference count.
/// One allocation per distinct name ever configured.
fn intern(name: &str) -> &'static str {
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

type Values<'a> = SmallVec<[Option<&'a str>; 8]>;
type KeyBuf = SmallVec<[u8; 128]>;
/// A kept rule's override change: its limiter, the overrides before and after.
type OverridePlan<'a> = (
    Arc<dyn RuleLimiter>,
    &'a HashMap<String, Quota>,
    HashMap<String, Quota>,
);

impl Rule {
    #[inline]
    fn applies(&self, values: &[Option<&str>]) -> bool {
        self.matches
            .iter()
            .all(|(i, spec)| values[*i].is_some_and(|v| spec.matches(v)))
            && descriptor_match::admits(self.descriptor_match, &self.matches, values)
    }

    /// The key bytes: nothing for a global rule, the value for one descriptor, and length-prefixed
    /// values for several (so no two tuples share an encoding). `None`: a key descriptor is missing.
    #[inline]
    fn key<'a>(&self, values: &[Option<&'a str>], buf: &'a mut KeyBuf) -> Option<&'a [u8]> {
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
    fn shown(&self, decision: Decision) -> (Decision, Duration) {
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

    fn quota_for(&self, key: &[u8]) -> Quota {
        if self.delay.is_some() {
            self.shown
        } else {
            self.limiter.quota_for(key)
        }
    }
}

impl Policy<MonotonicClock> {
    /// Builds the policy on the default monotonic clock.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the rule and field.
    pub fn new(config: PolicyConfig) -> Result<Self, ConfigError> {
        Self::with_clock(config, MonotonicClock::new())
    }
}

impl<C: Clock + Clone + 'static> Policy<C> {
    /// Builds the policy reading `clock` (every rule's limiter shares it).
    ///
    /// # Errors
    /// A [`ConfigError`] naming the rule and field.
    pub fn with_clock(config: PolicyConfig, clock: C) -> Result<Self, ConfigError> {
        let validated = config.validate()?;
        let (set, _) = RuleSet::build(config, &validated, &clock, None)?;
        Ok(Policy {
            current: ArcSwap::from_pointee(set),
            clock,
            dry_run: AtomicBool::new(false),
            reloads: Mutex::new(()),
        })
    }

    /// The clock's current reading.
    #[inline]
    pub fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Decides a request of `cost` units with these descriptors, now (one clock reading for every
    /// rule).
    ///
    /// # Errors
    /// [`PolicyError::CostExceedsCapacity`] when an applicable enforcing rule can never admit `cost`;
    /// nothing is consumed.
    #[inline]
    pub fn check(
        &self,
        descriptors: &Descriptors<'_>,
        cost: u64,
    ) -> Result<PolicyDecision, PolicyError> {
        self.check_at(descriptors, self.clock.now(), cost)
    }

    /// [`check`](Self::check) at an explicit time, for simulation and tests.
    ///
    /// # Errors
    /// As [`check`](Self::check).
    #[inline]
    pub fn check_at(
        &self,
        descriptors: &Descriptors<'_>,
        now: Nanos,
        cost: u64,
    ) -> Result<PolicyDecision, PolicyError> {
        let set = self.current.load();
        self.decide(&set, descriptors, now, cost, None, false)
            .map(|(decided, _)| decided)
    }

    /// [`check_at`](Self::check_at), also saying how long until more than the decision's
    /// `remaining` units would pass the deciding rule: the `RateLimit` field's `t`, which HTTP
    /// callers need on every response. On a denial that is its `retry_after`; on an admission it is
    /// a read-only look at the deciding rule's state right after the check (what
    /// [`peek_rule_at`](Self::peek_rule_at) of `remaining + 1` answers, without resolving the
    /// descriptors and loading the rule set a second time). `None` when no enforcing rule decided,
    /// when `remaining + 1` would be admitted already, or when that many could never be.
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
    /// let now = policy.now();
    /// let (decided, next) = policy.check_next_at(&[], now, 1)?;
    /// assert_eq!(decided.decision.remaining(), 1);
    /// assert_eq!(next, Some(Duration::from_millis(500)), "a second unit is there, a third in 0.5 s");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`check`](Self::check).
    #[inline]
    pub fn check_next_at(
        &self,
        descriptors: &Descriptors<'_>,
        now: Nanos,
        cost: u64,
    ) -> Result<(PolicyDecision, Option<Duration>), PolicyError> {
        let set = self.current.load();
        self.decide(&set, descriptors, now, cost, None, true)
    }

    /// [`check`](Self::check), also writing each applicable rule's own outcome into `outcomes`
    /// (cleared first; reuse the vector to avoid allocating).
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub fn check_detailed(
        &self,
        descriptors: &Descriptors<'_>,
        cost: u64,
        outcomes: &mut Vec<RuleOutcome>,
    ) -> Result<PolicyDecision, PolicyError> {
        outcomes.clear();
        let set = self.current.load();
        self.decide(
            &set,
            descriptors,
            self.clock.now(),
            cost,
            Some(outcomes),
            false,
        )
        .map(|(decided, _)| decided)
    }

    /// [`check_detailed`](Self::check_detailed) at an explicit time.
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub fn check_detailed_at(
        &self,
        descriptors: &Descriptors<'_>,
        now: Nanos,
        cost: u64,
        outcomes: &mut Vec<RuleOutcome>,
    ) -> Result<PolicyDecision, PolicyError> {
        outcomes.clear();
        let set = self.current.load();
        self.decide(&set, descriptors, now, cost, Some(outcomes), false)
            .map(|(decided, _)| decided)
    }

    /// The rules that apply to a request with these descriptors, in evaluation order, written into
    /// `out` (cleared first), consuming nothing and counting nothing: the matching and key building
    /// of [`check`](Self::check) without its limiters, for a caller that decides each rule against
    /// state it keeps elsewhere. A two-stage delay is not applied (`quota` is the effective one).
    pub fn applicable(&self, descriptors: &Descriptors<'_>, out: &mut Vec<Applicable>) {
        out.clear();
        let set = self.current.load();
        let values = set.resolve(descriptors);
        // Relaxed: see `set_dry_run`.
        let dry = set.dry_run || self.dry_run.load(Ordering::Relaxed);
        for rule in set.rules.iter() {
            if !rule.applies(&values) {
                continue;
            }
            let mut buf = KeyBuf::new();
            let Some(key) = rule.key(&values, &mut buf) else {
                continue;
            };
            let over = match *rule.key {
                [one] => values[one].and_then(|v| rule.overrides.get(v)).copied(),
                _ => None,
            };
            out.push(Applicable {
                rule: rule.name,
                enforced: rule.mode == Mode::Enforce && !dry,
                algorithm: rule.identity.algorithm,
                key: key.to_vec(),
                quota: over.unwrap_or(rule.quota),
                overridden: over.is_some(),
            });
        }
    }

    /// Counts, in rule `rule`'s counters ([`snapshot`](Self::snapshot) and the `metrics` facade),
    /// a decision that the caller of [`applicable`](Self::applicable) made against state it keeps
    /// elsewhere, as [`check`](Self::check) counts its own: an admission (and near the limit when
    /// `remaining` is at or below a fifth of the rule's capacity), a denial when `enforced`, a
    /// shadow denial otherwise. Nothing when the rule is gone (a reload in between) or the config
    /// turned counting off.
    pub fn count(&self, rule: &str, enforced: bool, decision: &Decision) {
        let set = self.current.load();
        if !set.metrics {
            return;
        }
        let Some(rule) = set.rules.iter().find(|r| r.name == rule) else {
            return;
        };
        match decision {
            Decision::Allowed { remaining, .. } => {
                rule.counters.count(Outcome::Allowed);
                if *remaining <= rule.near {
                    rule.counters.count(Outcome::NearLimit);
                }
            }
            Decision::Denied { .. } if enforced => rule.counters.count(Outcome::Denied),
            Decision::Denied { .. } => rule.counters.count(Outcome::ShadowDenied),
        }
    }

    /// Turns every rule into a shadow rule (evaluated and counted, never denying) while `on`, on top
    /// of the config's own `dry_run`.
    pub fn set_dry_run(&self, on: bool) {
        // Relaxed: a switch read by each decision; it publishes no other data.
        self.dry_run.store(on, Ordering::Relaxed);
    }

    /// Whether decisions run dry (the switch or the config's `dry_run`).
    pub fn dry_run(&self) -> bool {
        // Relaxed: as in `set_dry_run`.
        self.dry_run.load(Ordering::Relaxed) || self.current.load().dry_run
    }

    /// The configuration in force.
    pub fn config(&self) -> PolicyConfig {
        self.current.load().config.clone()
    }

    /// The rule names, in evaluation order.
    pub fn rules(&self) -> Vec<&'static str> {
        self.current.load().rules.iter().map(|r| r.name).collect()
    }

    /// Every rule's counters now (and the overflow counts published to the `metrics` facade).
    pub fn snapshot(&self) -> PolicySnapshot {
        let set = self.current.load();
        PolicySnapshot {
            rules: set
                .rules
                .iter()
                .map(|rule| {
                    let overflow = rule.limiter.overflow_decisions();
                    if set.metrics {
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
        let (set, report) = RuleSet::build(config, &validated, &self.clock, Some(&old))?;
        self.current.store(Arc::new(set));
        Ok(report)
    }

    fn decide(
        &self,
        set: &RuleSet,
        descriptors: &Descriptors<'_>,
        now: Nanos,
        cost: u64,
        mut outcomes: Option<&mut Vec<RuleOutcome>>,
        want_next: bool,
    ) -> Result<(PolicyDecision, Option<Duration>), PolicyError> {
        let values = set.resolve(descriptors);
        // Relaxed: see `set_dry_run`.
        let dry = set.dry_run || self.dry_run.load(Ordering::Relaxed);
        let mut admitted: SmallVec<[(usize, Receipt); 8]> = SmallVec::new();
        let mut denied: Option<(usize, Decision)> = None;
        let mut tightest: Option<(usize, Decision)> = None;
        let mut delay = Duration::ZERO;
        let mut shadow_denied = false;
        for (i, rule) in set.rules.iter().enumerate() {
            if !rule.applies(&values) {
                continue;
            }
            let mut buf = KeyBuf::new();
            let Some(key) = rule.key(&values, &mut buf) else {
                continue;
            };
            let enforced = rule.mode == Mode::Enforce && !dry;
            let result = if denied.is_some() {
                rule.limiter.peek(key, now, cost).map(|d| (d, None))
            } else {
                rule.limiter
                    .check(key, now, cost)
                    .map(|(d, r)| (d, Some(r)))
            };
            let (decision, receipt) = match result {
                Ok(found) => found,
                Err(error) => {
                    if !enforced {
                        // A shadow rule that could never admit this cost would have refused it.
                        if set.metrics {
                            rule.counters.count(Outcome::ShadowDenied);
                        }
                        shadow_denied = true;
                        continue;
                    }
                    set.refund(&values, &admitted, now, cost);
                    let capacity = match error {
                        CheckError::CostExceedsCapacity { capacity, .. } => capacity,
                        _ => 0,
                    };
                    return Err(PolicyError::CostExceedsCapacity {
                        rule: rule.name,
                        cost,
                        capacity,
                    });
                }
            };
            let (decision, wait) = rule.shown(decision);
            if let Some(outcomes) = outcomes.as_deref_mut() {
                outcomes.push(RuleOutcome {
                    rule: rule.name,
                    enforced,
                    decision,
                    quota: rule.quota_for(key),
                });
            }
            if decision.is_allowed() {
                if let Some(receipt) = receipt.filter(|_| cost > 0) {
                    admitted.push((i, receipt));
                }
                if set.metrics {
                    rule.counters.count(Outcome::Allowed);
                    if decision.remaining() <= rule.near {
                        rule.counters.count(Outcome::NearLimit);
                    }
                }
                if enforced {
                    delay = delay.max(wait);
                    let tighter = tightest.is_none_or(|(_, best)| {
                        (
                            decision.remaining(),
                            std::cmp::Reverse(decision.reset_after()),
                        ) < (best.remaining(), std::cmp::Reverse(best.reset_after()))
                    });
                    if tighter {
                        tightest = Some((i, decision));
                    }
                }
            } else if enforced {
                if set.metrics {
                    rule.counters.count(Outcome::Denied);
                }
                let longer =
                    denied.is_none_or(|(_, worst)| decision.retry_after() > worst.retry_after());
                if longer {
                    denied = Some((i, decision));
                }
            } else {
                if set.metrics {
                    rule.counters.count(Outcome::ShadowDenied);
                }
                shadow_denied = true;
            }
        }
        let (deciding, decision, delay) = match (denied, tightest) {
            (Some((i, decision)), _) => {
                set.refund(&values, &admitted, now, cost);
                (Some(i), decision, Duration::ZERO)
            }
            (None, Some((i, decision))) => (Some(i), decision, delay),
            (None, None) => (
                None,
                Decision::Allowed {
                    remaining: u64::MAX,
                    reset_after: Duration::ZERO,
                },
                Duration::ZERO,
            ),
        };
        let (rule, quota, next) = match deciding {
            Some(i) => {
                let rule = &set.rules[i];
                let mut buf = KeyBuf::new();
                let key = rule.key(&values, &mut buf);
                let quota = key.map(|key| rule.quota_for(key));
                let next = match decision {
                    Decision::Denied { retry_after, .. } => Some(retry_after),
                    Decision::Allowed { remaining, .. } if want_next => key
                        .zip(remaining.checked_add(1))
                        .and_then(|(key, more)| rule.limiter.peek(key, now, more).ok())
                        .and_then(|peeked| peeked.retry_after()),
                    Decision::Allowed { .. } => None,
                };
                (Some(rule.name), quota, next)
            }
            None => (None, None, None),
        };
        Ok((
            PolicyDecision {
                decision,
                rule,
                quota,
                delay,
                shadow_denied,
            },
            next,
        ))
    }
}

impl RuleSet {
    /// Each descriptor name's value in this request (first occurrence wins), and one slot more at
    /// the end, set when the request has a name no rule uses (for `descriptor_match = "exact"`).
    #[inline]
    fn resolve<'a>(&self, descriptors: &Descriptors<'a>) -> Values<'a> {
        let mut values: Values<'a> = SmallVec::from_elem(None, self.names.len() + 1);
        for &(name, value) in descriptors {
            match self.names.iter().position(|n| **n == *name) {
                Some(i) => values[i].get_or_insert(value),
                None => values[self.names.len()].get_or_insert(name),
            };
        }
        values
    }

    /// Gives every admission in `admitted` back.
    fn refund(
        &self,
        values: &[Option<&str>],
        admitted: &[(usize, Receipt)],
        now: Nanos,
        cost: u64,
    ) {
        for &(i, receipt) in admitted {
            let rule = &self.rules[i];
            let mut buf = KeyBuf::new();
            if let Some(key) = rule.key(values, &mut buf) {
                rule.limiter.refund(key, now, cost, receipt);
            }
        }
    }

    /// Builds a rule set from a validated config, reusing `old`'s state where identities match.
    /// Nothing shared with `old` is changed unless the whole build succeeds.
    fn build<C: Clock + Clone + 'static>(
        config: PolicyConfig,
        validated: &Validated,
        clock: &C,
        old: Option<&RuleSet>,
    ) -> Result<(RuleSet, ReloadReport), ConfigError> {
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
                    .iter()
                    .find(|r| r.name == name && r.identity == identity)
            });
            let (limiter, counters) = match kept {
                Some(prev) => {
                    let limiter = if prev.quota == valid.quota {
                        Arc::clone(&prev.limiter)
                    } else if let Some(tat) = prev.limiter.shared_tat() {
                        // Striped: rebuilt at the predecessor's place on the timeline.
                        Arc::from(limiter::build(&spec, clock, Some(tat)).map_err(err)?)
                    } else {
                        requotas.push((Arc::clone(&prev.limiter), valid.quota));
                        Arc::clone(&prev.limiter)
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
            let shown = match rc.delay {
                Some(_) => tollgate_core::Quota::per(rc.period, rc.limit)
                    .and_then(|q| rc.burst.map_or(Ok(q), |b| q.with_burst(b)))
                    .map_err(|e| {
                        ConfigError::new(Some(&rc.name), "limit", ConfigErrorKind::Quota(e))
                    })?,
                None => valid.quota,
            };
            let delay = rc
                .delay
                .map(|d| (delay_units(&shown, d.max_delay), shown.burst_nanos()));
            let capacity = match valid.algorithm {
                AlgorithmKind::Gcra | AlgorithmKind::LeakyBucket => shown.burst(),
                _ => shown.limit(),
            };
            rules.push(Rule {
                name,
                matches: rc
                    .matches
                    .iter()
                    .map(|(d, spec)| (index_of(d), spec.clone()))
                    .collect(),
                descriptor_match: config.descriptor_match.unwrap_or_default(),
                key: rc.key.iter().map(|d| index_of(d)).collect(),
                mode: rc.mode,
                quota: valid.quota,
                shown,
                delay,
                near: capacity / 5,
                identity,
                overrides,
                limiter,
                counters,
            });
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
                    let rule = rules
                        .iter()
                        .find(|r| Arc::ptr_eq(&r.limiter, limiter))
                        .map(|r| r.name);
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
                .iter()
                .map(|r| r.name)
                .filter(|name| !report.kept.contains(name))
                .collect();
        }
        Ok((
            RuleSet {
                names: names.into_boxed_slice(),
                rules: rules.into_boxed_slice(),
                dry_run: config.dry_run,
                metrics: config.metrics,
                config,
            },
            report,
        ))
    }
}

impl<C: Clock + Clone + 'static> Policy<C> {
    /// What one rule alone would decide for `cost` units with these descriptors at `now`, consuming
    /// nothing: `None` when no rule has that name or it does not apply to the request.
    ///
    /// The HTTP layer asks it for the `RateLimit` field's `t` after a decision that left `r` units
    /// in the deciding rule: `peek_rule_at(rule, descriptors, now, r + 1)` says how long until more
    /// than `r` are admitted.
    ///
    /// ```
    /// use tollgate_core::ManualClock;
    /// use tollgate_policy::{Policy, PolicyConfig};
    /// let config = PolicyConfig::from_toml(r#"
    ///     [[rules]]
    ///     name = "global"
    ///     limit = 2
    ///     period = "1s"
    /// "#)?;
    /// let policy = Policy::with_clock(config, ManualClock::new())?;
    /// let now = policy.now();
    /// assert!(policy.check_at(&[], now, 2)?.is_allowed());
    /// let next = policy.peek_rule_at("global", &[], now, 1).unwrap()?;
    /// assert_eq!(next.retry_after(), Some(std::time::Duration::from_millis(500)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek_rule_at(
        &self,
        rule: &str,
        descriptors: &Descriptors<'_>,
        now: Nanos,
        cost: u64,
    ) -> Option<Result<Decision, CheckError>> {
        let set = self.current.load();
        let values = set.resolve(descriptors);
        let rule = set.rules.iter().find(|r| r.name == rule)?;
        if !rule.applies(&values) {
            return None;
        }
        let mut buf = KeyBuf::new();
        let key = rule.key(&values, &mut buf)?;
        Some(
            rule.limiter
                .peek(key, now, cost)
                .map(|decision| rule.shown(decision).0),
        )
    }
}
