//! What the two window algorithms share: a quota read as `limit` per window of `period`.

use crate::clock::Nanos;
use crate::quota::{Quota, QuotaError};

/// A quota validated for a window algorithm whose state counts up to `max_count`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WindowQuota {
    pub quota: Quota,
    /// The window length in nanoseconds (at least 1).
    pub window: Nanos,
    pub limit: u64,
}

impl WindowQuota {
    /// # Errors
    /// [`QuotaError::LimitTooLarge`] when the limit exceeds `max_count`.
    pub fn new(quota: Quota, max_count: u64) -> Result<Self, QuotaError> {
        if quota.limit() > max_count {
            return Err(QuotaError::LimitTooLarge { max: max_count });
        }
        Ok(WindowQuota {
            quota,
            window: quota.period_nanos(),
            limit: quota.limit(),
        })
    }
}
