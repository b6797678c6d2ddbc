//! One Lua script call per decision.

use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager};
use tollgate_core::{
    CheckError, Decision, FixedWindow, Gcra, Nanos, Quota, QuotaError, SlidingWindow,
};

use crate::breaker::{Breaker, BreakerStats};
use crate::config::RedisConfig;
use crate::encoding::RedisEncoding;
use crate::error::Error;
use crate::faults::{FaultCounts, Faults};
use crate::params::ScriptParams;
use crate::scripts;

/// A rate limiter whose state lives in Redis: every decision is one atomic Lua script call on one key,
/// running algorithm `A` (any [`RedisEncoding`]: [`Gcra`] by default, [`LeakyBucket`](tollgate_core::LeakyBucket),
/// [`FixedWindow`], [`SlidingWindow`]).
///
/// * Same transitions as the core's pure `decide` (see [`RedisEncoding`] and each algorithm's
///   encoding for what a µs clock rounds), same [`Decision`].
/// * Scripts are sent by SHA (`EVALSHA`) and reloaded on `NOSCRIPT` (after a restart, failover or
///   `SCRIPT FLUSH`).
/// * Every write sets the key's TTL to the time at which its state becomes indistinguishable from a
///   fresh one, so idle keys cost no memory. A denial or a peek writes nothing.
/// * `C` is any redis-rs async connection that can be cloned cheaply: [`ConnectionManager`] (the
///   default, reconnects by itself), `MultiplexedConnection`, or a cluster connection (every script
///   touches one key).
///
/// ```no_run
/// use tollgate_core::{Quota, SlidingWindow};
/// use tollgate_redis::{connect, RedisConfig, RedisLimiter};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let config = RedisConfig::default().with_prefix("api:");
/// let conn = connect("redis://127.0.0.1:6379/", &config)?;
/// let limiter = RedisLimiter::gcra(conn.clone(), Quota::per_second(100)?, config.clone())?;
/// let decision = limiter.check("user:42", 1).await?; // fault policy applied
/// println!("allowed: {}", decision.is_allowed());
/// // Any algorithm with a Redis encoding, by type:
/// let windows = RedisLimiter::<SlidingWindow>::new(conn, Quota::per_minute(600)?, config)?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RedisLimiter<A = Gcra, C = ConnectionManager> {
    conn: C,
    config: RedisConfig,
    algorithm: A,
    params: ScriptParams,
    faults: Arc<Faults>,
    breaker: Arc<Breaker>,
}

impl<A: RedisEncoding, C: ConnectionLike + Clone + Send + Sync> RedisLimiter<A, C> {
    /// A limiter running `A` for `quota` over `conn`: `A` is built from
    /// [`A::redis_quota(quota)`](RedisEncoding::redis_quota), the quota itself wherever the script
    /// can follow it exactly (see [`algorithm`](Self::algorithm) for what runs).
    ///
    /// # Errors
    /// A [`QuotaError`] when the quota's figures would not stay exact in Lua's doubles (a GCRA depth
    /// over 71 years, or a window's `limit × window_us` over 2^52), or when `A` rejects it.
    pub fn new(conn: C, quota: Quota, config: RedisConfig) -> Result<Self, QuotaError> {
        Self::from_algorithm(conn, A::from_quota(A::redis_quota(quota)?)?, config)
    }

    /// A limiter running exactly `algorithm` over `conn`.
    ///
    /// # Errors
    /// A [`QuotaError`] when the script cannot follow `algorithm` exactly (build it from
    /// [`RedisEncoding::redis_quota`], or use [`new`](Self::new)).
    pub fn from_algorithm(conn: C, algorithm: A, config: RedisConfig) -> Result<Self, QuotaError> {
        Ok(RedisLimiter {
            breaker: Arc::new(Breaker::new(config.breaker(), config.prefix())),
            conn,
            config,
            params: algorithm.script_params()?,
            algorithm,
            faults: Arc::default(),
        })
    }

    /// The algorithm the script follows, with its parameters.
    pub fn algorithm(&self) -> &A {
        &self.algorithm
    }

