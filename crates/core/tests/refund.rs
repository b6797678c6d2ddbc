//! Property tests of `Algorithm::refund`: undoing an admission leaves a state that decides every
//! later request exactly as if the request had never come (at the admission's own `now`, with other
//! admissions in between), and never a looser one (later times, clocks gone backwards). Fake time only.

use std::time::Duration;

use proptest::prelude::*;
use tollgate_core::{
    Algorithm, FixedWindow, Gcra, GcraLimiter, LeakyBucket, Limiter, ManualClock, Nanos, Quota,
    SlidingWindow,
};

/// A quota with small limits and periods from 1 ms to 5 s, not always round.
fn quota() -> impl Strategy<Value = Quota> {
    (1u64..=40, 1u64..=5_000, 0u64..1_000_000, 1u64..=60).prop_map(
        |(limit, period_ms, extra_ns, burst)| {
            Quota::per(
                Duration::from_nanos(period_ms * 1_000_000 + extra_ns),
                limit,
            )
            .and_then(|q| q.with_burst(burst))
            .expect("valid by construction")
        },
    )
}

/// What a scenario is made of: a warm-up trace, then the refunded request among other requests.
#[derive(Clone, Debug)]
struct Scenario {
    /// (time step in 1/64ths of the period, raw cost) pairs that build the starting state.
    warmup: Vec<(u64, u64)>,
    /// Step from the end of the warm-up to the refunded request's `now`.
    gap: u64,
    /// Raw cost of the refunded request.
    cost: u64,
    /// Other requests: (step after `now` in 1/64ths of the period, raw cost, before the request?).
    others: Vec<(u64, u64, bool)>,
    /// Probes decided on both states afterwards: (step in 1/64ths, raw cost).
    probes: Vec<(u64, u64)>,
}

fn scenario(max_other_step: u64) -> impl Strategy<Value = Scenario> {
    (
        prop::collection::vec((0u64..=100, 0u64..=64), 0..30),
        0u64..=100,
        1u64..=64,
        prop::collection::vec((0u64..=max_other_step, 0u64..=64, any::<bool>()), 0..6),
        prop::collection::vec((0u64..=160, 1u64..=64), 1..12),
    )
        .prop_map(|(warmup, gap, cost, others, probes)| Scenario {
            warmup,
            gap,
            cost,
            others,
            probes,
        })
}

fn unit(alg: &impl Algorithm) -> Nanos {
    (alg.quota().period_nanos() / 64).max(1)
}

fn scaled(raw: u64, capacity: u64) -> u64 {
    raw % (capacity + 1)
}

/// Decides `cost` at `now`, returning the new state and whether it was admitted.
fn step<A: Algorithm>(alg: &A, state: u64, now: Nanos, cost: u64) -> (u64, bool) {
    let t = alg.decide(state, now, cost).expect("costs are scaled");
    (t.next.unwrap_or(state), t.decision.is_allowed())
}

/// The outcome of a scenario: the state with the request refunded, the reference state (the same
/// admitted traffic without the request), and the time of the last request.
struct Outcome {
    refunded: u64,
    reference: u64,
    last: Nanos,
    admitted: bool,
}

/// Runs the scenario on both worlds. Others after `now` in time come after the request in order;
/// others at step 0 may come before or after it (the flag).
fn play<A: Algorithm>(alg: &A, s: &Scenario) -> Outcome {
    let u = unit(alg);
    let cap = alg.capacity();
    let mut state = 0;
    let mut t = 0;
    for &(dt, raw) in &s.warmup {
        t += dt * u;
        state = step(alg, state, t, scaled(raw, cap)).0;
    }
    let now = t + s.gap * u;
    let cost = scaled(s.cost, cap).max(1);
    let start = state;
    let mut others: Vec<(Nanos, u64, bool)> = s
        .others
        .iter()
        .map(|&(dt, raw, before)| (now + dt * u, scaled(raw, cap), before && dt == 0))
        .collect();
    others.sort_by_key(|&(at, _, before)| (at, !before));
    // With the request: the others before it, the request, the others after it, then the refund.
    let mut with = start;
    let mut admitted_others = Vec::new();
    let mut admitted = false;
    let mut done = false;
    for &(at, c, before) in &others {
        if !before && !done {
            let (next, ok) = step(alg, with, now, cost);
            with = next;
            admitted = ok;
            done = true;
        }
        let (next, ok) = step(alg, with, at, c);
        with = next;
        if ok {
            admitted_others.push((at, c));
        }
    }
    if !done {
        let (next, ok) = step(alg, with, now, cost);
        with = next;
        admitted = ok;
    }
    if admitted {
        with = alg.refund(with, now, cost).unwrap_or(with);
    }
    // Without it: the same admitted others only.
    let mut reference = start;
    for &(at, c) in &admitted_others {
        let (next, ok) = step(alg, reference, at, c);
        assert!(
            ok,
            "an admission with the request present is one without it"
        );
        reference = next;
    }
    let last = others.last().map_or(now, |&(at, _, _)| at.max(now));
    Outcome {
        refunded: with,
        reference,
        last,
        admitted,
    }
}

