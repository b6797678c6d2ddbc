//! Tollgate's algorithms on a shared Redis: the same transitions as `tollgate-core`, as atomic Lua
//! scripts, so that many instances of a service enforce one quota.
//!
//! * [`RedisLimiter`]: one script call per decision, generic over the algorithm: any core algorithm
//!   with a [`RedisEncoding`] ([`Gcra`](tollgate_core::Gcra) by default,
//!   [`LeakyBucket`](tollgate_core::LeakyBucket), [`FixedWindow`](tollgate_core::FixedWindow),
//!   [`SlidingWindow`](tollgate_core::SlidingWindow)); cost `n`, peek and refund.
//! * [`RedisBatch`]: several keys, each with its own algorithm and quota ([`BatchLimit`]), decided
//!   as one request in one atomic script call: every key checked first, every admission written
//!   only if every enforcing key admits (shadow keys report, never deny). One `FCALL` per
//!   request (of a function library loaded once per server; one `EVALSHA` on Redis before 7 or
//!   where functions are refused), whatever the number of keys; all keys on one node (one hash
//!   slot on a cluster).
//!   Optionally durable ([`Durability`]): an admission is answered once replicas confirm it
//!   (`WAIT`), or as [`Error::NotReplicated`].
//! * [`LeasedLimiter`]: each instance leases up to `k` units of a shared GCRA bucket per call and
//!   admits locally; bounded error (see its docs), ≥ 100× fewer round-trips.
//! * [`connect_with`]: AUTH (a password or an ACL user, [`Secret`]s that never print) and TLS
//!   (`rediss://`, a CA file, a client certificate; feature `tls`, rustls).
//! * [`RedisConfig`]: key prefix, per-call timeout, [`FaultPolicy`] (fail open or closed),
//!   [`TimeSource`] (server `TIME` by default, or the client's clock).
//!
//! # Same transitions as the core
//! [`RedisEncoding`] ties a core algorithm to its script: the script restates the algorithm's
//! `decide` over the key's stored value, its parameters come from the algorithm's own validated
//! ones, and the trait encodes and decodes the state word as that value. The integration tests seed
//! core states into Redis and compare decision, stored state and TTL with the core's `decide`, on
//! random traces over random quotas.
//!
//! What a µs clock forces: Redis's `TIME` (and [`TimeSource::System`], and the `_at` methods) give
//! whole microseconds since the Unix epoch, and Lua numbers are doubles (exact integers below
//! 2^53). Within that:
//! * **GCRA and the leaky bucket are exact for any quota** whose depth stays below 2^51 units of
//!   `gcd(interval, 1 µs)` (26 days at worst, 71 years for whole-µs intervals): the key holds the
//!   core's TAT in ns and the script computes in that unit, so an interval such as 3/s
//!   (333 333 334 ns) needs no rounding. Deeper buckets with an interval that is not whole µs run
//!   with the interval rounded up to whole µs (rate lower by < 1 µs per interval).
//! * **The windows** compute in µs: a period that is not whole µs is rounded up to the next µs
//!   (never looser; periods of whole seconds, minutes, ... are unchanged). The sliding window's
//!   `retry_after` is then the core's rounded up to whole µs (the first instant a µs clock can see).
//!
//! Replies are four integers (`allowed`, `remaining`, `retry_after`, `reset_after`; `-1` = never)
//! in the script's unit, converted to the core's [`Decision`](tollgate_core::Decision). (A batch,
//! [`RedisBatch`], replies two for a GCRA key, `allowed` and an admission's `reset_after` or a
//! denial's `retry_after`, from which the client derives the other two with the quota and the cost
//! it sent: each integer Redis writes costs it a `sprintf`.)
//! [`RedisLimiter::algorithm`] is the algorithm the script follows (its quota is the requested one
//! unless rounded as above).
//!
//! # Refunds
//! [`RedisLimiter::try_refund`] (and [`try_refund_at`](RedisLimiter::try_refund_at),
//! [`refund`](RedisLimiter::refund)) gives back units a check admitted, for a request decided
//! against several limits when one of them denied: one atomic script per algorithm, restating the
//! core's [`Algorithm::refund`](tollgate_core::Algorithm::refund) over the stored value, checked
//! against it on random check/refund traces. GCRA and the leaky bucket move the TAT back by `cost`
//! intervals, never below now; the fixed window takes `cost` off the count of the same window
//! (nothing once it has rolled); the sliding window off the count the admission added to (the
//! current one, or the previous one when the refund is at the admission's own time and a later
//! admission has moved the state on); all saturating, a state left fresh deleted, the TTL following
//! the state. A refund of 0 costs no round trip. **A refund that cannot be made (an outage, an open
//! breaker, corrupt state) leaves the units spent** whatever the fault policy: stricter, never
//! looser; `refund` counts it in `faults()`. [`LeasedLimiter::refund`] gives units back to this
//! instance's live lease for the key, locally, and nothing once that lease has expired (see its
//! bound).
//!
//! # Charges and settlements
//! [`RedisLimiter::try_charge`] (and [`try_charge_at`](RedisLimiter::try_charge_at),
//! [`charge`](RedisLimiter::charge)) counts units without a decision, for a request that cost more
//! than it reserved: one atomic script per algorithm restating the core's
//! [`Algorithm::charge`](tollgate_core::Algorithm::charge), checked against it on random states
//! (debts and states of another quota included) and costs. GCRA and the leaky bucket move the TAT
//! `cost` intervals past `max(TAT, now)`, past the depth if need be (debt); the windows count into
//! now's window beyond the limit. Where the core's state would leave the scripts' exact integers the
//! script stops at its largest state (a TAT 2^52 units ahead, a count of `max_count`), which still
//! denies all the core's state denies. [`RedisBatch::try_check_timed`] tells when a batch decided,
//! and [`RedisBatch::try_settle`] brings a reserved request's keys to its actual cost in one script
//! call: each key given units back ([`SettleOp::GiveBack`]: a bucket at most the part of its
//! reservation still ahead of now, a window in the window it counted the units in) or charged
//! ([`SettleOp::Charge`]).
//!
//! # Keys, TTLs and Redis Cluster
//! The Redis key is `prefix + key` (see [`RedisConfig::with_prefix`]). Every script but
//! [`RedisBatch`]'s reads and writes exactly that one key, so it runs unchanged on Redis Cluster; a
//! batch's keys must share one slot there (Redis refuses a script across slots with `CROSSSLOT`):
//! put the shared part in a hash tag, e.g. `"{tenant42}:login"` and `"{tenant42}:api"`, or let
//! [`RedisBatch::with_slot_groups`] split a request into one script per slot group with
//! compensating refunds (the bound is on [`RedisBatch`]); [`slot`] computes a key's slot. Each write sets the key's TTL
//! (rounded up to whole ms) to when its state becomes indistinguishable from a fresh one: GCRA at its
//! TAT, fixed window at the window's end, sliding window at the end of the window after the current
//! one (after a refund, of the window whose count is the last non-zero one). Peeks never write, and
//! denials write nothing but a carry-over (below); a refund that leaves the state fresh deletes the
//! key. Give each algorithm its own prefix: a key written by one algorithm is, for another, a
//! configuration error ([`Error::WrongType`], a string where a hash is stored or the reverse) or
//! corrupt state ([`Error::CorruptState`], a hash with other fields).
//!
//! **A quota changed under the same key carries the state over as-is.** Each write stores the quota
//! it was written under with the state (a quota tag). A script under another quota (the same
//! algorithm with other parameters: a reloaded limit, an override) converts such a state at its
//! first call as the core's [`Algorithm::carry_over`](tollgate_core::Algorithm::carry_over) does:
//! the key keeps `min(what it could take under the old quota at that instant, the new capacity)`,
//! so a key that just spent its burst gets nothing back whichever way the quota changed. The
//! converted state is stored even by a denial. See [`RedisEncoding`].
//!
//! Upgrading from a version that stored GCRA TATs in µs: those values read as long past (a full
//! bucket) once, then are rewritten in ns.
//!
//! # Faults
//! Each call runs under [`RedisConfig::with_timeout`]; timeouts and Redis errors become the typed
//! [`Error`], which the `check` methods answer by the [`FaultPolicy`] (fail open or fail closed) and
//! the `try_` methods return. Nothing panics. The scripts validate what they read: a value they
//! cannot have written (not an integer in plain digits, out of range, a foreign hash, a TAT beyond
//! any write's reach) is [`Error::CorruptState`], answered by the policy too, never decided on and
//! never overwritten; a key of another Redis type is [`Error::WrongType`], a configuration error.
//! `faults()` on each limiter counts the policy's answers by cause (outage, corrupt state,
//! configuration) so the last two show apart from an outage.
//!
//! **Outages do not slow the hot path**: each limiter has a circuit breaker in front of its
//! connection ([`BreakerConfig`], on by default: open after 3 consecutive outage failures, probe
//! every 100 ms). While it is open, `check` answers by the fault policy at once (measured p99 3 µs
//! with `redis-server` killed, against 16 ms per call without the breaker), without touching the
//! network: **fail open admits everything, fail closed denies everything** until one caller's probe
//! (one per interval) succeeds and closes it. The lease mode keeps spending live leases locally.
//! State changes and time spent open are in `breaker()` ([`BreakerStats`]), `faults().circuit_open`
//! and the `metrics` facade (`tollgate_redis_breaker_transitions_total{prefix,to}`,
//! `tollgate_redis_breaker_open{prefix}` gauge: how many breakers under that prefix are open, 0 or
//! 1 for one limiter and its clones; `tollgate_redis_breaker_open_seconds{prefix}`
//! histogram per open period, `tollgate_redis_breaker_rejected_total{prefix}`).
//!
//! [`connect`] builds a redis-rs `ConnectionManager`, which
//! reconnects after the server comes back; scripts are sent by SHA and reloaded on `NOSCRIPT`, so a
//! restarted server needs nothing from you.

