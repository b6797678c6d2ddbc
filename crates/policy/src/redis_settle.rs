//! Reserve and settle on Redis: [`RedisPolicy::reserve`], [`RedisPolicy::settle`] and the
//! [`RedisReservation`] between them (whose docs give the semantics).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use smallvec::SmallVec;
use tollgate_core::{CheckError, Decision, Nanos, Quota};
use tollgate_redis::{Error, FaultPolicy, SettleKey, SettleOp};

use crate::charge::Charged;
use crate::decision::{Descriptors, PolicyDecision, PolicyError};
use crate::redis_policy::{RedisLive, RedisPolicy};
use crate::redis_store::{Limiter, QuotaLimiter, RedisStore};
use crate::settle::Settlement;
use crate::store::{AsyncStore, BatchAnswer, RuleKey};
use crate::sync::Ordering;
use crate::{engine, engine_async};

/// One rule's share of a reservation.
#[derive(Clone, Debug)]
struct Taken {
    /// The rule's index in the reserved rule set.
    index: usize,
    key: SmallVec<[u8; 32]>,
    composite: bool,
    /// The request's hash tag value for this rule (see `RuleKey::tag`): its Redis key carries it.
    tag: Option<Box<str>>,
    /// When Redis decided it (ns since the Unix epoch, a whole µs); `None` when not known (lease
    /// mode, which needs it for nothing).
    at: Option<Nanos>,
    /// Buckets: where the segment the reservation wrote ends (its instant plus the admission's
    /// `reset_after`).
    end: Option<Nanos>,
}

/// Units reserved in Redis for one admitted request, to be brought to the actual cost with
/// [`RedisPolicy::settle`]. Dropping it settles at the estimate (the units stay taken; no I/O),
/// so a cancelled request leaks nothing. It holds the rule set it was reserved under.
///
/// Costs known only after the response, on Redis: [`RedisPolicy::reserve`] an estimate, then
/// [`RedisPolicy::settle`] the actual cost. The same semantics as the in-process
/// [`Policy::reserve`](crate::Policy::reserve) and [`Reservation`](crate::Reservation) (a test
/// checks that Redis answers every reservation and settlement as they do, on random traces), with
/// each rule's state in Redis. So the same bound: counting every unit when the state took it (an
/// estimate at its reservation, a charge at its settlement, a give-back as negative), in any
/// interval of length `L` a bucket counts at most `burst + rate × L + O` and a fixed window at
/// most `limit + O` per window, `O` being the overdrafts charged in the interval after its last
/// admission: **the quota plus one request's overshoot** when a key's requests do not overlap, `c`
/// overshoots with `c` in flight at once.
///
/// * **Reserve**: the decision [`RedisPolicy::check`] gives for the estimate, by the same engine:
///   per request, every rule of the request in **one atomic script call** (one round trip; a
///   denial writes nothing), which also tells the instant Redis decided at. When admitted, a
///   [`RedisReservation`] names each rule and key that took the estimate, that instant, and where
///   each bucket's segment ends (the TAT the reservation wrote).
/// * **Settle**: every rule brought from the estimate to the actual cost in **one script call**
///   over all of the request's keys (one round trip; none when the actual cost is the estimate):
///   * **actual < estimate**: the surplus goes back through each algorithm's refund path (the same
///     Lua functions as `RedisLimiter::try_refund`): buckets (GCRA, leaky bucket) at most the part
///     of the reservation's segment still ahead of Redis's now at the settlement (units whose time
///     has passed are not handed out twice); windows in the window the reservation counted them in
///     (nothing once that count has reset or aged out).
///   * **actual > estimate**: the difference is charged unconditionally (the algorithm's
///     `charge` script, restating [`Algorithm::charge`](tollgate_core::Algorithm::charge)): a key
///     with nothing left goes into debt, its next requests waiting exactly as long as the overdraft
///     takes to refill (buckets), or its window counting beyond the limit.
///   * **Lease mode**: a surplus goes back to this process's live lease for the key, locally, as a
///     refund does (`LeasedLimiter::refund`: at most what that lease admitted, nothing once it has
///     expired: those units stay spent); a charge goes to Redis, on the shared bucket's key, in
///     one script call for all of the request's rules. The debt is the shared bucket's: leases
///     already granted (this process's and others') are spent first, within the lease mode's
///     bound; new grants wait for the debt to refill.
/// * **Dropped unsettled**: nothing happens, which *is* settling at the estimate (the estimate was
///   written at the reservation): no I/O, no leak on cancellation or panic. **A process that dies
///   holding reservations** leaves their estimates spent in Redis: never over-admits; the surplus
///   it would have given back is lost (stricter), and its overdraft uncounted (the response it
///   would have charged for was cut off with the process, up to what it had streamed).
///
/// # When Redis cannot settle
/// A settlement Redis does not confirm (an outage, a timeout, an open breaker; or, for one key,
/// state it cannot read) **gives nothing back**: after a timeout the script may or may not have
/// run, so no unit is returned another way (a lease included) and no call is repeated by itself.
/// The error is counted as a decision's is (`tollgate_policy_store_failures_total`), and
/// [`RedisPolicy::settle`] answers [`Unsettled`]:
/// * a surplus stays spent (stricter, whatever the fail policy);
/// * an overdraft is owed still. **Fail closed** hands the reservation back in
///   [`Unsettled::retry`] to settle again later (the charge may then land twice if the first call
///   did run after all: stricter, never looser); dropping it forgives the overdraft. **Fail open**
///   forgives it at once (`retry` is `None`): while Redis is down fail open admits without
///   counting anyway, and this is that exposure, at most one overdraft per failed settlement.
///
/// # Reloads
/// A reservation settles against the rules in force at the settlement: a rule a reload has removed
/// (or whose algorithm changed: another key) is skipped, no I/O, and counted in
/// [`Settlement::stale`]; a rule whose quota changed settles in units of its new quota (its
/// stored state carried over as a decision would).
///
/// # Round trips
/// One per reservation (per request mode), one per settlement that changes anything; both under
/// the store's circuit breaker. All of a request's keys go in one script, so they must live on one
/// node: `RedisPolicy` runs on one Redis (`ConnectionManager`).
#[must_use = "dropping a reservation settles it at its estimate"]
pub struct RedisReservation {
    live: Arc<RedisLive>,
    estimate: u64,
    taken: SmallVec<[Taken; 2]>,
}

