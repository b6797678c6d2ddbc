//! The implementations under test, behind one small trait so the runner is written once.
//!
//! Every implementation is wrapped in a type implementing [`Target`] (one decision for one key, `true`
//! when admitted). [`build`] turns an [`Impl`] name into its concrete type and hands it to a
//! [`Visit`]or, so the measuring loop is monomorphised per implementation: no virtual call on the
//! timed path. Adding an implementation is one [`Impl`] variant, one wrapper and one `build` arm.
//!
//! Peers get the same clock as Tollgate (governor and `ratelimit` both accept a custom clock), so
//! clock cost is equal across rows and `--clock coarse` applies to all of them.

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::Duration;

use crate::sync::{AtomicU64, Ordering};

use tollgate_core::algorithm::Algorithm;
use tollgate_core::{
    AtomicLimiter, Clock, CoarseClock, FixedWindow, Gcra, LeakyBucket, Limiter, MonotonicClock,
    Nanos, Quota, SlidingLog, SlidingWindow,
};
use tollgate_sharded::KeyedLimiter;
use tollgate_striped::StripedLimiter;

/// One implementation under test.
pub trait Target: Sync {
    /// Decides one request of cost 1 for `key` now; `true` when admitted. Unkeyed targets ignore `key`.
    fn decide(&self, key: u64) -> bool;
}

/// Where an implementation comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// Tollgate itself.
    Tollgate,
    /// Another crate users would otherwise pick.
    Peer,
    /// A hand-written reference point (a mutex around the same GCRA; the bare clock read).
    Baseline,
}

/// Every implementation the load generator knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Impl {
    /// `tollgate_core::GcraLimiter`.
    Gcra,
    /// `tollgate_core::LeakyBucketLimiter`.
    LeakyBucket,
    /// `tollgate_core::FixedWindowLimiter`.
    FixedWindow,
    /// `tollgate_core::SlidingWindowLimiter`.
    SlidingWindow,
    /// `tollgate_core::SlidingLog` (exact, mutex).
    SlidingLog,
    /// `governor::RateLimiter::direct` (GCRA, one atomic).
    Governor,
    /// `governor` keyed (its default DashMap store).
    GovernorKeyed,
    /// `ratelimit::Ratelimiter` (lock-free token bucket).
    Ratelimit,
    /// GCRA state under a `std::sync::Mutex`: what a naive implementation costs.
    MutexGcra,
    /// `tollgate_striped::StripedLimiter` (one GCRA quota, per-stripe leases).
    Striped,
    /// `tollgate_sharded::KeyedLimiter<u64, Gcra>`.
    KeyedGcra,
    /// `tollgate_sharded::KeyedLimiter<u64, SlidingWindow>`.
    KeyedSlidingWindow,
    /// No limiter: one clock read per decision, the floor every row pays.
    ClockOnly,
    /// The least a correct one-word lock-free limiter does: one clock read, one load of a padded word
    /// and, when admitting, one compare-and-swap (retried on the value found). No quota arithmetic and
    /// no result beyond the boolean: the floor of the allow (CAS) and deny (load) paths.
    CasFloor,
}

