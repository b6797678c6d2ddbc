//! [`RedisInFlight`]: an in-flight (concurrency) limit shared by a fleet, on Redis.
//!
//! Each key is a sorted set of **holders**: one member per permit out (a unique holder id), scored
//! by the instant it expires (Redis's own `TIME`, in ms). A take is one script: drop the expired
//! holders, count the rest, and add the new holder if the count is below the limit. A release
//! removes the holder (`ZREM`). A holder whose process crashed (or was killed, or lost its
//! network) never releases, so its permits come back when they expire.
//!
//! The expiry bound is stated on [`RedisInFlight`].
//!
//! Dropping a [`RedisPermit`] inside a tokio runtime sends its `ZREM` from a spawned task; outside
//! one (or if that call fails) the permit comes back at its expiry. [`RedisPermit::release`] awaits
//! the `ZREM` and reports it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::ConnectionManager;
use tollgate_core::{Decision, QuotaError};

use crate::error::Error;

/// Take: drop expired holders, then add `ARGV[2]` if fewer than `ARGV[1]` remain.
/// Reply: `{admitted (0/1), holders after, ms until the earliest holder expires (denials)}`.
const TAKE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit = tonumber(ARGV[1])
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
if held >= limit then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, held, tonumber(first[2]) - now}
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
redis.call('PEXPIRE', KEYS[1], ttl)
return {1, held + 1, 0}
";

/// Renew: push `ARGV[1]`'s expiry to now + `ARGV[2]` ms if it is still a holder. Reply: 0/1.
const RENEW: &str = r"
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
";

/// Count: drop expired holders, count the rest.
const COUNT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
";

/// At most `limit` permits out per key across every instance sharing the Redis.
///
/// **Bound**: a crashed instance's permits count against the limit for at most one `expiry` after
/// its last take or [`renew`](RedisPermit::renew) of each; never longer, and never more than the
/// permits it held. A live holder of a request longer than `expiry` must renew, or its permit is
/// given to someone else (the limit is then exceeded by one until it finishes).
pub struct RedisInFlight {
    conn: ConnectionManager,
    prefix: String,
    limit: u64,
    expiry_ms: u64,
    timeout: Duration,
    instance: u64,
    next: AtomicU64,
    take: redis::Script,
    renew: redis::Script,
    count: redis::Script,
}

impl fmt::Debug for RedisInFlight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisInFlight")
            .field("prefix", &self.prefix)
            .field("limit", &self.limit)
            .field("expiry_ms", &self.expiry_ms)
            .finish_non_exhaustive()
    }
}

