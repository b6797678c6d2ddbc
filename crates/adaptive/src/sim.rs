//! A deterministic simulation of a limiter in front of a model upstream: simulated time, no wall
//! clock, no threads, a seeded random stream. The tests and `examples/adaptive_sim.rs` (which
//! writes `results/concurrency/`) run it, so its figures do not depend on the machine.
//!
//! # The model
//! * **Upstream** ([`Upstream`]): a request admitted while `c` requests are in flight (itself
//!   included) takes `base × max(1, c / knee) × (1 ± jitter)`. Up to the knee the upstream has
//!   room and answers in `base`; past it, it is saturated: extra concurrency only queues, so
//!   throughput stays at `knee / base` and latency grows linearly. The latency is fixed at
//!   admission (a simplification of processor sharing that keeps the model exact and cheap).
//!   A [`Spike`] multiplies `base` for a while (a slow dependency, a GC pause).
//! * **Arrivals**: Poisson at `arrival_rate`, from [`SplitMix64`] seeded by the scenario. A request
//!   the limiter refuses is answered at once (a 503) and is not retried.
//!
//! [`SplitMix64`] is written here rather than taken from `rand`: the results must be reproducible
//! bit for bit from the seed, and `rand` does not promise its generators' streams across versions.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use crate::algorithm::LimitAlgorithm;
use crate::limiter::{ConcurrencyLimiter, Token};

/// Steele, Lea and Flood's SplitMix64: a tiny seeded generator with a fixed, documented stream.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform float in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        // The top 53 bits: exactly representable.
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An exponential variate of mean `mean`.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.next_f64()).ln()
    }
}

/// A while during which the upstream is slower at every concurrency.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spike {
    /// When it starts (simulated time from the run's start).
    pub start: Duration,
    /// When it ends.
    pub end: Duration,
    /// The factor on `base` meanwhile.
    pub factor: f64,
}

/// The model upstream (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Upstream {
    /// The concurrency it handles without queueing.
    pub knee: u64,
    /// Its latency up to the knee.
    pub base: Duration,
    /// Relative noise on each latency: uniform in `±jitter`.
    pub jitter: f64,
    /// An optional slow spell.
    pub spike: Option<Spike>,
}

impl Upstream {
    /// The latency (ns) of a request admitted at `now` with `in_flight` in flight, `u` a uniform
    /// draw in `[0, 1)`.
    pub fn latency(&self, now: Duration, in_flight: u64, u: f64) -> u64 {
        let factor = match self.spike {
            Some(s) if now >= s.start && now < s.end => s.factor,
            _ => 1.0,
        };
        let load = (in_flight as f64 / self.knee.max(1) as f64).max(1.0);
        let noise = 1.0 + self.jitter * (2.0 * u - 1.0);
        (self.base.as_nanos() as f64 * factor * load * noise).max(1.0) as u64
    }
}

/// One simulated run's setting.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scenario {
    /// The upstream.
    pub upstream: Upstream,
    /// Offered requests per second.
    pub arrival_rate: f64,
    /// Simulated length of the run.
    pub duration: Duration,
    /// The random stream's seed.
    pub seed: u64,
    /// How often the limit is recorded.
    pub sample_every: Duration,
}

/// The limit and the in-flight count at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Point {
    /// Simulated time (ns).
    pub at: u64,
    /// The limit then.
    pub limit: u64,
    /// Requests in flight then.
    pub in_flight: u64,
}

/// What one run recorded.
#[derive(Clone, Debug)]
pub struct Run {
    /// The algorithm's name.
    pub algorithm: &'static str,
    /// The limit over time, every `sample_every`.
    pub series: Vec<Point>,
    /// Admitted requests: (admitted at, latency), ns.
    pub admitted: Vec<(u64, u64)>,
    /// Arrival times (ns) of refused requests.
    pub refused: Vec<u64>,
}