impl Impl {
    /// Every implementation, Tollgate first.
    pub const ALL: [Impl; 14] = [
        Impl::Gcra,
        Impl::LeakyBucket,
        Impl::FixedWindow,
        Impl::SlidingWindow,
        Impl::SlidingLog,
        Impl::Striped,
        Impl::KeyedGcra,
        Impl::KeyedSlidingWindow,
        Impl::Governor,
        Impl::GovernorKeyed,
        Impl::Ratelimit,
        Impl::MutexGcra,
        Impl::ClockOnly,
        Impl::CasFloor,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Impl::Gcra => "gcra",
            Impl::LeakyBucket => "leaky_bucket",
            Impl::FixedWindow => "fixed_window",
            Impl::SlidingWindow => "sliding_window",
            Impl::SlidingLog => "sliding_log",
            Impl::Governor => "governor",
            Impl::GovernorKeyed => "governor_keyed",
            Impl::Ratelimit => "ratelimit",
            Impl::MutexGcra => "mutex_gcra",
            Impl::Striped => "striped",
            Impl::KeyedGcra => "keyed_gcra",
            Impl::KeyedSlidingWindow => "keyed_sliding_window",
            Impl::ClockOnly => "clock_only",
            Impl::CasFloor => "cas_floor",
        }
    }

    /// The algorithm it runs.
    pub fn algorithm(self) -> &'static str {
        match self {
            Impl::Gcra
            | Impl::Governor
            | Impl::GovernorKeyed
            | Impl::MutexGcra
            | Impl::Striped
            | Impl::KeyedGcra => "gcra",
            Impl::LeakyBucket => "leaky_bucket",
            Impl::FixedWindow => "fixed_window",
            Impl::SlidingWindow | Impl::KeyedSlidingWindow => "sliding_window",
            Impl::SlidingLog => "sliding_log",
            Impl::Ratelimit => "token_bucket",
            Impl::ClockOnly | Impl::CasFloor => "none",
        }
    }

    /// Tollgate, peer or baseline.
    pub fn family(self) -> Family {
        match self {
            Impl::Governor | Impl::GovernorKeyed | Impl::Ratelimit => Family::Peer,
            Impl::MutexGcra | Impl::ClockOnly | Impl::CasFloor => Family::Baseline,
            _ => Family::Tollgate,
        }
    }

    /// Whether it keeps one state per key (and so runs the keyed distributions).
    pub fn keyed(self) -> bool {
        matches!(
            self,
            Impl::GovernorKeyed | Impl::KeyedGcra | Impl::KeyedSlidingWindow
        )
    }

    /// Resolves a name, or a group (`all`, `tollgate`, `peers`, `keyed`, `unkeyed`).
    pub fn resolve(name: &str) -> Result<Vec<Impl>, UnknownImpl> {
        let name = name.trim();
        let pick = |f: &dyn Fn(Impl) -> bool| Impl::ALL.into_iter().filter(|&i| f(i)).collect();
        Ok(match name {
            "all" => Impl::ALL.to_vec(),
            "tollgate" => pick(&|i| i.family() == Family::Tollgate),
            "peers" => pick(&|i| i.family() != Family::Tollgate),
            "keyed" => pick(&|i| i.keyed()),
            "unkeyed" => pick(&|i| !i.keyed()),
            _ => vec![
                Impl::ALL
                    .into_iter()
                    .find(|i| i.name() == name)
                    .ok_or_else(|| UnknownImpl(name.to_owned()))?,
            ],
        })
    }
}

impl fmt::Display for Impl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An implementation name that is not known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownImpl(pub String);

impl fmt::Display for UnknownImpl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Impl::ALL.iter().map(|i| i.name()).collect();
        write!(
            f,
            "unknown implementation {:?}; known: {}, or all, tollgate, peers, keyed, unkeyed",
            self.0,
            names.join(", ")
        )
    }
}

impl std::error::Error for UnknownImpl {}

/// Which clock every limiter reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ClockKind {
    /// `MonotonicClock`: a TSC read per decision.
    Tsc,
    /// `CoarseClock` at 1 ms: a cached time, one relaxed load per decision.
    Coarse,
    /// [`FixedClock`]: a caller-supplied instant, taken once when the limiter is built and returned
    /// by every read (a plain field). What `check_at(now, ..)` at a precomputed `now` costs: the
    /// limiter's own cost without any clock read. Peers get the same instant through their clock
    /// trait (governor has no `check_at`; a clock returning a given instant is its equivalent).
    Fixed,
}

/// How generous the quota is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaMode {
    /// The most generous per-second quota the implementation can represent (up to 10^9/s): mostly
    /// admissions, the write (compare-and-swap) path. Window algorithms cap their limit, so they may
    /// still deny; the allowed fraction says so.
    Allow,
    /// One per hour: after the first request everything is denied, the read-only path.
    Deny,
}

impl fmt::Display for QuotaMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QuotaMode::Allow => "allow",
            QuotaMode::Deny => "deny",
        })
    }
}

impl fmt::Display for ClockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClockKind::Tsc => "tsc",
            ClockKind::Coarse => "coarse",
            ClockKind::Fixed => "fixed",
        })
    }
}

