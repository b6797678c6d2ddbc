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
use tollgate_core::{Algorithm, Clock, Gcra, Limiter, ManualClock, Nanos, Quota};
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

/// A limiter on one thread, on the default config (the alone path), for `decisions_alone_*`.
fn alone(burst: u64) -> (StripedLimiter<ManualClock>, ManualClock) {
    let quota = Quota::per_second(10).unwrap().with_burst(burst).unwrap();
    let clock = ManualClock::new();
    let config = StripedConfig::default().stripes(4);
    let limiter = StripedLimiter::with_config(quota, config, clock.clone()).unwrap();
    (limiter, clock)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// One thread alone decides on the shared word: every decision, allowed or denied, with its
    /// `remaining`, `retry_after` and `reset_after`, is the lone `GcraLimiter`'s.
    #[test]
    fn one_thread_alone_decides_as_a_lone_gcra(burst in 1u64..20, events in trace(6)) {
        let (limiter, clock) = alone(burst);
        let lone = tollgate_core::GcraLimiter::with_clock(*limiter.gcra().quota(), clock.clone()).unwrap();
        for (_, step, cost) in events {
            clock.advance(std::time::Duration::from_nanos(step));
            let cost = cost.min(burst);
            prop_assert_eq!(limiter.check_n(cost).unwrap(), lone.check_n(cost).unwrap());
            prop_assert!(limiter.is_alone());
        }
    }

    /// A stripe with one-unit leases holds nothing between requests, so every denial is the cached
    /// one (answered from the shared word without locking) and every admission a one-unit lease:
    /// decision for decision the lone `GcraLimiter`'s, denials included (their `retry_after` and
    /// `reset_after` too).
    #[test]
    fn cached_denials_on_a_stripe_decide_as_a_lone_gcra(
        burst in 1u64..20, stripes in 1usize..=4, events in trace(1),
    ) {
        let limiter = build(burst, stripes, LeaseSize::Fixed(1));
        let exact = Gcra::from_quota(*limiter.gcra().quota()).unwrap();
        let mut reference = 0u64;
        let mut now = 0;
        for (stripe, step, cost) in events {
            now += step;
            let t = exact.decide(reference, now, cost).unwrap();
            reference = t.next.unwrap_or(reference);
            prop_assert_eq!(limiter.check_on_stripe(stripe, now, cost).unwrap(), t.decision);
        }
    }

    /// Contention (a failed CAS on the alone path, forced here) sends decisions to the stripes; one
    /// thread taking leases with nobody else on the shared word returns to the alone path after a
    /// few refills, and the decisions stay within the exact GCRA's bound throughout.
    #[test]
    fn a_lone_thread_returns_to_the_alone_path(burst in 8u64..40, steps in prop::collection::vec(0..3 * T, 40..200)) {
        let (limiter, clock) = alone(burst);
        limiter.mark_contended();
        prop_assert!(!limiter.is_alone());
        let exact = Gcra::from_quota(*limiter.gcra().quota()).unwrap();
        let mut reference = 0u64;
        let mut refills_possible = 0u64;
        for step in steps {
            clock.advance(std::time::Duration::from_nanos(step));
            let was_alone = limiter.is_alone();
            if limiter.check().is_allowed() {
                let t = exact.decide(reference, clock.now(), 1).unwrap();
                prop_assert!(t.decision.is_allowed(), "over-admitted at {}", clock.now());
                reference = t.next.unwrap_or(reference);
                if !was_alone {
                    refills_possible += 1;
                }
            }
        }
        // Admissions on the stripe path with one lease size of at most `burst / 16` units: well
        // over four refills happened, so the limiter is alone again.
        if refills_possible >= 4 * limiter.max_lease() + 4 {
            prop_assert!(limiter.is_alone());
        }
    }
}
