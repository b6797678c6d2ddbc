//! [`Policy`]: the live rule set, its one-decision check and its reload.

use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use arc_swap::ArcSwap;
use tollgate_core::{CheckError, Clock, Decision, MonotonicClock, Nanos};

use crate::config::PolicyConfig;
use crate::config_error::ConfigError;
use crate::decision::{Descriptors, PolicyDecision, PolicyError, RuleOutcome};
use crate::engine::{self, Decided};
use crate::live::Live;
use crate::rules::KeyBuf;
use crate::schema::DescriptorSchema;
use crate::stats::PolicySnapshot;
use crate::sync::{AtomicBool, Ordering};

/// A set of rate-limiting rules over request descriptors, decided as one, reloadable while in use.
///
/// * [`check`](Self::check): every applicable rule is decided at one clock reading; the request is
///   admitted only if every enforcing rule admits, and when any denies, every rule that admitted it
///   is given its units back ([`tollgate_core::Algorithm::refund`]), so a denied request leaves no
///   trace in any rule's state. Rules after the first denial are only peeked.
/// * A rule applies when every descriptor in its `match` is present and matches, and every key
///   descriptor is present: a request **missing a descriptor is simply not limited by that rule**
///   (fails open for that rule; add an `any` rule without the descriptor to cap such requests).
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
    pub(crate) current: ArcSwap<Live>,
    pub(crate) clock: C,
    pub(crate) dry_run: AtomicBool,
    pub(crate) reloads: Mutex<()>,
    /// The loom build's mirror of `current`'s publication: `arc_swap`'s own atomics are invisible
    /// to loom, so a model thread that loaded a new rule set would not be seen to synchronise with
    /// the reload that built it. Bumped (Release) before each store of `current`, and read with an
    /// RMW (which reads the latest value, Acquire) after each load of it: a thread that got the
    /// new set thereby synchronises with everything the reload did before publishing it, as
    /// `arc_swap` guarantees outside loom.
    #[cfg(tollgate_loom)]
    pub(crate) published: crate::sync::AtomicU64,
}

impl<C> fmt::Debug for Policy<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = &self.live().rules;
        f.debug_struct("Policy")
            .field(
                "rules",
                &set.rules.iter().map(|r| r.name).collect::<Vec<_>>(),
            )
            .field("dry_run", &set.dry_run)
            .finish_non_exhaustive()
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

impl<C> Policy<C> {
    /// The rule set in force, loaded lock-free.
    #[inline]
    pub(crate) fn live(&self) -> arc_swap::Guard<std::sync::Arc<Live>> {
        let live = self.current.load();
        // Acquire, as an RMW so that it reads the latest bump: see `published`.
        #[cfg(tollgate_loom)]
        self.published.fetch_add(0, Ordering::Acquire);
        live
    }
}