/// Runs `algorithm` against `scenario`.
pub fn simulate<A: LimitAlgorithm>(algorithm: A, scenario: &Scenario) -> Run {
    let limiter = ConcurrencyLimiter::new(algorithm);
    let mut rng = SplitMix64::new(scenario.seed);
    let end = u64::try_from(scenario.duration.as_nanos()).unwrap_or(u64::MAX);
    let every = u64::try_from(scenario.sample_every.as_nanos())
        .unwrap_or(u64::MAX)
        .max(1);
    let mean_gap = 1e9 / scenario.arrival_rate;
    let mut out: HashMap<u64, (Token<'_, A>, u64)> = HashMap::new();
    let mut finishing: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new();
    let mut run = Run {
        algorithm: limiter.algorithm_name(),
        series: Vec::new(),
        admitted: Vec::new(),
        refused: Vec::new(),
    };
    let (mut next_arrival, mut next_point, mut id) = (0f64, 0u64, 0u64);
    loop {
        let arrival = next_arrival as u64;
        let completion = finishing.peek().map(|Reverse((at, _))| *at);
        let now = match completion {
            Some(at) if at <= arrival => at,
            _ => arrival,
        };
        while next_point <= now.min(end) {
            run.series.push(Point {
                at: next_point,
                limit: limiter.limit(),
                in_flight: limiter.in_flight(),
            });
            next_point += every;
        }
        if now >= end {
            break;
        }
        if completion == Some(now) {
            if let Some(Reverse((_, done))) = finishing.pop() {
                if let Some((token, latency)) = out.remove(&done) {
                    token.complete(Duration::from_nanos(latency));
                }
            }
            continue;
        }
        next_arrival += rng.exponential(mean_gap);
        let u = rng.next_f64();
        match limiter.acquire() {
            Some(token) => {
                let latency =
                    scenario
                        .upstream
                        .latency(Duration::from_nanos(now), limiter.in_flight(), u);
                run.admitted.push((now, latency));
                finishing.push(Reverse((now + latency, id)));
                out.insert(id, (token, latency));
                id += 1;
            }
            None => run.refused.push(now),
        }
    }
    run
}

impl Run {
    /// The earliest time in `[from, until)` after which every recorded limit up to `until` lies
    /// within `±tolerance` of `target` (as a time since `from`), or `None` if it never settles.
    pub fn settling_time(
        &self,
        target: u64,
        tolerance: f64,
        from: Duration,
        until: Duration,
    ) -> Option<Duration> {
        let (from, until) = (nanos(from), nanos(until));
        let within =
            |p: &Point| (p.limit as f64 - target as f64).abs() <= tolerance * target as f64;
        let span: Vec<&Point> = self
            .series
            .iter()
            .filter(|p| p.at >= from && p.at < until)
            .collect();
        let last_outside = span.iter().rposition(|p| !within(p));
        let settled = match last_outside {
            None => span.first()?,
            Some(i) => span.get(i + 1)?,
        };
        Some(Duration::from_nanos(settled.at - from))
    }

    /// Requests admitted per second during `[from, until)`.
    pub fn throughput(&self, from: Duration, until: Duration) -> f64 {
        let (a, b) = (nanos(from), nanos(until));
        let n = self
            .admitted
            .iter()
            .filter(|(at, _)| *at >= a && *at < b)
            .count();
        n as f64 / (until - from).as_secs_f64()
    }

    /// The share of arrivals refused during `[from, until)`.
    pub fn refused_share(&self, from: Duration, until: Duration) -> f64 {
        let (a, b) = (nanos(from), nanos(until));
        let refused = self
            .refused
            .iter()
            .filter(|at| **at >= a && **at < b)
            .count();
        let admitted = self
            .admitted
            .iter()
            .filter(|(at, _)| *at >= a && *at < b)
            .count();
        refused as f64 / (refused + admitted).max(1) as f64
    }

    /// The share of arrivals refused in each slot of length `slot` from the run's start.
    pub fn refused_shares(&self, slot: Duration) -> Vec<f64> {
        let slot = nanos(slot).max(1);
        let last = self
            .refused
            .iter()
            .copied()
            .chain(self.admitted.iter().map(|(at, _)| *at))
            .max()
            .unwrap_or(0);
        let slots = usize::try_from(last / slot + 1).unwrap_or(usize::MAX);
        let (mut refused, mut all) = (vec![0u64; slots], vec![0u64; slots]);
        for &at in &self.refused {
            let i = (at / slot) as usize;
            refused[i] += 1;
            all[i] += 1;
        }
        for &(at, _) in &self.admitted {
            all[(at / slot) as usize] += 1;
        }
        refused
            .iter()
            .zip(&all)
            .map(|(&r, &a)| r as f64 / a.max(1) as f64)
            .collect()
    }

    /// The `q`-quantile (0..=1) of the latency of requests admitted during `[from, until)`.
    pub fn latency_quantile(&self, q: f64, from: Duration, until: Duration) -> Option<Duration> {
        let (a, b) = (nanos(from), nanos(until));
        let mut latencies: Vec<u64> = self
            .admitted
            .iter()
            .filter(|(at, _)| *at >= a && *at < b)
            .map(|(_, l)| *l)
            .collect();
        if latencies.is_empty() {
            return None;
        }
        latencies.sort_unstable();
        let i = ((latencies.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
        Some(Duration::from_nanos(latencies[i]))
    }

    /// The mean, lowest and highest recorded limit during `[from, until)`.
    pub fn limit_range(&self, from: Duration, until: Duration) -> Option<(f64, u64, u64)> {
        let (a, b) = (nanos(from), nanos(until));
        let span: Vec<u64> = self
            .series
            .iter()
            .filter(|p| p.at >= a && p.at < b)
            .map(|p| p.limit)
            .collect();
        let (lo, hi) = (*span.iter().min()?, *span.iter().max()?);
        Some((span.iter().sum::<u64>() as f64 / span.len() as f64, lo, hi))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