impl std::fmt::Debug for RedisReservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisReservation")
            .field("estimate", &self.estimate)
            .field("taken", &self.taken)
            .finish_non_exhaustive()
    }
}

impl RedisReservation {
    /// The estimate reserved.
    pub fn estimate(&self) -> u64 {
        self.estimate
    }

    /// How many rules took units (the rules settling will touch).
    pub fn rules(&self) -> usize {
        self.taken.len()
    }

    /// When Redis decided the reservation (ns since the Unix epoch, a whole µs), where known
    /// (per request mode).
    pub fn reserved_at(&self) -> Option<Nanos> {
        self.taken.iter().find_map(|t| t.at)
    }
}

/// What [`RedisPolicy::reserve`] answers: the decision, and the reservation when admitted.
#[derive(Debug)]
pub struct RedisReserved {
    /// The decision, exactly as [`RedisPolicy::check`] would give it for the estimate.
    pub decision: PolicyDecision,
    /// The `RateLimit` field's `t`, as [`RedisPolicy::check`] gives it.
    pub next: Option<Duration>,
    /// `Some` when admitted; `None` on a denial (which took nothing).
    pub reservation: Option<RedisReservation>,
}

/// A settlement Redis did not confirm (see [`RedisReservation`]): nothing it did not confirm
/// was given back.
#[derive(Debug)]
pub struct Unsettled {
    /// What was asked (`stale` counted as for a confirmed one).
    pub settlement: Settlement,
    /// Rules whose settlement Redis did not confirm (the rest were settled).
    pub unconfirmed: usize,
    /// The first error.
    pub error: Error,
    /// Fail closed, with units owed and the whole call failed: the reservation, to settle again
    /// (its surplus, if any, is never given back: see [`RedisReservation`]). `None` otherwise.
    pub retry: Option<RedisReservation>,
}

impl std::fmt::Display for Unsettled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "settlement of {} rules not confirmed by redis: {}",
            self.unconfirmed, self.error
        )
    }
}

impl std::error::Error for Unsettled {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// The Redis store, recording what each admitting rule took (for the reservation).
struct Reserving<'s> {
    store: &'s RedisStore,
    taken: Mutex<SmallVec<[Taken; 2]>>,
}

impl Reserving<'_> {
    fn taken(&self) -> MutexGuard<'_, SmallVec<[Taken; 2]>> {
        // Only pushed to: a panic while held cannot leave it half-updated.
        self.taken.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, at: &RuleKey<'_>, when: Option<Nanos>, decision: &Decision) {
        let end = when.map(|when| {
            let ahead = u64::try_from(decision.reset_after().as_nanos()).unwrap_or(u64::MAX);
            when.saturating_add(ahead)
        });
        self.taken().push(Taken {
            index: at.index,
            key: SmallVec::from_slice(at.key),
            composite: at.composite,
            tag: at.tag.map(Box::from),
            at: when,
            end,
        });
    }
}

