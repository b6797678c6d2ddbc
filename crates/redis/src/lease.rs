//! Local leases of a shared GCRA bucket: most decisions never leave the process.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use foldhash::quality::RandomState;
use redis::aio::{ConnectionLike, ConnectionManager};
use tokio::sync::Notify;
use tollgate_core::{CheckError, Clock, Decision, MonotonicClock, Nanos, Quota, QuotaError};

use crate::breaker::{Breaker, BreakerStats};
use crate::config::RedisConfig;
use crate::encoding::{TatUnits, gcra_quota};
use crate::error::Error;
use crate::faults::{FaultCounts, Faults};
use crate::function::{BATCH_LIBRARY, LibraryCall};
use crate::params::ScriptParams;
use crate::scripts::{self, LEASE, Lua};

/// Lease sizing: how many units one Redis call may take, and how long they may be spent locally.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Units asked for per lease (`k`); the script grants fewer when the bucket holds fewer.
    pub size: u64,
    /// How long leased units may be spent; units unspent by then are dropped (stranded).
    pub ttl: Duration,
    /// Fewest units worth a round trip: when the bucket holds fewer than
    /// `max(cost, min_grant)`, the instance is told how long until it will, and denies locally until
    /// then. `1` (the default) denies exactly as the bucket would; a larger value (up to `size`) cuts
    /// Redis calls under contention to about one per `min_grant` admitted units, at the price of
    /// answering a nearly empty bucket up to `min_grant` emission intervals late. It never changes
    /// how much is admitted over time: units not yet granted stay in the bucket.
    pub min_grant: u64,
    /// Most keys tracked locally (a hard bound, split across the key table's 16 shards). When a
    /// key's shard is full of live leases, that key is decided by one exact Redis call per request
    /// (a lease of exactly its cost) until room frees up.
    pub max_keys: usize,
    /// Units left in a live lease below which the admission that leaves fewer takes the key's next
    /// lease ahead of need (one call at a time per key, as any lease call), so that the requests
    /// after it go on spending the live lease instead of waiting on a lease call when it runs out:
    /// a key whose requests spend fewer than `renew_below` units in one round trip to Redis does
    /// not wait for its lease running out (a lease that expires before it is spent below the mark
    /// is still renewed by the request that finds it expired). The next lease's units are spent once
    /// the live one's are too few or expired, and live one lifetime from their grant, as any
    /// lease's (see [`LeasedLimiter`]'s error bound). The admission that takes it answers when the
    /// call ends (its answer already decided; a failed call only leaves no next lease). `0` (the
    /// default) takes a lease only when a request needs one; at most `size`.
    pub renew_below: u64,
}

impl Default for LeaseConfig {
    /// 100 units per lease, spendable for 100 ms, minimum grant 1, 10 000 keys.
    fn default() -> Self {
        LeaseConfig {
            size: 100,
            ttl: Duration::from_millis(100),
            min_grant: 1,
            max_keys: 10_000,
            renew_below: 0,
        }
    }
}

/// Totals over every key this instance tracks (units).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseStats {
    /// Units granted by the shared bucket.
    pub leased: u64,
    /// Units admitted to callers, net of refunds (see [`LeasedLimiter::refund`]).
    pub admitted: u64,
    /// Units given back to a live lease by refunds (already taken off `admitted`).
    pub refunded: u64,
    /// Units whose lease expired unspent: taken from the bucket, never admitted.
    pub stranded: u64,
    /// Units held in live leases right now.
    pub held: u64,
    /// Lease script calls made (successful or not).
    pub redis_calls: u64,
    /// Decisions answered from the local "denied until" cache.
    pub cached_denials: u64,
    /// Decisions made by a direct Redis call because the key's table shard was full of live keys
    /// (also counted in `redis_calls`; admitted units in `leased` and `admitted`).
    pub untracked: u64,
}

