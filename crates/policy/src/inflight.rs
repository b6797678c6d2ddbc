//! Concurrency (in-flight) rules: the policy's `[[concurrency]]` section, compiled beside the rate
//! rules, and [`Policy::admit`], which decides a request against both as one and returns the
//! permits it holds.
//!
//! A rate rule bounds requests per unit of time; a concurrency rule bounds requests *at once*:
//! each admitted request holds a permit per applicable concurrency rule until the [`Admission`] is
//! dropped (the response finished, the request was cancelled, its task panicked).
//!
//! ```
//! use tollgate_core::ManualClock;
//! use tollgate_policy::{Policy, PolicyConfig};
//!
//! let config = PolicyConfig::from_toml(r#"
//!     [[rules]]
//!     name = "per_client_rate"
//!     match = { client = "any" }
//!     key = ["client"]
//!     limit = 100
//!     period = "1s"
//!     capacity = 10000
//!
//!     [[concurrency]]
//!     name = "per_client_in_flight"
//!     match = { client = "any" }
//!     key = ["client"]
//!     limit = 2            # at most 2 requests of one client at once
//!     max_hold = "30s"     # a permit not given back is reclaimed after 30 to 60 s
//!     capacity = 10000
//! "#)?;
//! let policy = Policy::with_clock(config, ManualClock::new())?;
//! let request = [("client", "alice")];
//! let first = policy.admit(&request, 1)?;
//! let second = policy.admit(&request, 1)?;
//! assert!(first.is_allowed() && second.is_allowed());
//! let third = policy.admit(&request, 1)?;
//! assert!(!third.is_allowed() && third.denied_by_concurrency());
//! assert_eq!(third.decision.rule, Some("per_client_in_flight"));
//! drop(first); // the response finished: its permit comes back
//! assert!(policy.admit(&request, 1)?.is_allowed());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Semantics
//! * **One decision**: the concurrency rules are decided first (each takes a permit), then the rate
//!   rules ([`Policy::check_next_at`]). A denial by either gives everything back: a concurrency denial
//!   drops the permits already taken and consumes no rate quota; a rate denial (or a
//!   [`PolicyError`]) drops every permit.
//! * A shadow rule (or any rule under dry run) takes a permit when it can and never denies; when
//!   it cannot, the admission's `shadow_denied` is set.
//! * A denial's `retry_after` is the rule's `retry_after` (default 1 s): an in-flight limit cannot
//!   know when a holder finishes. Its [`PolicyDecision::quota`] is `None` (a concurrency limit is
//!   not a `RateLimit-Policy`).
//! * **Reload**: a rule whose name, key and capacity are unchanged keeps its table and the permits
//!   counted in it (a new limit or `max_hold` applies from the commit; counts carry over as they
//!   are). A permit taken under a rule that a reload then removed or rebuilt is given back to that
//!   rule's old table, which lives until its last permit is dropped: it never lands in the new
//!   table, so it cannot release someone else's permit there.
//! * **Reserved shares**: `priority = { descriptor, classes, reserve }`, as on a rate rule (see
//!   [`PriorityConfig`](crate::PriorityConfig)): a request of a lower class is admitted only if, after
//!   it, the key still has the shares of the classes above it free, so a flood of low-priority
//!   requests cannot hold every permit; the lowest class sheds first. Shares are of `limit`.
//! * Stuck holders, flooding keys, bad limits: as [`tollgate_sharded::KeyedInFlight`] (a global
//!   rule is a one-key table).
//! * In process only: a [`RedisPolicy`](crate::RedisPolicy) refuses concurrency rules
//!   ([`ConfigErrorKind::ConcurrencyUnsupported`]), and so does tollgate-server's Envoy RLS, which
//!   never sees a request end.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use smallvec::SmallVec;
use tollgate_core::{CheckError, Clock, Decision, InFlight, Nanos};
use tollgate_sharded::{KeyPermit, KeyedError, KeyedInFlight, KeyedLimiter};

pub use crate::config::ConcurrencyConfig;
use crate::config::{MatchSpec, Mode, PolicyConfig};
use crate::config_error::{ConfigError, ConfigErrorKind};
use crate::decision::{Descriptors, PolicyDecision, PolicyError};
use crate::descriptor_match::DescriptorMatch;
use crate::policy::Policy;
use crate::priority::Priority;
use crate::reload::ReloadReport;
use crate::rules::{KeyBuf, intern};