impl AsyncStore for Reserving<'_> {
    type Receipt = ();

    async fn check(
        &self,
        at: &RuleKey<'_>,
        now: Option<Nanos>,
        cost: u64,
    ) -> Result<Option<(Decision, ())>, CheckError> {
        let result = self.store.check(at, now, cost).await?;
        if let Some((decision, ())) = &result {
            if decision.is_allowed() {
                // Rule by rule (lease mode): the instant is the caller's, if any.
                self.record(at, now, decision);
            }
        }
        Ok(result)
    }

    async fn peek(
        &self,
        at: &RuleKey<'_>,
        now: Option<Nanos>,
        cost: u64,
    ) -> Result<Option<Decision>, CheckError> {
        self.store.peek(at, now, cost).await
    }

    async fn refund(&self, at: &RuleKey<'_>, now: Option<Nanos>, cost: u64, receipt: ()) {
        self.store.refund(at, now, cost, receipt).await;
    }

    fn next_unit(&self, index: usize, quota: &Quota, decision: &Decision) -> Option<Duration> {
        self.store.next_unit(index, quota, decision)
    }

    fn batches(&self) -> bool {
        self.store.batches()
    }

    async fn check_batch(
        &self,
        rules: &[(RuleKey<'_>, bool)],
        now: Option<Nanos>,
        cost: u64,
    ) -> Option<BatchAnswer> {
        let (answer, when) = self.store.check_batch_timed(rules, now, cost).await?;
        if let Ok(answers) = &answer {
            // The script writes every admission only when every enforcing rule admits; a
            // reservation is made only then (the request admitted).
            for ((at, _), decision) in rules.iter().zip(answers) {
                if let Some(decision) = decision.filter(Decision::is_allowed) {
                    self.record(at, when, &decision);
                }
            }
        }
        Some(answer)
    }
}

/// A taken rule as the rules in force see it.
struct Target<'a> {
    taken: &'a Taken,
    at: RuleKey<'a>,
    limiter: &'a QuotaLimiter,
}

impl RedisPolicy {
    /// Reserves `estimate` units for a request whose actual cost is known only later, on Redis's
    /// clock (see [`RedisReservation`]): one round trip per request mode.
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub async fn reserve(
        &self,
        descriptors: &Descriptors<'_>,
        estimate: u64,
    ) -> Result<RedisReserved, PolicyError> {
        self.reserve_inner(descriptors, None, estimate).await
    }

    /// [`reserve`](Self::reserve) at an explicit time (as [`check_at`](Self::check_at)).
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub async fn reserve_at(
        &self,
        descriptors: &Descriptors<'_>,
        now: Nanos,
        estimate: u64,
    ) -> Result<RedisReserved, PolicyError> {
        self.reserve_inner(descriptors, Some(now), estimate).await
    }

    async fn reserve_inner(
        &self,
        descriptors: &Descriptors<'_>,
        now: Option<Nanos>,
        estimate: u64,
    ) -> Result<RedisReserved, PolicyError> {
        let live = self.current.load_full();
        // Relaxed: a switch read by each decision; it publishes no other data.
        let dry = live.rules.dry_run || self.dry_run.load(Ordering::Relaxed);
        let store = Reserving {
            store: &live.store,
            taken: Mutex::new(SmallVec::new()),
        };
        let (decision, next) =
            engine_async::decide_async(&live.rules, &store, descriptors, dry, now, estimate)
                .await?;
        if !decision.is_allowed() {
            return Ok(RedisReserved {
                decision,
                next,
                reservation: None,
            });
        }
        let taken = store.taken.into_inner().unwrap_or_else(|e| e.into_inner());
        Ok(RedisReserved {
            decision,
            next,
            reservation: Some(RedisReservation {
                live,
                estimate,
                taken,
            }),
        })
    }

    /// Settles `reservation` at `actual` units, on Redis's clock: gives the surplus back or charges
    /// the difference in every rule that took the estimate, one script call for all of them (see
    /// [`RedisReservation`]). Consumes the reservation: a second settlement
    /// cannot be written.
    ///
    /// # Errors
    /// [`Unsettled`] when Redis did not confirm every rule's settlement: nothing unconfirmed was
    /// given back; under fail closed an overdraft can be retried with [`Unsettled::retry`].
    pub async fn settle(
        &self,
        reservation: RedisReservation,
        actual: u64,
    ) -> Result<Settlement, Box<Unsettled>> {
        self.settle_inner(reservation, None, actual).await
    }