/// One key's local state.
#[derive(Debug, Default)]
struct Local {
    tokens: u64,
    lease_until: Nanos,
    denied_until: Nanos,
    reset_at: Nanos,
    /// Units the shared bucket held after this instance's last lease call, and when that was: with
    /// the live lease and the refill since, the estimate of the shared quota an answer reports.
    shared: u64,
    shared_at: Nanos,
    /// Units the current lease has admitted and not had back: what a refund may return to it, so
    /// that `tokens + returnable` never exceeds what the lease was granted (with its carried units).
    returnable: u64,
    /// A task is calling the lease script for this key (see [`Refill`]); the others wait for it.
    refilling: bool,
    /// The next lease, taken ahead of need (`LeaseConfig::renew_below`): its units and their
    /// expiry, spent once the live lease cannot serve a request.
    next: u64,
    next_until: Nanos,
    /// The live lease's call ahead was made (one per lease, whatever its outcome: a refused or
    /// failed one is not repeated until a new lease is live).
    ahead_taken: bool,
    stats: LeaseStats,
}

impl Local {
    /// An admission's answer: the shared quota's estimate ([`Bucket::estimate`]).
    fn allowed(&self, now: Nanos, bucket: Bucket) -> Decision {
        let live = self.live(now);
        let (remaining, reset) = bucket.estimate(self.shared, self.shared_at, live, now);
        Decision::allowed(remaining, reset)
    }

    /// Answers from the lease or the denial cache, if either can.
    fn try_local(&mut self, now: Nanos, cost: u64, bucket: Bucket) -> Option<Decision> {
        if cost == 0 {
            // Asking for nothing always passes (as in GCRA), answered locally.
            return Some(self.allowed(now, bucket));
        }
        if now < self.denied_until {
            self.stats.cached_denials += 1;
            return Some(Decision::denied(
                self.denied_until - now,
                self.reset_at.saturating_sub(now),
            ));
        }
        if !self.covers(now, cost) && now < self.next_until {
            self.promote(now);
        }
        if self.covers(now, cost) {
            self.tokens -= cost;
            self.returnable += cost;
            self.stats.admitted += cost;
            return Some(self.allowed(now, bucket));
        }
        None
    }

    /// Whether the live lease can admit `cost` units at `now`.
    fn covers(&self, now: Nanos, cost: u64) -> bool {
        now < self.lease_until && self.tokens >= cost
    }

    /// Units held in live leases at `now` (the live one's and the next one's).
    fn live(&self, now: Nanos) -> u64 {
        let mut live = 0;
        if now < self.lease_until {
            live += self.tokens;
        }
        if now < self.next_until {
            live += self.next;
        }
        live
    }

    /// The next lease becomes the live one. The live one's units, too few for the request (or
    /// expired, then stranded), travel into it as a lease call's leftover does.
    fn promote(&mut self, now: Nanos) {
        self.expire(now);
        self.tokens += std::mem::take(&mut self.next);
        self.lease_until = std::mem::take(&mut self.next_until);
        self.ahead_taken = false;
        // A new lease: refunds of what earlier leases admitted no longer come back (see `refund`).
        self.returnable = 0;
    }

    /// Whether the admission just made should take the next lease ahead: the live lease holds
    /// fewer than `below` units, no next lease is held, no call is in flight and none was made
    /// ahead for this lease.
    fn renews(&self, now: Nanos, below: u64) -> bool {
        self.tokens < below
            && now < self.lease_until
            && now >= self.next_until
            && !self.refilling
            && !self.ahead_taken
    }

    /// Drops expired leases' tokens, counting them as stranded.
    fn expire(&mut self, now: Nanos) {
        if now >= self.lease_until && self.tokens > 0 {
            self.stats.stranded += self.tokens;
            self.tokens = 0;
        }
        if now >= self.next_until && self.next > 0 {
            self.stats.stranded += self.next;
            self.next = 0;
        }
    }
}

/// The shared bucket's shape, for the estimate an admission reports.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    burst: u64,
    interval: Nanos,
}