/// Every probe sequence decides identically from both states.
fn same_future<A: Algorithm>(
    alg: &A,
    o: &Outcome,
    probes: &[(u64, u64)],
) -> Result<(), TestCaseError> {
    let u = unit(alg);
    let (mut a, mut b, mut t) = (o.refunded, o.reference, o.last);
    for &(dt, raw) in probes {
        t += dt * u;
        let cost = scaled(raw, alg.capacity()).max(1);
        let ta = alg.decide(a, t, cost).unwrap();
        let tb = alg.decide(b, t, cost).unwrap();
        prop_assert_eq!(ta.decision, tb.decision, "probe at {} cost {}", t, cost);
        a = ta.next.unwrap_or(a);
        b = tb.next.unwrap_or(b);
    }
    Ok(())
}

/// Each probe, alone, is admitted from the refunded state only if it is from the reference.
fn never_looser<A: Algorithm>(
    alg: &A,
    o: &Outcome,
    probes: &[(u64, u64)],
) -> Result<(), TestCaseError> {
    let u = unit(alg);
    let mut t = o.last;
    for &(dt, raw) in probes {
        t += dt * u;
        let cost = scaled(raw, alg.capacity()).max(1);
        if alg
            .decide(o.refunded, t, cost)
            .unwrap()
            .decision
            .is_allowed()
        {
            prop_assert!(
                alg.decide(o.reference, t, cost)
                    .unwrap()
                    .decision
                    .is_allowed(),
                "refund looser than the request never coming: probe at {} cost {}",
                t,
                cost
            );
        }
    }
    Ok(())
}

fn exact_at_one_instant<A: Algorithm>(alg: &A, s: &Scenario) -> Result<(), TestCaseError> {
    let o = play(alg, s);
    same_future(alg, &o, &s.probes)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Other admissions at the refunded request's own `now` (before or after it): exact for all four.
    #[test]
    fn refund_at_the_admissions_instant_is_exact(q in quota(), s in scenario(0)) {
        exact_at_one_instant(&Gcra::from_quota(q).unwrap(), &s)?;
        exact_at_one_instant(&LeakyBucket::from_quota(q).unwrap(), &s)?;
        if let Ok(fw) = FixedWindow::from_quota(q) {
            exact_at_one_instant(&fw, &s)?;
        }
        if let Ok(sw) = SlidingWindow::from_quota(q) {
            exact_at_one_instant(&sw, &s)?;
        }
    }

    /// Other admissions at later times between the admission and its refund: the window algorithms
    /// stay exact (the count moves to `previous` or ages out).
    #[test]
    fn window_refunds_stay_exact_across_later_admissions(q in quota(), s in scenario(160)) {
        if let Ok(fw) = FixedWindow::from_quota(q) {
            exact_at_one_instant(&fw, &s)?;
        }
        if let Ok(sw) = SlidingWindow::from_quota(q) {
            exact_at_one_instant(&sw, &s)?;
        }
    }

    /// GCRA with later admissions in between: never stricter than the reference TAT, never looser by
    /// more than the refunded cost, and exact unless some admission came after `now + cost × T`.
    #[test]
    fn gcra_refund_across_later_admissions_is_bounded_by_its_cost(q in quota(), s in scenario(160)) {
        let gcra = Gcra::from_quota(q).unwrap();
        let o = play(&gcra, &s);
        prop_assume!(o.admitted);
        let cost = scaled(s.cost, gcra.capacity()).max(1);
        let floor = |tat: u64| tat.max(o.last);
        prop_assert!(floor(o.refunded) <= floor(o.reference));
        prop_assert!(floor(o.refunded) + cost * gcra.interval() >= floor(o.reference));
        never_looser_by_cost(&gcra, &o, cost)?;
    }

    /// A clock gone backwards before the admission: the refund is never looser than the request never
    /// coming, for every algorithm.
    #[test]
    fn refund_after_a_backwards_clock_is_never_looser(q in quota(), s in scenario(0), back in 1u64..=200) {
        let mut s = s;
        // Run the request `back` units before the warm-up's end.
        s.gap = 0;
        s.others.clear();
        let check = |alg: &dyn Fn(&Scenario) -> Result<(), TestCaseError>| alg(&s);
        check(&|s| backwards(&Gcra::from_quota(q).unwrap(), s, back))?;
        if let Ok(fw) = FixedWindow::from_quota(q) {
            check(&|s| backwards(&fw, s, back))?;
        }
        if let Ok(sw) = SlidingWindow::from_quota(q) {
            check(&|s| backwards(&sw, s, back))?;
        }
    }
}

