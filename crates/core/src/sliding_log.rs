//! Sliding-window log: the exact algorithm, keeping one timestamp per admitted unit.

use std::fmt;

use crate::clock::{Clock, MonotonicClock, Nanos};
use crate::decision::{CheckError, Decision};
use crate::limiter::Limiter;
use crate::quota::{Quota, QuotaError};
use crate::sync::{Mutex, lock};

/// The largest limit a [`SlidingLog`] accepts: 2^24 timestamps, 128 MiB.
pub const SLIDING_LOG_MAX_LIMIT: u64 = 1 << 24;

/// Exact sliding window: at most `quota.limit()` units in *every* trailing window of `quota.period()`.
///
/// Keeps the timestamps of the last `limit` admitted units in a ring buffer allocated once, at
/// construction: memory is `8 × limit` bytes per limiter, and a check costs `O(log limit)` plus
/// `O(cost)` to record. A unit admitted at `t` counts while `now < t + period`.
///
/// Uses a mutex rather than a lock-free form: an admission must test one old timestamp and append
/// `cost` new ones as one step, which no single-word compare-and-swap expresses, and a lock-free ring
/// would still serialise every admission on its tail. Uncontended, the standard mutex is one atomic
/// exchange to lock and one to unlock, with no allocation and no syscall; the critical section is a
/// binary search and a few stores. Fails closed: errors admit and record nothing.
///
/// A clock gone backwards records admissions at the newest timestamp already held, so entries never
/// leave the window early.
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::{Limiter, ManualClock, Quota, SlidingLog};
/// let clock = ManualClock::new();
/// let log = SlidingLog::with_clock(Quota::per_minute(100)?, clock.clone())?;
/// clock.set(59_000_000_000); // 00:59
/// assert!(log.check_n(100)?.is_allowed());
/// clock.set(60_000_000_000); // 01:00: unlike a fixed window, nothing more until 01:59
/// let denied = log.check();
/// assert_eq!(denied.retry_after(), Some(Duration::from_secs(59)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SlidingLog<C = MonotonicClock> {
    quota: Quota,
    window: Nanos,
    limit: u64,
    log: Mutex<Ring>,
    clock: C,
}

/// Whether a unit admitted at `t` still counts at `now`: while `now < t + window`, and forever when
/// `t + window` lies past the end of the clock's range.
fn counts_at(t: Nanos, window: Nanos, now: Nanos) -> bool {
    t.checked_add(window).is_none_or(|expiry| expiry > now)
}

/// Time from `now` until a unit admitted at `t` stops counting; `Decision::NEVER`'s nanoseconds when
/// that lies past the end of the clock's range. `t + window > now` (it still counts).
fn until_expiry(t: Nanos, window: Nanos, now: Nanos) -> Nanos {
    t.checked_add(window)
        .map_or(Nanos::MAX, |expiry| expiry - now)
}

/// A fixed-capacity ring of timestamps, oldest first, never decreasing.
struct Ring {
    stamps: Box<[Nanos]>,
    /// Index of the oldest entry.
    head: usize,
    len: usize,
}

impl Ring {
    fn with_capacity(capacity: usize) -> Self {
        Ring {
            stamps: vec![0; capacity].into_boxed_slice(),
            head: 0,
            len: 0,
        }
    }

    /// The `i`-th oldest entry (`i < len`).
    fn get(&self, i: usize) -> Nanos {
        self.stamps[(self.head + i) % self.stamps.len()]
    }

    fn newest(&self) -> Option<Nanos> {
        self.len.checked_sub(1).map(|i| self.get(i))
    }

    /// How many entries are still inside the window ending at `now`: those with `t + window > now`.
    fn live(&self, now: Nanos, window: Nanos) -> usize {
        let (mut lo, mut hi) = (0, self.len);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if counts_at(self.get(mid), window, now) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        self.len - lo
    }

    /// Appends `count` copies of `t`, dropping the oldest entries beyond capacity.
    fn push(&mut self, t: Nanos, count: usize) {
        let capacity = self.stamps.len();
        for _ in 0..count {
            let tail = (self.head + self.len) % capacity;
            self.stamps[tail] = t;
            if self.len == capacity {
                self.head = (self.head + 1) % capacity;
            } else {
                self.len += 1;
            }
        }
    }
}

impl SlidingLog<MonotonicClock> {
    /// A fresh log on the default monotonic clock.
    ///
    /// # Errors
    /// [`QuotaError::LimitTooLarge`] above [`SLIDING_LOG_MAX_LIMIT`].
    pub fn new(quota: Quota) -> Result<Self, QuotaError> {
        Self::with_clock(quota, MonotonicClock::new())
    }
}

impl<C: Clock> SlidingLog<C> {
    /// A fresh log reading `clock`.
    ///
    /// # Errors
    /// [`QuotaError::LimitTooLarge`] above [`SLIDING_LOG_MAX_LIMIT`].
    pub fn with_clock(quota: Quota, clock: C) -> Result<Self, QuotaError> {
        let limit = quota.limit();
        if limit > SLIDING_LOG_MAX_LIMIT {
            return Err(QuotaError::LimitTooLarge {
                max: SLIDING_LOG_MAX_LIMIT,
            });
        }
        Ok(SlidingLog {
            quota,
            window: quota.period_nanos(),
            limit,
            // `limit <= 2^24` fits in usize on every supported target.
            log: Mutex::new(Ring::with_capacity(limit as usize)),
            clock,
        })
    }

    /// Bytes of timestamp storage this limiter holds.
    pub fn memory_bytes(&self) -> usize {
        self.limit as usize * std::mem::size_of::<Nanos>()
    }

    fn decide(&self, now: Nanos, cost: u64, record: bool) -> Result<Decision, CheckError> {
        if cost > self.limit {
            return Err(CheckError::CostExceedsCapacity {
                cost,
                capacity: self.limit,
            });
        }
        // Both at most `limit <= 2^24`.
        let (limit, cost) = (self.limit as usize, cost as usize);
        let mut ring = lock(&self.log);
        if ring.len + cost > limit {
            // Admitting needs the oldest `len + cost − limit` entries gone; the last of those:
            let last_to_go = ring.get(ring.len + cost - limit - 1);
            if counts_at(last_to_go, self.window, now) {
                let reset = ring
                    .newest()
                    .map_or(0, |t| until_expiry(t, self.window, now));
                return Ok(Decision::denied(
                    until_expiry(last_to_go, self.window, now),
                    reset,
                ));
            }
        }
        let live = ring.live(now, self.window);
        let stamp = ring.newest().map_or(now, |newest| newest.max(now));
        if record && cost > 0 {
            ring.push(stamp, cost);
        }
        let reset = if live + cost == 0 {
            0
        } else {
            until_expiry(stamp, self.window, now)
        };
        Ok(Decision::allowed((limit - live - cost) as u64, reset))
    }
}

impl<C: Clock> Limiter for SlidingLog<C> {
    #[inline]
    fn now(&self) -> Nanos {
        self.clock.now()
    }

    fn quota(&self) -> &Quota {
        &self.quota
    }

    fn check_at(&self, now: Nanos, cost: u64) -> Result<Decision, CheckError> {
        self.decide(now, cost, true)
    }

    fn peek_at(&self, now: Nanos, cost: u64) -> Result<Decision, CheckError> {
        self.decide(now, cost, false)
    }
}

impl<C> fmt::Debug for SlidingLog<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlidingLog")
            .field("quota", &self.quota)
            .finish_non_exhaustive()
    }
}
