//! A deterministic thundering-herd simulation: how much work each retry strategy costs a
//! rate-limited server after a shared failure, and how long the last client waits.
//!
//! # Model
//! * Virtual time in nanoseconds; a discrete-event loop (a min-heap of `(time, client)`,
//!   ties broken by client index). Nothing reads a real clock.
//! * `N` clients all make their first call at `t = 0` and all fail together (a shared
//!   outage, e.g. a dropped connection: no `Retry-After`). That call counts as work but is
//!   not seen by the rate limiter.
//! * Each client then retries until it is admitted. Calls take no time; a call's outcome is
//!   decided at the instant it is made.
//! * The server admits a fixed rate with a GCRA (the token bucket's virtual-scheduling form,
//!   written inline here, so the whole model reads in one file): emission interval
//!   `T = 1 s / rate`, tolerance `τ = T·(burst − 1)`, so it admits `burst` at once from idle and
//!   then one per `T`. A request at `t` is admitted iff `t ≥ TAT − τ`, and then
//!   `TAT = max(TAT, t) + T`.
//! * A denied client asks its [`Backoff`] (unlimited attempts, the given base and cap) for
//!   the next delay. In the [`Strategy::RetryAfter`] runs the server's 429 carries
//!   `Retry-After`: the GCRA's time until the next admission, rounded *up* to whole seconds
//!   as delay-seconds must be, and the client waits that plus its [`ServerJitter`] extra
//!   (none: exactly the server's wait, the rule before issue 11; the default: up to 50 %, at
//!   most 1 s), as [`RetryPolicy`](tollgate_client::RetryPolicy) does. The first retry after the
//!   shared failure has no header and uses the fallback jitter.
//! * Every client has its own RNG ([`rand::rngs::StdRng`]) seeded from the run's seed and
//!   its index, so a seed fixes the whole run.
//!
//! # Measured
//! Total calls (the work the server absorbs, including the failed calls at `t = 0`), the
//! virtual time at which the median and the last client were admitted, and the peak number of
//! retries after a 429 that land in one [`PEAK_WINDOW`] (100 ms, the simulated servers'
//! emission interval: the strict server admits one request per window, so a peak of 40 means
//! at least 39 denials at once). Each client's first retry, which follows the shared failure
//! rather than a 429, is left out of the peak: every strategy spreads it the same way.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;

use tollgate_client::{Backoff, BackoffError, BackoffState, Jitter, ServerJitter};

/// Saturating conversion of a duration to whole nanoseconds in `u64`.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// How a simulated client chooses its waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Capped exponential backoff with this jitter; the server sends no hints.
    Backoff(Jitter),
    /// The server's 429 carries `Retry-After` (whole seconds), which the client waits plus its
    /// `server_jitter` extra; `fallback` jitter covers the first retry after the shared failure.
    RetryAfter {
        /// Jitter for waits without a server hint.
        fallback: Jitter,
        /// The bounded extra over the server's wait ([`ServerJitter::NONE`]: exactly the wait).
        server_jitter: ServerJitter,
    },
}

impl Strategy {
    /// `Retry-After` obeyed exactly (the client before issue 11), full jitter as the fallback.
    pub const RETRY_AFTER_EXACT: Strategy = Strategy::RetryAfter {
        fallback: Jitter::Full,
        server_jitter: ServerJitter::NONE,
    };

    /// `Retry-After` plus the default [`ServerJitter`], full jitter as the fallback (the
    /// client's default).
    pub const RETRY_AFTER_JITTERED: Strategy = Strategy::RetryAfter {
        fallback: Jitter::Full,
        server_jitter: ServerJitter::DEFAULT,
    };

    /// The six strategies of the herd report: the four jitters, then `Retry-After` obeyed
    /// exactly and with the default extra.
    pub const REPORT: [Strategy; 6] = [
        Strategy::Backoff(Jitter::None),
        Strategy::Backoff(Jitter::Full),
        Strategy::Backoff(Jitter::Equal),
        Strategy::Backoff(Jitter::Decorrelated),
        Strategy::RETRY_AFTER_EXACT,
        Strategy::RETRY_AFTER_JITTERED,
    ];

