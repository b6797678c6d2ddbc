//! Property tests: every algorithm against a plain reference model over random traces of
//! (time step, cost), with the stated bounds checked on the admitted traffic. Fake time only.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use tollgate_core::algorithm::fixed_window::{FixedLayout, FixedState};
use tollgate_core::algorithm::sliding_window::{SlidingLayout, SlidingState};
use tollgate_core::{
    Algorithm, CheckError, Decision, FixedWindow, Gcra, LeakyBucket, Limiter, ManualClock, Nanos,
    Quota, SlidingLog, SlidingWindow,
};

// ---------------------------------------------------------------- inputs

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

/// (time step as a fraction of the period in 1/64ths, cost) pairs; costs may exceed capacity.
fn trace() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0u64..=160, 0u64..=64), 1..120)
}

/// Turns steps into absolute times for `quota`, starting at `start`.
fn times(quota: &Quota, steps: &[(u64, u64)], start: Nanos) -> Vec<(Nanos, u64)> {
    let unit = quota.period_nanos() / 64;
    let mut now = start;
    steps
        .iter()
        .map(|&(step, cost)| {
            now += step * unit + step % 7; // a few odd nanoseconds, too
            (now, cost)
        })
        .collect()
}

/// Cost scaled into 0..=capacity+1 so most requests are valid and some are not.
fn scaled_cost(raw: u64, capacity: u64) -> u64 {
    raw % (capacity + 2)
}

// ---------------------------------------------------------------- reference models

/// A leaky bucket kept as a water level in nanoseconds of work, drained by elapsed time.
struct WaterLevel {
    level: u64,
    last: Nanos,
    interval: Nanos,
    depth: Nanos,
}

impl WaterLevel {
    fn new(quota: &Quota) -> Self {
        WaterLevel {
            level: 0,
            last: 0,
            interval: quota.emission_interval_nanos(),
            depth: quota.burst_nanos(),
        }
    }

    fn decide(&mut self, now: Nanos, cost: u64) -> Decision {
        self.level = self.level.saturating_sub(now - self.last);
        self.last = now;
        let need = self.level + cost * self.interval;
        if need <= self.depth {
            if cost > 0 {
                self.level = need;
            }
            Decision::allowed((self.depth - need) / self.interval, need)
        } else {
            Decision::denied(need - self.depth, self.level)
        }
    }
}

/// Fixed windows as a map from window index to count.
struct WindowCounts {
    counts: HashMap<u64, u64>,
    window: Nanos,
    limit: u64,
}

impl WindowCounts {
    fn new(quota: &Quota) -> Self {
        WindowCounts {
            counts: HashMap::new(),
            window: quota.period_nanos(),
            limit: quota.limit(),
        }
    }

    fn count(&self, index: u64) -> u64 {
        self.counts.get(&index).copied().unwrap_or(0)
    }

    fn fixed(&mut self, now: Nanos, cost: u64) -> Decision {
        let index = now / self.window;
        let used = self.count(index) + cost;
        let until_end = (index + 1) * self.window - now;
        if used > self.limit {
            return Decision::denied(until_end, until_end);
        }
        *self.counts.entry(index).or_default() += cost;
        Decision::allowed(self.limit - used, if used == 0 { 0 } else { until_end })
    }

    /// The sliding counter's estimate with exact rational weighting, rounded up.
    fn sliding(&mut self, now: Nanos, cost: u64) -> (bool, u64, Nanos) {
        let w = self.window;
        let index = now / w;
        let elapsed = now % w;
        let (previous, current) = (self.count(index.wrapping_sub(1)), self.count(index));
        let weighted = (u128::from(previous) * u128::from(w - elapsed)).div_ceil(u128::from(w));
        let estimate = current + weighted as u64;
        let allowed = estimate + cost <= self.limit;
        if allowed {
            *self.counts.entry(index).or_default() += cost;
        }
        let current = self.count(index);
        let reset = if current > 0 {
            2 * w - elapsed
        } else if previous > 0 {
            w - elapsed
        } else {
            0
        };
        let remaining = if allowed {
            self.limit - estimate - cost
        } else {
            0
        };
        (allowed, remaining, reset)
    }
}

