//! [`StripedConfig`]: how a [`StripedLimiter`] is laid out (its stripes and their [`LeaseSize`]).
//!
//! [`StripedLimiter`]: crate::StripedLimiter

/// The most stripes a limiter may have.
pub const MAX_STRIPES: usize = 1 << 12;

/// How big each stripe's lease is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseSize {
    /// Starts at 1 unit; doubles while the stripe replaces its lease within 20 µs of taking it (used
    /// up, or expired before the next request), halves when an older lease expires with none of its
    /// units used; never above `max` (nor the caps described on [`StripedConfig`]).
    Adaptive {
        /// The largest lease, in units.
        max: u64,
    },
    /// Always this many units (capped as described on [`StripedConfig`]).
    Fixed(u64),
}

/// How a [`StripedLimiter`] is laid out. `Default`: one stripe per available core (rounded up to a
/// power of two) and an adaptive lease of at most `burst / (4 × stripes)` units, at most 65 536.
///
/// Every lease size is also capped by `burst / stripes` (so all leases together never hold more than
/// one burst) and by [`LeaseWord::UNITS_MASK`].
///
/// [`StripedLimiter`]: crate::StripedLimiter
/// [`LeaseWord::UNITS_MASK`]: crate::LeaseWord::UNITS_MASK
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct StripedConfig {
    /// Number of stripes (rounded up to a power of two); `None`: `available_parallelism`.
    pub stripes: Option<usize>,
    /// Lease size; `None`: adaptive, capped at `burst / (4 × stripes)` and 65 536.
    pub lease: Option<LeaseSize>,
    /// Never take the alone path (see the [crate docs](crate), "One thread alone"): every
    /// decision goes through the calling thread's stripe. `false` (the default): a thread that finds
    /// the limiter uncontended decides on the shared word directly, as plain GCRA.
    pub always_lease: bool,
}

impl StripedConfig {
    /// This configuration with `stripes` stripes (rounded up to a power of two).
    pub fn stripes(mut self, stripes: usize) -> Self {
        self.stripes = Some(stripes);
        self
    }

    /// This configuration with lease size `lease`.
    pub fn lease(mut self, lease: LeaseSize) -> Self {
        self.lease = Some(lease);
        self
    }

    /// This configuration with the alone path off (`true`) or on (`false`, the default).
    pub fn always_lease(mut self, always: bool) -> Self {
        self.always_lease = always;
        self
    }
}
