//! Several keys, each with its own algorithm and quota, decided as one request in one atomic script
//! call.

use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager};
use smallvec::SmallVec;
use tollgate_core::{
    CheckError, Decision, FixedWindow, Gcra, LeakyBucket, Nanos, Quota, QuotaError, SlidingWindow,
};

use crate::breaker::{Admission, Breaker, BreakerStats, Outcome};
use crate::coalesce::{Answer, Coalesce, Coalescer, Request};
use crate::config::RedisConfig;
use crate::durable::{Durability, GroupWait};
use crate::encoding::RedisEncoding;
use crate::error::Error;
use crate::function::LibraryCall;
use crate::limiter::RedisLimiter;
use crate::params::ScriptParams;
use crate::scripts::{self, Reply};

mod sealed {
    /// The batch script's name for an algorithm's `*_decide` function.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Kind {
        /// `gcra_decide`: GCRA and the leaky bucket (one TAT).
        Tat,
        /// `fixed_window_decide`.
        Fixed,
        /// `sliding_window_decide`.
        Sliding,
    }

    impl Kind {
        pub(crate) fn code(self) -> &'static str {
            match self {
                Kind::Tat => "g",
                Kind::Fixed => "f",
                Kind::Sliding => "s",
            }
        }
    }

    /// Keeps [`BatchEncoding`](super::BatchEncoding) to the crate's algorithms, whose decision
    /// functions the batch script carries.
    pub trait Sealed {
        /// Which decision function runs the algorithm.
        fn kind() -> Kind;
    }
}

use sealed::Kind;

/// A [`RedisEncoding`] that [`RedisBatch`] can decide among other keys: [`Gcra`], [`LeakyBucket`],
/// [`FixedWindow`] and [`SlidingWindow`] (sealed: the batch script carries exactly their decision
/// functions, the same ones their single-key scripts run).
pub trait BatchEncoding: RedisEncoding + sealed::Sealed {}

macro_rules! batchable {
    ($($t:ty => $kind:expr),+) => {$(
        impl sealed::Sealed for $t {
            fn kind() -> Kind {
                $kind
            }
        }
        impl BatchEncoding for $t {}
    )+};
}

batchable!(Gcra => Kind::Tat, LeakyBucket => Kind::Tat, FixedWindow => Kind::Fixed,
    SlidingWindow => Kind::Sliding);

/// One limit a [`RedisBatch`] decides a key against: an algorithm and its quota, as the script's
/// parameters (exactly those its single-key [`RedisLimiter`] sends), and its capacity.
///
/// Build it once per limit and reuse it: [`BatchLimit::for_quota`] from a quota,
/// [`BatchLimit::new`] from an algorithm, or
/// [`RedisLimiter::batch_limit`] from a limiter (the same algorithm and quota as that limiter's
/// script, so a batch and the limiter read and write the same state under the same key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchLimit {
    pub(crate) kind: Kind,
    pub(crate) params: ScriptParams,
    capacity: u64,
    /// The key's spec as the batch script reads it, shadow then enforcing (see `spec`): built once
    /// here rather than formatted for every key of every call.
    specs: [Box<str>; 2],
    /// GCRA's interval and depth in the script's units, from which the batch's two values per
    /// GCRA key give its four (see [`TatReply`]); `None` for a window.
    tat: Option<TatReply>,
}

/// The four values of a GCRA key's decision (allowed, remaining, retry_after, reset_after, in
/// the script's units, -1 = never) from the two the batch script replies for it (batch.lua): an
/// admission's reset_after or a denial's retry_after. An admission's remaining is
/// `floor((depth - reset_after) / interval)` and a denial's reset_after `retry_after + depth -
/// cost × interval`, as gcra_decide (tat.lua) computes them: the script saves a `sprintf` (about
/// 1 k instructions of the redis-server's) per value it does not write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TatReply {
    interval: i64,
    depth: i64,
}

impl TatReply {
    /// From a GCRA key's script parameters (units per µs, interval, depth).
    fn of(params: &ScriptParams) -> Option<TatReply> {
        let number = |i: usize| params.args().get(i)?.parse::<i64>().ok();
        let (interval, depth) = (number(1)?, number(2)?);
        (interval > 0 && depth >= 0).then_some(TatReply { interval, depth })
    }

