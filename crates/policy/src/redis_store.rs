//! The store behind a [`RedisPolicy`](crate::RedisPolicy): every rule's state in a shared Redis,
//! as [`RedisSettings`] say.
//!
//! Each rule (and each of its override quotas) decides through a tollgate-redis limiter of its
//! algorithm: a `RedisLimiter` (one atomic script per decision, exact) per request, or a
//! `LeasedLimiter` (local leases of a shared GCRA bucket) in lease mode. Per request, a request's
//! rules are one `RedisBatch` script.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use tollgate_core::{
    CheckError, Decision, FixedWindow, Gcra, LeakyBucket, Nanos, Quota, QuotaError, SlidingWindow,
};
use tollgate_redis::{
    BatchEncoding, BatchKey, BatchLimit, BreakerConfig, Connection, Durability, Error, FaultPolicy,
    LeaseConfig, LeasedLimiter, RedisBatch, RedisConfig, RedisLimiter,
};

use crate::config::AlgorithmKind;
use crate::config_error::{ConfigError, ConfigErrorKind};
use crate::rules::RuleSet;
use crate::store::{AsyncStore, BatchAnswer, RuleKey, next_unit};

/// How a [`RedisPolicy`](crate::RedisPolicy) keeps its rules' state in Redis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisSettings {
    /// Prefix of every key (`"tollgate:"`; tollgate-server adds the domain).
    pub prefix: String,
    /// `None`: one script per request (exact). `Some`: local leases of a shared GCRA bucket (every
    /// rule must then be `gcra`; another algorithm is a [`ConfigError`] at build).
    pub lease: Option<LeaseConfig>,
    /// Per-call timeout.
    pub timeout: Duration,
    /// The answer when Redis cannot give one.
    pub fail: FaultPolicy,
    /// When to stop calling a Redis that keeps failing.
    pub breaker: BreakerConfig,
    /// Per request mode: wait for replicas to confirm each admitted request (`WAIT` after its
    /// script), answering by [`fail`](Self::fail) when too few do in time (see
    /// [`Durability`]); `None` (the default): answer as soon as the primary has decided. Keep its
    /// timeout below [`timeout`](Self::timeout). Lease mode or a cluster connection with it is a
    /// [`ConfigError`] at build.
    pub durable: Option<Durability>,
    /// A descriptor whose value tags the keys of the rules keyed by it (`"tenant"`: a rule keyed by
    /// `tenant`, alone or with others, stores its key `k` as `{t<hex of the tenant>}k`), so that
    /// every such key of a request lies in one Redis Cluster slot and the request is one exact
    /// script there. Rules not keyed by it keep their keys (a global rule has one key for all
    /// tenants and lives in its own slot). Changing it moves those keys (their state starts fresh).
    pub hash_tag: Option<String>,
}

impl Default for RedisSettings {
    fn default() -> Self {
        let redis = RedisConfig::default();
        RedisSettings {
            prefix: "tollgate:".to_owned(),
            lease: None,
            timeout: redis.timeout(),
            fail: FaultPolicy::FailClosed {
                retry_after: Duration::from_secs(1),
            },
            breaker: BreakerConfig::default(),
            durable: None,
            hash_tag: None,
        }
    }
}

/// A rule-and-quota's Redis limiter, of its algorithm and mode.
pub(crate) enum Limiter {
    /// A script call per decision: a [`RedisLimiter`] of the rule's algorithm.
    PerCall(Box<dyn PerCall>),
    /// Boxed: a leased limiter carries its key table's shards inline.
    Lease(Box<LeasedLimiter<Connection>>),
}

/// The future of a per-call limiter's call.
type Call<'a, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

/// A [`RedisLimiter`] of any algorithm, as the store calls it: at the server's time (`now`
/// `None`) or the caller's. Its calls' futures are boxed: a round trip each, so the allocation is
/// small beside it, and a lease's local decision (and every future that awaits one of these) then
/// does not carry and move a script call's future.
pub(crate) trait PerCall: Send + Sync {
    fn check<'a>(&'a self, key: &'a str, now: Option<Nanos>, cost: u64) -> Call<'a, Decision>;
    fn peek<'a>(&'a self, key: &'a str, now: Option<Nanos>, cost: u64) -> Call<'a, Decision>;
    fn refund<'a>(&'a self, key: &'a str, now: Option<Nanos>, cost: u64) -> Call<'a, ()>;
    /// The algorithm and quota as a key of a [`RedisBatch`].
    fn batch_limit(&self) -> BatchLimit;
}

