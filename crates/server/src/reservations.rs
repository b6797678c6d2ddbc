//! The reservations `POST /v1/reserve` holds open until `POST /v1/settle`: a bounded table.
//!
//! Envoy's rate-limit filter asks once per request and cannot report a response's cost to the
//! same reservation, so a gateway that learns the cost after the response (LLM tokens, rows,
//! bytes) reserves an estimate here and settles the actual cost by id (tollgate-policy's
//! [`Policy::reserve`](tollgate_policy::Policy::reserve) / [`settle`](tollgate_policy::Policy::settle)).
//!
//! * **Bounded**: at most [`ReservationLimits::max_open`] open at once. A reserve beyond it is
//!   refused before anything is decided (it takes nothing; the server answers 503).
//! * **Expiry**: a reservation not settled within [`ReservationLimits::expiry`] is dropped, which
//!   settles it at its estimate: the units stay taken, so a caller that never settles can never
//!   be admitted more than its estimates. Expired entries go at the next reserve or settle.
//! * **Ids** are 32 hex digits: a sequence number and a keyed hash of it (SipHash under a key
//!   drawn at start), so an id cannot be guessed, and one this process never issued is told apart
//!   from one it issued that is no longer open ([`NotOpen::Unknown`] vs [`NotOpen::Closed`]).
//!   A settled reservation is removed; settling its id again is [`NotOpen::Closed`].

use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use tollgate_policy::Reservation;

use crate::config::ReservationLimits;
use crate::domain::Domain;

/// An open reservation, as [`Reservations::take`] hands it back to be settled.
pub struct Open {
    /// The domain's name.
    pub name: String,
    /// The domain it was reserved in (kept: a reload that replaces it leaves this one to settle).
    pub domain: Arc<Domain>,
    /// The policy's reservation.
    pub reservation: Reservation,
    tag: u64,
    expires: Instant,
}

/// Why [`Reservations::take`] found nothing to settle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotOpen {
    /// Not an id this process issued.
    Unknown,
    /// Issued, but already settled or expired (settled at its estimate).
    Closed,
    /// Issued and expired just now: settled at its estimate.
    Expired,
}

/// Why [`Reservations::slot`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Full {
    /// Reservations open (or being made) when refused.
    pub open: usize,
}

struct Table {
    /// The next sequence number.
    next: u64,
    /// Open reservations by sequence number: issue order, hence (the expiry being fixed at
    /// start) expiry order, up to the moments between reading the clock and taking the lock (an
    /// entry may outlive its expiry by that much before a sweep drops it; a settle checks its
    /// own).
    open: BTreeMap<u64, Open>,
    /// Slots taken by reserves being decided.
    pending: usize,
}

/// The table of open reservations (see the [module docs](self)).
pub struct Reservations {
    limits: ReservationLimits,
    key: std::hash::RandomState,
    table: Mutex<Table>,
}

impl std::fmt::Debug for Reservations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservations")
            .field("limits", &self.limits)
            .field("open", &self.open())
            .finish_non_exhaustive()
    }
}

/// A place in the table for a reservation being decided; [`fill`](Slot::fill) it with the
/// reservation, or drop it (a denial) to give the place back.
#[must_use = "dropping a slot gives its place back"]
pub struct Slot<'t> {
    table: &'t Reservations,
    /// Whether it still holds a pending place (not filled).
    held: bool,
}

impl Reservations {
    /// An empty table.
    pub fn new(limits: ReservationLimits) -> Self {
        Reservations {
            limits,
            key: std::hash::RandomState::new(),
            table: Mutex::new(Table {
                next: 0,
                open: BTreeMap::new(),
                pending: 0,
            }),
        }
    }

    /// The limits it was made with.
    pub fn limits(&self) -> ReservationLimits {
        self.limits
    }

    /// How many are open (expired ones not yet removed included).
    pub fn open(&self) -> usize {
        self.lock().open.len()
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // A panic elsewhere while holding it leaves a consistent table (each change is one map
        // operation), so a poisoned lock is taken as is.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn tag(&self, seq: u64) -> u64 {
        self.key.hash_one(seq)
    }

    /// Takes a place for a reservation about to be made at `now`, after dropping the expired
    /// ones; refused when `max_open` are open or being made.
    ///
    /// # Errors
    /// [`Full`] when the table is full.
    pub fn slot(&self, now: Instant) -> Result<Slot<'_>, Full> {
        let expired;
        let refused = {
            let mut table = self.lock();
            expired = sweep(&mut table, now);
            gauge(&table);
            let open = table.open.len() + table.pending;
            if open >= self.limits.max_open {
                Some(Full { open })
            } else {
                table.pending += 1;
                None
            }
        };
        // Dropped outside the lock: the last reference to a reloaded rule set frees its tables.
        record_expired(expired);
        match refused {
            Some(full) => Err(full),
            None => Ok(Slot {
                table: self,
                held: true,
            }),
        }
    }

    /// Removes the reservation `id` names, to be settled, at `now`.
    ///
    /// # Errors
    /// [`NotOpen`]: an id this process never issued, one settled or expired already, or one
    /// found expired now (dropped: settled at its estimate).
    pub fn take(&self, id: &str, now: Instant) -> Result<Open, NotOpen> {
        let (seq, tag) = parse(id).ok_or(NotOpen::Unknown)?;
        if tag != self.tag(seq) {
            return Err(NotOpen::Unknown);
        }
        let (found, expired) = {
            let mut table = self.lock();
            if seq >= table.next {
                return Err(NotOpen::Unknown);
            }
            let found = table.open.remove(&seq);
            let expired = sweep(&mut table, now);
            gauge(&table);
            (found, expired)
        };
        record_expired(expired);
        match found {
            None => Err(NotOpen::Closed),
            Some(open) if open.expires <= now => {
                debug_assert_eq!(open.tag, tag);
                record_expired(vec![open]);
                Err(NotOpen::Expired)
            }
            Some(open) => Ok(open),
        }
    }
}