    /// The quota enforced (the algorithm's, see [`new`](Self::new)).
    pub fn quota(&self) -> &Quota {
        self.algorithm.quota()
    }

    /// The script's parameters.
    pub(crate) fn params(&self) -> &ScriptParams {
        &self.params
    }

    /// The settings.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// The largest cost one request may have.
    pub fn capacity(&self) -> u64 {
        self.algorithm.capacity()
    }

    /// How many `check`/`peek` calls the fault policy answered, and how many
    /// [`refund`](Self::refund)s a fault lost, by cause: outages, corrupt state, configuration errors
    /// (shared by this limiter's clones).
    pub fn faults(&self) -> FaultCounts {
        self.faults.snapshot()
    }

    /// The circuit breaker's state and counters (shared by this limiter's clones; see
    /// [`BreakerConfig`](crate::BreakerConfig)).
    pub fn breaker(&self) -> BreakerStats {
        self.breaker.stats()
    }

    /// Decides `cost` units for `key`, consuming capacity if allowed. When no decision can be made
    /// (Redis unreachable or slow, corrupt state under the key, a key of another type: see
    /// [`try_check`](Self::try_check)), the [`FaultPolicy`](crate::FaultPolicy) answers and
    /// [`faults`](Self::faults) counts the cause, so a misconfiguration or bad state shows apart from
    /// an outage.
    ///
    /// # Errors
    /// Only [`CheckError::CostExceedsCapacity`]: a cost that can never pass.
    pub async fn check(&self, key: &str, cost: u64) -> Result<Decision, CheckError> {
        self.with_policy(self.run(key, None, cost, false).await)
    }

    /// What [`check`](Self::check) would decide, consuming nothing.
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub async fn peek(&self, key: &str, cost: u64) -> Result<Decision, CheckError> {
        self.with_policy(self.run(key, None, cost, true).await)
    }

    /// [`check`](Self::check) without the fault policy: backend faults come back as errors.
    ///
    /// # Errors
    /// [`Error::Cost`]; the outages [`Error::Timeout`], [`Error::Redis`], [`Error::BadReply`];
    /// [`Error::CorruptState`] when the key holds a value the script cannot have written;
    /// [`Error::WrongType`] (a configuration error) when it holds another Redis type.
    pub async fn try_check(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.run(key, None, cost, false).await
    }

    /// [`peek`](Self::peek) without the fault policy.
    ///
    /// # Errors
    /// As [`try_check`](Self::try_check).
    pub async fn try_peek(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.run(key, None, cost, true).await
    }

    /// [`try_check`](Self::try_check) at a time the caller supplies (ns on a time base every instance
    /// shares, e.g. since the Unix epoch), rounded down to whole µs; for tests and simulations.
    ///
    /// # Errors
    /// As [`try_check`](Self::try_check).
    pub async fn try_check_at(&self, key: &str, now: Nanos, cost: u64) -> Result<Decision, Error> {
        self.run(key, Some(now), cost, false).await
    }

    /// [`try_peek`](Self::try_peek) at a time the caller supplies (as [`try_check_at`](Self::try_check_at)).
    ///
    /// # Errors
    /// As [`try_check`](Self::try_check).
    pub async fn try_peek_at(&self, key: &str, now: Nanos, cost: u64) -> Result<Decision, Error> {
        self.run(key, Some(now), cost, true).await
    }

    /// Gives back `cost` units that [`check`](Self::check) admitted for `key`, as the algorithm's
    /// in-process [`refund`](tollgate_core::Algorithm::refund) does (one atomic script call; see
    /// [`try_refund`](Self::try_refund) for what each algorithm gives back). For a decision made
    /// against several limits, when one denied: the others give back what they admitted.
    ///
    /// A refund that cannot be made (Redis unreachable or slow, an open breaker, corrupt state, a key
    /// of another type) is counted in [`faults`](Self::faults) and otherwise dropped, whatever the
    /// [`FaultPolicy`](crate::FaultPolicy): **a refund lost to an outage leaves the units spent**,
    /// which is stricter, never looser. Use [`try_refund`](Self::try_refund) to see the error.
    pub async fn refund(&self, key: &str, cost: u64) {
        if let Err(e) = self.refund_run(key, None, cost).await {
            self.faults.count(&e);
        }
    }

