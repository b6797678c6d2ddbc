//! Worked examples and edge cases for every algorithm, on the manual clock.

use std::time::Duration;

use tollgate_core::algorithm::fixed_window::FixedState;
use tollgate_core::algorithm::sliding_window::SlidingState;
use tollgate_core::{
    Algorithm, CheckError, Decision, FixedWindow, FixedWindowLimiter, Gcra, GcraLimiter,
    LeakyBucket, Limiter, ManualClock, Nanos, Quota, QuotaError, ShapeError, Shaper, SlidingLog,
    SlidingWindow, SlidingWindowLimiter,
};

const SEC: Nanos = 1_000_000_000;
const MIN: Nanos = 60 * SEC;

#[test]
fn quota_rejects_nonsense_with_typed_errors() {
    assert_eq!(Quota::per_second(0), Err(QuotaError::ZeroLimit));
    assert_eq!(Quota::per(Duration::ZERO, 1), Err(QuotaError::ZeroPeriod));
    assert_eq!(Quota::per(Duration::MAX, 1), Err(QuotaError::PeriodTooLong));
    // 2 per nanosecond: the emission interval would be half a nanosecond.
    assert_eq!(
        Quota::per(Duration::from_nanos(1), 2),
        Err(QuotaError::RateTooHigh)
    );
    assert_eq!(
        Quota::per_second(1_000_000_001),
        Err(QuotaError::RateTooHigh)
    );
    let q = Quota::per_second(10).unwrap();
    assert_eq!(q.with_burst(0), Err(QuotaError::ZeroBurst));
    assert_eq!(q.with_burst(u64::MAX), Err(QuotaError::BurstTooLarge));
    // The largest burst that fits is accepted, and math on it cannot overflow.
    let max_burst = u64::MAX / q.emission_interval_nanos();
    let q = q.with_burst(max_burst).unwrap();
    let gcra = Gcra::from_quota(q).unwrap();
    assert!(gcra.decide(0, u64::MAX - 1, max_burst).is_ok());
}

#[test]
fn emission_interval_rounds_up_so_buckets_never_refill_faster_than_the_quota() {
    let q = Quota::per_second(3).unwrap();
    assert_eq!(q.emission_interval_nanos(), 333_333_334);
}

#[test]
fn cost_above_capacity_is_an_error_not_a_denial() {
    let q = Quota::per_second(10).unwrap().with_burst(5).unwrap();
    let err = CheckError::CostExceedsCapacity {
        cost: 6,
        capacity: 5,
    };
    assert_eq!(Gcra::from_quota(q).unwrap().decide(0, 0, 6), Err(err));
    assert_eq!(
        LeakyBucket::from_quota(q).unwrap().decide(0, 0, 6),
        Err(err)
    );
    // Window algorithms' capacity is the limit.
    let err = CheckError::CostExceedsCapacity {
        cost: 11,
        capacity: 10,
    };
    assert_eq!(
        FixedWindow::from_quota(q).unwrap().decide(0, 0, 11),
        Err(err)
    );
    assert_eq!(
        SlidingWindow::from_quota(q).unwrap().decide(0, 0, 11),
        Err(err)
    );
    let log = SlidingLog::with_clock(q, ManualClock::new()).unwrap();
    assert_eq!(log.check_n(11), Err(err));
    assert!(
        log.check_n(10).unwrap().is_allowed(),
        "the error consumed nothing"
    );
    let shaper = Shaper::with_clock(q, Duration::from_secs(1), ManualClock::new()).unwrap();
    assert_eq!(
        shaper.reserve(6),
        Err(ShapeError::CostExceedsCapacity {
            cost: 6,
            capacity: 5
        })
    );
}

#[test]
fn token_bucket_capacity_100_refilling_10_per_second() {
    let clock = ManualClock::starting_at(1000 * SEC); // long idle
    let quota = Quota::per_second(10).unwrap().with_burst(100).unwrap();
    let limiter = GcraLimiter::with_clock(quota, clock.clone()).unwrap();
    // Idle: the whole burst of 100 at once.
    for i in 0..100 {
        let d = limiter.check();
        assert_eq!(d.remaining(), 99 - i, "request {i}");
    }
    let denied = limiter.check();
    assert_eq!(denied.retry_after(), Some(Duration::from_millis(100)));
    // Then 10 per second: one every 100 ms.
    for second in 0..3 {
        let mut admitted = 0;
        for _ in 0..10 {
            clock.advance(Duration::from_millis(100));
            if limiter.check().is_allowed() {
                admitted += 1;
            }
            assert!(!limiter.check().is_allowed(), "only one per 100 ms");
        }
        assert_eq!(admitted, 10, "second {second}");
    }
}

