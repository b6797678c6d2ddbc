//! The response fields for a [`Policy`] decision, as values. Every edge gets them inside an
//! [`EdgeVerdict`](crate::EdgeVerdict) (the tower [`PolicyLayer`](crate::PolicyLayer),
//! tollgate-pingora, and tollgate-server, which hands the same `RateLimit`, `RateLimit-Policy` and
//! `Retry-After` values to Envoy to add to its responses); [`PolicyFields::for_decision`] and
//! [`PolicyFields::for_rule`] make them from a decision in hand. The field syntax lives in
//! [`crate::headers`] only, and `(r, t)` is worked out by one function there.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use http::HeaderValue;
use tollgate_core::{Decision, Quota};
#[cfg(doc)]
use tollgate_policy::Policy;
use tollgate_policy::PolicyDecision;

use crate::headers::{self, PolicyHeaders, RateLimitValue};

/// The fields one decision's response carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldValues {
    /// `RateLimit-Policy: "rule";q=..;w=..` for the deciding rule and the key's quota.
    pub ratelimit_policy: HeaderValue,
    /// `RateLimit: "rule";r=..;t=..` (see [`crate::headers`] for `r` and `t`), written into a
    /// header value only when a response carries it (`HeaderValue::from`), so that a decision
    /// allocates nothing.
    pub ratelimit: RateLimitValue,
    /// `Retry-After` in whole seconds, rounded up and never 0: on denials only.
    pub retry_after: Option<HeaderValue>,
    /// `q` of `RateLimit-Policy`, for `X-RateLimit-Limit`.
    pub limit: HeaderValue,
    /// `(r, t)` as numbers.
    pub service_limit: (u64, u64),
}

/// Builds [`FieldValues`] for [`Policy`] decisions.
///
/// The fixed part of each `(rule, quota)` pair is serialised once per process and kept for its
/// life (a few tens of bytes per pair: a config's rules and override quotas bound the pairs, and a
/// reload that changes a quota adds one). Each thread keeps the pairs it used last in a small
/// direct-mapped table, so a response's fields cost no lock, no shared write and no hashing of the
/// rule's name: a profile of the Pingora integration found the shared map's lock, its SipHash and
/// the copied name string on every request.
#[derive(Debug, Default)]
pub struct PolicyFields {
    _private: (),
}

impl PolicyFields {
    /// A builder (the cache behind it is process-wide).
    pub fn new() -> Self {
        Self::default()
    }

    /// The fields for `decided`, which [`Policy::check_next_at`] returned with `next_unit`; `None`
    /// when no enforcing rule decided (nothing to advertise) or the rule's name is not a
    /// structured-field string.
    ///
    /// ```
    /// use tollgate_core::ManualClock;
    /// use tollgate_http::PolicyFields;
    /// use tollgate_policy::{Policy, PolicyConfig};
    /// let config = PolicyConfig::from_toml(r#"
    ///     [[rules]]
    ///     name = "per_client"
    ///     match = { remote_address = "any" }
    ///     key = ["remote_address"]
    ///     capacity = 1024
    ///     limit = 10
    ///     period = "60s"
    /// "#)?;
    /// let policy = Policy::with_clock(config, ManualClock::new())?;
    /// let (decided, next) = policy.check_next_at(&[("remote_address", "192.0.2.1")], policy.now(), 1)?;
    /// let f = PolicyFields::new().for_decision(&decided, next).unwrap();
    /// assert_eq!(f.ratelimit_policy, "\"per_client\";q=10;w=60");
    /// assert_eq!(f.ratelimit, "\"per_client\";r=9;t=6", "9 left, a tenth in 6 s");
    /// assert!(f.retry_after.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn for_decision(
        &self,
        decided: &PolicyDecision,
        next_unit: Option<Duration>,
    ) -> Option<FieldValues> {
        self.for_rule(decided.rule?, decided.quota?, &decided.decision, next_unit)
    }

    /// The fields for a decision that `rule` under `quota` made outside a [`Policy`] (for example
    /// on Redis, where a peek would cost a round trip): `next_unit` is the caller's best knowledge
    /// of the wait until more than `remaining` units pass (`t` of `RateLimit`), `None` when it has
    /// none (then `t` is 0, or 1 with nothing left). A denial is taken without a look at the rule:
    /// `r=0` and `t` its wait, the conservative values (exact for one-unit requests;
    /// [`EdgeVerdict::of_check`](crate::EdgeVerdict::of_check) says the units left after a denial
    /// of more). `None` when the rule's name is not a structured-field string.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_core::{Decision, Quota};
    /// use tollgate_http::PolicyFields;
    /// let fields = PolicyFields::new();
    /// let quota = Quota::per_minute(10)?;
    /// let denied = Decision::denied(1_500_000_000, 6_000_000_000);
    /// let f = fields.for_rule("api", quota, &denied, None).unwrap();
    /// assert_eq!(f.ratelimit, "\"api\";r=0;t=2");
    /// assert_eq!(f.retry_after.unwrap(), "2");
    /// let allowed = Decision::allowed(3, 6_000_000_000);
    /// let f = fields.for_rule("api", quota, &allowed, Some(Duration::from_millis(200))).unwrap();
    /// assert_eq!(f.ratelimit, "\"api\";r=3;t=1");
    /// assert_eq!(f.ratelimit_policy, "\"api\";q=10;w=60");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn for_rule(
        &self,
        rule: &'static str,
        quota: Quota,
        decision: &Decision,
        next_unit: Option<Duration>,
    ) -> Option<FieldValues> {
        let limit =
            headers::service_limit(decision, 1, with_next_unit(decision, next_unit, |_| None));
        let retry_after = decision.retry_after().map(headers::retry_secs);
        self.with_limit(rule, quota, limit, retry_after)
    }

    /// The fields for `rule` under `quota` with service limit `(r, t)` and `Retry-After` already
    /// worked out (by [`EdgeVerdict::of_check`](crate::EdgeVerdict::of_check)).
    pub(crate) fn with_limit(
        &self,
        rule: &'static str,
        quota: Quota,
        (r, t): (u64, u64),
        retry_after: Option<u64>,
    ) -> Option<FieldValues> {
        let made = self.headers(rule, quota)?;
        Some(FieldValues {
            ratelimit_policy: made.policy.clone(),
            ratelimit: made.ratelimit_value(r, t),
            retry_after: retry_after.map(headers::number),
            limit: made.limit.clone(),
            service_limit: (r, t),
        })
    }

    /// The field text for `rule` under `quota`, made once per pair and process.
    pub(crate) fn headers(
        &self,
        rule: &'static str,
        quota: Quota,
    ) -> Option<&'static PolicyHeaders> {
        let slot = Recent::slot(rule, &quota);
        // `try_with`: during thread teardown the table is gone; the shared map still answers.
        if let Ok(Some(made)) = RECENT.try_with(|recent| {
            let entry = recent[slot].get()?;
            entry.is(rule, &quota).then_some(entry.made)
        }) {
            return made;
        }
        let made = made_once(rule, quota);
        let _ = RECENT.try_with(|recent| recent[slot].set(Some(Recent { rule, quota, made })));
        made
    }
}