/// A rule's table, whatever the policy's clock type.
trait Table: Send + Sync {
    /// A permit of `cost` units, leaving `reserve` free for higher priority classes (0: none).
    fn take(
        &self,
        key: &[u8],
        now: Nanos,
        cost: u64,
        reserve: u64,
    ) -> Result<Result<KeyPermit, Decision>, CheckError>;
    fn in_flight(&self, key: &[u8]) -> u64;
    fn set_algorithm(&self, algorithm: InFlight);
}

impl<C: Clock + 'static> Table for Arc<KeyedInFlight<[u8], C>> {
    fn take(
        &self,
        key: &[u8],
        now: Nanos,
        cost: u64,
        reserve: u64,
    ) -> Result<Result<KeyPermit, Decision>, CheckError> {
        // A reserve of 0 takes the plain path there.
        self.try_acquire_reserving_at(key, now, cost, reserve)
    }

    fn in_flight(&self, key: &[u8]) -> u64 {
        KeyedInFlight::in_flight(self, key)
    }

    fn set_algorithm(&self, algorithm: InFlight) {
        self.table().set_default(algorithm);
    }
}

/// One compiled concurrency rule.
struct InFlightRule {
    name: &'static str,
    config: ConcurrencyConfig,
    matches: Box<[(Box<str>, MatchSpec)]>,
    /// The class descriptor's name and the compiled classes (`None`: every request alike).
    priority: Option<(Box<str>, Priority)>,
    table: Arc<dyn Table>,
}

impl InFlightRule {
    /// Whether the rule applies, by the policy's descriptor matching.
    fn applies(&self, descriptors: &Descriptors<'_>, mode: DescriptorMatch) -> bool {
        let named = self
            .matches
            .iter()
            .all(|(name, spec)| value(descriptors, name).is_some_and(|value| spec.matches(value)));
        // Under exact matching the class descriptor counts as named (a request carrying a class
        // still reaches the rule).
        let class = self.priority.as_ref().map(|(name, _)| &**name);
        named
            && (mode == DescriptorMatch::Subset
                || descriptors.iter().all(|(name, _)| {
                    Some(*name) == class || self.matches.iter().any(|(n, _)| **n == **name)
                }))
    }

    /// Units of the limit this request must leave free, by its class.
    fn reserve(&self, descriptors: &Descriptors<'_>) -> u64 {
        self.priority.as_ref().map_or(0, |(name, priority)| {
            priority.reserve_of_class(value(descriptors, name), self.config.limit)
        })
    }

    /// The key bytes, encoded as a rate rule's (one value as is, several length-prefixed).
    fn key<'a>(&self, descriptors: &Descriptors<'a>, buf: &'a mut KeyBuf) -> Option<&'a [u8]> {
        match self.config.key.as_slice() {
            [] => Some(&[]),
            [one] => value(descriptors, one).map(str::as_bytes),
            many => {
                buf.clear();
                for name in many {
                    let value = value(descriptors, name)?;
                    let len = u32::try_from(value.len()).unwrap_or(u32::MAX);
                    buf.extend_from_slice(&len.to_le_bytes());
                    buf.extend_from_slice(value.as_bytes());
                }
                Some(&buf[..])
            }
        }
    }
}

/// A descriptor's first value.
fn value<'a>(descriptors: &Descriptors<'a>, name: &str) -> Option<&'a str> {
    descriptors
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, value)| *value)
}

/// The compiled concurrency rules of one rule set.
#[derive(Default)]
pub(crate) struct InFlightSet {
    rules: Box<[InFlightRule]>,
    descriptor_match: DescriptorMatch,
    /// Limit changes of kept tables, applied at the reload's commit (a prepared reload changes
    /// nothing live).
    pending: Mutex<Vec<(Arc<dyn Table>, InFlight)>>,
}