    /// A short label: the jitter name; `retry-after` (exact), `retry-after+jitter` (the default
    /// extra), or `retry-after+P%<=Xms` for another extra; `/fallback` when that is not full.
    pub fn label(&self) -> String {
        match *self {
            Strategy::Backoff(j) => j.name().to_owned(),
            Strategy::RetryAfter {
                fallback,
                server_jitter,
            } => {
                let mut label = if server_jitter == ServerJitter::NONE {
                    "retry-after".to_owned()
                } else if server_jitter == ServerJitter::DEFAULT {
                    "retry-after+jitter".to_owned()
                } else {
                    format!(
                        "retry-after+{}%<={}ms",
                        server_jitter.percent,
                        server_jitter.max_extra.as_millis()
                    )
                };
                if fallback != Jitter::Full {
                    label.push('/');
                    label.push_str(fallback.name());
                }
                label
            }
        }
    }

    fn fallback(&self) -> Jitter {
        match *self {
            Strategy::Backoff(j) | Strategy::RetryAfter { fallback: j, .. } => j,
        }
    }

    fn server_jitter(&self) -> ServerJitter {
        match *self {
            Strategy::Backoff(_) => ServerJitter::NONE,
            Strategy::RetryAfter { server_jitter, .. } => server_jitter,
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

/// The simulated server's admission rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Server {
    /// Requests admitted per second in steady state.
    pub rate_per_sec: u32,
    /// Requests admitted at once from idle.
    pub burst: u32,
}

impl Server {
    /// 10 requests per second, burst 10: a refilled bucket serves a clump of 10 at once.
    pub const BURST_10: Server = Server {
        rate_per_sec: 10,
        burst: 10,
    };
    /// 10 requests per second, burst 1: one admission per 100 ms, so clients arriving
    /// together contend for a single slot (the setting of the classic backoff simulations).
    pub const STRICT: Server = Server {
        rate_per_sec: 10,
        burst: 1,
    };
}

impl Default for Server {
    /// [`Server::BURST_10`].
    fn default() -> Self {
        Server::BURST_10
    }
}

/// One simulation's inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HerdConfig {
    /// Number of clients that fail together at `t = 0`.
    pub clients: u32,
    /// How clients choose their waits.
    pub strategy: Strategy,
    /// Backoff base (first un-jittered delay).
    pub base: Duration,
    /// Backoff cap.
    pub cap: Duration,
    /// The server's rate limit.
    pub server: Server,
    /// Seed for every client's RNG.
    pub seed: u64,
}

impl HerdConfig {
    /// `clients` clients with `strategy`, base 100 ms, cap 10 s (the [`Backoff`] defaults),
    /// the default [`Server`], seed 0.
    pub fn new(clients: u32, strategy: Strategy) -> Self {
        let defaults = Backoff::default();
        HerdConfig {
            clients,
            strategy,
            base: defaults.base(),
            cap: defaults.cap(),
            server: Server::default(),
            seed: 0,
        }
    }

    /// The same configuration with another seed.
    #[must_use]
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
}

/// Why a simulation could not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HerdError {
    /// The backoff base and cap do not form a valid [`Backoff`].
    Backoff(BackoffError),
    /// The server's rate or burst is zero: nobody could ever be admitted.
    ZeroServerRate,
    /// More than [`MAX_EVENTS`] calls without every client finishing.
    TooManyEvents,
}

impl fmt::Display for HerdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HerdError::Backoff(e) => write!(f, "invalid backoff: {e}"),
            HerdError::ZeroServerRate => f.write_str("server rate and burst must be non-zero"),
            HerdError::TooManyEvents => {
                write!(
                    f,
                    "simulation exceeded {MAX_EVENTS} calls without finishing"
                )
            }
        }
    }
}

impl std::error::Error for HerdError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HerdError::Backoff(e) => Some(e),
            _ => None,
        }
    }
}

/// Upper bound on simulated calls, so a pathological configuration ends with an error.
pub const MAX_EVENTS: u64 = 50_000_000;

/// The window over which [`HerdOutcome::peak_retries`] counts retries: 100 ms, one emission
/// interval of the simulated 10 req/s servers.
pub const PEAK_WINDOW: Duration = Duration::from_millis(100);