/// Every `(rule, quota)` pair's fields, made once per process (`None`: not a valid name).
fn made_once(rule: &'static str, quota: Quota) -> Option<&'static PolicyHeaders> {
    type Made = HashMap<(&'static str, Quota), Option<&'static PolicyHeaders>>;
    static MADE: OnceLock<Mutex<Made>> = OnceLock::new();
    let mut made = MADE
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    *made.entry((rule, quota)).or_insert_with(|| {
        // Rule names come from a validated config; one that is not a valid field name gets no
        // fields.
        PolicyHeaders::new(rule, &quota)
            .ok()
            .map(|h| &*Box::leak(Box::new(h)))
    })
}

/// Slots in each thread's table of recently used pairs: more than a config's rules usually are.
const RECENT_SLOTS: usize = 16;

thread_local! {
    static RECENT: [Cell<Option<Recent>>; RECENT_SLOTS] = const { [const { Cell::new(None) }; RECENT_SLOTS] };
}

/// One pair in a thread's table: the rule by its `'static` text's address and length (two names
/// at one address with one length are the same text, as `'static` text is never freed).
#[derive(Clone, Copy)]
struct Recent {
    rule: &'static str,
    quota: Quota,
    made: Option<&'static PolicyHeaders>,
}

impl Recent {
    #[inline]
    fn is(&self, rule: &'static str, quota: &Quota) -> bool {
        std::ptr::eq(self.rule, rule) && self.quota == *quota
    }

    /// The pair's slot: a multiplicative hash of the name's address and the quota's numbers.
    #[inline]
    fn slot(rule: &'static str, quota: &Quota) -> usize {
        let mixed = (rule.as_ptr() as u64)
            ^ (rule.len() as u64).rotate_left(48)
            ^ quota.limit().rotate_left(24)
            ^ quota.period_nanos()
            ^ quota.burst().rotate_left(40);
        (mixed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - RECENT_SLOTS.trailing_zeros())) as usize
    }
}

/// A peek that answers `remaining + 1` of an admission from what the check already said
/// (`next_unit`: the wait until more than `remaining` pass, `None` when none), and anything else
/// through `peek`.
pub(crate) fn with_next_unit(
    decision: &Decision,
    next_unit: Option<Duration>,
    mut peek: impl FnMut(u64) -> Option<Decision>,
) -> impl FnMut(u64) -> Option<Decision> {
    let admitted = match *decision {
        Decision::Allowed { remaining, .. } => remaining.checked_add(1),
        Decision::Denied { .. } => None,
    };
    move |units| {
        if Some(units) == admitted {
            return Some(match next_unit {
                Some(wait) => Decision::Denied {
                    retry_after: wait,
                    reset_after: Duration::ZERO,
                },
                None => Decision::Allowed {
                    remaining: 0,
                    reset_after: Duration::ZERO,
                },
            });
        }
        peek(units)
    }
}
