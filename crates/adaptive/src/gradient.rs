//! [`GradientLimit`]: the in-flight limit that follows latency (see the crate docs for why this
//! design).

use std::collections::VecDeque;
use std::time::Duration;

use crate::algorithm::{LimitAlgorithm, LimitConfigError, Sample, check_bounds, check_factor};

/// Parameters of a [`GradientLimit`]. The defaults suit an upstream answering in milliseconds to
/// seconds; every field is checked by [`GradientLimit::new`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GradientConfig {
    /// The limit before any sample (default 20).
    pub initial_limit: u64,
    /// Lower bound (default 1). Only a floor: there is no probe that pins the limit to it.
    pub min_limit: u64,
    /// Upper bound (default 1000).
    pub max_limit: u64,
    /// How much slower than the baseline a window may be before the limit shrinks (default 1.03:
    /// 3 %). At least 1. It must exceed the noise of a window's mean latency (a window holds about
    /// `limit` requests), or noise alone shrinks the limit: raise it for noisy upstreams.
    pub tolerance: f64,
    /// Fraction of the limit added after a window with no queueing that used the limit (default
    /// 0.015; at least one request is added). In (0, 1].
    pub growth: f64,
    /// Weight of a decrease's target against the current limit (default 0.5: halfway there per
    /// window). In (0, 1].
    pub smoothing: f64,
    /// The most one window may multiply the limit by when shrinking (default 0.5). In (0, 1).
    pub max_decrease: f64,
    /// Samples per window at least (default 10); a window is `max(min_window, limit)` samples, about
    /// one round trip of the whole limit.
    pub min_window: u64,
    /// How many windows the baseline (the lowest window mean) remembers (default 1000). Long on
    /// purpose: in steady state the limit hovers just past the knee and seldom sees the unloaded
    /// latency again, so a short memory lets the baseline rise with it (the creep). A real change
    /// of the upstream's latency is handled by `relearn_after` instead.
    pub baseline_windows: usize,
    /// Consecutive shrinking windows after which the baseline is re-learned from the latest
    /// window and the limit goes back to where it was before them (default 4): queueing drains
    /// within a window or two of a decrease, so latency that stays high while the limit keeps
    /// falling is the upstream itself getting slower.
    pub relearn_after: u32,
}

impl Default for GradientConfig {
    fn default() -> Self {
        GradientConfig {
            initial_limit: 20,
            min_limit: 1,
            max_limit: 1000,
            tolerance: 1.03,
            growth: 0.015,
            smoothing: 0.5,
            max_decrease: 0.5,
            min_window: 10,
            baseline_windows: 1000,
            relearn_after: 4,
        }
    }
}

/// The latency-following limit: a gradient on a windowed-minimum baseline, growing only when no
/// queueing is seen (see the crate docs).
///
/// Per window of at least `max(min_window, limit)` completed requests (more when latency is noisy:
/// see below), with `r` the window's mean latency
/// and `b` the lowest window mean of the last `baseline_windows` windows (`r` included):
///
/// * `r > tolerance × b` (queueing): target `limit × max(b / r, max_decrease)`, and the limit
///   moves `smoothing` of the way there;
/// * otherwise, if the window used at least half the limit: `limit += max(1, growth × limit)`;
/// * otherwise (the caller is not using the limit): unchanged.
///
/// Only requests admitted under the current limit count towards a window (those admitted before
/// it moved saw another concurrency: counting them makes every step overshoot by one window).
/// Dropped requests end no window and add no latency. The limit stays within `[min_limit,
/// max_limit]`.
///
/// ```
/// use std::time::Duration;
/// use tollgate_adaptive::{ConcurrencyLimiter, GradientConfig, GradientLimit};
///
/// let limiter = ConcurrencyLimiter::new(GradientLimit::new(GradientConfig::default())?);
/// if let Some(token) = limiter.acquire() {
///     // ... forward the request, measure how long it took ...
///     token.complete(Duration::from_millis(12));
/// } else {
///     // answer 503 at once: the upstream is at its limit
/// }
/// # Ok::<(), tollgate_adaptive::LimitConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct GradientLimit {
    config: GradientConfig,
    limit: f64,
    /// The current window: samples, their latency sum (ns), the most in flight seen.
    count: u64,
    sum_nanos: u128,
    /// Sum of squared latencies (ns²) of the window, for its mean's standard error.
    sum_squares: f64,
    busiest: u64,
    /// The lowest window mean of the last `baseline_windows` windows, as a monotonic queue:
    /// (window number, mean ns), means strictly increasing from the front, so the front is the
    /// minimum (O(1) amortised per window instead of a scan of every remembered window).
    history: MinWindow,
    /// Shrinking windows in a row.
    shrinking: u32,
    /// The limit before the first of them.
    before_shrinking: f64,
    /// The baseline from before the last re-learning, until latency comes back to it.
    previous_baseline: Option<u64>,
}

