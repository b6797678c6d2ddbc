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