impl RedisInFlight {
    /// At most `limit` permits per key (Redis key `{prefix}{key}`), each expiring `expiry` after
    /// its take or last renew; calls time out after 1 s.
    ///
    /// # Errors
    /// [`QuotaError::ZeroLimit`] for a zero limit; [`QuotaError::InvalidDuration`] for an expiry
    /// under 1 ms or beyond what Redis counts.
    pub fn new(
        conn: ConnectionManager,
        prefix: impl Into<String>,
        limit: u64,
        expiry: Duration,
    ) -> Result<Self, QuotaError> {
        if limit == 0 {
            return Err(QuotaError::ZeroLimit);
        }
        let expiry_ms = u64::try_from(expiry.as_millis())
            .ok()
            .filter(|&ms| (1..=i64::MAX as u64 / 2).contains(&ms))
            .ok_or(QuotaError::InvalidDuration)?;
        Ok(RedisInFlight {
            conn,
            prefix: prefix.into(),
            limit,
            expiry_ms,
            timeout: Duration::from_secs(1),
            instance: std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), 0u8),
            next: AtomicU64::new(0),
            take: redis::Script::new(TAKE),
            renew: redis::Script::new(RENEW),
            count: redis::Script::new(COUNT),
        })
    }

    /// The per-call timeout (default 1 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    async fn call<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, Error> {
        let mut conn = self.conn.clone();
        tokio::time::timeout(self.timeout, invocation.invoke_async(&mut conn))
            .await
            .map_err(|_| Error::Timeout(self.timeout))?
            .map_err(Error::from)
    }

    /// Takes one permit for `key`: `Ok(permit)`, or `Err(denial)` whose `retry_after` is when the
    /// earliest holder's permit expires (an upper bound: a release may come sooner).
    ///
    /// # Errors
    /// [`Error::Timeout`], [`Error::Redis`] (nothing is known to be taken; a take that reached
    /// Redis before the error comes back at its expiry), [`Error::BadReply`].
    pub async fn try_acquire(&self, key: &str) -> Result<Result<RedisPermit, Decision>, Error> {
        // Relaxed: only uniqueness of the counter's values matters.
        let holder = format!(
            "{:016x}:{}",
            self.instance,
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let redis_key = format!("{}{key}", self.prefix);
        let mut invocation = self.take.key(&redis_key);
        invocation.arg(self.limit).arg(&holder).arg(self.expiry_ms);
        let reply: Vec<i64> = self.call(&invocation).await?;
        let [admitted, held, wait_ms] = reply[..] else {
            return Err(Error::BadReply(format!("{reply:?}")));
        };
        let held = u64::try_from(held).unwrap_or(0);
        if admitted != 1 {
            let wait = Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0));
            return Ok(Err(Decision::Denied {
                retry_after: wait,
                reset_after: wait,
            }));
        }
        Ok(Ok(RedisPermit {
            conn: self.conn.clone(),
            key: redis_key,
            holder,
            expiry_ms: self.expiry_ms,
            renew: self.renew.clone(),
            remaining: self.limit.saturating_sub(held),
            released: false,
        }))
    }

    /// Permits out for `key` now (expired holders dropped first).
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn in_flight(&self, key: &str) -> Result<u64, Error> {
        let redis_key = format!("{}{key}", self.prefix);
        let invocation = self.count.key(&redis_key);
        self.call(&invocation).await
    }
}

/// One permit of a [`RedisInFlight`]: released by [`release`](Self::release), or on drop (a
/// spawned `ZREM`), or at its expiry.
#[must_use = "dropping a permit releases it"]
pub struct RedisPermit {
    conn: ConnectionManager,
    key: String,
    holder: String,
    expiry_ms: u64,
    renew: redis::Script,
    remaining: u64,
    released: bool,
}

impl fmt::Debug for RedisPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisPermit")
            .field("key", &self.key)
            .field("holder", &self.holder)
            .finish_non_exhaustive()
    }
}

impl RedisPermit {
    /// The holder id (unique per permit).
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Permits the key had left after this one was taken.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Gives the permit back now: whether it was still held (false: it had expired).
    ///
    /// # Errors
    /// [`Error::Redis`]: the permit then comes back at its expiry.
    pub async fn release(mut self) -> Result<bool, Error> {
        self.released = true;
        let mut conn = self.conn.clone();
        let removed: i64 = redis::cmd("ZREM")
            .arg(&self.key)
            .arg(&self.holder)
            .query_async(&mut conn)
            .await?;
        Ok(removed == 1)
    }

    /// Pushes the expiry to one `expiry` from now (for a request that runs longer): whether it was
    /// still held.
    ///
    /// # Errors
    /// [`Error::Redis`].
    pub async fn renew(&mut self) -> Result<bool, Error> {
        let mut conn = self.conn.clone();
        let renewed: i64 = self
            .renew
            .key(&self.key)
            .arg(&self.holder)
            .arg(self.expiry_ms)
            .invoke_async(&mut conn)
            .await?;
        Ok(renewed == 1)
    }
}

impl Drop for RedisPermit {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // Outside a runtime nothing can be sent: the permit comes back at its expiry.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (mut conn, key, holder) = (
                self.conn.clone(),
                std::mem::take(&mut self.key),
                std::mem::take(&mut self.holder),
            );
            runtime.spawn(async move {
                let removed: Result<i64, redis::RedisError> = redis::cmd("ZREM")
                    .arg(key)
                    .arg(holder)
                    .query_async(&mut conn)
                    .await;
                // A failed release is bounded by the expiry (module docs).
                drop(removed);
            });
        }
    }
}