/// One simulation's result.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HerdOutcome {
    /// The configuration that produced it.
    pub config: HerdConfig,
    /// Every call made, including the `N` failed calls at `t = 0`.
    pub total_calls: u64,
    /// Calls the rate limiter denied.
    pub denied_calls: u64,
    /// When the median client was admitted (mean of the two middle ones for even `N`).
    pub median_done: Duration,
    /// When the last client was admitted.
    pub last_done: Duration,
    /// The most retries after a 429 (every call but the first two of each client) in one
    /// aligned [`PEAK_WINDOW`] (`[k·100 ms, (k+1)·100 ms)`).
    pub peak_retries: u64,
}

/// The inline GCRA rate limiter.
struct Gcra {
    tat: u64,
    interval: u64,
    tolerance: u64,
}

impl Gcra {
    fn new(server: Server) -> Self {
        let interval = 1_000_000_000 / u64::from(server.rate_per_sec);
        Gcra {
            tat: 0,
            interval,
            tolerance: interval * u64::from(server.burst - 1),
        }
    }

    /// `Ok(())` if admitted at `now`, else `Err(wait until the next admission)`.
    fn decide(&mut self, now: u64) -> Result<(), u64> {
        let earliest = self.tat.saturating_sub(self.tolerance);
        if now < earliest {
            return Err(earliest - now);
        }
        self.tat = self.tat.max(now).saturating_add(self.interval);
        Ok(())
    }
}

/// Run one simulation.
///
/// ```
/// use tollgate_client::Jitter;
/// use tollgate_lab::herd::{simulate, HerdConfig, Strategy};
///
/// let run = simulate(&HerdConfig::new(25, Strategy::Backoff(Jitter::Full)))?;
/// assert!(run.total_calls >= 50); // 25 failures at t = 0, then at least one call each
/// # Ok::<(), tollgate_lab::herd::HerdError>(())
/// ```
///
/// # Errors
/// [`HerdError`] for an invalid base/cap, a zero server rate, or a run over [`MAX_EVENTS`].
pub fn simulate(config: &HerdConfig) -> Result<HerdOutcome, HerdError> {
    if config.server.rate_per_sec == 0 || config.server.burst == 0 {
        return Err(HerdError::ZeroServerRate);
    }
    let backoff = Backoff::builder()
        .base(config.base)
        .cap(config.cap)
        .unlimited_attempts()
        .unlimited_elapsed()
        .jitter(config.strategy.fallback())
        .server_jitter(config.strategy.server_jitter())
        .build()
        .map_err(HerdError::Backoff)?;
    let honour_retry_after = matches!(config.strategy, Strategy::RetryAfter { .. });
    let mut server = Gcra::new(config.server);

    let n = config.clients as usize;
    let mut states = vec![BackoffState::new(); n];
    let mut rngs: Vec<StdRng> = (0..u64::from(config.clients))
        .map(|i| StdRng::seed_from_u64(config.seed ^ (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)))
        .collect();
    let mut done = Vec::with_capacity(n);
    let mut heap = BinaryHeap::with_capacity(n);

    // Every client's first call fails at t = 0 without reaching the limiter.
    let mut total_calls = u64::from(config.clients);
    let mut denied_calls = 0u64;
    for (i, (state, rng)) in states.iter_mut().zip(rngs.iter_mut()).enumerate() {
        let wait = next_wait(&backoff, state, rng, 0, None);
        heap.push(Reverse((wait, i)));
    }

    // Events pop in time order, so one running count per window finds the peak.
    let window = nanos(PEAK_WINDOW);
    let mut after_429 = vec![false; n];
    let (mut current_window, mut in_window, mut peak_retries) = (0u64, 0u64, 0u64);
    while let Some(Reverse((now, i))) = heap.pop() {
        total_calls += 1;
        if total_calls > MAX_EVENTS {
            return Err(HerdError::TooManyEvents);
        }
        if after_429[i] {
            if now / window != current_window {
                (current_window, in_window) = (now / window, 0);
            }
            in_window += 1;
            peak_retries = peak_retries.max(in_window);
        }
        match server.decide(now) {
            Ok(()) => done.push(now),
            Err(until_admissible) => {
                denied_calls += 1;
                after_429[i] = true;
                let hint = honour_retry_after.then(|| {
                    // delay-seconds is an integer: round up so the retry is never early.
                    let secs = until_admissible.div_ceil(1_000_000_000);
                    Duration::from_secs(secs)
                });
                let wait = next_wait(&backoff, &mut states[i], &mut rngs[i], now, hint);
                heap.push(Reverse((now.saturating_add(wait), i)));
            }
        }
    }

    done.sort_unstable();
    let median = match done.len() {
        0 => 0,
        len if len % 2 == 1 => done[len / 2],
        len => done[len / 2 - 1] / 2 + done[len / 2] / 2,
    };
    Ok(HerdOutcome {
        config: *config,
        total_calls,
        denied_calls,
        median_done: Duration::from_nanos(median),
        last_done: Duration::from_nanos(done.last().copied().unwrap_or(0)),
        peak_retries,
    })
}

