//! Capped exponential backoff with jitter: the policy, its validated configuration and the
//! iterator of delays.
//!
//! All arithmetic is done on whole nanoseconds in `u64` with saturation, so a huge attempt
//! number or a huge `cap` never panics: `base·2^n` saturates at `u64::MAX` nanoseconds
//! (about 584 years) before the `cap` is applied.

use std::fmt;
use std::time::Duration;

use rand::Rng;

/// How randomness is mixed into the exponential delay.
///
/// Write `exp(n) = min(cap, base·2^n)` for retry number `n` (0 for the first retry).
///
/// | variant | delay before retry `n` |
/// | --- | --- |
/// | [`None`](Jitter::None) | `exp(n)` |
/// | [`Full`](Jitter::Full) | `random(0, exp(n))` |
/// | [`Equal`](Jitter::Equal) | `exp(n)/2 + random(0, exp(n)/2)` |
/// | [`Decorrelated`](Jitter::Decorrelated) | `min(cap, random(base, prev·3))`, `prev` = the previous delay, `base` before the first |
///
/// Ranges are inclusive and uniform over whole nanoseconds.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Jitter {
    /// No randomness: every client that failed together retries together.
    None,
    /// Uniform over `[0, exp(n)]`: the least total work in the herd simulation, Tollgate's default.
    #[default]
    Full,
    /// Half of `exp(n)` fixed plus a uniform half: never retries sooner than `exp(n)/2`.
    Equal,
    /// `min(cap, random(base, prev·3))`: each delay depends on the previous one, not on `n`.
    Decorrelated,
}

impl Jitter {
    /// Every variant, in the order the documentation and the herd report use.
    pub const ALL: [Jitter; 4] = [
        Jitter::None,
        Jitter::Full,
        Jitter::Equal,
        Jitter::Decorrelated,
    ];

    /// A short lowercase name (`"none"`, `"full"`, `"equal"`, `"decorrelated"`).
    pub const fn name(self) -> &'static str {
        match self {
            Jitter::None => "none",
            Jitter::Full => "full",
            Jitter::Equal => "equal",
            Jitter::Decorrelated => "decorrelated",
        }
    }
}

impl fmt::Display for Jitter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A small bounded extra wait on top of a wait the server asked for (`Retry-After`, or a
/// `RateLimit` `t` with nothing remaining), so that clients told the same wait do not all come
/// back at the same instant.
///
/// The delay is uniform over `[wait, wait + extra]` whole nanoseconds, with
/// `extra = min(max_extra, wait × percent / 100)`, drawn from the same seeded RNG as the backoff
/// jitter. It is **never earlier than the server asked**; the extra is shortened (never below
/// `wait`) where it would pass the backoff's `cap` or `max_elapsed`.
///
/// The default, [`ServerJitter::DEFAULT`], is up to 50 % of the wait and at most 1 s: a
/// `Retry-After: 1` becomes 1.0-1.5 s, `Retry-After: 2` 2-3 s, `Retry-After: 60` 60-61 s. In the
/// herd simulation (`results/herd/herd.md`), 100 clients obeying a strict server's
/// `Retry-After` made 806 calls instead of 5150, at most 23.9 retries per 100 ms instead of 99
/// (seed means), and the last one was done at 16.4 s instead of 99.1 s; 100 % spread a little
/// more (677 calls) at up to twice the server's wait. [`ServerJitter::NONE`] obeys the server
/// exactly.
///
/// ```
/// use std::time::Duration;
/// use tollgate_client::ServerJitter;
///
/// let j = ServerJitter::DEFAULT;
/// assert_eq!(j.max_extra_for(Duration::from_secs(1)), Duration::from_millis(500));
/// assert_eq!(j.max_extra_for(Duration::from_secs(60)), Duration::from_secs(1));
/// assert_eq!(ServerJitter::NONE.max_extra_for(Duration::from_secs(60)), Duration::ZERO);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ServerJitter {
    /// The largest extra as a percentage of the server's wait (0 disables the jitter; above 100
    /// allowed).
    pub percent: u32,
    /// The largest extra in absolute terms.
    pub max_extra: Duration,
}

impl ServerJitter {
    /// No extra: wait exactly what the server asked (the behaviour before issue 11).
    pub const NONE: ServerJitter = ServerJitter {
        percent: 0,
        max_extra: Duration::ZERO,
    };

    /// Up to 50 % of the server's wait, at most 1 s (the default).
    pub const DEFAULT: ServerJitter = ServerJitter {
        percent: 50,
        max_extra: Duration::from_secs(1),
    };

    /// `min(max_extra, wait × percent / 100)`: the most this adds to a server wait of `wait`
    /// (before the backoff's cap and elapsed limit shorten it).
    pub fn max_extra_for(&self, wait: Duration) -> Duration {
        let share = wait.as_nanos() * u128::from(self.percent) / 100;
        let share = Duration::from_nanos(u64::try_from(share).unwrap_or(u64::MAX));
        share.min(self.max_extra)
    }
}

