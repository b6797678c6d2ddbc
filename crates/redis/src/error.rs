//! Why a Redis-backed decision could not be made.

use std::fmt;
use std::time::Duration;

use tollgate_core::CheckError;

/// A failed Redis-backed check. [`RedisLimiter::check`](crate::RedisLimiter::check) and
/// [`LeasedLimiter::check`](crate::LeasedLimiter::check) turn the backend variants into a decision by
/// the [`FaultPolicy`](crate::FaultPolicy); the `try_` methods return them as they are.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The cost can never be admitted under this quota (not a backend fault; never retried).
    Cost(CheckError),
    /// Redis did not answer within the configured per-call timeout.
    Timeout(Duration),
    /// The connection or the server failed (I/O, refused connection, script error, ...).
    Redis(redis::RedisError),
    /// The script answered something other than what it always returns (four integers per key,
    /// two for a GCRA key of a batch, and values in range).
    BadReply(String),
    /// The key holds a value this limiter's script cannot have written (not a number, out of
    /// range, foreign hash fields): no decision was made and nothing was written. Fix or delete
    /// the key; until then `check` answers by the fault policy.
    CorruptState {
        /// The Redis key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The circuit breaker is open after consecutive outage failures: the call was answered without
    /// touching the network (see [`BreakerConfig`](crate::BreakerConfig)). An outage.
    CircuitOpen,
    /// The key holds another Redis type than this limiter stores (`WRONGTYPE`): most likely two
    /// limiters (algorithms) share a key prefix. A configuration error, not an outage: give each
    /// limiter its own prefix.
    WrongType {
        /// The Redis key.
        key: String,
        /// Redis's message.
        detail: String,
    },
    /// The same key twice in one [`RedisBatch`](crate::RedisBatch) call (it would be decided twice
    /// on the same state): a configuration error, refused before any round trip.
    DuplicateKey {
        /// The Redis key.
        key: String,
    },
    /// The algorithm has no charge script
    /// ([`RedisEncoding::charge_script`](crate::RedisEncoding::charge_script)): units owed cannot
    /// be counted, so the call says so rather than dropping them. A configuration error (every algorithm of this crate has one).
    NoCharge,
    /// The admission was written on the primary, but fewer replicas than asked for confirmed it
    /// within the [`Durability`](crate::Durability) timeout (`WAIT`): a failover now could lose it.
    /// Neither an outage (the primary answered) nor a configuration error; the units stay spent.
    NotReplicated {
        /// How many replicas confirmed.
        confirmed: u64,
        /// How many were asked for.
        wanted: u32,
    },
}

impl Error {
    /// Whether no decision could be made because of the backend or the stored state (everything but
    /// [`Error::Cost`]): the errors to which the `check` methods apply the fault policy.
    pub fn is_backend(&self) -> bool {
        !matches!(self, Error::Cost(_))
    }

    /// Whether Redis could not be reached or answer in time ([`Error::Timeout`], [`Error::Redis`],
    /// [`Error::BadReply`], [`Error::CircuitOpen`]): an outage, as opposed to bad state or
    /// configuration.
    pub fn is_outage(&self) -> bool {
        matches!(
            self,
            Error::Timeout(_) | Error::Redis(_) | Error::BadReply(_) | Error::CircuitOpen
        )
    }

    /// Whether this is a configuration error ([`Error::WrongType`], [`Error::DuplicateKey`]).
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            Error::WrongType { .. } | Error::DuplicateKey { .. } | Error::NoCharge
        )
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Cost(e) => e.fmt(f),
            Error::Timeout(d) => write!(f, "redis did not answer within {d:?}"),
            Error::Redis(e) => write!(f, "redis error: {e}"),
            Error::BadReply(what) => write!(f, "unexpected reply from the limiter script: {what}"),
            Error::CircuitOpen => write!(
                f,
                "redis circuit breaker open after consecutive failures (not tried)"
            ),
            Error::CorruptState { key, reason } => {
                write!(f, "corrupt limiter state under redis key {key:?}: {reason}")
            }
            Error::WrongType { key, detail } => write!(
                f,
                "redis key {key:?} holds another type than this limiter stores (do two limiters \
                 share a prefix?): {detail}"
            ),
            Error::DuplicateKey { key } => {
                write!(f, "redis key {key:?} is twice in one batch")
            }
            Error::NoCharge => write!(f, "this limiter's algorithm has no charge script"),
            Error::NotReplicated { confirmed, wanted } => write!(
                f,
                "the admission was not confirmed by enough replicas in time ({confirmed} of \
                 {wanted})"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Cost(e) => Some(e),
            Error::Redis(e) => Some(e),
            Error::Timeout(_)
            | Error::BadReply(_)
            | Error::CircuitOpen
            | Error::CorruptState { .. }
            | Error::WrongType { .. }
            | Error::DuplicateKey { .. }
            | Error::NoCharge
            | Error::NotReplicated { .. } => None,
        }
    }
}

impl From<CheckError> for Error {
    fn from(e: CheckError) -> Self {
        Error::Cost(e)
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        Error::Redis(e)
    }
}