/// The next wait in nanoseconds. With unlimited attempts and elapsed time, and server hints
/// (at most a few seconds) below the cap, `next_delay` never gives up; if it ever did, the
/// cap is the conservative wait.
fn next_wait(
    backoff: &Backoff,
    state: &mut BackoffState,
    rng: &mut StdRng,
    now: u64,
    hint: Option<Duration>,
) -> u64 {
    backoff
        .next_delay(state, rng, Duration::from_nanos(now), hint)
        .map_or_else(|_| nanos(backoff.cap()), nanos)
}

/// Mean results over several seeds for one `(strategy, clients)` cell of the report.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SweepRow {
    /// The simulated server.
    pub server: Server,
    /// The strategy label ([`Strategy::label`]).
    pub strategy: String,
    /// Number of clients.
    pub clients: u32,
    /// Seeds averaged.
    pub seeds: u32,
    /// Mean total calls.
    pub mean_calls: f64,
    /// Fewest total calls over the seeds.
    pub min_calls: u64,
    /// Most total calls over the seeds.
    pub max_calls: u64,
    /// Mean time until the median client was admitted, in seconds.
    pub mean_median_done_s: f64,
    /// Mean time until the last client was admitted, in seconds.
    pub mean_last_done_s: f64,
    /// Worst time until the last client was admitted, in seconds.
    pub max_last_done_s: f64,
    /// Mean of [`HerdOutcome::peak_retries`] (most retries in one 100 ms window).
    pub mean_peak_retries: f64,
    /// Largest [`HerdOutcome::peak_retries`] over the seeds.
    pub max_peak_retries: u64,
}