/// Largest sliding-log limit used for the allow mode (the log holds 8 bytes per unit of limit).
pub const SLIDING_LOG_ALLOW_LIMIT: u64 = 1 << 20;

/// The quota an implementation of algorithm `A` gets in `mode`.
///
/// # Errors
/// When no candidate quota is representable (not expected for the built-in algorithms).
pub fn quota_for<A: Algorithm>(mode: QuotaMode) -> Result<Quota, BuildError> {
    match mode {
        QuotaMode::Deny => Quota::per_hour(1).map_err(BuildError::quota),
        QuotaMode::Allow => [1_000_000_000, (1 << 29) - 1, 1 << 20, (1 << 14) - 1, 1000]
            .into_iter()
            .filter_map(|n| Quota::per_second(n).ok())
            .find(|q| A::from_quota(*q).is_ok())
            .ok_or(BuildError("no representable allow quota".into())),
    }
}

/// Why a target could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildError(pub String);

impl BuildError {
    fn quota(e: impl fmt::Display) -> Self {
        BuildError(format!("quota: {e}"))
    }
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot build the implementation: {}", self.0)
    }
}

impl std::error::Error for BuildError {}

/// What the report says about a built target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetInfo {
    /// The quota, in words (`1000000000/1s`).
    pub quota: String,
}

/// Receives the concrete target built by [`build`].
pub trait Visit {
    /// What the visit returns.
    type Out;
    /// Called once with the built target.
    fn visit<T: Target>(self, target: &T, info: &TargetInfo) -> Self::Out;
}

/// A Tollgate single limiter (any [`Limiter`]).
#[derive(Debug)]
pub struct Single<L>(pub L);

impl<L: Limiter> Target for Single<L> {
    #[inline]
    fn decide(&self, _key: u64) -> bool {
        self.0.check().is_allowed()
    }
}

/// A Tollgate clock adapted to governor's and `ratelimit`'s clock traits, so every row reads the same
/// clock.
#[derive(Clone, Debug)]
pub struct SharedClock<C>(pub C);

impl<C: Clock + Clone> governor::clock::Clock for SharedClock<C> {
    type Instant = governor::nanos::Nanos;

    #[inline]
    fn now(&self) -> Self::Instant {
        governor::nanos::Nanos::from(self.0.now())
    }
}

impl<C: Clock> ratelimit::Clock for SharedClock<C> {
    #[inline]
    fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.0.now())
    }
}

type GovDirect<C> = governor::RateLimiter<
    governor::state::NotKeyed,
    governor::state::InMemoryState,
    SharedClock<C>,
    governor::middleware::NoOpMiddleware<governor::nanos::Nanos>,
>;

type GovKeyed<C> = governor::RateLimiter<
    u64,
    governor::state::keyed::DashMapStateStore<u64>,
    SharedClock<C>,
    governor::middleware::NoOpMiddleware<governor::nanos::Nanos>,
>;

/// Reads the clock and decides nothing: the cost floor of a decision that reads the time.
pub struct ClockOnly<C>(C);

impl<C: Clock> Target for ClockOnly<C> {
    #[inline]
    fn decide(&self, _key: u64) -> bool {
        // Admit unless the clock reads its impossible maximum, so the read cannot be optimised out.
        std::hint::black_box(self.0.now()) != Nanos::MAX
    }
}

/// A clock that always reads the instant it was given: a caller-supplied `now`.
#[derive(Clone, Copy, Debug)]
pub struct FixedClock(pub Nanos);

impl Clock for FixedClock {
    #[inline]
    fn now(&self) -> Nanos {
        self.0
    }
}

/// See [`Impl::CasFloor`].
pub struct CasFloor<C> {
    word: crossbeam_utils::CachePadded<AtomicU64>,
    clock: C,
}

