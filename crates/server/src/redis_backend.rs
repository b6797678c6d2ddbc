//! The Redis backend: a domain whose rules keep their state in a shared Redis, so that every
//! replica pointing at it shares each rule's quota.
//!
//! The domain's [`Policy`] still does the matching and key building
//! ([`Policy::applicable`]); each rule's state lives in a tollgate-redis limiter built from that
//! rule's algorithm and quota (one per override quota too): a [`RedisLimiter`] (one atomic script
//! call per decision) in `per_request` mode, a [`LeasedLimiter`] (local leases of a shared GCRA
//! bucket) in `lease` mode.
//!
//! # Keys
//! A rule's key `k` lives at `<prefix><domain>:<rule>:<algorithm>:<k>`: `k` is the descriptor's
//! value for a rule keyed by one descriptor, the hex of the policy's length-prefixed encoding for
//! several, empty for a global rule. The window algorithms' label carries the window length
//! (`fixed_window@60000ms`), so a reload that changes the window starts those keys fresh (as the
//! embedded backend does), while a changed limit or burst reads the existing state under the new
//! quota (no fresh burst). GCRA and the lease mode share a label: switching the mode keeps the
//! buckets. Every script touches exactly one key, so no hash tag is needed for Redis Cluster (and
//! none is added: a per-rule tag would put all of a rule's keys on one node).
//!
//! # Several rules in one request (not atomic across rules)
//! The embedded backend decides all rules of a descriptor as one and gives back what earlier rules
//! admitted when a later one denies. Redis has no refund script here, so a Redis domain decides
//! a descriptor's rules **in config order, one call each, and stops at the first enforcing rule
//! that denies**: the rules after it are not consulted (nothing consumed there), but **the
//! admissions of the rules before it are kept** (each of those rules may count a request that was
//! denied overall). Put the rule most likely to deny first. Each rule alone keeps its own bound
//! (exact in `per_request` mode, the lease bound in `lease` mode).
//!
//! Each rule's decisions are counted in the policy's own per-rule counters
//! (`tollgate_policy_decisions_total{rule,outcome,domain}`, [`Policy::snapshot`]) through
//! [`Policy::count`], as on the embedded backend; per replica (each counts what it decided).
//!
//! # When Redis cannot answer
//! Each limiter sits behind tollgate-redis's circuit breaker (after `breaker.failures` consecutive
//! outage failures, calls are answered at once without touching the network; one probe per
//! `breaker.probe_interval`). The domain's `fail` policy gives the answer: `closed` denies with
//! `fail_retry_after`, `open` treats the rule as not applying. Every such answer is counted in
//! `tollgate_server_backend_failures_total{domain,rule,cause,answer}` (`cause`: `outage`,
//! `circuit_open`, `corrupt`, `config`); the breaker's state is tollgate-redis's
//! `tollgate_redis_breaker_open{prefix}` gauge (the prefix names domain and rule; a rule's
//! override quotas have limiters, and breakers, of their own under the same prefix, and the gauge
//! counts how many of them are open). Live leases are still spent locally during an outage.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate_core::{Decision, FixedWindow, Gcra, LeakyBucket, Quota, SlidingWindow};
use tollgate_policy::{
    AlgorithmKind, Applicable, Descriptors, Policy, PolicyConfig, PolicyDecision, PolicyError,
};
use tollgate_redis::{
    BreakerConfig, ConnectionManager, Error, FaultPolicy, LeaseConfig, LeasedLimiter, RedisConfig,
    RedisLimiter,
};

use crate::config::{Backend, FailMode, LeaseSettings, RedisBackend, RedisMode, ServerConfig};

/// Connections by (URL, timeout), shared by every domain and kept across reloads (so a reload that
/// keeps the URL keeps the connection; a changed URL gets a new one). After a reload, those no
/// domain uses any more are let go ([`retain_used`](Self::retain_used)): the connection closes
/// when the old domains' limiters holding it are dropped too. Each is one multiplexed redis-rs
/// connection (pipelined commands from every task), lazily reconnecting.
#[derive(Default)]
pub struct Connections {
    open: Mutex<HashMap<(String, Duration), ConnectionManager>>,
}

