//! The decision, written once for every store: each rule that applies to a request is decided for
//! the request's key, and the outcomes are combined by one [`Tally`].
//!
//! * Admitted only if every enforcing rule admits; the rules after the first enforcing denial are
//!   only peeked (for the longest wait), and every rule that admitted gets its units back, so a
//!   denied request leaves no trace in any rule's state, on any store.
//! * A shadow rule (or any rule under dry run) is decided and counted but never denies; a cost it
//!   could never admit counts as a shadow denial.
//! * A cost an enforcing rule can never admit is a [`PolicyError`]: what was admitted is given back.
//! * The deciding rule: the denying one with the longest `retry_after`, else the admitting one with
//!   the fewest units left (then the latest reset). With no enforcing rule applying: allowed,
//!   `remaining` = `u64::MAX`.
//! * Two-stage delay: the longest wait any admitting enforcing rule asks for.

use std::time::Duration;

use smallvec::SmallVec;
use tollgate_core::{CheckError, Decision, Nanos, Quota};

use crate::decision::{Descriptors, PolicyDecision, PolicyError, RuleOutcome};
use crate::rules::{KeyBuf, Rule, RuleSet};
use crate::store::{RuleKey, Store, next_unit};

/// A decision with the `RateLimit` field's `t` when asked for.
pub(crate) type Decided = (PolicyDecision, Option<Duration>);

/// The running combination of a request's rule outcomes.
pub(crate) struct Tally<R> {
    /// Rules that admitted (with what their refund needs), to give back on a denial.
    pub(crate) admitted: SmallVec<[(usize, R); 8]>,
    /// The denying rule with the longest wait, its decision and its quota for this key.
    denied: Option<(usize, Decision, Quota)>,
    /// The admitting enforcing rule with the fewest units left, as `denied`.
    tightest: Option<(usize, Decision, Quota)>,
    delay: Duration,
    pub(crate) shadow_denied: bool,
    /// Outcomes not counted yet (`set.metrics`), 4 bits per rule (`Rule::counted`; at most 16
    /// rules, `RuleSet::peeks_decide`): a pass that may be thrown away (see
    /// [`decide_values_peeking_first`]) counts only once it is the answer. `None`: counted as
    /// recorded.
    deferred: Option<u64>,
}

impl<R: Copy> Tally<R> {
    pub(crate) fn new() -> Self {
        Tally {
            admitted: SmallVec::new(),
            denied: None,
            tightest: None,
            delay: Duration::ZERO,
            shadow_denied: false,
            deferred: None,
        }
    }

    /// A tally whose outcomes are counted only by [`count_deferred`](Self::count_deferred).
    fn deferring() -> Self {
        Tally {
            deferred: Some(0),
            ..Tally::new()
        }
    }

    /// Counts the outcomes a [`deferring`](Self::deferring) tally recorded.
    fn count_deferred(&self, set: &RuleSet) {
        let codes = self.deferred.unwrap_or(0);
        for (i, rule) in set.rules.iter().enumerate().take(16) {
            rule.count_code((codes >> (4 * i)) & 0xF);
        }
    }

    /// Counts rule `i`'s outcome now, or defers it.
    fn count(&mut self, rule: &Rule, i: usize, enforced: bool, decision: &Decision) {
        match &mut self.deferred {
            Some(codes) if i < 16 => *codes |= rule.counted(enforced, decision) << (4 * i),
            _ => rule.count(enforced, decision),
        }
    }

    /// Whether an enforcing rule has denied already: the rules after it are only peeked.
    pub(crate) fn denying(&self) -> bool {
        self.denied.is_some()
    }