#[test]
fn gcra_denial_reports_exact_retry_and_reset_and_writes_nothing() {
    let quota = Quota::per_second(2).unwrap().with_burst(2).unwrap();
    let gcra = Gcra::from_quota(quota).unwrap();
    let t1 = gcra.decide(0, 0, 2).unwrap();
    assert_eq!(
        t1.decision,
        Decision::Allowed {
            remaining: 0,
            reset_after: Duration::from_secs(1)
        }
    );
    let tat = t1.next.unwrap();
    let t2 = gcra.decide(tat, 0, 1).unwrap();
    assert_eq!(t2.next, None);
    assert_eq!(
        t2.decision,
        Decision::Denied {
            retry_after: Duration::from_millis(500),
            reset_after: Duration::from_secs(1)
        }
    );
    assert!(
        !gcra
            .decide(tat, SEC / 2 - 1, 1)
            .unwrap()
            .decision
            .is_allowed()
    );
    assert!(gcra.decide(tat, SEC / 2, 1).unwrap().decision.is_allowed());
}

#[test]
fn fixed_window_admits_the_boundary_burst_and_sliding_log_does_not() {
    let quota = Quota::per_minute(100).unwrap();
    let clock = ManualClock::new();
    let fixed = FixedWindowLimiter::with_clock(quota, clock.clone()).unwrap();
    let log = SlidingLog::with_clock(quota, clock.clone()).unwrap();
    clock.set(59 * SEC); // 00:59
    for _ in 0..100 {
        assert!(fixed.check().is_allowed());
        assert!(log.check().is_allowed());
    }
    assert!(!fixed.check().is_allowed());
    assert!(!log.check().is_allowed());
    clock.set(MIN); // 01:00
    let mut fixed_admitted = 0;
    let mut log_admitted = 0;
    for _ in 0..100 {
        fixed_admitted += u32::from(fixed.check().is_allowed());
        log_admitted += u32::from(log.check().is_allowed());
    }
    assert_eq!(
        fixed_admitted, 100,
        "200 within one second across the boundary"
    );
    assert_eq!(
        log_admitted, 0,
        "the exact log still sees 100 in the trailing minute"
    );
    // The log admits again exactly one minute after the first batch.
    clock.set(59 * SEC + MIN - 1);
    assert!(!log.check().is_allowed());
    clock.set(59 * SEC + MIN);
    assert!(log.check_n(100).unwrap().is_allowed());
}

#[test]
fn sliding_counter_worked_example_previous_80_current_30_at_25_percent() {
    let sw = SlidingWindow::from_quota(Quota::per_minute(100).unwrap()).unwrap();
    let word = sw.layout().pack(SlidingState {
        index: 1,
        previous: 80,
        current: 30,
    });
    let now = MIN + MIN / 4;
    // estimate = 30 + 80 × 0.75 = 90 < 100
    let t = sw.decide(word, now, 1).unwrap();
    assert_eq!(t.decision.remaining(), 9);
    // 10 fit (90 + 10 = 100), 11 do not.
    assert!(sw.decide(word, now, 10).unwrap().decision.is_allowed());
    let denied = sw.decide(word, now, 11).unwrap();
    assert!(!denied.decision.is_allowed());
    // 11 fit once the previous window's share drops to 59: 80 × (1 − e) ≤ 59 ⇔ e ≥ 26.25 %.
    let retry = denied.decision.retry_after().unwrap();
    assert_eq!(now + retry.as_nanos() as u64, MIN + MIN * 2625 / 10000);
}