impl Connections {
    fn get(&self, url: &str, config: &RedisConfig) -> Result<ConnectionManager, String> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let key = (url.to_owned(), config.timeout());
        if let Some(conn) = open.get(&key) {
            return Ok(conn.clone());
        }
        let conn = tollgate_redis::connect(url, config)
            .map_err(|e| format!("backend.redis.url `{url}`: {e}"))?;
        open.insert(key, conn.clone());
        Ok(conn)
    }

    /// Keeps only the connections some Redis domain of `config` uses.
    pub fn retain_used(&self, config: &ServerConfig) {
        let used: HashSet<(&str, Duration)> = config
            .domains
            .iter()
            .filter_map(|d| match &d.backend {
                Backend::Redis(settings) => Some((settings.url.as_str(), settings.timeout)),
                Backend::Embedded => None,
            })
            .collect();
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(url, timeout), _| used.contains(&(url.as_str(), *timeout)));
    }

    /// How many connections are kept.
    pub fn len(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A rule's Redis limiter, of its algorithm and mode.
enum Store {
    Gcra(RedisLimiter<Gcra>),
    Leaky(RedisLimiter<LeakyBucket>),
    Fixed(RedisLimiter<FixedWindow>),
    Sliding(RedisLimiter<SlidingWindow>),
    /// Boxed: a leased limiter carries its key table's shards inline.
    Lease(Box<LeasedLimiter>),
}

/// Everything a rule limiter is built from: equal specs reuse the limiter across reloads (a lease
/// mode limiter keeps its live leases, every limiter its breaker).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Spec {
    url: String,
    prefix: String,
    algorithm: AlgorithmKind,
    quota: Quota,
    mode: RedisMode,
    lease: Option<LeaseSettings>,
    timeout: Duration,
    failures: u32,
    probe: Duration,
}

/// One rule-and-quota's limiter.
pub struct RuleStore {
    store: Store,
    spec: Spec,
}

impl RuleStore {
    async fn try_check(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        match &self.store {
            Store::Gcra(l) => l.try_check(key, cost).await,
            Store::Leaky(l) => l.try_check(key, cost).await,
            Store::Fixed(l) => l.try_check(key, cost).await,
            Store::Sliding(l) => l.try_check(key, cost).await,
            Store::Lease(l) => l.try_check(key, cost).await,
        }
    }

    /// The wait until more than `remaining` units pass, from an admission alone (no round trip):
    /// exact for the buckets (`reset_after − (burst − remaining − 1) × T`), the window's end for
    /// the windows (exact for the fixed window, an upper bound for the sliding one), unknown in
    /// lease mode (`remaining` is this replica's lease).
    fn next_unit(&self, decision: &Decision) -> Option<Duration> {
        let Decision::Allowed {
            remaining,
            reset_after,
        } = *decision
        else {
            return None;
        };
        let quota = &self.spec.quota;
        match self.store {
            Store::Lease(_) => None,
            Store::Gcra(_) | Store::Leaky(_) => {
                let burst = quota.burst();
                if remaining >= burst {
                    return None;
                }
                let later =
                    u128::from(burst - remaining - 1) * u128::from(quota.emission_interval_nanos());
                let wait = reset_after.as_nanos().saturating_sub(later);
                Some(Duration::from_nanos(
                    u64::try_from(wait).unwrap_or(u64::MAX),
                ))
            }
            Store::Fixed(_) | Store::Sliding(_) => {
                (remaining < quota.limit()).then_some(reset_after)
            }
        }
    }
}

/// A rule's limiters: its own quota's and one per override quota.
struct RuleEntry {
    /// Key descriptors > 1: the key bytes are length-prefixed (binary), sent as hex.
    hex_key: bool,
    by_quota: Vec<(Quota, Arc<RuleStore>)>,
}

/// A Redis domain's rules.
pub struct RedisRules {
    domain: String,
    fail: FaultPolicy,
    rules: HashMap<String, RuleEntry>,
}

/// One descriptor's outcome on Redis: the policy-shaped decision and the `t` hint for its fields.
pub(crate) struct RedisOutcome {
    pub(crate) result: Result<PolicyDecision, PolicyError>,
    pub(crate) next_unit: Option<Duration>,
}