impl<C: Clock> Target for CasFloor<C> {
    #[inline]
    fn decide(&self, _key: u64) -> bool {
        let now = self.clock.now();
        // Relaxed: as in `tollgate_core::AtomicState`, the word publishes nothing else and its RMWs
        // are totally ordered by coherence.
        let mut current = self.word.load(Ordering::Relaxed);
        loop {
            // Deny mode starts the word at `u64::MAX`: every decision is a load and a compare.
            if current == u64::MAX {
                return false;
            }
            let next = current.max(now).wrapping_add(1);
            // Relaxed: see above; a failed exchange retries on the value found.
            match self.word.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }
}

/// A Tollgate keyed limiter.
pub struct Keyed<A, C>(KeyedLimiter<u64, A, C>);

impl<A: Algorithm, C: Clock> Target for Keyed<A, C> {
    #[inline]
    fn decide(&self, key: u64) -> bool {
        self.0.check_key(&key, 1).is_ok_and(|d| d.is_allowed())
    }
}

/// `governor`'s direct limiter.
pub struct GovernorDirect<C: Clock + Clone>(GovDirect<C>);

impl<C: Clock + Clone> Target for GovernorDirect<C> {
    #[inline]
    fn decide(&self, _key: u64) -> bool {
        self.0.check().is_ok()
    }
}

/// `governor`'s keyed limiter on its default DashMap store.
pub struct GovernorKeyed<C: Clock + Clone>(GovKeyed<C>);

impl<C: Clock + Clone> Target for GovernorKeyed<C> {
    #[inline]
    fn decide(&self, key: u64) -> bool {
        self.0.check_key(&key).is_ok()
    }
}

/// `ratelimit::Ratelimiter`.
pub struct RatelimitTarget<C: Clock>(ratelimit::Ratelimiter<SharedClock<C>>);

impl<C: Clock> Target for RatelimitTarget<C> {
    #[inline]
    fn decide(&self, _key: u64) -> bool {
        self.0.try_wait().is_ok()
    }
}

/// A GCRA state word under a mutex: the naive baseline.
pub struct MutexGcra<C> {
    state: Mutex<u64>,
    gcra: Gcra,
    clock: C,
}

impl<C: Clock> Target for MutexGcra<C> {
    #[inline]
    fn decide(&self, _key: u64) -> bool {
        let now = self.clock.now();
        // A poisoned lock only means another thread panicked mid-benchmark; the word is still valid.
        let mut word = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match self.gcra.decide(*word, now, 1) {
            Ok(t) => {
                if let Some(next) = t.next {
                    *word = next;
                }
                t.decision.is_allowed()
            }
            Err(_) => false,
        }
    }
}

fn governor_quota(mode: QuotaMode) -> governor::Quota {
    match mode {
        QuotaMode::Allow => governor::Quota::per_second(NonZeroU32::MAX),
        QuotaMode::Deny => governor::Quota::per_hour(NonZeroU32::MIN),
    }
}

fn governor_quota_text(mode: QuotaMode) -> String {
    match mode {
        QuotaMode::Allow => format!("{}/1s", u32::MAX),
        QuotaMode::Deny => "1/3600s".into(),
    }
}

fn quota_text(q: &Quota) -> String {
    format!("{}/{:?}", q.limit(), q.period())
}

fn core_limiter<A: Algorithm, C: Clock, V: Visit>(
    mode: QuotaMode,
    clock: C,
    v: V,
) -> Result<V::Out, BuildError> {
    let quota = quota_for::<A>(mode)?;
    let limiter = AtomicLimiter::<A, C>::with_clock(quota, clock).map_err(BuildError::quota)?;
    let info = TargetInfo {
        quota: quota_text(&quota),
    };
    Ok(v.visit(&Single(limiter), &info))
}

fn keyed_limiter<A: Algorithm, C: Clock, V: Visit>(
    mode: QuotaMode,
    keys: u64,
    clock: C,
    v: V,
) -> Result<V::Out, BuildError> {
    let quota = quota_for::<A>(mode)?;
    // Sized for the distinct keys of the run (at least 1024), as a deployment would size it.
    let capacity = usize::try_from(keys).unwrap_or(usize::MAX).max(1024);
    let limiter = KeyedLimiter::<u64, A, C>::with_clock(quota, capacity, clock)
        .map_err(|e| BuildError(format!("keyed limiter: {e}")))?;
    let info = TargetInfo {
        quota: format!("{} per key, capacity {capacity}", quota_text(&quota)),
    };
    Ok(v.visit(&Keyed(limiter), &info))
}

fn with_clock<C: Clock + Clone + 'static, V: Visit>(
    imp: Impl,
    mode: QuotaMode,
    keys: u64,
    clock: C,
    v: V,
) -> Result<V::Out, BuildError> {
    match imp {
        Impl::KeyedGcra => keyed_limiter::<Gcra, C, V>(mode, keys, clock, v),
        Impl::ClockOnly => {
            let info = TargetInfo {
                quota: "none".into(),
            };
            Ok(v.visit(&ClockOnly(clock), &info))
        }
        Impl::CasFloor => {
            let start = match mode {
                QuotaMode::Allow => 0,
                QuotaMode::Deny => u64::MAX,
            };
            let target = CasFloor {
                word: crossbeam_utils::CachePadded::new(AtomicU64::new(start)),
                clock,
            };
            let info = TargetInfo {
                quota: "none (allow: always CAS; deny: never)".into(),
            };
            Ok(v.visit(&target, &info))
        }
        Impl::KeyedSlidingWindow => keyed_limiter::<SlidingWindow, C, V>(mode, keys, clock, v),
        Impl::Striped => {
            let quota = quota_for::<Gcra>(mode)?;
            let limiter = StripedLimiter::with_clock(quota, clock)
                .map_err(|e| BuildError(format!("striped: {e}")))?;
            let info = TargetInfo {
                quota: format!("{}, {} stripes", quota_text(&quota), limiter.stripes()),
            };
            Ok(v.visit(&Single(limiter), &info))
        }
        Impl::Gcra => core_limiter::<Gcra, C, V>(mode, clock, v),
        Impl::LeakyBucket => core_limiter::<LeakyBucket, C, V>(mode, clock, v),
        Impl::FixedWindow => core_limiter::<FixedWindow, C, V>(mode, clock, v),
        Impl::SlidingWindow => core_limiter::<SlidingWindow, C, V>(mode, clock, v),
        Impl::SlidingLog => {
            let quota = match mode {
                QuotaMode::Allow => Quota::per_second(SLIDING_LOG_ALLOW_LIMIT),
                QuotaMode::Deny => Quota::per_hour(1),
            }
            .map_err(BuildError::quota)?;
            let log = SlidingLog::with_clock(quota, clock).map_err(BuildError::quota)?;
            let info = TargetInfo {
                quota: quota_text(&quota),
            };
            Ok(v.visit(&Single(log), &info))
        }
        Impl::Governor => {
            let limiter = GovDirect::new(
                governor_quota(mode),
                governor::state::InMemoryState::default(),
                SharedClock(clock),
            );
            let info = TargetInfo {
                quota: governor_quota_text(mode),
            };
            Ok(v.visit(&GovernorDirect(limiter), &info))
        }
        Impl::GovernorKeyed => {
            let limiter = GovKeyed::new(
                governor_quota(mode),
                governor::state::keyed::DashMapStateStore::default(),
                SharedClock(clock),
            );
            let info = TargetInfo {
                quota: format!("{} per key", governor_quota_text(mode)),
            };
            Ok(v.visit(&GovernorKeyed(limiter), &info))
        }
        Impl::Ratelimit => {
            let (rate, period, initial) = match mode {
                QuotaMode::Allow => (1_000_000_000, Duration::from_secs(1), 1_000_000_000),
                QuotaMode::Deny => (1, Duration::from_secs(3600), 1),
            };
            let limiter = ratelimit::Builder::with_clock(rate, SharedClock(clock))
                .period(period)
                .max_tokens(rate)
                .initial_available(initial)
                .build()
                .map_err(|e| BuildError(format!("ratelimit: {e}")))?;
            let info = TargetInfo {
                quota: format!("{rate}/{period:?}"),
            };
            Ok(v.visit(&RatelimitTarget(limiter), &info))
        }
        Impl::MutexGcra => {
            let quota = quota_for::<Gcra>(mode)?;
            let gcra = Gcra::from_quota(quota).map_err(BuildError::quota)?;
            let target = MutexGcra {
                state: Mutex::new(0),
                gcra,
                clock,
            };
            let info = TargetInfo {
                quota: quota_text(&quota),
            };
            Ok(v.visit(&target, &info))
        }
    }
}