impl Bucket {
    /// The shared quota's remaining units and reset an admission reports: what the bucket held
    /// after this instance's last lease call (`shared`, at `shared_at`), plus the units this
    /// instance's live lease still holds (`live`), plus what the rate has added since, at most the
    /// burst; the reset is when that estimate would be a full bucket again
    /// (`(burst − remaining) × interval`). Admissions other instances made since the last call are
    /// not seen (the estimate can be high by what they took); it is never 0 while this instance's
    /// lease holds units or the bucket had room at the last call, so it never tells a client to
    /// stop while the quota has room that this instance could know of.
    fn estimate(self, shared: u64, shared_at: Nanos, live: u64, now: Nanos) -> (u64, Nanos) {
        let refill = now.saturating_sub(shared_at) / self.interval.max(1);
        let remaining = shared
            .saturating_add(live)
            .saturating_add(refill)
            .min(self.burst);
        let reset = (self.burst - remaining).saturating_mul(self.interval);
        (remaining, reset)
    }
}

#[derive(Debug, Default)]
struct Slot {
    local: Mutex<Local>,
    /// Wakes every task waiting on the key's lease call when it ends (`Local::refilling`).
    refilled: Notify,
}

impl Slot {
    fn local(&self) -> MutexGuard<'_, Local> {
        // A panic elsewhere cannot leave `Local` half-updated in a way that over-admits; keep going.
        self.local.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The key's lease call in flight, held by the task making it. When it ends (answered, failed or
/// cancelled) the units that task took out of the pool and did not spend go back, the key is free
/// for the next call, and every waiting task wakes at once. (Waiters woken one by one, a mutex
/// handed down its queue, each finished in a scheduler turn of their own, and tollgate-server
/// then wrote each answer on its own: about 0.3 `writev` per call in `results/fleet`'s lease row,
/// against 0.08 now.)
struct Refill<'a> {
    slot: &'a Slot,
    /// Units of the old lease travelling with the request into the next one (0 once spent).
    leftover: u64,
}

impl Drop for Refill<'_> {
    fn drop(&mut self) {
        let mut local = self.slot.local();
        local.tokens += self.leftover;
        local.refilling = false;
        drop(local);
        self.slot.refilled.notify_waiters();
    }
}