#[test]
fn sliding_window_idle_for_any_length_behaves_as_fresh() {
    let quota = Quota::per_second(10).unwrap();
    let sw = SlidingWindow::from_quota(quota).unwrap();
    let clock = ManualClock::new();
    let limiter = SlidingWindowLimiter::with_clock(quota, clock.clone()).unwrap();
    assert!(limiter.check_n(10).unwrap().is_allowed());
    let word = limiter.state_word();
    // Idle spans that would alias a truncated window index (multiples of 2^k windows) and the end of
    // the clock's range: all read as fresh.
    for idle_windows in [2u64, 1 << 20, 1 << 24, 1 << 32, 1 << 34, u64::MAX / SEC - 1] {
        let now = idle_windows * SEC;
        assert!(sw.is_fresh(word, now), "idle {idle_windows} windows");
        assert_eq!(
            sw.decide(word, now, 10).unwrap().decision,
            sw.decide(0, now, 10).unwrap().decision
        );
    }
    clock.set((1 << 34) * SEC);
    assert!(limiter.check_n(10).unwrap().is_allowed());
}

#[test]
fn fixed_window_idle_for_any_length_behaves_as_fresh() {
    let fw = FixedWindow::from_quota(Quota::per_second(1000).unwrap()).unwrap();
    let word = fw.layout().pack(FixedState {
        index: 0,
        count: 1000,
    });
    for idle_windows in [1u64, 1 << 29, 1 << 33, u64::MAX / SEC - 1] {
        let now = idle_windows * SEC;
        assert!(fw.is_fresh(word, now));
        assert!(fw.decide(word, now, 1000).unwrap().decision.is_allowed());
    }
}

#[test]
fn window_layouts_reject_limits_they_cannot_count() {
    assert_eq!(
        SlidingWindow::from_quota(Quota::per_second(20_000).unwrap()),
        Err(QuotaError::LimitTooLarge { max: 16_383 })
    );
    assert!(SlidingWindow::from_quota(Quota::per_second(16_383).unwrap()).is_ok());
    assert!(SlidingWindow::from_quota(Quota::per_hour(1_048_575).unwrap()).is_ok());
    assert_eq!(
        FixedWindow::from_quota(Quota::per(Duration::from_micros(1), 600).unwrap()),
        Err(QuotaError::LimitTooLarge { max: 511 })
    );
}

#[test]
fn a_clock_going_backwards_never_admits_more() {
    let quota = Quota::per_second(4).unwrap();
    let clock = ManualClock::starting_at(10 * SEC);
    let gcra = GcraLimiter::with_clock(quota, clock.clone()).unwrap();
    let fixed = FixedWindowLimiter::with_clock(quota, clock.clone()).unwrap();
    let sliding = SlidingWindowLimiter::with_clock(quota, clock.clone()).unwrap();
    let log = SlidingLog::with_clock(quota, clock.clone()).unwrap();
    let all: [&dyn Limiter; 4] = [&gcra, &fixed, &sliding, &log];
    for l in all {
        assert!(l.check_n(4).unwrap().is_allowed());
    }
    // Jump back an hour, then far back to 0: everything stays exhausted.
    for back in [10 * SEC - 3600, 0] {
        clock.set(back);
        for l in all {
            assert!(!l.check().is_allowed(), "{:?}", l.quota());
            let retry = l.peek(1).unwrap().retry_after().unwrap();
            assert!(retry >= Duration::from_nanos(10 * SEC - back));
        }
    }
}

#[test]
fn shaper_spaces_output_and_bounds_its_queue_by_delay() {
    let clock = ManualClock::new();
    let quota = Quota::per_second(10).unwrap().with_burst(2).unwrap();
    let shaper = Shaper::with_clock(quota, Duration::from_millis(250), clock.clone()).unwrap();
    // A burst of 2 leaves at once, then one every 100 ms.
    let delays: Vec<_> = (0..4).map(|_| shaper.reserve(1).unwrap()).collect();
    assert_eq!(delays, [0, 0, 100, 200].map(Duration::from_millis).to_vec());
    // The next slot is 300 ms away: over the 250 ms bound, rejected, nothing booked.
    assert_eq!(
        shaper.reserve(1),
        Err(ShapeError::QueueFull {
            retry_after: Duration::from_millis(50)
        })
    );
    clock.advance(Duration::from_millis(50));
    assert_eq!(shaper.reserve(1), Ok(Duration::from_millis(250)));
    // Cost 0 books nothing, so it waits for nothing (issue 11: it used to report the queue's delay).
    assert_eq!(shaper.reserve(0), Ok(Duration::ZERO));
    assert!(shaper.reserve(1).is_err());
}

