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
//! * In process only: a `RedisPolicy` (feature `redis`) refuses concurrency rules
//!   ([`ConfigErrorKind::ConcurrencyUnsupported`](crate::ConfigErrorKind::ConcurrencyUnsupported)),
//!   and so does tollgate-server's Envoy RLS, which never sees a request end.

use std::fmt;
use std::time::Duration;

use smallvec::SmallVec;
use tollgate_core::{CheckError, Clock, Nanos};
use tollgate_sharded::KeyPermit;

pub use crate::config::ConcurrencyConfig;
use crate::config::Mode;
use crate::decision::{Descriptors, PolicyDecision, PolicyError};
use crate::policy::Policy;
use crate::rules::KeyBuf;

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
    permits: SmallVec<[KeyPermit<'static>; 2]>,
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