    /// Takes rule `i`'s outcome into account. `result`: the store's answer (`None`: the store
    /// failed open, the rule does not apply); the receipt is `None` for a peek.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn record(
        &mut self,
        set: &RuleSet,
        i: usize,
        at: &RuleKey<'_>,
        enforced: bool,
        cost: u64,
        result: Result<Option<(Decision, Option<R>)>, CheckError>,
        outcomes: Option<&mut Vec<RuleOutcome>>,
    ) -> Result<(), PolicyError> {
        let rule = &set.rules[i];
        let (decision, receipt) = match result {
            Ok(Some(found)) => found,
            Ok(None) => return Ok(()),
            Err(error) => {
                if !enforced {
                    // A shadow rule that could never admit this cost would have refused it.
                    if set.metrics {
                        let never = Decision::denied(Nanos::MAX, Nanos::MAX);
                        self.count(rule, i, false, &never);
                    }
                    self.shadow_denied = true;
                    return Ok(());
                }
                let capacity = match error {
                    CheckError::CostExceedsCapacity { capacity, .. } => capacity,
                    _ => 0,
                };
                return Err(PolicyError::CostExceedsCapacity {
                    rule: rule.name,
                    cost,
                    capacity,
                });
            }
        };
        let (decision, wait) = rule.shown(decision);
        if let Some(outcomes) = outcomes {
            outcomes.push(RuleOutcome {
                rule: rule.name,
                enforced,
                decision,
                quota: shown_quota(rule, at.quota),
            });
        }
        if set.metrics {
            self.count(rule, i, enforced, &decision);
        }
        if decision.is_allowed() {
            if let Some(receipt) = receipt.filter(|_| cost > 0) {
                self.admitted.push((i, receipt));
            }
            if enforced {
                self.delay = self.delay.max(wait);
                let tighter = self.tightest.is_none_or(|(_, best, _)| {
                    (
                        decision.remaining(),
                        std::cmp::Reverse(decision.reset_after()),
                    ) < (best.remaining(), std::cmp::Reverse(best.reset_after()))
                });
                if tighter {
                    self.tightest = Some((i, decision, at.quota));
                }
            }
        } else if enforced {
            let longer = self
                .denied
                .is_none_or(|(_, worst, _)| decision.retry_after() > worst.retry_after());
            if longer {
                self.denied = Some((i, decision, at.quota));
            }
        } else {
            self.shadow_denied = true;
        }
        Ok(())
    }

    /// The deciding rule (if any) with its quota for this key, the decision and the delay.
    pub(crate) fn finish(&self) -> Finished {
        match (self.denied, self.tightest) {
            (Some((i, decision, quota)), _) => (Some((i, quota)), decision, Duration::ZERO),
            (None, Some((i, decision, quota))) => (Some((i, quota)), decision, self.delay),
            (None, None) => (
                None,
                Decision::Allowed {
                    remaining: u64::MAX,
                    reset_after: Duration::ZERO,
                },
                Duration::ZERO,
            ),
        }
    }
}

/// A finished tally: the deciding rule with its quota for the key, the decision, the delay.
pub(crate) type Finished = (Option<(usize, Quota)>, Decision, Duration);

/// The quota a rule shows for a key limited by `quota` (a delayed rule shows its configured burst).
fn shown_quota(rule: &Rule, quota: Quota) -> Quota {
    if rule.delay.is_some() {
        rule.shown
    } else {
        quota
    }
}

/// Rule `i`'s key for this request, if the rule applies. (`always`: once per rule and request; a
/// call returned the whole `RuleKey` through memory.)
#[inline(always)]
pub(crate) fn rule_key<'a>(
    set: &RuleSet,
    i: usize,
    values: &[Option<&'a str>],
    buf: &'a mut KeyBuf,
) -> Option<RuleKey<'a>> {
    let rule = &set.rules[i];
    if !rule.applies(values) {
        return None;
    }
    let key = rule.key(values, buf)?;
    let quota = rule.effective_for(key);
    Some(RuleKey {
        index: i,
        rule: rule.name,
        algorithm: rule.algorithm,
        quota,
        key,
        composite: rule.key.len() > 1,
        reserve: rule
            .priority
            .as_ref()
            .map_or(0, |p| p.reserve(values, rule.algorithm, &quota)),
        tag: set.tag_of(i, values),
    })
}

