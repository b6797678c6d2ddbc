//! [`EdgeVerdict`]: the one decision every edge renders, its status, delay and field values
//! worked out once; and [`Admitted`], the verdict with the in-flight permits it admitted.

use std::time::Duration;

use http::StatusCode;
use tollgate_core::{Clock, Decision};
use tollgate_policy::{Admission, Policy, PolicyDecision, PolicyError};

use crate::headers::{self, ExplainField};
use crate::policy_fields::{FieldValues, PolicyFields};

/// The decision an edge renders: whether to forward, after how long, with which status and
/// which field values. Made by [`PolicyEdge::decide`](crate::PolicyEdge::decide) or
/// [`EdgeVerdict::of_check`] only.
#[derive(Clone, Debug)]
pub struct EdgeVerdict {
    /// Whether the request goes on (after [`delay`](Self::delay)).
    pub allowed: bool,
    /// What an HTTP edge answers: `200 OK` (forward; the upstream's status is what the client
    /// sees), `429 Too Many Requests`, or `413 Payload Too Large` for a cost no enforcing rule
    /// can ever admit.
    pub status: StatusCode,
    /// How long to hold an admitted request before forwarding it (a two-stage rule's wait; zero
    /// for most).
    pub delay: Duration,
    /// `Retry-After` in whole seconds (rounded up, at least 1): on a 429 only.
    pub retry_after: Option<u64>,
    /// `RateLimit-Policy` and `RateLimit` of the deciding rule with the key's own quota; `None`
    /// when no enforcing rule applied or the cost can never be admitted.
    pub fields: Option<FieldValues>,
    /// The policy's decision (`None` for a cost no rule can ever admit).
    pub decided: Option<PolicyDecision>,
    /// Why it could not be decided (a cost no enforcing rule can ever admit).
    pub error: Option<PolicyError>,
    /// The decision's trace as a response header: only for a request the edge's
    /// [`explain_header`](crate::PolicyEdge::explain_header) predicate trusts, else `None`.
    pub explain: Option<Box<ExplainField>>,
}

impl EdgeVerdict {
    /// The verdict for `checked`, what [`Policy::check_next_at`] answered for `cost` units:
    /// the one place the status, `Retry-After` and the `RateLimit` service limit `(r, t)` are
    /// worked out.
    ///
    /// `peek(units)` is a read-only look at the deciding rule for `units` units (what
    /// `Policy::peek_rule_at` answers); it is asked only on a denial of more than one unit, to
    /// find how many units are left (see the [module docs](crate::edge)). A store that cannot look
    /// cheaply answers `None` and gets the conservative `r=0`, `t` = `Retry-After`.
    pub fn of_check(
        checked: Result<(PolicyDecision, Option<Duration>), PolicyError>,
        cost: u64,
        fields: &PolicyFields,
        peek: impl FnMut(u64) -> Option<Decision>,
    ) -> Self {
        let (decided, next_unit) = match checked {
            Ok(checked) => checked,
            Err(error) => {
                return EdgeVerdict {
                    allowed: false,
                    status: StatusCode::PAYLOAD_TOO_LARGE,
                    delay: Duration::ZERO,
                    retry_after: None,
                    fields: None,
                    decided: None,
                    error: Some(error),
                    explain: None,
                };
            }
        };
        let allowed = decided.is_allowed();
        let retry_after = decided.decision.retry_after().map(headers::retry_secs);
        let limit = headers::service_limit(
            &decided.decision,
            cost,
            crate::policy_fields::with_next_unit(&decided.decision, next_unit, peek),
        );
        EdgeVerdict {
            allowed,
            status: if allowed {
                StatusCode::OK
            } else {
                StatusCode::TOO_MANY_REQUESTS
            },
            delay: if allowed {
                decided.delay
            } else {
                Duration::ZERO
            },
            retry_after,
            fields: decided
                .rule
                .zip(decided.quota)
                .and_then(|(rule, quota)| fields.with_limit(rule, quota, limit, retry_after)),
            decided: Some(decided),
            error: None,
            explain: None,
        }
    }

    /// Decides `descriptors` for `cost` units with `policy` at `now`: [`Policy::check_next_at`],
    /// then [`of_check`](Self::of_check) with the policy's own read-only look at the deciding
    /// rule. For a caller that has descriptors rather than request facts (an RLS server).
    pub fn decide<C: Clock + Clone + 'static>(
        policy: &Policy<C>,
        descriptors: &[(&str, &str)],
        now: tollgate_core::Nanos,
        cost: u64,
        fields: &PolicyFields,
    ) -> Self {
        let checked = policy.check_next_at(descriptors, now, cost);
        let rule = checked.as_ref().ok().and_then(|(d, _)| d.rule);
        EdgeVerdict::of_check(checked, cost, fields, |units| {
            policy.peek_rule_at(rule?, descriptors, now, units)?.ok()
        })
    }

    /// Whether the cost asked can never be admitted (answered 413 / `OVER_LIMIT`, no retry).
    pub fn cost_too_large(&self) -> bool {
        self.error.is_some()
    }

    /// Whether a shadow rule (or any rule under dry run) would have denied.
    pub fn shadow_denied(&self) -> bool {
        self.decided.is_some_and(|d| d.shadow_denied)
    }
}

/// What [`PolicyEdge::admit`](crate::PolicyEdge::admit) decided: the verdict to render, and while
/// admitted the [`Admission`] to hold for the request's life.
#[derive(Debug)]
pub struct Admitted {
    /// The verdict: status `200` (forward), `503` (a concurrency rule is full), `429` (a rate rule
    /// denied) or `413` (a cost no rule can ever admit).
    pub verdict: EdgeVerdict,
    /// The permits, when admitted: drop them when the request ends.
    pub admission: Option<Admission>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denial_without_a_look_promises_no_units() {
        let denied = Decision::denied(2_500_000_000, 10_000_000_000);
        assert_eq!(headers::service_limit(&denied, 3, |_| None), (0, 3));
        let left_two = |units: u64| {
            Some(if units <= 2 {
                Decision::allowed(2 - units, 0)
            } else {
                Decision::denied(1_200_000_000, 0)
            })
        };
        assert_eq!(
            headers::service_limit(&denied, 3, left_two),
            (2, 2),
            "two left, a third in 1.2 s"
        );
    }
}
