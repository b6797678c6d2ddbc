//! What a decision takes and gives: a request's [`Descriptors`], the [`PolicyDecision`] over every
//! rule that applies, each rule's [`RuleOutcome`], and the [`PolicyError`] when a request cannot be
//! decided. Plain values, the same for every store (in process and Redis).

use std::fmt;
use std::time::Duration;

use tollgate_core::{Decision, Quota};

/// A request's descriptors: `(name, value)` pairs such as `("remote_address", "192.0.2.1")`. When a
/// name occurs twice the first pair counts.
pub type Descriptors<'a> = [(&'a str, &'a str)];

/// One decision over every rule that applies to a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyDecision {
    /// Allowed (with `remaining`/`reset_after` of the tightest enforcing rule) or denied (with the
    /// largest `retry_after` of the denying rules, and that rule's `reset_after`). With no enforcing
    /// rule applying: allowed, `remaining` = `u64::MAX`, `reset_after` = 0.
    pub decision: Decision,
    /// The rule that decided (the tightest admitting one, or the denying one with the longest wait),
    /// for headers and logs; `None` when no enforcing rule applied.
    pub rule: Option<&'static str>,
    /// The deciding rule's quota for this request's key: its override when the key has one.
    pub quota: Option<Quota>,
    /// Two-stage rules: how long the caller should hold the request before forwarding it (zero when
    /// no rule asks for a wait).
    pub delay: Duration,
    /// Whether a shadow rule (or any rule under dry run) would have denied.
    pub shadow_denied: bool,
}

impl PolicyDecision {
    /// Whether the request is admitted.
    #[inline]
    pub fn is_allowed(&self) -> bool {
        self.decision.is_allowed()
    }
}

/// One rule's part in a decision, from
/// [`Policy::check_detailed`](crate::Policy::check_detailed): what a gRPC server needs per
/// descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleOutcome {
    /// The rule.
    pub rule: &'static str,
    /// Whether it was enforcing for this decision (false for shadow rules and under dry run).
    pub enforced: bool,
    /// Its own verdict (a rule evaluated after another denied is only peeked, and its admission
    /// would be given back anyway).
    pub decision: Decision,
    /// Its quota for this request's key.
    pub quota: Quota,
}

/// Why a check could not be decided (as opposed to denied). Nothing is consumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyError {
    /// An enforcing rule can never admit this cost at once; retrying cannot help. (A shadow rule in
    /// this position counts as shadow-denied and is otherwise skipped.)
    CostExceedsCapacity {
        /// The rule.
        rule: &'static str,
        /// The cost asked for.
        cost: u64,
        /// The most the rule admits at once.
        capacity: u64,
    },
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::CostExceedsCapacity {
                rule,
                cost,
                capacity,
            } => write!(
                f,
                "rule `{rule}`: cost {cost} exceeds the most it can ever admit at once ({capacity})"
            ),
        }
    }
}

impl std::error::Error for PolicyError {}
