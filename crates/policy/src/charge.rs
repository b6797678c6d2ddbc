//! Charging a cost after the fact, with no reservation: the call a proxy makes once a response is
//! done and its cost known (Envoy's `apply_on_stream_done` with a `hits_addend` read from the
//! response), when nothing was reserved for it.
//!
//! [`Policy::charge`] adds `cost` units to every rule that applies to the descriptors, for the
//! request's key, unconditionally ([`Algorithm::charge`](tollgate_core::Algorithm::charge)): a
//! key with nothing left goes into debt, and its next requests wait exactly as long as the
//! overdraft takes to refill (buckets) or its window counts beyond the limit (windows). Nothing is
//! denied and nothing given back: the units were spent upstream already. Shadow rules are charged
//! too, as a decision counts them.

use tollgate_core::{Clock, Nanos};

use crate::decision::Descriptors;
use crate::engine;
use crate::policy::Policy;

/// What a charge did.
///
/// # The bound
/// A charge is a settlement of a reservation of 0 units, so the settle bound (`guides/settle.md`)
/// holds: in any interval, a key's rule counts at most its quota plus the charges made after its
/// last admission in that interval. With a check before each request and a charge of `c` after
/// its response, a key overshoots by at most `c` (by the sum of `n` charges with `n` responses
/// running at once): admission sees what was charged when it decided.
///
/// # Bad input
/// A cost of 0 changes nothing. An absurd one saturates: the key stays denied, never over-admits,
/// never panics. A request no rule applies to charges nothing ([`Charged::rules`] is 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Charged {
    /// The units charged to each rule.
    pub cost: u64,
    /// The rules charged (every rule that applies to the descriptors, shadow ones included).
    pub rules: usize,
}

impl<C: Clock + Clone + 'static> Policy<C> {
    /// Charges `cost` units now, unconditionally, to every rule that applies to `descriptors`: a
    /// key with nothing left goes into debt (see [`Charged`] for the bound and bad input).
    ///
    /// ```
    /// use tollgate_core::ManualClock;
    /// use tollgate_policy::{Policy, PolicyConfig};
    /// let config = PolicyConfig::from_toml(r#"
    ///     [[rules]]
    ///     name = "tokens"
    ///     match = { tenant = "any" }
    ///     key = ["tenant"]
    ///     limit = 1000
    ///     period = "1m"
    ///     capacity = 100
    /// "#)?;
    /// let policy = Policy::with_clock(config, ManualClock::new())?;
    /// let tenant = [("tenant", "acme")];
    /// assert!(policy.check(&tenant, 1)?.is_allowed());
    /// // The response used 1 200 tokens: the tenant is in debt, its next request waits.
    /// assert_eq!(policy.charge(&tenant, 1_200).rules, 1);
    /// assert!(!policy.check(&tenant, 1)?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charge(&self, descriptors: &Descriptors<'_>, cost: u64) -> Charged {
        self.charge_at(descriptors, self.clock.now(), cost)
    }

    /// [`charge`](Self::charge) at an explicit time.
    pub fn charge_at(&self, descriptors: &Descriptors<'_>, now: Nanos, cost: u64) -> Charged {
        let live = self.live();
        let values = live.rules.resolve(descriptors);
        let mut rules = 0;
        engine::each_rule_key(&live.rules, &values, |at| {
            if cost > 0 {
                live.store.limiters[at.index].charge(at.key, now, cost);
            }
            rules += 1;
        });
        Charged { cost, rules }
    }
}
