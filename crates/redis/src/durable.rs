//! Durable admissions: `WAIT` for replicas after a script that wrote an admission.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use redis::RedisError;
use redis::aio::ConnectionLike;
use tokio::sync::OnceCell;

use crate::error::Error;

/// Wait for `replicas` replicas to confirm each admission, for at most `timeout`
/// ([`RedisBatch::with_durability`](crate::RedisBatch::with_durability)).
///
/// Redis replicates asynchronously: the primary answers a script before any replica has its
/// writes, so a primary that dies right after an admission can take it along, and the replica
/// promoted in its place admits those units again. With a `Durability`, every call whose script
/// wrote an admission is followed by `WAIT replicas timeout` on the same connection: the call
/// answers only once `replicas` replicas have acknowledged every write sent on that connection so
/// far (the admission included), and when fewer confirm within `timeout` it answers
/// [`Error::NotReplicated`], which a caller answers by its fault policy (the units stay spent on the
/// primary: stricter, never looser). A call that admitted nothing (a denial, a peek) sends no
/// `WAIT`.
///
/// What it costs: one more round trip per admitted request, plus the replicas' acknowledgement
/// time; with [`with_coalescing`](crate::RedisBatch::with_coalescing), one `WAIT` per group call
/// whose requests wrote an admission, sent after the group's reply and awaited by each of them.
/// `WAIT` blocks the connection it is sent on, so with a multiplexed connection the commands
/// queued behind it wait too (up to `timeout` each while a replica is missing).
///
/// What it does not cover: an admission confirmed by `replicas` replicas survives a failover to
/// one of them; `WAIT` does not make Redis strongly consistent (a failover to a replica that had
/// not acknowledged can still lose it, so promote the most up-to-date replica, as Sentinel and
/// Cluster do). A connection that redis-rs replaces between the script and the `WAIT` (the primary
/// restarted at the same address in between) makes the `WAIT` count the new connection's writes
/// only.
///
/// ```
/// use std::time::Duration;
/// use tollgate_redis::Durability;
///
/// let durable = Durability::new(1, Duration::from_millis(5));
/// assert_eq!(durable.wait_args(), (1, 5));
/// // Below a millisecond rounds up (`WAIT n 0` would block for ever).
/// assert_eq!(Durability::new(1, Duration::from_micros(10)).wait_args(), (1, 1));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Durability {
    replicas: u32,
    timeout: Duration,
}

impl Durability {
    /// At least `replicas` replicas (at least 1) confirm within `timeout` (rounded up to whole
    /// milliseconds, at least 1 ms: `WAIT`'s unit).
    pub fn new(replicas: u32, timeout: Duration) -> Self {
        Durability {
            replicas: replicas.max(1),
            timeout,
        }
    }

    /// How many replicas must confirm.
    pub fn replicas(&self) -> u32 {
        self.replicas
    }

    /// How long to wait for them.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `WAIT`'s two arguments: the replicas, and the timeout in whole milliseconds (rounded up, at
    /// least 1).
    pub fn wait_args(&self) -> (u32, u64) {
        let ms = self.timeout.as_nanos().div_ceil(1_000_000);
        (self.replicas, u64::try_from(ms).unwrap_or(u64::MAX).max(1))
    }

    /// Sends `WAIT` on `conn` and checks that enough replicas confirmed. `slack` bounds the network
    /// time on top of `WAIT`'s own timeout (the caller's per-call timeout).
    pub(crate) async fn confirm<C: ConnectionLike + Clone + Send>(
        &self,
        conn: &C,
        slack: Duration,
    ) -> Result<(), Error> {
        let (replicas, ms) = self.wait_args();
        let mut conn = conn.clone();
        let limit = Duration::from_millis(ms).saturating_add(slack);
        let confirmed: u64 = tokio::time::timeout(
            limit,
            redis::cmd("WAIT")
                .arg(replicas)
                .arg(ms)
                .query_async(&mut conn),
        )
        .await
        .map_err(|_| Error::Timeout(limit))?
        .map_err(|e| {
            if e.is_timeout() {
                Error::Timeout(limit)
            } else {
                Error::Redis(e)
            }
        })?;
        if confirmed < u64::from(replicas) {
            return Err(Error::NotReplicated {
                confirmed,
                wanted: replicas,
            });
        }
        Ok(())
    }
}

