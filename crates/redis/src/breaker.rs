//! A circuit breaker in front of each limiter's Redis connection, so that an outage costs the hot
//! path one atomic load, not a reconnect attempt per call.
//!
//! # States
//! * **Closed** (normal): every call goes to Redis. Consecutive outage failures
//!   ([`Error::is_outage`](crate::Error::is_outage): timeouts, refused or dropped connections, server
//!   errors) are counted; any answer from Redis (a decision, or corrupt state / a wrong type, which
//!   the server did answer) resets the count. At [`BreakerConfig::failures`] the circuit opens.
//! * **Open**: calls are answered at once with [`Error::CircuitOpen`](crate::Error::CircuitOpen),
//!   without touching the network; `check` turns that into the [`FaultPolicy`](crate::FaultPolicy)'s
//!   decision (fail open: admitted; fail closed: denied with its `retry_after`). Once per
//!   [`BreakerConfig::probe_interval`] one caller is let through as the probe (it pays the round trip
//!   or the timeout, everyone else keeps the fast answer). A successful probe closes the circuit; a
//!   failed one leaves it open until the next interval. A probe whose caller gave up (its future was
//!   dropped) costs nothing either: the next interval brings another.
//!
//! There is no separate half-open state: "one caller per interval" is the probe slot moving forward
//! by one interval when a caller claims it (under the breaker's mutex, so exactly one caller wins).
//!
//! # Concurrency
//! The state is one packed word ([`Word`]) in an `AtomicU64`, read lock-free on every call. Every
//! write happens under the `book` mutex, which also holds the bookkeeping of transitions (when the
//! circuit opened, how long it has been open in total), so a transition and its accounting are one
//! step. The hot paths never lock: closed with no failures counted and a success (nothing to write),
//! and open before the next probe instant (a rejection).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram};
use tollgate_core::{Clock, MonotonicClock, Nanos};

/// Circuit-breaker settings (see [`RedisConfig::with_breaker`](crate::RedisConfig::with_breaker)).
///
/// While the circuit is open, `check` answers by the configured
/// [`FaultPolicy`](crate::FaultPolicy) within about a microsecond: **fail open admits every request
/// (no limit at all during the outage), fail closed denies every request** with the policy's
/// `retry_after`; the `try_` methods return [`Error::CircuitOpen`](crate::Error::CircuitOpen). The
/// lease mode keeps spending live leases locally either way (they were granted before the outage).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive outage failures that open the circuit; `0` disables the breaker (every call goes
    /// to Redis, as without one).
    pub failures: u32,
    /// While open, one caller per interval is sent to Redis as the probe.
    pub probe_interval: Duration,
}

impl Default for BreakerConfig {
    /// Open after 3 consecutive failures; probe every 100 ms.
    fn default() -> Self {
        BreakerConfig {
            failures: 3,
            probe_interval: Duration::from_millis(100),
        }
    }
}

impl BreakerConfig {
    /// No breaker: every call goes to Redis.
    pub fn disabled() -> Self {
        BreakerConfig {
            failures: 0,
            ..BreakerConfig::default()
        }
    }

    fn interval(&self) -> Nanos {
        u64::try_from(self.probe_interval.as_nanos())
            .unwrap_or(Nanos::MAX)
            .max(1)
    }
}

/// Whether the circuit is letting calls through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go to Redis.
    Closed,
    /// Calls are answered without Redis, but for one probe per interval.
    Open,
}

/// A breaker's counters (totals since it was built).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerStats {
    /// The state now.
    pub state: BreakerState,
    /// Times the circuit opened.
    pub opens: u64,
    /// Times it closed again (a probe, or a call in flight when it opened, succeeded).
    pub closes: u64,
    /// Total time spent open, including the current open period.
    pub open_time: Duration,
    /// Calls answered without touching the network.
    pub rejected: u64,
    /// Probes sent while open.
    pub probes: u64,
}

/// The packed state: bits 63..62 the tag (`0` closed, `1` open), bits 61..0 the payload: for
/// closed, the consecutive failures counted; for open, the instant (ns on the breaker's clock) from
/// which the next caller is the probe (saturating at [`Word::PAYLOAD`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Word(u64);

