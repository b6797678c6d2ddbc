//! Whether a rule's `match` must name every entry of a descriptor ([`DescriptorMatch`]).
//!
//! A rule's `match` says which descriptor entries must be present and how their values must look.
//! What it leaves open is the entries it does not name. An HTTP edge (tower, Pingora) builds one
//! descriptor list per request with every fact it knows, so a rule naming `remote_address` should
//! apply whatever else is there: [`DescriptorMatch::Subset`]. Envoy sends several descriptors per
//! call, one per `rate_limits` entry of the route, and its users write one limit per descriptor
//! shape (`remote_address` alone, `remote_address` + `path`): a rule naming only `remote_address`
//! applying to the `remote_address` + `path` descriptor too would count each request twice.
//! [`DescriptorMatch::Exact`] is that expectation: the descriptor has no entry the rule does not
//! name.

use serde::{Deserialize, Serialize};

/// How a rule's `match` is held against a descriptor's entries (`descriptor_match` in a
/// [`PolicyConfig`](crate::PolicyConfig)). Unset, a policy matches as
/// [`Subset`](DescriptorMatch::Subset); tollgate-server sets [`Exact`](DescriptorMatch::Exact) for
/// its domains unless their config says otherwise.
///
/// ```
/// use tollgate_core::ManualClock;
/// use tollgate_policy::{Policy, PolicyConfig};
///
/// let config = PolicyConfig::from_toml(r#"
///     descriptor_match = "exact"
///     [[rules]]
///     name = "per_ip"
///     match = { remote_address = "any" }
///     key = ["remote_address"]
///     limit = 1
///     period = "1m"
///     capacity = 100
/// "#)?;
/// let policy = Policy::with_clock(config, ManualClock::new())?;
/// // A descriptor with an entry `per_ip` does not name: no rule applies.
/// let with_path = [("remote_address", "192.0.2.1"), ("path", "/login")];
/// assert_eq!(policy.check(&with_path, 1)?.rule, None);
/// // Exactly `per_ip`'s shape: it applies.
/// assert_eq!(policy.check(&[("remote_address", "192.0.2.1")], 1)?.rule, Some("per_ip"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DescriptorMatch {
    /// A rule applies when the entries it names are present and match; other entries are ignored.
    #[default]
    Subset,
    /// As `Subset`, and the descriptor has no entry the rule does not name (a rule with an empty
    /// `match` then applies only to an empty descriptor list).
    Exact,
}

/// Whether a descriptor passes `mode`'s test for a rule whose `match` names the entries `named`
/// (by index into the rule set's names). `values` is the descriptor resolved against those names,
/// with one slot more at the end that is set when the descriptor has an entry no rule names.
#[inline]
pub(crate) fn admits<Spec>(
    mode: DescriptorMatch,
    named: &[(usize, Spec)],
    values: &[Option<&str>],
) -> bool {
    match mode {
        DescriptorMatch::Subset => true,
        DescriptorMatch::Exact => values
            .iter()
            .enumerate()
            .all(|(i, value)| value.is_none() || named.iter().any(|&(j, _)| j == i)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(indices: &[usize]) -> Vec<(usize, ())> {
        indices.iter().map(|&i| (i, ())).collect()
    }

    #[test]
    fn subset_ignores_entries_the_rule_does_not_name() {
        let values = [Some("192.0.2.1"), Some("/login"), Some("other")];
        assert!(admits(DescriptorMatch::Subset, &named(&[0]), &values));
        assert!(admits(DescriptorMatch::Subset, &named(&[]), &values));
    }

    #[test]
    fn exact_needs_every_present_entry_named() {
        // names: [remote_address, path], then the "unknown entry" slot.
        let ip_only = [Some("192.0.2.1"), None, None];
        let ip_and_path = [Some("192.0.2.1"), Some("/login"), None];
        let ip_and_unknown = [Some("192.0.2.1"), None, Some("x")];
        let per_ip = named(&[0]);
        let login = named(&[0, 1]);
        assert!(admits(DescriptorMatch::Exact, &per_ip, &ip_only));
        assert!(!admits(DescriptorMatch::Exact, &per_ip, &ip_and_path));
        assert!(admits(DescriptorMatch::Exact, &login, &ip_and_path));
        // `login` names more than `ip_only` has: this test passes it, the rule's own match fails it.
        assert!(admits(DescriptorMatch::Exact, &login, &ip_only));
        // An entry that no rule names at all is outside every rule.
        assert!(!admits(DescriptorMatch::Exact, &per_ip, &ip_and_unknown));
        assert!(!admits(DescriptorMatch::Exact, &login, &ip_and_unknown));
        // An empty match covers only an empty descriptor.
        assert!(!admits(DescriptorMatch::Exact, &named(&[]), &ip_only));
        assert!(admits(
            DescriptorMatch::Exact,
            &named(&[]),
            &[None, None, None]
        ));
    }

    #[test]
    fn a_policy_counts_a_descriptor_once_per_rule_shape_and_a_reload_switches_the_mode() {
        use crate::{Policy, PolicyConfig};
        use tollgate_core::{Decision, ManualClock};
        let rules = r#"
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
            key = ["remote_address"]
            limit = 20
            period = "1h"
            capacity = 10
        "#;
        let exact = PolicyConfig::from_toml(&format!("descriptor_match = \"exact\"\n{rules}"))
            .expect("config");
        let policy = Policy::with_clock(exact, ManualClock::new()).expect("policy");
        let ip = [("remote_address", "192.0.2.1")];
        let ip_path = [("remote_address", "192.0.2.1"), ("path", "/login")];
        let remaining = |d: &crate::PolicyDecision| match d.decision {
            Decision::Allowed { remaining, .. } => remaining,
            Decision::Denied { .. } => 0,
        };
        // Envoy's two descriptors of one request: per_ip counts the first, login the second.
        let first = policy.check(&ip, 1).expect("check");
        let second = policy.check(&ip_path, 1).expect("check");
        assert_eq!((first.rule, remaining(&first)), (Some("per_ip"), 9));
        assert_eq!((second.rule, remaining(&second)), (Some("login"), 19));
        // Subset (what unset means): per_ip applies to the second descriptor too, and is the
        // tighter of the two there.
        let subset = PolicyConfig::from_toml(rules).expect("config");
        assert_eq!(subset.descriptor_match, None);
        policy.reload(subset).expect("reload");
        let both = policy.check(&ip_path, 1).expect("check");
        assert_eq!((both.rule, remaining(&both)), (Some("per_ip"), 8));
    }
}
