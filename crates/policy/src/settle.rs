//! Costs known only after the response: reserve an estimate, then settle the actual cost.
//!
//! [`Policy::reserve`] decides a request of an *estimated* cost exactly as [`Policy::check`] does
//! (the same engine, so atomic over the request's rules: a denial or an error gives everything
//! back) and, when admitted, hands out a [`Reservation`] naming each rule, key and receipt that
//! took the estimate. [`Policy::settle`] (or [`Reservation::settle_at`]) then brings every one of
//! those rules to the actual cost:
//!
//! * **actual < estimate**: the surplus goes back through the rule's refund path (the same CAS loop
//!   as a decision). Windows give it back in the window the reservation counted it in (nothing once
//!   that window has passed: its count has reset anyway). Buckets (GCRA, leaky bucket) give back at
//!   most the part of the reservation's segment still ahead of the settlement's `now`: units whose
//!   time has passed are not handed out a second time. A striped rule gives them back to the lease
//!   or shared segment they came from when it is unchanged (else nothing: stricter).
//! * **actual > estimate**: the difference is charged unconditionally
//!   ([`Algorithm::charge`](tollgate_core::Algorithm::charge)): a key with nothing left goes into
//!   debt, and its next requests wait exactly as long as the overdraft takes to refill (buckets),
//!   or its window counts beyond the limit (windows).
//! * **dropped unsettled**: nothing happens, which *is* settling at the estimate (the estimate was
//!   taken at the reservation). A cancelled request, a panic or a lost connection never leaks
//!   units back. [`Reservation::settle_at`] takes `self`, so settling twice cannot be written.
//!
//! # The bound
//! Count, for one key and rule, every unit at the instant the state took it: a reservation's
//! estimate when it was admitted, a settlement's charge when it settled, a give-back as negative.
//! Then in any interval of length `L`:
//!
//! * **GCRA / leaky bucket**: counted ≤ `burst + rate × L + O`, where `O` is the sum of the
//!   overdrafts charged in the interval after its last admission. When a key's requests do not
//!   overlap (each settles before the next reserves) that is **quota + at most one request's
//!   overshoot**; with `c` requests in flight at once, at most `c` overshoots. Proof: an admission
//!   at `t` leaves the TAT at most `t + burst × T`; charges and give-backs after it move it by their
//!   units × `T`; the interval's counted units × `T` are at most the final TAT minus its start.
//! * **fixed window**: in every aligned window, counted ≤ `limit + O` (a fixed window carries no debt
//!   into the next window).
//! * **sliding window**: its own bound (`limit` per aligned window, `2 × limit` per trailing window)
//!   plus `O`; the overdraft also weighs on the next window through the previous count.
//!
//! And since each request's actual cost is what ends up counted (its estimate, plus its charge, or
//! minus what was given back), the same bound holds for the actual costs of the requests admitted in
//! the interval, counted at their reservation: a give-back never frees a unit twice (see above).
//! `crates/policy/tests/settle.rs` checks it against a reference model.
//!
//! # Bad input
//! An actual cost is a `u64`: a negative one cannot be passed (an edge that reads a malformed or
//! negative count settles at the estimate, see `tollgate-http`). Zero gives the whole estimate
//! back. An absurd one is charged saturating: the key's count or TAT stops at what its state can
//! hold, so it stays denied (never over-admits, never panics). A rule removed by a reload since the
//! reservation is settled into the state it had, which no decision reads any more: a no-op, counted
//! in [`Settlement::stale`]. A rule whose quota changed settles in units of the new quota.

use std::sync::Arc;

use smallvec::SmallVec;
use tollgate_core::{CheckError, Clock, Decision, Nanos};

use crate::config::AlgorithmKind;
use crate::decision::{Descriptors, PolicyDecision, PolicyError};
use crate::engine;
use crate::limiter::Receipt;
use crate::live::Live;
use crate::policy::Policy;
use crate::store::{MemoryStore, RuleKey, Store};
use crate::sync::Ordering;

/// One rule's share of a reservation: what settling it needs.
#[derive(Clone, Debug)]
struct Taken {
    /// The rule's index in the reserved rule set.
    index: usize,
    algorithm: AlgorithmKind,
    /// The key's emission interval `T` (buckets), in nanoseconds.
    interval: Nanos,
    /// The end of the bucket segment the reservation wrote (`now + reset_after`).
    end: Nanos,
    key: SmallVec<[u8; 32]>,
    receipt: Receipt,
}

/// Units reserved for one admitted request in each rule that took them, to be brought to the
/// actual cost with [`Policy::settle`] or [`settle_at`](Self::settle_at). Dropping it settles at
/// the estimate (the units stay taken), so a cancelled request leaks nothing.
///
/// It holds the rule set it was reserved under (an `Arc`), so a reload in between settles into the
/// state the units were taken from.
#[derive(Debug)]
#[must_use = "dropping a reservation settles it at its estimate"]
pub struct Reservation {
    live: Arc<Live>,
    at: Nanos,
    /// Units held: the estimate, plus extensions.
    held: u64,
    /// The estimate as first reserved.
    reserved: u64,
    taken: SmallVec<[Taken; 2]>,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live")
            .field("rules", &self.rules.names())
            .finish_non_exhaustive()
    }
}