    /// [`settle`](Self::settle) at an explicit time (as [`check_at`](Self::check_at)).
    ///
    /// # Errors
    /// As [`settle`](Self::settle).
    pub async fn settle_at(
        &self,
        reservation: RedisReservation,
        now: Nanos,
        actual: u64,
    ) -> Result<Settlement, Box<Unsettled>> {
        self.settle_inner(reservation, Some(now), actual).await
    }

    async fn settle_inner(
        &self,
        reservation: RedisReservation,
        now: Option<Nanos>,
        actual: u64,
    ) -> Result<Settlement, Box<Unsettled>> {
        let current = self.current.load_full();
        let held = reservation.estimate;
        let (settlement, failed) = {
            let targets = resolve(&reservation, &current);
            let settlement = Settlement {
                estimate: held,
                actual,
                rules: reservation.taken.len(),
                stale: reservation.taken.len() - targets.len(),
            };
            let failed = if actual < held {
                give_back(&current.store, &targets, now, held - actual).await
            } else if actual > held {
                charge(&current.store, &targets, now, actual - held).await
            } else {
                None
            };
            (settlement, failed)
        };
        let Some(Failed {
            unconfirmed,
            error,
            whole,
        }) = failed
        else {
            return Ok(settlement);
        };
        let owed = actual > held;
        let closed = matches!(current.store.fail, FaultPolicy::FailClosed { .. });
        Err(Box::new(Unsettled {
            settlement,
            unconfirmed,
            error,
            retry: (owed && closed && whole).then_some(reservation),
        }))
    }
}

impl RedisPolicy {
    /// Charges `cost` units, unconditionally, to every rule that applies to `descriptors`, on
    /// Redis's clock: the in-process [`Policy::charge`](crate::Policy::charge) on the shared state
    /// (a key with nothing left goes into debt), in one settle script call for all the rules (lease
    /// mode: on the shared bucket).
    ///
    /// # Errors
    /// The first error when Redis did not confirm every rule's charge (each counted as a store
    /// failure by the circuit breaker): the rules not confirmed did not count the units, an
    /// under-count of at most this charge. Retrying may count it twice where Redis applied it
    /// before the answer was lost.
    pub async fn charge(&self, descriptors: &Descriptors<'_>, cost: u64) -> Result<Charged, Error> {
        self.charge_inner(descriptors, None, cost).await
    }

    /// [`charge`](Self::charge) at an explicit time (as [`check_at`](Self::check_at)).
    ///
    /// # Errors
    /// As [`charge`](Self::charge).
    pub async fn charge_at(
        &self,
        descriptors: &Descriptors<'_>,
        now: Nanos,
        cost: u64,
    ) -> Result<Charged, Error> {
        self.charge_inner(descriptors, Some(now), cost).await
    }