impl<A> PerCall for RedisLimiter<A, Connection>
where
    A: BatchEncoding + Send + Sync,
{
    fn check<'a>(&'a self, key: &'a str, now: Option<Nanos>, cost: u64) -> Call<'a, Decision> {
        Box::pin(async move {
            match now {
                None => self.try_check(key, cost).await,
                Some(now) => self.try_check_at(key, now, cost).await,
            }
        })
    }

    fn peek<'a>(&'a self, key: &'a str, now: Option<Nanos>, cost: u64) -> Call<'a, Decision> {
        Box::pin(async move {
            match now {
                None => self.try_peek(key, cost).await,
                Some(now) => self.try_peek_at(key, now, cost).await,
            }
        })
    }

    fn refund<'a>(&'a self, key: &'a str, now: Option<Nanos>, cost: u64) -> Call<'a, ()> {
        Box::pin(async move {
            match now {
                None => self.try_refund(key, cost).await,
                Some(now) => self.try_refund_at(key, now, cost).await,
            }
        })
    }

    fn batch_limit(&self) -> BatchLimit {
        RedisLimiter::batch_limit(self)
    }
}

/// A per-call limiter of algorithm `A` (a [`RedisLimiter`] behind [`PerCall`]).
fn per_call<A>(conn: Connection, quota: Quota, config: RedisConfig) -> Result<Limiter, QuotaError>
where
    A: BatchEncoding + Send + Sync + 'static,
{
    Ok(Limiter::PerCall(Box::new(RedisLimiter::<A, _>::new(
        conn, quota, config,
    )?)))
}

/// Everything a limiter is built from: equal specs reuse the limiter across reloads (a leased one
/// keeps its live leases, every one its breaker).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Spec {
    prefix: String,
    algorithm: AlgorithmKind,
    quota: Quota,
    lease: Option<LeaseConfig>,
    timeout: Duration,
    fail: FaultPolicy,
    breaker: BreakerConfig,
}

pub(crate) struct QuotaLimiter {
    spec: Spec,
    pub(crate) limiter: Limiter,
    /// Per request mode: the algorithm and quota as one key of a [`RedisBatch`], and the key's
    /// name under the batch's prefix (`<rule>:<algorithm>:`).
    pub(crate) batch: Option<(BatchLimit, String)>,
}

impl QuotaLimiter {
    async fn check(&self, key: &str, now: Option<Nanos>, cost: u64) -> Result<Decision, Error> {
        match (&self.limiter, now) {
            (Limiter::PerCall(l), _) => l.check(key, now, cost).await,
            (Limiter::Lease(l), None) => l.try_check(key, cost).await,
            (Limiter::Lease(l), Some(now)) => l.try_check_at(key, now, cost).await,
        }
    }

    /// `None`: not asked (a lease answers for this process alone; peeking the shared bucket after
    /// another rule denied would cost a round trip for a wait that is only a hint).
    async fn peek(
        &self,
        key: &str,
        now: Option<Nanos>,
        cost: u64,
    ) -> Option<Result<Decision, Error>> {
        match &self.limiter {
            Limiter::PerCall(l) => Some(l.peek(key, now, cost).await),
            Limiter::Lease(_) => None,
        }
    }

    async fn refund(&self, key: &str, now: Option<Nanos>, cost: u64) -> Result<(), Error> {
        match (&self.limiter, now) {
            (Limiter::PerCall(l), _) => l.refund(key, now, cost).await,
            (Limiter::Lease(l), None) => {
                l.refund(key, cost);
                Ok(())
            }
            (Limiter::Lease(l), Some(now)) => {
                l.refund_at(key, now, cost);
                Ok(())
            }
        }
    }

    /// The wait until more than `remaining` units pass, from an admission alone (no round trip):
    /// [`store::next_unit`](crate::store::next_unit) for the buckets and the fixed window (in lease
    /// mode on the shared bucket's estimate the leased limiter reports), the window's end for the
    /// sliding window (an upper bound).
    fn next_unit(&self, decision: &Decision) -> Option<Duration> {
        match self.spec.algorithm {
            AlgorithmKind::SlidingWindow => match *decision {
                Decision::Allowed {
                    remaining,
                    reset_after,
                } => (remaining < self.spec.quota.limit()).then_some(reset_after),
                Decision::Denied { .. } => None,
            },
            _ => next_unit(self.spec.algorithm, &self.spec.quota, decision).flatten(),
        }
    }
}

/// A rule's limiters: its own quota's and one per override quota.
struct RuleLimiters {
    by_quota: Vec<(Quota, Arc<QuotaLimiter>)>,
}

