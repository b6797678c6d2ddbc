//! The decision of [`engine`](crate::engine) against a store behind a round trip (Redis): the same
//! tally and semantics, each rule one round trip or, where the store decides a batch atomically,
//! a request (or a group of them) in one.

use smallvec::SmallVec;
use tollgate_core::{CheckError, Decision, Nanos};

use crate::decision::{Descriptors, PolicyError};
use crate::engine::{Decided, Tally, answer, each_rule_key, rule_key};
use crate::rules::{KeyBuf, RuleSet};
use crate::store::{AsyncStore, RuleKey};

/// Decides a request against a store behind a round trip (the store's clock). The same semantics
/// as [`decide`]: one rule at a time, the admissions given back on a denial.
pub(crate) async fn decide_async<S: AsyncStore>(
    set: &RuleSet,
    store: &S,
    descriptors: &Descriptors<'_>,
    dry: bool,
    now: Option<Nanos>,
    cost: u64,
) -> Result<Decided, PolicyError> {
    let values = set.resolve(descriptors);
    let (tally, error) = pass_async(set, store, &values, dry, now, cost).await;
    if error.is_some() || tally.denying() {
        refund_async(set, store, &values, &tally.admitted, now, cost).await;
    }
    match error {
        Some(error) => Err(error),
        None => Ok(conclude_async(set, store, &tally)),
    }
}