impl Word {
    const TAG_SHIFT: u32 = 62;
    const PAYLOAD: u64 = (1 << Self::TAG_SHIFT) - 1;
    const OPEN: u64 = 1;

    pub(crate) const CLOSED: Word = Word(0);

    fn closed(failures: u64) -> Word {
        Word(failures.min(Self::PAYLOAD))
    }

    fn open(next_probe: Nanos) -> Word {
        Word((Self::OPEN << Self::TAG_SHIFT) | next_probe.min(Self::PAYLOAD))
    }

    fn is_open(self) -> bool {
        self.0 >> Self::TAG_SHIFT == Self::OPEN
    }

    fn payload(self) -> u64 {
        self.0 & Self::PAYLOAD
    }
}

/// What a caller may do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Closed: go to Redis.
    Pass,
    /// Open, and this caller is the interval's probe: go to Redis.
    Probe,
    /// Open: answer without Redis.
    Reject,
}

/// A transition worth reporting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transition {
    Opened,
    Closed,
}

/// Whether the call reached a Redis that answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Answered,
    Failed,
}

/// The pure admission step: what a caller at `now` may do, and the word to store (`None`: none).
pub(crate) fn admit(word: Word, now: Nanos, config: &BreakerConfig) -> (Admission, Option<Word>) {
    if config.failures == 0 || !word.is_open() {
        return (Admission::Pass, None);
    }
    if now < word.payload() {
        return (Admission::Reject, None);
    }
    let next = Word::open(now.saturating_add(config.interval()));
    (Admission::Probe, Some(next))
}

/// The pure recording step: the word after a call's `outcome` at `now` (`None`: unchanged), and the
/// transition it makes.
pub(crate) fn record(
    word: Word,
    now: Nanos,
    outcome: Outcome,
    config: &BreakerConfig,
) -> Option<(Word, Option<Transition>)> {
    if config.failures == 0 {
        return None;
    }
    match (word.is_open(), outcome) {
        (false, Outcome::Answered) if word.payload() == 0 => None,
        (false, Outcome::Answered) => Some((Word::CLOSED, None)),
        (false, Outcome::Failed) => {
            let failures = word.payload() + 1;
            if failures >= u64::from(config.failures) {
                let next = Word::open(now.saturating_add(config.interval()));
                Some((next, Some(Transition::Opened)))
            } else {
                Some((Word::closed(failures), None))
            }
        }
        (true, Outcome::Answered) => Some((Word::CLOSED, Some(Transition::Closed))),
        // The probe slot already moved on when the probe was claimed.
        (true, Outcome::Failed) => None,
    }
}

#[derive(Debug, Default)]
struct Book {
    opened_at: Option<Nanos>,
    open_ns: u64,
    opens: u64,
    closes: u64,
}

/// Handles into the `metrics` facade, labelled by the limiter's key prefix (taken when the breaker
/// is built: install the recorder before building limiters).
struct Metrics {
    opened: Counter,
    closed: Counter,
    rejected: Counter,
    open: Gauge,
    open_seconds: Histogram,
}

impl Metrics {
    fn new(prefix: &str) -> Metrics {
        let prefix = prefix.to_owned();
        let transition = |to: &'static str| metrics::counter!("tollgate_redis_breaker_transitions_total", "prefix" => prefix.clone(), "to" => to);
        Metrics {
            opened: transition("open"),
            closed: transition("closed"),
            rejected: metrics::counter!("tollgate_redis_breaker_rejected_total", "prefix" => prefix.clone()),
            open: metrics::gauge!("tollgate_redis_breaker_open", "prefix" => prefix.clone()),
            open_seconds: metrics::histogram!("tollgate_redis_breaker_open_seconds", "prefix" => prefix),
        }
    }
}

impl Drop for Breaker {
    /// A breaker dropped while open (its limiter replaced by a reload) leaves the gauge's count.
    fn drop(&mut self) {
        if self.lock().opened_at.is_some() {
            self.metrics.open.decrement(1.0);
        }
    }
}