mod auth;
mod batch;
mod breaker;
mod coalesce;
mod config;
mod connection;
mod durable;
mod encoding;
mod error;
mod faults;
mod function;
mod inflight;
mod lease;
mod limiter;
mod params;
mod scripts;
mod settle;
mod slot;
mod split;

use std::time::Duration;

pub use auth::{ConnectOptions, Secret, TlsFiles, connect_with};
pub use batch::{BatchEncoding, BatchKey, BatchLimit, RedisBatch, admitted};
pub use breaker::{BreakerConfig, BreakerState, BreakerStats};
pub use config::{FaultPolicy, RedisConfig, TimeSource};
pub use connection::{Connection, LazyCluster};
pub use durable::Durability;
pub use encoding::{KeyType, RedisEncoding};
pub use error::Error;
pub use faults::FaultCounts;
pub use inflight::{RedisInFlight, RedisPermit};
pub use lease::{LeaseConfig, LeaseStats, LeasedLimiter};
pub use limiter::RedisLimiter;
pub use params::ScriptParams;
pub use redis::aio::ConnectionManager;
pub use redis::cluster_async::ClusterConnection;
pub use settle::{SettleKey, SettleOp};
pub use slot::{SLOTS, slot};

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

/// A connection to the Redis Cluster that `urls` (some of its nodes, e.g.
/// `["redis://10.0.0.1:6379/"]`) belong to, with connection and response timeouts from `config`.
///
/// redis-rs's cluster connection routes each script by its one key's slot, follows `MOVED` and `ASK`
/// redirects at once (a slot being migrated needs nothing from you), reloads scripts on every master
/// on `NOSCRIPT`, and rediscovers the topology after a failover. Retries of a failing node wait
/// 10–200 ms (redis-rs's default is at least 1.28 s), always within the per-call timeout, after
/// which the fault policy answers.
///
/// # Errors
/// [`Error::Redis`] for malformed URLs or when no node can be reached to read the slot map.
pub async fn connect_cluster<I, T>(
    urls: I,
    config: &RedisConfig,
) -> Result<ClusterConnection, Error>
where
    I: IntoIterator<Item = T>,
    T: redis::IntoConnectionInfo,
{
    Ok(cluster_client(urls, config)?.get_async_connection().await?)
}

/// [`connect_cluster`] without waiting: the connection (and the slot map) is made by the first
/// command, and tried again by the next while no node answers (each such command fails, so the
/// fault policy answers it), as [`connect`] does for one node.
///
/// # Errors
/// [`Error::Redis`] for malformed URLs.
pub fn connect_cluster_lazy<I, T>(urls: I, config: &RedisConfig) -> Result<Connection, Error>
where
    I: IntoIterator<Item = T>,
    T: redis::IntoConnectionInfo,
{
    Ok(Connection::Cluster(connection::LazyCluster::new(
        cluster_client(urls, config)?,
    )))
}

fn cluster_client<I, T>(
    urls: I,
    config: &RedisConfig,
) -> Result<redis::cluster::ClusterClient, Error>
where
    I: IntoIterator<Item = T>,
    T: redis::IntoConnectionInfo,
{
    Ok(redis::cluster::ClusterClientBuilder::new(urls)
        .connection_timeout(config.timeout())
        .response_timeout(config.timeout())
        .min_retry_wait(10)
        .max_retry_wait(200)
        .build()?)
}
