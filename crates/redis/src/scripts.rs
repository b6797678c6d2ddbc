//! The Lua scripts, their parameters in microseconds, and their replies.

use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::Script;
use tollgate_core::{Decision, Nanos, Quota, QuotaError};

use crate::config::{RedisConfig, TimeSource};
use crate::error::Error;

/// Integers the scripts handle stay below 2^53 (exact in a Lua double). Parameters are held below
/// 2^52 so that `now` (about 2^50.6 µs today) plus any of them stays exact until the year 2112.
pub(crate) const LUA_PARAM_MAX: u64 = 1 << 52;

macro_rules! lua {
    ($file:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("lua/prelude.lua"),
                include_str!(concat!("lua/", $file))
            ))
        })
    };
}

pub(crate) static GCRA: LazyLock<Script> = lua!("gcra.lua");
pub(crate) static LEASE: LazyLock<Script> = lua!("lease.lua");
pub(crate) static FIXED_WINDOW: LazyLock<Script> = lua!("fixed_window.lua");
pub(crate) static SLIDING_WINDOW: LazyLock<Script> = lua!("sliding_window.lua");

/// Nanoseconds rounded up to whole microseconds.
pub(crate) fn ceil_us(ns: Nanos) -> u64 {
    ns.div_ceil(1000)
}

/// GCRA parameters in µs: `(interval_us, depth_us)`, the interval rounded up (never faster). More
/// than one unit per µs per key is [`QuotaError::RateTooHigh`] (rounding would cut the rate).
pub(crate) fn gcra_params(quota: &Quota) -> Result<(u64, u64), QuotaError> {
    if quota.emission_interval_nanos() < 1000 {
        return Err(QuotaError::RateTooHigh);
    }
    let interval = ceil_us(quota.emission_interval_nanos());
    let depth = quota
        .burst()
        .checked_mul(interval)
        .filter(|d| *d < LUA_PARAM_MAX)
        .ok_or(QuotaError::BurstTooLarge)?;
    Ok((interval, depth))
}

/// Window parameters in µs: `(window_us, limit)`, the window rounded up (never more per window).
pub(crate) fn window_params(quota: &Quota) -> Result<(u64, u64), QuotaError> {
    let window = ceil_us(quota.period_nanos());
    if window >= LUA_PARAM_MAX {
        return Err(QuotaError::PeriodTooLong);
    }
    let max = (LUA_PARAM_MAX - 1) / window;
    if quota.limit() > max {
        return Err(QuotaError::LimitTooLarge { max });
    }
    Ok((window, quota.limit()))
}

/// The script's first argument: `now` in µs, or `""` for the server's `TIME`.
pub(crate) fn time_arg(config: &RedisConfig, now: Option<Nanos>) -> String {
    match (now, config.time()) {
        (Some(now), _) => (now / 1000).to_string(),
        (None, TimeSource::Server) => String::new(),
        (None, TimeSource::System) => {
            let since = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or(Duration::ZERO);
            since.as_micros().to_string()
        }
    }
}

/// A script reply `{a, b, retry_us, reset_us}`, microseconds converted to nanoseconds (-1: never).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reply {
    pub a: u64,
    pub b: u64,
    pub retry: Nanos,
    pub reset: Nanos,
}

impl Reply {
    pub(crate) fn parse(raw: &[i64]) -> Result<Reply, Error> {
        let &[a, b, retry, reset] = raw else {
            return Err(Error::BadReply(format!("{} values, want 4", raw.len())));
        };
        let count = |v: i64| u64::try_from(v).map_err(|_| Error::BadReply(format!("count {v}")));
        let us = |v: i64| match v {
            -1 => Ok(Nanos::MAX),
            v => u64::try_from(v)
                .map(|us| us.saturating_mul(1000))
                .map_err(|_| Error::BadReply(format!("duration {v}"))),
        };
        Ok(Reply {
            a: count(a)?,
            b: count(b)?,
            retry: us(retry)?,
            reset: us(reset)?,
        })
    }

    /// For the decision scripts: `a` = allowed (0/1), `b` = remaining.
    pub(crate) fn decision(self) -> Decision {
        if self.a != 0 {
            Decision::allowed(self.b, self.reset)
        } else {
            Decision::denied(self.retry, self.reset)
        }
    }
}

/// Runs `script` on one key (EVALSHA, loading the script on NOSCRIPT) under the configured timeout.
pub(crate) async fn invoke<C>(
    conn: &C,
    config: &RedisConfig,
    script: &Script,
    key: &str,
    args: [&str; 5],
) -> Result<Reply, Error>
where
    C: redis::aio::ConnectionLike + Clone + Send,
{
    let mut conn = conn.clone();
    let mut call = script.key(config.key(key));
    for arg in args {
        call.arg(arg);
    }
    let reply: Vec<i64> = tokio::time::timeout(config.timeout(), call.invoke_async(&mut conn))
        .await
        .map_err(|_| Error::Timeout(config.timeout()))?
        .map_err(|e| {
            // The connection's own response timeout (set by `connect`) is the same timeout.
            if e.is_timeout() {
                Error::Timeout(config.timeout())
            } else {
                Error::Redis(e)
            }
        })?;
    Reply::parse(&reply)
}