/// A GCRA limiter shared through Redis whose instances take *leases*: one script call grants up to
/// `k` units from the shared bucket, which this instance then admits locally, without a round-trip,
/// until they run out or the lease expires. A key the bucket refused is denied locally until the
/// `retry_after` Redis reported ("denied until" cache).
///
/// # Error bound
/// * **Never over-admits against the global quota, cumulatively**: every admitted unit was first
///   granted by the shared GCRA, and a grant of `g` units is exactly a GCRA admission of cost `g`. So
///   from any start, admitted ≤ granted ≤ `burst + rate × elapsed`.
/// * Over a window of length `d` admissions stay within `burst + rate × (d + ttl)`: a unit may be spent
///   up to one lease lifetime after it was granted (units of a lease too few for a request of cost
///   > 1 are carried into the next lease, so for costs above 1 add at most `cost − 1` units).
/// * **Under-admission (stranded capacity)**: units whose lease expires unspent are lost, at most `k`
///   per instance per lease lifetime (each instance holds at most one lease per key; with
///   [`LeaseConfig::renew_below`] `r`, at most `k + r`: the next lease, and what the live one held
///   when the next was taken), plus the
///   denial cache may deny for up to one `retry_after` that another instance's future grants cannot
///   shorten (grants only ever push the bucket's TAT later, so this never denies what the bucket would
///   admit, up to clock-rate differences).
/// * **Fleet bound, both ways** (checked by `tests/fleet.rs`): `n` instances sharing a key from a
///   full bucket over `[0, T]` admit at most `burst + rate × T` (as one per-request limiter), and at
///   least the per-request count minus `n × k × (⌈T / ttl⌉ + 1)` (`n × (k + r) × …` with
///   `renew_below` `r`): every granted unit is admitted,
///   stranded or still held, and each instance strands or holds at most `k` units per lease it
///   takes (at most one per lifetime while demand lasts, plus the one live at `T`). Measured with 4
///   instances, `k` = 10, ttl 6 s, 500/min burst 50 over 2 min (simulated): admissions equal the
///   per-request GCRA's at 0.5×, 1× and 4× demand (500, 1000, 1049); 204 units stranded at 0.5×
///   cost nothing because demand was below the rate; with `renew_below` = 5 (`k + r` in the bound)
///   500, 1000, 1048, with 320 stranded at 0.5×. With 4 separate processes in real time (1000/s
///   burst 100, `k` = 20, ttl 100 ms, 5 s; `results/redis-fleet`) saturated admissions equalled the
///   per-request GCRA's too (5097 against an allowance of 5099).
///
/// * **Refunds** ([`refund`](Self::refund)) give units back to this instance's live lease for the
///   key, at most what that lease has admitted, without a round trip: the bounds above hold with
///   admissions counted net of refunds (a refund that reaches a newer lease than the one that
///   admitted its request lets those units be spent up to one lease lifetime later, see `refund`).
///   With no live lease nothing comes back: the units stay spent (stricter).
///
/// # What an answer reports
/// An admission reports the **shared** quota, as an estimate (never this instance's lease alone,
/// which would tell a client to stop while the quota has room): `remaining` is what the shared
/// bucket held after this instance's last lease call, plus what its live lease still holds, plus
/// what the rate has added since, at most the burst; `reset_after` is when that estimate would be a
/// full bucket again, `(burst − remaining) × interval`. So the first admission on a fresh key
/// answers as a per-request limiter does (10/s: `remaining` 9, `reset_after` 100 ms). What other
/// instances took since this one's last call is not seen: the estimate can be high by that much,
/// and is exact with one instance. A denial reports the shared bucket's answer (its `retry_after`
/// and how far its TAT runs ahead).
///
/// Local state lives under one short mutex per key, found in a key table of 16 mutex-guarded shards
/// (a local decision takes two uncontended locks and no reference count); the refill is
/// single-flight per key per instance, and the tasks that wait for it wake together when it ends.
/// `LeaseConfig::max_keys` is split across the shards (their capacities sum to it exactly), so the
/// table never holds more keys.
pub struct LeasedLimiter<C = ConnectionManager, K = MonotonicClock> {
    conn: C,
    config: RedisConfig,
    lease: LeaseConfig,
    clock: K,
    quota: Quota,
    /// The lease script's GCRA parameters (as [`Gcra`](tollgate_core::Gcra)'s encoding).
    params: ScriptParams,
    lease_ttl: Nanos,
    /// The key table, split in [`SHARDS`] locks chosen by the key's hash, each on its own cache line,
    /// so tasks on different keys rarely contend.
    shards: Box<[CachePadded<Mutex<Table>>]>,
    hasher: RandomState,
    faults: Faults,
    breaker: Breaker,
    /// Whether lease calls go by the function library's `FCALL` or, where the server refuses
    /// functions, by the script's `EVALSHA`.
    via: LibraryCall,
    /// Totals of the decisions made without a slot (see [`LeaseStats::untracked`]).
    untracked: Mutex<LeaseStats>,
}

/// How a request is served: from local state, through its key's slot, or without one.
enum Route {
    Local(Decision),
    /// Answered locally; the caller takes the key's next lease ahead of need (see
    /// [`LeaseConfig::renew_below`]) before it answers.
    Ahead(Decision, Arc<Slot>),
    Slot(Arc<Slot>),
    /// The key's shard is full of live keys.
    Untracked,
}

type Table = HashMap<Box<str>, Arc<Slot>, RandomState>;

/// Key-table shards (a power of two).
const SHARDS: usize = 16;

impl<C, K> std::fmt::Debug for LeasedLimiter<C, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeasedLimiter")
            .field("config", &self.config)
            .field("lease", &self.lease)
            .field("quota", &self.quota)
            .finish_non_exhaustive()
    }
}