impl Slot<'_> {
    /// Holds `reservation` (made in `domain`, named `name`) from `now` until settled or expired;
    /// its id.
    pub fn fill(
        mut self,
        name: &str,
        domain: Arc<Domain>,
        reservation: Reservation,
        now: Instant,
    ) -> String {
        let table = self.table;
        let expires = now.checked_add(table.limits.expiry).unwrap_or(now);
        let seq = {
            let mut inner = table.lock();
            let seq = inner.next;
            inner.next += 1;
            let tag = table.tag(seq);
            inner.open.insert(
                seq,
                Open {
                    name: name.to_owned(),
                    domain,
                    reservation,
                    tag,
                    expires,
                },
            );
            // The slot's place is the entry's now.
            inner.pending = inner.pending.saturating_sub(1);
            gauge(&inner);
            self.held = false;
            seq
        };
        format!("{seq:016x}{:016x}", table.tag(seq))
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if self.held {
            let mut table = self.table.lock();
            table.pending = table.pending.saturating_sub(1);
        }
    }
}

/// `tollgate_server_reservations_open`: the reservations open now (expired ones not yet removed
/// included).
fn gauge(table: &Table) {
    metrics::gauge!("tollgate_server_reservations_open").set(table.open.len() as f64);
}

/// Removes the expired reservations at the front of the table (issue order), returning them to
/// be dropped outside the lock.
fn sweep(table: &mut Table, now: Instant) -> Vec<Open> {
    let mut expired = Vec::new();
    while let Some(entry) = table.open.first_entry() {
        if entry.get().expires > now {
            break;
        }
        expired.push(entry.remove());
    }
    expired
}

/// Drops expired reservations (each settles at its estimate: nothing to do to the state),
/// counting them.
fn record_expired(expired: Vec<Open>) {
    if !expired.is_empty() {
        metrics::counter!("tollgate_server_reservations_expired_total")
            .increment(expired.len() as u64);
        for open in &expired {
            tracing::debug!(
                domain = %open.name,
                estimate = open.reservation.held(),
                "reservation expired unsettled: settled at its estimate"
            );
        }
    }
}

/// `(sequence, tag)` of an id: 32 lowercase or uppercase hex digits.
fn parse(id: &str) -> Option<(u64, u64)> {
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let seq = u64::from_str_radix(&id[..16], 16).ok()?;
    let tag = u64::from_str_radix(&id[16..], 16).ok()?;
    Some((seq, tag))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn table(max_open: usize) -> Reservations {
        Reservations::new(ReservationLimits {
            max_open,
            expiry: Duration::from_secs(60),
        })
    }

    #[test]
    fn a_slot_holds_a_place_until_dropped() {
        let t = table(1);
        let now = Instant::now();
        let slot = t.slot(now).expect("room for one");
        assert_eq!(t.slot(now).err(), Some(Full { open: 1 }));
        drop(slot);
        assert!(t.slot(now).is_ok(), "a dropped slot gives its place back");
    }

    #[test]
    fn ids_never_issued_are_unknown_whatever_their_shape() {
        let t = table(4);
        let now = Instant::now();
        for id in [
            "",
            "x",
            "0000000000000000000000000000000g",
            "000000000000000000000000000000000",
        ] {
            assert_eq!(t.take(id, now).err(), Some(NotOpen::Unknown), "{id:?}");
        }
        // A well-formed id: its tag is right, but its sequence number was never issued.
        let forged = format!("{:016x}{:016x}", 0, t.tag(0));
        assert_eq!(t.take(&forged, now).err(), Some(NotOpen::Unknown));
        // A wrong tag on a sequence number: unknown too (an id cannot be guessed from another).
        let wrong = format!("{:016x}{:016x}", 0, t.tag(0) ^ 1);
        assert_eq!(t.take(&wrong, now).err(), Some(NotOpen::Unknown));
    }

    #[test]
    fn parse_reads_both_halves() {
        assert_eq!(
            parse("00000000000000ff0123456789ABCDEF"),
            Some((255, 0x0123_4567_89ab_cdef))
        );
        assert_eq!(parse("+0000000000000ff0123456789abcdef"), None);
    }
}
