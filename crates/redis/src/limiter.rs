//! One Lua script call per decision.

use redis::aio::{ConnectionLike, ConnectionManager};
use tollgate_core::{CheckError, Decision, Nanos, Quota, QuotaError};

use crate::config::{FaultPolicy, RedisConfig};
use crate::error::Error;
use crate::scripts::{self, FIXED_WINDOW, GCRA, SLIDING_WINDOW};

/// Which algorithm a [`RedisLimiter`] runs; each is one atomic script on one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisAlgorithm {
    /// GCRA token bucket, as [`tollgate_core::Gcra`]. Key: a string, the theoretical arrival time in µs.
    Gcra,
    /// Fixed window, as [`tollgate_core::FixedWindow`]. Key: a hash `{i: window index, c: count}`.
    FixedWindow,
    /// Sliding window counter, as [`tollgate_core::SlidingWindow`]. Key: a hash
    /// `{i: window index, p: previous count, c: current count}`.
    SlidingWindow,
}

/// A rate limiter whose state lives in Redis: every decision is one atomic Lua script call on one key.
///
/// * Same transitions as the core's pure `decide` (see the crate docs for the µs unit), same
///   [`Decision`].
/// * Scripts are sent by SHA (`EVALSHA`) and reloaded on `NOSCRIPT` (after a restart, failover or
///   `SCRIPT FLUSH`).
/// * Every write sets the key's TTL to the time at which its state becomes indistinguishable from a
///   fresh one, so idle keys cost no memory. A denial or a peek writes nothing.
/// * `C` is any redis-rs async connection that can be cloned cheaply: [`ConnectionManager`] (the
///   default, reconnects by itself), `MultiplexedConnection`, or a cluster connection (every script
///   touches one key).
///
/// ```no_run
/// use tollgate_core::Quota;
/// use tollgate_redis::{connect, RedisConfig, RedisLimiter};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let config = RedisConfig::default().with_prefix("api:");
/// let conn = connect("redis://127.0.0.1:6379/", &config)?;
/// let limiter = RedisLimiter::gcra(conn, Quota::per_second(100)?, config)?;
/// let decision = limiter.check("user:42", 1).await?; // fault policy applied
/// println!("allowed: {}", decision.is_allowed());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RedisLimiter<C = ConnectionManager> {
    conn: C,
    config: RedisConfig,
    algorithm: RedisAlgorithm,
    quota: Quota,
    /// `(interval_us, depth_us)` for GCRA, `(window_us, limit)` for the windows.
    params: (String, String),
    capacity: u64,
}

impl<C: ConnectionLike + Clone + Send + Sync> RedisLimiter<C> {
    /// A limiter running `algorithm` for `quota` over `conn`.
    ///
    /// # Errors
    /// A [`QuotaError`] when the quota's figures in µs would not stay exact in Lua's doubles (below
    /// 2^52: a GCRA depth over 142 years, or a window's `limit × window_us` over 2^52), or
    /// [`QuotaError::RateTooHigh`] for GCRA above one unit per µs per key.
    pub fn new(
        conn: C,
        algorithm: RedisAlgorithm,
        quota: Quota,
        config: RedisConfig,
    ) -> Result<Self, QuotaError> {
        let ((p1, p2), capacity) = match algorithm {
            RedisAlgorithm::Gcra => (scripts::gcra_params(&quota)?, quota.burst()),
            RedisAlgorithm::FixedWindow | RedisAlgorithm::SlidingWindow => {
                (scripts::window_params(&quota)?, quota.limit())
            }
        };
        Ok(RedisLimiter {
            conn,
            config,
            algorithm,
            quota,
            params: (p1.to_string(), p2.to_string()),
            capacity,
        })
    }

    /// A GCRA limiter (see [`new`](Self::new)).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn gcra(conn: C, quota: Quota, config: RedisConfig) -> Result<Self, QuotaError> {
        Self::new(conn, RedisAlgorithm::Gcra, quota, config)
    }

    /// A fixed-window limiter (see [`new`](Self::new)).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn fixed_window(conn: C, quota: Quota, config: RedisConfig) -> Result<Self, QuotaError> {
        Self::new(conn, RedisAlgorithm::FixedWindow, quota, config)
    }

    /// A sliding-window-counter limiter (see [`new`](Self::new)).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn sliding_window(conn: C, quota: Quota, config: RedisConfig) -> Result<Self, QuotaError> {
        Self::new(conn, RedisAlgorithm::SlidingWindow, quota, config)
    }

    /// The algorithm.
    pub fn algorithm(&self) -> RedisAlgorithm {
        self.algorithm
    }

    /// The quota enforced.
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The settings.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// The largest cost one request may have.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Decides `cost` units for `key`, consuming capacity if allowed; a Redis fault is answered by the
    /// [`FaultPolicy`].
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
    /// [`Error::Cost`], [`Error::Timeout`], [`Error::Redis`], [`Error::BadReply`].
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

    fn with_policy(&self, result: Result<Decision, Error>) -> Result<Decision, CheckError> {
        apply_policy(self.config.policy(), result)
    }

    async fn run(
        &self,
        key: &str,
        now: Option<Nanos>,
        cost: u64,
        peek: bool,
    ) -> Result<Decision, Error> {
        if cost > self.capacity {
            return Err(Error::Cost(CheckError::CostExceedsCapacity {
                cost,
                capacity: self.capacity,
            }));
        }
        let script = match self.algorithm {
            RedisAlgorithm::Gcra => &*GCRA,
            RedisAlgorithm::FixedWindow => &*FIXED_WINDOW,
            RedisAlgorithm::SlidingWindow => &*SLIDING_WINDOW,
        };
        let time = scripts::time_arg(&self.config, now);
        let cost = cost.to_string();
        let peek = if peek { "1" } else { "0" };
        let args = [&*time, &*cost, peek, &*self.params.0, &*self.params.1];
        let reply = scripts::invoke(&self.conn, &self.config, script, key, args).await?;
        Ok(reply.decision())
    }
}

/// A result with backend faults replaced by the policy's decision.
pub(crate) fn apply_policy(
    policy: FaultPolicy,
    result: Result<Decision, Error>,
) -> Result<Decision, CheckError> {
    match result {
        Ok(decision) => Ok(decision),
        Err(Error::Cost(e)) => Err(e),
        Err(_) => Ok(policy.decision()),
    }
}