/// Calls `f` with the key of every rule that applies to a request, in rule order: what a charge
/// (`charge.rs`) touches. Shadow rules included: they count as enforcing ones do.
pub(crate) fn each_rule_key(
    set: &RuleSet,
    values: &[Option<&str>],
    mut f: impl FnMut(&RuleKey<'_>),
) {
    for i in 0..set.rules.len() {
        let mut buf = KeyBuf::new();
        if let Some(at) = rule_key(set, i, values, &mut buf) {
            f(&at);
        }
    }
}

#[inline]
pub(crate) fn answer(
    set: &RuleSet,
    finished: Finished,
    shadow_denied: bool,
    next: Option<Duration>,
) -> Decided {
    let (deciding, decision, delay) = finished;
    let rule = deciding.map(|(i, quota)| (&set.rules[i], quota));
    let next = match decision {
        Decision::Denied { retry_after, .. } if rule.is_some() => Some(retry_after),
        _ => next,
    };
    (
        PolicyDecision {
            decision,
            rule: rule.map(|(r, _)| r.name),
            quota: rule.map(|(r, quota)| shown_quota(r, quota)),
            delay,
            shadow_denied,
        },
        next,
    )
}

/// Decides a request against an in-process store at `now`.
#[allow(clippy::too_many_arguments)]
#[inline]
pub(crate) fn decide<S: Store>(
    set: &RuleSet,
    store: &S,
    descriptors: &Descriptors<'_>,
    dry: bool,
    now: Nanos,
    cost: u64,
    outcomes: Option<&mut Vec<RuleOutcome>>,
    want_next: bool,
) -> Result<Decided, PolicyError> {
    with_values(set, descriptors, |values| {
        decide_values(set, store, values, dry, now, cost, outcomes, want_next)
    })
}

/// `f` of the request's values (`RuleSet::resolve`): on the stack (one slot per name, and the
/// unknown slot) for most rule sets.
#[inline(always)]
pub(crate) fn with_values<R>(
    set: &RuleSet,
    descriptors: &Descriptors<'_>,
    f: impl FnOnce(&[Option<&str>]) -> R,
) -> R {
    let mut stack = [None; 8];
    match stack.get_mut(..set.names.len() + 1) {
        Some(values) => {
            set.resolve_pairs_into(descriptors, values);
            f(values)
        }
        None => f(&set.resolve(descriptors)),
    }
}

/// [`decide`] for a request whose descriptors are resolved already (`RuleSet::resolve`,
/// `RuleSet::resolve_by`).
#[allow(clippy::too_many_arguments)]
#[inline]
pub(crate) fn decide_values<S: Store>(
    set: &RuleSet,
    store: &S,
    values: &[Option<&str>],
    dry: bool,
    now: Nanos,
    cost: u64,
    outcomes: Option<&mut Vec<RuleOutcome>>,
    want_next: bool,
) -> Result<Decided, PolicyError> {
    let mut tally = Tally::new();
    let error = pass(set, store, values, dry, now, cost, outcomes, &mut tally);
    if error.is_some() || tally.denying() {
        refund(set, store, values, &tally.admitted, now, cost);
    }
    match error {
        Some(error) => Err(error),
        None => Ok(conclude(set, store, values, &tally, now, want_next)),
    }
}

/// [`decide_values`] for a caller that expects a denial (its previous request was denied, as
/// in a flood): every rule is peeked first, in order. When an enforcing rule denies, or one can
/// never admit the cost, that pass is the answer, and nothing was written: no admission to make
/// and give back, no exchange on any rule's state. Otherwise the peeks are dropped and the request
/// is decided by [`decide_values`].
///
/// The answer is [`decide_values`]'s at the same state: its pass checks the rules up to the first
/// enforcing denial (a check decides as a peek does, and those admissions are given back) and
/// peeks the rest. Where a peek may decide otherwise than a check (a striped rule, priority
/// headroom: `RuleSet::peeks_decide`), the request goes to [`decide_values`] directly.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decide_values_peeking_first<S: Store>(
    set: &RuleSet,
    store: &S,
    values: &[Option<&str>],
    dry: bool,
    now: Nanos,
    cost: u64,
    mut outcomes: Option<&mut Vec<RuleOutcome>>,
    want_next: bool,
) -> Result<Decided, PolicyError> {
    if set.peeks_decide {
        let mut tally = Tally::<S::Receipt>::deferring();
        let mut error = None;
        // `pass` with every rule peeked, written out: through `pass` (a flag on the tally) the
        // replay ran about 5 % slower (84 instructions more per request), and inlining `pass`
        // always cost the plain decision (Pingora's) 31 instructions.
        for i in 0..set.rules.len() {
            let mut buf = KeyBuf::new();
            let Some(at) = rule_key(set, i, values, &mut buf) else {
                continue;
            };
            let enforced = set.rules[i].enforced(dry);
            let result = store.peek(&at, now, cost).map(|d| d.map(|d| (d, None)));
            let recorded =
                tally.record(set, i, &at, enforced, cost, result, outcomes.as_deref_mut());
            if let Err(e) = recorded {
                error = Some(e);
                break;
            }
        }
        if error.is_some() || tally.denying() {
            tally.count_deferred(set);
            return match error {
                Some(error) => Err(error),
                None => Ok(conclude(set, store, values, &tally, now, want_next)),
            };
        }
        // Admitted on every peek: not the answer, decided below.
        if let Some(outcomes) = outcomes.as_deref_mut() {
            outcomes.clear();
        }
    }
    decide_values(set, store, values, dry, now, cost, outcomes, want_next)
}