    /// [`refund`](Self::refund) without the fault handling: the error comes back.
    ///
    /// What comes back is exactly what the core's `refund` gives back for the same state, `now` and
    /// `cost` (the crate's tests check it against the core on random traces):
    /// * GCRA and the leaky bucket: the TAT moves back by `cost` emission intervals, never below
    ///   now (a TAT at or before now is a full bucket, the absent key), and the key's TTL follows
    ///   the new TAT.
    /// * Fixed window: the count of the window stored goes down by `cost` (saturating) when that is
    ///   now's window; nothing once the window has rolled (its count has reset already).
    /// * Sliding window: the current window's count goes down by `cost` (saturating) while the
    ///   stored window is now's; the previous count when a later admission has moved it one window
    ///   on (a refund at the admission's own time, see [`try_refund_at`](Self::try_refund_at));
    ///   nothing otherwise. The TTL follows the counts left.
    ///
    /// A state left fresh is deleted. Any `cost` is accepted (more than was admitted saturates); a
    /// refund of 0 returns at once without a round trip, as does one the core would give nothing
    /// back for whatever the state ([`refund_cost`](RedisEncoding::refund_cost): a GCRA `cost ×
    /// interval` beyond `u64`). Algorithms without a
    /// [`refund_script`](RedisEncoding::refund_script) give nothing back, also without one.
    ///
    /// # Errors
    /// The backend faults of [`try_check`](Self::try_check) ([`Error::Cost`] never): the outages
    /// [`Error::Timeout`], [`Error::Redis`], [`Error::BadReply`], [`Error::CircuitOpen`];
    /// [`Error::CorruptState`]; [`Error::WrongType`]. Nothing was given back then.
    pub async fn try_refund(&self, key: &str, cost: u64) -> Result<(), Error> {
        self.refund_run(key, None, cost).await
    }

    /// [`try_refund`](Self::try_refund) at a time the caller supplies, as
    /// [`try_check_at`](Self::try_check_at). Give the admission's own `now` to undo it exactly (the
    /// core's contract): the windows then find the window it counted in even when a later admission
    /// has moved the state on.
    ///
    /// # Errors
    /// As [`try_refund`](Self::try_refund).
    pub async fn try_refund_at(&self, key: &str, now: Nanos, cost: u64) -> Result<(), Error> {
        self.refund_run(key, Some(now), cost).await
    }

    async fn refund_run(&self, key: &str, now: Option<Nanos>, cost: u64) -> Result<(), Error> {
        let Some(script) = A::refund_script() else {
            return Ok(());
        };
        let Some(cost) = self.algorithm.refund_cost(cost).filter(|&c| c > 0) else {
            return Ok(());
        };
        let time = scripts::time_arg(&self.config, now);
        let cost = cost.to_string();
        let head = [&*time, &*cost, ""];
        scripts::invoke(
            &self.conn,
            &self.breaker,
            &self.config,
            scripts::Lua::Script(script),
            key,
            head,
            &self.params,
        )
        .await?;
        Ok(())
    }

