//! Leaky bucket as a shaper (pacer): instead of refusing traffic above the rate, make each caller wait
//! for its slot so that output leaves at the quota's rate.

use std::fmt;
use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::algorithm::gcra::Timeline;
use crate::clock::{Clock, MonotonicClock, Nanos, duration_to_nanos};
use crate::decision::Decision;
use crate::quota::{Quota, QuotaError};
use crate::state::AtomicState;

/// A pacer: each [`reserve`](Shaper::reserve) books the caller's slot and returns how long to wait
/// for it, so admitted work leaves at `quota.limit()` per `quota.period()` after an initial burst of
/// `quota.burst()` (use a burst of 1 for strictly even spacing).
///
/// The queue is bounded by time: a reservation whose slot is more than `max_delay` away is rejected
/// with [`ShapeError::QueueFull`] and books nothing, so at most `burst + max_delay / T` units are ever
/// waiting. A booked slot cannot be given back: a caller that gives up after reserving wastes its slot.
///
/// State: one atomic word, the next free slot in [`Nanos`] (GCRA's TAT); booking is one
/// compare-and-swap, a rejection is one load. Fails closed: errors book nothing.
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::{ManualClock, Quota, Shaper};
/// // 10 per second, evenly spaced, at most half a second of queue.
/// let shaper = Shaper::with_clock(
///     Quota::per_second(10)?.with_burst(1)?,
///     Duration::from_millis(500),
///     ManualClock::new(),
/// )?;
/// assert_eq!(shaper.reserve(1)?, Duration::ZERO);
/// assert_eq!(shaper.reserve(1)?, Duration::from_millis(100));
/// assert_eq!(shaper.reserve(1)?, Duration::from_millis(200));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Shaper<C = MonotonicClock> {
    next_slot: CachePadded<AtomicState>,
    quota: Quota,
    params: Timeline,
    max_delay: Nanos,
    clock: C,
}

impl Shaper<MonotonicClock> {
    /// A shaper on the default monotonic clock.
    ///
    /// # Errors
    /// [`QuotaError::InvalidDuration`] if `max_delay` does not fit in 584 years of nanoseconds.
    pub fn new(quota: Quota, max_delay: Duration) -> Result<Self, QuotaError> {
        Self::with_clock(quota, max_delay, MonotonicClock::new())
    }
}

impl<C: Clock> Shaper<C> {
    /// A shaper reading `clock`. `max_delay` of zero makes it a pure meter (no waiting).
    ///
    /// # Errors
    /// [`QuotaError::InvalidDuration`] if `max_delay` does not fit in 584 years of nanoseconds.
    pub fn with_clock(quota: Quota, max_delay: Duration, clock: C) -> Result<Self, QuotaError> {
        let max_delay = duration_to_nanos(max_delay).ok_or(QuotaError::InvalidDuration)?;
        Ok(Shaper {
            next_slot: CachePadded::new(AtomicState::new(0)),
            quota,
            params: Timeline::new(&quota),
            max_delay,
            clock,
        })
    }

    /// The quota paced to.
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The longest wait a reservation may be given.
    pub fn max_delay(&self) -> Duration {
        Duration::from_nanos(self.max_delay)
    }

    /// Books a slot for `cost` units now; returns how long to wait before proceeding.
    ///
    /// # Errors
    /// [`ShapeError::CostExceedsCapacity`] when `cost > quota.burst()`, [`ShapeError::QueueFull`] when
    /// the slot would be more than `max_delay` away. Neither books anything.
    pub fn reserve(&self, cost: u64) -> Result<Duration, ShapeError> {
        self.reserve_at(self.clock.now(), cost)
    }

    /// [`reserve`](Self::reserve) at an explicit time, for simulation and tests.
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve).
    pub fn reserve_at(&self, now: Nanos, cost: u64) -> Result<Duration, ShapeError> {
        let capacity = self.quota.burst();
        if cost > capacity {
            return Err(ShapeError::CostExceedsCapacity { cost, capacity });
        }
        if cost == 0 {
            // Nothing to book, so nothing to wait for, however long the queue.
            return Ok(Duration::ZERO);
        }
        let (delay, _) = self.next_slot.update(self.next_slot.load(), |tat| {
            // Past the end of the clock's range: no slot can be booked.
            let step = self
                .params
                .step(tat, now, cost)
                .ok_or(ShapeError::QueueFull {
                    retry_after: Decision::NEVER,
                })?;
            let delay = step.allow_at.saturating_sub(now);
            if delay > self.max_delay {
                return Err(ShapeError::QueueFull {
                    retry_after: Duration::from_nanos(delay - self.max_delay),
                });
            }
            Ok((Duration::from_nanos(delay), Some(step.new_tat)))
        })?;
        Ok(delay)
    }

    /// Books a slot and blocks the thread until it comes (a real sleep: use
    /// [`reserve`](Self::reserve) to schedule without blocking).
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve); nothing is booked and the call returns at once.
    pub fn acquire(&self, cost: u64) -> Result<(), ShapeError> {
        let delay = self.reserve(cost)?;
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        Ok(())
    }

    /// Books a slot and waits for it on tokio's timer.
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve); nothing is booked and the call returns at once.
    #[cfg(feature = "tokio")]
    pub async fn acquire_async(&self, cost: u64) -> Result<(), ShapeError> {
        let delay = self.reserve(cost)?;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Ok(())
    }
}

impl<C> fmt::Debug for Shaper<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shaper")
            .field("quota", &self.quota)
            .field("max_delay", &self.max_delay)
            .finish_non_exhaustive()
    }
}

/// Why a [`Shaper`] booked no slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShapeError {
    /// More units than the burst capacity in one request: it can never be booked.
    CostExceedsCapacity {
        /// The cost asked for.
        cost: u64,
        /// The shaper's burst capacity.
        capacity: u64,
    },
    /// The slot would be further away than `max_delay`.
    QueueFull {
        /// How long until the same request would be given a slot within `max_delay`
        /// ([`Decision::NEVER`] when that lies past the end of the clock's range).
        retry_after: Duration,
    },
}

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShapeError::CostExceedsCapacity { cost, capacity } => {
                write!(
                    f,
                    "cost {cost} exceeds the shaper's burst capacity {capacity}"
                )
            }
            ShapeError::QueueFull { retry_after } => {
                write!(f, "shaper queue full; retry after {retry_after:?}")
            }
        }
    }
}

impl std::error::Error for ShapeError {}