/// What [`Policy::reserve`] answers: the decision, and the reservation when admitted.
#[derive(Debug)]
pub struct Reserved {
    /// The decision, exactly as [`Policy::check`] would give it for the estimate.
    pub decision: PolicyDecision,
    /// `Some` when admitted; `None` on a denial (which took nothing).
    pub reservation: Option<Reservation>,
}

/// What a settlement did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settlement {
    /// The units held when settled (the estimate plus any extension).
    pub estimate: u64,
    /// The actual cost settled.
    pub actual: u64,
    /// Rules settled.
    pub rules: usize,
    /// Of those, rules a reload has removed since the reservation (settling them changes nothing
    /// any decision reads).
    pub stale: usize,
}

impl Reservation {
    /// The estimate first reserved.
    pub fn estimate(&self) -> u64 {
        self.reserved
    }

    /// When it was reserved (the policy clock's nanoseconds).
    pub fn reserved_at(&self) -> Nanos {
        self.at
    }

    /// How many rules took units (the rules settling will touch).
    pub fn rules(&self) -> usize {
        self.taken.len()
    }

    /// Units held now: the estimate plus what [`extend_at`](Self::extend_at) added.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// Takes `more` units on top of what is held, at `now`, in every rule that took the estimate
    /// (for a response that turns out longer than estimated, while it streams): one decision over
    /// those rules and keys, atomic as a check is (a denial in any gives back what the others
    /// admitted). `Ok(true)`: held, settled with the rest. `Ok(false)`: the key's budget is spent
    /// (nothing taken). A rule that can never admit `more` at once is an error (nothing taken).
    ///
    /// # Errors
    /// [`CheckError::CostExceedsCapacity`] when a rule's quota can never admit `more` at once.
    pub fn extend_at(&mut self, now: Nanos, more: u64) -> Result<bool, CheckError> {
        if more == 0 {
            return Ok(true);
        }
        let store = &self.live.store;
        let mut admitted: SmallVec<[(usize, Receipt); 2]> = SmallVec::new();
        let mut outcome = Ok(true);
        for (i, taken) in self.taken.iter().enumerate() {
            match store.limiters[taken.index].check(&taken.key, now, more) {
                Ok((decision, receipt)) if decision.is_allowed() => admitted.push((i, receipt)),
                Ok(_) => {
                    outcome = Ok(false);
                    break;
                }
                Err(error) => {
                    outcome = Err(error);
                    break;
                }
            }
        }
        if outcome != Ok(true) {
            for (i, receipt) in admitted {
                let taken = &self.taken[i];
                store.limiters[taken.index].refund(&taken.key, now, more, receipt);
            }
            return outcome;
        }
        // The bucket segment now ends where the extension left it.
        for taken in &mut self.taken {
            if matches!(
                taken.algorithm,
                AlgorithmKind::Gcra | AlgorithmKind::LeakyBucket
            ) {
                taken.end = taken
                    .end
                    .max(now)
                    .saturating_add(more.saturating_mul(taken.interval));
            }
        }
        self.held += more;
        Ok(true)
    }

    /// Brings every rule that took the estimate to `actual` units at `now`: gives the surplus back
    /// or charges the difference (see [`Reservation`]). Consumes the reservation: a second
    /// settlement cannot be written.
    pub fn settle_at(self, now: Nanos, actual: u64) -> Settlement {
        let store = &self.live.store;
        if actual < self.held {
            let surplus = self.held - actual;
            for taken in &self.taken {
                let back = match (taken.algorithm, taken.receipt) {
                    // Only the part of the segment still ahead of `now`: units whose time has
                    // passed are not handed out again.
                    (
                        AlgorithmKind::Gcra | AlgorithmKind::LeakyBucket,
                        Receipt::Plain | Receipt::Keyed(_),
                    ) => {
                        let ahead = taken.end.saturating_sub(now) / taken.interval.max(1);
                        surplus.min(ahead)
                    }
                    // A striped receipt names where the first units came from: no more than those.
                    (_, Receipt::Striped { .. }) => surplus.min(self.reserved),
                    _ => surplus,
                };
                if back > 0 {
                    // At the reservation's instant: the window it counted the units in.
                    store.limiters[taken.index].refund(&taken.key, self.at, back, taken.receipt);
                }
            }
        } else if actual > self.held {
            let owed = actual - self.held;
            for taken in &self.taken {
                store.limiters[taken.index].charge(&taken.key, now, owed);
            }
        }
        Settlement {
            estimate: self.held,
            actual,
            rules: self.taken.len(),
            stale: 0,
        }
    }
}

