//! How a Redis-backed limiter talks to Redis: key prefix, per-call timeout, fault policy, time source.

use std::time::Duration;

use tollgate_core::Decision;

use crate::breaker::BreakerConfig;

/// What a limiter answers when Redis cannot (timeout, connection down, server error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultPolicy {
    /// Admit the request (`remaining` 0, `reset_after` 0): availability over protection. Use it when
    /// the limiter guards fairness rather than a resource that falls over.
    FailOpen,
    /// Deny the request, telling the caller to retry after `retry_after`: protection over
    /// availability.
    FailClosed {
        /// The `retry_after` (and `reset_after`) reported while Redis is unreachable.
        retry_after: Duration,
    },
}

impl FaultPolicy {
    /// The decision this policy gives in place of one Redis could not make.
    pub fn decision(self) -> Decision {
        match self {
            FaultPolicy::FailOpen => Decision::Allowed {
                remaining: 0,
                reset_after: Duration::ZERO,
            },
            FaultPolicy::FailClosed { retry_after } => Decision::Denied {
                retry_after,
                reset_after: retry_after,
            },
        }
    }
}

/// Whose clock times the scripts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TimeSource {
    /// The Redis server's `TIME`, read inside the script (default): one clock for every instance, so
    /// client clock skew cannot matter. Allowed because Redis ≥ 5 replicates scripts by their effects
    /// (the only mode since Redis 7), so a script may read `TIME` and then write.
    #[default]
    Server,
    /// This process's wall clock (`SystemTime`, µs since the Unix epoch), sent as an argument: for
    /// deployments that reject `TIME` in scripts. Instances must then keep their clocks in sync; skew
    /// between them loosens or tightens the limit by the skew times the rate.
    System,
}

/// Settings shared by [`RedisLimiter`](crate::RedisLimiter) and
/// [`LeasedLimiter`](crate::LeasedLimiter).
///
/// ```
/// use std::time::Duration;
/// use tollgate_redis::{FaultPolicy, RedisConfig, TimeSource};
///
/// let config = RedisConfig::default()
///     .with_prefix("api:rl:")
///     .with_timeout(Duration::from_millis(20))
///     .with_policy(FaultPolicy::FailOpen)
///     .with_time(TimeSource::Server);
/// assert_eq!(config.key("{tenant42}:login"), "api:rl:{tenant42}:login");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisConfig {
    prefix: String,
    timeout: Duration,
    policy: FaultPolicy,
    time: TimeSource,
    breaker: BreakerConfig,
}

impl Default for RedisConfig {
    /// Prefix `"tollgate:"`, a 50 ms timeout, fail closed (retry after 1 s), server time, and a
    /// circuit breaker that opens after 3 consecutive failures and probes every 100 ms.
    fn default() -> Self {
        RedisConfig {
            prefix: "tollgate:".to_owned(),
            timeout: Duration::from_millis(50),
            policy: FaultPolicy::FailClosed {
                retry_after: Duration::from_secs(1),
            },
            time: TimeSource::Server,
            breaker: BreakerConfig::default(),
        }
    }
}

impl RedisConfig {
    /// Namespace every key with `prefix` (the Redis key is `prefix + key`).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Give up on a Redis call after `timeout` (then the fault policy decides).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What to answer while Redis is unreachable.
    pub fn with_policy(mut self, policy: FaultPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Whose clock times the scripts.
    pub fn with_time(mut self, time: TimeSource) -> Self {
        self.time = time;
        self
    }

    /// The circuit breaker in front of the connection (see [`BreakerConfig`]): after
    /// `failures` consecutive outage failures, calls are answered by the fault policy at once
    /// without touching the network, and one caller per `probe_interval` probes Redis.
    pub fn with_breaker(mut self, breaker: BreakerConfig) -> Self {
        self.breaker = breaker;
        self
    }

    /// The circuit-breaker settings.
    pub fn breaker(&self) -> BreakerConfig {
        self.breaker
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The fault policy.
    pub fn policy(&self) -> FaultPolicy {
        self.policy
    }

    /// The time source.
    pub fn time(&self) -> TimeSource {
        self.time
    }

    /// The Redis key for a user key: `prefix + key`.
    pub fn key(&self, key: &str) -> String {
        let mut full = String::with_capacity(self.prefix.len() + key.len());
        full.push_str(&self.prefix);
        full.push_str(key);
        full
    }
}