#[test]
fn shaper_acquire_blocks_only_for_its_slot() {
    let quota = Quota::per_second(1000).unwrap().with_burst(1).unwrap();
    let shaper = Shaper::new(quota, Duration::from_millis(100)).unwrap();
    let start = std::time::Instant::now();
    for _ in 0..5 {
        shaper.acquire(1).unwrap();
    }
    // Five slots 1 ms apart: at least 4 ms of pacing happened.
    assert!(start.elapsed() >= Duration::from_millis(4));
}

#[test]
fn peek_consumes_nothing() {
    let clock = ManualClock::new();
    let quota = Quota::per_second(1).unwrap();
    let limiter = GcraLimiter::with_clock(quota, clock).unwrap();
    for _ in 0..5 {
        assert!(limiter.peek(1).unwrap().is_allowed());
    }
    assert!(limiter.check().is_allowed());
    assert!(!limiter.peek(1).unwrap().is_allowed());
}

#[test]
fn cost_zero_is_a_query_that_writes_nothing() {
    let quota = Quota::per_second(5).unwrap();
    for alg in [
        &Gcra::from_quota(quota).unwrap() as &dyn DynDecide,
        &FixedWindow::from_quota(quota).unwrap(),
        &SlidingWindow::from_quota(quota).unwrap(),
    ] {
        let t = alg.decide_dyn(0, 7 * SEC, 0);
        assert!(t.0);
        assert_eq!(t.1, None);
    }
}

trait DynDecide {
    fn decide_dyn(&self, state: u64, now: Nanos, cost: u64) -> (bool, Option<u64>);
}

impl<A: Algorithm> DynDecide for A {
    fn decide_dyn(&self, state: u64, now: Nanos, cost: u64) -> (bool, Option<u64>) {
        let t = self.decide(state, now, cost).unwrap();
        (t.decision.is_allowed(), t.next)
    }
}

#[test]
fn sliding_log_reports_remaining_and_reset() {
    let clock = ManualClock::new();
    let log = SlidingLog::with_clock(Quota::per_second(3).unwrap(), clock.clone()).unwrap();
    assert_eq!(log.check().unwrap_allowed(), (2, Duration::from_secs(1)));
    clock.advance(Duration::from_millis(400));
    assert_eq!(
        log.check_n(2).unwrap().unwrap_allowed(),
        (0, Duration::from_secs(1))
    );
    // The first unit leaves at 1 s: retry after 600 ms; everything is gone at 1.4 s.
    assert_eq!(
        log.check(),
        Decision::Denied {
            retry_after: Duration::from_millis(600),
            reset_after: Duration::from_secs(1)
        }
    );
    assert_eq!(log.memory_bytes(), 24);
}

trait UnwrapAllowed {
    fn unwrap_allowed(self) -> (u64, Duration);
}

impl UnwrapAllowed for Decision {
    fn unwrap_allowed(self) -> (u64, Duration) {
        match self {
            Decision::Allowed {
                remaining,
                reset_after,
            } => (remaining, reset_after),
            Decision::Denied { .. } => panic!("denied: {self:?}"),
        }
    }
}

#[test]
fn coarse_clock_is_monotonic_and_reports_its_precision() {
    let clock = tollgate_core::CoarseClock::new(Duration::from_millis(1)).unwrap();
    assert_eq!(clock.interval(), Duration::from_millis(1));
    let mut last = tollgate_core::Clock::now(&clock);
    for _ in 0..1000 {
        let now = tollgate_core::Clock::now(&clock);
        assert!(now >= last);
        last = now;
    }
}

#[cfg(feature = "tokio")]
#[tokio::test(start_paused = true)]
async fn shaper_acquire_async_waits_on_tokio_time() {
    let quota = Quota::per_second(10).unwrap().with_burst(1).unwrap();
    let shaper = Shaper::new(quota, Duration::from_secs(1)).unwrap();
    let start = tokio::time::Instant::now();
    for _ in 0..3 {
        shaper.acquire_async(1).await.unwrap();
    }
    // Paused time auto-advances through the sleeps: at least the two 100 ms gaps passed.
    assert!(start.elapsed() >= Duration::from_millis(200));
}

