//! A reserved request's settlement: each of its keys given units back or charged, in one atomic
//! script call.

use redis::aio::ConnectionLike;
use tollgate_core::Nanos;

use crate::batch::{BatchLimit, RedisBatch};
use crate::breaker::{Admission, Outcome};
use crate::error::Error;
use crate::scripts::{self, SETTLE};

/// What a settlement does to one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettleOp {
    /// Gives back `units` that a reservation took, through the algorithm's refund (the same
    /// function as [`RedisLimiter::try_refund`](crate::RedisLimiter::try_refund)'s script):
    /// * GCRA and the leaky bucket: at most the units of the reservation's segment still ahead of
    ///   the settlement's now (`segment_end`: the reservation's instant plus its admission's
    ///   `reset_after`, the TAT it wrote), rounded down: units whose time has passed are not handed
    ///   out a second time. Then the TAT moves back by that many intervals, never below now.
    /// * The windows: at `reserved_at` (the instant the reservation was decided at, see
    ///   [`RedisBatch::try_check_timed`]), off the count of the window it counted the units in;
    ///   nothing once that count has reset (fixed) or aged out (sliding).
    GiveBack {
        /// Units to give back (0: nothing is sent).
        units: u64,
        /// When the reservation was decided (ns since the Unix epoch, a whole µs).
        reserved_at: Nanos,
        /// Where the reservation's bucket segment ends (ns since the Unix epoch; unused by the
        /// windows).
        segment_end: Nanos,
    },
    /// Counts `units` at the settlement's now without a decision, as
    /// [`RedisLimiter::try_charge`](crate::RedisLimiter::try_charge) (0: nothing is sent).
    Charge {
        /// Units owed.
        units: u64,
    },
}

impl SettleOp {
    fn units(self) -> u64 {
        match self {
            SettleOp::GiveBack { units, .. } | SettleOp::Charge { units } => units,
        }
    }
}

/// One key of a settlement: the key (under the batch's prefix), the limit it was reserved under
/// (the same [`BatchLimit`] as the reservation's [`BatchKey`](crate::BatchKey), or the rule's
/// current one after a reload: units are settled in that limit's quota), and what to do.
#[derive(Clone, Copy, Debug)]
pub struct SettleKey<'a> {
    /// The key, without the batch's prefix.
    pub key: &'a str,
    /// The algorithm and quota.
    pub limit: &'a BatchLimit,
    /// Give back or charge.
    pub op: SettleOp,
}

