//! [`DescriptorSchema`]: the descriptor names an edge can supply, in a fixed order, so that a
//! decision asks it only for the values its rule set uses.
//!
//! An HTTP edge knows the same names for every request (the client address, the route, the
//! method, some headers); building each value and then matching each name against the rule set's
//! names costs on every request, and some values (the client address's text) are dear. With a
//! schema the engine goes the other way: each schema position is resolved to one of the rule
//! set's names once per (schema, rule set) pair and thread, and the edge is asked only for the
//! values of positions a rule uses (under `descriptor_match = "exact"` every present descriptor
//! matters, and each is asked for).

use std::cell::Cell;

use crate::descriptor_match::DescriptorMatch;
use crate::rules::{RuleSet, Values, next_id};

/// The descriptor names an edge supplies, in its order: position `i` of a request's values is
/// name `i`. When a name occurs twice, the first position with a value counts (as the first pair
/// of a descriptor list does). A clone is the same schema (it shares the resolutions cached for
/// it).
///
/// ```
/// use tollgate_core::ManualClock;
/// use tollgate_policy::{DescriptorSchema, Policy, PolicyConfig};
///
/// let policy = Policy::with_clock(PolicyConfig::from_toml(r#"
///     [[rules]]
///     name = "per_key"
///     match = { api_key = "any" }
///     key = ["api_key"]
///     limit = 1
///     period = "1m"
///     capacity = 100
/// "#)?, ManualClock::new())?;
/// let schema = DescriptorSchema::new(["remote_address", "api_key"]);
/// // Only `api_key` (position 1) is asked for: no rule uses `remote_address`.
/// let value = |i: usize| {
///     assert_eq!(i, 1);
///     Some("k1")
/// };
/// let now = policy.now();
/// assert!(policy.check_next_by_at(&schema, value, now, 1)?.0.is_allowed());
/// assert!(!policy.check_next_by_at(&schema, value, now, 1)?.0.is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct DescriptorSchema {
    /// Unique per [`new`](Self::new) (see [`next_id`]).
    id: u64,
    names: Box<[Box<str>]>,
}

impl Default for DescriptorSchema {
    fn default() -> Self {
        Self::new::<&str>([])
    }
}

impl DescriptorSchema {
    /// A schema of these names, in this order.
    pub fn new<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Self {
        DescriptorSchema {
            id: next_id(),
            names: names.into_iter().map(|n| n.as_ref().into()).collect(),
        }
    }

    /// The names, in order.
    pub fn names(&self) -> impl ExactSizeIterator<Item = &str> {
        self.names.iter().map(|n| &**n)
    }
}

/// A schema resolved against a rule set, four bits per schema position (so for schemas of at
/// most [`PLAN_POSITIONS`] names and rule sets of at most [`PLAN_NAMES`] names): the rule set's
/// name index, [`UNKNOWN`] (a name no rule uses, under exact matching) or [`SKIP`].
type Plan = u64;
const PLAN_POSITIONS: usize = 16;
const PLAN_NAMES: usize = 14;
const UNKNOWN: u64 = 14;
const SKIP: u64 = 15;

/// Entries of each thread's table of plans (direct-mapped by the two identities).
const PLAN_SLOTS: usize = 8;

thread_local! {
    /// `(schema id, rule set id, plan)`; id 0 is never handed out, so an empty entry never hits.
    static PLANS: [Cell<(u64, u64, Plan)>; PLAN_SLOTS] =
        const { [const { Cell::new((0, 0, 0)) }; PLAN_SLOTS] };
}

impl RuleSet {
    /// Whether a descriptor no rule names keeps rules out (`descriptor_match = "exact"`).
    fn exact(&self) -> bool {
        self.rules
            .iter()
            .any(|r| r.descriptor_match == DescriptorMatch::Exact)
    }

    /// Where schema position `i`'s value goes: a name index, [`UNKNOWN`] or [`SKIP`].
    fn target(&self, schema: &DescriptorSchema, i: usize, exact: bool) -> u64 {
        let name = &schema.names[i];
        match self.names.iter().position(|n| *n == *name) {
            Some(j) => j as u64,
            None if exact => UNKNOWN,
            None => SKIP,
        }
    }