#[test]
fn sliding_window_weighting_is_exact_for_very_long_windows() {
    // 1 000 hours: count × window overflows a u64, so the weighting takes its 128-bit path.
    let quota = Quota::per(Duration::from_secs(3600 * 1000), 30_000_000).unwrap();
    let sw = SlidingWindow::from_quota(quota).unwrap();
    let w = quota.period_nanos();
    let word = sw.layout().pack(SlidingState {
        index: 1,
        previous: 30_000_000,
        current: 0,
    });
    // A third into window 1: ⌈30 000 000 × 2/3⌉ = 20 000 000 still weigh, so 9 999 999 remain.
    let t = sw.decide(word, w + w / 3, 1).unwrap();
    assert_eq!(t.decision.remaining(), 9_999_999);
    // One nanosecond earlier the weight rounds up to 20 000 001.
    let t = sw.decide(word, w + w / 3 - 1, 1).unwrap();
    assert_eq!(t.decision.remaining(), 9_999_998);
}

/// Issue 11, finding 2: at the last instant of the clock's range the sliding log admitted without
/// limit (an entry's expiry saturated to `u64::MAX`, which `now` equals). It must deny past its limit,
/// and say it can never admit again (the window would end past the range).
#[test]
fn sliding_log_denies_at_the_end_of_the_clock() -> Result<(), Box<dyn std::error::Error>> {
    let clock = ManualClock::starting_at(u64::MAX);
    let log = SlidingLog::with_clock(Quota::per_second(100)?, clock.clone())?;
    let admitted = (0..1_000).filter(|_| log.check().is_allowed()).count();
    assert_eq!(admitted, 100);
    assert_eq!(log.check().retry_after(), Some(Decision::NEVER));
    clock.advance(Duration::from_secs(3600)); // saturates
    assert!(!log.check().is_allowed());
    Ok(())
}

/// Issue 11, finding 3: the fixed window's last window never ends within the range, so an admission
/// there resets never (`Decision::NEVER`), not after 0.
#[test]
fn fixed_window_at_the_end_of_the_clock_never_resets() -> Result<(), Box<dyn std::error::Error>> {
    let fw = FixedWindow::from_quota(Quota::per_second(10)?)?;
    let t = fw.decide(0, u64::MAX, 1)?;
    assert_eq!(
        t.decision,
        Decision::Allowed {
            remaining: 9,
            reset_after: Decision::NEVER
        }
    );
    Ok(())
}

/// Issue 11, finding 3: one convention for "never within the clock's range": GCRA's denial past the
/// end and the shaper's full queue past the end both say `Decision::NEVER`.
#[test]
fn past_the_end_of_the_clock_is_never_everywhere() -> Result<(), Box<dyn std::error::Error>> {
    let quota = Quota::per_second(10)?.with_burst(10)?;
    let gcra = Gcra::from_quota(quota)?;
    let denied = gcra.decide(u64::MAX - 1, u64::MAX, 10)?.decision;
    assert_eq!(denied.retry_after(), Some(Decision::NEVER));
    let shaper = Shaper::with_clock(
        quota,
        Duration::from_secs(1),
        ManualClock::starting_at(u64::MAX),
    )?;
    assert_eq!(
        shaper.reserve(10),
        Err(ShapeError::QueueFull {
            retry_after: Decision::NEVER
        })
    );
    Ok(())
}

/// Issue 11, finding 3: reserving nothing books nothing and so waits for nothing, even behind a queue.
#[test]
fn shaper_reserve_zero_waits_for_nothing() -> Result<(), Box<dyn std::error::Error>> {
    let shaper = Shaper::with_clock(
        Quota::per_second(10)?.with_burst(1)?,
        Duration::from_millis(500),
        ManualClock::new(),
    )?;
    assert_eq!(shaper.reserve(1)?, Duration::ZERO);
    assert_eq!(shaper.reserve(1)?, Duration::from_millis(100));
    assert_eq!(shaper.reserve(0)?, Duration::ZERO);
    assert_eq!(
        shaper.reserve(1)?,
        Duration::from_millis(200),
        "reserve(0) booked nothing"
    );
    Ok(())
}

// Edge cases that cargo-mutants found untested (results/mutants/README.md).