/// Sizes in bytes of what a decision returns and of the limiters measured: Tollgate's `Decision`
/// and `check_n`'s `Result`, governor's `check` result, and the limiter structs on the coarse clock.
pub fn layout() -> Vec<(String, usize)> {
    use std::mem::size_of;
    type GovResult = Result<(), governor::NotUntil<governor::nanos::Nanos>>;
    vec![
        (
            "tollgate_core::Decision".into(),
            size_of::<tollgate_core::Decision>(),
        ),
        (
            "Result<Decision, CheckError>".into(),
            size_of::<Result<tollgate_core::Decision, tollgate_core::CheckError>>(),
        ),
        (
            "governor Result<(), NotUntil<Nanos>>".into(),
            size_of::<GovResult>(),
        ),
        (
            "GcraLimiter<CoarseClock>".into(),
            size_of::<AtomicLimiter<Gcra, CoarseClock>>(),
        ),
        (
            "governor RateLimiter<NotKeyed, InMemoryState, CoarseClock>".into(),
            size_of::<GovDirect<CoarseClock>>(),
        ),
    ]
}

/// Builds `imp` with the quota for `mode` on `clock`, sized for `keys` distinct keys (keyed
/// implementations), and hands it to `v`.
///
/// # Errors
/// A [`BuildError`] when the quota cannot be represented or the coarse clock cannot start.
pub fn build<V: Visit>(
    imp: Impl,
    mode: QuotaMode,
    clock: ClockKind,
    keys: u64,
    v: V,
) -> Result<V::Out, BuildError> {
    match clock {
        ClockKind::Tsc => with_clock(imp, mode, keys, MonotonicClock::new(), v),
        ClockKind::Coarse => {
            let coarse = CoarseClock::new(Duration::from_millis(1))
                .map_err(|e| BuildError(e.to_string()))?;
            with_clock(imp, mode, keys, coarse, v)
        }
        ClockKind::Fixed => with_clock(imp, mode, keys, FixedClock(MonotonicClock::new().now()), v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts admissions out of `n` decisions over distinct keys.
    struct Count(u64);

    impl Visit for Count {
        type Out = u64;
        fn visit<T: Target>(self, target: &T, _: &TargetInfo) -> u64 {
            (0..self.0).filter(|&k| target.decide(k)).count() as u64
        }
    }

    #[test]
    fn deny_mode_admits_only_the_first_request() {
        for imp in Impl::ALL {
            let allowed = build(imp, QuotaMode::Deny, ClockKind::Tsc, 100, Count(100)).unwrap();
            // Keyed targets get a fresh key per request, so each key's first request passes.
            let expected = match imp {
                _ if imp.keyed() => 100,
                Impl::ClockOnly => 100,
                // The floor's deny mode never admits: it measures the load-and-compare path only.
                Impl::CasFloor => 0,
                _ => 1,
            };
            assert_eq!(allowed, expected, "{imp}");
        }
    }

    #[test]
    fn allow_mode_admits_a_short_burst_everywhere() {
        for imp in Impl::ALL {
            let allowed = build(imp, QuotaMode::Allow, ClockKind::Tsc, 1000, Count(1000)).unwrap();
            assert_eq!(allowed, 1000, "{imp}");
        }
    }

    #[test]
    fn allow_quota_is_the_largest_representable() {
        assert_eq!(
            quota_for::<Gcra>(QuotaMode::Allow).unwrap().limit(),
            1_000_000_000
        );
        assert_eq!(
            quota_for::<SlidingWindow>(QuotaMode::Allow)
                .unwrap()
                .limit(),
            (1 << 14) - 1
        );
    }

    #[test]
    fn names_resolve_and_groups_cover_everything() {
        for imp in Impl::ALL {
            assert_eq!(Impl::resolve(imp.name()).unwrap(), vec![imp]);
        }
        let mut split = Impl::resolve("tollgate").unwrap();
        split.extend(Impl::resolve("peers").unwrap());
        assert_eq!(split, Impl::ALL.to_vec());
        assert!(Impl::resolve("nope").is_err());
    }
}
