//! Loom models of tollgate-striped's lease protocol: stripes taking, using and giving back leases of
//! one shared GCRA word. Each model checks, after every interleaving, that
//! * nothing is over-admitted at a frozen instant (admitted ≤ burst), and
//! * nothing is lost or invented: every unit the shared word has granted is either admitted, held by
//!   a stripe, or counted as wasted (`admitted + stranded == shared TAT / T`, time frozen at 0).
#![cfg(tollgate_loom)]

use loom::sync::Arc;
use loom::thread;
use tollgate_core::{ManualClock, Nanos, Quota};
use tollgate_striped::{LeaseSize, StripedConfig, StripedLimiter};

const T: Nanos = 100_000_000; // 10 per second

fn limiter(burst: u64, stripes: usize, lease: u64) -> Arc<StripedLimiter<ManualClock>> {
    let quota = Quota::per_second(10).unwrap().with_burst(burst).unwrap();
    let config = StripedConfig::default()
        .stripes(stripes)
        .lease(LeaseSize::Fixed(lease));
    Arc::new(StripedLimiter::with_config(quota, config, ManualClock::new()).unwrap())
}

/// Runs one thread per `(stripe, costs)` entry, each checking its costs at time 0 on its stripe;
/// returns the admitted units.
fn race(limiter: &Arc<StripedLimiter<ManualClock>>, plan: &[(usize, &'static [u64])]) -> u64 {
    let handles: Vec<_> = plan
        .iter()
        .map(|&(stripe, costs)| {
            let limiter = limiter.clone();
            thread::spawn(move || {
                costs
                    .iter()
                    .filter(|&&cost| {
                        limiter
                            .check_on_stripe(stripe, 0, cost)
                            .unwrap()
                            .is_allowed()
                    })
                    .sum::<u64>()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).sum()
}

fn assert_conserved(limiter: &StripedLimiter<ManualClock>, admitted: u64, burst: u64) {
    assert!(admitted <= burst, "admitted {admitted} > burst {burst}");
    let granted = limiter.shared_tat() / T;
    assert_eq!(
        admitted + limiter.stranded_units(),
        granted,
        "admitted {admitted} + stranded {} != granted {granted}",
        limiter.stranded_units()
    );
}

/// Two stripes racing to take leases from a burst of 4 with leases of 2, asking for 6 in all: never
/// more than 4 admitted at the frozen instant, and every granted unit accounted for.
#[test]
fn two_stripes_racing_lease_takes_never_exceed_the_burst() {
    loom::model(|| {
        let l = limiter(4, 2, 2);
        let admitted = race(&l, &[(0, &[1, 1, 1]), (1, &[1, 1, 1])]);
        assert_conserved(&l, admitted, 4);
    });
}

/// Stripe 0 holds a lease with 2 live units and gives them back (a cost-3 request does not fit)
/// while stripe 1 takes its first lease: whichever CAS wins, the returned units are either back in
/// the shared word or counted as wasted — never lost, never granted twice.
#[test]
fn a_give_back_racing_another_stripes_take_loses_nothing() {
    loom::model(|| {
        // Burst 6 over 2 stripes: leases of up to 3.
        let l = limiter(6, 2, 3);
        assert!(l.check_on_stripe(0, 0, 1).unwrap().is_allowed()); // lease [0, 3T), 2 live
        let admitted = 1 + race(&l, &[(0, &[3]), (1, &[1])]);
        assert_conserved(&l, admitted, 6);
    });
}

/// Two unpinned threads sharing one stripe: the fast-path CAS on the lease word races the refill
/// lock; never more than the burst, nothing lost.
#[test]
fn two_threads_sharing_a_stripe_never_exceed_the_burst() {
    loom::model(|| {
        let l = limiter(3, 1, 2);
        let admitted = race(&l, &[(0, &[1, 1]), (0, &[1, 1])]);
        assert_conserved(&l, admitted, 3);
    });
}

// ---- The refill's publication, as the fast-path reader sees it ------------------------------------
//
// A lock holder installs a lease by storing `end` and then the unlocked word (`Release`); a fast-path
// reader loads the word (`Acquire`) and then `end`, and must find an `end` at least as new as the
// word's, or it pairs the new lease's units with an older end: it counts them as expired, retires
// them as wasted, and the instant admits less than it owns. The models below check, at a frozen
// instant, that the threads and a final drain admit *exactly* what the instant owns (the old lease's
// live units plus what the shared word has free), and that nothing was wasted. Each fails when one
// of the orderings it names is weakened to `Relaxed` (see loom-tests/README.md).

/// Checks cost 1 on stripe 0 at `now` until the first denial; returns the admissions.
fn drain(limiter: &StripedLimiter<ManualClock>, now: Nanos) -> u64 {
    let mut admitted = 0;
    while limiter.check_on_stripe(0, now, 1).unwrap().is_allowed() {
        admitted += 1;
    }
    admitted
}

/// Runs one thread per entry of `plan`, each checking its costs on stripe 0 at `now`, then drains the
/// stripe at `now`; returns all admitted units.
fn race_then_drain(
    limiter: &Arc<StripedLimiter<ManualClock>>,
    now: Nanos,
    plan: &[&'static [u64]],
) -> u64 {
    let handles: Vec<_> = plan
        .iter()
        .map(|&costs| {
            let limiter = limiter.clone();
            thread::spawn(move || {
                costs
                    .iter()
                    .filter(|&&cost| limiter.check_on_stripe(0, now, cost).unwrap().is_allowed())
                    .sum::<u64>()
            })
        })
        .collect();
    let raced: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    raced + drain(limiter, now)
}

/// The used-up lease `[0, 3T)` is replaced at 3 T by whichever of two threads locks the stripe; the
/// other reads the new word. The instant owns the whole burst of 4: all 4 admitted, none wasted.
///
/// Fails without: the fast path's `Acquire` load of the word, the refill's `Release` store of the
/// word, or the lock CAS's `Acquire` on failure (a reader whose lock attempt fails on the new word
/// must then read the new `end`).
#[test]
fn a_reader_of_a_replaced_lease_finds_its_end() {
    loom::model(|| {
        let l = limiter(4, 1, 3);
        assert_eq!(drain_n(&l, 0, 3), 3); // lease [0, 3T), used up
        let admitted = race_then_drain(&l, 3 * T, &[&[1], &[1]]);
        assert_eq!(admitted, 4);
        assert_eq!(l.stranded_units(), 0, "units wasted at a frozen instant");
    });
}

/// At 2 T the lease `[0, 3T)` has one live unit (its top position). Thread A takes it on the fast
/// path and then replaces the lease; thread B read the old word, so its fast-path CAS fails on a
/// newer one and must re-read `end` for it. The instant owns 1 + 3 units: all admitted, none wasted.
///
/// Fails without the fast-path CAS's `Acquire` on failure.
#[test]
fn a_reader_whose_cas_fails_on_a_replaced_lease_finds_its_end() {
    loom::model(|| {
        let l = limiter(4, 1, 3);
        assert_eq!(drain_n(&l, 0, 2), 2); // lease [0, 3T), one unit left at [2T, 3T)
        let admitted = race_then_drain(&l, 2 * T, &[&[1, 1], &[1]]);
        assert_eq!(admitted, 4);
        assert_eq!(l.stranded_units(), 0, "units wasted at a frozen instant");
    });
}

/// Thread A takes the only lease (the whole burst of 2) and then asks for 2, which does not fit: its
/// refill is denied and unlocks the stripe keeping the lease's last unit. Thread B, reading that
/// word, must find the lease's `end` (published by A's first refill) to use the unit.
///
/// Fails without the `Release` store that unlocks a denied refill.
#[test]
fn a_reader_after_a_denied_refill_finds_the_kept_lease() {
    loom::model(|| {
        let l = limiter(2, 1, 2);
        let admitted = race_then_drain(&l, 0, &[&[1, 2], &[1]]);
        assert_eq!(admitted, 2);
        assert_eq!(l.stranded_units(), 0, "units wasted at a frozen instant");
    });
}

/// `n` cost-1 checks on stripe 0 at `now` (single-threaded set-up); returns the admissions.
fn drain_n(limiter: &StripedLimiter<ManualClock>, now: Nanos, n: usize) -> u64 {
    (0..n)
        .filter(|_| limiter.check_on_stripe(0, now, 1).unwrap().is_allowed())
        .count() as u64
}

// ---- The cached denial and the alone path ---------------------------------------------------------
//
// A stripe with no unit in its lease answers a denial from the shared word (one load, no lock, no
// CAS); a thread that finds the limiter uncontended decides on the shared word directly (the alone
// path). Neither may admit beyond the burst or lose a unit, and a denial must not outlive the
// refusal it answers: once the shared word frees units (a refund, a give-back), the stripe gets them
// at the same frozen instant.

/// Stripe 0 has used its one-unit lease `[0, T)`; a direct grant of 2 (above the lease size) holds
/// `[T, 3T)`, so the shared word is full. Thread A asks stripe 0 for a unit (the cached denial, or a
/// lease if it sees the refund) while thread B refunds the direct grant. Then stripe 0 is drained
/// at the same instant: A and the drain together must admit exactly the 2 refunded units. A stripe
/// that remembered its refusal (the TAT it was refused at) past the refund would deny them forever
/// at this instant.
#[test]
fn a_cached_denial_does_not_outlive_a_refund() {
    loom::model(|| {
        let l = limiter(3, 2, 1);
        assert!(l.check_on_stripe(0, 0, 1).unwrap().is_allowed()); // lease [0, T), used up
        let (decision, receipt) = l.check_on_stripe_with_receipt(1, 0, 2).unwrap();
        assert!(decision.is_allowed()); // direct: [T, 3T)
        let a = {
            let l = l.clone();
            thread::spawn(move || u64::from(l.check_on_stripe(0, 0, 1).unwrap().is_allowed()))
        };
        let b = {
            let l = l.clone();
            thread::spawn(move || l.refund(receipt, 2))
        };
        let admitted = a.join().unwrap();
        assert!(
            b.join().unwrap(),
            "nothing was granted above the direct grant"
        );
        let admitted = admitted + drain(&l, 0);
        assert_eq!(admitted, 2, "the refunded units, no more, no fewer");
        assert_conserved(&l, 1 + admitted, 3);
    });
}

/// Two threads on stripe 0 at a frozen instant, burst 3, leases of 2: cached denials race the lease
/// refills and the fast-path CAS. Never more than the burst, nothing lost, and the final drain finds
/// every unit the instant owns (no denial while the shared word or the lease holds a unit).
#[test]
fn cached_denials_racing_refills_on_one_stripe_admit_exactly_the_burst() {
    loom::model(|| {
        let l = limiter(3, 1, 2);
        let admitted = race_then_drain(&l, 0, &[&[1, 1], &[1, 1]]);
        assert_eq!(admitted, 3);
        assert_conserved(&l, admitted, 3);
        assert_eq!(l.stranded_units(), 0, "units wasted at a frozen instant");
    });
}

/// Thread A decides on the alone path (plain GCRA on the shared word) while thread B takes a lease
/// on stripe 1 (as a thread arriving on another stripe after contention does): never more than the
/// burst, every granted unit admitted or held, and A's stripe then drains exactly what is left.
#[test]
fn the_alone_path_racing_a_stripe_lease_never_exceeds_the_burst() {
    loom::model(|| {
        let l = limiter(4, 2, 2);
        assert!(l.is_alone());
        let a = {
            let l = l.clone();
            thread::spawn(move || {
                use tollgate_core::Limiter;
                [1, 1]
                    .iter()
                    .filter(|&&cost| l.check_at(0, cost).unwrap().is_allowed())
                    .count() as u64
            })
        };
        let b = {
            let l = l.clone();
            thread::spawn(move || {
                [1, 1]
                    .iter()
                    .filter(|&&cost| l.check_on_stripe(1, 0, cost).unwrap().is_allowed())
                    .count() as u64
            })
        };
        let admitted = a.join().unwrap() + b.join().unwrap();
        assert_conserved(&l, admitted, 4);
        let admitted = admitted + drain(&l, 0);
        // Whatever stripe 1 still holds is the only thing the drain on stripe 0 cannot have.
        assert_eq!(admitted + l.held_units(0), 4);
        assert_conserved(&l, admitted, 4);
    });
}

/// Two threads on the alone path at once: one CAS fails, the limiter leaves the alone path, and the
/// decisions stay exact (burst 2, three requests: exactly 2 admitted).
#[test]
fn two_threads_on_the_alone_path_admit_exactly_the_burst() {
    loom::model(|| {
        let l = limiter(2, 1, 1);
        let handles: Vec<_> = [2usize, 1]
            .iter()
            .map(|&n| {
                let l = l.clone();
                thread::spawn(move || {
                    use tollgate_core::Limiter;
                    (0..n)
                        .filter(|_| l.check_at(0, 1).unwrap().is_allowed())
                        .count() as u64
                })
            })
            .collect();
        let admitted: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(admitted, 2);
        assert_conserved(&l, admitted, 2);
    });
}
