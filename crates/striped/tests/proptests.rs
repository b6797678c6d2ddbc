//! Property tests: multi-stripe traces against the exact GCRA.
//!
//! A trace is a list of events (stripe, time step, cost) on a manual time line. Inequalities tested:
//! 1. **Conformance** (any costs): an exact GCRA fed only the striped limiter's admitted requests
//!    admits every one of them — the striped limiter never over-admits.
//! 2. **Unit costs, every prefix:** `admitted_striped ≤ admitted_exact` (greedy exact GCRA on the whole
//!    trace), and `admitted_striped ≥ admitted_exact − stranded`, where `stranded` is the units held
//!    in stripe words plus units wasted so far (`stranded_units()`); held units are at most
//!    `max_lease × stripes`.
//! 3. **Release:** once time reaches the shared TAT (every lease's end), the full burst is admitted.

use proptest::prelude::*;
use tollgate_core::{Algorithm, Gcra, ManualClock, Nanos, Quota};
use tollgate_striped::{LeaseSize, StripedConfig, StripedLimiter};

const T: Nanos = 100_000_000; // 10 per second

fn lease() -> impl Strategy<Value = LeaseSize> {
    prop_oneof![
        (1u64..8).prop_map(LeaseSize::Fixed),
        (1u64..16).prop_map(|max| LeaseSize::Adaptive { max }),
    ]
}

fn trace(max_cost: u64) -> impl Strategy<Value = Vec<(usize, Nanos, u64)>> {
    prop::collection::vec((0usize..4, 0..3 * T, 1..=max_cost), 1..300)
}

fn build(burst: u64, stripes: usize, lease: LeaseSize) -> StripedLimiter<ManualClock> {
    let quota = Quota::per_second(10).unwrap().with_burst(burst).unwrap();
    let config = StripedConfig::default().stripes(stripes).lease(lease);
    StripedLimiter::with_config(quota, config, ManualClock::new()).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn admitted_stream_conforms_to_exact_gcra(
        burst in 1u64..20, stripes in 1usize..=4, lease in lease(), events in trace(4),
    ) {
        let limiter = build(burst, stripes, lease);
        let exact = Gcra::from_quota(*limiter.gcra().quota()).unwrap();
        let mut reference = 0u64;
        let mut now = 0;
        for (stripe, step, cost) in events {
            now += step;
            let cost = cost.min(burst);
            if limiter.check_on_stripe(stripe, now, cost).unwrap().is_allowed() {
                let t = exact.decide(reference, now, cost).unwrap();
                prop_assert!(t.decision.is_allowed(), "over-admitted cost {} at {}", cost, now);
                reference = t.next.unwrap_or(reference);
            }
        }
        // Release: at the shared TAT every lease has ended; the whole burst is free again.
        let end = limiter.shared_tat().max(now);
        prop_assert_eq!(limiter.held_units(end), 0);
        prop_assert!(limiter.check_on_stripe(0, end, burst).unwrap().is_allowed());
    }

    #[test]
    fn unit_costs_stay_between_exact_and_exact_minus_stranded(
        burst in 1u64..20, stripes in 1usize..=4, lease in lease(), events in trace(1),
    ) {
        let limiter = build(burst, stripes, lease);
        let exact = Gcra::from_quota(*limiter.gcra().quota()).unwrap();
        let (mut exact_tat, mut exact_admitted, mut striped_admitted) = (0u64, 0u64, 0u64);
        let mut now = 0;
        for (stripe, step, _) in events {
            now += step;
            let t = exact.decide(exact_tat, now, 1).unwrap();
            if t.decision.is_allowed() {
                exact_admitted += 1;
                exact_tat = t.next.unwrap_or(exact_tat);
            }
            if limiter.check_on_stripe(stripe, now, 1).unwrap().is_allowed() {
                striped_admitted += 1;
            }
            prop_assert!(striped_admitted <= exact_admitted);
            prop_assert!(
                striped_admitted + limiter.stranded_units() >= exact_admitted,
                "striped {} + stranded {} < exact {}", striped_admitted, limiter.stranded_units(), exact_admitted
            );
            prop_assert!(limiter.held_units(now) <= limiter.max_lease() * limiter.stripes() as u64);
        }
    }
}