impl Default for ServerJitter {
    /// [`ServerJitter::DEFAULT`].
    fn default() -> Self {
        ServerJitter::DEFAULT
    }
}

/// Why a [`BackoffBuilder`] refused its configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackoffError {
    /// `base` was zero: every exponential delay would be zero.
    ZeroBase,
    /// `cap` was below `base`: the first delay could never be reached.
    CapBelowBase {
        /// The configured base.
        base: Duration,
        /// The configured cap.
        cap: Duration,
    },
    /// `max_attempts` was zero: not even the first call would be made.
    ZeroMaxAttempts,
    /// `max_elapsed` was zero: use `max_attempts(1)` to disable retries.
    ZeroMaxElapsed,
}

impl fmt::Display for BackoffError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackoffError::ZeroBase => f.write_str("backoff base must be greater than zero"),
            BackoffError::CapBelowBase { base, cap } => {
                write!(f, "backoff cap {cap:?} is below its base {base:?}")
            }
            BackoffError::ZeroMaxAttempts => {
                f.write_str("max attempts must be at least 1 (the first call counts)")
            }
            BackoffError::ZeroMaxElapsed => f.write_str(
                "max elapsed must be greater than zero; use max_attempts(1) for no retries",
            ),
        }
    }
}

impl std::error::Error for BackoffError {}

/// A validated backoff policy: `base`, `cap`, optional attempt and elapsed-time limits, and a
/// [`Jitter`] strategy. `Copy`, so every request or client can hold its own.
///
/// Build one with [`Backoff::builder`]; the defaults are base 100 ms, cap 10 s, at most 5
/// attempts (the first call and 4 retries), no elapsed-time limit, [`Jitter::Full`], and
/// [`ServerJitter::DEFAULT`] over server-given waits.
///
/// ```
/// use std::time::Duration;
/// use rand::SeedableRng;
/// use tollgate_client::{Backoff, Jitter};
///
/// let policy = Backoff::builder()
///     .base(Duration::from_millis(50))
///     .cap(Duration::from_secs(2))
///     .max_attempts(4)
///     .jitter(Jitter::None)
///     .build()?;
/// let rng = rand::rngs::StdRng::seed_from_u64(7);
/// let delays: Vec<Duration> = policy.delays(rng).collect();
/// assert_eq!(delays, [50, 100, 200].map(Duration::from_millis));
/// # Ok::<(), tollgate_client::BackoffError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    max_attempts: Option<u32>,
    max_elapsed: Option<Duration>,
    jitter: Jitter,
    server_jitter: ServerJitter,
}

/// Builder for [`Backoff`]; [`build`](BackoffBuilder::build) validates the whole configuration.
#[derive(Debug, Clone, Copy)]
#[must_use]
pub struct BackoffBuilder {
    base: Duration,
    cap: Duration,
    max_attempts: Option<u32>,
    max_elapsed: Option<Duration>,
    jitter: Jitter,
    server_jitter: ServerJitter,
}

impl Default for BackoffBuilder {
    fn default() -> Self {
        BackoffBuilder {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(10),
            max_attempts: Some(5),
            max_elapsed: None,
            jitter: Jitter::Full,
            server_jitter: ServerJitter::DEFAULT,
        }
    }
}

impl BackoffBuilder {
    /// The first retry's un-jittered delay (and decorrelated jitter's lower bound).
    pub fn base(mut self, base: Duration) -> Self {
        self.base = base;
        self
    }

    /// The largest delay this policy will ever sleep, and the largest `Retry-After` it accepts.
    pub fn cap(mut self, cap: Duration) -> Self {
        self.cap = cap;
        self
    }

    /// Total attempts, counting the first call: `max_attempts(1)` never retries.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }

    /// Retry without an attempt limit (combine with [`max_elapsed`](Self::max_elapsed), or
    /// make sure the caller stops on its own).
    pub fn unlimited_attempts(mut self) -> Self {
        self.max_attempts = None;
        self
    }

    /// Give up rather than start a retry later than this after the first attempt began.
    pub fn max_elapsed(mut self, elapsed: Duration) -> Self {
        self.max_elapsed = Some(elapsed);
        self
    }

    /// Remove the elapsed-time limit (the default).
    pub fn unlimited_elapsed(mut self) -> Self {
        self.max_elapsed = None;
        self
    }