impl<C: ConnectionLike + Clone + Send + Sync> RedisBatch<C> {
    /// Settles every key of `keys` in **one script call** (one round trip, whatever the number of
    /// keys; all keys on one node, one hash slot on a cluster), at Redis's now: each key given units
    /// back or charged as its [`SettleOp`] says, by the same Lua functions as the single-key refund
    /// and charge scripts. Keys with 0 units are not sent; with none left, there is no round trip.
    ///
    /// Each key is settled on its own: the answer per key (in `keys`' order) is `Ok(true)` when
    /// its state was written, `Ok(false)` when there was nothing to do (a give-back whose units'
    /// time has passed or whose window has rolled), or the error its state raised
    /// ([`Error::CorruptState`], [`Error::WrongType`]: that key untouched, the others settled).
    ///
    /// # Errors
    /// [`Error::DuplicateKey`] before any round trip; the outages [`Error::Timeout`],
    /// [`Error::Redis`], [`Error::BadReply`], [`Error::CircuitOpen`]. Then nothing is known to be
    /// written: **after a timeout the script may still have run** (a caller must not give the same
    /// units back another way).
    pub async fn try_settle(
        &self,
        keys: &[SettleKey<'_>],
    ) -> Result<Vec<Result<bool, Error>>, Error> {
        self.settle_run(keys, None).await
    }

    /// [`try_settle`](Self::try_settle) at a time the caller supplies (as
    /// [`try_check_at`](Self::try_check_at)).
    ///
    /// # Errors
    /// As [`try_settle`](Self::try_settle).
    pub async fn try_settle_at(
        &self,
        keys: &[SettleKey<'_>],
        now: Nanos,
    ) -> Result<Vec<Result<bool, Error>>, Error> {
        self.settle_run(keys, Some(now)).await
    }

    async fn settle_run(
        &self,
        keys: &[SettleKey<'_>],
        now: Option<Nanos>,
    ) -> Result<Vec<Result<bool, Error>>, Error> {
        let mut names: Vec<&str> = keys.iter().map(|k| k.key).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::DuplicateKey {
                key: self.config.key(w[0]),
            });
        }
        let sent: Vec<&SettleKey<'_>> = keys.iter().filter(|k| k.op.units() > 0).collect();
        if sent.is_empty() {
            return Ok(keys.iter().map(|_| Ok(false)).collect());
        }
        if self.breaker.admit() == Admission::Reject {
            return Err(Error::CircuitOpen);
        }
        let result = self.settle_call(&sent, now).await;
        self.breaker.record(match &result {
            Err(e) if e.is_outage() => Outcome::Failed,
            _ => Outcome::Answered,
        });
        let mut answers = result?.into_iter();
        Ok(keys
            .iter()
            .map(|k| {
                if k.op.units() == 0 {
                    return Ok(false);
                }
                // `settle_call` checked there is one answer per key sent.
                answers.next().unwrap_or(Ok(false))
            })
            .collect())
    }

    async fn settle_call(
        &self,
        sent: &[&SettleKey<'_>],
        now: Option<Nanos>,
    ) -> Result<Vec<Result<bool, Error>>, Error> {
        let mut conn = self.conn.clone();
        let mut call = SETTLE.prepare_invoke();
        call.arg(scripts::time_arg(&self.config, now));
        for k in sent {
            call.key(self.config.key(k.key)).arg(k.limit.kind.code());
            match k.op {
                SettleOp::GiveBack {
                    units,
                    reserved_at,
                    segment_end,
                } => {
                    let mark = if k.limit.kind.code() == "g" {
                        segment_end
                    } else {
                        reserved_at / 1000
                    };
                    call.arg("r").arg(units).arg(mark);
                }
                SettleOp::Charge { units } => {
                    call.arg("c").arg(units).arg(0);
                }
            }
            for a in k.limit.params.args() {
                call.arg(a.as_str());
            }
        }
        let reply: Vec<redis::Value> =
            tokio::time::timeout(self.config.timeout(), call.invoke_async(&mut conn))
                .await
                .map_err(|_| Error::Timeout(self.config.timeout()))?
                .map_err(|e| scripts::classify(e, &self.config, ""))?;
        if reply.len() != sent.len() {
            return Err(Error::BadReply(format!(
                "{} values, want {}",
                reply.len(),
                sent.len()
            )));
        }
        Ok(reply
            .into_iter()
            .zip(sent)
            .map(|(value, k)| self.answer(value, k.key))
            .collect())
    }

    /// One key's answer: 1 written, 0 nothing to do, or the error its state raised.
    fn answer(&self, value: redis::Value, key: &str) -> Result<bool, Error> {
        let message = match value {
            redis::Value::Int(0) => return Ok(false),
            redis::Value::Int(1) => return Ok(true),
            redis::Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            redis::Value::SimpleString(s) => s,
            other => return Err(Error::BadReply(format!("{other:?}"))),
        };
        // Redis may append where the error was raised (" script: <sha>, on @user_script:<line>.").
        let message = message
            .split(" script: ")
            .next()
            .unwrap_or(&message)
            .to_owned();
        let full = self.config.key(key);
        let (code, rest) = message.split_once(' ').unwrap_or((&message, ""));
        Err(match code {
            "TOLLGATE_CORRUPT" => Error::CorruptState {
                reason: rest
                    .strip_prefix(full.as_str())
                    .and_then(|r| r.strip_prefix(": "))
                    .unwrap_or(rest)
                    .to_owned(),
                key: full,
            },
            "WRONGTYPE" => Error::WrongType {
                key: full,
                detail: rest.to_owned(),
            },
            _ => Error::BadReply(format!("settling {full:?}: {message}")),
        })
    }
}
