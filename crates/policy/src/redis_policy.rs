//! [`RedisPolicy`]: the same rules and the same decision as [`Policy`](crate::Policy), with every
//! rule's state in a shared Redis (`redis_store.rs`), so that every process pointing at it shares
//! each rule's quota.
//!
//! See [`RedisPolicy`] for the semantics across rules, the key layout and failures.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tollgate_core::Nanos;
use tollgate_redis::Connection;

use crate::config::PolicyConfig;
use crate::config_error::ConfigError;
use crate::decision::{Descriptors, PolicyDecision, PolicyError};
use crate::engine::Decided;
use crate::engine_async;
use crate::redis_store::{RedisSettings, RedisStore};
use crate::rules::RuleSet;
use crate::stats::PolicySnapshot;
use crate::sync::{AtomicBool, Ordering};

/// Points `rules` at `settings`' hash tag descriptor.
fn tag_rules(rules: &mut RuleSet, settings: &RedisSettings) {
    if let Some(name) = &settings.hash_tag {
        rules.set_hash_tag(name);
    }
}

/// A rule set with its Redis state: what decisions load.
pub(crate) struct RedisLive {
    pub(crate) rules: RuleSet,
    pub(crate) store: RedisStore,
}

/// A policy whose rules keep their state in Redis: [`Policy`](crate::Policy)'s rules, config and
/// semantics (atomic over a request's rules, shadow, metrics, reload), shared by every process that
/// points at the same Redis and prefix.
///
/// # Several rules in one request
/// As in process: the request is admitted only if every enforcing rule admits, and a denied
/// request consumes nothing anywhere.
/// * **Per request** (no lease): every rule of the request in **one script call** (tollgate-redis's
///   `RedisBatch`): all checked at one instant, every admission written only when every enforcing
///   rule admits. Atomic and exact, one round trip, whatever the number of rules. On one node,
///   concurrent requests share that call (`RedisBatch::with_coalescing`: one `FCALL` for the
///   requests that arrive while the previous call is in flight, each decided in turn as alone).
/// * **Lease mode**: rule by rule, each on its local lease (a round trip only when a lease runs
///   out); on a denial every rule that admitted gets its units back into its lease.
/// * **A group** ([`check_all`](Self::check_all), the descriptors of one RLS call): per request
///   mode, when the requests have one cost and no rule and key in common, every rule of every
///   request in **one script call**, written only when every enforcing rule of every request
///   admits (one round trip, exact). Otherwise (lease mode, different costs, a key two requests
///   share) each request as above, in order, and when one is refused what the others admitted is
///   given back by refund scripts: between an admission and its refund another caller can see
///   those units spent (refused a little early, never admitted beyond the quota); a refund Redis
///   cannot take (an outage) leaves the units spent: stricter, never looser.
///
/// # Costs known only after the response
/// [`reserve`](Self::reserve) an estimate (one round trip per request mode), then
/// [`settle`](Self::settle) the actual cost (one round trip for all of the request's rules: the
/// surplus given back, an overdraft charged into debt); a dropped reservation stays at its
/// estimate. See [`RedisReservation`](crate::RedisReservation).
///
/// # Keys
/// A rule's key `k` lives at `<prefix><rule>:<algorithm>:<k>`: `k` is the descriptor's value for a
/// rule keyed by one descriptor, the hex of the length-prefixed encoding for several, empty for a
/// global rule; `<algorithm>` is `gcra`, `leaky_bucket`, `fixed_window` or `sliding_window` (GCRA
/// and the lease mode share it). With [`RedisSettings::hash_tag`], a rule keyed by that descriptor
/// stores `{t<hex of its value>}k` instead, so that all such keys of a request share one Redis
/// Cluster slot. Every quota of a rule (its own, its overrides', before and after a
/// reload) uses the same key: see [`reload`](Self::reload) for how a state crosses a quota change.
/// (Versions before quota tags put the window length in the windows' label, `fixed_window@60000ms`:
/// their window keys start fresh once after the upgrade.)
///
/// # When Redis cannot answer
/// Each limiter sits behind tollgate-redis's circuit breaker. [`RedisSettings::fail`] gives the
/// answer: `FailClosed` denies with its `retry_after`; `FailOpen` treats the rule as not applying to
/// the request. Every such answer is counted in
/// `tollgate_policy_store_failures_total{rule,cause,answer}` (plus the config's `metric_labels`;
/// `cause`: `outage`, `circuit_open`, `corrupt`, `config`, `not_replicated`).
///
/// # Durable admissions
/// With [`RedisSettings::durable`] (per request mode), a request whose script admitted it is
/// answered only once the replicas asked for confirm the admission (`WAIT`, one more round trip).
/// When fewer confirm within the timeout, the request is answered by [`RedisSettings::fail`]
/// (closed: denied, its units staying spent on the primary; open: admitted with no rule deciding),
/// counted with `cause="not_replicated"`. A denied request waits for nothing. So an admission a
/// client was told about survives the primary's loss when a confirming replica is promoted (see
/// tollgate-redis's `Durability` for what `WAIT` does not cover).
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tollgate_policy::{PolicyConfig, RedisPolicy, RedisSettings};
/// let config = PolicyConfig::from_toml(r#"
///     [[rules]]
///     name = "per_user"
///     match = { user = "any" }
///     key = ["user"]
///     limit = 100
///     period = "1m"
/// "#)?;
/// let conn = tollgate_redis::connect("redis://127.0.0.1/", &Default::default())?;
/// let policy = RedisPolicy::new(config, conn, RedisSettings::default())?;
/// let (decided, _next) = policy.check(&[("user", "alice")], 1).await?;
/// assert!(decided.is_allowed());
/// # Ok(()) }
/// ```
pub struct RedisPolicy {
    pub(crate) current: ArcSwap<RedisLive>,
    conn: Connection,
    settings: RedisSettings,
    pub(crate) dry_run: AtomicBool,
    reloads: Mutex<()>,
}

