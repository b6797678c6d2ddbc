//! [`RedisPolicy`]: the same rules and the same decision as [`Policy`](crate::Policy), with every
//! rule's state in a shared Redis, so that every process pointing at it shares each rule's quota.
//!
//! Each rule (and each of its override quotas) decides through a tollgate-redis limiter of its
//! algorithm: a `RedisLimiter` (one atomic script per decision, exact) per request, or a
//! `LeasedLimiter` (local leases of a shared GCRA bucket) in lease mode.
//!
//! See [`RedisPolicy`] for the semantics across rules, the key layout and failures.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tollgate_core::{
    CheckError, Decision, FixedWindow, Gcra, LeakyBucket, Nanos, Quota, SlidingWindow,
};
use tollgate_redis::{
    BatchKey, BatchLimit, BreakerConfig, Connection, Durability, Error, FaultPolicy, LeaseConfig,
    LeasedLimiter, RedisBatch, RedisConfig, RedisLimiter,
};

use crate::config::{AlgorithmKind, PolicyConfig};
use crate::config_error::{ConfigError, ConfigErrorKind};
use crate::decision::{Descriptors, PolicyDecision, PolicyError};
use crate::engine::{self, Decided};
use crate::rules::RuleSet;
use crate::stats::PolicySnapshot;
use crate::store::{AsyncStore, BatchAnswer, RuleKey, next_unit};
use crate::sync::{AtomicBool, Ordering};