fn label(algorithm: AlgorithmKind, quota: &Quota) -> String {
    match algorithm {
        AlgorithmKind::Gcra => "gcra".to_owned(),
        AlgorithmKind::LeakyBucket => "leaky_bucket".to_owned(),
        AlgorithmKind::FixedWindow => format!("fixed_window@{}ms", quota.period().as_millis()),
        AlgorithmKind::SlidingWindow => {
            format!("sliding_window@{}ms", quota.period().as_millis())
        }
    }
}

impl RedisRules {
    /// Builds the limiters of `policy`'s rules on `settings`, reusing `old`'s where nothing they
    /// are built from changed.
    ///
    /// # Errors
    /// A malformed URL, or a quota the Redis scripts cannot follow, naming the rule.
    pub fn build(
        domain: &str,
        settings: &RedisBackend,
        policy: &PolicyConfig,
        connections: &Connections,
        old: Option<&RedisRules>,
    ) -> Result<Self, String> {
        let validated = policy.validate().map_err(|e| e.to_string())?;
        let fail = match settings.fail {
            FailMode::Open => FaultPolicy::FailOpen,
            FailMode::Closed => FaultPolicy::FailClosed {
                retry_after: settings.fail_retry_after,
            },
        };
        let breaker = BreakerConfig {
            failures: settings.breaker.failures,
            probe_interval: settings.breaker.probe_interval,
        };
        let old_stores: HashMap<&Spec, &Arc<RuleStore>> = old
            .into_iter()
            .flat_map(|o| o.rules.values())
            .flat_map(|e| e.by_quota.iter().map(|(_, s)| (&s.spec, s)))
            .collect();
        let mut rules = HashMap::new();
        for (rc, (algorithm, quota, overrides)) in policy.rules.iter().zip(validated.rules()) {
            let mut quotas = vec![quota];
            for (_, q) in overrides {
                if !quotas.contains(q) {
                    quotas.push(*q);
                }
            }
            let prefix = format!(
                "{}{domain}:{}:{}:",
                settings.prefix,
                rc.name,
                label(algorithm, &quota)
            );
            let config = RedisConfig::default()
                .with_prefix(prefix.clone())
                .with_timeout(settings.timeout)
                .with_policy(fail)
                .with_breaker(breaker);
            let mut by_quota = Vec::with_capacity(quotas.len());
            for q in quotas {
                let spec = Spec {
                    url: settings.url.clone(),
                    prefix: prefix.clone(),
                    algorithm,
                    quota: q,
                    mode: settings.mode,
                    lease: settings.lease,
                    timeout: settings.timeout,
                    failures: breaker.failures,
                    probe: breaker.probe_interval,
                };
                let store = match old_stores.get(&spec) {
                    Some(store) => Arc::clone(store),
                    None => {
                        let conn = connections.get(&settings.url, &config)?;
                        let err = |e| format!("rule `{}`: quota not usable on redis: {e}", rc.name);
                        let c = config.clone();
                        let store = match (settings.mode, algorithm) {
                            (RedisMode::Lease, _) => {
                                let l = settings.lease.unwrap_or_default();
                                let lease = LeaseConfig {
                                    size: l.size,
                                    ttl: l.ttl,
                                    min_grant: l.min_grant,
                                    max_keys: l.max_keys,
                                };
                                Store::Lease(Box::new(
                                    LeasedLimiter::new(conn, q, c, lease).map_err(err)?,
                                ))
                            }
                            (_, AlgorithmKind::Gcra) => {
                                Store::Gcra(RedisLimiter::new(conn, q, c).map_err(err)?)
                            }
                            (_, AlgorithmKind::LeakyBucket) => {
                                Store::Leaky(RedisLimiter::new(conn, q, c).map_err(err)?)
                            }
                            (_, AlgorithmKind::FixedWindow) => {
                                Store::Fixed(RedisLimiter::new(conn, q, c).map_err(err)?)
                            }
                            (_, AlgorithmKind::SlidingWindow) => {
                                Store::Sliding(RedisLimiter::new(conn, q, c).map_err(err)?)
                            }
                        };
                        Arc::new(RuleStore { store, spec })
                    }
                };
                by_quota.push((q, store));
            }
            rules.insert(
                rc.name.clone(),
                RuleEntry {
                    hex_key: rc.key.len() > 1,
                    by_quota,
                },
            );
        }
        Ok(RedisRules {
            domain: domain.to_owned(),
            fail,
            rules,
        })
    }

