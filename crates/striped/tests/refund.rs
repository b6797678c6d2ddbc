//! `StripedLimiter::refund`: units go back into the lease they came from (or the shared state), so
//! at a frozen instant refunded admissions leave the quota exactly as if they had not come.

use proptest::prelude::*;
use tollgate_core::{Limiter, ManualClock, Quota};
use tollgate_striped::{LeaseReceipt, LeaseSize, StripedConfig, StripedLimiter};

const NOW: u64 = 3_000_000_000;

fn limiter(stripes: usize, lease: u64, burst: u64) -> StripedLimiter<ManualClock> {
    StripedLimiter::with_config(
        Quota::per_second(10).unwrap().with_burst(burst).unwrap(),
        StripedConfig::default()
            .stripes(stripes)
            .lease(LeaseSize::Fixed(lease)),
        ManualClock::new(),
    )
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// One stripe at a frozen instant: with a mix of kept and refunded admissions (lease, refill and
    /// direct paths), every immediate refund succeeds, the quota is never over-admitted, and once it
    /// is drained every unit not kept is one the leases stranded (refunds lose none).
    #[test]
    fn refunds_at_one_instant_on_one_stripe_are_exact(
        ops in prop::collection::vec((1u64..=6, any::<bool>()), 0..40),
        lease in 1u64..=4,
    ) {
        let burst = 20;
        let l = limiter(1, lease, burst);
        let reference = limiter(1, lease, burst);
        let mut kept = 0;
        let mut kept_reference = 0;
        for (cost, refund) in ops {
            let (decision, receipt) = l.check_on_stripe_with_receipt(0, NOW, cost).unwrap();
            if decision.is_allowed() {
                if refund {
                    prop_assert!(l.refund(receipt, cost), "{:?}", receipt);
                    continue;
                }
                kept += cost;
            } else {
                prop_assert_eq!(receipt, LeaseReceipt::Nothing);
            }
            if reference.check_on_stripe(0, NOW, cost).unwrap().is_allowed() {
                kept_reference += cost;
            }
        }
        while l.check_on_stripe(0, NOW, 1).unwrap().is_allowed() {
            kept += 1;
        }
        while reference.check_on_stripe(0, NOW, 1).unwrap().is_allowed() {
            kept_reference += 1;
        }
        // Never over-admits; and every unit not kept is one the limiter counts as stranded (held or
        // wasted by leases), as in the crate's lower bound: refunds lose nothing on top.
        prop_assert!(kept <= burst && kept_reference <= burst);
        prop_assert!(kept + l.stranded_units() >= burst, "{} kept, {} stranded", kept, l.stranded_units());
    }

    /// Several stripes: a refund never over-admits, and units it cannot return (the lease was
    /// replaced) are only ever lost, never invented.
    #[test]
    fn refunds_on_many_stripes_never_over_admit(
        ops in prop::collection::vec((0usize..4, 1u64..=6, 0u8..3), 0..60),
    ) {
        let burst = 24;
        let l = limiter(4, 3, burst);
        let mut pending: Vec<(LeaseReceipt, u64)> = Vec::new();
        let mut kept = 0;
        for (stripe, cost, action) in ops {
            let (decision, receipt) = l.check_on_stripe_with_receipt(stripe, NOW, cost).unwrap();
            if decision.is_allowed() {
                match action {
                    0 => kept += cost,
                    // A refund delayed past other stripes' work: may find its lease replaced.
                    1 => pending.push((receipt, cost)),
                    _ => { l.refund(receipt, cost); }
                }
            }
        }
        for (receipt, cost) in pending {
            l.refund(receipt, cost);
        }
        for stripe in 0..4 {
            while l.check_on_stripe(stripe, NOW, 1).unwrap().is_allowed() {
                kept += 1;
            }
        }
        prop_assert!(kept <= burst, "{} kept of {}", kept, burst);
    }
}

#[test]
fn a_refund_into_a_replaced_lease_gives_nothing_back() {
    let l = limiter(1, 2, 10);
    let (d, receipt) = l.check_on_stripe_with_receipt(0, NOW, 1).unwrap();
    assert!(d.is_allowed());
    // Use the lease up and force a refill: the receipt's generation is gone.
    assert!(l.check_on_stripe(0, NOW, 1).unwrap().is_allowed());
    assert!(l.check_on_stripe(0, NOW, 1).unwrap().is_allowed());
    assert!(!l.refund(receipt, 1));
    // Costs above the lease go to the shared state and come back from it.
    let (d, receipt) = l.check_on_stripe_with_receipt(0, NOW, 5).unwrap();
    assert!(d.is_allowed());
    assert!(matches!(receipt, LeaseReceipt::Shared { .. }));
    assert!(l.refund(receipt, 5));
    assert!(l.check_at(NOW, 5).unwrap().is_allowed());
}