#[test]
fn a_live_state_is_never_fresh_and_an_expired_one_is() {
    let second = Quota::per_second(10).unwrap();
    // Fixed window: a count in `now`'s window is live; a zero count or a past window is fresh.
    let fw = FixedWindow::from_quota(second).unwrap();
    let live = fw.layout().pack(FixedState { index: 3, count: 1 });
    assert!(!fw.is_fresh(live, 3 * SEC));
    assert!(!fw.is_fresh(live, 4 * SEC - 1));
    assert!(fw.is_fresh(live, 4 * SEC));
    let zero = fw.layout().pack(FixedState { index: 3, count: 0 });
    assert!(fw.is_fresh(zero, 3 * SEC));
    // GCRA and the leaky bucket: fresh once the TAT is not ahead of now.
    let gcra = Gcra::from_quota(second).unwrap();
    let bucket = LeakyBucket::from_quota(second).unwrap();
    for (alg_fresh, name) in [
        (
            &(|s, n| gcra.is_fresh(s, n)) as &dyn Fn(u64, Nanos) -> bool,
            "gcra",
        ),
        (&|s, n| bucket.is_fresh(s, n), "leaky bucket"),
    ] {
        assert!(!alg_fresh(SEC + 1, SEC), "{name}");
        assert!(alg_fresh(SEC, SEC), "{name}");
        assert!(alg_fresh(0, SEC), "{name}");
    }
    // Sliding window: a current count is live for two windows, a previous one for one.
    let sw = SlidingWindow::from_quota(second).unwrap();
    let current = sw.layout().pack(SlidingState {
        index: 3,
        previous: 0,
        current: 1,
    });
    let previous = sw.layout().pack(SlidingState {
        index: 3,
        previous: 1,
        current: 0,
    });
    assert!(!sw.is_fresh(current, 3 * SEC));
    assert!(!sw.is_fresh(current, 4 * SEC + SEC / 2));
    assert!(sw.is_fresh(current, 5 * SEC));
    assert!(!sw.is_fresh(previous, 3 * SEC + SEC / 2));
    assert!(sw.is_fresh(previous, 4 * SEC));
    // A clock gone backwards before the stored window: live while a count is held.
    assert!(!sw.is_fresh(previous, 2 * SEC));
    assert!(sw.is_fresh(
        sw.layout().pack(SlidingState {
            index: 3,
            previous: 0,
            current: 0
        }),
        2 * SEC
    ));
}

#[test]
fn a_refund_of_nothing_or_onto_nothing_writes_nothing() {
    let fw = FixedWindow::from_quota(Quota::per_second(10).unwrap()).unwrap();
    let live = fw.layout().pack(FixedState { index: 3, count: 4 });
    let empty = fw.layout().pack(FixedState { index: 3, count: 0 });
    assert_eq!(fw.refund(live, 3 * SEC, 0), None);
    assert_eq!(fw.refund(empty, 3 * SEC, 1), None);
    assert_eq!(fw.refund(live, 4 * SEC, 1), None);
    assert_eq!(
        fw.refund(live, 3 * SEC, 1),
        Some(fw.layout().pack(FixedState { index: 3, count: 3 }))
    );
    // GCRA (and the leaky bucket, which is GCRA): a zero cost or a fresh TAT give nothing back.
    let gcra = Gcra::from_quota(Quota::per_second(10).unwrap()).unwrap();
    let bucket = LeakyBucket::from_quota(Quota::per_second(10).unwrap()).unwrap();
    for refund in [
        &(|s, n, c| gcra.refund(s, n, c)) as &dyn Fn(u64, Nanos, u64) -> Option<u64>,
        &|s, n, c| bucket.refund(s, n, c),
    ] {
        assert_eq!(refund(SEC, SEC, 0), None);
        assert_eq!(refund(0, SEC, 1), None);
        assert_eq!(refund(SEC, SEC, 2), Some(SEC - 2 * SEC / 10));
        assert_eq!(refund(SEC / 10, SEC, 2), Some(0));
    }
    // Sliding window: nothing to take off an empty current count (stored window is now's) or an
    // empty previous count (stored window is one ahead of now's, a later admission moved it).
    let sw = SlidingWindow::from_quota(Quota::per_second(10).unwrap()).unwrap();
    let word = |previous, current| {
        sw.layout().pack(SlidingState {
            index: 3,
            previous,
            current,
        })
    };
    assert_eq!(sw.refund(word(4, 0), 3 * SEC, 1), None);
    assert_eq!(sw.refund(word(0, 4), 2 * SEC, 1), None);
    assert_eq!(sw.refund(word(4, 4), 3 * SEC, 0), None);
    assert_eq!(sw.refund(word(4, 4), 3 * SEC, 1), Some(word(4, 3)));
    assert_eq!(sw.refund(word(4, 4), 2 * SEC, 1), Some(word(3, 4)));
    assert_eq!(sw.refund(word(4, 4), SEC, 1), None);
}

