//! Counts of the calls that the fault policy answered, by cause.

use std::sync::atomic::{AtomicU64, Ordering};

use tollgate_core::{CheckError, Decision};

use crate::config::FaultPolicy;
use crate::error::Error;

/// How many `check` calls a limiter answered by its [`FaultPolicy`], and how many `refund` calls a
/// fault lost (their units stay spent), by cause (totals since it was built, shared by its clones).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Redis unreachable, slow or failing ([`Error::is_outage`]), found by trying it.
    pub outages: u64,
    /// Answered during an outage without trying Redis: the circuit breaker was open
    /// ([`Error::CircuitOpen`]).
    pub circuit_open: u64,
    /// Stored state the script refused ([`Error::CorruptState`]).
    pub corrupt: u64,
    /// Configuration errors ([`Error::WrongType`]: a key of another type under this prefix;
    /// [`Error::DuplicateKey`]).
    pub config: u64,
}

/// The live counters behind [`FaultCounts`].
#[derive(Debug, Default)]
pub(crate) struct Faults {
    outages: AtomicU64,
    circuit_open: AtomicU64,
    corrupt: AtomicU64,
    config: AtomicU64,
}

impl Faults {
    pub(crate) fn snapshot(&self) -> FaultCounts {
        // Relaxed: independent statistics; nothing is published through them.
        FaultCounts {
            outages: self.outages.load(Ordering::Relaxed),
            circuit_open: self.circuit_open.load(Ordering::Relaxed),
            corrupt: self.corrupt.load(Ordering::Relaxed),
            config: self.config.load(Ordering::Relaxed),
        }
    }

    /// `result` with every error but a bad cost answered by `policy`, and counted.
    pub(crate) fn apply(
        &self,
        policy: FaultPolicy,
        result: Result<Decision, Error>,
    ) -> Result<Decision, CheckError> {
        match result {
            Ok(decision) => Ok(decision),
            Err(Error::Cost(e)) => Err(e),
            Err(e) => {
                self.count(&e);
                Ok(policy.decision())
            }
        }
    }

    /// Counts backend fault `e` by its cause (a bad cost is not a fault and is not counted).
    pub(crate) fn count(&self, e: &Error) {
        let counter = match e {
            Error::Cost(_) => return,
            Error::CircuitOpen => &self.circuit_open,
            Error::CorruptState { .. } => &self.corrupt,
            Error::WrongType { .. } | Error::DuplicateKey { .. } | Error::NoCharge => &self.config,
            _ => &self.outages,
        };
        // Relaxed: a statistic (see `snapshot`).
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
