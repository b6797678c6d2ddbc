//! Reserve, then settle, on the live domains: `POST /v1/reserve` and `POST /v1/settle` (a cost known
//! only after the response; guides/settle.md).

use std::sync::Arc;

use tollgate_http::EdgeVerdict;

use crate::answer::{Answer, answer};
use crate::charge;
use crate::domain::DomainPolicy;
use crate::request::{RequestError, validate};
use crate::reservations::{Full, NotOpen, Reservations};
use crate::service::LiveDomains;

/// Why a reservation could not be made (answered with an error, not a decision).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReserveError {
    /// As a check's: an unknown domain or a malformed request.
    Check(RequestError),
    /// The domain is on Redis, where reservations are not built yet.
    OnRedis(String),
    /// The table of open reservations is full ([`Full`]); nothing was decided.
    Full(Full),
}

/// What [`LiveDomains::reserve`] answers: the decision and, when admitted, the reservation's id.
pub struct ReserveAnswer {
    /// The decision, as [`LiveDomains::check`] would answer it for the estimate.
    pub answer: Answer,
    /// The id to settle with, when admitted.
    pub id: Option<String>,
    /// The estimate reserved.
    pub estimate: u64,
}

/// What [`LiveDomains::settle`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SettleAnswer {
    /// The policy's settlement. Its `stale` counts the rules a reload has removed since the
    /// reservation (settling them changed nothing any decision reads); all of them when the
    /// domain itself was removed or rebuilt.
    pub settlement: tollgate_policy::Settlement,
}

impl LiveDomains {
    /// Reserves `estimate` units for one descriptor of an embedded domain, now: the decision is
    /// the one [`check`](Self::check) would give for the estimate (every rule that applies,
    /// decided as one) and, when admitted, the reservation is held in the bounded table until
    /// [`settle`](Self::settle)d or expired (see [`crate::reservations`]).
    ///
    /// # Errors
    /// [`ReserveError`]: an unknown domain, a malformed request (more than one descriptor
    /// included), a domain on Redis, or a full table; nothing is consumed.
    pub fn reserve(
        &self,
        domain: &str,
        descriptors: &[(Vec<(&str, &str)>, u64)],
    ) -> Result<ReserveAnswer, ReserveError> {
        validate(domain, descriptors).map_err(ReserveError::Check)?;
        let [(entries, estimate)] = descriptors else {
            return Err(ReserveError::Check(RequestError::Malformed(
                "a reservation takes exactly one descriptor".into(),
            )));
        };
        if charge::is_charge(entries).map_err(ReserveError::Check)? {
            return Err(ReserveError::Check(RequestError::Malformed(
                "a reservation takes a decision, not a charge".into(),
            )));
        }
        let estimate = (*estimate).max(1);
        let dom = {
            let domains = self.domains.load();
            let Some(dom) = domains.get(domain) else {
                return Err(ReserveError::Check(RequestError::UnknownDomain(
                    domain.to_owned(),
                )));
            };
            Arc::clone(dom)
        };
        let DomainPolicy::Embedded(policy) = &dom.policy else {
            return Err(ReserveError::OnRedis(domain.to_owned()));
        };
        // The place first: a full table refuses before anything is taken.
        let slot = self
            .reservations
            .slot(std::time::Instant::now())
            .map_err(ReserveError::Full)?;
        let now = policy.now();
        let (checked, reservation) = match policy.reserve_at(entries, now, estimate) {
            Ok(reserved) => (Ok((reserved.decision, None)), reserved.reservation),
            Err(error) => (Err(error), None),
        };
        let rule = checked.as_ref().ok().and_then(|(d, _)| d.rule);
        let verdict = EdgeVerdict::of_check(checked, estimate, &dom.fields, |units| {
            policy.peek_rule_at(rule?, entries, now, units)?.ok()
        });
        let answer = answer(&dom, vec![verdict]);
        let id = reservation.map(|reservation| {
            slot.fill(
                domain,
                Arc::clone(&dom),
                reservation,
                std::time::Instant::now(),
            )
        });
        Ok(ReserveAnswer {
            answer,
            id,
            estimate,
        })
    }

    /// Settles the reservation `id` at `actual` units now (tollgate-policy's
    /// [`Policy::settle`](tollgate_policy::Policy::settle)): the surplus is given back, or the difference charged (a key with
    /// nothing left goes into debt). A rule a reload has removed since is settled into the state
    /// it had: a no-op, counted in the settlement's `stale`.
    ///
    /// # Errors
    /// [`NotOpen`]: an id never issued, or one already settled or expired (an expired one was
    /// settled at its estimate). Nothing changes.
    pub fn settle(&self, id: &str, actual: u64) -> Result<SettleAnswer, NotOpen> {
        let open = self.reservations.take(id, std::time::Instant::now())?;
        let current = self
            .domains
            .load()
            .get(&open.name)
            .is_some_and(|dom| Arc::ptr_eq(dom, &open.domain));
        let DomainPolicy::Embedded(policy) = &open.domain.policy else {
            // Only embedded domains reserve, and a domain's policy never changes backend (a
            // domain that does is rebuilt whole): not reached. Dropping settles at the estimate.
            return Err(NotOpen::Closed);
        };
        let mut settlement = policy.settle(open.reservation, actual);
        if !current {
            settlement.stale = settlement.rules;
        }
        Ok(SettleAnswer { settlement })
    }

    /// The open reservations' table.
    pub fn reservations(&self) -> &Reservations {
        &self.reservations
    }
}