/// How a [`RedisPolicy`] keeps its rules' state in Redis.
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
    Gcra(RedisLimiter<Gcra, Connection>),
    Leaky(RedisLimiter<LeakyBucket, Connection>),
    Fixed(RedisLimiter<FixedWindow, Connection>),
    Sliding(RedisLimiter<SlidingWindow, Connection>),
    /// Boxed: a leased limiter carries its key table's shards inline.
    Lease(Box<LeasedLimiter<Connection>>),
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
            (Limiter::Gcra(l), None) => l.try_check(key, cost).await,
            (Limiter::Gcra(l), Some(now)) => l.try_check_at(key, now, cost).await,
            (Limiter::Leaky(l), None) => l.try_check(key, cost).await,
            (Limiter::Leaky(l), Some(now)) => l.try_check_at(key, now, cost).await,
            (Limiter::Fixed(l), None) => l.try_check(key, cost).await,
            (Limiter::Fixed(l), Some(now)) => l.try_check_at(key, now, cost).await,
            (Limiter::Sliding(l), None) => l.try_check(key, cost).await,
            (Limiter::Sliding(l), Some(now)) => l.try_check_at(key, now, cost).await,
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
        Some(match (&self.limiter, now) {
            (Limiter::Gcra(l), None) => l.try_peek(key, cost).await,
            (Limiter::Gcra(l), Some(now)) => l.try_peek_at(key, now, cost).await,
            (Limiter::Leaky(l), None) => l.try_peek(key, cost).await,
            (Limiter::Leaky(l), Some(now)) => l.try_peek_at(key, now, cost).await,
            (Limiter::Fixed(l), None) => l.try_peek(key, cost).await,
            (Limiter::Fixed(l), Some(now)) => l.try_peek_at(key, now, cost).await,
            (Limiter::Sliding(l), None) => l.try_peek(key, cost).await,
            (Limiter::Sliding(l), Some(now)) => l.try_peek_at(key, now, cost).await,
            (Limiter::Lease(_), _) => return None,
        })
    }

    async fn refund(&self, key: &str, now: Option<Nanos>, cost: u64) -> Result<(), Error> {
        match (&self.limiter, now) {
            (Limiter::Gcra(l), None) => l.try_refund(key, cost).await,
            (Limiter::Gcra(l), Some(now)) => l.try_refund_at(key, now, cost).await,
            (Limiter::Leaky(l), None) => l.try_refund(key, cost).await,
            (Limiter::Leaky(l), Some(now)) => l.try_refund_at(key, now, cost).await,
            (Limiter::Fixed(l), None) => l.try_refund(key, cost).await,
            (Limiter::Fixed(l), Some(now)) => l.try_refund_at(key, now, cost).await,
            (Limiter::Sliding(l), None) => l.try_refund(key, cost).await,
            (Limiter::Sliding(l), Some(now)) => l.try_refund_at(key, now, cost).await,
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
        match self.limiter {
            Limiter::Sliding(_) => match *decision {
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

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    out
}

impl RedisStore {
    /// Builds the limiters of `rules` on `conn`, reusing `old`'s where nothing they are built from
    /// changed.
    fn build(
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
                                Limiter::Gcra(RedisLimiter::new(conn, quota, c).map_err(err)?)
                            }
                            (None, AlgorithmKind::LeakyBucket) => {
                                Limiter::Leaky(RedisLimiter::new(conn, quota, c).map_err(err)?)
                            }
                            (None, AlgorithmKind::FixedWindow) => {
                                Limiter::Fixed(RedisLimiter::new(conn, quota, c).map_err(err)?)
                            }
                            (None, AlgorithmKind::SlidingWindow) => {
                                Limiter::Sliding(RedisLimiter::new(conn, quota, c).map_err(err)?)
                            }
                        };
                        let batch = match &limiter {
                            Limiter::Gcra(l) => Some(l.batch_limit()),
                            Limiter::Leaky(l) => Some(l.batch_limit()),
                            Limiter::Fixed(l) => Some(l.batch_limit()),
                            Limiter::Sliding(l) => Some(l.batch_limit()),
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
                // On a cluster a request's keys in several slots go as one script per slot.
                let batch = if conn.is_cluster() {
                    batch.with_slot_groups()
                } else {
                    batch
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
        self.rules[at.index]
            .by_quota
            .iter()
            .find(|(q, _)| *q == at.quota)
            .map(|(_, l)| &**l)
    }

    pub(crate) fn key(at: &RuleKey<'_>) -> String {
        let key = if at.composite {
            hex(at.key)
        } else {
            String::from_utf8_lossy(at.key).into_owned()
        };
        match at.tag {
            // Hex: never empty (an empty tag is no tag), never a brace.
            Some(tag) => format!("{{t{}}}{key}", hex(tag.as_bytes())),
            None => key,
        }
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
        let result = limiter.check(&Self::key(at), now, cost).await;
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
        match limiter.peek(&Self::key(at), now, cost).await {
            Some(result) => self.settle(at, result),
            None => Ok(None),
        }
    }

    async fn refund(&self, at: &RuleKey<'_>, now: Option<Nanos>, cost: u64, _: ()) {
        if let Some(limiter) = self.limiter(at) {
            if let Err(error) = limiter.refund(&Self::key(at), now, cost).await {
                // The units stay spent: stricter, never looser.
                let _ = self.fault(at, &error);
            }
        }
    }

    fn next_unit(&self, at: &RuleKey<'_>, decision: &Decision) -> Option<Duration> {
        self.limiter(at).and_then(|l| l.next_unit(decision))
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
        let mut names = Vec::with_capacity(rules.len());
        let mut limits = Vec::with_capacity(rules.len());
        for (at, enforced) in rules {
            let (limit, relative) = self.limiter(at)?.batch.as_ref()?;
            if *enforced && cost > limit.capacity() {
                let error = CheckError::CostExceedsCapacity {
                    cost,
                    capacity: limit.capacity(),
                };
                return Some((Err((limits.len(), error)), None));
            }
            names.push(format!("{relative}{}", Self::key(at)));
            limits.push(limit);
        }
        let keys: Vec<BatchKey<'_>> = names
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

/// Points `rules` at `settings`' hash tag descriptor.
fn tag_rules(rules: &mut RuleSet, settings: &RedisSettings) {
    if let Some(name) = &settings.hash_tag {
        rules.set_hash_tag(name);
    }
}

/// A rule set with its Redis state: what decisions load.
pub(crate) struct RedisLive {
    pub(crate) rules: RuleSet,
    pub(crate) store: RedisStore,
}

/// A policy whose rules keep their state in Redis: [`Policy`](crate::Policy)'s rules, config and
/// semantics (atomic over a request's rules, shadow, metrics, reload), shared by every process that
/// points at the same Redis and prefix.
///
/// # Several rules in one request
/// As in process: the request is admitted only if every enforcing rule admits, and a denied
/// request consumes nothing anywhere.
/// * **Per request** (no lease): every rule of the request in **one script call** (tollgate-redis's
///   `RedisBatch`): all checked at one instant, every admission written only when every enforcing
///   rule admits. Atomic and exact, one round trip, whatever the number of rules.
/// * **Lease mode**: rule by rule, each on its local lease (a round trip only when a lease runs
///   out); on a denial every rule that admitted gets its units back into its lease.
/// * **A group** ([`check_all`](Self::check_all)): each request of the group as above, in order;
///   when one is refused, what the others admitted is given back by refund scripts. Between an
///   admission and its refund another caller can see those units spent: it is refused a little
///   early, never admitted beyond the quota. A refund Redis cannot take (an outage) leaves the
///   units spent: stricter, never looser.
///
/// # Costs known only after the response
/// [`reserve`](Self::reserve) an estimate (one round trip per request mode), then
/// [`settle`](Self::settle) the actual cost (one round trip for all of the request's rules: the
/// surplus given back, an overdraft charged into debt); a dropped reservation stays at its
/// estimate. See [`RedisReservation`](crate::RedisReservation).
///
/// # Keys
/// A rule's key `k` lives at `<prefix><rule>:<algorithm>:<k>`: `k` is the descriptor's value for a
/// rule keyed by one descriptor, the hex of the length-prefixed encoding for several, empty for a
/// global rule; `<algorithm>` is `gcra`, `leaky_bucket`, `fixed_window` or `sliding_window` (GCRA
/// and the lease mode share it). With [`RedisSettings::hash_tag`], a rule keyed by that descriptor
/// stores `{t<hex of its value>}k` instead, so that all such keys of a request share one Redis
/// Cluster slot. Every quota of a rule (its own, its overrides', before and after a
/// reload) uses the same key: see [`reload`](Self::reload) for how a state crosses a quota change.
/// (Versions before quota tags put the window length in the windows' label, `fixed_window@60000ms`:
/// their window keys start fresh once after the upgrade.)
///
/// # When Redis cannot answer
/// Each limiter sits behind tollgate-redis's circuit breaker. [`RedisSettings::fail`] gives the
/// answer: `FailClosed` denies with its `retry_after`; `FailOpen` treats the rule as not applying to
/// the request. Every such answer is counted in
/// `tollgate_policy_store_failures_total{rule,cause,answer}` (plus the config's `metric_labels`;
/// `cause`: `outage`, `circuit_open`, `corrupt`, `config`, `not_replicated`).
///
/// # Durable admissions
/// With [`RedisSettings::durable`] (per request mode), a request whose script admitted it is
/// answered only once the replicas asked for confirm the admission (`WAIT`, one more round trip).
/// When fewer confirm within the timeout, the request is answered by [`RedisSettings::fail`]
/// (closed: denied, its units staying spent on the primary; open: admitted with no rule deciding),
/// counted with `cause="not_replicated"`. A denied request waits for nothing. So an admission a
/// client was told about survives the primary's loss when a confirming replica is promoted (see
/// tollgate-redis's `Durability` for what `WAIT` does not cover).
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tollgate_policy::{PolicyConfig, RedisPolicy, RedisSettings};
/// let config = PolicyConfig::from_toml(r#"
///     [[rules]]
///     name = "per_user"
///     match = { user = "any" }
///     key = ["user"]
///     limit = 100
///     period = "1m"
/// "#)?;
/// let conn = tollgate_redis::connect("redis://127.0.0.1/", &Default::default())?;
/// let policy = RedisPolicy::new(config, conn, RedisSettings::default())?;
/// let (decided, _next) = policy.check(&[("user", "alice")], 1).await?;
/// assert!(decided.is_allowed());
/// # Ok(()) }
/// ```
pub struct RedisPolicy {
    pub(crate) current: ArcSwap<RedisLive>,
    conn: Connection,
    settings: RedisSettings,
    pub(crate) dry_run: AtomicBool,
    reloads: Mutex<()>,
}

impl std::fmt::Debug for RedisPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisPolicy")
            .field("rules", &self.rules())
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl RedisPolicy {
    /// Builds the policy on `conn`: one node ([`tollgate_redis::connect`]) or a Redis Cluster
    /// ([`tollgate_redis::connect_cluster`]), where a request whose keys lie in several slots is one
    /// script per slot group with compensating refunds (see `RedisBatch::with_slot_groups`; a
    /// [`RedisSettings::hash_tag`] keeps a request's tenant-keyed rules in one slot). Keyed rules
    /// need no `capacity` here (their state is in Redis).
    ///
    /// # Errors
    /// A [`ConfigError`] naming the rule and field.
    pub fn new(
        config: PolicyConfig,
        conn: impl Into<Connection>,
        settings: RedisSettings,
    ) -> Result<Self, ConfigError> {
        let conn = conn.into();
        let validated = config.validate_shared()?;
        let mut rules = RuleSet::compile(config, &validated, None)?;
        tag_rules(&mut rules, &settings);
        let store = RedisStore::build(&rules, &settings, &conn, None)?;
        Ok(RedisPolicy {
            current: ArcSwap::from_pointee(RedisLive { rules, store }),
            conn,
            settings,
            dry_run: AtomicBool::new(false),
            reloads: Mutex::new(()),
        })
    }

    /// A policy for `config` that carries `previous`'s in-process parts over (each rule's counters
    /// where its name and identity stay; each Redis limiter, with its breaker and live leases, where
    /// it is built alike) while `previous` goes on deciding unchanged until the caller swaps them:
    /// for a caller that replaces several policies as one (tollgate-server's domains).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn succeed(
        previous: &RedisPolicy,
        config: PolicyConfig,
        conn: impl Into<Connection>,
        settings: RedisSettings,
    ) -> Result<Self, ConfigError> {
        let conn = conn.into();
        let validated = config.validate_shared()?;
        let old = previous.current.load_full();
        let mut rules = RuleSet::compile(config, &validated, Some(&old.rules))?;
        tag_rules(&mut rules, &settings);
        let store = RedisStore::build(&rules, &settings, &conn, Some(&old.store))?;
        Ok(RedisPolicy {
            current: ArcSwap::from_pointee(RedisLive { rules, store }),
            conn,
            settings,
            // Relaxed: a switch; see `set_dry_run`.
            dry_run: AtomicBool::new(previous.dry_run.load(Ordering::Relaxed)),
            reloads: Mutex::new(()),
        })
    }

    /// Decides a request of `cost` units with these descriptors: the same decision as
    /// [`Policy::check_next_at`](crate::Policy::check_next_at), on Redis's clock, with the
    /// `RateLimit` field's `t` worked out from the deciding admission (no extra round trip).
    ///
    /// # Errors
    /// [`PolicyError::CostExceedsCapacity`] when an enforcing rule can never admit `cost`; what
    /// other rules admitted is given back.
    pub async fn check(
        &self,
        descriptors: &Descriptors<'_>,
        cost: u64,
    ) -> Result<(PolicyDecision, Option<Duration>), PolicyError> {
        self.decide(descriptors, None, cost).await
    }

    /// [`check`](Self::check) at an explicit time instead of Redis's clock (nanoseconds since the
    /// Unix epoch, sent to the scripts in microseconds), for simulation and tests.
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub async fn check_at(
        &self,
        descriptors: &Descriptors<'_>,
        now: Nanos,
        cost: u64,
    ) -> Result<(PolicyDecision, Option<Duration>), PolicyError> {
        self.decide(descriptors, Some(now), cost).await
    }

    /// Decides several requests as one, as [`Policy::check_all_at`](crate::Policy::check_all_at)
    /// does: when any is denied or cannot be decided, what the others admitted is given back.
    pub async fn check_all(
        &self,
        requests: &[(&Descriptors<'_>, u64)],
    ) -> Vec<Result<(PolicyDecision, Option<Duration>), PolicyError>> {
        self.decide_all(requests, None).await
    }

    /// [`check_all`](Self::check_all) at an explicit time, for simulation and tests.
    pub async fn check_all_at(
        &self,
        requests: &[(&Descriptors<'_>, u64)],
        now: Nanos,
    ) -> Vec<Result<(PolicyDecision, Option<Duration>), PolicyError>> {
        self.decide_all(requests, Some(now)).await
    }

    async fn decide_all(
        &self,
        requests: &[(&Descriptors<'_>, u64)],
        now: Option<Nanos>,
    ) -> Vec<Result<Decided, PolicyError>> {
        let live = self.current.load_full();
        // Relaxed: a switch read by each decision; it publishes no other data.
        let dry = live.rules.dry_run || self.dry_run.load(Ordering::Relaxed);
        engine::decide_all_async(&live.rules, &live.store, requests, dry, now).await
    }

    async fn decide(
        &self,
        descriptors: &Descriptors<'_>,
        now: Option<Nanos>,
        cost: u64,
    ) -> Result<Decided, PolicyError> {
        let live = self.current.load_full();
        // Relaxed: a switch read by each decision; it publishes no other data.
        let dry = live.rules.dry_run || self.dry_run.load(Ordering::Relaxed);
        engine::decide_async(&live.rules, &live.store, descriptors, dry, now, cost).await
    }

    /// Replaces the rules with `config`'s: nothing changes unless the whole config is valid. A rule
    /// that stays keeps its counters; a limiter whose prefix, algorithm, quota and settings stay
    /// is kept (its breaker, its live leases); the state in Redis stays where its key stays.
    ///
    /// **A changed quota carries each key's state over as-is in units**, as
    /// [`Policy::reload`](crate::Policy::reload) does (a rule's limit, burst or window, an override
    /// added, changed or removed; every algorithm; per request and lease mode): each stored state
    /// names the quota it was written under, and the first script that touches the key under
    /// another quota converts it with the core's
    /// [`Algorithm::carry_over`](tollgate_core::Algorithm::carry_over) at that instant and stores
    /// the result (even when it denies). The key keeps `min(what it could take under its old quota
    /// then, the new capacity)`: a key that just spent its burst gets nothing back whichever way the
    /// quota changed. One difference from the in-process reload: the conversion happens at the
    /// key's first call after the reload, not at the reload instant, so a key idle across the
    /// reload refills under its old quota until then (it never holds more than the old quota would
    /// have given it, nor more than the new capacity). Replicas reloaded at different times convert
    /// back and forth as-is; each conversion only keeps or drops units. A changed algorithm is a
    /// new key (fresh), as in process.
    ///
    /// # Errors
    /// As [`new`](Self::new); the old rules stay in force.
    pub fn reload(&self, config: PolicyConfig) -> Result<(), ConfigError> {
        let _serial = self
            .reloads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let validated = config.validate_shared()?;
        let old = self.current.load_full();
        let mut rules = RuleSet::compile(config, &validated, Some(&old.rules))?;
        tag_rules(&mut rules, &self.settings);
        let store = RedisStore::build(&rules, &self.settings, &self.conn, Some(&old.store))?;
        self.current.store(Arc::new(RedisLive { rules, store }));
        Ok(())
    }

    /// Turns every rule into a shadow rule while `on` (on top of the config's `dry_run`).
    pub fn set_dry_run(&self, on: bool) {
        // Relaxed: a switch read by each decision; it publishes no other data.
        self.dry_run.store(on, Ordering::Relaxed);
    }

    /// The configuration in force.
    pub fn config(&self) -> PolicyConfig {
        self.current.load().rules.config.clone()
    }

    /// The rule names, in evaluation order.
    pub fn rules(&self) -> Vec<&'static str> {
        self.current.load().rules.names()
    }

    /// Every rule's counters (what this process decided).
    pub fn snapshot(&self) -> PolicySnapshot {
        self.current.load().rules.snapshot(|_| 0)
    }
}
