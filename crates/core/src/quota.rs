//! How much, per how long: the one validated description of a limit that every algorithm reads.

use std::fmt;
use std::time::Duration;

use crate::clock::{Nanos, duration_to_nanos};

/// A rate limit: `limit` units per `period`, with a `burst` capacity.
///
/// Validated once, at construction; afterwards no algorithm built from it can overflow or divide by
/// zero. How each algorithm reads it:
///
/// | algorithm | uses |
/// |---|---|
/// | [`Gcra`](crate::Gcra), [`LeakyBucket`](crate::LeakyBucket), [`Shaper`](crate::Shaper) | rate `limit / period` (one unit every [`emission_interval`](Quota::emission_interval)) and capacity `burst` |
/// | [`FixedWindow`](crate::FixedWindow), [`SlidingWindow`](crate::SlidingWindow), [`SlidingLog`](crate::SlidingLog) | `limit` per window of length `period`; `burst` is not used |
///
/// `burst` defaults to `limit`, so "100 per second" means: a full bucket of 100, refilling one unit every
/// 10 ms.
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::{Quota, QuotaError};
///
/// let q = Quota::per_second(100)?.with_burst(20)?;
/// assert_eq!(q.limit(), 100);
/// assert_eq!(q.burst(), 20);
/// assert_eq!(q.emission_interval(), Duration::from_millis(10));
///
/// assert_eq!(Quota::per_minute(0), Err(QuotaError::ZeroLimit));
/// assert_eq!(Quota::per(Duration::ZERO, 5), Err(QuotaError::ZeroPeriod));
/// # Ok::<(), QuotaError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u64,
    period: Nanos,
    burst: u64,
    /// `ceil(period / limit)`: rounded up so the bucket algorithms never refill faster than the quota.
    emission_interval: Nanos,
}

impl Quota {
    /// `limit` units per `period`, burst `limit`.
    ///
    /// # Errors
    /// [`QuotaError::ZeroLimit`], [`QuotaError::ZeroPeriod`], [`QuotaError::PeriodTooLong`] (over
    /// 584 years), or [`QuotaError::RateTooHigh`] when one unit would take less than 1 ns.
    pub fn per(period: Duration, limit: u64) -> Result<Quota, QuotaError> {
        if limit == 0 {
            return Err(QuotaError::ZeroLimit);
        }
        if period.is_zero() {
            return Err(QuotaError::ZeroPeriod);
        }
        let period = duration_to_nanos(period).ok_or(QuotaError::PeriodTooLong)?;
        if limit > period {
            return Err(QuotaError::RateTooHigh);
        }
        Ok(Quota {
            limit,
            period,
            burst: limit,
            emission_interval: period.div_ceil(limit),
        })
    }

    /// `limit` units per second.
    ///
    /// # Errors
    /// As [`Quota::per`].
    pub fn per_second(limit: u64) -> Result<Quota, QuotaError> {
        Self::per(Duration::from_secs(1), limit)
    }

    /// `limit` units per minute.
    ///
    /// # Errors
    /// As [`Quota::per`].
    pub fn per_minute(limit: u64) -> Result<Quota, QuotaError> {
        Self::per(Duration::from_secs(60), limit)
    }

    /// `limit` units per hour.
    ///
    /// # Errors
    /// As [`Quota::per`].
    pub fn per_hour(limit: u64) -> Result<Quota, QuotaError> {
        Self::per(Duration::from_secs(3600), limit)
    }

    /// The same rate with a different burst capacity (the bucket algorithms' depth).
    ///
    /// # Errors
    /// [`QuotaError::ZeroBurst`], or [`QuotaError::BurstTooLarge`] when `burst` units of time
    /// (`burst × emission interval`) overflow 584 years.
    pub fn with_burst(self, burst: u64) -> Result<Quota, QuotaError> {
        if burst == 0 {
            return Err(QuotaError::ZeroBurst);
        }
        if burst.checked_mul(self.emission_interval).is_none() {
            return Err(QuotaError::BurstTooLarge);
        }
        Ok(Quota { burst, ..self })
    }

    /// Units admitted per period.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The period (window length for the window algorithms).
    pub fn period(&self) -> Duration {
        Duration::from_nanos(self.period)
    }

    /// The period in nanoseconds.
    pub fn period_nanos(&self) -> Nanos {
        self.period
    }

    /// Burst capacity of the bucket algorithms.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Time to replenish one unit, `period / limit` rounded up to a whole nanosecond.
    pub fn emission_interval(&self) -> Duration {
        Duration::from_nanos(self.emission_interval)
    }

    /// [`Quota::emission_interval`] in nanoseconds (at least 1).
    pub fn emission_interval_nanos(&self) -> Nanos {
        self.emission_interval
    }

    /// `burst × emission interval`: how far ahead of `now` a bucket's state may run (GCRA's tolerance
    /// plus one interval). Cannot overflow: checked at construction.
    pub fn burst_nanos(&self) -> Nanos {
        self.burst * self.emission_interval
    }
}

/// Why a [`Quota`] (or an algorithm built from one) was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuotaError {
    /// A limit of zero admits nothing; deny outright instead of building a limiter.
    ZeroLimit,
    /// A period of zero is not a rate.
    ZeroPeriod,
    /// A burst of zero admits nothing.
    ZeroBurst,
    /// The period does not fit in 584 years of nanoseconds.
    PeriodTooLong,
    /// More than one unit per nanosecond: the emission interval would round to zero.
    RateTooHigh,
    /// `burst × emission interval` overflows 584 years of nanoseconds.
    BurstTooLarge,
    /// The algorithm's state cannot count this high; `max` is the largest limit it accepts for this
    /// period (see the algorithm's docs for why).
    LimitTooLarge {
        /// The largest limit the algorithm accepts for this quota's period.
        max: u64,
    },
    /// A duration argument (other than the period) is zero or does not fit in 584 years of nanoseconds.
    InvalidDuration,
}

impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuotaError::ZeroLimit => f.write_str("quota limit must be at least 1"),
            QuotaError::ZeroPeriod => f.write_str("quota period must be longer than zero"),
            QuotaError::ZeroBurst => f.write_str("quota burst must be at least 1"),
            QuotaError::PeriodTooLong => f.write_str("quota period must fit in 2^64 nanoseconds"),
            QuotaError::RateTooHigh => {
                f.write_str("quota rate exceeds one unit per nanosecond (limit > period in ns)")
            }
            QuotaError::BurstTooLarge => {
                f.write_str("quota burst times emission interval overflows 2^64 nanoseconds")
            }
            QuotaError::LimitTooLarge { max } => {
                write!(
                    f,
                    "quota limit too large for this algorithm and period (max {max})"
                )
            }
            QuotaError::InvalidDuration => {
                f.write_str("duration must be non-zero and fit in 2^64 nanoseconds")
            }
        }
    }
}

impl std::error::Error for QuotaError {}