/// Decides several requests as one at `now` (the descriptors of one RLS call): each is decided
/// as [`decide`] does, in order, and when any is denied or cannot be decided, every admission of
/// every one of them is given back. Each keeps its own answer.
pub(crate) fn decide_all<S: Store>(
    set: &RuleSet,
    store: &S,
    requests: &[(&Descriptors<'_>, u64)],
    dry: bool,
    now: Nanos,
    want_next: bool,
) -> Vec<Result<Decided, PolicyError>> {
    let passes: Vec<_> = requests
        .iter()
        .map(|&(descriptors, cost)| {
            let values = set.resolve(descriptors);
            let mut tally = Tally::new();
            let error = pass(set, store, &values, dry, now, cost, None, &mut tally);
            (values, tally, error, cost)
        })
        .collect();
    let refused = passes
        .iter()
        .any(|(_, tally, error, _)| error.is_some() || tally.denying());
    if refused {
        for (values, tally, _, cost) in &passes {
            refund(set, store, values, &tally.admitted, now, *cost);
        }
    }
    passes
        .into_iter()
        .map(|(values, tally, error, _)| match error {
            Some(error) => Err(error),
            None => Ok(conclude(set, store, &values, &tally, now, want_next)),
        })
        .collect()
}

/// One request's pass over the rules into `tally`: every applicable rule checked (peeked after an
/// enforcing denial), or the error that stopped it. Nothing is given back here.
#[allow(clippy::too_many_arguments)]
#[inline]
fn pass<S: Store>(
    set: &RuleSet,
    store: &S,
    values: &[Option<&str>],
    dry: bool,
    now: Nanos,
    cost: u64,
    mut outcomes: Option<&mut Vec<RuleOutcome>>,
    tally: &mut Tally<S::Receipt>,
) -> Option<PolicyError> {
    for i in 0..set.rules.len() {
        let mut buf = KeyBuf::new();
        let Some(at) = rule_key(set, i, values, &mut buf) else {
            continue;
        };
        let enforced = set.rules[i].enforced(dry);
        let result = if tally.denying() {
            store.peek(&at, now, cost).map(|d| d.map(|d| (d, None)))
        } else {
            store
                .check(&at, now, cost)
                .map(|d| d.map(|(d, r)| (d, Some(r))))
        };
        let recorded = tally.record(set, i, &at, enforced, cost, result, outcomes.as_deref_mut());
        if let Err(error) = recorded {
            return Some(error);
        }
    }
    None
}

/// The answer of a finished pass, with the `RateLimit` field's `t` when asked for: worked out
/// from the admission (no second look at the state, no key rebuilt) except for a sliding window,
/// whose next unit the store looks up.
#[inline]
fn conclude<S: Store>(
    set: &RuleSet,
    store: &S,
    values: &[Option<&str>],
    tally: &Tally<S::Receipt>,
    now: Nanos,
    want_next: bool,
) -> Decided {
    let finished = tally.finish();
    let next = match finished {
        (Some((i, quota)), decision @ Decision::Allowed { .. }, _) if want_next => {
            match next_unit(set.rules[i].algorithm, &quota, &decision) {
                Some(known) => known,
                None => {
                    let mut buf = KeyBuf::new();
                    rule_key(set, i, values, &mut buf)
                        .and_then(|at| store.next_unit(&at, now, &decision))
                }
            }
        }
        _ => None,
    };
    answer(set, finished, tally.shadow_denied, next)
}

fn refund<S: Store>(
    set: &RuleSet,
    store: &S,
    values: &[Option<&str>],
    admitted: &[(usize, S::Receipt)],
    now: Nanos,
    cost: u64,
) {
    for &(i, receipt) in admitted {
        // A keyed rule's receipt names its slot: no key to build.
        if store.refund_by_receipt(i, now, cost, receipt) {
            continue;
        }
        let mut buf = KeyBuf::new();
        if let Some(at) = rule_key(set, i, values, &mut buf) {
            store.refund(&at, now, cost, receipt);
        }
    }
}
