//! Per-rule counters: the crate's own (for [`Policy::snapshot`](crate::Policy::snapshot)) and the
//! `metrics` facade's (for whatever exporter the application installs).

use std::collections::BTreeMap;

use crossbeam_utils::CachePadded;
use metrics::{Counter, Label};

use crate::sync::{AtomicU64, Ordering, thread_ordinal};

/// Threads that count into a stripe of their own: the first `OWNED` threads of the process to
/// count (by [`thread_ordinal`]). A stripe with one writer needs no read-modify-write, so counting
/// costs a load and a store to a line that stays in that core's cache (a `lock`-prefixed add cost
/// about 6 ns per rule per decision on the benchmark machine). Later threads (or every thread
/// under loom) share one more stripe through `fetch_add`: correct, only slower. 33 padded stripes
/// are about 4 KiB per rule.
const OWNED: usize = 32;

/// Index of the shared stripe.
const SHARED: usize = OWNED;

/// What is counted, as indices into a stripe.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Outcome {
    Allowed = 0,
    Denied = 1,
    ShadowDenied = 2,
    NearLimit = 3,
}

const OUTCOMES: usize = 4;

/// A rule's counters. The facade handles are registered when the rule is built, so install the
/// `metrics` recorder before building (or reloading) the policy.
pub(crate) struct Counters {
    stripes: Box<[CachePadded<[AtomicU64; OUTCOMES]>]>,
    facade: [Counter; OUTCOMES],
    overflow: Counter,
}

impl Counters {
    /// `rule`'s counters, labelled `rule` and every pair of `extra` (the config's `metric_labels`).
    pub(crate) fn new(rule: &'static str, extra: &BTreeMap<String, String>) -> Self {
        let labels = |outcome: Option<&'static str>| {
            let mut labels = vec![Label::new("rule", rule)];
            labels.extend(outcome.map(|o| Label::new("outcome", o)));
            labels.extend(extra.iter().map(|(k, v)| Label::new(k.clone(), v.clone())));
            labels
        };
        let outcome = |name: &'static str| {
            metrics::counter!("tollgate_policy_decisions_total", labels(Some(name)))
        };
        Counters {
            stripes: (0..=OWNED)
                .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
            facade: [
                outcome("allowed"),
                outcome("denied"),
                outcome("shadow_denied"),
                metrics::counter!("tollgate_policy_near_limit_total", labels(None)),
            ],
            overflow: metrics::counter!("tollgate_policy_overflow_decisions_total", labels(None)),
        }
    }

    #[inline]
    pub(crate) fn count(&self, outcome: Outcome) {
        match thread_ordinal().filter(|&ordinal| ordinal < OWNED) {
            Some(ordinal) => {
                let counter = &self.stripes[ordinal][outcome as usize];
                // Relaxed, and a load then a store rather than an RMW: ordinals are unique per thread
                // for the process's life, so this thread is the stripe's only writer and no increment
                // can be lost; readers only sum a monitoring value, which publishes nothing.
                counter.store(
                    counter.load(Ordering::Relaxed).wrapping_add(1),
                    Ordering::Relaxed,
                );
            }
            // Relaxed: a monitoring counter; it publishes nothing.
            None => {
                self.stripes[SHARED][outcome as usize].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.facade[outcome as usize].increment(1);
    }

    pub(crate) fn total(&self, outcome: Outcome) -> u64 {
        self.stripes
            .iter()
            // Relaxed: a monitoring snapshot; it may lag concurrent decisions.
            .map(|stripe| stripe[outcome as usize].load(Ordering::Relaxed))
            .sum()
    }

    /// Publishes the keyed table's overflow count (kept by the table itself) to the facade.
    pub(crate) fn publish_overflow(&self, total: u64) {
        self.overflow.absolute(total);
    }
}

/// One rule's counters at a moment, from [`Policy::snapshot`](crate::Policy::snapshot).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuleStats {
    /// The rule's name.
    pub rule: &'static str,
    /// Requests the rule admitted (on its own verdict; the request may still have been denied by
    /// another rule, and then this rule's units were given back).
    pub allowed: u64,
    /// Requests an enforcing rule denied.
    pub denied: u64,
    /// Requests a shadow rule (or any rule under dry run) would have denied.
    pub shadow_denied: u64,
    /// Admissions that left 20 % or less of the rule's default capacity: at or above 80 % used.
    pub near_limit: u64,
    /// Decisions the rule's keyed table made with a stripe's shared overflow state (its table is too
    /// small for its live keys when this grows).
    pub overflow: u64,
}

/// Every rule's counters, in policy order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicySnapshot {
    /// Per rule.
    pub rules: Vec<RuleStats>,
}

impl PolicySnapshot {
    /// The counters of the rule named `name`.
    pub fn rule(&self, name: &str) -> Option<&RuleStats> {
        self.rules.iter().find(|r| r.rule == name)
    }
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::*;

    /// More threads than owned stripes, all counting at once: the owners' load-then-store and the
    /// latecomers' shared `fetch_add` together lose nothing.
    #[test]
    fn concurrent_counts_from_more_threads_than_stripes_are_exact() {
        const THREADS: usize = OWNED + 8;
        const EACH: u64 = 20_000;
        let counters = Counters::new("test", &BTreeMap::new());
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    for _ in 0..EACH {
                        counters.count(Outcome::Allowed);
                    }
                    counters.count(Outcome::Denied);
                });
            }
        });
        assert_eq!(counters.total(Outcome::Allowed), THREADS as u64 * EACH);
        assert_eq!(counters.total(Outcome::Denied), THREADS as u64);
        assert_eq!(counters.total(Outcome::ShadowDenied), 0);
    }
}