impl std::fmt::Debug for RedisPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisPolicy")
            .field("rules", &self.rules())
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl RedisPolicy {
    /// Builds the policy on `conn`: one node ([`tollgate_redis::connect`]) or a Redis Cluster
    /// ([`tollgate_redis::connect_cluster`]), where a request whose keys lie in several slots is one
    /// script per slot group with compensating refunds (see `RedisBatch::with_slot_groups`; a
    /// [`RedisSettings::hash_tag`] keeps a request's tenant-keyed rules in one slot). Keyed rules
    /// need no `capacity` here (their state is in Redis).
    ///
    /// # Errors
    /// A [`ConfigError`] naming the rule and field.
    pub fn new(
        config: PolicyConfig,
        conn: impl Into<Connection>,
        settings: RedisSettings,
    ) -> Result<Self, ConfigError> {
        let conn = conn.into();
        let validated = config.validate_shared()?;
        let mut rules = RuleSet::compile(config, &validated, None)?;
        tag_rules(&mut rules, &settings);
        let store = RedisStore::build(&rules, &settings, &conn, None)?;
        Ok(RedisPolicy {
            current: ArcSwap::from_pointee(RedisLive { rules, store }),
            conn,
            settings,
            dry_run: AtomicBool::new(false),
            reloads: Mutex::new(()),
        })
    }

    /// A policy for `config` that carries `previous`'s in-process parts over (each rule's counters
    /// where its name and identity stay; each Redis limiter, with its breaker and live leases, where
    /// it is built alike) while `previous` goes on deciding unchanged until the caller swaps them:
    /// for a caller that replaces several policies as one (tollgate-server's domains).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn succeed(
        previous: &RedisPolicy,
        config: PolicyConfig,
        conn: impl Into<Connection>,
        settings: RedisSettings,
    ) -> Result<Self, ConfigError> {
        let conn = conn.into();
        let validated = config.validate_shared()?;
        let old = previous.current.load_full();
        let mut rules = RuleSet::compile(config, &validated, Some(&old.rules))?;
        tag_rules(&mut rules, &settings);
        let store = RedisStore::build(&rules, &settings, &conn, Some(&old.store))?;
        Ok(RedisPolicy {
            current: ArcSwap::from_pointee(RedisLive { rules, store }),
            conn,
            settings,
            // Relaxed: a switch; see `set_dry_run`.
            dry_run: AtomicBool::new(previous.dry_run.load(Ordering::Relaxed)),
            reloads: Mutex::new(()),
        })
    }

    /// Decides a request of `cost` units with these descriptors: the same decision as
    /// [`Policy::check_next_at`](crate::Policy::check_next_at), on Redis's clock, with the
    /// `RateLimit` field's `t` worked out from the deciding admission (no extra round trip).
    ///
    /// # Errors
    /// [`PolicyError::CostExceedsCapacity`] when an enforcing rule can never admit `cost`; what
    /// other rules admitted is given back.
    pub async fn check(
        &self,
        descriptors: &Descriptors<'_>,
        cost: u64,
    ) -> Result<(PolicyDecision, Option<Duration>), PolicyError> {
        self.decide(descriptors, None, cost).await
    }

    /// [`check`](Self::check) at an explicit time instead of Redis's clock (nanoseconds since the
    /// Unix epoch, sent to the scripts in microseconds), for simulation and tests.
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub async fn check_at(
        &self,
        descriptors: &Descriptors<'_>,
        now: Nanos,
        cost: u64,
    ) -> Result<(PolicyDecision, Option<Duration>), PolicyError> {
        self.decide(descriptors, Some(now), cost).await
    }

    /// Decides several requests as one, as [`Policy::check_all_at`](crate::Policy::check_all_at)
    /// does: when any is denied or cannot be decided, what the others admitted is given back.
    pub async fn check_all(
        &self,
        requests: &[(&Descriptors<'_>, u64)],
    ) -> Vec<Result<(PolicyDecision, Option<Duration>), PolicyError>> {
        self.decide_all(requests, None).await
    }

    /// [`check_all`](Self::check_all) at an explicit time, for simulation and tests.
    pub async fn check_all_at(
        &self,
        requests: &[(&Descriptors<'_>, u64)],
        now: Nanos,
    ) -> Vec<Result<(PolicyDecision, Option<Duration>), PolicyError>> {
        self.decide_all(requests, Some(now)).await
    }

    async fn decide_all(
        &self,
        requests: &[(&Descriptors<'_>, u64)],
        now: Option<Nanos>,
    ) -> Vec<Result<Decided, PolicyError>> {
        let live = self.current.load_full();
        // Relaxed: a switch read by each decision; it publishes no other data.
        let dry = live.rules.dry_run || self.dry_run.load(Ordering::Relaxed);
        engine_async::decide_all_async(&live.rules, &live.store, requests, dry, now).await
    }

    async fn decide(
        &self,
        descriptors: &Descriptors<'_>,
        now: Option<Nanos>,
        cost: u64,
    ) -> Result<Decided, PolicyError> {
        let live = self.current.load_full();
        // Relaxed: a switch read by each decision; it publishes no other data.
        let dry = live.rules.dry_run || self.dry_run.load(Ordering::Relaxed);
        engine_async::decide_async(&live.rules, &live.store, descriptors, dry, now, cost).await
    }

    /// Replaces the rules with `config`'s: nothing changes unless the whole config is valid. A rule
    /// that stays keeps its counters; a limiter whose prefix, algorithm, quota and settings stay
    /// is kept (its breaker, its live leases); the state in Redis stays where its key stays.
    ///
    /// **A changed quota carries each key's state over as-is in units**, as
    /// [`Policy::reload`](crate::Policy::reload) does (a rule's limit, burst or window, an override
    /// added, changed or removed; every algorithm; per request and lease mode): each stored state
    /// names the quota it was written under, and the first script that touches the key under
    /// another quota converts it with the core's
    /// [`Algorithm::carry_over`](tollgate_core::Algorithm::carry_over) at that instant and stores
    /// the result (even when it denies). The key keeps `min(what it could take under its old quota
    /// then, the new capacity)`: a key that just spent its burst gets nothing back whichever way the
    /// quota changed. One difference from the in-process reload: the conversion happens at the
    /// key's first call after the reload, not at the reload instant, so a key idle across the
    /// reload refills under its old quota until then (it never holds more than the old quota would
    /// have given it, nor more than the new capacity). Replicas reloaded at different times convert
    /// back and forth as-is; each conversion only keeps or drops units. A changed algorithm is a
    /// new key (fresh), as in process.
    ///
    /// # Errors
    /// As [`new`](Self::new); the old rules stay in force.
    pub fn reload(&self, config: PolicyConfig) -> Result<(), ConfigError> {
        let _serial = self
            .reloads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let validated = config.validate_shared()?;
        let old = self.current.load_full();
        let mut rules = RuleSet::compile(config, &validated, Some(&old.rules))?;
        tag_rules(&mut rules, &self.settings);
        let store = RedisStore::build(&rules, &self.settings, &self.conn, Some(&old.store))?;
        self.current.store(Arc::new(RedisLive { rules, store }));
        Ok(())
    }

    /// Turns every rule into a shadow rule while `on` (on top of the config's `dry_run`).
    pub fn set_dry_run(&self, on: bool) {
        // Relaxed: a switch read by each decision; it publishes no other data.
        self.dry_run.store(on, Ordering::Relaxed);
    }

    /// The configuration in force.
    pub fn config(&self) -> PolicyConfig {
        self.current.load().rules.config.clone()
    }

    /// The rule names, in evaluation order.
    pub fn rules(&self) -> Vec<&'static str> {
        self.current.load().rules.names()
    }

    /// Every rule's counters (what this process decided).
    pub fn snapshot(&self) -> PolicySnapshot {
        self.current.load().rules.snapshot(|_| 0)
    }
}
