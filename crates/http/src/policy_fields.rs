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