/// Every rule's Redis limiters, indexed like the rule set.
pub(crate) struct RedisStore {
    rules: Box<[RuleLimiters]>,
    /// Every rule of a request in one script (per request mode), and every settlement's script
    /// (both modes).
    pub(crate) batch: RedisBatch<Connection>,
    /// What the batch was built with (a reload with other settings builds another).
    batch_settings: RedisSettings,
    pub(crate) fail: FaultPolicy,
    labels: Vec<(String, String)>,
}

/// The algorithm's part of a rule's keys. Not the quota: every quota of a rule (a reload, an
/// override) reads and writes the same key, whose stored quota tag lets the scripts carry the state
/// over as-is.
fn label(algorithm: AlgorithmKind) -> &'static str {
    match algorithm {
        AlgorithmKind::Gcra => "gcra",
        AlgorithmKind::LeakyBucket => "leaky_bucket",
        AlgorithmKind::FixedWindow => "fixed_window",
        AlgorithmKind::SlidingWindow => "sliding_window",
    }
}

/// A key's bytes as text: borrowed when they are UTF-8, as a single key's value is unless a caller
/// gave bytes that are not (then with replacement characters, in a copy). `from_utf8` first: on
/// valid bytes it is about half the work of `from_utf8_lossy`.
fn text(bytes: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

/// `bytes` in lowercase hex, appended to `out`.
fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
}

impl RedisStore {
    /// Builds the limiters of `rules` on `conn`, reusing `old`'s where nothing they are built from
    /// changed.
    pub(crate) fn build(
        rules: &RuleSet,
        settings: &RedisSettings,
        conn: &Connection,
        old: Option<&RedisStore>,
    ) -> Result<Self, ConfigError> {
        let reusable: Vec<&Arc<QuotaLimiter>> = old
            .into_iter()
            .flat_map(|o| o.rules.iter())
            .flat_map(|r| r.by_quota.iter().map(|(_, l)| l))
            .collect();
        if settings.lease.is_some() && settings.durable.is_some() {
            return Err(ConfigError::new(
                None,
                "durable",
                ConfigErrorKind::LeaseNotDurable,
            ));
        }
        if conn.is_cluster() && settings.durable.is_some() {
            return Err(ConfigError::new(
                None,
                "durable",
                ConfigErrorKind::ClusterNotDurable,
            ));
        }
        let mut built = Vec::with_capacity(rules.rules.len());
        for rule in rules.rules.iter() {
            if settings.lease.is_some() && rule.algorithm != AlgorithmKind::Gcra {
                return Err(ConfigError::new(
                    Some(rule.name),
                    "algorithm",
                    ConfigErrorKind::LeaseNeedsGcra,
                ));
            }
            let mut quotas = vec![rule.quota];
            for q in rule.overrides.values() {
                if !quotas.contains(q) {
                    quotas.push(*q);
                }
            }
            let relative = format!("{}:{}:", rule.name, label(rule.algorithm));
            let prefix = format!("{}{relative}", settings.prefix);
            let config = RedisConfig::default()
                .with_prefix(prefix.clone())
                .with_timeout(settings.timeout)
                .with_policy(settings.fail)
                .with_breaker(settings.breaker);
            let mut by_quota = Vec::with_capacity(quotas.len());
            for quota in quotas {
                let spec = Spec {
                    prefix: prefix.clone(),
                    algorithm: rule.algorithm,
                    quota,
                    lease: settings.lease,
                    timeout: settings.timeout,
                    fail: settings.fail,
                    breaker: settings.breaker,
                };
                let limiter = match reusable.iter().find(|l| l.spec == spec) {
                    Some(kept) => Arc::clone(kept),
                    None => {
                        let err = |e| {
                            ConfigError::new(Some(rule.name), "limit", ConfigErrorKind::Quota(e))
                        };
                        let (c, conn) = (config.clone(), conn.clone());
                        let limiter = match (settings.lease, rule.algorithm) {
                            (Some(lease), _) => Limiter::Lease(Box::new(
                                LeasedLimiter::new(conn, quota, c, lease).map_err(err)?,
                            )),
                            (None, AlgorithmKind::Gcra) => {
                                per_call::<Gcra>(conn, quota, c).map_err(err)?
                            }
                            (None, AlgorithmKind::LeakyBucket) => {
                                per_call::<LeakyBucket>(conn, quota, c).map_err(err)?
                            }
                            (None, AlgorithmKind::FixedWindow) => {
                                per_call::<FixedWindow>(conn, quota, c).map_err(err)?
                            }
                            (None, AlgorithmKind::SlidingWindow) => {
                                per_call::<SlidingWindow>(conn, quota, c).map_err(err)?
                            }
                        };
                        let batch = match &limiter {
                            Limiter::PerCall(l) => Some(l.batch_limit()),
                            // The shared bucket's GCRA, as the lease script runs it on the same
                            // key: what a settlement charges.
                            Limiter::Lease(_) => BatchLimit::for_quota::<Gcra>(quota).ok(),
                        }
                        .map(|limit| (limit, relative.clone()));
                        Arc::new(QuotaLimiter {
                            spec,
                            limiter,
                            batch,
                        })
                    }
                };
                by_quota.push((quota, limiter));
            }
            built.push(RuleLimiters { by_quota });
        }
        // One batch per store: its breaker is the store's, over every rule.
        let batch = old
            .filter(|o| o.batch_settings == *settings)
            .map(|o| o.batch.clone())
            .unwrap_or_else(|| {
                let config = RedisConfig::default()
                    .with_prefix(settings.prefix.clone())
                    .with_timeout(settings.timeout)
                    .with_policy(settings.fail)
                    .with_breaker(settings.breaker);
                let batch = RedisBatch::new(conn.clone(), config);
                // On a cluster a request's keys in several slots go as one script per slot; on
                // one node concurrent requests go as one call.
                let batch = if conn.is_cluster() {
                    batch.with_slot_groups()
                } else {
                    batch.with_coalescing()
                };
                match settings.durable {
                    Some(durable) => batch.with_durability(durable),
                    None => batch,
                }
            });
        Ok(RedisStore {
            rules: built.into_boxed_slice(),
            batch,
            batch_settings: settings.clone(),
            fail: settings.fail,
            labels: rules
                .config
                .metric_labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        })
    }