impl<C: ConnectionLike + Clone + Send + Sync> LeasedLimiter<C, MonotonicClock> {
    /// A leased GCRA limiter on the default monotonic clock (which times lease expiry and the denial
    /// cache; the shared bucket is timed as `config` says).
    ///
    /// The shared bucket runs the GCRA quota [`RedisLimiter::gcra`](crate::RedisLimiter::gcra) would
    /// (the same key format and the same exactness: see [`quota`](Self::quota)).
    ///
    /// # Errors
    /// As [`RedisLimiter::new`](crate::RedisLimiter::new), or [`QuotaError::InvalidDuration`] for a
    /// zero lease size or lifetime.
    pub fn new(
        conn: C,
        quota: Quota,
        config: RedisConfig,
        lease: LeaseConfig,
    ) -> Result<Self, QuotaError> {
        Self::with_clock(conn, quota, config, lease, MonotonicClock::new())
    }
}

impl<C: ConnectionLike + Clone + Send + Sync, K: Clock> LeasedLimiter<C, K> {
    /// A leased GCRA limiter whose local expiry is timed by `clock`.
    ///
    /// # Errors
    /// As [`new`](LeasedLimiter::new).
    pub fn with_clock(
        conn: C,
        quota: Quota,
        config: RedisConfig,
        lease: LeaseConfig,
        clock: K,
    ) -> Result<Self, QuotaError> {
        let quota = gcra_quota(quota)?;
        let params = TatUnits::for_quota(&quota)?.params();
        let lease_ttl = u64::try_from(lease.ttl.as_nanos()).unwrap_or(u64::MAX);
        if lease.size == 0 || lease_ttl == 0 {
            return Err(QuotaError::InvalidDuration);
        }
        Ok(LeasedLimiter {
            breaker: Breaker::new(config.breaker(), config.prefix()),
            conn,
            config,
            lease: LeaseConfig {
                size: lease.size.min(quota.burst()),
                min_grant: lease.min_grant.clamp(1, lease.size.min(quota.burst())),
                renew_below: lease.renew_below.min(lease.size.min(quota.burst())),
                ..lease
            },
            clock,
            quota,
            params,
            lease_ttl,
            shards: (0..SHARDS).map(|_| CachePadded::default()).collect(),
            hasher: RandomState::default(),
            faults: Faults::default(),
            via: LibraryCall::default(),
            untracked: Mutex::default(),
        })
    }

    fn bucket(&self) -> Bucket {
        Bucket {
            burst: self.quota.burst(),
            interval: self.quota.emission_interval_nanos(),
        }
    }