/// The exact log: one timestamp per admitted unit.
struct ExactLog {
    stamps: Vec<Nanos>,
    window: Nanos,
    limit: u64,
}

impl ExactLog {
    fn live(&self, now: Nanos) -> u64 {
        self.stamps
            .iter()
            .filter(|&&t| t + self.window > now)
            .count() as u64
    }

    fn decide(&mut self, now: Nanos, cost: u64) -> (bool, Option<Nanos>) {
        if self.live(now) + cost <= self.limit {
            self.stamps.extend(std::iter::repeat_n(now, cost as usize));
            return (true, None);
        }
        // Earliest instant at which enough units have left the window.
        let retry = self
            .stamps
            .iter()
            .map(|&t| t + self.window)
            .filter(|&at| at > now && self.live(at) + cost <= self.limit)
            .min()
            .expect("cost <= limit, so once every unit has left it fits");
        (false, Some(retry - now))
    }
}

// ---------------------------------------------------------------- shared checks

/// Admitted (time, cost) pairs of a run.
type Admitted = Vec<(Nanos, u64)>;

/// Runs `alg` over `trace`, asserting errors exactly for costs above capacity and that denials never
/// write; calls `check` with each decision; returns the admitted traffic and the final state.
fn run<A: Algorithm>(
    alg: &A,
    trace: &[(Nanos, u64)],
    mut check: impl FnMut(u64, Nanos, u64, &Decision) -> Result<(), TestCaseError>,
) -> Result<(Admitted, u64), TestCaseError> {
    let mut state = 0;
    let mut admitted = Vec::new();
    for &(now, raw) in trace {
        let cost = scaled_cost(raw, alg.capacity());
        match alg.decide(state, now, cost) {
            Err(e) => {
                prop_assert!(cost > alg.capacity());
                prop_assert_eq!(
                    e,
                    CheckError::CostExceedsCapacity {
                        cost,
                        capacity: alg.capacity()
                    }
                );
            }
            Ok(t) => {
                prop_assert!(cost <= alg.capacity());
                check(state, now, cost, &t.decision)?;
                if t.decision.is_allowed() {
                    admitted.push((now, cost));
                } else {
                    prop_assert_eq!(t.next, None, "a denial wrote");
                }
                if let Some(next) = t.next {
                    state = next;
                }
            }
        }
    }
    Ok((admitted, state))
}

/// `retry_after` is exact: the same request passes at `now + retry_after` and not a nanosecond sooner.
fn retry_is_exact<A: Algorithm>(
    alg: &A,
    state: u64,
    now: Nanos,
    cost: u64,
    decision: &Decision,
) -> Result<(), TestCaseError> {
    if let Some(retry) = decision.retry_after() {
        let at = now + retry.as_nanos() as u64;
        prop_assert!(alg.decide(state, at, cost).unwrap().decision.is_allowed());
        prop_assert!(retry > Duration::ZERO);
        prop_assert!(
            !alg.decide(state, at - 1, cost)
                .unwrap()
                .decision
                .is_allowed()
        );
    }
    Ok(())
}

/// Bucket bound: in every interval `[t_i, t_j]`, admitted ≤ burst + limit × (t_j − t_i) / period.
fn bucket_bound(quota: &Quota, admitted: &Admitted) -> Result<(), TestCaseError> {
    for i in 0..admitted.len() {
        let mut sum = 0u128;
        for &(t, cost) in &admitted[i..] {
            sum += u128::from(cost);
            let elapsed = u128::from(t - admitted[i].0);
            let allowance = u128::from(quota.burst())
                + u128::from(quota.limit()) * elapsed / u128::from(quota.period_nanos());
            prop_assert!(sum <= allowance, "{} admitted, bound {}", sum, allowance);
        }
    }
    Ok(())
}