impl GradientLimit {
    /// A gradient limit with these parameters.
    ///
    /// # Errors
    /// A [`LimitConfigError`] naming what is out of range.
    pub fn new(config: GradientConfig) -> Result<Self, LimitConfigError> {
        check_bounds(config.min_limit, config.initial_limit, config.max_limit)?;
        if !(config.tolerance.is_finite() && config.tolerance >= 1.0) {
            return Err(LimitConfigError::Factor {
                field: "tolerance",
                value: config.tolerance,
            });
        }
        check_factor("growth", config.growth, 0.0, 1.0)?;
        check_factor("smoothing", config.smoothing, 0.0, 1.0)?;
        check_factor("max_decrease", config.max_decrease, 0.0, 1.0)?;
        if config.max_decrease >= 1.0 {
            return Err(LimitConfigError::Factor {
                field: "max_decrease",
                value: config.max_decrease,
            });
        }
        if config.min_window == 0 {
            return Err(LimitConfigError::ZeroCount("min_window"));
        }
        if config.baseline_windows == 0 {
            return Err(LimitConfigError::ZeroCount("baseline_windows"));
        }
        if config.relearn_after == 0 {
            return Err(LimitConfigError::ZeroCount("relearn_after"));
        }
        Ok(GradientLimit {
            config,
            limit: config.initial_limit as f64,
            count: 0,
            sum_nanos: 0,
            sum_squares: 0.0,
            busiest: 0,
            history: MinWindow::default(),
            shrinking: 0,
            before_shrinking: config.initial_limit as f64,
            previous_baseline: None,
        })
    }

    /// The limit now.
    pub fn limit(&self) -> u64 {
        // `limit` stays within [min, max], both u64.
        (self.limit as u64).clamp(self.config.min_limit, self.config.max_limit)
    }

    /// The baseline latency (lowest recent window mean), once a window has closed.
    pub fn baseline(&self) -> Option<Duration> {
        self.history.min().map(Duration::from_nanos)
    }

    /// Whether the current window has enough samples: at least `max(min_window, limit)`, and
    /// enough for its mean to be precise to a quarter of the tolerance (standard error ≤
    /// `(tolerance − 1) / 4 × mean`), or 64 times the first figure, whichever comes first.
    ///
    /// The price: a window that straddles a sudden change of latency mixes two levels and runs on
    /// until the new one dominates its mean, so the reaction to a step change comes a few windows
    /// later (the spike test in `tests/simulation.rs` includes it).
    ///
    /// Why the second condition: with noisy latencies a small window's mean wanders by more than
    /// the tolerance, and the baseline (a minimum over many windows) sits at its low tail, so noise
    /// alone reads as queueing; and since a lower limit makes windows smaller and noisier, the
    /// false cuts feed on themselves (in the simulator, ±50 % uniform noise took the limit from the
    /// knee of 100 down to about 40 before this condition).
    fn window_done(&self) -> bool {
        let least = self.config.min_window.max(self.limit());
        if self.count < least {
            return false;
        }
        if self.count >= least.saturating_mul(64) {
            return true;
        }
        let n = self.count as f64;
        let mean = self.sum_nanos as f64 / n;
        let variance = (self.sum_squares / n - mean * mean).max(0.0);
        let precision = (self.config.tolerance - 1.0) / 4.0 * mean;
        // Standard error² = variance / n ≤ precision².
        variance <= precision * precision * n
    }