    pub(crate) fn limiter(&self, at: &RuleKey<'_>) -> Option<&QuotaLimiter> {
        self.limiter_for(at.index, &at.quota)
    }

    /// Rule `index`'s limiter for `quota` (its own, or an override's).
    fn limiter_for(&self, index: usize, quota: &Quota) -> Option<&QuotaLimiter> {
        self.rules[index]
            .by_quota
            .iter()
            .find(|(q, _)| q == quota)
            .map(|(_, l)| &**l)
    }

    /// The name of `at`'s key, as its limiter (per-rule scripts, leases) knows it: a key of one
    /// value with no hash tag is that value's text, borrowed (no allocation, which a decision on
    /// the leases would otherwise pay per rule); any other is built as [`key_after`](Self::key_after)
    /// builds it.
    pub(crate) fn key_name<'k>(at: &RuleKey<'k>) -> Cow<'k, str> {
        if at.tag.is_none() && !at.composite {
            return text(at.key);
        }
        Cow::Owned(Self::key_after("", at))
    }

    /// `prefix` then the [key's name](Self::key_name), built in one string (a batch's key names:
    /// the rule's relative prefix, then the key).
    pub(crate) fn key_after(prefix: &str, at: &RuleKey<'_>) -> String {
        let tag_len = at.tag.map_or(0, |tag| 3 + 2 * tag.len());
        let mut out = String::with_capacity(prefix.len() + tag_len + 2 * at.key.len());
        out.push_str(prefix);
        if let Some(tag) = at.tag {
            // Hex: never empty (an empty tag is no tag), never a brace.
            out.push_str("{t");
            push_hex(&mut out, tag.as_bytes());
            out.push('}');
        }
        if at.composite {
            push_hex(&mut out, at.key);
        } else {
            out.push_str(&text(at.key));
        }
        out
    }

    /// The answer when Redis could not decide: counted, then the fault policy's (`None`: the rule
    /// does not apply).
    pub(crate) fn fault(&self, at: &RuleKey<'_>, error: &Error) -> Option<Decision> {
        let cause = match error {
            Error::CircuitOpen => "circuit_open",
            Error::CorruptState { .. } => "corrupt",
            Error::WrongType { .. } | Error::DuplicateKey { .. } | Error::NoCharge => "config",
            Error::NotReplicated { .. } => "not_replicated",
            _ => "outage",
        };
        let answer = match self.fail {
            FaultPolicy::FailOpen => "open",
            FaultPolicy::FailClosed { .. } => "closed",
        };
        let mut labels = vec![
            metrics::Label::new("rule", at.rule),
            metrics::Label::new("cause", cause),
            metrics::Label::new("answer", answer),
        ];
        labels.extend(
            self.labels
                .iter()
                .map(|(k, v)| metrics::Label::new(k.clone(), v.clone())),
        );
        metrics::counter!("tollgate_policy_store_failures_total", labels).increment(1);
        match self.fail {
            FaultPolicy::FailOpen => None,
            closed @ FaultPolicy::FailClosed { .. } => Some(closed.decision()),
        }
    }

    fn settle(
        &self,
        at: &RuleKey<'_>,
        result: Result<Decision, Error>,
    ) -> Result<Option<Decision>, CheckError> {
        match result {
            Ok(decision) => Ok(Some(decision)),
            Err(Error::Cost(error)) => Err(error),
            Err(error) => Ok(self.fault(at, &error)),
        }
    }
}