/// Most admitted in any trailing window `(t − period, t]`.
fn max_in_trailing_window(period: Nanos, admitted: &Admitted) -> u64 {
    (0..admitted.len())
        .map(|j| {
            let end = admitted[j].0;
            admitted[..=j]
                .iter()
                .filter(|&&(t, _)| t + period > end)
                .map(|&(_, c)| c)
                .sum()
        })
        .max()
        .unwrap_or(0)
}

/// Whenever `is_fresh(state, t)`, the state decides like a fresh one at `t` and later.
fn fresh_means_fresh<A: Algorithm>(
    alg: &A,
    state: u64,
    t: Nanos,
    later: Nanos,
) -> Result<(), TestCaseError> {
    if alg.is_fresh(state, t) {
        for now in [t, t + later] {
            for cost in [1, alg.capacity()] {
                prop_assert_eq!(
                    alg.decide(state, now, cost).unwrap(),
                    alg.decide(0, now, cost)
                        .unwrap()
                        .with_next_of(alg, state, now, cost)
                );
            }
        }
    }
    Ok(())
}

/// Comparing transitions of an old state and a fresh one: decisions must match; the written words
/// may differ only in representation, so compare what they decide next.
trait WithNextOf {
    fn with_next_of<A: Algorithm>(self, alg: &A, state: u64, now: Nanos, cost: u64) -> Self;
}

impl WithNextOf for tollgate_core::Transition {
    fn with_next_of<A: Algorithm>(self, alg: &A, state: u64, now: Nanos, cost: u64) -> Self {
        let theirs = alg.decide(state, now, cost).unwrap();
        match (self.next, theirs.next) {
            (Some(a), Some(b)) if a != b => {
                // Same future behaviour from both words.
                for later in [now, now + 1, now + alg.quota().period_nanos()] {
                    assert_eq!(
                        alg.decide(a, later, 1).unwrap().decision,
                        alg.decide(b, later, 1).unwrap().decision
                    );
                }
                tollgate_core::Transition {
                    next: Some(b),
                    ..self
                }
            }
            _ => self,
        }
    }
}

// ---------------------------------------------------------------- properties