/// One `WAIT` for the requests of a group call (coalesce.rs) that wrote an admission: the first of
/// them to ask sends it, after the group's reply arrived, so it counts every write of the group
/// (the connection's writes so far); the others await its answer. A group whose requests wrote
/// nothing sends none. If the request sending it gives up (its timeout), the next one to ask sends
/// it again.
pub(crate) trait GroupWait: Send + Sync {
    /// The durability it waits for (that of the group's first request that has one: clones of a
    /// batch share its coalescing and may ask for different ones).
    fn durability(&self) -> Durability;

    /// Whether enough replicas confirmed the group's writes ([`Durability::confirm`]'s answer).
    fn confirm(&self) -> Pin<Box<dyn Future<Output = Result<(), Error>> + Send + '_>>;
}

/// [`GroupWait`] over one connection.
pub(crate) struct SharedWait<C> {
    conn: C,
    durability: Durability,
    slack: Duration,
    answer: OnceCell<Result<(), Unconfirmed>>,
}

impl<C> SharedWait<C> {
    /// A `WAIT` for `durability` on `conn`, `slack` as in [`Durability::confirm`].
    pub(crate) fn new(conn: C, durability: Durability, slack: Duration) -> Self {
        SharedWait {
            conn,
            durability,
            slack,
            answer: OnceCell::new(),
        }
    }
}

impl<C: ConnectionLike + Clone + Send + Sync> GroupWait for SharedWait<C> {
    fn durability(&self) -> Durability {
        self.durability
    }

    fn confirm(&self) -> Pin<Box<dyn Future<Output = Result<(), Error>> + Send + '_>> {
        Box::pin(async move {
            let answer = self
                .answer
                .get_or_init(|| async {
                    self.durability
                        .confirm(&self.conn, self.slack)
                        .await
                        .map_err(Unconfirmed::from)
                })
                .await;
            answer.clone().map_err(Error::from)
        })
    }
}

/// Why a shared `WAIT` did not confirm, kept to answer each request that awaits it (the crate's
/// [`Error`] is not `Clone`).
#[derive(Clone, Debug)]
enum Unconfirmed {
    Short { confirmed: u64, wanted: u32 },
    Timeout(Duration),
    Redis(RedisError),
}

impl From<Error> for Unconfirmed {
    fn from(e: Error) -> Self {
        match e {
            Error::NotReplicated { confirmed, wanted } => Unconfirmed::Short { confirmed, wanted },
            Error::Timeout(t) => Unconfirmed::Timeout(t),
            Error::Redis(e) => Unconfirmed::Redis(e),
            // `confirm` answers nothing else; kept as its text rather than lost.
            other => Unconfirmed::Redis(RedisError::from(std::io::Error::other(other.to_string()))),
        }
    }
}

impl From<Unconfirmed> for Error {
    fn from(u: Unconfirmed) -> Self {
        match u {
            Unconfirmed::Short { confirmed, wanted } => Error::NotReplicated { confirmed, wanted },
            Unconfirmed::Timeout(t) => Error::Timeout(t),
            Unconfirmed::Redis(e) => Error::Redis(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_never_gets_zero_and_at_least_one_replica() {
        assert_eq!(Durability::new(0, Duration::ZERO).wait_args(), (1, 1));
        assert_eq!(
            Durability::new(2, Duration::from_micros(1500)).wait_args(),
            (2, 2)
        );
        assert_eq!(
            Durability::new(3, Duration::from_secs(1)).wait_args(),
            (3, 1000)
        );
        assert_eq!(Durability::new(1, Duration::MAX).wait_args().1, u64::MAX);
    }
}