#[test]
fn timelines_compare_by_interval_and_depth() {
    use tollgate_core::algorithm::gcra::Timeline;
    let ten = Quota::per_second(10).unwrap();
    let a = Timeline::new(&ten);
    assert_eq!(a, Timeline::new(&ten));
    assert_ne!(a, Timeline::new(&ten.with_burst(5).unwrap()));
    assert_ne!(a, Timeline::new(&Quota::per_second(20).unwrap()));
    assert_eq!(a.interval(), SEC / 10);
    assert_eq!(a.depth(), SEC);
    let gcra = Gcra::from_quota(ten.with_burst(5).unwrap()).unwrap();
    assert_eq!((gcra.interval(), gcra.depth()), (SEC / 10, SEC / 2));
    assert_eq!(gcra.timeline(), &Timeline::new(&ten.with_burst(5).unwrap()));
    // Units a TAT leaves free (T = 100 ms, D = 1 s): all at a past TAT, none a whole depth ahead.
    assert_eq!(a.available(0, 5 * SEC), 10);
    assert_eq!(a.available(5 * SEC + 300_000_000, 5 * SEC), 7);
    assert_eq!(a.available(5 * SEC + 250_000_000, 5 * SEC), 7);
    assert_eq!(a.available(6 * SEC, 5 * SEC), 0);
    assert_eq!(a.available(9 * SEC, 5 * SEC), 0);
}

#[test]
fn sliding_window_waits_after_a_backwards_clock_include_the_lag() {
    let sw = SlidingWindow::from_quota(Quota::per_second(10).unwrap()).unwrap();
    // Window 3 holds the whole limit; the clock reads 2.5 s, half a window before it.
    let word = sw.layout().pack(SlidingState {
        index: 3,
        previous: 0,
        current: 10,
    });
    let now = 2 * SEC + SEC / 2;
    let t = sw.decide(word, now, 1).unwrap();
    assert_eq!(t.next, None);
    // Decided as at 3 s: the unit fits at 4.1 s (the 10 weigh ⌈10 × 0.9⌉ = 9 there), and every count
    // has aged out at 5 s; both measured from the clock's 2.5 s.
    assert_eq!(t.decision.retry_after(), Some(Duration::from_millis(1_600)));
    assert_eq!(t.decision.reset_after(), Duration::from_millis(2_500));
    assert!(
        !sw.decide(word, 4 * SEC + SEC / 10 - 1, 1)
            .unwrap()
            .decision
            .is_allowed()
    );
    assert!(
        sw.decide(word, 4 * SEC + SEC / 10, 1)
            .unwrap()
            .decision
            .is_allowed()
    );
}

/// A wait that ends exactly at the clock's last nanosecond is still a wait, not `Decision::NEVER`;
/// one nanosecond later it is.
#[test]
fn sliding_window_waits_ending_at_the_last_nanosecond_are_reported() {
    // 1 per 5 ns, and 5 divides u64::MAX: a full window `i` with (i + 2) × 5 = u64::MAX.
    let sw = SlidingWindow::from_quota(Quota::per(Duration::from_nanos(5), 1).unwrap()).unwrap();
    let index = u64::MAX / 5 - 2;
    let word = sw.layout().pack(SlidingState {
        index,
        previous: 0,
        current: 1,
    });
    let denied = sw.decide(word, index * 5, 1).unwrap().decision;
    assert_eq!(denied.retry_after(), Some(Duration::from_nanos(10)));
    assert_eq!(denied.reset_after(), Duration::from_nanos(10));
    let denied = sw.decide(word, index * 5 + 1, 1).unwrap().decision;
    assert_eq!(denied.retry_after(), Some(Duration::from_nanos(9)));
    // A window later the unit would fit at u64::MAX + 1: never.
    let word = sw.layout().pack(SlidingState {
        index: index + 1,
        previous: 0,
        current: 1,
    });
    let denied = sw.decide(word, (index + 1) * 5, 1).unwrap().decision;
    assert_eq!(denied.retry_after(), Some(Decision::NEVER));
}