impl AsyncStore for RedisStore {
    type Receipt = ();

    async fn check(
        &self,
        at: &RuleKey<'_>,
        now: Option<Nanos>,
        cost: u64,
    ) -> Result<Option<(Decision, ())>, CheckError> {
        let Some(limiter) = self.limiter(at) else {
            return Ok(None);
        };
        let result = limiter.check(&Self::key_name(at), now, cost).await;
        self.settle(at, result).map(|d| d.map(|d| (d, ())))
    }

    async fn peek(
        &self,
        at: &RuleKey<'_>,
        now: Option<Nanos>,
        cost: u64,
    ) -> Result<Option<Decision>, CheckError> {
        let Some(limiter) = self.limiter(at) else {
            return Ok(None);
        };
        match limiter.peek(&Self::key_name(at), now, cost).await {
            Some(result) => self.settle(at, result),
            None => Ok(None),
        }
    }

    async fn refund(&self, at: &RuleKey<'_>, now: Option<Nanos>, cost: u64, _: ()) {
        if let Some(limiter) = self.limiter(at) {
            if let Err(error) = limiter.refund(&Self::key_name(at), now, cost).await {
                // The units stay spent: stricter, never looser.
                let _ = self.fault(at, &error);
            }
        }
    }

    fn next_unit(&self, index: usize, quota: &Quota, decision: &Decision) -> Option<Duration> {
        self.limiter_for(index, quota)
            .and_then(|l| l.next_unit(decision))
    }

    fn batches(&self) -> bool {
        self.batch_settings.lease.is_none()
    }

    async fn check_batch(
        &self,
        rules: &[(RuleKey<'_>, bool)],
        now: Option<Nanos>,
        cost: u64,
    ) -> Option<BatchAnswer> {
        self.check_batch_timed(rules, now, cost)
            .await
            .map(|(answer, _)| answer)
    }
}

impl RedisStore {
    /// [`AsyncStore::check_batch`], with the instant the script decided at (`None`: no script
    /// ran). `None` in lease mode (rule by rule, on the leases).
    pub(crate) async fn check_batch_timed(
        &self,
        rules: &[(RuleKey<'_>, bool)],
        now: Option<Nanos>,
        cost: u64,
    ) -> Option<(BatchAnswer, Option<Nanos>)> {
        if self.batch_settings.lease.is_some() {
            return None;
        }
        let batch = &self.batch;
        // A request's few rules: on the stack.
        let mut names: SmallVec<[String; 4]> = SmallVec::with_capacity(rules.len());
        let mut limits: SmallVec<[&BatchLimit; 4]> = SmallVec::with_capacity(rules.len());
        for (at, enforced) in rules {
            let (limit, relative) = self.limiter(at)?.batch.as_ref()?;
            if *enforced && cost > limit.capacity() {
                let error = CheckError::CostExceedsCapacity {
                    cost,
                    capacity: limit.capacity(),
                };
                return Some((Err((limits.len(), error)), None));
            }
            names.push(Self::key_after(relative, at));
            limits.push(limit);
        }
        let keys: SmallVec<[BatchKey<'_>; 4]> = names
            .iter()
            .zip(&limits)
            .zip(rules)
            .map(|((key, limit), (_, enforcing))| BatchKey {
                key,
                limit,
                enforcing: *enforcing,
            })
            .collect();
        let result = match now {
            Some(now) => batch.try_check_timed_at(&keys, now, cost).await,
            None => batch.try_check_timed(&keys, cost).await,
        };
        Some(match result {
            Ok((decisions, at)) => (Ok(decisions.into_iter().map(Some).collect()), at),
            Err(Error::Cost(error)) => (Err((0, error)), None),
            // Every rule answers by the fault policy, each counted.
            Err(error) => (
                Ok(rules.iter().map(|(at, _)| self.fault(at, &error)).collect()),
                None,
            ),
        })
    }
}