/// [`decide_all`] against a store behind a round trip.
pub(crate) async fn decide_all_async<S: AsyncStore>(
    set: &RuleSet,
    store: &S,
    requests: &[(&Descriptors<'_>, u64)],
    dry: bool,
    now: Option<Nanos>,
) -> Vec<Result<Decided, PolicyError>> {
    // Boxed, as in `pass_async`.
    if store.batches() {
        if let Some(decided) = Box::pin(decide_all_batch(set, store, requests, dry, now)).await {
            return decided;
        }
    }
    let mut passes = Vec::with_capacity(requests.len());
    for &(descriptors, cost) in requests {
        let values = set.resolve(descriptors);
        let (tally, error) = pass_async(set, store, &values, dry, now, cost).await;
        passes.push((values, tally, error, cost));
    }
    let refused = passes
        .iter()
        .any(|(_, tally, error, _)| error.is_some() || tally.denying());
    if refused {
        for (values, tally, _, cost) in &passes {
            refund_async(set, store, values, &tally.admitted, now, *cost).await;
        }
    }
    passes
        .into_iter()
        .map(|(_, tally, error, _)| match error {
            Some(error) => Err(error),
            None => Ok(conclude_async(set, store, &tally)),
        })
        .collect()
}

/// [`decide_all_async`] in one atomic batch, when the store has one: every rule of every request
/// in one round trip, written only when every enforcing rule of every request admits, so a refused
/// group needs no refund; for a store that [`batches`](AsyncStore::batches) (the caller asks).
/// `None` (decided request by request instead) for requests of different costs (a batch has one
/// cost), for a rule and key two requests share (the second must see the first's admission), and
/// for a cost a rule can never admit (each request then gets its own answer or error).
async fn decide_all_batch<S: AsyncStore>(
    set: &RuleSet,
    store: &S,
    requests: &[(&Descriptors<'_>, u64)],
    dry: bool,
    now: Option<Nanos>,
) -> Option<Vec<Result<Decided, PolicyError>>>
where
    S::Receipt: Default,
{
    let &(_, cost) = requests.first()?;
    if requests.len() < 2 || requests.iter().any(|&(_, c)| c != cost) {
        return None;
    }
    let values: SmallVec<[_; 4]> = requests.iter().map(|(d, _)| set.resolve(d)).collect();
    let tallies = batch(set, store, &values, dry, now, cost).await?.ok()?;
    Some(
        tallies
            .iter()
            .map(|tally| Ok(conclude_async(set, store, tally)))
            .collect(),
    )
}

/// Every rule of every request (`values`: each request's resolved descriptors) in one atomic
/// batch, each request's outcomes in its own tally, for a store that
/// [`batches`](AsyncStore::batches) (its callers ask first); `None` when the store has no batch
/// call after all or two requests share a rule and key. `Err((request, error))`: a cost a rule of
/// that request can never admit (nothing was decided).
async fn batch<'v, S: AsyncStore, V: AsRef<[Option<&'v str>]>>(
    set: &RuleSet,
    store: &S,
    values: &[V],
    dry: bool,
    now: Option<Nanos>,
    cost: u64,
) -> Option<Result<SmallVec<[Tally<S::Receipt>; 4]>, (usize, PolicyError)>>
where
    S::Receipt: Default,
{
    // (request, rule, key) for every rule that applies to each request.
    let mut keys: SmallVec<[(usize, usize, KeyBuf); 8]> = SmallVec::new();
    for (r, v) in values.iter().enumerate() {
        each_rule_key(set, v.as_ref(), |at| {
            keys.push((r, at.index, KeyBuf::from_slice(at.key)));
        });
    }
    let shared = keys.iter().enumerate().any(|(a, (_, i, key))| {
        keys[a + 1..]
            .iter()
            .any(|(_, j, other)| i == j && key == other)
    });
    if shared {
        return None;
    }
    let rules: SmallVec<[(RuleKey<'_>, bool); 8]> = keys
        .iter()
        .filter_map(|(r, i, key)| {
            let at = rule_key_of(set, *i, key, values[*r].as_ref())?;
            Some((at, set.rules[*i].enforced(dry)))
        })
        .collect();
    let answers = match store.check_batch(&rules, now, cost).await? {
        Ok(answers) => answers,
        Err((k, error)) => {
            let capacity = match error {
                CheckError::CostExceedsCapacity { capacity, .. } => capacity,
                _ => 0,
            };
            let error = PolicyError::CostExceedsCapacity {
                rule: set.rules[rules[k].0.index].name,
                cost,
                capacity,
            };
            return Some(Err((keys[k].0, error)));
        }
    };
    let committed = rules
        .iter()
        .zip(&answers)
        .all(|((_, enforced), answer)| !enforced || answer.is_none_or(|d| d.is_allowed()));
    let mut tallies: SmallVec<[Tally<S::Receipt>; 4]> =
        values.iter().map(|_| Tally::new()).collect();
    for (((at, enforced), answer), (r, _, _)) in rules.iter().zip(answers).zip(&keys) {
        let receipt = committed.then(S::Receipt::default);
        let result = Ok(answer.map(|d| (d, receipt)));
        // An answer, not an error: recording it cannot fail.
        if let Err(error) = tallies[*r].record(set, at.index, at, *enforced, cost, result, None) {
            return Some(Err((*r, error)));
        }
    }
    Some(Ok(tallies))
}

/// [`pass`] against a store behind a round trip: one round trip for the whole request where the
/// store decides a batch atomically, else one per applicable rule.
async fn pass_async<S: AsyncStore>(
    set: &RuleSet,
    store: &S,
    values: &[Option<&str>],
    dry: bool,
    now: Option<Nanos>,
    cost: u64,
) -> (Tally<S::Receipt>, Option<PolicyError>) {
    // Boxed: a batch is a round trip, and its future (keys, script call) is most of this one's
    // size, which a rule-by-rule pass on local leases would otherwise carry and move.
    if store.batches() {
        if let Some(passed) = Box::pin(pass_batch(set, store, values, dry, now, cost)).await {
            return passed;
        }
    }
    let mut tally: Tally<S::Receipt> = Tally::new();
    for i in 0..set.rules.len() {
        let mut buf = KeyBuf::new();
        let Some(at) = rule_key(set, i, values, &mut buf) else {
            continue;
        };
        let enforced = set.rules[i].enforced(dry);
        let result = if tally.denying() {
            store
                .peek(&at, now, cost)
                .await
                .map(|d| d.map(|d| (d, None)))
        } else {
            store
                .check(&at, now, cost)
                .await
                .map(|d| d.map(|(d, r)| (d, Some(r))))
        };
        if let Err(error) = tally.record(set, i, &at, enforced, cost, result, None) {
            return (tally, Some(error));
        }
    }
    (tally, None)
}

/// One request's rules in one atomic batch, when the store has one (`None` otherwise). The
/// script writes only when every enforcing rule admits, so a denial needs no refund; an admitted
/// request's admissions are listed (for a group that is refused later).
async fn pass_batch<S: AsyncStore>(
    set: &RuleSet,
    store: &S,
    values: &[Option<&str>],
    dry: bool,
    now: Option<Nanos>,
    cost: u64,
) -> Option<(Tally<S::Receipt>, Option<PolicyError>)>
where
    S::Receipt: Default,
{
    Some(match batch(set, store, &[values], dry, now, cost).await? {
        Ok(mut tallies) => (tallies.swap_remove(0), None),
        Err((_, error)) => (Tally::new(), Some(error)),
    })
}

/// Rule `i`'s [`RuleKey`] for key bytes built earlier.
pub(crate) fn rule_key_of<'a>(
    set: &RuleSet,
    i: usize,
    key: &'a [u8],
    values: &[Option<&'a str>],
) -> Option<RuleKey<'a>> {
    let rule = &set.rules[i];
    Some(RuleKey {
        index: i,
        rule: rule.name,
        algorithm: rule.algorithm,
        quota: rule.effective_for(key),
        key,
        composite: rule.key.len() > 1,
        // Redis stores refuse priorities (validation).
        reserve: 0,
        tag: set.tag_of(i, values),
    })
}

/// [`conclude`] for a store behind a round trip: `t` from the admission alone (the deciding
/// rule's limiter found by the quota the tally kept: no key built again).
fn conclude_async<S: AsyncStore>(set: &RuleSet, store: &S, tally: &Tally<S::Receipt>) -> Decided {
    let finished = tally.finish();
    let next = match finished {
        (Some((i, quota)), decision @ Decision::Allowed { .. }, _) => {
            store.next_unit(i, &quota, &decision)
        }
        _ => None,
    };
    answer(set, finished, tally.shadow_denied, next)
}

async fn refund_async<S: AsyncStore>(
    set: &RuleSet,
    store: &S,
    values: &[Option<&str>],
    admitted: &[(usize, S::Receipt)],
    now: Option<Nanos>,
    cost: u64,
) {
    for &(i, receipt) in admitted {
        let mut buf = KeyBuf::new();
        if let Some(at) = rule_key(set, i, values, &mut buf) {
            store.refund(&at, now, cost, receipt).await;
        }
    }
}