/// Run every `(strategy, clients)` pair over `seeds` seeds (0, 1, ...) starting from
/// `template` (whose `clients`, `strategy` and `seed` are replaced), in the given order.
///
/// # Errors
/// The first [`HerdError`] any run returns.
pub fn sweep(
    template: &HerdConfig,
    strategies: &[Strategy],
    clients: &[u32],
    seeds: u32,
) -> Result<Vec<SweepRow>, HerdError> {
    let mut rows = Vec::with_capacity(strategies.len() * clients.len());
    for &strategy in strategies {
        for &n in clients {
            let mut runs = Vec::with_capacity(seeds as usize);
            for seed in 0..seeds {
                let config = HerdConfig {
                    clients: n,
                    strategy,
                    seed: u64::from(seed),
                    ..*template
                };
                runs.push(simulate(&config)?);
            }
            // Sum exact integers (calls, nanoseconds) and divide once, so the means carry no
            // accumulated floating-point noise.
            let k = u128::from(seeds.max(1));
            let mean = |f: &dyn Fn(&HerdOutcome) -> u128| {
                let total: u128 = runs.iter().map(f).sum();
                total as f64 / k as f64
            };
            rows.push(SweepRow {
                server: template.server,
                strategy: strategy.label(),
                clients: n,
                seeds,
                mean_calls: mean(&|r| u128::from(r.total_calls)),
                min_calls: runs.iter().map(|r| r.total_calls).min().unwrap_or(0),
                max_calls: runs.iter().map(|r| r.total_calls).max().unwrap_or(0),
                mean_median_done_s: mean(&|r| r.median_done.as_nanos()) / 1e9,
                mean_last_done_s: mean(&|r| r.last_done.as_nanos()) / 1e9,
                max_last_done_s: runs
                    .iter()
                    .map(|r| r.last_done.as_secs_f64())
                    .fold(0.0, f64::max),
                mean_peak_retries: mean(&|r| u128::from(r.peak_retries)),
                max_peak_retries: runs.iter().map(|r| r.peak_retries).max().unwrap_or(0),
            });
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZES: [u32; 4] = [10, 25, 50, 100];

    fn calls(strategy: Strategy, n: u32, seed: u64) -> u64 {
        simulate(&HerdConfig::new(n, strategy).with_seed(seed))
            .expect("valid config")
            .total_calls
    }

    #[test]
    fn deterministic_for_a_seed() {
        for strategy in Strategy::REPORT {
            let a = simulate(&HerdConfig::new(50, strategy).with_seed(7)).unwrap();
            let b = simulate(&HerdConfig::new(50, strategy).with_seed(7)).unwrap();
            assert_eq!(a, b, "{strategy}");
        }
        // And the seed matters for a jittered strategy.
        let s = Strategy::Backoff(Jitter::Full);
        assert_ne!(
            simulate(&HerdConfig::new(50, s).with_seed(1)).unwrap(),
            simulate(&HerdConfig::new(50, s).with_seed(2)).unwrap()
        );
    }

    #[test]
    fn every_client_finishes_and_work_adds_up() {
        for strategy in Strategy::REPORT {
            for n in SIZES {
                let r = simulate(&HerdConfig::new(n, strategy).with_seed(3)).unwrap();
                // N failures at t = 0, N admissions, the rest denials.
                assert_eq!(
                    r.total_calls,
                    2 * u64::from(n) + r.denied_calls,
                    "{strategy} {n}"
                );
                assert!(r.median_done <= r.last_done);
                // 10/s with burst 10 cannot admit N before (N - 10) / 10 seconds.
                let floor = Duration::from_millis(u64::from(n.saturating_sub(10)) * 100);
                assert!(r.last_done >= floor, "{strategy} {n}: {:?}", r.last_done);
            }
        }
    }

    fn mean_calls(server: Server, strategy: Strategy, n: u32) -> u64 {
        let seeds = 10;
        (0..seeds)
            .map(|seed| {
                let c = HerdConfig {
                    server,
                    ..HerdConfig::new(n, strategy).with_seed(seed)
                };
                simulate(&c).expect("valid config").total_calls
            })
            .sum::<u64>()
            / seeds
    }

    const STRICT: Server = Server::STRICT;
    const BURSTY: Server = Server::BURST_10;

    #[test]
    fn strict_pacing_shows_the_literature_shape() {
        // One admission per 100 ms, no burst: the contention setting of the classic
        // simulations. No jitter is clearly the most work, full jitter far less.
        for n in [25, 50, 100] {
            let none = mean_calls(STRICT, Strategy::Backoff(Jitter::None), n);
            let full = mean_calls(STRICT, Strategy::Backoff(Jitter::Full), n);
            for jitter in [Jitter::Full, Jitter::Equal, Jitter::Decorrelated] {
                let other = mean_calls(STRICT, Strategy::Backoff(jitter), n);
                // "Clearly": at least twice the work of any jittered strategy.
                assert!(none > 2 * other, "n={n}: none {none} vs {jitter} {other}");
            }
            assert!(full * 2 < none, "n={n}: full {full} vs none {none}");
        }
    }

    #[test]
    fn with_a_burst_no_jitter_costs_time_more_than_work() {
        // A burst-10 bucket serves a synchronized clump of 10 per refill, so jitter saves
        // little work until the herd is large, but no jitter strands idle capacity between
        // rounds and its last client finishes far later.
        let s = |j| Strategy::Backoff(j);
        for n in [10, 25, 50, 100] {
            if n == 10 {
                for strategy in Strategy::REPORT {
                    assert_eq!(
                        calls(strategy, n, 0),
                        20,
                        "burst absorbs everyone: {strategy}"
                    );
                }
                continue;
            }
            let last = |j| simulate(&HerdConfig::new(n, s(j))).unwrap().last_done;
            let none = last(Jitter::None);
            for jitter in [Jitter::Full, Jitter::Equal, Jitter::Decorrelated] {
                assert!(none > last(jitter), "n={n}: none {none:?} vs {jitter}");
            }
        }
        let none = mean_calls(BURSTY, s(Jitter::None), 100);
        let full = mean_calls(BURSTY, s(Jitter::Full), 100);
        assert!(full * 10 < none * 9, "n=100: full {full} vs none {none}");
    }

    fn mean_of(server: Server, strategy: Strategy, n: u32, f: fn(&HerdOutcome) -> u64) -> u64 {
        let seeds = 10;
        (0..seeds)
            .map(|seed| {
                let c = HerdConfig {
                    server,
                    ..HerdConfig::new(n, strategy).with_seed(seed)
                };
                f(&simulate(&c).expect("valid config"))
            })
            .sum::<u64>()
            / seeds
    }

    #[test]
    fn jitter_over_retry_after_breaks_up_the_herd() {
        // Issue 11, point 8: obeyed exactly, the strict server's Retry-After brings every
        // denied client back in the same 100 ms; the bounded extra spreads them.
        let (exact, jittered) = (Strategy::RETRY_AFTER_EXACT, Strategy::RETRY_AFTER_JITTERED);
        for n in [25, 50, 100] {
            let calls = |s| mean_of(STRICT, s, n, |r| r.total_calls);
            let peak = |s| mean_of(STRICT, s, n, |r| r.peak_retries);
            let last = |s| mean_of(STRICT, s, n, |r| nanos(r.last_done));
            assert!(
                2 * calls(jittered) < calls(exact),
                "n={n}: calls {} vs {}",
                calls(jittered),
                calls(exact)
            );
            // Exact: all but the one admitted come back together.
            assert!(peak(exact) + 1 >= u64::from(n), "n={n}: {}", peak(exact));
            assert!(2 * peak(jittered) < peak(exact), "n={n}");
            assert!(last(jittered) < last(exact), "n={n}");
        }
        // Against the burst-10 bucket it costs no more work, and the last client is late by
        // well under the 1 s bound of one extra.
        for n in [25, 50, 100] {
            let calls = |s| mean_of(BURSTY, s, n, |r| r.total_calls);
            let last = |s| mean_of(BURSTY, s, n, |r| nanos(r.last_done));
            assert!(calls(jittered) <= calls(exact), "n={n}");
            assert!(last(jittered) < last(exact) + 1_000_000_000, "n={n}");
        }
    }

    #[test]
    fn peak_counts_retries_after_a_429_per_window() {
        // 10 clients against burst 10: everyone is admitted on the first retry, which follows
        // the shared failure, not a 429: no peak.
        let r = simulate(&HerdConfig::new(10, Strategy::RETRY_AFTER_EXACT)).unwrap();
        assert_eq!(r.peak_retries, 0);
        // Strict server, exact Retry-After: 11 clients, one admitted in the first round, the
        // other 10 told the same whole second come back inside one window.
        let c = HerdConfig {
            server: STRICT,
            ..HerdConfig::new(11, Strategy::RETRY_AFTER_EXACT)
        };
        assert!(simulate(&c).unwrap().peak_retries >= 9);
    }

    #[test]
    fn gcra_admits_burst_then_rate() {
        let mut g = Gcra::new(Server {
            rate_per_sec: 10,
            burst: 10,
        });
        for _ in 0..10 {
            assert_eq!(g.decide(0), Ok(()));
        }
        assert_eq!(g.decide(0), Err(100_000_000));
        assert_eq!(g.decide(100_000_000), Ok(()));
        assert_eq!(g.decide(100_000_000), Err(100_000_000));
    }

    #[test]
    fn rejects_bad_configs() {
        let mut c = HerdConfig::new(10, Strategy::Backoff(Jitter::Full));
        c.server.rate_per_sec = 0;
        assert_eq!(simulate(&c), Err(HerdError::ZeroServerRate));
        let mut c = HerdConfig::new(10, Strategy::Backoff(Jitter::Full));
        c.base = Duration::ZERO;
        assert_eq!(
            simulate(&c),
            Err(HerdError::Backoff(BackoffError::ZeroBase))
        );
    }
}
