//! The limit algorithms: what the in-flight limit should be, given the requests that finished.
//!
//! A [`LimitAlgorithm`] never reads a clock: the caller measures each request's latency and hands
//! it in through [`Token::complete`](crate::Token::complete). So the same algorithm runs in a
//! server and in the simulator ([`crate::sim`]) unchanged, and a simulation is exactly
//! reproducible.

use std::fmt;
use std::time::Duration;

/// One finished request, as a limit algorithm sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// How long it took; `None` when it was dropped (its token was dropped without
    /// [`complete`](crate::Token::complete): cancelled, failed, panicked).
    pub latency: Option<Duration>,
    /// Requests in flight when it was admitted, itself included: how busy the limit was.
    pub in_flight: u64,
    /// The limit it was admitted under: an algorithm can tell samples that saw its latest limit
    /// from those admitted before the limit moved.
    pub limit: u64,
}

/// An in-flight limit that may move with what it observes.
///
/// The limiter ([`ConcurrencyLimiter`](crate::ConcurrencyLimiter)) calls
/// [`on_sample`](Self::on_sample) once per finished request, under its lock, and admits new
/// requests against the value returned.
pub trait LimitAlgorithm: Send {
    /// A short stable name (`"fixed"`, `"aimd"`, `"gradient"`), for reports.
    fn name(&self) -> &'static str;
    /// The limit before any sample.
    fn initial_limit(&self) -> u64;
    /// Takes one finished request into account and returns the limit from now on (at least 1).
    fn on_sample(&mut self, sample: Sample) -> u64;
}

/// Why a limit algorithm's parameters were refused.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum LimitConfigError {
    /// A limit of 0 would admit nothing, ever.
    ZeroLimit,
    /// `min_limit <= initial_limit <= max_limit` does not hold.
    Bounds {
        /// The lower bound.
        min: u64,
        /// The starting limit.
        initial: u64,
        /// The upper bound.
        max: u64,
    },
    /// A factor outside its range (the field's name and the value given).
    Factor {
        /// The field.
        field: &'static str,
        /// The value given.
        value: f64,
    },
    /// A count that must be at least 1 (the field's name).
    ZeroCount(&'static str),
    /// A zero latency threshold.
    ZeroTimeout,
}

impl fmt::Display for LimitConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitConfigError::ZeroLimit => f.write_str("a limit of 0 admits nothing"),
            LimitConfigError::Bounds { min, initial, max } => write!(
                f,
                "need 1 <= min_limit ({min}) <= initial_limit ({initial}) <= max_limit ({max})"
            ),
            LimitConfigError::Factor { field, value } => {
                write!(f, "`{field}` = {value} is outside its range")
            }
            LimitConfigError::ZeroCount(field) => write!(f, "`{field}` must be at least 1"),
            LimitConfigError::ZeroTimeout => f.write_str("the latency threshold must be above 0"),
        }
    }
}

impl std::error::Error for LimitConfigError {}

/// Checks `1 <= min <= initial <= max`.
pub(crate) fn check_bounds(min: u64, initial: u64, max: u64) -> Result<(), LimitConfigError> {
    if min == 0 || min > initial || initial > max {
        return Err(LimitConfigError::Bounds { min, initial, max });
    }
    Ok(())
}

/// Checks `low < value <= high` (`value` finite).
pub(crate) fn check_factor(
    field: &'static str,
    value: f64,
    low: f64,
    high: f64,
) -> Result<(), LimitConfigError> {
    if value.is_finite() && value > low && value <= high {
        Ok(())
    } else {
        Err(LimitConfigError::Factor { field, value })
    }
}

/// A limit that never moves: what `limit_conn` and a semaphore do, for comparison and for
/// upstreams whose capacity is known.
///
/// ```
/// use tollgate_adaptive::{ConcurrencyLimiter, FixedLimit};
/// let limiter = ConcurrencyLimiter::new(FixedLimit::new(2)?);
/// let (a, b) = (limiter.acquire(), limiter.acquire());
/// assert!(a.is_some() && b.is_some());
/// assert!(limiter.acquire().is_none());
/// drop(a);
/// assert!(limiter.acquire().is_some());
/// # Ok::<(), tollgate_adaptive::LimitConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedLimit(u64);

impl FixedLimit {
    /// A fixed limit of `limit` requests in flight.
    ///
    /// # Errors
    /// [`LimitConfigError::ZeroLimit`] for 0.
    pub fn new(limit: u64) -> Result<Self, LimitConfigError> {
        if limit == 0 {
            return Err(LimitConfigError::ZeroLimit);
        }
        Ok(FixedLimit(limit))
    }
}

impl LimitAlgorithm for FixedLimit {
    fn name(&self) -> &'static str {
        "fixed"
    }
    fn initial_limit(&self) -> u64 {
        self.0
    }
    fn on_sample(&mut self, _: Sample) -> u64 {
        self.0
    }
}

/// Parameters of an [`AimdLimit`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AimdConfig {
    /// The limit before any sample (default 20).
    pub initial_limit: u64,
    /// Lower bound (default 1).
    pub min_limit: u64,
    /// Upper bound (default 1000).
    pub max_limit: u64,
    /// A request slower than this counts as a loss, like a drop (default 2 s; set it to about
    /// twice the upstream's unloaded latency for the limit to react to queueing at all).
    pub timeout: Duration,
    /// Multiplier applied on a loss (default 0.9), at most once per round of `limit` samples.
    pub backoff: f64,
}

