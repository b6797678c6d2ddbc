//! A [`RedisBatch`] request across Redis Cluster hash slots
//! ([`with_slot_groups`](RedisBatch::with_slot_groups)): one script per slot group, the groups sent
//! concurrently, and compensating refunds for the groups that committed when another denies.
//!
//! The bound this leaves is stated on [`RedisBatch`] ("Redis Cluster").

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use redis::aio::ConnectionLike;
use tollgate_core::{Decision, Nanos};

use crate::batch::{BatchKey, RedisBatch, admitted, parse};
use crate::breaker::Outcome;
use crate::error::Error;
use crate::scripts;
use crate::slot::slot;

/// Drives every future to completion concurrently (on the caller's task) and answers their
/// outputs in order.
async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    // Every output is set once the poll above is ready.
    outputs.into_iter().flatten().collect()
}

impl<C: ConnectionLike + Clone + Send + Sync> RedisBatch<C> {
    /// Whether `sent`'s keys (under the batch's prefix) lie in more than one hash slot, so that
    /// one script cannot decide them: the test that sends a request down [`run_split`]. A method
    /// here, beside the split it chooses, so that `batch.rs` names nothing of this file.
    ///
    /// [`run_split`]: Self::run_split
    pub(crate) fn spans_slots(&self, sent: &[&BatchKey<'_>]) -> bool {
        let mut slots = sent.iter().map(|k| slot(self.config.key(k.key).as_bytes()));
        let first = slots.next();
        slots.any(|s| Some(s) != first)
    }

    /// [`RedisBatch::try_check`] (or a peek) for keys in several slots; the breaker has admitted
    /// the call. `sent`: the keys sent (those whose cost fits their capacity), in `keys`' order.
    pub(crate) async fn run_split(
        &self,
        keys: &[BatchKey<'_>],
        sent: &[&BatchKey<'_>],
        now: Option<Nanos>,
        cost: u64,
        peek: bool,
    ) -> Result<Vec<Decision>, Error> {
        // Positions in `keys` of the keys sent, grouped by slot in order of first appearance.
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            if cost > k.limit.capacity() {
                continue;
            }
            let s = slot(self.config.key(k.key).as_bytes());
            match groups.iter_mut().find(|(g, _)| *g == s) {
                Some((_, members)) => members.push(i),
                None => groups.push((s, vec![i])),
            }
        }
        debug_assert_eq!(
            groups.iter().map(|(_, m)| m.len()).sum::<usize>(),
            sent.len()
        );
        let replies = join_all(
            groups
                .iter()
                .map(|(_, members)| async move {
                    let group: Vec<&BatchKey<'_>> = members.iter().map(|&i| &keys[i]).collect();
                    let (raw, _, _) = self.call(&group, now, cost, peek).await?;
                    let owned: Vec<BatchKey<'_>> = group.iter().map(|k| **k).collect();
                    parse(&owned, &group, &raw, cost)
                })
                .collect(),
        )
        .await;
        self.breaker
            .record(match replies.iter().find_map(|r| r.as_ref().err()) {
                Some(e) if e.is_outage() => Outcome::Failed,
                _ => Outcome::Answered,
            });

        // A shadow key that can never admit the cost was not sent: it is denied for good.
        let mut decisions = vec![Decision::denied(Nanos::MAX, Nanos::MAX); keys.len()];
        let mut written: Vec<&BatchKey<'_>> = Vec::new();
        let mut all_admit = true;
        let mut error = None;
        for ((_, members), reply) in groups.iter().zip(replies) {
            let group_decisions = match reply {
                Ok(d) => d,
                Err(e) => {
                    error.get_or_insert(e);
                    continue;
                }
            };
            let group: Vec<BatchKey<'_>> = members.iter().map(|&i| keys[i]).collect();
            // The group's script committed its admitted keys when its enforcing keys all admitted.
            let committed = admitted(&group, &group_decisions);
            all_admit &= committed;
            for (&i, d) in members.iter().zip(&group_decisions) {
                decisions[i] = *d;
                if !peek && committed && d.is_allowed() {
                    written.push(&keys[i]);
                }
            }
        }
        if !written.is_empty() && (error.is_some() || !all_admit) {
            self.give_back(&written, now, cost).await;
        }
        if let Some(e) = error {
            return Err(e);
        }
        if let Some(durability) = self.durability.filter(|_| !written.is_empty() && all_admit) {
            // `WAIT` counts one connection's writes on one node: it cannot confirm several slots.
            return Err(Error::NotReplicated {
                confirmed: 0,
                wanted: durability.replicas(),
            });
        }
        Ok(decisions)
    }

    /// Compensating refunds: `cost` back to each key a committed group wrote, concurrently, each by
    /// its algorithm's refund script. One that fails leaves the units spent (stricter, never
    /// looser), counted in `tollgate_redis_batch_refunds_lost_total{prefix}`.
    async fn give_back(&self, written: &[&BatchKey<'_>], now: Option<Nanos>, cost: u64) {
        let time = scripts::time_arg(&self.config, now);
        // An admitted key's cost is within its capacity, so `cost` intervals fit the GCRA refund
        // (the quota's depth fits a u64): every admitted cost can be sent.
        let units = cost.to_string();
        let results = join_all(
            written
                .iter()
                .map(|k| {
                    let head = [time.as_str(), units.as_str(), ""];
                    scripts::invoke(
                        &self.conn,
                        &self.breaker,
                        &self.config,
                        scripts::Lua::Script(k.limit.refund_script()),
                        k.key,
                        head,
                        k.limit.params(),
                    )
                })
                .collect(),
        )
        .await;
        let lost = results.iter().filter(|r| r.is_err()).count();
        if lost > 0 {
            metrics::counter!(
                "tollgate_redis_batch_refunds_lost_total",
                "prefix" => self.config.prefix().to_owned()
            )
            .increment(lost as u64);
        }
    }
}
