//! Time sources.
//!
//! Every algorithm takes `now` as an argument and never reads a clock itself; the storage types
//! ([`AtomicLimiter`](crate::AtomicLimiter), [`SlidingLog`](crate::SlidingLog),
//! [`Shaper`](crate::Shaper)) read their [`Clock`] once per decision. Time is a plain [`Nanos`]:
//! nanoseconds since the clock's own epoch, which in a `u64` spans 584 years.

use std::fmt;
use std::sync::OnceLock;
use std::time::Duration;

use crate::sync::{Arc, AtomicU64, Ordering};

/// Nanoseconds since a clock's epoch (for [`MonotonicClock`], the moment it was created).
pub type Nanos = u64;

/// Converts a [`Duration`] to [`Nanos`], or `None` when it does not fit in a `u64` (584 years).
#[inline]
pub fn duration_to_nanos(duration: Duration) -> Option<Nanos> {
    u64::try_from(duration.as_nanos()).ok()
}

/// A source of monotonic time for limiters.
///
/// Implementations must be cheap (one call per decision) and should never go backwards; the
/// algorithms tolerate a clock that does (they decide conservatively: never more admissions, and no
/// panic), which [`ManualClock`] lets tests exercise.
pub trait Clock: Send + Sync {
    /// Nanoseconds since this clock's epoch.
    fn now(&self) -> Nanos;
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    #[inline]
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

/// The default clock: quanta's TSC-based monotonic clock (falling back to the OS monotonic clock where
/// the TSC is not usable), measured from this value's creation.
///
/// A reading costs a `rdtsc` and a multiply (around 10–20 ns), with nanosecond resolution; quanta
/// calibrates the TSC against the OS clock once per process, so the first `new` takes a few
/// milliseconds. Cloning keeps the same epoch.
///
/// ```
/// use tollgate_core::{Clock, MonotonicClock};
/// let clock = MonotonicClock::new();
/// let a = clock.now();
/// assert!(clock.now() >= a);
/// ```
#[derive(Clone)]
pub struct MonotonicClock {
    clock: quanta::Clock,
    origin: u64,
}

impl MonotonicClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        MonotonicClock { clock, origin }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MonotonicClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MonotonicClock").finish_non_exhaustive()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> Nanos {
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
    }
}

/// A cached clock: reads quanta's "recent" time, a value a background upkeep thread refreshes every
/// `interval`. A reading is a single relaxed load (about 1 ns) but lags real time by up to one
/// `interval` plus scheduling delay of the upkeep thread.
///
/// What the lag means for limiting: decisions are made as if they happened up to `interval` earlier,
/// so a request may be denied up to `interval` longer than strictly necessary and `retry_after` may be
/// short by up to `interval`. Nothing is ever over-admitted because of it — a stale `now` only makes
/// every algorithm more conservative.
///
/// quanta keeps one upkeep thread per process: the first `CoarseClock::new` starts it with its
/// `interval`, later calls share it (and its interval), and it runs until the process exits.
#[derive(Clone)]
pub struct CoarseClock {
    clock: quanta::Clock,
    origin: quanta::Instant,
    interval: Duration,
}

/// The upkeep thread handle, kept alive for the life of the process, with its interval.
static UPKEEP: OnceLock<Result<(quanta::Handle, Duration), String>> = OnceLock::new();

impl CoarseClock {
    /// Starts (or reuses) the upkeep thread refreshing every `interval` and returns a clock reading it.
    ///
    /// # Errors
    /// [`ClockError::Upkeep`] if the upkeep thread could not be started.
    pub fn new(interval: Duration) -> Result<Self, ClockError> {
        let started = UPKEEP.get_or_init(|| {
            quanta::Upkeep::new(interval)
                .start()
                .map(|handle| (handle, interval))
                .map_err(|e| e.to_string())
        });
        let interval = match started {
            Ok((_, interval)) => *interval,
            Err(e) => return Err(ClockError::Upkeep(e.clone())),
        };
        let clock = quanta::Clock::new();
        let origin = quanta::Clock::recent(&clock);
        Ok(CoarseClock {
            clock,
            origin,
            interval,
        })
    }

    /// The refresh interval of the shared upkeep thread: the precision of this clock.
    pub fn interval(&self) -> Duration {
        self.interval
    }
}

impl fmt::Debug for CoarseClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoarseClock")
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> Nanos {
        let elapsed = self.clock.recent().saturating_duration_since(self.origin);
        duration_to_nanos(elapsed).unwrap_or(Nanos::MAX)
    }
}

/// Why a clock could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClockError {
    /// quanta's upkeep thread failed to start; the message is quanta's.
    Upkeep(String),
}

impl fmt::Display for ClockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClockError::Upkeep(e) => write!(f, "could not start the clock upkeep thread: {e}"),
        }
    }
}

impl std::error::Error for ClockError {}

/// A clock that moves only when told to: for tests, simulation and loom models.
///
/// Clones share the same time, so a test can keep one handle and give another to a limiter. It may
/// be set backwards, to check that limiters stay safe when a real clock misbehaves.
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::{Clock, ManualClock};
/// let clock = ManualClock::new();
/// clock.advance(Duration::from_millis(1500));
/// assert_eq!(clock.now(), 1_500_000_000);
/// clock.set(10);
/// assert_eq!(clock.now(), 10);
/// ```
#[derive(Clone, Debug)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading 0.
    pub fn new() -> Self {
        Self::starting_at(0)
    }

    /// A clock reading `now`.
    pub fn starting_at(now: Nanos) -> Self {
        ManualClock {
            now: Arc::new(AtomicU64::new(now)),
        }
    }

    /// Moves the clock forward by `by` (saturating at [`Nanos::MAX`]).
    pub fn advance(&self, by: Duration) {
        let by = duration_to_nanos(by).unwrap_or(Nanos::MAX);
        // Relaxed: the clock's value is the only data it publishes; callers that need ordering with
        // other memory synchronise through their own means (a test's thread join, say).
        let _ = self
            .now
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(by))
            });
    }

    /// Sets the clock to `now`, forwards or backwards.
    pub fn set(&self, now: Nanos) {
        // Relaxed: as in `advance`.
        self.now.store(now, Ordering::Relaxed);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> Nanos {
        // Relaxed: as in `advance`.
        self.now.load(Ordering::Relaxed)
    }
}