impl InFlightSet {
    /// Compiles `config`'s concurrency rules (validated), keeping `old`'s tables where a rule's
    /// name, key and capacity are unchanged; adds each rule to `report`.
    pub(crate) fn build<C: Clock + Clone + 'static>(
        config: &PolicyConfig,
        clock: &C,
        old: Option<&InFlightSet>,
        report: &mut ReloadReport,
    ) -> Result<InFlightSet, ConfigError> {
        let mut rules = Vec::with_capacity(config.concurrency.len());
        let mut pending = Vec::new();
        for rc in &config.concurrency {
            let name = intern(&rc.name);
            let algorithm = rc.algorithm()?;
            let kept = old.and_then(|old| {
                old.rules.iter().find(|r| {
                    r.name == name && r.config.key == rc.key && r.config.capacity == rc.capacity
                })
            });
            let table = match kept {
                Some(prev) => {
                    if prev.config.algorithm()? != algorithm {
                        pending.push((Arc::clone(&prev.table), algorithm));
                    }
                    report.kept.push(name);
                    Arc::clone(&prev.table)
                }
                None => {
                    let err = |e: KeyedError| {
                        let field = match e {
                            KeyedError::CapacityTooLarge { .. } | KeyedError::ZeroCapacity => {
                                "capacity"
                            }
                            _ => "limit",
                        };
                        ConfigError::new(Some(&rc.name), field, ConfigErrorKind::Keyed(e))
                    };
                    let table = KeyedLimiter::<[u8], InFlight, C>::builder_with_clock(
                        rc.quota()?,
                        rc.capacity.unwrap_or(1),
                        clock.clone(),
                    )
                    .build()
                    .map_err(err)?;
                    // The builder made the algorithm from the quota; the retry hint is the rule's.
                    table.set_default(algorithm);
                    report.fresh.push(name);
                    Arc::new(Arc::new(KeyedInFlight::from_table(table))) as Arc<dyn Table>
                }
            };
            let priority = rc.priority.as_ref().and_then(|p| {
                // The class is read by name here: no rule-set index is needed.
                Priority::compile(p, &mut |_| 0)
                    .map(|compiled| (p.descriptor.as_str().into(), compiled))
            });
            rules.push(InFlightRule {
                name,
                priority,
                config: rc.clone(),
                matches: rc
                    .matches
                    .iter()
                    .map(|(name, spec)| (name.as_str().into(), spec.clone()))
                    .collect(),
                table,
            });
        }
        if let Some(old) = old {
            report.removed.extend(
                old.rules
                    .iter()
                    .map(|r| r.name)
                    .filter(|name| !report.kept.contains(name)),
            );
        }
        Ok(InFlightSet {
            rules: rules.into_boxed_slice(),
            descriptor_match: config.descriptor_match.unwrap_or_default(),
            pending: Mutex::new(pending),
        })
    }

    /// Applies the limit changes of kept tables (at a reload's commit).
    pub(crate) fn commit(&self) {
        let pending = std::mem::take(
            &mut *self
                .pending
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        for (table, algorithm) in pending {
            table.set_algorithm(algorithm);
        }
    }
}

/// A request's admission by [`Policy::admit`]: the decision, and while admitted, the permits of
/// the concurrency rules it holds. Drop it when the request ends (the response body is done, the
/// request was cancelled): that gives every permit back, once.
#[must_use = "dropping an admission gives its permits back at once"]
pub struct Admission {
    /// The decision: a concurrency rule's denial, else the rate rules' decision
    /// ([`Policy::check_at`]).
    pub decision: PolicyDecision,
    denied_by_concurrency: bool,
    next_unit: Option<Duration>,
    permits: SmallVec<[KeyPermit; 2]>,
}

impl Admission {
    /// Whether the request was admitted.
    pub fn is_allowed(&self) -> bool {
        self.decision.is_allowed()
    }

    /// Whether a concurrency rule denied it (edges answer `503` with `Retry-After` rather than
    /// `429`: the client is not over its rate, the service is busy with its requests).
    pub fn denied_by_concurrency(&self) -> bool {
        self.denied_by_concurrency
    }

    /// The rate rules' `RateLimit` `t` ([`Policy::check_next_at`]); `None` on a concurrency
    /// denial.
    pub fn next_unit(&self) -> Option<Duration> {
        self.next_unit
    }

    /// How many permits it holds (one per applicable concurrency rule that admitted it).
    pub fn permits(&self) -> usize {
        self.permits.len()
    }
}