impl<C: Clock + Clone + 'static> Policy<C> {
    /// Builds the policy reading `clock` (every rule's limiter shares it).
    ///
    /// # Errors
    /// A [`ConfigError`] naming the rule and field.
    pub fn with_clock(config: PolicyConfig, clock: C) -> Result<Self, ConfigError> {
        let validated = config.validate()?;
        let (set, _, _) = Live::build(config, &validated, &clock, None)?;
        Ok(Policy {
            current: ArcSwap::from_pointee(set),
            clock,
            dry_run: AtomicBool::new(false),
            reloads: Mutex::new(()),
            #[cfg(tollgate_loom)]
            published: crate::sync::AtomicU64::new(0),
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
        let live = self.live();
        self.decide(&live, descriptors, now, cost, None, false)
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
        let live = self.live();
        self.decide(&live, descriptors, now, cost, None, true)
    }

    /// [`check_next_at`](Self::check_next_at) for a request described by `schema`: `value(i)` is
    /// the value of the schema's name `i` (`None`: absent), asked only for the names the rule set
    /// in force uses (every present one under `descriptor_match = "exact"`). Decides as
    /// `check_next_at` of the present `(name, value)` pairs in schema order, without building
    /// the values no rule reads.
    ///
    /// # Errors
    /// As [`check`](Self::check).
    #[inline]
    pub fn check_next_by_at<'a>(
        &self,
        schema: &DescriptorSchema,
        value: impl Fn(usize) -> Option<&'a str>,
        now: Nanos,
        cost: u64,
    ) -> Result<(PolicyDecision, Option<Duration>), PolicyError> {
        let live = self.live();
        let dry = self.dry(&live);
        let decide = |values: &[Option<&str>]| {
            engine::decide_values(&live.rules, &live.store, values, dry, now, cost, None, true)
        };
        // The values on the stack (one slot per name, and the unknown slot) for most rule sets.
        let mut stack = [None; 8];
        match stack.get_mut(..live.rules.names.len() + 1) {
            Some(values) => {
                live.rules.resolve_into(schema, value, values);
                decide(values)
            }
            None => decide(&live.rules.resolve_by(schema, value)),
        }
    }

    /// Decides several requests as one at `now`, each `(descriptors, cost)` as
    /// [`check_next_at`](Self::check_next_at) would, in order: when any is denied or cannot be
    /// decided, every admission of every one of them is given back, so a refused group consumes
    /// nothing anywhere (the descriptors of one Envoy rate-limit call, say). Each keeps its own
    /// answer; the group is admitted when every answer is an admission.
    ///
    /// ```
    /// use tollgate_core::ManualClock;
    /// use tollgate_policy::{Policy, PolicyConfig};
    /// let config = PolicyConfig::from_toml(r#"
    ///     [[rules]]
    ///     name = "per_user"
    ///     match = { user = "any" }
    ///     key = ["user"]
    ///     limit = 1
    ///     period = "1s"
    ///     capacity = 10
    /// "#)?;
    /// let policy = Policy::with_clock(config, ManualClock::new())?;
    /// let now = policy.now();
    /// let (a, b) = ([("user", "a")], [("user", "b")]);
    /// assert!(policy.check_at(&b, now, 1)?.is_allowed()); // b is spent
    /// let answers = policy.check_all_at(&[(&a, 1), (&b, 1)], now);
    /// assert!(answers[0].as_ref().unwrap().0.is_allowed());
    /// assert!(!answers[1].as_ref().unwrap().0.is_allowed());
    /// // The group was refused, so a's unit came back.
    /// assert!(policy.check_at(&a, now, 1)?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_all_at(
        &self,
        requests: &[(&Descriptors<'_>, u64)],
        now: Nanos,
    ) -> Vec<Result<(PolicyDecision, Option<Duration>), PolicyError>> {
        let live = self.live();
        let dry = self.dry(&live);
        engine::decide_all(&live.rules, &live.store, requests, dry, now, true)
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
        let live = self.live();
        self.decide(
            &live,
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
        self.check_detailed_on(&self.live(), descriptors, now, cost, outcomes, false)
    }

    /// [`check_detailed_at`](Self::check_detailed_at) on `live`, loaded already; `peek_first`:
    /// decided by `engine::decide_values_peeking_first` (the same answer, no write when denied).
    #[inline]
    pub(crate) fn check_detailed_on(
        &self,
        live: &Live,
        descriptors: &Descriptors<'_>,
        now: Nanos,
        cost: u64,
        outcomes: &mut Vec<RuleOutcome>,
        peek_first: bool,
    ) -> Result<PolicyDecision, PolicyError> {
        outcomes.clear();
        let dry = self.dry(live);
        let (set, store) = (&live.rules, &live.store);
        engine::with_values(set, descriptors, |values| {
            let outcomes = Some(outcomes);
            if peek_first {
                engine::decide_values_peeking_first(
                    set, store, values, dry, now, cost, outcomes, false,
                )
            } else {
                engine::decide_values(set, store, values, dry, now, cost, outcomes, false)
            }
        })
        .map(|(decided, _)| decided)
    }

    #[inline]
    fn decide(
        &self,
        live: &Live,
        descriptors: &Descriptors<'_>,
        now: Nanos,
        cost: u64,
        outcomes: Option<&mut Vec<RuleOutcome>>,
        want_next: bool,
    ) -> Result<Decided, PolicyError> {
        let dry = self.dry(live);
        engine::decide(
            &live.rules,
            &live.store,
            descriptors,
            dry,
            now,
            cost,
            outcomes,
            want_next,
        )
    }

    /// Turns every rule into a shadow rule (evaluated and counted, never denying) while `on`, on top
    /// of the config's own `dry_run`.
    pub fn set_dry_run(&self, on: bool) {
        // Relaxed: a switch read by each decision; it publishes no other data.
        self.dry_run.store(on, Ordering::Relaxed);
    }

    /// Whether decisions run dry (the switch or the config's `dry_run`).
    pub fn dry_run(&self) -> bool {
        self.dry(&self.live())
    }

    /// Whether decisions on `live` run dry: its config's `dry_run` or the switch.
    #[inline]
    fn dry(&self, live: &Live) -> bool {
        // Relaxed: see `set_dry_run`.
        live.rules.dry_run || self.dry_run.load(Ordering::Relaxed)
    }

    /// The configuration in force.
    pub fn config(&self) -> PolicyConfig {
        self.live().rules.config.clone()
    }

    /// The rule names, in evaluation order.
    pub fn rules(&self) -> Vec<&'static str> {
        self.live().rules.names()
    }

    /// Every rule's counters now (and the overflow counts published to the `metrics` facade).
    pub fn snapshot(&self) -> PolicySnapshot {
        let live = self.live();
        live.rules
            .snapshot(|i| live.store.limiters[i].overflow_decisions())
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
        let live = self.live();
        let values = live.rules.resolve(descriptors);
        Self::peek_values(&live, rule, &values, now, cost)
    }

    /// [`peek_rule_at`](Self::peek_rule_at) for a request described by `schema`, as
    /// [`check_next_by_at`](Self::check_next_by_at) takes it.
    pub fn peek_rule_by_at<'a>(
        &self,
        rule: &str,
        schema: &DescriptorSchema,
        value: impl Fn(usize) -> Option<&'a str>,
        now: Nanos,
        cost: u64,
    ) -> Option<Result<Decision, CheckError>> {
        let live = self.live();
        let values = live.rules.resolve_by(schema, value);
        Self::peek_values(&live, rule, &values, now, cost)
    }

    fn peek_values(
        live: &Live,
        rule: &str,
        values: &[Option<&str>],
        now: Nanos,
        cost: u64,
    ) -> Option<Result<Decision, CheckError>> {
        let set = &live.rules;
        let i = set.rules.iter().position(|r| r.name == rule)?;
        let rule = &set.rules[i];
        if !rule.applies(values) {
            return None;
        }
        let mut buf = KeyBuf::new();
        let key = rule.key(values, &mut buf)?;
        Some(
            live.store.limiters[i]
                .peek(key, now, cost)
                .map(|decision| rule.shown(decision).0),
        )
    }
}