    /// Ends the current window with mean latency `mean` (ns).
    fn close_window(&mut self, mean: u64, busiest: u64) {
        let config = &self.config;
        if let Some(previous) = self.previous_baseline {
            let relearned = self.history.min().unwrap_or(u64::MAX);
            if mean as f64 * config.tolerance < relearned as f64 {
                // Latency fell well below the re-learned baseline: the slow spell is over, and the
                // old baseline (measured below the knee) is a better estimate than anything seen
                // at the limit since. (If the spell is only partly over, cuts re-learn again.)
                self.history.push(previous, config.baseline_windows);
                self.previous_baseline = None;
            }
        }
        self.history.push(mean, config.baseline_windows);
        // `history` holds `mean`, so it is not empty; a baseline of 0 ns (latencies below 1 ns)
        // reads as 1 ns so that the ratio below stays finite.
        let baseline = self.history.min().unwrap_or(mean).max(1);
        let ratio = baseline as f64 / mean.max(1) as f64;
        if ratio * config.tolerance < 1.0 {
            if self.shrinking == 0 {
                self.before_shrinking = self.limit;
            }
            let target = self.limit * ratio.max(config.max_decrease);
            self.limit += (target - self.limit) * config.smoothing;
            self.shrinking += 1;
            if self.shrinking >= config.relearn_after {
                // Shrinking has not brought latency down: the upstream's own latency moved, the
                // cuts were for nothing. Start the baseline again from this window and go back
                // to the limit from before them, rather than pin the limit low. (Were it
                // queueing after all, the next windows cut again, from the re-learned baseline.)
                // Keep the lowest: a second re-learning within one slow spell must not forget the
                // baseline from before it.
                self.previous_baseline =
                    Some(self.previous_baseline.map_or(baseline, |p| p.min(baseline)));
                self.history.clear();
                self.history.push(mean, config.baseline_windows);
                self.shrinking = 0;
                self.limit = self.before_shrinking;
            }
        } else {
            self.shrinking = 0;
            if busiest * 2 >= self.limit() {
                self.limit += (self.limit * config.growth).max(1.0);
            }
        }
        self.limit = self
            .limit
            .clamp(config.min_limit as f64, config.max_limit as f64);
    }
}

/// The minimum of the last `n` values pushed, in O(1) amortised per push.
#[derive(Clone, Debug, Default)]
struct MinWindow {
    /// (push number, value), values strictly increasing from the front.
    queue: VecDeque<(u64, u64)>,
    pushed: u64,
}

impl MinWindow {
    /// Adds `value`; values pushed `n` or more pushes ago are forgotten.
    fn push(&mut self, value: u64, n: usize) {
        while self.queue.back().is_some_and(|&(_, v)| v >= value) {
            self.queue.pop_back();
        }
        self.queue.push_back((self.pushed, value));
        self.pushed += 1;
        // Entry `at` is among the last `n` pushes while `pushed - at <= n`.
        let n = n as u64;
        while self
            .queue
            .front()
            .is_some_and(|&(at, _)| self.pushed - at > n)
        {
            self.queue.pop_front();
        }
    }

    fn min(&self) -> Option<u64> {
        self.queue.front().map(|&(_, v)| v)
    }

    fn clear(&mut self) {
        self.queue.clear();
    }
}