    /// `schema`'s plan against this rule set, from this thread's table or made now; `None` when
    /// the schema or the rule set is too large for one.
    #[inline]
    fn plan(&self, schema: &DescriptorSchema) -> Option<Plan> {
        if schema.names.len() > PLAN_POSITIONS || self.names.len() > PLAN_NAMES {
            return None;
        }
        let slot = (schema.id ^ self.id.rotate_left(3)) as usize % PLAN_SLOTS;
        let cached = PLANS
            .try_with(|plans| {
                let (s, r, plan) = plans[slot].get();
                (s == schema.id && r == self.id).then_some(plan)
            })
            .ok()
            .flatten();
        if cached.is_some() {
            return cached;
        }
        let exact = self.exact();
        let plan = (0..schema.names.len())
            .rev()
            .fold(0, |plan, i| plan << 4 | self.target(schema, i, exact));
        // `try_with`: during thread teardown the table is gone; the plan is made each time then.
        let _ = PLANS.try_with(|plans| plans[slot].set((schema.id, self.id, plan)));
        Some(plan)
    }

    /// Each of this rule set's descriptor names' value in one request described by `schema`
    /// (`value(i)`: position `i`'s value, `None` when absent), as [`resolve`](RuleSet::resolve)
    /// answers for the list of the present `(name, value)` pairs in schema order. Only the
    /// positions whose name a rule uses are asked for, except under `descriptor_match = "exact"`,
    /// where any present descriptor no rule names keeps a rule out.
    pub(crate) fn resolve_by<'a>(
        &self,
        schema: &DescriptorSchema,
        value: impl Fn(usize) -> Option<&'a str>,
    ) -> Values<'a> {
        let mut values: Values<'a> = smallvec::SmallVec::from_elem(None, self.names.len() + 1);
        self.resolve_into(schema, value, &mut values);
        values
    }

    /// [`resolve_by`](Self::resolve_by) into `values`: one slot per name and the unknown slot,
    /// all `None`.
    #[inline]
    pub(crate) fn resolve_into<'a>(
        &self,
        schema: &DescriptorSchema,
        value: impl Fn(usize) -> Option<&'a str>,
        values: &mut [Option<&'a str>],
    ) {
        let unknown = self.names.len();
        match self.plan(schema) {
            Some(mut plan) => {
                for i in 0..schema.names.len() {
                    let target = match plan & 0xF {
                        SKIP => None,
                        UNKNOWN => Some(unknown),
                        j => Some(j as usize),
                    };
                    plan >>= 4;
                    // Only whether the unknown slot is set is ever read (`descriptor_match`).
                    if let Some(slot) = target.and_then(|t| values.get_mut(t)) {
                        if slot.is_none() {
                            *slot = value(i);
                        }
                    }
                }
            }
            None => {
                let exact = self.exact();
                for i in 0..schema.names.len() {
                    let target = match self.target(schema, i, exact) {
                        SKIP => continue,
                        UNKNOWN => unknown,
                        j => j as usize,
                    };
                    if let Some(slot) = values.get_mut(target) {
                        if slot.is_none() {
                            *slot = value(i);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Policy, PolicyConfig};
    use tollgate_core::ManualClock;

    const RULES: &str = r#"
        [[rules]]
        name = "per_ip"
        match = { remote_address = "any" }
        key = ["remote_address"]
        limit = 10
        period = "1h"
        capacity = 10
        [[rules]]
        name = "login"
        match = { remote_address = "any", path = { prefix = "/login" } }
        key = ["remote_address", "path"]
        limit = 20
        period = "1h"
        capacity = 10
    "#;

    /// Every subset of a schema's values (with a repeated name), under both matching modes:
    /// `resolve_by` answers what `resolve` answers for the present pairs in schema order.
    #[test]
    fn resolving_by_schema_is_resolving_the_present_pairs() {
        let names = [
            "method",
            "remote_address",
            "path",
            "remote_address",
            "tenant",
        ];
        let given = ["GET", "192.0.2.1", "/login/x", "192.0.2.2", "acme"];
        // The second schema is too long for a cached plan (the fallback path); its extra names
        // are never present.
        let long = DescriptorSchema::new(names.iter().copied().chain(["extra"; 12]));
        for (schema, mode) in [
            (DescriptorSchema::new(names), ""),
            (
                DescriptorSchema::new(names),
                "descriptor_match = \"exact\"\n",
            ),
            (long.clone(), ""),
            (long, "descriptor_match = \"exact\"\n"),
        ] {
            let config = PolicyConfig::from_toml(&format!("{mode}{RULES}")).expect("config");
            let policy = Policy::with_clock(config, ManualClock::new()).expect("policy");
            let live = policy.live();
            for mask in 0u32..(1 << names.len()) {
                let value = |i: usize| (i < given.len() && mask & (1 << i) != 0).then(|| given[i]);
                let pairs: Vec<(&str, &str)> = (0..names.len())
                    .filter_map(|i| Some((names[i], value(i)?)))
                    .collect();
                let by_schema = live.rules.resolve_by(&schema, value);
                let by_pairs = live.rules.resolve(&pairs);
                let known = live.rules.names.len();
                assert_eq!(by_schema[..known], by_pairs[..known], "{mode} {mask:b}");
                if !mode.is_empty() {
                    assert_eq!(
                        by_schema[known].is_some(),
                        by_pairs[known].is_some(),
                        "{mode} {mask:b}"
                    );
                }
            }
        }
    }

    #[test]
    fn only_the_names_the_rules_use_are_asked_for_under_subset_matching() {
        let config = PolicyConfig::from_toml(RULES).expect("config");
        let policy = Policy::with_clock(config, ManualClock::new()).expect("policy");
        let schema = DescriptorSchema::new(["method", "remote_address", "path", "tenant"]);
        let asked = std::cell::RefCell::new(Vec::new());
        let value = |i: usize| {
            asked.borrow_mut().push(i);
            Some("x")
        };
        let decided = policy.check_next_by_at(&schema, value, policy.now(), 1);
        assert!(decided.expect("decided").0.is_allowed());
        let mut asked = asked.into_inner();
        asked.sort_unstable();
        asked.dedup();
        assert_eq!(asked, [1, 2], "`method` and `tenant` are never built");
    }

    #[test]
    fn a_reload_resolves_the_schema_again() {
        let config = PolicyConfig::from_toml(RULES).expect("config");
        let policy = Policy::with_clock(config, ManualClock::new()).expect("policy");
        let schema = DescriptorSchema::new(["method", "remote_address"]);
        let value = |i: usize| Some(["GET", "192.0.2.1"][i]);
        let now = policy.now();
        let (first, _) = policy
            .check_next_by_at(&schema, value, now, 1)
            .expect("check");
        assert_eq!(first.rule, Some("per_ip"));
        let per_method = r#"
            [[rules]]
            name = "per_method"
            match = { method = "any" }
            key = ["method"]
            limit = 1
            period = "1h"
            capacity = 10
        "#;
        policy
            .reload(PolicyConfig::from_toml(&format!("{RULES}{per_method}")).expect("config"))
            .expect("reload");
        let (second, _) = policy
            .check_next_by_at(&schema, value, now, 1)
            .expect("check");
        assert_eq!(second.rule, Some("per_method"), "`method` is asked for now");
        assert!(
            !policy
                .check_next_by_at(&schema, value, now, 1)
                .expect("check")
                .0
                .is_allowed()
        );
    }

    /// A rule set with more names than the stack holds decides as one with few.
    #[test]
    fn a_rule_set_of_many_names_decides_through_a_schema_as_through_pairs() {
        let rules: String = (0..9)
            .map(|i| {
                format!(
                    "[[rules]]\nname = \"r{i}\"\nmatch = {{ d{i} = \"any\" }}\nkey = [\"d{i}\"]\n\
                     limit = {}\nperiod = \"1h\"\ncapacity = 10\n",
                    20 - i
                )
            })
            .collect();
        let names: Vec<String> = (0..9).map(|i| format!("d{i}")).collect();
        let schema = DescriptorSchema::new(&names);
        let value = |i: usize| (i % 2 == 0).then_some("v");
        let pairs: Vec<(&str, &str)> = (0..9)
            .filter_map(|i| Some((names[i].as_str(), value(i)?)))
            .collect();
        let by_schema = Policy::with_clock(
            PolicyConfig::from_toml(&rules).expect("config"),
            ManualClock::new(),
        )
        .expect("policy");
        let by_pairs = Policy::with_clock(
            PolicyConfig::from_toml(&rules).expect("config"),
            ManualClock::new(),
        )
        .expect("policy");
        let now = by_schema.now();
        for _ in 0..14 {
            let a = by_schema
                .check_next_by_at(&schema, value, now, 1)
                .expect("check");
            let b = by_pairs.check_next_at(&pairs, now, 1).expect("check");
            assert_eq!(a, b);
        }
        assert_eq!(
            by_schema
                .check_next_by_at(&schema, value, now, 1)
                .expect("check")
                .0
                .rule,
            Some("r8"),
            "the tightest of the rules whose descriptor is present"
        );
    }
}
