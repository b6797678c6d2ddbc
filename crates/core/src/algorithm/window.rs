//! What the two window algorithms share: a quota read as `limit` per window of `period`.

use strength_reduce::StrengthReducedU64;

use crate::clock::Nanos;
use crate::quota::{Quota, QuotaError};

/// A quota validated for a window algorithm whose state counts up to `max_count`.
#[derive(Clone, Debug)]
pub(crate) struct WindowQuota {
    pub quota: Quota,
    /// The window length in nanoseconds (at least 1).
    pub window: Nanos,
    pub limit: u64,
    /// Division by the window as a multiply and shift: every decision splits `now` into window index
    /// and offset, and a hardware 64-bit divide would dominate the decision.
    per_window: StrengthReducedU64,
}

impl PartialEq for WindowQuota {
    fn eq(&self, other: &Self) -> bool {
        self.quota == other.quota
    }
}

impl Eq for WindowQuota {}

impl WindowQuota {
    /// # Errors
    /// [`QuotaError::LimitTooLarge`] when the limit exceeds `max_count`.
    pub fn new(quota: Quota, max_count: u64) -> Result<Self, QuotaError> {
        if quota.limit() > max_count {
            return Err(QuotaError::LimitTooLarge { max: max_count });
        }
        let window = quota.period_nanos();
        Ok(WindowQuota {
            quota,
            window,
            limit: quota.limit(),
            // `window >= 1`: a zero period is rejected when the quota is built.
            per_window: StrengthReducedU64::new(window),
        })
    }

    /// `(now / window, now % window)`: the window `now` falls in and how far into it.
    #[inline]
    pub fn split(&self, now: Nanos) -> (u64, Nanos) {
        StrengthReducedU64::div_rem(now, self.per_window)
    }

    /// `⌈x / window⌉`.
    #[inline]
    pub fn div_ceil(&self, x: u64) -> u64 {
        let (quotient, remainder) = StrengthReducedU64::div_rem(x, self.per_window);
        quotient + u64::from(remainder != 0)
    }
}