    fn values(self, allowed: i64, value: i64, cost: u64) -> Option<[i64; 4]> {
        match (allowed, value) {
            (1, reset) if (0..=self.depth).contains(&reset) => {
                Some([1, (self.depth - reset) / self.interval, 0, reset])
            }
            (0, -1) => Some([0, 0, -1, -1]),
            (0, retry) if retry > 0 => {
                let spent = i64::try_from(cost).ok()?.checked_mul(self.interval)?;
                let reset = retry.checked_add(self.depth)?.checked_sub(spent)?;
                (reset >= 0).then_some([0, 0, retry, reset])
            }
            _ => None,
        }
    }
}

impl BatchLimit {
    fn of(kind: Kind, params: ScriptParams, capacity: u64) -> BatchLimit {
        let tag = params.quota_tag();
        let specs = ["0", "1"].map(|enforcing| format!("{}{enforcing}{tag}", kind.code()).into());
        let tat = match kind {
            Kind::Tat => TatReply::of(&params),
            Kind::Fixed | Kind::Sliding => None,
        };
        BatchLimit {
            kind,
            params,
            capacity,
            specs,
            tat,
        }
    }

    /// The key's spec the batch script reads (batch.lua): the algorithm, enforcing (1/0), then its
    /// parameters joined by ',' (its quota tag).
    pub(crate) fn spec(&self, enforcing: bool) -> &str {
        &self.specs[usize::from(enforcing)]
    }

    /// The limit `algorithm` enforces (build it from
    /// [`RedisEncoding::redis_quota`] so that the script can follow it exactly, as
    /// [`RedisLimiter::new`] does).
    ///
    /// # Errors
    /// A [`QuotaError`] when the script cannot follow `algorithm` exactly (as
    /// [`RedisLimiter::from_algorithm`]).
    pub fn new<A: BatchEncoding>(algorithm: &A) -> Result<BatchLimit, QuotaError> {
        Ok(BatchLimit::of(
            A::kind(),
            algorithm.script_params()?,
            algorithm.capacity(),
        ))
    }

    /// The limit algorithm `A` enforces for `quota`, built as [`RedisLimiter::new`] builds it: from
    /// [`A::redis_quota(quota)`](RedisEncoding::redis_quota), the quota itself wherever the script
    /// can follow it exactly.
    ///
    /// # Errors
    /// As [`RedisLimiter::new`].
    pub fn for_quota<A: BatchEncoding>(quota: Quota) -> Result<BatchLimit, QuotaError> {
        Self::new(&A::from_quota(A::redis_quota(quota)?)?)
    }

    /// The largest cost one request may have under this limit.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The algorithm's refund script (the one its [`RedisLimiter`] refunds with).
    pub(crate) fn refund_script(&self) -> &'static redis::Script {
        match self.kind {
            Kind::Tat => &scripts::GCRA_REFUND,
            Kind::Fixed => &scripts::FIXED_WINDOW_REFUND,
            Kind::Sliding => &scripts::SLIDING_WINDOW_REFUND,
        }
    }

    /// The script's parameters.
    pub(crate) fn params(&self) -> &ScriptParams {
        &self.params
    }
}

impl<A: BatchEncoding, C: ConnectionLike + Clone + Send + Sync> RedisLimiter<A, C> {
    /// This limiter's algorithm and quota as a [`BatchLimit`]: a [`RedisBatch`] with the same key
    /// prefix decides a key against it exactly as this limiter does, on the same stored state.
    pub fn batch_limit(&self) -> BatchLimit {
        BatchLimit::of(A::kind(), self.params().clone(), self.capacity())
    }
}

/// One key of a batch: the key (under the batch's prefix), the limit it is decided against, and
/// whether it enforces.
#[derive(Clone, Copy, Debug)]
pub struct BatchKey<'a> {
    /// The key, without the batch's prefix: any string of any length (CR LF, NUL, quotes, braces
    /// and the like included; a hash tag decides its cluster slot).
    pub key: &'a str,
    /// The algorithm and quota.
    pub limit: &'a BatchLimit,
    /// `true`: a denial denies the request. `false` (shadow): decided and reported, never denies;
    /// its admission is written only when the request is admitted.
    pub enforcing: bool,
}

impl<'a> BatchKey<'a> {
    /// An enforcing key: its denial denies the request.
    pub fn enforcing(key: &'a str, limit: &'a BatchLimit) -> Self {
        BatchKey {
            key,
            limit,
            enforcing: true,
        }
    }

    /// A shadow key: decided and reported, never denies the request.
    pub fn shadow(key: &'a str, limit: &'a BatchLimit) -> Self {
        BatchKey {
            key,
            limit,
            enforcing: false,
        }
    }
}

