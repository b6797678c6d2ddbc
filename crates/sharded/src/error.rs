//! The keyed limiter's construction and configuration errors.

use std::fmt;

use tollgate_core::QuotaError;

/// Why a [`KeyedLimiter`](crate::KeyedLimiter) could not be built or reconfigured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyedError {
    /// The quota cannot be represented by the algorithm.
    Quota(QuotaError),
    /// A capacity of zero keys.
    ZeroCapacity,
    /// A capacity whose table does not fit in memory: its size overflows the address space, or the
    /// allocator could not provide it.
    CapacityTooLarge {
        /// The capacity asked for.
        capacity: usize,
    },
    /// A stripe count that is zero, not a power of two, or above [`MAX_STRIPES`](crate::MAX_STRIPES).
    InvalidStripes {
        /// The stripe count asked for.
        stripes: usize,
    },
    /// A probe window outside `MIN_WINDOW..=MAX_WINDOW` (see [`MIN_WINDOW`](crate::MIN_WINDOW)).
    InvalidWindow {
        /// The window asked for.
        window: usize,
    },
    /// [`set_override`](crate::KeyedLimiter::set_override) with a new quota when all
    /// [`MAX_OVERRIDE_QUOTAS`](crate::MAX_OVERRIDE_QUOTAS) distinct override quotas are in use.
    TooManyOverrideQuotas,
    /// [`set_override`](crate::KeyedLimiter::set_override) for a key that is not in the table, when the
    /// key's probe window holds only live or pinned keys (no room to pin it).
    WindowFull,
}

impl From<QuotaError> for KeyedError {
    fn from(error: QuotaError) -> Self {
        KeyedError::Quota(error)
    }
}

impl fmt::Display for KeyedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyedError::Quota(error) => write!(f, "invalid quota: {error}"),
            KeyedError::ZeroCapacity => {
                f.write_str("a keyed limiter needs a capacity of at least 1 key")
            }
            KeyedError::CapacityTooLarge { capacity } => {
                write!(f, "a capacity of {capacity} keys does not fit in memory")
            }
            KeyedError::InvalidStripes { stripes } => write!(
                f,
                "stripe count {stripes} must be a power of two between 1 and {}",
                crate::MAX_STRIPES
            ),
            KeyedError::InvalidWindow { window } => write!(
                f,
                "probe window {window} must be between {} and {}",
                crate::MIN_WINDOW,
                crate::MAX_WINDOW
            ),
            KeyedError::TooManyOverrideQuotas => write!(
                f,
                "at most {} distinct override quotas are supported",
                crate::MAX_OVERRIDE_QUOTAS
            ),
            KeyedError::WindowFull => {
                f.write_str("no room in the key's probe window to pin an override")
            }
        }
    }
}

impl std::error::Error for KeyedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            KeyedError::Quota(error) => Some(error),
            _ => None,
        }
    }
}