    /// The jitter strategy.
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The bounded extra over a server-given wait (default [`ServerJitter::DEFAULT`];
    /// [`ServerJitter::NONE`] waits exactly what the server asked).
    pub fn server_jitter(mut self, server_jitter: ServerJitter) -> Self {
        self.server_jitter = server_jitter;
        self
    }

    /// Validate and build.
    ///
    /// # Errors
    /// [`BackoffError`] for a zero base, a cap below the base, zero max attempts or a zero max
    /// elapsed time.
    pub fn build(self) -> Result<Backoff, BackoffError> {
        if self.base.is_zero() {
            return Err(BackoffError::ZeroBase);
        }
        if self.cap < self.base {
            return Err(BackoffError::CapBelowBase {
                base: self.base,
                cap: self.cap,
            });
        }
        if self.max_attempts == Some(0) {
            return Err(BackoffError::ZeroMaxAttempts);
        }
        if self.max_elapsed.is_some_and(|d| d.is_zero()) {
            return Err(BackoffError::ZeroMaxElapsed);
        }
        Ok(Backoff {
            base: self.base,
            cap: self.cap,
            max_attempts: self.max_attempts,
            max_elapsed: self.max_elapsed,
            jitter: self.jitter,
            server_jitter: self.server_jitter,
        })
    }
}

/// Per-operation progress through a [`Backoff`]: how many retries were scheduled and the
/// previous delay (decorrelated jitter's input). Start each operation with
/// [`BackoffState::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BackoffState {
    retries: u32,
    prev: Option<Duration>,
}

impl BackoffState {
    /// A fresh state: no retries yet.
    pub const fn new() -> Self {
        BackoffState {
            retries: 0,
            prev: None,
        }
    }

    /// Retries scheduled so far (attempts made = `retries() + 1`).
    pub const fn retries(&self) -> u32 {
        self.retries
    }
}

/// Why [`Backoff::next_delay`] gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GiveUp {
    /// `max_attempts` calls have been made.
    MaxAttempts,
    /// The next retry would start later than `max_elapsed` after the first attempt.
    MaxElapsed,
    /// The server's `Retry-After` (or `RateLimit` reset) asks for a longer wait than `cap`.
    ServerDelayAboveCap,
}

impl fmt::Display for GiveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GiveUp::MaxAttempts => "maximum number of attempts reached",
            GiveUp::MaxElapsed => "next retry would start after the maximum elapsed time",
            GiveUp::ServerDelayAboveCap => "server asked for a wait longer than the backoff cap",
        })
    }
}

impl std::error::Error for GiveUp {}

impl Default for Backoff {
    /// The builder's defaults (base 100 ms, cap 10 s, 5 attempts, full jitter).
    fn default() -> Self {
        // Invariant: the defaults satisfy every check in `build`, so this is the same value
        // built without the fallible path.
        let b = BackoffBuilder::default();
        Backoff {
            base: b.base,
            cap: b.cap,
            max_attempts: b.max_attempts,
            max_elapsed: b.max_elapsed,
            jitter: b.jitter,
            server_jitter: b.server_jitter,
        }
    }
}