/// Decides several keys, each against its own [`BatchLimit`] (any mix of GCRA, leaky bucket, fixed
/// and sliding window, each with its own quota), as **one request in one atomic script call** (one
/// `FCALL` of a function library loaded once per server, or on Redis before 7, or where functions
/// are refused, one `EVALSHA`: one round trip, whatever the number of keys).
///
/// * Every key is decided first, at one `now`, for the same `cost`, on the state it holds, by the
///   same Lua function as its single-key [`RedisLimiter`] script: each key's [`Decision`] is what
///   that limiter's `try_peek` would answer, in the same units.
/// * Then, for a check, the admissions are written (each key's new state and TTL) **only if every
///   enforcing key admitted**; otherwise nothing is written. A shadow key (`enforcing: false`) never
///   denies the request, and its admission is written only with the request's: as the in-process
///   engine, which gives every admission back when an enforcing rule denies. A peek writes nothing.
/// * The request is admitted when every enforcing key's decision is
///   [`Allowed`](Decision::is_allowed) (see [`admitted`]).
/// * A cost an enforcing key can never admit is [`Error::Cost`] before any round trip. A shadow key
///   that can never admit it is not sent; its decision is a denial with `retry_after` and
///   `reset_after` "never" (`u64::MAX` ns), as a script's `-1`.
/// * A key holding another Redis type ([`Error::WrongType`]) or state no script can have written
///   ([`Error::CorruptState`]) fails the whole call, naming that key; every key is read before any
///   is written, so **nothing is written**. The same key twice in one call is
///   [`Error::DuplicateKey`], before any round trip.
/// * Keys are `prefix + key` ([`RedisConfig::with_prefix`]); any bytes, any length. The calls run
///   under the configured timeout and circuit breaker, as [`RedisLimiter`]'s do; no fault policy
///   is applied (the caller answers the errors).
///
/// **Durable admissions** ([`with_durability`](Self::with_durability)): a call whose script wrote
/// an admission then sends `WAIT` and answers [`Error::NotReplicated`] when too few replicas
/// confirm in time (see [`Durability`]); coalesced requests share their group call's one `WAIT`.
///
/// **Redis Cluster**: a script's keys must all live in one hash slot, or the server refuses it
/// (`CROSSSLOT`, an [`Error::Redis`]). Put one hash tag in every key of a request (e.g.
/// `"{tenant42}:login"`, `"{tenant42}:api"`): the request is then one script, atomic and exact,
/// as on one node. Otherwise ask for [`with_slot_groups`](Self::with_slot_groups): the keys are
/// grouped by [`slot`](crate::slot), one script per group (each atomic over its keys, committing
/// only if its own enforcing keys admit), the groups sent concurrently (one round trip for the
/// slowest); when any group denies or fails, each group that committed gets its admissions back by
/// the algorithms' refund scripts (one more round trip). **The bound**: between a group's commit
/// and its refund, a concurrent request on one of its keys sees those units spent, so it may be
/// denied early (at most `cost` units per key per request in flight); never admitted beyond the
/// quota, since every admission is decided against the stored state. The refund puts the state
/// back as each algorithm's refund does (exactly for GCRA, the leaky bucket and the fixed window
/// within the same window; see [`RedisLimiter::try_refund`]); a refund that fails (an outage)
/// leaves the units spent: stricter, never looser. Keys on several slots see several `TIME`s (one
/// per node). A split request with [`with_durability`](Self::with_durability) that admits
/// answers [`Error::NotReplicated`] (`WAIT` is not sent across slot groups).
///
/// ```no_run
/// use tollgate_core::{FixedWindow, Gcra, Quota};
/// use tollgate_redis::{BatchKey, BatchLimit, RedisBatch, RedisConfig, admitted, connect};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let config = RedisConfig::default().with_prefix("api:");
/// let batch = RedisBatch::new(connect("redis://127.0.0.1:6379/", &config)?, config);
/// let per_second = BatchLimit::for_quota::<Gcra>(Quota::per_second(10)?)?;
/// let per_hour = BatchLimit::for_quota::<FixedWindow>(Quota::per_hour(1000)?)?;
/// let keys = [
///     BatchKey::enforcing("{user42}:s", &per_second),
///     BatchKey::shadow("{user42}:h", &per_hour),
/// ];
/// let decisions = batch.try_check(&keys, 1).await?;
/// println!("admitted: {}", admitted(&keys, &decisions));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RedisBatch<C = ConnectionManager> {
    pub(crate) conn: C,
    pub(crate) config: RedisConfig,
    pub(crate) breaker: Arc<Breaker>,
    pub(crate) durability: Option<Durability>,
    /// Split a request across slot groups ([`with_slot_groups`](Self::with_slot_groups)).
    pub(crate) split: bool,
    /// `FCALL` or `EVALSHA` (shared by the clones).
    pub(crate) via: Arc<LibraryCall>,
    /// Concurrent requests sent as one call ([`with_coalescing`](Self::with_coalescing); shared by
    /// the clones).
    coalesce: Option<Arc<dyn Coalesce>>,
}

