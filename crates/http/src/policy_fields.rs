//! The response fields for a [`Policy`] decision, as values, for callers that are not the tower
//! layer: [`PolicyLayer`](crate::PolicyLayer) uses it, and so does tollgate-server, which hands the
//! same `RateLimit`, `RateLimit-Policy` and `Retry-After` values to Envoy to add to its responses.
//! The field syntax lives in [`crate::headers`] only.

use std::collections::HashMap;
use std::sync::RwLock;

use http::HeaderValue;
use tollgate_core::{Clock, Decision, Nanos, Quota};
use tollgate_policy::{Descriptors, Policy, PolicyDecision};

use crate::headers::{self, PolicyHeaders};

/// The fields one decision's response carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldValues {
    /// `RateLimit-Policy: "rule";q=..;w=..` for the deciding rule and the key's quota.
    pub ratelimit_policy: HeaderValue,
    /// `RateLimit: "rule";r=..;t=..` (see [`crate::headers`] for `r` and `t`).
    pub ratelimit: HeaderValue,
    /// `Retry-After` in whole seconds, rounded up and never 0: on denials only.
    pub retry_after: Option<HeaderValue>,
    /// `q` of `RateLimit-Policy`, for `X-RateLimit-Limit`.
    pub limit: HeaderValue,
    /// `(r, t)` as numbers.
    pub service_limit: (u64, u64),
}

/// Builds [`FieldValues`] for [`Policy`] decisions. The fixed part of each `(rule, quota)` pair is
/// serialised once and kept (a few tens of bytes per pair, for the life of the process: a config's
/// rules and overrides bound the pairs).
#[derive(Debug, Default)]
pub struct PolicyFields {
    made: RwLock<HashMap<(&'static str, Quota), PolicyHeaders>>,
}

impl PolicyFields {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The fields for `decided`, which `policy` returned for `descriptors` at `now`; `None` when no
    /// enforcing rule decided (nothing to advertise) or the rule's name is not a structured-field
    /// string. Costs one read-only peek of the deciding rule on allowed decisions (for `t`).
    pub fn for_decision<C: Clock + Clone + 'static>(
        &self,
        policy: &Policy<C>,
        decided: &PolicyDecision,
        descriptors: &Descriptors<'_>,
        now: Nanos,
    ) -> Option<FieldValues> {
        let (rule, quota) = (decided.rule?, decided.quota?);
        let made = self.headers(rule, quota)?;
        let (r, t) = service_limit(policy, decided, rule, descriptors, now);
        let retry_after = match decided.decision {
            Decision::Denied { retry_after, .. } => {
                Some(headers::number(headers::retry_secs(retry_after)))
            }
            Decision::Allowed { .. } => None,
        };
        Some(FieldValues {
            ratelimit_policy: made.policy.clone(),
            ratelimit: made.ratelimit(r, t),
            retry_after,
            limit: made.limit.clone(),
            service_limit: (r, t),
        })
    }

    /// The fields for a decision that `rule` under `quota` made outside a [`Policy`] (for example
    /// on Redis, where a peek would cost a round trip): `next_unit` is the caller's best knowledge
    /// of the wait until more than `remaining` units pass (`t` of `RateLimit`), `None` when it has
    /// none (then `t` is 0, or 1 with nothing left). Denials need no peek: `t` is their wait.
    /// `None` when the rule's name is not a structured-field string.
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
        next_unit: Option<std::time::Duration>,
    ) -> Option<FieldValues> {
        let made = self.headers(rule, quota)?;
        let (r, t, retry_after) = match *decision {
            Decision::Denied { retry_after, .. } => {
                let secs = headers::retry_secs(retry_after);
                (0, secs, Some(headers::number(secs)))
            }
            Decision::Allowed { remaining, .. } => {
                let t = next_unit.map_or(0, headers::ceil_secs);
                (remaining, if remaining == 0 { t.max(1) } else { t }, None)
            }
        };
        Some(FieldValues {
            ratelimit_policy: made.policy.clone(),
            ratelimit: made.ratelimit(r, t),
            retry_after,
            limit: made.limit.clone(),
            service_limit: (r, t),
        })
    }

    /// The field text for `rule` under `quota`, made once per pair.
    pub(crate) fn headers(&self, rule: &'static str, quota: Quota) -> Option<PolicyHeaders> {
        if let Some(found) = self
            .made
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(rule, quota))
        {
            return Some(found.clone());
        }
        // Rule names come from a validated config; one that is not a valid field name gets no fields.
        let made = PolicyHeaders::new(rule, &quota).ok()?;
        self.made
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert((rule, quota), made.clone());
        Some(made)
    }
}

/// `(r, t)` for the deciding rule (see [`crate::headers`]): `t` is the wait until more than `r`
/// units pass that rule.
pub(crate) fn service_limit<C: Clock + Clone + 'static>(
    policy: &Policy<C>,
    decided: &PolicyDecision,
    rule: &'static str,
    descriptors: &Descriptors<'_>,
    now: Nanos,
) -> (u64, u64) {
    match decided.decision {
        Decision::Denied { retry_after, .. } => (0, headers::retry_secs(retry_after)),
        Decision::Allowed { remaining, .. } => {
            let t = match remaining
                .checked_add(1)
                .and_then(|more| policy.peek_rule_at(rule, descriptors, now, more))
            {
                Some(Ok(Decision::Denied { retry_after, .. })) => headers::ceil_secs(retry_after),
                _ => 0,
            };
            (remaining, if remaining == 0 { t.max(1) } else { t })
        }
    }
}