    /// Counts `cost` units for `key` now **without a decision**, as the algorithm's in-process
    /// [`charge`](tollgate_core::Algorithm::charge) does (one atomic script call): what a
    /// settlement owes when a request cost more than it reserved. The key goes into debt where it
    /// has nothing left: GCRA and the leaky bucket move the TAT `cost` intervals past `max(TAT,
    /// now)` (past the bucket's depth if need be), so the next request waits exactly as long as
    /// the overdraft takes to refill; the windows count `cost` into now's window beyond the limit.
    /// The key's quota tag is written as a decision writes it (a state under another quota is
    /// carried over first). Where the core's state would go beyond what the script's exact integers
    /// hold, the script stops at its largest state: a TAT 2^52 of its units ahead of now (at least
    /// 52 days; 142 years for whole-µs intervals), a window count of the script's `max_count` (at
    /// least the limit): either still denies every request the core's state would deny, for at
    /// least that long. A charge of 0 returns at once without a round trip.
    ///
    /// # Errors
    /// The backend faults of [`try_refund`](Self::try_refund); [`Error::NoCharge`] for an
    /// algorithm without a [`charge_script`](RedisEncoding::charge_script). Nothing was counted
    /// then (the units are owed still: see [`charge`](Self::charge)).
    pub async fn try_charge(&self, key: &str, cost: u64) -> Result<(), Error> {
        self.charge_run(key, None, cost).await
    }

    /// [`try_charge`](Self::try_charge) at a time the caller supplies, as
    /// [`try_check_at`](Self::try_check_at).
    ///
    /// # Errors
    /// As [`try_charge`](Self::try_charge).
    pub async fn try_charge_at(&self, key: &str, now: Nanos, cost: u64) -> Result<(), Error> {
        self.charge_run(key, Some(now), cost).await
    }

    /// [`try_charge`](Self::try_charge) with the fault handling: a charge that cannot be made is
    /// counted in [`faults`](Self::faults) and dropped. **A charge lost to an outage is looser** (the
    /// units were used and are not counted): the same exposure as admitting while Redis is down;
    /// call [`try_charge`](Self::try_charge) to retry instead.
    pub async fn charge(&self, key: &str, cost: u64) {
        if let Err(e) = self.charge_run(key, None, cost).await {
            self.faults.count(&e);
        }
    }

    async fn charge_run(&self, key: &str, now: Option<Nanos>, cost: u64) -> Result<(), Error> {
        if cost == 0 {
            return Ok(());
        }
        let script = A::charge_script().ok_or(Error::NoCharge)?;
        let time = scripts::time_arg(&self.config, now);
        let cost = cost.to_string();
        let head = [&*time, &*cost, ""];
        scripts::invoke(
            &self.conn,
            &self.breaker,
            &self.config,
            scripts::Lua::Script(script),
            key,
            head,
            &self.params,
        )
        .await?;
        Ok(())
    }

    fn with_policy(&self, result: Result<Decision, Error>) -> Result<Decision, CheckError> {
        self.faults.apply(self.config.policy(), result)
    }

    async fn run(
        &self,
        key: &str,
        now: Option<Nanos>,
        cost: u64,
        peek: bool,
    ) -> Result<Decision, Error> {
        self.algorithm.check_cost(cost)?;
        let time = scripts::time_arg(&self.config, now);
        let cost = cost.to_string();
        let peek = if peek { "1" } else { "0" };
        let head = [&*time, &*cost, peek];
        let reply = scripts::invoke(
            &self.conn,
            &self.breaker,
            &self.config,
            scripts::Lua::Script(A::script()),
            key,
            head,
            &self.params,
        )
        .await?;
        Ok(reply.decision())
    }
}

impl<C: ConnectionLike + Clone + Send + Sync> RedisLimiter<Gcra, C> {
    /// A GCRA limiter (see [`new`](Self::new)).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn gcra(conn: C, quota: Quota, config: RedisConfig) -> Result<Self, QuotaError> {
        Self::new(conn, quota, config)
    }
}

impl<C: ConnectionLike + Clone + Send + Sync> RedisLimiter<FixedWindow, C> {
    /// A fixed-window limiter (see [`new`](Self::new)).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn fixed_window(conn: C, quota: Quota, config: RedisConfig) -> Result<Self, QuotaError> {
        Self::new(conn, quota, config)
    }
}

impl<C: ConnectionLike + Clone + Send + Sync> RedisLimiter<SlidingWindow, C> {
    /// A sliding-window-counter limiter (see [`new`](Self::new)).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn sliding_window(conn: C, quota: Quota, config: RedisConfig) -> Result<Self, QuotaError> {
        Self::new(conn, quota, config)
    }
}