/// A circuit breaker (see the [module docs](self)); shared by a limiter and its clones.
pub(crate) struct Breaker {
    word: AtomicU64,
    config: BreakerConfig,
    clock: Arc<dyn Clock>,
    book: Mutex<Book>,
    rejected: AtomicU64,
    probes: AtomicU64,
    metrics: Metrics,
}

impl std::fmt::Debug for Breaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Breaker")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Breaker {
    /// A closed breaker on the monotonic clock, reporting under `prefix`.
    pub(crate) fn new(config: BreakerConfig, prefix: &str) -> Breaker {
        Breaker::with_clock(config, prefix, Arc::new(MonotonicClock::new()))
    }

    /// A closed breaker timed by `clock`.
    pub(crate) fn with_clock(
        config: BreakerConfig,
        prefix: &str,
        clock: Arc<dyn Clock>,
    ) -> Breaker {
        let metrics = Metrics::new(prefix);
        // The gauge counts the open breakers under the prefix (several limiters may share one),
        // so a new breaker adds 0: written, so the series shows, without resetting the others'.
        metrics.open.increment(0.0);
        Breaker {
            word: AtomicU64::new(Word::CLOSED.0),
            config,
            clock,
            book: Mutex::default(),
            rejected: AtomicU64::new(0),
            probes: AtomicU64::new(0),
            metrics,
        }
    }

    fn load(&self) -> Word {
        // Relaxed: the word publishes nothing but itself (the book is read under its mutex), and a
        // stale read only delays a rejection or a probe claim by one call; every write happens under
        // the mutex, which orders the writes themselves.
        Word(self.word.load(Ordering::Relaxed))
    }

    fn lock(&self) -> MutexGuard<'_, Book> {
        // The book is a few counters: a panic while it was held cannot leave it unusable.
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a call may go to Redis now (`Pass` or `Probe`) or must be answered without it.
    pub(crate) fn admit(&self) -> Admission {
        let now = self.clock.now();
        match admit(self.load(), now, &self.config) {
            (Admission::Probe, Some(_)) => {
                let _book = self.lock();
                // Re-decide under the lock: only one caller claims each probe slot.
                match admit(self.load(), now, &self.config) {
                    (Admission::Probe, Some(next)) => {
                        // Relaxed: see `load`; the mutex orders this write after the read above.
                        self.word.store(next.0, Ordering::Relaxed);
                        // Relaxed: a statistic.
                        self.probes.fetch_add(1, Ordering::Relaxed);
                        Admission::Probe
                    }
                    (admission, _) => self.count(admission),
                }
            }
            (admission, _) => self.count(admission),
        }
    }

    fn count(&self, admission: Admission) -> Admission {
        if admission == Admission::Reject {
            // Relaxed: a statistic.
            self.rejected.fetch_add(1, Ordering::Relaxed);
            self.metrics.rejected.increment(1);
        }
        admission
    }

    /// Records how a call that went to Redis ended.
    pub(crate) fn record(&self, outcome: Outcome) {
        let now = self.clock.now();
        if record(self.load(), now, outcome, &self.config).is_none() {
            return;
        }
        let mut book = self.lock();
        let Some((next, transition)) = record(self.load(), now, outcome, &self.config) else {
            return;
        };
        // Relaxed: see `load`.
        self.word.store(next.0, Ordering::Relaxed);
        match transition {
            Some(Transition::Opened) => {
                book.opens += 1;
                book.opened_at = Some(now);
                self.metrics.opened.increment(1);
                self.metrics.open.increment(1.0);
            }
            Some(Transition::Closed) => {
                book.closes += 1;
                let spent = book.opened_at.take().map_or(0, |at| now.saturating_sub(at));
                book.open_ns = book.open_ns.saturating_add(spent);
                self.metrics.closed.increment(1);
                self.metrics.open.decrement(1.0);
                self.metrics
                    .open_seconds
                    .record(Duration::from_nanos(spent).as_secs_f64());
            }
            None => {}
        }
    }

    /// The counters now.
    pub(crate) fn stats(&self) -> BreakerStats {
        let now = self.clock.now();
        let book = self.lock();
        let current = book.opened_at.map_or(0, |at| now.saturating_sub(at));
        BreakerStats {
            state: if self.load().is_open() {
                BreakerState::Open
            } else {
                BreakerState::Closed
            },
            opens: book.opens,
            closes: book.closes,
            open_time: Duration::from_nanos(book.open_ns.saturating_add(current)),
            // Relaxed: statistics.
            rejected: self.rejected.load(Ordering::Relaxed),
            probes: self.probes.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::ManualClock;

    const MS: Nanos = 1_000_000;

    fn cfg(failures: u32) -> BreakerConfig {
        BreakerConfig {
            failures,
            probe_interval: Duration::from_millis(100),
        }
    }

    #[test]
    fn word_round_trips() {
        for f in [0, 1, 7, Word::PAYLOAD, u64::MAX] {
            let w = Word::closed(f);
            assert!(!w.is_open());
            assert_eq!(w.payload(), f.min(Word::PAYLOAD));
        }
        for t in [0, 1, 123 * MS, Word::PAYLOAD, u64::MAX] {
            let w = Word::open(t);
            assert!(w.is_open());
            assert_eq!(w.payload(), t.min(Word::PAYLOAD));
        }
    }

    #[test]
    fn opens_after_exactly_n_consecutive_failures() {
        let c = cfg(3);
        let mut w = Word::CLOSED;
        for i in 1..3 {
            let (next, t) = record(w, 10 * MS, Outcome::Failed, &c).unwrap();
            assert_eq!((next, t), (Word::closed(i), None));
            w = next;
            assert_eq!(admit(w, 10 * MS, &c), (Admission::Pass, None));
        }
        let (w, t) = record(w, 10 * MS, Outcome::Failed, &c).unwrap();
        assert_eq!(t, Some(Transition::Opened));
        assert_eq!(w, Word::open(110 * MS));
    }

    #[test]
    fn an_answer_resets_the_count() {
        let c = cfg(3);
        let w = Word::closed(2);
        assert_eq!(
            record(w, 0, Outcome::Answered, &c),
            Some((Word::CLOSED, None))
        );
        // Nothing to write for the common case.
        assert_eq!(record(Word::CLOSED, 0, Outcome::Answered, &c), None);
    }

    #[test]
    fn open_rejects_until_the_probe_instant_then_lets_one_probe_per_interval() {
        let c = cfg(1);
        let w = Word::open(110 * MS);
        assert_eq!(admit(w, 50 * MS, &c), (Admission::Reject, None));
        assert_eq!(admit(w, 110 * MS - 1, &c), (Admission::Reject, None));
        let (a, next) = admit(w, 110 * MS, &c);
        assert_eq!(a, Admission::Probe);
        let next = next.unwrap();
        assert_eq!(next, Word::open(210 * MS));
        // The next caller in the same interval is rejected.
        assert_eq!(admit(next, 110 * MS, &c), (Admission::Reject, None));
        // A failed probe changes nothing: the slot already moved.
        assert_eq!(record(next, 120 * MS, Outcome::Failed, &c), None);
        // A late probe (caller long gone) is claimed by whoever comes after the slot.
        assert_eq!(admit(next, 900 * MS, &c).0, Admission::Probe);
    }

    #[test]
    fn a_successful_probe_closes() {
        let c = cfg(2);
        let w = Word::open(5 * MS);
        assert_eq!(
            record(w, 6 * MS, Outcome::Answered, &c),
            Some((Word::CLOSED, Some(Transition::Closed)))
        );
    }

    #[test]
    fn disabled_never_opens() {
        let c = BreakerConfig::disabled();
        for _ in 0..10 {
            assert_eq!(record(Word::CLOSED, 0, Outcome::Failed, &c), None);
        }
        assert_eq!(admit(Word::open(u64::MAX), 0, &c), (Admission::Pass, None));
    }

    #[test]
    fn huge_times_saturate_instead_of_wrapping() {
        let c = BreakerConfig {
            failures: 1,
            probe_interval: Duration::MAX,
        };
        // The breaker's clock starts at 0 when it is built: 2^62 ns is 146 years away.
        let now = Word::PAYLOAD - 10;
        let (w, _) = record(Word::CLOSED, now, Outcome::Failed, &c).unwrap();
        assert!(w.is_open());
        assert_eq!(admit(w, now, &c).0, Admission::Reject);
    }

    #[test]
    fn the_open_gauge_counts_open_breakers_under_one_prefix() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        // The debugging recorder's snapshot hands out a gauge's value and zeroes it, so the test
        // adds the changes up: `open` is what the exporter would show.
        let mut open = 0.0;
        let mut read = || {
            open += snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .find(|(key, ..)| key.key().name() == "tollgate_redis_breaker_open")
                .map_or(0.0, |(.., value)| match value {
                    DebugValue::Gauge(g) => g.into_inner(),
                    other => panic!("{other:?}"),
                });
            open
        };
        metrics::with_local_recorder(&recorder, || {
            let clock = ManualClock::new();
            // Two limiters' breakers under one prefix (a rule and its override quota).
            let a = Breaker::with_clock(cfg(1), "p:", Arc::new(clock.clone()));
            let b = Breaker::with_clock(cfg(1), "p:", Arc::new(clock.clone()));
            assert_eq!(read(), 0.0);
            a.record(Outcome::Failed);
            assert_eq!(read(), 1.0);
            b.record(Outcome::Failed);
            assert_eq!(read(), 2.0, "both open");
            clock.advance(Duration::from_millis(100));
            assert_eq!(a.admit(), Admission::Probe);
            a.record(Outcome::Answered);
            assert_eq!(read(), 1.0, "one closed, one still open");
            drop(b);
            assert_eq!(read(), 0.0, "dropped while open: no longer counted");
            let c = Breaker::with_clock(cfg(1), "p:", Arc::new(clock.clone()));
            assert_eq!(read(), 0.0, "a new breaker adds nothing");
            c.record(Outcome::Failed);
            drop(a);
            assert_eq!(read(), 1.0, "a closed breaker's drop changes nothing");
        });
    }

    #[test]
    fn breaker_accounts_open_time_and_probes_on_a_manual_clock() {
        let clock = ManualClock::new();
        let b = Breaker::with_clock(cfg(2), "t:", Arc::new(clock.clone()));
        assert_eq!(b.admit(), Admission::Pass);
        b.record(Outcome::Failed);
        assert_eq!(b.stats().state, BreakerState::Closed);
        b.record(Outcome::Failed);
        assert_eq!(b.stats().state, BreakerState::Open);
        for _ in 0..5 {
            assert_eq!(b.admit(), Admission::Reject);
        }
        clock.advance(Duration::from_millis(100));
        assert_eq!(b.admit(), Admission::Probe);
        assert_eq!(b.admit(), Admission::Reject);
        b.record(Outcome::Failed); // the probe failed
        clock.advance(Duration::from_millis(50));
        assert_eq!(b.admit(), Admission::Reject);
        clock.advance(Duration::from_millis(50));
        assert_eq!(b.admit(), Admission::Probe);
        clock.advance(Duration::from_millis(7));
        b.record(Outcome::Answered);
        let s = b.stats();
        assert_eq!(s.state, BreakerState::Closed);
        assert_eq!((s.opens, s.closes, s.probes, s.rejected), (1, 1, 2, 7));
        assert_eq!(s.open_time, Duration::from_millis(207));
        assert_eq!(b.admit(), Admission::Pass);
        // Time open keeps counting while open.
        b.record(Outcome::Failed);
        b.record(Outcome::Failed);
        clock.advance(Duration::from_millis(30));
        assert_eq!(b.stats().open_time, Duration::from_millis(237));
    }

    #[test]
    fn concurrent_callers_claim_one_probe_per_slot() {
        let clock = ManualClock::new();
        let b = Arc::new(Breaker::with_clock(cfg(1), "t:", Arc::new(clock.clone())));
        b.record(Outcome::Failed);
        clock.advance(Duration::from_millis(100));
        let probes: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let b = Arc::clone(&b);
                    s.spawn(move || (0..1000).filter(|_| b.admit() == Admission::Probe).count())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(probes, 1, "at a frozen instant exactly one caller probes");
        assert_eq!(b.stats().rejected, 3999);
    }
}