/// The in-process store, recording what each admitting rule took (for the reservation).
struct Reserving<'s> {
    store: &'s MemoryStore,
    taken: std::cell::RefCell<SmallVec<[Taken; 2]>>,
}

impl Store for Reserving<'_> {
    type Receipt = Receipt;

    #[inline]
    fn check(
        &self,
        at: &RuleKey<'_>,
        now: Nanos,
        cost: u64,
    ) -> Result<Option<(Decision, Receipt)>, CheckError> {
        let result = self.store.check(at, now, cost)?;
        if let Some((decision, receipt)) = result {
            if decision.is_allowed() {
                let ahead = u64::try_from(decision.reset_after().as_nanos()).unwrap_or(u64::MAX);
                self.taken.borrow_mut().push(Taken {
                    index: at.index,
                    algorithm: at.algorithm,
                    interval: at.quota.emission_interval_nanos(),
                    end: now.saturating_add(ahead),
                    key: SmallVec::from_slice(at.key),
                    receipt,
                });
            }
        }
        Ok(result)
    }

    #[inline]
    fn peek(
        &self,
        at: &RuleKey<'_>,
        now: Nanos,
        cost: u64,
    ) -> Result<Option<Decision>, CheckError> {
        self.store.peek(at, now, cost)
    }

    #[inline]
    fn refund(&self, at: &RuleKey<'_>, now: Nanos, cost: u64, receipt: Receipt) {
        self.store.refund(at, now, cost, receipt);
    }

    #[inline]
    fn next_unit(
        &self,
        at: &RuleKey<'_>,
        now: Nanos,
        decision: &Decision,
    ) -> Option<std::time::Duration> {
        self.store.next_unit(at, now, decision)
    }
}

impl<C: Clock + Clone + 'static> Policy<C> {
    /// Reserves `estimate` units for a request whose actual cost is known only later, now.
    ///
    /// ```
    /// use tollgate_core::ManualClock;
    /// use tollgate_policy::{Policy, PolicyConfig};
    /// let config = PolicyConfig::from_toml(r#"
    ///     [[rules]]
    ///     name = "tokens"
    ///     match = { tenant = "any" }
    ///     key = ["tenant"]
    ///     limit = 1000
    ///     period = "1m"
    ///     capacity = 100
    /// "#)?;
    /// let policy = Policy::with_clock(config, ManualClock::new())?;
    /// let tenant = [("tenant", "acme")];
    /// let reserved = policy.reserve(&tenant, 800)?;
    /// assert!(reserved.decision.is_allowed());
    /// policy.settle(reserved.reservation.unwrap(), 300); // 500 come back
    /// assert!(policy.check(&tenant, 700)?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub fn reserve(
        &self,
        descriptors: &Descriptors<'_>,
        estimate: u64,
    ) -> Result<Reserved, PolicyError> {
        self.reserve_at(descriptors, self.clock.now(), estimate)
    }

    /// [`reserve`](Self::reserve) at an explicit time. The decision is [`check_at`](Self::check_at)'s
    /// for `estimate`, with the same engine: atomic over the request's rules.
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub fn reserve_at(
        &self,
        descriptors: &Descriptors<'_>,
        now: Nanos,
        estimate: u64,
    ) -> Result<Reserved, PolicyError> {
        let live = self.current.load_full();
        // Relaxed: see `set_dry_run`.
        let dry = live.rules.dry_run || self.dry_run.load(Ordering::Relaxed);
        let store = Reserving {
            store: &live.store,
            taken: std::cell::RefCell::new(SmallVec::new()),
        };
        let (decision, _) = engine::decide(
            &live.rules,
            &store,
            descriptors,
            dry,
            now,
            estimate,
            None,
            false,
        )?;
        if !decision.is_allowed() {
            return Ok(Reserved {
                decision,
                reservation: None,
            });
        }
        let taken = store.taken.into_inner();
        Ok(Reserved {
            decision,
            reservation: Some(Reservation {
                live,
                at: now,
                held: estimate,
                reserved: estimate,
                taken,
            }),
        })
    }

    /// Settles `reservation` at `actual` units now (see [`Reservation::settle_at`]).
    pub fn settle(&self, reservation: Reservation, actual: u64) -> Settlement {
        self.settle_at(reservation, self.clock.now(), actual)
    }

    /// [`settle`](Self::settle) at an explicit time; also counts the rules a reload has removed
    /// since the reservation ([`Settlement::stale`]).
    pub fn settle_at(&self, reservation: Reservation, now: Nanos, actual: u64) -> Settlement {
        let current = self.current.load();
        let stale = if Arc::ptr_eq(&reservation.live, &current) {
            0
        } else {
            let names = &reservation.live.rules.rules;
            reservation
                .taken
                .iter()
                .filter(|taken| {
                    let name = names[taken.index].name;
                    !current.rules.rules.iter().any(|rule| rule.name == name)
                })
                .count()
        };
        Settlement {
            stale,
            ..reservation.settle_at(now, actual)
        }
    }
}
