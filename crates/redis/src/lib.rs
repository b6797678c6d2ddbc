//! Tollgate's algorithms on a shared Redis: the same transitions as `tollgate-core`, as atomic Lua
//! scripts, so that many instances of a service enforce one quota.
//!
//! * [`RedisLimiter`]: one script call per decision, for [`RedisAlgorithm::Gcra`],
//!   [`RedisAlgorithm::FixedWindow`] and [`RedisAlgorithm::SlidingWindow`]; cost `n` and peek.
//! * [`LeasedLimiter`]: each instance leases up to `k` units of a shared GCRA bucket per call and
//!   admits locally; bounded error (see its docs), ≥ 100× fewer round-trips.
//! * [`RedisConfig`]: key prefix, per-call timeout, [`FaultPolicy`] (fail open or closed),
//!   [`TimeSource`] (server `TIME` by default, or the client's clock).
//!
//! # Same transitions as the core, in microseconds
//! Each script is the core algorithm's `decide` restated over the script's own state (GCRA: the
//! TAT; the windows: a hash of window index and counts). Lua numbers are doubles, so the scripts
//! keep every value an integer below 2^53 by working in **microseconds**: times are µs since the
//! Unix epoch (the server's `TIME`), the emission interval and the window are the quota's rounded
//! *up* to whole µs (never looser: a GCRA interval of `T` µs plus a fraction enforces a rate lower
//! by less than `1 / T`, e.g. < 0.1 % at 1 000/s; GCRA above 1 000 000/s per key is refused), and
//! replies are four integers (`allowed`, `remaining`, `retry_after_us`, `reset_after_us`; `-1` =
//! never), converted to the core's [`Decision`](tollgate_core::Decision). For a quota whose
//! interval (GCRA) or window is a whole number of µs and for µs-aligned times, decisions equal the
//! core's exactly, except that the sliding window's `retry_after` is the core's rounded up to the
//! next µs (the first µs-aligned instant that fits). The integration tests check this on random
//! traces.
//!
//! # Keys, TTLs and Redis Cluster
//! The Redis key is `prefix + key` (see [`RedisConfig::with_prefix`]). Every script reads and writes
//! exactly that one key, so it runs unchanged on Redis Cluster; to keep several of your keys on one
//! slot, put the shared part in a hash tag, e.g. `"{tenant42}:login"`. Each write sets the key's TTL
//! (rounded up to whole ms) to when its state becomes indistinguishable from a fresh one: GCRA at its
//! TAT, fixed window at the window's end, sliding window at the end of the window after the current
//! one. Denials and peeks never write. Give each limiter (algorithm and quota) its own prefix: a key
//! written by one algorithm is a Redis `WRONGTYPE` error ([`Error::Redis`]) or a misread for another.
//!
//! # Faults
//! Each call runs under [`RedisConfig::with_timeout`]; timeouts and Redis errors become the typed
//! [`Error`], which the `check` methods answer by the [`FaultPolicy`] (fail open or fail closed) and
//! the `try_` methods return. Nothing panics. [`connect`] builds a redis-rs `ConnectionManager`, which
//! reconnects after the server comes back; scripts are sent by SHA and reloaded on `NOSCRIPT`, so a
//! restarted server needs nothing from you.

mod config;
mod error;
mod lease;
mod limiter;
mod scripts;

use std::time::Duration;

pub use config::{FaultPolicy, RedisConfig, TimeSource};
pub use error::Error;
pub use lease::{LeaseConfig, LeaseStats, LeasedLimiter};
pub use limiter::{RedisAlgorithm, RedisLimiter};
pub use redis::aio::ConnectionManager;

/// A lazily connecting, self-reconnecting connection to the Redis at `url` (e.g.
/// `redis://127.0.0.1:6379/`), with connection and response timeouts from `config`.
///
/// Never waits and never fails because the server is down: the first command connects, and a
/// dropped connection is re-established in the background.
///
/// # Errors
/// [`Error::Redis`] for a malformed URL.
pub fn connect(url: &str, config: &RedisConfig) -> Result<ConnectionManager, Error> {
    let client = redis::Client::open(url)?;
    let manager = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.timeout()))
        .set_response_timeout(Some(config.timeout()))
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(200));
    Ok(ConnectionManager::new_lazy_with_config(client, manager)?)
}
