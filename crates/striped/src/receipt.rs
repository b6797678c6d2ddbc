//! [`LeaseReceipt`]: where an admission's units came from (a stripe's lease or the shared word),
//! so that a refund can give them back there.

use tollgate_core::Nanos;

/// Where an admission's units came from, so that
/// [`StripedLimiter::refund`](crate::StripedLimiter::refund) can give them back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LeaseReceipt {
    /// Nothing was taken (a denial, or a cost of 0).
    #[default]
    Nothing,
    /// From stripe `stripe`'s lease of generation `generation`.
    Lease {
        /// The stripe index.
        stripe: usize,
        /// The lease's generation (see [`LeaseWord`](crate::LeaseWord)).
        generation: u64,
    },
    /// From the shared state directly, as the segment ending at `end`.
    Shared {
        /// The end of the granted segment on the shared timeline.
        end: Nanos,
    },
}