    async fn charge_inner(
        &self,
        descriptors: &Descriptors<'_>,
        now: Option<Nanos>,
        cost: u64,
    ) -> Result<Charged, Error> {
        let live = self.current.load_full();
        let values = live.rules.resolve(descriptors);
        let mut keys: SmallVec<[(usize, SmallVec<[u8; 32]>); 4]> = SmallVec::new();
        engine::each_rule_key(&live.rules, &values, |at| {
            keys.push((at.index, SmallVec::from_slice(at.key)));
        });
        let charged = Charged {
            cost,
            rules: keys.len(),
        };
        if cost == 0 {
            return Ok(charged);
        }
        let targets: SmallVec<[(RuleKey<'_>, &QuotaLimiter); 4]> = keys
            .iter()
            .filter_map(|(i, key)| {
                let at = engine_async::rule_key_of(&live.rules, *i, key, &values)?;
                let limiter = live.store.limiter(&at)?;
                Some((at, limiter))
            })
            .collect();
        let sent: Vec<Sent<'_, '_>> = targets
            .iter()
            .map(|(at, limiter)| (at, *limiter, SettleOp::Charge { units: cost }))
            .collect();
        match run(&live.store, &sent, now).await {
            None => Ok(charged),
            Some(failed) => Err(failed.error),
        }
    }
}

/// The reservation's rules in the rules in force now, with the key each settles (rules a reload
/// removed, or whose algorithm changed, left out).
fn resolve<'a>(reservation: &'a RedisReservation, current: &'a RedisLive) -> Vec<Target<'a>> {
    let reserved = &reservation.live.rules.rules;
    reservation
        .taken
        .iter()
        .filter_map(|taken| {
            let was = &reserved[taken.index];
            let (index, rule) = current
                .rules
                .rules
                .iter()
                .enumerate()
                .find(|(_, r)| r.name == was.name && r.algorithm == was.algorithm)?;
            let at = RuleKey {
                index,
                rule: rule.name,
                algorithm: rule.algorithm,
                quota: rule.effective_for(&taken.key),
                key: &taken.key,
                composite: taken.composite,
                // Redis stores refuse priorities (validation).
                reserve: 0,
                tag: taken.tag.as_deref(),
            };
            let limiter = current.store.limiter(&at)?;
            Some(Target { taken, at, limiter })
        })
        .collect()
}

/// What a settlement Redis did not confirm left: how many rules, the first error, and whether the
/// whole call failed (else some keys' state).
struct Failed {
    unconfirmed: usize,
    error: Error,
    whole: bool,
}

/// Gives `surplus` back: to the live lease (lease mode, locally), or through the settle script.
async fn give_back(
    store: &RedisStore,
    targets: &[Target<'_>],
    now: Option<Nanos>,
    surplus: u64,
) -> Option<Failed> {
    let mut sent: Vec<Sent<'_, '_>> = Vec::with_capacity(targets.len());
    for target in targets {
        if let Limiter::Lease(lease) = &target.limiter.limiter {
            let key = RedisStore::key_name(&target.at);
            // At most what the live lease admitted comes back; nothing once it has expired.
            match now {
                Some(now) => lease.refund_at(&key, now, surplus),
                None => lease.refund(&key, surplus),
            };
            continue;
        }
        // Without the instant or the segment (never in per request mode) nothing comes back.
        let (Some(at), Some(end)) = (target.taken.at, target.taken.end) else {
            continue;
        };
        sent.push((
            &target.at,
            target.limiter,
            SettleOp::GiveBack {
                units: surplus,
                reserved_at: at,
                segment_end: end,
            },
        ));
    }
    run(store, &sent, now).await
}

/// Charges `owed` in every rule, through the settle script (lease mode: on the shared bucket).
async fn charge(
    store: &RedisStore,
    targets: &[Target<'_>],
    now: Option<Nanos>,
    owed: u64,
) -> Option<Failed> {
    let sent: Vec<Sent<'_, '_>> = targets
        .iter()
        .map(|t| (&t.at, t.limiter, SettleOp::Charge { units: owed }))
        .collect();
    run(store, &sent, now).await
}

/// One rule's part of a settle script call: its key, its limiter and what to do.
type Sent<'k, 'a> = (&'k RuleKey<'a>, &'k QuotaLimiter, SettleOp);

/// One settle script call for `sent`; the failures, each counted as a store failure.
async fn run(store: &RedisStore, sent: &[Sent<'_, '_>], now: Option<Nanos>) -> Option<Failed> {
    let mut names = Vec::with_capacity(sent.len());
    let mut ops = Vec::with_capacity(sent.len());
    for &(at, limiter, op) in sent {
        // Every limiter has its batch form (lease mode: the shared bucket's GCRA).
        if let Some((limit, relative)) = &limiter.batch {
            names.push(RedisStore::key_after(relative, at));
            ops.push((at, limit, op));
        }
    }
    if ops.is_empty() {
        return None;
    }
    let keys: Vec<SettleKey<'_>> = names
        .iter()
        .zip(&ops)
        .map(|(key, (_, limit, op))| SettleKey {
            key,
            limit,
            op: *op,
        })
        .collect();
    let result = match now {
        Some(now) => store.batch.try_settle_at(&keys, now).await,
        None => store.batch.try_settle(&keys).await,
    };
    match result {
        Err(error) => {
            for (at, _, _) in &ops {
                let _ = store.fault(at, &error);
            }
            Some(Failed {
                unconfirmed: ops.len(),
                error,
                whole: true,
            })
        }
        Ok(answers) => {
            let mut failed: Option<Failed> = None;
            for ((at, _, _), answer) in ops.iter().zip(answers) {
                if let Err(error) = answer {
                    let _ = store.fault(at, &error);
                    match &mut failed {
                        Some(f) => f.unconfirmed += 1,
                        None => {
                            failed = Some(Failed {
                                unconfirmed: 1,
                                error,
                                whole: false,
                            });
                        }
                    }
                }
            }
            failed
        }
    }
}