impl Default for AimdConfig {
    fn default() -> Self {
        AimdConfig {
            initial_limit: 20,
            min_limit: 1,
            max_limit: 1000,
            timeout: Duration::from_secs(2),
            backoff: 0.9,
        }
    }
}

/// Additive increase, multiplicative decrease, as TCP Reno: +1 per round of `limit` successful
/// samples while the limit is in use, × `backoff` on a drop or a request slower than `timeout`
/// (at most once per round, so one burst of slow requests is one decrease, not a collapse).
///
/// It needs a loss signal: it settles where latency reaches `timeout`, however far that is past
/// the upstream's knee, and saws around it (see `results/concurrency/adaptive.md`).
#[derive(Clone, Debug)]
pub struct AimdLimit {
    config: AimdConfig,
    limit: f64,
    /// Samples left before another decrease may happen.
    cooldown: u64,
}

impl AimdLimit {
    /// An AIMD limit with these parameters.
    ///
    /// # Errors
    /// A [`LimitConfigError`] naming what is out of range.
    pub fn new(config: AimdConfig) -> Result<Self, LimitConfigError> {
        check_bounds(config.min_limit, config.initial_limit, config.max_limit)?;
        check_factor("backoff", config.backoff, 0.0, 1.0)?;
        if config.backoff >= 1.0 {
            return Err(LimitConfigError::Factor {
                field: "backoff",
                value: config.backoff,
            });
        }
        if config.timeout.is_zero() {
            return Err(LimitConfigError::ZeroTimeout);
        }
        Ok(AimdLimit {
            config,
            limit: config.initial_limit as f64,
            cooldown: 0,
        })
    }

    fn current(&self) -> u64 {
        // `limit` stays within [min, max], both u64.
        (self.limit as u64).clamp(self.config.min_limit, self.config.max_limit)
    }
}

impl LimitAlgorithm for AimdLimit {
    fn name(&self) -> &'static str {
        "aimd"
    }
    fn initial_limit(&self) -> u64 {
        self.config.initial_limit
    }
    fn on_sample(&mut self, sample: Sample) -> u64 {
        self.cooldown = self.cooldown.saturating_sub(1);
        let lost = sample.latency.is_none_or(|l| l > self.config.timeout);
        if lost {
            if self.cooldown == 0 {
                self.limit = (self.limit * self.config.backoff).max(self.config.min_limit as f64);
                self.cooldown = self.current();
            }
        } else if sample.in_flight * 2 >= self.current() {
            // +1 per `limit` samples: one per round trip of the whole window.
            self.limit = (self.limit + 1.0 / self.limit).min(self.config.max_limit as f64);
        }
        self.current()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(limit: u64, in_flight: u64) -> Sample {
        Sample {
            latency: Some(Duration::from_millis(5)),
            in_flight,
            limit,
        }
    }

    #[test]
    fn aimd_adds_one_per_round_and_cuts_once_per_round() {
        let mut aimd = AimdLimit::new(AimdConfig {
            initial_limit: 10,
            ..AimdConfig::default()
        })
        .unwrap();
        // One round of 10 busy samples: about +1.
        for _ in 0..10 {
            aimd.on_sample(ok(10, 10));
        }
        assert_eq!(aimd.current(), 10, "10.99: not a whole unit yet");
        aimd.on_sample(ok(10, 10));
        assert_eq!(aimd.current(), 11);
        // Idle samples (fewer than half the limit in flight) do not grow it.
        for _ in 0..100 {
            aimd.on_sample(ok(11, 2));
        }
        assert_eq!(aimd.current(), 11);
        // A burst of drops is one cut (× 0.9), not one per drop.
        for _ in 0..5 {
            aimd.on_sample(Sample {
                latency: None,
                in_flight: 11,
                limit: 11,
            });
        }
        assert_eq!(aimd.current(), 9);
        // So is a burst of requests slower than the timeout.
        let mut slow = AimdLimit::new(AimdConfig {
            initial_limit: 100,
            timeout: Duration::from_millis(20),
            ..AimdConfig::default()
        })
        .unwrap();
        for _ in 0..50 {
            slow.on_sample(Sample {
                latency: Some(Duration::from_millis(30)),
                in_flight: 100,
                limit: 100,
            });
        }
        assert_eq!(slow.current(), 90);
    }

    #[test]
    fn bad_limits_are_typed_errors() {
        assert_eq!(FixedLimit::new(0), Err(LimitConfigError::ZeroLimit));
        let bad = |config| AimdLimit::new(config).unwrap_err();
        let d = AimdConfig::default();
        assert!(matches!(
            bad(AimdConfig { min_limit: 0, ..d }),
            LimitConfigError::Bounds { .. }
        ));
        assert!(matches!(
            bad(AimdConfig { backoff: 1.0, ..d }),
            LimitConfigError::Factor {
                field: "backoff",
                ..
            }
        ));
        assert_eq!(
            bad(AimdConfig {
                timeout: Duration::ZERO,
                ..d
            }),
            LimitConfigError::ZeroTimeout
        );
    }
}