/// One step of the backwards-clock property: an admission at `now` must also be one at `latest`.
fn stricter_in_the_past<A: Algorithm>(
    alg: &A,
    state: &mut u64,
    now: Nanos,
    latest: Nanos,
    cost: u64,
) -> Result<(), TestCaseError> {
    let Ok(t) = alg.decide(*state, now, cost) else {
        prop_assert!(cost > alg.capacity());
        return Ok(());
    };
    if t.decision.is_allowed() {
        prop_assert!(
            alg.decide(*state, latest, cost)
                .unwrap()
                .decision
                .is_allowed(),
            "looser in the past"
        );
    }
    if let Some(next) = t.next {
        *state = next;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn gcra_equals_the_water_level_bucket_and_keeps_its_bound(
        q in quota(), steps in trace(), start in 0u64..1_000_000_000, idle in 0u64..u32::MAX as u64,
    ) {
        let gcra = Gcra::from_quota(q).unwrap();
        let mut model = WaterLevel::new(&q);
        model.last = start;
        let trace = times(&q, &steps, start);
        let (admitted, state) = run(&gcra, &trace, |s, now, cost, d| {
            prop_assert_eq!(*d, model.decide(now, cost));
            retry_is_exact(&gcra, s, now, cost, d)
        })?;
        bucket_bound(&q, &admitted)?;
        let end = trace.last().unwrap().0;
        fresh_means_fresh(&gcra, state, end + idle, idle)?;
        prop_assert!(gcra.is_fresh(state, end + q.burst_nanos()));
    }

    #[test]
    fn leaky_bucket_meter_equals_the_water_level_bucket(
        q in quota(), steps in trace(),
    ) {
        let bucket = LeakyBucket::from_quota(q).unwrap();
        let mut model = WaterLevel::new(&q);
        let (admitted, _) = run(&bucket, &times(&q, &steps, 0), |s, now, cost, d| {
            prop_assert_eq!(*d, model.decide(now, cost));
            retry_is_exact(&bucket, s, now, cost, d)
        })?;
        bucket_bound(&q, &admitted)?;
    }

    #[test]
    fn fixed_window_equals_per_window_counters(
        q in quota(), steps in trace(), idle in 0u64..1 << 40,
    ) {
        let fw = FixedWindow::from_quota(q).unwrap();
        let mut model = WindowCounts::new(&q);
        let trace = times(&q, &steps, 0);
        let (_, state) = run(&fw, &trace, |s, now, cost, d| {
            prop_assert_eq!(*d, model.fixed(now, cost));
            retry_is_exact(&fw, s, now, cost, d)
        })?;
        prop_assert!(model.counts.values().all(|&c| c <= q.limit()));
        let end = trace.last().unwrap().0;
        fresh_means_fresh(&fw, state, end + idle, idle)?;
        prop_assert!(fw.is_fresh(state, end + q.period_nanos()));
    }

    #[test]
    fn sliding_window_equals_its_reference_and_stays_within_its_bounds(
        q in quota(), steps in trace(), idle in 0u64..1 << 40,
    ) {
        let sw = SlidingWindow::from_quota(q).unwrap();
        let mut model = WindowCounts::new(&q);
        let trace = times(&q, &steps, 0);
        let (admitted, state) = run(&sw, &trace, |s, now, cost, d| {
            let (allowed, remaining, reset) = model.sliding(now, cost);
            prop_assert_eq!(d.is_allowed(), allowed);
            prop_assert_eq!(d.remaining(), remaining);
            prop_assert_eq!(d.reset_after(), Duration::from_nanos(reset));
            retry_is_exact(&sw, s, now, cost, d)
        })?;
        // Documented bounds: ≤ limit per aligned window, ≤ 2 × limit per trailing window.
        prop_assert!(model.counts.values().all(|&c| c <= q.limit()));
        prop_assert!(max_in_trailing_window(q.period_nanos(), &admitted) <= 2 * q.limit());
        let end = trace.last().unwrap().0;
        fresh_means_fresh(&sw, state, end + idle, idle)?;
        prop_assert!(sw.is_fresh(state, end + 2 * q.period_nanos()));
    }

    #[test]
    fn sliding_log_equals_the_exact_log(q in quota(), steps in trace()) {
        let clock = ManualClock::new();
        let log = SlidingLog::with_clock(q, clock).unwrap();
        let mut model = ExactLog { stamps: Vec::new(), window: q.period_nanos(), limit: q.limit() };
        let mut admitted = Vec::new();
        for (now, raw) in times(&q, &steps, 0) {
            let cost = scaled_cost(raw, q.limit());
            let Ok(d) = log.check_at(now, cost) else {
                prop_assert!(cost > q.limit());
                continue;
            };
            let (allowed, retry) = model.decide(now, cost);
            prop_assert_eq!(d.is_allowed(), allowed);
            prop_assert_eq!(d.retry_after(), retry.map(Duration::from_nanos));
            if allowed {
                prop_assert_eq!(d.remaining(), q.limit() - model.live(now));
                admitted.push((now, cost));
            }
        }
        prop_assert!(max_in_trailing_window(q.period_nanos(), &admitted) <= q.limit());
    }

    /// Time going backwards: no panic, and every decision is at most as permissive as the same state
    /// would get at the latest time seen (so a lying clock never buys extra admissions).
    #[test]
    fn a_clock_going_backwards_only_makes_decisions_stricter(
        q in quota(),
        jumps in prop::collection::vec((0u64..=160, any::<bool>(), 0u64..=64), 1..80),
    ) {
        let unit = q.period_nanos() / 64;
        let gcra = Gcra::from_quota(q).unwrap();
        let fw = FixedWindow::from_quota(q).unwrap();
        let sw = SlidingWindow::from_quota(q).unwrap();
        let log = SlidingLog::with_clock(q, ManualClock::new()).unwrap();
        let mut states = [0u64; 3];
        let (mut now, mut latest) = (50 * q.period_nanos(), 0);
        let mut log_stamps: Vec<Nanos> = Vec::new();
        for (step, back, raw) in jumps {
            now = if back { now.saturating_sub(step * unit * 4) } else { now + step * unit };
            latest = latest.max(now);
            let cost = scaled_cost(raw, q.limit().min(q.burst()));
            stricter_in_the_past(&gcra, &mut states[0], now, latest, cost)?;
            stricter_in_the_past(&fw, &mut states[1], now, latest, cost)?;
            stricter_in_the_past(&sw, &mut states[2], now, latest, cost)?;
            // The log: an admission in the past must also fit at the latest time.
            if log.check_at(now, cost).is_ok_and(|d| d.is_allowed()) {
                let live_at_latest = log_stamps
                    .iter()
                    .filter(|&&t| t + q.period_nanos() > latest)
                    .count() as u64;
                prop_assert!(live_at_latest + cost <= q.limit(), "log looser in the past");
                log_stamps.extend(std::iter::repeat_n(now.max(log_stamps.last().copied().unwrap_or(0)), cost as usize));
            }
        }
    }

    #[test]
    fn window_layouts_round_trip(period in 1u64..=u64::MAX, index in any::<u64>(), a in any::<u64>(), b in any::<u64>()) {
        let fixed = FixedLayout::for_period(period);
        let state = FixedState { index: index % (u64::MAX / period + 1), count: a & fixed.max_count() };
        prop_assert_eq!(fixed.unpack(fixed.pack(state)), state);
        let sliding = SlidingLayout::for_period(period);
        let state = SlidingState {
            index: index % (u64::MAX / period + 1),
            previous: a & sliding.max_count(),
            current: b & sliding.max_count(),
        };
        prop_assert_eq!(sliding.unpack(sliding.pack(state)), state);
    }
}

// ---------------------------------------------------------------- the end of the clock's range

/// Like [`times`], from `start` near the end of the clock's range: steps saturate at `u64::MAX`, so
/// the tail of the trace is many requests at the last instant (issue 11, finding 2).
fn times_to_the_end(quota: &Quota, steps: &[(u64, u64)], start: Nanos) -> Vec<(Nanos, u64)> {
    let unit = quota.period_nanos() / 64;
    let mut now = start;
    steps
        .iter()
        .map(|&(step, cost)| {
            now = now.saturating_add(step * unit + step % 7);
            (now, cost)
        })
        .collect()
}

/// Most admitted in any trailing window `(t − period, t]`, without overflowing at the range's end.
fn max_in_trailing_window_to_the_end(period: Nanos, admitted: &Admitted) -> u64 {
    (0..admitted.len())
        .map(|j| {
            let end = u128::from(admitted[j].0);
            admitted[..=j]
                .iter()
                .filter(|&&(t, _)| u128::from(t) + u128::from(period) > end)
                .map(|&(_, c)| c)
                .sum()
        })
        .max()
        .unwrap_or(0)
}

/// At the range's end a denial's `retry_after` is exact where the retry instant exists, and
/// [`Decision::NEVER`] where it would lie past the end; an admission that leaves anything counted
/// says so in `reset_after` (never 0).
fn honest_at_the_end<A: Algorithm>(
    alg: &A,
    state: u64,
    now: Nanos,
    cost: u64,
    decision: &Decision,
) -> Result<(), TestCaseError> {
    match decision.retry_after() {
        Some(retry) if retry == Decision::NEVER => {
            prop_assert!(
                !alg.decide(state, Nanos::MAX, cost)
                    .unwrap()
                    .decision
                    .is_allowed()
            );
        }
        Some(_) => retry_is_exact(alg, state, now, cost, decision)?,
        None => {
            if cost > 0 {
                prop_assert!(
                    decision.reset_after() > Duration::ZERO,
                    "admitted with reset_after 0"
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn gcra_keeps_its_bound_at_the_end_of_the_clock(
        q in quota(), steps in trace(), periods_left in 0u64..4,
    ) {
        let gcra = Gcra::from_quota(q).unwrap();
        let start = Nanos::MAX - periods_left * q.period_nanos();
        let (admitted, _) = run(&gcra, &times_to_the_end(&q, &steps, start), |s, now, cost, d| {
            honest_at_the_end(&gcra, s, now, cost, d)
        })?;
        bucket_bound(&q, &admitted)?;
    }

    #[test]
    fn leaky_bucket_keeps_its_bound_at_the_end_of_the_clock(
        q in quota(), steps in trace(), periods_left in 0u64..4,
    ) {
        let bucket = LeakyBucket::from_quota(q).unwrap();
        let start = Nanos::MAX - periods_left * q.period_nanos();
        let (admitted, _) = run(&bucket, &times_to_the_end(&q, &steps, start), |s, now, cost, d| {
            honest_at_the_end(&bucket, s, now, cost, d)
        })?;
        bucket_bound(&q, &admitted)?;
    }

    #[test]
    fn fixed_window_keeps_its_bound_at_the_end_of_the_clock(
        q in quota(), steps in trace(), periods_left in 0u64..4,
    ) {
        let fw = FixedWindow::from_quota(q).unwrap();
        let start = Nanos::MAX - periods_left * q.period_nanos();
        let (admitted, _) = run(&fw, &times_to_the_end(&q, &steps, start), |s, now, cost, d| {
            honest_at_the_end(&fw, s, now, cost, d)
        })?;
        let mut per_window: HashMap<u64, u64> = HashMap::new();
        for (t, cost) in admitted {
            *per_window.entry(t / q.period_nanos()).or_default() += cost;
        }
        prop_assert!(per_window.values().all(|&c| c <= q.limit()));
    }

    #[test]
    fn sliding_window_keeps_its_bounds_at_the_end_of_the_clock(
        q in quota(), steps in trace(), periods_left in 0u64..4,
    ) {
        let sw = SlidingWindow::from_quota(q).unwrap();
        let start = Nanos::MAX - periods_left * q.period_nanos();
        let (admitted, _) = run(&sw, &times_to_the_end(&q, &steps, start), |s, now, cost, d| {
            honest_at_the_end(&sw, s, now, cost, d)
        })?;
        let mut per_window: HashMap<u64, u64> = HashMap::new();
        for &(t, cost) in &admitted {
            *per_window.entry(t / q.period_nanos()).or_default() += cost;
        }
        prop_assert!(per_window.values().all(|&c| c <= q.limit()));
        prop_assert!(max_in_trailing_window_to_the_end(q.period_nanos(), &admitted) <= 2 * q.limit());
    }

    #[test]
    fn sliding_log_is_exact_at_the_end_of_the_clock(
        q in quota(), steps in trace(), periods_left in 0u64..4,
    ) {
        let start = Nanos::MAX - periods_left * q.period_nanos();
        let log = SlidingLog::with_clock(q, ManualClock::starting_at(start)).unwrap();
        let mut admitted = Vec::new();
        for (now, raw) in times_to_the_end(&q, &steps, start) {
            let cost = scaled_cost(raw, q.limit());
            let Ok(d) = log.check_at(now, cost) else {
                prop_assert!(cost > q.limit());
                continue;
            };
            match d.retry_after() {
                None => admitted.push((now, cost)),
                Some(retry) if retry == Decision::NEVER => {}
                Some(retry) => {
                    let at = now + retry.as_nanos() as u64;
                    prop_assert!(log.peek_at(at, cost).unwrap().is_allowed());
                    prop_assert!(!log.peek_at(at - 1, cost).unwrap().is_allowed());
                }
            }
        }
        prop_assert!(max_in_trailing_window_to_the_end(q.period_nanos(), &admitted) <= q.limit());
    }
}