    /// Decides one descriptor of `cost` units: its applicable rules in order, stopping at the first
    /// enforcing denial (see the [module docs](self) for what holds across rules).
    pub(crate) async fn decide(
        &self,
        policy: &Policy,
        descriptors: &Descriptors<'_>,
        cost: u64,
    ) -> RedisOutcome {
        let mut applicable: Vec<Applicable> = Vec::new();
        policy.applicable(descriptors, &mut applicable);
        let mut tightest: Option<(&Applicable, Decision, Option<Duration>)> = None;
        let mut shadow_denied = false;
        for rule in &applicable {
            let Some(entry) = self.rules.get(rule.rule) else {
                continue; // not possible: the policy and these rules come from one config
            };
            let Some((_, store)) = entry.by_quota.iter().find(|(q, _)| *q == rule.quota) else {
                continue;
            };
            let key = if entry.hex_key {
                hex(&rule.key)
            } else {
                String::from_utf8_lossy(&rule.key).into_owned()
            };
            let decision = match store.try_check(&key, cost).await {
                Ok(decision) => decision,
                Err(Error::Cost(e)) => {
                    if !rule.enforced {
                        policy.count(rule.rule, false, &Decision::denied(u64::MAX, u64::MAX));
                        shadow_denied = true;
                        continue;
                    }
                    let capacity = match e {
                        tollgate_core::CheckError::CostExceedsCapacity { capacity, .. } => capacity,
                        _ => 0,
                    };
                    return RedisOutcome {
                        result: Err(PolicyError::CostExceedsCapacity {
                            rule: rule.rule,
                            cost,
                            capacity,
                        }),
                        next_unit: None,
                    };
                }
                Err(e) => {
                    let cause = match e {
                        Error::CircuitOpen => "circuit_open",
                        Error::CorruptState { .. } => "corrupt",
                        Error::WrongType { .. } => "config",
                        _ => "outage",
                    };
                    let answer = match self.fail {
                        FaultPolicy::FailOpen => "open",
                        FaultPolicy::FailClosed { .. } => "closed",
                    };
                    metrics::counter!(
                        "tollgate_server_backend_failures_total",
                        "domain" => self.domain.clone(),
                        "rule" => rule.rule,
                        "cause" => cause,
                        "answer" => answer
                    )
                    .increment(1);
                    tracing::debug!(domain = %self.domain, rule = rule.rule, error = %e, answer, "redis could not decide");
                    match self.fail {
                        // Fail open: the rule does not apply to this request.
                        FaultPolicy::FailOpen => continue,
                        closed @ FaultPolicy::FailClosed { .. } => closed.decision(),
                    }
                }
            };
            policy.count(rule.rule, rule.enforced, &decision);
            if !rule.enforced {
                shadow_denied |= !decision.is_allowed();
                continue;
            }
            if !decision.is_allowed() {
                // First enforcing denial: later rules are not consulted; earlier admissions stay.
                return RedisOutcome {
                    result: Ok(PolicyDecision {
                        decision,
                        rule: Some(rule.rule),
                        quota: Some(rule.quota),
                        delay: Duration::ZERO,
                        shadow_denied,
                    }),
                    next_unit: None,
                };
            }
            let tighter = tightest.is_none_or(|(_, best, _)| {
                (
                    decision.remaining(),
                    std::cmp::Reverse(decision.reset_after()),
                ) < (best.remaining(), std::cmp::Reverse(best.reset_after()))
            });
            if tighter {
                tightest = Some((rule, decision, store.next_unit(&decision)));
            }
        }
        let result = match tightest {
            Some((rule, decision, next)) => {
                return RedisOutcome {
                    result: Ok(PolicyDecision {
                        decision,
                        rule: Some(rule.rule),
                        quota: Some(rule.quota),
                        delay: Duration::ZERO,
                        shadow_denied,
                    }),
                    next_unit: next,
                };
            }
            None => PolicyDecision {
                decision: Decision::Allowed {
                    remaining: u64::MAX,
                    reset_after: Duration::ZERO,
                },
                rule: None,
                quota: None,
                delay: Duration::ZERO,
                shadow_denied,
            },
        };
        RedisOutcome {
            result: Ok(result),
            next_unit: None,
        }
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