/// Whether a batch's request was admitted: every enforcing key's decision is allowed (`keys` and
/// `decisions` in the same order, as [`RedisBatch`] answers).
pub fn admitted(keys: &[BatchKey<'_>], decisions: &[Decision]) -> bool {
    keys.iter()
        .zip(decisions)
        .all(|(k, d)| !k.enforcing || d.is_allowed())
}

impl<C: ConnectionLike + Clone + Send + Sync> RedisBatch<C> {
    /// Batches over `conn` with `config`'s prefix, timeout, time source and circuit breaker (its
    /// fault policy is not used: the calls return their errors).
    pub fn new(conn: C, config: RedisConfig) -> Self {
        RedisBatch {
            breaker: Arc::new(Breaker::new(config.breaker(), config.prefix())),
            conn,
            config,
            durability: None,
            split: false,
            via: Arc::default(),
            coalesce: None,
        }
    }

    /// Sends concurrent requests (of this batch and its clones) as one call: while a call is in
    /// flight, the requests that arrive wait, and the next call carries them all (up to 64), each
    /// decided in turn exactly as its own call would decide it (atomic, on the state the one
    /// before it left, its own errors its own: a request whose key is of a foreign type fails
    /// alone and writes nothing). Redis then runs one command, one `TIME` and one reply per group
    /// rather than per request; a request alone goes at once. The requests of one call share the
    /// server's `TIME` (the instant the call runs).
    ///
    /// **One node only** (or a primary behind one address): a group's keys span any slots, which
    /// Redis Cluster refuses (`CROSSSLOT`). By the library's function (`FCALL`, Redis 7 and
    /// later); where functions are not there to use, each request goes alone, as without this.
    /// Each request keeps its own timeout (a group call is bounded by the same one). Needs a
    /// tokio runtime (outside one a request goes alone).
    pub fn with_coalescing(mut self) -> Self
    where
        C: 'static,
    {
        let coalescer = Coalescer::new(self.conn.clone(), self.via.clone(), self.config.timeout());
        self.coalesce = Some(Arc::new(coalescer));
        self
    }

    /// After every call whose script wrote an admission, waits for `durability`'s replicas to
    /// confirm it (`WAIT`), answering [`Error::NotReplicated`] when too few do in time. Keep
    /// [`Durability::timeout`] below the connection's response timeout (for [`connect`](crate::connect),
    /// the config's timeout), or a missing replica reads as a timeout of the connection instead.
    /// For one node (or a primary behind one address) only: on a cluster connection the `WAIT`
    /// would not reach the node that ran the script.
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = Some(durability);
        self
    }

    /// On Redis Cluster: a request whose keys lie in several hash slots is decided as one script per
    /// slot group, the groups sent concurrently, and when any group denies (or fails) the groups that
    /// admitted get their units back by compensating refund scripts (see
    /// [`RedisBatch`]'s "Redis Cluster" section for the bound this leaves). A request whose keys
    /// share one slot (a hash tag) is still one exact script. Without this, keys in several slots
    /// are refused by Redis (`CROSSSLOT`).
    pub fn with_slot_groups(mut self) -> Self {
        self.split = true;
        self
    }

    /// The durability asked for, if any.
    pub fn durability(&self) -> Option<Durability> {
        self.durability
    }

    /// The settings.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// The circuit breaker's state and counters (shared by this batch's clones).
    pub fn breaker(&self) -> BreakerStats {
        self.breaker.stats()
    }

    /// Decides `cost` units for every key of `keys` as one request, writing the admissions only
    /// when every enforcing key admits (see [`RedisBatch`]). The decisions come back in `keys`'
    /// order.
    ///
    /// # Errors
    /// [`Error::Cost`] when an enforcing key can never admit `cost`; [`Error::DuplicateKey`]; the
    /// outages [`Error::Timeout`], [`Error::Redis`], [`Error::BadReply`], [`Error::CircuitOpen`];
    /// [`Error::CorruptState`] and [`Error::WrongType`] naming the key at fault. Nothing was
    /// written then. With [`with_durability`](Self::with_durability), [`Error::NotReplicated`]
    /// (or an outage of the `WAIT`) after an admission that was written.
    pub async fn try_check(
        &self,
        keys: &[BatchKey<'_>],
        cost: u64,
    ) -> Result<Vec<Decision>, Error> {
        self.run(keys, None, cost, false).await
    }

    /// What [`try_check`](Self::try_check) would decide, writing nothing.
    ///
    /// # Errors
    /// As [`try_check`](Self::try_check).
    pub async fn try_peek(&self, keys: &[BatchKey<'_>], cost: u64) -> Result<Vec<Decision>, Error> {
        self.run(keys, None, cost, true).await
    }

    /// [`try_check`](Self::try_check) at a time the caller supplies (ns on a time base every
    /// instance shares, e.g. since the Unix epoch), rounded down to whole µs; for tests and
    /// simulations.
    ///
    /// # Errors
    /// As [`try_check`](Self::try_check).
    pub async fn try_check_at(
        &self,
        keys: &[BatchKey<'_>],
        now: Nanos,
        cost: u64,
    ) -> Result<Vec<Decision>, Error> {
        self.run(keys, Some(now), cost, false).await
    }

    /// [`try_peek`](Self::try_peek) at a time the caller supplies (as
    /// [`try_check_at`](Self::try_check_at)).
    ///
    /// # Errors
    /// As [`try_check`](Self::try_check).
    pub async fn try_peek_at(
        &self,
        keys: &[BatchKey<'_>],
        now: Nanos,
        cost: u64,
    ) -> Result<Vec<Decision>, Error> {
        self.run(keys, Some(now), cost, true).await
    }

    /// [`try_check`](Self::try_check), with the instant the script decided at (ns since the Unix
    /// epoch, a whole µs: Redis's `TIME`, or the configured time source), which a reservation
    /// settles against ([`try_settle`](Self::try_settle)); `None` when no key was sent (nothing
    /// was written).
    ///
    /// # Errors
    /// As [`try_check`](Self::try_check).
    pub async fn try_check_timed(
        &self,
        keys: &[BatchKey<'_>],
        cost: u64,
    ) -> Result<(Vec<Decision>, Option<Nanos>), Error> {
        self.run_timed(keys, None, cost, false).await
    }

    /// [`try_check_timed`](Self::try_check_timed) at a time the caller supplies (as
    /// [`try_check_at`](Self::try_check_at)).
    ///
    /// # Errors
    /// As [`try_check`](Self::try_check).
    pub async fn try_check_timed_at(
        &self,
        keys: &[BatchKey<'_>],
        now: Nanos,
        cost: u64,
    ) -> Result<(Vec<Decision>, Option<Nanos>), Error> {
        self.run_timed(keys, Some(now), cost, false).await
    }

    async fn run(
        &self,
        keys: &[BatchKey<'_>],
        now: Option<Nanos>,
        cost: u64,
        peek: bool,
    ) -> Result<Vec<Decision>, Error> {
        self.run_timed(keys, now, cost, peek)
            .await
            .map(|(decisions, _)| decisions)
    }

    async fn run_timed(
        &self,
        keys: &[BatchKey<'_>],
        now: Option<Nanos>,
        cost: u64,
        peek: bool,
    ) -> Result<(Vec<Decision>, Option<Nanos>), Error> {
        for k in keys.iter().filter(|k| k.enforcing) {
            if cost > k.limit.capacity {
                return Err(Error::Cost(CheckError::CostExceedsCapacity {
                    cost,
                    capacity: k.limit.capacity,
                }));
            }
        }
        if let Some(key) = duplicate(keys) {
            return Err(Error::DuplicateKey {
                key: self.config.key(key),
            });
        }
        // A shadow key that can never admit the cost is not sent: it is denied for good.
        let never = Decision::denied(Nanos::MAX, Nanos::MAX);
        let sent: SmallVec<[&BatchKey<'_>; 8]> =
            keys.iter().filter(|k| cost <= k.limit.capacity).collect();
        if sent.is_empty() {
            return Ok((vec![never; keys.len()], None));
        }
        if self.breaker.admit() == Admission::Reject {
            return Err(Error::CircuitOpen);
        }
        if self.split && self.spans_slots(&sent) {
            // Several scripts decide a split request, each at its own instant: none is reported.
            return self
                .run_split(keys, &sent, now, cost, peek)
                .await
                .map(|decisions| (decisions, None));
        }
        let result: Result<(Vec<Decision>, Nanos), Error> = async {
            let (raw, at, group_wait) = self.call(&sent, now, cost, peek).await?;
            let decisions = parse(keys, &sent, &raw, cost)?;
            // Only a call that wrote an admission waits for it to be replicated: by its group's
            // one `WAIT` where it went in a group that waits for the same durability, else by its
            // own.
            let wrote =
                !peek && admitted(keys, &decisions) && decisions.iter().any(|d| d.is_allowed());
            if let Some(durability) = self.durability.filter(|_| wrote) {
                match group_wait {
                    Some(wait) if wait.durability() == durability => wait.confirm().await?,
                    _ => {
                        durability
                            .confirm(&self.conn, self.config.timeout())
                            .await?
                    }
                }
            }
            Ok((decisions, at))
        }
        .await;
        self.breaker.record(match &result {
            Err(e) if e.is_outage() => Outcome::Failed,
            _ => Outcome::Answered,
        });
        result.map(|(decisions, at)| (decisions, Some(at)))
    }

    pub(crate) async fn call(
        &self,
        sent: &[&BatchKey<'_>],
        now: Option<Nanos>,
        cost: u64,
        peek: bool,
    ) -> Result<(Vec<i64>, Nanos, Option<Arc<dyn GroupWait>>), Error> {
        let request = Request {
            keys: sent.iter().map(|k| self.config.key(k.key)).collect(),
            time: scripts::time_arg(&self.config, now),
            cost: cost.to_string(),
            plan: plan(sent, peek),
            durability: self.durability,
        };
        let timeout = self.config.timeout();
        let grouped = match &self.coalesce {
            Some(c) if !self.via.script_only() => Arc::clone(c).submit(request),
            _ => Err(request),
        };
        let request = match grouped {
            Err(request) => request,
            // The group answers by the request's deadline (coalesce.rs): no timer of our own.
            Ok(answer) => match answer.await {
                // The group's task was dropped (its runtime shut down): no answer came.
                Err(_) => {
                    return Err(Error::Redis(redis::RedisError::from(
                        std::io::Error::other("the group call was dropped with its runtime"),
                    )));
                }
                Ok(Answer::Reply(text, wait)) => {
                    let (raw, at) = reply_of(&text, sent, cost)?;
                    return Ok((raw, at, wait));
                }
                Ok(Answer::Failed(e)) => return Err(self.classify(e, sent)),
                Ok(Answer::Timeout(t)) => return Err(Error::Timeout(t)),
                Ok(Answer::BadReply(why)) => return Err(Error::BadReply(why)),
                Ok(Answer::Alone(request)) => request,
            },
        };
        let mut conn = self.conn.clone();
        let args = [
            request.time.as_str(),
            request.cost.as_str(),
            request.plan.as_str(),
        ];
        let text: Vec<u8> =
            tokio::time::timeout(timeout, self.via.invoke(&mut conn, &request.keys, &args))
                .await
                .map_err(|_| Error::Timeout(timeout))?
                .map_err(|e| self.classify(e, sent))?;
        let (raw, at) = reply_of(&text, sent, cost)?;
        Ok((raw, at, None))
    }

    /// A script error as the crate's [`Error`]: `TOLLGATE_KEY <i> <error>` names the key (from 1)
    /// whose decision raised `<error>`.
    fn classify(&self, e: redis::RedisError, sent: &[&BatchKey<'_>]) -> Error {
        if e.code() != Some("TOLLGATE_KEY") {
            return scripts::classify(e, &self.config, "");
        }
        let detail = e.detail().unwrap_or("");
        // Redis appends where the error was raised (" script: <sha>, on @user_script:<line>.").
        let detail = detail.rsplit_once(" script: ").map_or(detail, |(d, _)| d);
        let Some((index, inner)) = detail.split_once(' ') else {
            return Error::Redis(e);
        };
        let Some(k) = index
            .parse::<usize>()
            .ok()
            .and_then(|i| i.checked_sub(1))
            .and_then(|i| sent.get(i))
        else {
            return Error::Redis(e);
        };
        let key = self.config.key(k.key);
        let (code, rest) = inner.split_once(' ').unwrap_or((inner, ""));
        match code {
            "TOLLGATE_CORRUPT" => {
                let reason = rest
                    .strip_prefix(key.as_str())
                    .and_then(|r| r.strip_prefix(": "))
                    .unwrap_or(rest)
                    .to_owned();
                Error::CorruptState { key, reason }
            }
            "WRONGTYPE" => Error::WrongType {
                key,
                detail: rest.to_owned(),
            },
            _ => Error::Redis(e),
        }
    }
}

/// The request's plan, the batch's third argument (batch.lua): peek (0/1), then each sent key's
/// spec, separated by single spaces. One argument, not one per key: the same rules send the same
/// text, which the function library parses once (the cost, which may change on every request, is
/// the second argument).
fn plan(sent: &[&BatchKey<'_>], peek: bool) -> String {
    let specs: usize = sent
        .iter()
        .map(|k| k.limit.spec(k.enforcing).len() + 1)
        .sum();
    let mut plan = String::with_capacity(1 + specs);
    plan.push(if peek { '1' } else { '0' });
    for k in sent {
        plan.push(' ');
        plan.push_str(k.limit.spec(k.enforcing));
    }
    plan
}

/// The batch's reply text (batch.lua) as four values per sent key and the instant decided at (ns):
/// a window's four as replied, a GCRA key's from its two ([`TatReply`]) and the request's `cost`.
fn reply_of(text: &[u8], sent: &[&BatchKey<'_>], cost: u64) -> Result<(Vec<i64>, Nanos), Error> {
    let bad = || {
        Error::BadReply(format!(
            "not the batch's reply: {:?}",
            String::from_utf8_lossy(text)
        ))
    };
    let mut values = text.split(|&b| b == b' ').map(integer);
    let mut next = || values.next().flatten().ok_or_else(bad);
    let mut reply = Vec::with_capacity(sent.len() * 4);
    for k in sent {
        match k.limit.tat {
            Some(tat) => {
                let (allowed, value) = (next()?, next()?);
                reply.extend(tat.values(allowed, value, cost).ok_or_else(bad)?);
            }
            None => {
                for _ in 0..4 {
                    reply.push(next()?);
                }
            }
        }
    }
    // Then the instant decided at (µs), and nothing after it.
    let at = next().ok().and_then(|us| u64::try_from(us).ok());
    let at = at.ok_or_else(|| Error::BadReply("no time, or a negative one".to_owned()))?;
    if values.next().is_some() {
        return Err(bad());
    }
    Ok((reply, at.saturating_mul(1000)))
}

/// The script's reply as a decision per key of `keys` (`sent`: those sent, in order).
pub(crate) fn parse(
    keys: &[BatchKey<'_>],
    sent: &[&BatchKey<'_>],
    raw: &[i64],
    cost: u64,
) -> Result<Vec<Decision>, Error> {
    // A shadow key that can never admit the cost was not sent: it is denied for good.
    let never = Decision::denied(Nanos::MAX, Nanos::MAX);
    let mut replies = raw.chunks_exact(4).zip(sent);
    keys.iter()
        .map(|k| {
            if cost > k.limit.capacity {
                return Ok(never);
            }
            let (chunk, k) = replies.next().ok_or_else(|| short(raw, sent))?;
            Ok(Reply::parse(chunk, k.limit.params.unit())?.decision())
        })
        .collect()
}

/// An optional `-` and decimal digits as an `i64`; `None` for anything else or out of range.
fn integer(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, text),
    };
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0i64, |n, &d| {
        if !d.is_ascii_digit() {
            return None;
        }
        let d = i64::from(d - b'0');
        // Accumulated with its sign, so that i64::MIN reads too.
        let n = n.checked_mul(10)?;
        if negative {
            n.checked_sub(d)
        } else {
            n.checked_add(d)
        }
    })
}

/// The first key that appears twice in `keys`, if any.
fn duplicate<'a>(keys: &[BatchKey<'a>]) -> Option<&'a str> {
    if keys.len() <= 8 {
        // A request's few keys compared pairwise: nothing to allocate and sort.
        return keys
            .iter()
            .enumerate()
            .find(|(i, k)| keys[..*i].iter().any(|other| other.key == k.key))
            .map(|(_, k)| k.key);
    }
    let mut sorted: Vec<&str> = keys.iter().map(|k| k.key).collect();
    sorted.sort_unstable();
    sorted.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

fn short(raw: &[i64], sent: &[&BatchKey<'_>]) -> Error {
    Error::BadReply(format!("{} values, want {}", raw.len(), sent.len() * 4 + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The batch script reads exactly three parameters per key after its algorithm and flag (its
    /// spec: `<algorithm><0/1><a>,<b>,<c>`).
    #[test]
    fn every_batch_algorithm_sends_three_parameters() {
        let quota = Quota::per_second(3).unwrap();
        let limits = [
            BatchLimit::for_quota::<Gcra>(quota).unwrap(),
            BatchLimit::for_quota::<LeakyBucket>(quota).unwrap(),
            BatchLimit::for_quota::<FixedWindow>(quota).unwrap(),
            BatchLimit::for_quota::<SlidingWindow>(quota).unwrap(),
        ];
        let codes: Vec<&str> = limits.iter().map(|l| l.kind.code()).collect();
        assert_eq!(codes, ["g", "g", "f", "s"]);
        for l in &limits {
            assert_eq!(l.params.args().len(), 3, "{l:?}");
            assert_eq!(l.capacity(), 3);
        }
    }

    #[test]
    fn a_reply_value_reads_as_its_integer() {
        for (text, n) in [
            (&b"1"[..], 1),
            (b"999", 999),
            (b"-1", -1),
            (b"1733000000000000", 1_733_000_000_000_000),
            (b"-9223372036854775808", i64::MIN),
            (b"9223372036854775807", i64::MAX),
        ] {
            assert_eq!(integer(text), Some(n));
        }
        for bad in [
            &b""[..],
            b"-",
            b"1.5",
            b"1e3",
            b"x",
            b"99999999999999999999",
            b"9223372036854775808",
            b"+5",
            b"--1",
            b"\xff",
        ] {
            assert_eq!(integer(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    /// A GCRA key's two values give its four as gcra_decide computes them; a window's four are
    /// read as replied; anything else is a bad reply.
    #[test]
    fn the_reply_text_reads_as_four_values_per_key() {
        // 10/s, burst 5: units of 1 µs, interval 100 000, depth 500 000.
        let quota = Quota::per_second(10).unwrap().with_burst(5).unwrap();
        let gcra = BatchLimit::for_quota::<Gcra>(quota).unwrap();
        let window = BatchLimit::for_quota::<FixedWindow>(quota).unwrap();
        let (g, w) = (
            BatchKey::enforcing("g", &gcra),
            BatchKey::shadow("w", &window),
        );
        let sent = [&g, &w];
        let read = |text: &str, cost| reply_of(text.as_bytes(), &sent, cost);
        // An admission: remaining (500 000 - 100 000) / 100 000 = 4.
        let (values, at) = read("1 100000 1 4 0 90000 1733000000000000", 1).unwrap();
        assert_eq!(values, [1, 4, 0, 100_000, 1, 4, 0, 90_000]);
        assert_eq!(at, 1_733_000_000_000_000_000);
        // A denial of cost 2: reset_after 50 000 + 500 000 - 200 000.
        let (values, _) = read("0 50000 0 0 7 8 1", 2).unwrap();
        assert_eq!(values, [0, 0, 50_000, 350_000, 0, 0, 7, 8]);
        // Never.
        let (values, _) = read("0 -1 0 0 -1 -1 1", 1).unwrap();
        assert_eq!(values, [0, 0, -1, -1, 0, 0, -1, -1]);
        for bad in [
            "1 100000 1 4 0 90000",
            "1 100000 1 4 0 90000 1 2",
            "1 600000 1 4 0 90000 1",
            "1 -1 1 4 0 90000 1",
            "0 0 1 4 0 90000 1",
            "0 -2 1 4 0 90000 1",
            "2 5 1 4 0 90000 1",
            "1 100000 1 4 0 90000 -1",
            "1  100000 1 4 0 90000 1",
            "1 100000 1 4 0 90000 1 ",
            " 1 100000 1 4 0 90000 1",
            "",
        ] {
            assert!(matches!(read(bad, 1), Err(Error::BadReply(_))), "{bad:?}");
        }
        // A denial whose retry_after is shorter than the cost's intervals past the depth.
        assert!(matches!(read("0 1 0 0 7 8 1", 6), Err(Error::BadReply(_))));
    }

    #[test]
    fn a_key_twice_is_found() {
        let l = BatchLimit::for_quota::<Gcra>(Quota::per_second(3).unwrap()).unwrap();
        let keys = [
            BatchKey::enforcing("a", &l),
            BatchKey::shadow("b", &l),
            BatchKey::enforcing("c", &l),
        ];
        assert_eq!(duplicate(&keys), None);
        let keys = [keys[0], keys[1], BatchKey::shadow("a", &l)];
        assert_eq!(duplicate(&keys), Some("a"));
        // Past 8 keys (sorted rather than compared pairwise).
        let names: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
        let mut many: Vec<BatchKey<'_>> =
            names.iter().map(|n| BatchKey::enforcing(n, &l)).collect();
        assert_eq!(duplicate(&many), None);
        many.push(BatchKey::shadow("k7", &l));
        assert_eq!(duplicate(&many), Some("k7"));
    }
}
