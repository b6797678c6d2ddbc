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
    /// The script answered something other than the four integers it always returns.
    BadReply(String),
}

impl Error {
    /// Whether this is a backend fault (timeout, Redis, reply) to which the fault policy applies.
    pub fn is_backend(&self) -> bool {
        !matches!(self, Error::Cost(_))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Cost(e) => e.fmt(f),
            Error::Timeout(d) => write!(f, "redis did not answer within {d:?}"),
            Error::Redis(e) => write!(f, "redis error: {e}"),
            Error::BadReply(what) => write!(f, "unexpected reply from the limiter script: {what}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Cost(e) => Some(e),
            Error::Redis(e) => Some(e),
            Error::Timeout(_) | Error::BadReply(_) => None,
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