impl fmt::Debug for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("decision", &self.decision)
            .field("denied_by_concurrency", &self.denied_by_concurrency)
            .field("permits", &self.permits.len())
            .finish()
    }
}

impl<C: Clock + Clone + 'static> Policy<C> {
    /// Decides a request against the concurrency rules and the rate rules as one, now. See the
    /// [module docs](crate::inflight) and [`admit_at`](Self::admit_at).
    ///
    /// # Errors
    /// As [`admit_at`](Self::admit_at).
    pub fn admit(
        &self,
        descriptors: &Descriptors<'_>,
        cost: u64,
    ) -> Result<Admission, PolicyError> {
        self.admit_at(descriptors, self.now(), cost)
    }

    /// Takes a permit of `cost` units from each applicable concurrency rule, then checks the rate
    /// rules at `now`; a denial by either gives everything back. The [`Admission`] holds the
    /// permits until it is dropped.
    ///
    /// # Errors
    /// [`PolicyError::CostExceedsCapacity`] when an enforcing rule (rate or concurrency) can never
    /// admit `cost`; nothing is held or consumed.
    pub fn admit_at(
        &self,
        descriptors: &Descriptors<'_>,
        now: Nanos,
        cost: u64,
    ) -> Result<Admission, PolicyError> {
        self.admit_with(descriptors, now, cost, || {
            self.check_next_at(descriptors, now, cost)
        })
    }

    /// [`admit_at`](Self::admit_at) with the rate rules decided by `rate` (what
    /// [`check_next_at`](Self::check_next_at) answers, or the same with a trace), run only once
    /// every concurrency rule has admitted.
    #[inline]
    pub(crate) fn admit_with(
        &self,
        descriptors: &Descriptors<'_>,
        now: Nanos,
        cost: u64,
        rate: impl FnOnce() -> Result<(PolicyDecision, Option<Duration>), PolicyError>,
    ) -> Result<Admission, PolicyError> {
        let live = self.current.load();
        let set = &live.inflight;
        let dry = self.dry_run();
        let mut permits = SmallVec::new();
        let mut shadow_denied = false;
        let mut buf = KeyBuf::new();
        for rule in &*set.rules {
            if !rule.applies(descriptors, set.descriptor_match) {
                continue;
            }
            let Some(key) = rule.key(descriptors, &mut buf) else {
                continue;
            };
            let enforced = rule.config.mode == Mode::Enforce && !dry;
            match rule.table.take(key, now, cost, rule.reserve(descriptors)) {
                Ok(Ok(permit)) => permits.push(permit),
                Ok(Err(denial)) if enforced => {
                    // `permits` drops here: every permit taken so far goes back.
                    return Ok(Admission {
                        decision: PolicyDecision {
                            decision: denial,
                            rule: Some(rule.name),
                            quota: None,
                            delay: Duration::ZERO,
                            shadow_denied,
                        },
                        denied_by_concurrency: true,
                        next_unit: None,
                        permits: SmallVec::new(),
                    });
                }
                Err(CheckError::CostExceedsCapacity { capacity, .. }) if enforced => {
                    return Err(PolicyError::CostExceedsCapacity {
                        rule: rule.name,
                        cost,
                        capacity,
                    });
                }
                Ok(Err(_)) | Err(_) => shadow_denied = true,
            }
        }
        drop(live);
        let (mut decision, next_unit) = rate()?;
        decision.shadow_denied |= shadow_denied;
        if !decision.is_allowed() {
            permits.clear();
        }
        Ok(Admission {
            decision,
            denied_by_concurrency: false,
            next_unit,
            permits,
        })
    }

    /// Units `descriptors`' key holds in concurrency rule `rule` now (`None`: no such rule, or it
    /// does not apply to these descriptors).
    pub fn in_flight(&self, rule: &str, descriptors: &Descriptors<'_>) -> Option<u64> {
        let live = self.current.load();
        let set = &live.inflight;
        let rule = set.rules.iter().find(|r| r.name == rule)?;
        if !rule.applies(descriptors, set.descriptor_match) {
            return None;
        }
        let mut buf = KeyBuf::new();
        let key = rule.key(descriptors, &mut buf)?;
        Some(rule.table.in_flight(key))
    }
}
