//! [`PinnedPolicy`]: a policy that decides on the rule set it had when pinned, for one caller
//! making many decisions in a row (a replay), without loading the rule set on every decision.

use crate::sync::{AtomicBool, Ordering};
use std::sync::Arc;

use tollgate_core::{Clock, Nanos};

use crate::decision::{Descriptors, PolicyDecision, PolicyError, RuleOutcome};
use crate::live::Live;
use crate::policy::Policy;

/// A [`Policy`] and the rule set it had when pinned. A decision through it skips the lock-free
/// load of the rule set that each [`Policy`] decision makes (a few dozen instructions and a
/// thread-local debt slot). A reload made since (through [`policy`](Self::policy)) is not seen
/// until [`repin`](Self::repin): until then decisions go on as a decision that was in flight
/// during the reload does, on the rules it loaded and the state they share with the new ones.
///
/// After a denial, the next request's rules are all peeked first: when it is denied too (a flood,
/// or a replay of a tightened limit), nothing is written, where a plain decision admits on the
/// rules before the denying one and gives those admissions back. The answers, each rule's outcome
/// and the counters are a plain decision's (a property test says so); rule sets with a striped
/// rule or priority headroom, where a peek may decide otherwise than a check, are decided plainly.
///
/// ```
/// use tollgate_core::ManualClock;
/// use tollgate_policy::{Policy, PolicyConfig};
///
/// let config = PolicyConfig::from_toml(r#"
///     [[rules]]
///     name = "per_user"
///     match = { user = "any" }
///     key = ["user"]
///     limit = 1
///     period = "1s"
///     capacity = 10
/// "#)?;
/// let pinned = Policy::with_clock(config, ManualClock::new())?.pinned();
/// let mut outcomes = Vec::new();
/// let request = [("user", "u1")];
/// assert!(pinned.check_detailed_at(&request, 0, 1, &mut outcomes)?.is_allowed());
/// assert!(!pinned.check_detailed_at(&request, 0, 1, &mut outcomes)?.is_allowed());
/// assert_eq!(outcomes[0].rule, "per_user");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct PinnedPolicy<C> {
    policy: Policy<C>,
    live: Arc<Live>,
    /// Whether the last decision was a denial: the next one then peeks every rule first and,
    /// when it is denied too, writes nothing (`engine::decide_values_peeking_first`; the same
    /// answer either way). A hint: any value is correct.
    denying: AtomicBool,
}

impl<C> Policy<C> {
    /// This policy, pinned to the rule set it has now (see [`PinnedPolicy`]).
    pub fn pinned(self) -> PinnedPolicy<C> {
        let live = arc_swap::Guard::into_inner(self.live());
        PinnedPolicy {
            policy: self,
            live,
            denying: AtomicBool::new(false),
        }
    }
}

impl<C> PinnedPolicy<C> {
    /// The policy (its reloads and statistics); a reload through it is seen after
    /// [`repin`](Self::repin).
    pub fn policy(&self) -> &Policy<C> {
        &self.policy
    }

    /// Pins the rule set the policy has now.
    pub fn repin(&mut self) {
        self.live = arc_swap::Guard::into_inner(self.policy.live());
    }

    /// The policy back, unpinned.
    pub fn into_inner(self) -> Policy<C> {
        self.policy
    }
}

impl<C: Clock + Clone + 'static> PinnedPolicy<C> {
    /// [`Policy::check_detailed_at`] on the pinned rule set.
    ///
    /// # Errors
    /// As [`Policy::check`].
    #[inline]
    pub fn check_detailed_at(
        &self,
        descriptors: &Descriptors<'_>,
        now: Nanos,
        cost: u64,
        outcomes: &mut Vec<RuleOutcome>,
    ) -> Result<PolicyDecision, PolicyError> {
        // Relaxed: a hint that publishes nothing; a stale value costs time, never an answer.
        let peek_first = self.denying.load(Ordering::Relaxed);
        let decided =
            self.policy
                .check_detailed_on(&self.live, descriptors, now, cost, outcomes, peek_first);
        let denied = !decided.as_ref().is_ok_and(PolicyDecision::is_allowed);
        if denied != peek_first {
            self.denying.store(denied, Ordering::Relaxed);
        }
        decided
    }
}