impl LimitAlgorithm for GradientLimit {
    fn name(&self) -> &'static str {
        "gradient"
    }

    fn initial_limit(&self) -> u64 {
        self.config.initial_limit
    }

    fn on_sample(&mut self, sample: Sample) -> u64 {
        let Some(latency) = sample.latency else {
            return self.limit();
        };
        if sample.limit != self.limit() {
            // Admitted before the limit last moved: its latency says nothing about this limit.
            return self.limit();
        }
        self.count += 1;
        self.sum_nanos += latency.as_nanos();
        // Through u64: a u128 to f64 conversion is a library call, u64 to f64 one instruction.
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX) as f64;
        self.sum_squares += nanos * nanos;
        self.busiest = self.busiest.max(sample.in_flight);
        if self.window_done() {
            // A mean of at most the largest sample, which came from a `Duration`: fits in u64
            // for any latency below 584 years; saturate above.
            let mean = u64::try_from(self.sum_nanos / u128::from(self.count)).unwrap_or(u64::MAX);
            let busiest = self.busiest;
            self.count = 0;
            self.sum_nanos = 0;
            self.sum_squares = 0.0;
            self.busiest = 0;
            self.close_window(mean, busiest);
        }
        self.limit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(g: &GradientLimit, ms: u64, in_flight: u64) -> Sample {
        Sample {
            latency: Some(Duration::from_millis(ms)),
            in_flight,
            limit: g.limit(),
        }
    }

    #[test]
    fn bad_parameters_are_typed_errors() {
        let bad = |config| GradientLimit::new(config).unwrap_err();
        let d = GradientConfig::default();
        assert!(matches!(
            bad(GradientConfig { min_limit: 0, ..d }),
            LimitConfigError::Bounds { .. }
        ));
        assert!(matches!(
            bad(GradientConfig {
                initial_limit: 2000,
                ..d
            }),
            LimitConfigError::Bounds { .. }
        ));
        for (field, config) in [
            (
                "tolerance",
                GradientConfig {
                    tolerance: 0.9,
                    ..d
                },
            ),
            (
                "tolerance",
                GradientConfig {
                    tolerance: f64::NAN,
                    ..d
                },
            ),
            ("growth", GradientConfig { growth: 0.0, ..d }),
            (
                "smoothing",
                GradientConfig {
                    smoothing: 1.5,
                    ..d
                },
            ),
            (
                "max_decrease",
                GradientConfig {
                    max_decrease: 1.0,
                    ..d
                },
            ),
        ] {
            assert!(
                matches!(bad(config), LimitConfigError::Factor { field: f, .. } if f == field),
                "{field}"
            );
        }
        assert_eq!(
            bad(GradientConfig { min_window: 0, ..d }),
            LimitConfigError::ZeroCount("min_window")
        );
    }

    #[test]
    fn grows_only_while_the_limit_is_used() {
        let mut g = GradientLimit::new(GradientConfig::default()).unwrap();
        // 20 samples at 10 ms with only 2 in flight: the caller is not using the limit.
        for _ in 0..20 {
            g.on_sample(sample(&g, 10, 2));
        }
        assert_eq!(g.limit(), 20);
        // Using it: +5 % (at least 1) per window.
        for _ in 0..20 {
            g.on_sample(sample(&g, 10, 20));
        }
        assert_eq!(g.limit(), 21);
    }

    #[test]
    fn shrinks_towards_baseline_over_latency_with_smoothing_and_a_floor() {
        let mut g = GradientLimit::new(GradientConfig {
            initial_limit: 100,
            ..GradientConfig::default()
        })
        .unwrap();
        for _ in 0..100 {
            g.on_sample(sample(&g, 10, 100));
        }
        assert_eq!(
            g.limit(),
            101,
            "+1.5 % after a window at the baseline: 101.5"
        );
        // Latency 1.2 × the baseline: target 101.5 / 1.2 = 84.6, halfway there: 93.04.
        for _ in 0..101 {
            g.on_sample(sample(&g, 12, 101));
        }
        assert_eq!(g.limit(), 93);
        // Latency 10 × the baseline: the cut is floored at × 0.5 (46.5), halfway: 69.8.
        for _ in 0..93 {
            g.on_sample(sample(&g, 100, 93));
        }
        assert_eq!(g.limit(), 69);
    }

    #[test]
    fn the_windowed_minimum_matches_a_scan() {
        let mut rng = crate::sim::SplitMix64::new(3);
        for n in [1usize, 2, 7, 50] {
            let (mut window, mut all) = (MinWindow::default(), Vec::new());
            for _ in 0..2_000 {
                let value = rng.next_u64() % 100;
                window.push(value, n);
                all.push(value);
                let scan = all[all.len().saturating_sub(n)..].iter().min().copied();
                assert_eq!(window.min(), scan, "n = {n}");
            }
        }
    }

    #[test]
    fn drops_are_not_latency() {
        let mut g = GradientLimit::new(GradientConfig::default()).unwrap();
        for _ in 0..1000 {
            g.on_sample(Sample {
                latency: None,
                in_flight: 20,
                limit: 20,
            });
        }
        assert_eq!(g.limit(), 20);
        assert_eq!(g.baseline(), None);
    }

    #[test]
    fn a_lasting_latency_shift_is_relearned_instead_of_pinning_the_limit() {
        let mut g = GradientLimit::new(GradientConfig {
            initial_limit: 100,
            ..GradientConfig::default()
        })
        .unwrap();
        for _ in 0..100 {
            g.on_sample(sample(&g, 10, 100));
        }
        // The upstream becomes 3 × slower at every concurrency: a few shrinking windows, then the
        // baseline is re-learned and the limit stops falling well above the floor.
        let mut lowest = u64::MAX;
        for _ in 0..5_000 {
            let limit = g.limit();
            g.on_sample(sample(&g, 30, limit));
            lowest = lowest.min(g.limit());
        }
        assert_eq!(g.baseline(), Some(Duration::from_millis(30)));
        assert!(lowest >= 30, "fell to {lowest}");
        assert!(g.limit() >= 100, "back to {} after re-learning", g.limit());
        // The spell ends: the old baseline comes back as soon as a window closes (the one that
        // straddles the change mixes 30 ms and 10 ms, so it runs on until its mean is precise).
        for _ in 0..20_000 {
            g.on_sample(sample(&g, 10, g.limit()));
        }
        assert_eq!(g.baseline(), Some(Duration::from_millis(10)));
    }
}