/// GCRA's stated looseness: a probe admitted from the refunded state is admitted from the reference
/// when it costs `cost` less.
fn never_looser_by_cost(gcra: &Gcra, o: &Outcome, cost: u64) -> Result<(), TestCaseError> {
    for c in 1..=gcra.capacity() {
        if gcra
            .decide(o.refunded, o.last, c)
            .unwrap()
            .decision
            .is_allowed()
            && c > cost
        {
            prop_assert!(
                gcra.decide(o.reference, o.last, c - cost)
                    .unwrap()
                    .decision
                    .is_allowed()
            );
        }
    }
    Ok(())
}

fn backwards<A: Algorithm>(alg: &A, s: &Scenario, back: u64) -> Result<(), TestCaseError> {
    let u = unit(alg);
    let cap = alg.capacity();
    let mut state = 0;
    let mut t = 0;
    for &(dt, raw) in &s.warmup {
        t += dt * u;
        state = step(alg, state, t, scaled(raw, cap)).0;
    }
    let now = t.saturating_sub(back * u);
    let cost = scaled(s.cost, cap).max(1);
    let (with, admitted) = step(alg, state, now, cost);
    let refunded = if admitted {
        alg.refund(with, now, cost).unwrap_or(with)
    } else {
        with
    };
    let o = Outcome {
        refunded,
        reference: state,
        last: t,
        admitted,
    };
    never_looser(alg, &o, &s.probes)
}

#[test]
fn a_limiter_refund_goes_through_the_cas_loop_and_restores_the_burst() {
    let clock = ManualClock::new();
    let limiter =
        GcraLimiter::with_clock(Quota::per_second(10).unwrap().with_burst(3).unwrap(), clock)
            .unwrap();
    let now = 5_000_000_000;
    for _ in 0..3 {
        assert!(limiter.check_at(now, 1).unwrap().is_allowed());
    }
    assert!(!limiter.check_at(now, 1).unwrap().is_allowed());
    assert!(limiter.refund_at(now, 2));
    assert!(limiter.check_at(now, 2).unwrap().is_allowed());
    assert!(!limiter.check_at(now, 1).unwrap().is_allowed());
    // Nothing to give back on a fresh limiter.
    let fresh =
        GcraLimiter::with_clock(Quota::per_second(10).unwrap(), ManualClock::new()).unwrap();
    assert!(!fresh.refund_at(now, 1));
    assert_eq!(fresh.state_word(), 0);
}

#[test]
fn a_gcra_refund_raced_by_a_much_later_admission_frees_at_most_its_cost() {
    // The documented inexact case: 1 unit at t = 0 (TAT = T), then another at 5T (TAT = 6T), then the
    // first is refunded at its own now: TAT = 5T, while without it TAT would be 6T: one unit looser.
    let gcra = Gcra::from_quota(Quota::per_second(10).unwrap().with_burst(1).unwrap()).unwrap();
    let t = gcra.interval();
    let (s1, ok) = step(&gcra, 0, 0, 1);
    assert!(ok);
    let (s2, ok) = step(&gcra, s1, 5 * t, 1);
    assert!(ok);
    assert_eq!(s2, 6 * t);
    let refunded = gcra.refund(s2, 0, 1).unwrap();
    assert_eq!(refunded, 5 * t);
    assert_eq!(6 * t - refunded, t, "looser by exactly the refunded cost");
}

/// GCRA's decisions without its refund: an algorithm that keeps the trait's default.
#[derive(Clone, Debug)]
struct NoRefund(Gcra);

impl Algorithm for NoRefund {
    const NAME: &'static str = "no_refund";

    fn from_quota(quota: Quota) -> Result<Self, tollgate_core::QuotaError> {
        Gcra::from_quota(quota).map(NoRefund)
    }

    fn quota(&self) -> &Quota {
        self.0.quota()
    }

    fn capacity(&self) -> u64 {
        self.0.capacity()
    }

    fn decide(
        &self,
        state: u64,
        now: Nanos,
        cost: u64,
    ) -> Result<tollgate_core::Transition, tollgate_core::CheckError> {
        self.0.decide(state, now, cost)
    }

    fn is_fresh(&self, state: u64, now: Nanos) -> bool {
        self.0.is_fresh(state, now)
    }
    fn charge(&self, state: u64, now: Nanos, cost: u64) -> Option<u64> {
        self.0.charge(state, now, cost)
    }
}

#[test]
fn the_default_refund_gives_nothing_back_and_writes_nothing() {
    let alg = NoRefund::from_quota(Quota::per_second(10).unwrap().with_burst(2).unwrap()).unwrap();
    let now = 1_000_000_000;
    let limiter = tollgate_core::AtomicLimiter::from_algorithm(alg.clone(), ManualClock::new());
    assert!(limiter.check_at(now, 2).unwrap().is_allowed());
    let word = limiter.state_word();
    assert_ne!(word, 0);
    for state in [0, 1, word] {
        assert_eq!(alg.refund(state, now, 1), None);
    }
    assert!(!limiter.refund_at(now, 2), "nothing to give back");
    assert_eq!(limiter.state_word(), word, "the word is untouched");
    assert!(!limiter.check_at(now, 1).unwrap().is_allowed());
}
