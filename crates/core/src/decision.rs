//! The one answer every limiter gives.

use std::fmt;
use std::time::Duration;

use crate::clock::Nanos;

/// The outcome of a check: the same shape for every algorithm and every layer (keyed, Redis, HTTP).
///
/// Durations rather than instants, so layers can pass them straight through (an HTTP `Retry-After`,
/// a Redis reply).
///
/// * `remaining`: units that could still be admitted right now after this decision (for the window
///   algorithms: in the current window; for the bucket algorithms: tokens left in the bucket).
/// * `reset_after`: how long, with no further requests, until the limiter is back to its fresh, full
///   state (the IETF `RateLimit` header's `t` while allowed).
/// * `retry_after`: the exact earliest moment, from now, at which the same request (same cost) would
///   be allowed if nothing else happened in between.
///
/// The variant is a tag byte of its own (`repr(u8)`), not a niche in a `Duration`'s nanosecond
/// field as Rust would lay it out by default: there, `is_allowed()` compares that field, so a
/// denial had to work out `retry_after`'s sub-second part (a division) even for a caller that
/// asks only whether it was allowed. With the tag, such a caller's denial is plain GCRA's compare
/// and nothing more; the value is 8 bytes larger (40), which costs a caller that keeps the whole
/// decision a few stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Decision {
    /// The request was admitted (or, for a `peek`, would be).
    Allowed {
        /// Units still admissible now.
        remaining: u64,
        /// Time until the limiter is back to its fresh state.
        reset_after: Duration,
    },
    /// The request was refused; nothing was consumed.
    Denied {
        /// Time until the same request would be admitted.
        retry_after: Duration,
        /// Time until the limiter is back to its fresh state.
        reset_after: Duration,
    },
}

impl Decision {
    /// "Not within the clock's range": the `retry_after` of a request that no instant before the end
    /// of the clock's range (`u64::MAX` ns, 584 years after the limiter's epoch) can admit, and the
    /// `reset_after` of a state that stays counted past that end. One convention for every algorithm,
    /// the shaper and the keyed and Redis layers. It is a denial, not an error (the request itself is
    /// valid; only time has run out), so the end of the range fails closed.
    ///
    /// ```
    /// use tollgate_core::{Algorithm, Decision, Gcra, Quota};
    /// let gcra = Gcra::from_quota(Quota::per_second(10)?.with_burst(10)?)?;
    /// let t = gcra.decide(u64::MAX - 1, u64::MAX, 10)?;
    /// assert_eq!(t.decision.retry_after(), Some(Decision::NEVER));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const NEVER: Duration = Duration::from_nanos(Nanos::MAX);

    /// An admission, from nanosecond figures.
    #[inline]
    pub fn allowed(remaining: u64, reset_after: Nanos) -> Self {
        Decision::Allowed {
            remaining,
            reset_after: Duration::from_nanos(reset_after),
        }
    }

    /// A denial, from nanosecond figures.
    #[inline]
    pub fn denied(retry_after: Nanos, reset_after: Nanos) -> Self {
        Decision::Denied {
            retry_after: Duration::from_nanos(retry_after),
            reset_after: Duration::from_nanos(reset_after),
        }
    }

    /// Whether the request was admitted.
    #[inline]
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allowed { .. })
    }

    /// Units still admissible now (0 when denied).
    #[inline]
    pub fn remaining(&self) -> u64 {
        match *self {
            Decision::Allowed { remaining, .. } => remaining,
            Decision::Denied { .. } => 0,
        }
    }

    /// Time to wait before retrying (`None` when allowed).
    #[inline]
    pub fn retry_after(&self) -> Option<Duration> {
        match *self {
            Decision::Allowed { .. } => None,
            Decision::Denied { retry_after, .. } => Some(retry_after),
        }
    }

    /// Time until the limiter is back to its fresh state.
    #[inline]
    pub fn reset_after(&self) -> Duration {
        match *self {
            Decision::Allowed { reset_after, .. } | Decision::Denied { reset_after, .. } => {
                reset_after
            }
        }
    }
}

/// Why a check could not be decided at all (as opposed to being denied).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CheckError {
    /// The cost exceeds what the quota can ever grant at once (its burst, or its limit per window):
    /// retrying can never succeed, so this is an error rather than a [`Decision::Denied`].
    CostExceedsCapacity {
        /// The cost asked for.
        cost: u64,
        /// The most one request may cost under this quota.
        capacity: u64,
    },
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::CostExceedsCapacity { cost, capacity } => write!(
                f,
                "cost {cost} exceeds the most this quota can ever admit at once ({capacity})"
            ),
        }
    }
}

impl std::error::Error for CheckError {}