    /// The quota enforced across all instances: the one given, or for a GCRA depth the script cannot
    /// follow exactly, its interval rounded up to whole µs (see
    /// [`RedisEncoding for Gcra`](crate::RedisEncoding#impl-RedisEncoding-for-Gcra)).
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The lease sizing in effect (`size` clamped to the burst, `min_grant` to `1..=size`,
    /// `renew_below` to `size`).
    pub fn lease_config(&self) -> LeaseConfig {
        self.lease
    }

    /// Decides `cost` units for `key`, locally when a live lease covers it; a Redis fault is answered
    /// by the [`FaultPolicy`](crate::FaultPolicy).
    ///
    /// # Errors
    /// Only [`CheckError::CostExceedsCapacity`].
    pub async fn check(&self, key: &str, cost: u64) -> Result<Decision, CheckError> {
        self.faults
            .apply(self.config.policy(), self.run(key, None, cost).await)
    }

    /// [`check`](Self::check) without the fault policy.
    ///
    /// # Errors
    /// [`Error::Cost`], or a backend fault when a lease was needed and Redis failed.
    pub async fn try_check(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.run(key, None, cost).await
    }

    /// [`try_check`](Self::try_check) at a caller-supplied time, used both for the local lease expiry
    /// and (as client time, in µs) for the shared bucket; for tests and simulations.
    ///
    /// # Errors
    /// As [`try_check`](Self::try_check).
    pub async fn try_check_at(&self, key: &str, now: Nanos, cost: u64) -> Result<Decision, Error> {
        self.run(key, Some(now), cost).await
    }

    /// Gives back `cost` units that [`check`](Self::check) admitted for `key`, locally: they return
    /// to this instance's live lease for the key, without a round trip, so the next requests spend
    /// them again. Returns how many units came back.
    ///
    /// At most what the live lease has admitted and not had back is returned, so a lease never holds
    /// more than it was granted and units still go only to requests within one lease lifetime of
    /// their grant. Nothing comes back (the units stay spent, which is stricter, never looser) when
    /// the key has no live lease here: it expired, the key was decided without local state (its
    /// table shard was full), or it was never leased. The shared bucket is never written back: the
    /// units stay granted to this instance. The bounds in the type's docs hold with admissions
    /// counted net of refunds, with one addition: a refund that comes after the lease that admitted
    /// its request was replaced (by a refill for a larger cost, or once it expired) returns the
    /// units to the new lease, out of what that one has admitted, so they can be spent up to one
    /// more lease lifetime after their grant; refunds right after the check, as a multi-limit
    /// decision makes them, reach the lease that admitted them.
    pub fn refund(&self, key: &str, cost: u64) -> u64 {
        let now = self.clock.now();
        self.refund_at(key, now, cost)
    }

    /// [`refund`](Self::refund) at a caller-supplied time (the lease is live when `now` is before its
    /// expiry), as [`try_check_at`](Self::try_check_at).
    pub fn refund_at(&self, key: &str, now: Nanos, cost: u64) -> u64 {
        if cost == 0 {
            return 0;
        }
        let shard = (self.hasher.hash_one(key) as usize) & (SHARDS - 1);
        let Some(slot) = self.table(shard).get(key).map(Arc::clone) else {
            return 0;
        };
        let mut local = slot.local();
        if now >= local.lease_until {
            return 0;
        }
        let back = cost.min(local.returnable);
        local.returnable -= back;
        local.tokens += back;
        local.stats.admitted = local.stats.admitted.saturating_sub(back);
        local.stats.refunded += back;
        back
    }

    /// How many `check` calls the fault policy answered, by cause (see
    /// [`RedisLimiter::faults`](crate::RedisLimiter::faults)).
    pub fn faults(&self) -> FaultCounts {
        self.faults.snapshot()
    }

    /// The circuit breaker's state and counters (see [`BreakerConfig`](crate::BreakerConfig)); live
    /// leases keep being spent locally while it is open.
    pub fn breaker(&self) -> BreakerStats {
        self.breaker.stats()
    }

    /// Totals over all keys tracked now (`held` counts live leases at the limiter's clock).
    pub fn stats(&self) -> LeaseStats {
        let now = self.clock.now();
        self.stats_at(now)
    }

    /// [`stats`](Self::stats) with `held` judged at `now`.
    pub fn stats_at(&self, now: Nanos) -> LeaseStats {
        let slots: Vec<Arc<Slot>> = (0..SHARDS)
            .flat_map(|i| self.table(i).values().cloned().collect::<Vec<_>>())
            .collect();
        let mut total = LeaseStats::default();
        for slot in slots {
            let local = slot.local();
            let s = local.stats;
            let live = local.live(now);
            total.leased += s.leased;
            total.admitted += s.admitted;
            total.refunded += s.refunded;
            total.stranded += s.stranded + (local.tokens + local.next - live);
            total.held += live;
            total.redis_calls += s.redis_calls;
            total.cached_denials += s.cached_denials;
        }
        let u = *self.untracked.lock().unwrap_or_else(|e| e.into_inner());
        total.leased += u.leased;
        total.admitted += u.admitted;
        total.redis_calls += u.redis_calls;
        total.untracked += u.untracked;
        total
    }

    /// How many keys this instance tracks now (at most `LeaseConfig::max_keys`: idle keys are
    /// pruned when a shard fills).
    pub fn tracked_keys(&self) -> usize {
        (0..SHARDS).map(|i| self.table(i).len()).sum()
    }

    fn table(&self, shard: usize) -> MutexGuard<'_, Table> {
        // A table holds only `Arc`s: a panic while it was locked cannot have broken it.
        self.shards[shard].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most keys shard `shard` holds: `max_keys / SHARDS`, plus one for the first
    /// `max_keys % SHARDS` shards, so the capacities sum to `max_keys`.
    fn shard_capacity(&self, shard: usize) -> usize {
        let max = self.lease.max_keys;
        max / SHARDS + usize::from(shard < max % SHARDS)
    }

    /// Answers from the key's local state if it can (no reference count touched); otherwise hands
    /// back the key's slot for the slow path, or [`Route::Untracked`] when its shard is full.
    fn route(&self, key: &str, now: Nanos, cost: u64) -> Route {
        let shard = (self.hasher.hash_one(key) as usize) & (SHARDS - 1);
        let mut table = self.table(shard);
        if let Some(slot) = table.get(key) {
            let mut local = slot.local();
            return match local.try_local(now, cost, self.bucket()) {
                Some(decision)
                    if cost > 0
                        && decision.is_allowed()
                        && local.renews(now, self.lease.renew_below) =>
                {
                    local.refilling = true;
                    local.ahead_taken = true;
                    local.stats.redis_calls += 1;
                    drop(local);
                    Route::Ahead(decision, Arc::clone(slot))
                }
                Some(decision) => Route::Local(decision),
                None => Route::Slot(Arc::clone(slot)),
            };
        }
        let capacity = self.shard_capacity(shard);
        if table.len() >= capacity {
            // Drop keys nobody is using whose lease and denial have both lapsed. Their leftover
            // tokens are stranded either way; forgetting them admits nothing extra.
            table.retain(|_, slot| {
                if Arc::strong_count(slot) > 1 {
                    return true;
                }
                let local = slot.local();
                now < local.lease_until || now < local.next_until || now < local.denied_until
            });
            if table.len() >= capacity {
                // Every entry is live (or in use): keep the bound rather than evict a live lease.
                return Route::Untracked;
            }
        }
        Route::Slot(Arc::clone(table.entry(key.into()).or_default()))
    }

    /// The lease script on `key` with `head` (time, min, max) and the quota's parameters: by the
    /// library's function, or by the script where the server has no functions.
    async fn lease_script(&self, key: &str, head: [&str; 3]) -> Result<scripts::Reply, Error> {
        let lua = Lua::Function {
            via: &self.via,
            name: &BATCH_LIBRARY.lease,
            script: &LEASE,
        };
        scripts::invoke(
            &self.conn,
            &self.breaker,
            &self.config,
            lua,
            key,
            head,
            &self.params,
        )
        .await
    }

    /// A decision without local state: one lease of exactly `cost` units, which is exactly a GCRA
    /// decision of cost `cost` by the shared bucket. Nothing is cached.
    async fn run_untracked(
        &self,
        key: &str,
        at: Option<Nanos>,
        cost: u64,
    ) -> Result<Decision, Error> {
        if cost == 0 {
            return Ok(Decision::allowed(0, 0)); // asking for nothing always passes, as in GCRA
        }
        let time = scripts::time_arg(&self.config, at);
        let cost_arg = cost.to_string();
        let head = [&*time, &*cost_arg, &*cost_arg];
        let result = self.lease_script(key, head).await;
        let mut stats = self.untracked.lock().unwrap_or_else(|e| e.into_inner());
        stats.redis_calls += 1;
        stats.untracked += 1;
        let reply = result?;
        if reply.a == 0 {
            return Ok(Decision::denied(reply.retry, reply.reset));
        }
        stats.leased += reply.a;
        stats.admitted += cost;
        Ok(Decision::allowed(reply.b, reply.reset)) // what the shared bucket has left
    }

    /// `at`: a caller-supplied time for both the local state and the script; `None`: the limiter's
    /// clock locally and the configured time source in the script.
    async fn run(&self, key: &str, at: Option<Nanos>, cost: u64) -> Result<Decision, Error> {
        let now = at.unwrap_or_else(|| self.clock.now());
        let burst = self.quota.burst();
        if cost > burst {
            return Err(Error::Cost(CheckError::CostExceedsCapacity {
                cost,
                capacity: burst,
            }));
        }
        // The paths that may wait on Redis are boxed: their futures hold the script call's, about
        // a kilobyte, which every local decision's future would otherwise carry and move.
        match self.route(key, now, cost) {
            Route::Local(decision) => Ok(decision),
            Route::Ahead(decision, slot) => {
                Box::pin(self.lease_ahead(key, at, &slot)).await;
                Ok(decision)
            }
            Route::Slot(slot) => Box::pin(self.lease_call(key, at, cost, now, &slot)).await,
            Route::Untracked => Box::pin(self.run_untracked(key, at, cost)).await,
        }
    }

    /// The key's next lease, taken ahead of need by an admission that left the live one below
    /// [`LeaseConfig::renew_below`] (the caller has set `refilling`): up to `size` units, at
    /// least 1. A refusal or a failed call leaves no next lease (the requests that find the live
    /// one spent then make the call themselves).
    async fn lease_ahead(&self, key: &str, at: Option<Nanos>, slot: &Slot) {
        // Frees the key for the next call and wakes its waiters when this ends, however it ends.
        let _refill = Refill { slot, leftover: 0 };
        let time = scripts::time_arg(&self.config, at);
        let max = self.lease.size.to_string();
        let head = [&*time, "1", &*max];
        let result = self.lease_script(key, head).await;
        let now = at.unwrap_or_else(|| self.clock.now());
        let mut local = slot.local();
        if let Ok(reply) = result
            && reply.a > 0
        {
            // Units that expired meanwhile are counted stranded, never overwritten.
            local.expire(now);
            local.stats.leased += reply.a;
            local.next = reply.a;
            local.next_until = now.saturating_add(self.lease_ttl);
            local.shared = reply.b;
            local.shared_at = now;
        }
    }

    /// The slow path of [`run`](Self::run): one lease call per key at a time in this instance;
    /// the other tasks that need it wait for its end, then decide from what it brought.
    async fn lease_call(
        &self,
        key: &str,
        at: Option<Nanos>,
        cost: u64,
        mut now: Nanos,
        slot: &Slot,
    ) -> Result<Decision, Error> {
        let mut refill = loop {
            let refilled = slot.refilled.notified();
            let mut refilled = pin!(refilled);
            {
                let mut local = slot.local();
                if let Some(decision) = local.try_local(now, cost, self.bucket()) {
                    return Ok(decision); // another task refilled meanwhile
                }
                if !local.refilling {
                    local.refilling = true;
                    local.expire(now);
                    local.stats.redis_calls += 1;
                    // Units of a live lease too few for this request travel with it into the next
                    // lease; they leave the pool while the call is in flight so no other task can
                    // spend them twice.
                    let leftover = std::mem::take(&mut local.tokens);
                    break Refill { slot, leftover };
                }
                // Registered before the lock is released: the call's end cannot slip between.
                refilled.as_mut().enable();
            }
            refilled.await;
            now = at.unwrap_or_else(|| self.clock.now());
        };
        let leftover = refill.leftover;
        let need = cost - leftover; // leftover < cost here, so need >= 1
        let min = need.max(self.lease.min_grant);
        let time = scripts::time_arg(&self.config, at);
        let max = self.lease.size.max(min).to_string();
        let min = min.to_string();
        let head = [&*time, &*min, &*max];
        let result = self.lease_script(key, head).await;
        // Local expiries count from when the answer arrived, not from when we asked.
        let now = at.unwrap_or_else(|| self.clock.now());
        // The leftover goes back to the pool when `refill` drops (after `local`), unless spent.
        let mut local = slot.local();
        let reply = result?;
        local.reset_at = now.saturating_add(reply.reset);
        if reply.a == 0 {
            local.denied_until = now.saturating_add(reply.retry);
            return Ok(Decision::denied(reply.retry, reply.reset));
        }
        local.stats.leased += reply.a;
        local.stats.admitted += cost;
        // `reply.a >= need = cost - leftover`, so this does not underflow.
        local.tokens += leftover + reply.a - cost;
        refill.leftover = 0;
        // A new lease: refunds of what earlier leases admitted no longer come back (see `refund`).
        local.returnable = cost;
        local.lease_until = now.saturating_add(self.lease_ttl);
        local.ahead_taken = false;
        local.shared = reply.b;
        local.shared_at = now;
        Ok(local.allowed(now, self.bucket()))
    }
}
