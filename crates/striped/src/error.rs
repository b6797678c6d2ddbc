//! [`StripedError`]: why a striped limiter could not be built.

use std::fmt;

use tollgate_core::QuotaError;

use crate::config::MAX_STRIPES;

/// Why a [`StripedLimiter`](crate::StripedLimiter) could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StripedError {
    /// The quota cannot be represented by GCRA.
    Quota(QuotaError),
    /// Zero stripes, or more than [`MAX_STRIPES`].
    Stripes(usize),
    /// A lease size of zero units.
    ZeroLease,
}

impl fmt::Display for StripedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StripedError::Quota(error) => write!(f, "invalid quota: {error}"),
            StripedError::Stripes(n) => {
                write!(f, "{n} stripes: a striped limiter needs 1 to {MAX_STRIPES}")
            }
            StripedError::ZeroLease => f.write_str("a lease must hold at least one unit"),
        }
    }
}

impl std::error::Error for StripedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StripedError::Quota(error) => Some(error),
            _ => None,
        }
    }
}

impl From<QuotaError> for StripedError {
    fn from(error: QuotaError) -> Self {
        StripedError::Quota(error)
    }
}