/// Saturating conversion of a duration to whole nanoseconds in `u64`.
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Backoff {
    /// A builder holding the defaults.
    pub fn builder() -> BackoffBuilder {
        BackoffBuilder::default()
    }

    /// The configured base.
    pub const fn base(&self) -> Duration {
        self.base
    }

    /// The configured cap.
    pub const fn cap(&self) -> Duration {
        self.cap
    }

    /// The attempt limit, counting the first call (`None`: unlimited).
    pub const fn max_attempts(&self) -> Option<u32> {
        self.max_attempts
    }

    /// The elapsed-time limit (`None`: unlimited).
    pub const fn max_elapsed(&self) -> Option<Duration> {
        self.max_elapsed
    }

    /// The jitter strategy.
    pub const fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// The extra over server-given waits.
    pub const fn server_jitter(&self) -> ServerJitter {
        self.server_jitter
    }

    /// The same policy with another extra over server-given waits.
    #[must_use]
    pub const fn with_server_jitter(mut self, server_jitter: ServerJitter) -> Self {
        self.server_jitter = server_jitter;
        self
    }

    /// The same policy with another jitter strategy.
    #[must_use]
    pub const fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// `min(cap, base·2^retry)`, the un-jittered delay before retry number `retry` (0-based).
    /// Saturates instead of overflowing for any `retry`.
    pub fn exponential(&self, retry: u32) -> Duration {
        let base = nanos(self.base);
        let cap = nanos(self.cap);
        let scaled = if retry >= u64::BITS {
            u64::MAX
        } else {
            base.saturating_mul(1u64 << retry)
        };
        Duration::from_nanos(scaled.min(cap))
    }

    /// The jittered delay for the next retry of `state`, without the attempt and elapsed
    /// limits and without updating `state`. Always within `[0, cap]`.
    pub fn jittered<R: Rng + ?Sized>(&self, state: &BackoffState, rng: &mut R) -> Duration {
        let exp = nanos(self.exponential(state.retries));
        let d = match self.jitter {
            Jitter::None => exp,
            Jitter::Full => rng.random_range(0..=exp),
            Jitter::Equal => {
                let half = exp / 2;
                // exp - half >= half, so the sum stays <= exp and the odd nanosecond is kept.
                half + rng.random_range(0..=exp - half)
            }
            Jitter::Decorrelated => {
                let base = nanos(self.base);
                let prev = state.prev.map_or(base, nanos).max(base);
                let hi = prev.saturating_mul(3);
                rng.random_range(base..=hi).min(nanos(self.cap))
            }
        };
        Duration::from_nanos(d)
    }

    /// Decide the wait before the next retry, or give up.
    ///
    /// * `elapsed`: time since the first attempt started (the caller's clock; the
    ///   [`delays`](Self::delays) iterator uses the sum of the delays it produced).
    /// * `server_delay`: a wait the server asked for (`Retry-After`, or a `RateLimit` `t`
    ///   when nothing remains). It takes precedence over the computed backoff; the delay is that
    ///   wait plus the bounded [`ServerJitter`] extra (never less than the wait, never over
    ///   `cap`, never past `max_elapsed` when the wait alone fits). A server wait longer than
    ///   `cap` gives up with [`GiveUp::ServerDelayAboveCap`] rather than retrying too early.
    ///
    /// A retry is scheduled only if the attempt count allows another call and the retry would
    /// start no later than `max_elapsed` (`elapsed + delay <= max_elapsed`). On success
    /// `state` is advanced.
    ///
    /// # Errors
    /// [`GiveUp`] says which limit stopped the retries.
    pub fn next_delay<R: Rng + ?Sized>(
        &self,
        state: &mut BackoffState,
        rng: &mut R,
        elapsed: Duration,
        server_delay: Option<Duration>,
    ) -> Result<Duration, GiveUp> {
        if let Some(max) = self.max_attempts {
            // attempts made so far = retries + 1; another call needs attempts < max.
            if state.retries.saturating_add(1) >= max {
                return Err(GiveUp::MaxAttempts);
            }
        }
        let delay = match server_delay {
            Some(d) if d > self.cap => return Err(GiveUp::ServerDelayAboveCap),
            Some(d) => self.server_wait(d, elapsed, rng),
            None => self.jittered(state, rng),
        };
        if let Some(max) = self.max_elapsed {
            if elapsed.saturating_add(delay) > max {
                return Err(GiveUp::MaxElapsed);
            }
        }
        state.retries = state.retries.saturating_add(1);
        state.prev = Some(delay.clamp(self.base, self.cap));
        Ok(delay)
    }

    /// `wait` (at most `cap`) plus a uniform draw over `[0, extra]`, the extra bounded by the
    /// [`ServerJitter`], the cap and the elapsed-time limit. No draw when the extra is 0.
    fn server_wait<R: Rng + ?Sized>(
        &self,
        wait: Duration,
        elapsed: Duration,
        rng: &mut R,
    ) -> Duration {
        let w = nanos(wait);
        let mut extra =
            nanos(self.server_jitter.max_extra_for(wait)).min(nanos(self.cap).saturating_sub(w));
        if let Some(max) = self.max_elapsed {
            let room = nanos(max).saturating_sub(nanos(elapsed)).saturating_sub(w);
            extra = extra.min(room);
        }
        if extra == 0 {
            return wait;
        }
        Duration::from_nanos(w.saturating_add(rng.random_range(0..=extra)))
    }

    /// The delays before each retry, as a plain iterator for any client: it ends when
    /// `max_attempts` or `max_elapsed` would be exceeded (elapsed time is counted as the sum
    /// of the delays yielded, since the iterator has no clock). With neither limit it never
    /// ends. The RNG decides the jitter; pass a seeded one for reproducible delays.
    pub fn delays<R: Rng>(&self, rng: R) -> Delays<R> {
        Delays {
            policy: *self,
            state: BackoffState::new(),
            rng,
            elapsed: Duration::ZERO,
            done: false,
        }
    }
}

/// Iterator returned by [`Backoff::delays`].
#[derive(Debug, Clone)]
pub struct Delays<R> {
    policy: Backoff,
    state: BackoffState,
    rng: R,
    elapsed: Duration,
    done: bool,
}

impl<R> Delays<R> {
    /// Retries yielded so far.
    pub const fn retries(&self) -> u32 {
        self.state.retries
    }
}

impl<R: Rng> Iterator for Delays<R> {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self.done {
            return None;
        }
        let Ok(d) = self
            .policy
            .next_delay(&mut self.state, &mut self.rng, self.elapsed, None)
        else {
            // A later draw might fit the elapsed budget, but once given up the iterator stays done.
            self.done = true;
            return None;
        };
        self.elapsed = self.elapsed.saturating_add(d);
        Some(d)
    }
}

impl<R: Rng> std::iter::FusedIterator for Delays<R> {}
