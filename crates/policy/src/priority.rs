//! Priority classes: a rule keeps shares of each key's capacity for higher classes, so that a flood
//! of low-priority traffic cannot spend what critical traffic needs.
//!
//! ```toml
//! [[rules]]
//! name = "api"
//! match = { api_key = "any" }
//! key = ["api_key"]
//! limit = 100
//! period = "1s"
//! capacity = 10000
//! # The class comes from the `priority` descriptor; highest first.
//! priority = { descriptor = "priority", classes = ["critical", "normal", "batch"], reserve = { critical = "20%", normal = "10%" } }
//! ```
//!
//! A share reserved for a class may be spent only by that class and the classes above it. So a
//! request of class `c` is admitted only if, after it, the key would still have the shares of all
//! classes above `c` left ([`tollgate_core::Algorithm::decide_reserving`], in the same
//! compare-and-swap as a plain check; a denial writes nothing). Above, `critical` may spend
//! everything, `normal` must leave 20 % of the burst, `batch` (and a request with no `priority`
//! descriptor, or a value not listed) must leave 30 %.
//!
//! **Shedding order**: the lowest class first. As a key fills up, requests with no class or an
//! unknown one and the last listed class are refused first (once what is left falls to the sum of
//! all shares), then each class in turn up the list (once what is left falls to the shares of the
//! classes above it), and the highest class only when the key is spent. A class listed without a
//! share reserves nothing for itself but keeps its place in the order.
//!
//! Shares are of the key's capacity (its override's, when it has one): the burst for `gcra` and
//! `leaky_bucket` (a delayed rule's extra depth included), the limit per window for the window
//! algorithms; the units kept back round up. The class value is trusted as given: the edge must
//! set the descriptor from facts the client cannot forge (an authenticated route, a service
//! identity), or any client can claim `critical`.
//!
//! Where the headroom is applied: a rule's check (the admission itself). A rule only peeked because
//! an earlier rule already denied the request reports its plain wait, without the headroom; the
//! request is denied either way.
//!
//! In-process storages only: the keyed table and the atomic global slot. Striped rules (per-core
//! leases) and Redis stores refuse a `priority` ([`PriorityError::Storage`]). A concurrency rule
//! (`[[concurrency]]`) takes the same `priority`, its shares being of the rule's `limit` (permits
//! in flight): a lower class is refused while the permits left are the shares above it.

use std::fmt;

use tollgate_core::Quota;

use crate::config::{AlgorithmKind, MatchSpec, PriorityConfig, Storage};
use crate::descriptor_match::DescriptorMatch;

/// Why a rule's `priority` was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PriorityError {
    /// A share that is not a percentage above 0 and below 100 (`"20%"`).
    Share {
        /// The class.
        class: String,
        /// What was written.
        share: String,
    },
    /// The shares add up to 100 % or more: the lowest class could never be admitted.
    TotalTooLarge,
    /// `reserve` is empty.
    NoReserve,
    /// `reserve` names a class that `classes` does not list.
    UnknownClass(String),
    /// `reserve` names several classes but `classes` does not order them.
    NeedsClasses,
    /// A class listed twice.
    DuplicateClass(String),
    /// A storage that cannot keep headroom: striped rules, Redis stores.
    Storage,
}

impl fmt::Display for PriorityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PriorityError::Share { class, share } => write!(
                f,
                "share `{share}` for class `{class}`: write a percentage above 0 and below 100, \
                 such as \"20%\""
            ),
            PriorityError::TotalTooLarge => {
                f.write_str("the reserved shares add up to 100 % or more")
            }
            PriorityError::NoReserve => f.write_str("`reserve` names no class"),
            PriorityError::UnknownClass(class) => {
                write!(
                    f,
                    "`reserve` names `{class}`, which `classes` does not list"
                )
            }
            PriorityError::NeedsClasses => f.write_str(
                "`reserve` names several classes: list them in `classes`, highest first",
            ),
            PriorityError::DuplicateClass(class) => {
                write!(f, "class `{class}` is listed twice")
            }
            PriorityError::Storage => f.write_str(
                "reserved shares need in-process atomic or keyed storage (not striped, not redis)",
            ),
        }
    }
}

impl std::error::Error for PriorityError {}

/// Parts per million of a share written `"20%"` or `"12.5%"`, if it is above 0 and below 100 %.
fn parse_share(share: &str) -> Option<u32> {
    let number: f64 = share.trim().strip_suffix('%')?.trim().parse().ok()?;
    (number.is_finite() && number > 0.0 && number < 100.0)
        .then(|| (number * 10_000.0).round() as u32)
}

/// The classes in order, highest first, each with the headroom (ppm of capacity) it must leave;
/// and the headroom of every other value.
fn resolve(config: &PriorityConfig) -> Result<(Vec<(String, u32)>, u32), PriorityError> {
    if config.reserve.is_empty() {
        return Err(PriorityError::NoReserve);
    }
    let order: Vec<String> = if config.classes.is_empty() {
        if config.reserve.len() > 1 {
            return Err(PriorityError::NeedsClasses);
        }
        config.reserve.keys().cloned().collect()
    } else {
        config.classes.clone()
    };
    for (i, class) in order.iter().enumerate() {
        if order[..i].contains(class) {
            return Err(PriorityError::DuplicateClass(class.clone()));
        }
    }
    if let Some(class) = config.reserve.keys().find(|c| !order.contains(c)) {
        return Err(PriorityError::UnknownClass(class.clone()));
    }
    let mut above = 0u32;
    let mut classes = Vec::with_capacity(order.len());
    for class in order {
        classes.push((class.clone(), above));
        if let Some(share) = config.reserve.get(&class) {
            let ppm = parse_share(share).ok_or_else(|| PriorityError::Share {
                class: class.clone(),
                share: share.clone(),
            })?;
            above += ppm;
        }
    }
    if above >= 1_000_000 {
        return Err(PriorityError::TotalTooLarge);
    }
    Ok((classes, above))
}

/// Checks a rule's `priority` for a store (`in_process`: a `Policy`; otherwise Redis).
pub(crate) fn validate(
    config: &PriorityConfig,
    storage: Storage,
    in_process: bool,
) -> Result<(), PriorityError> {
    if !in_process || storage == Storage::Striped {
        return Err(PriorityError::Storage);
    }
    resolve(config).map(drop)
}

/// A rule's compiled priority classes.
#[derive(Clone, Debug)]
pub(crate) struct Priority {
    /// The class descriptor's index in the rule set's names.
    descriptor: usize,
    /// Each class, highest first, with the headroom (ppm of capacity) it must leave.
    classes: Box<[(Box<str>, u32)]>,
    /// The headroom of a request with no class or an unlisted one.
    lowest: u32,
}

impl Priority {
    /// Compiles a validated config; `index_of` numbers descriptor names.
    pub(crate) fn compile(
        config: &PriorityConfig,
        index_of: &mut impl FnMut(&str) -> usize,
    ) -> Option<Priority> {
        let (classes, lowest) = resolve(config).ok()?;
        Some(Priority {
            descriptor: index_of(&config.descriptor),
            classes: classes
                .into_iter()
                .map(|(class, ppm)| (class.into_boxed_str(), ppm))
                .collect(),
            lowest,
        })
    }

    /// Units of `quota` this request must leave, by its class.
    #[inline]
    pub(crate) fn reserve(
        &self,
        values: &[Option<&str>],
        algorithm: AlgorithmKind,
        quota: &Quota,
    ) -> u64 {
        let class = values.get(self.descriptor).copied().flatten();
        let capacity = if algorithm.is_bucket() {
            quota.burst()
        } else {
            quota.limit()
        };
        self.reserve_of_class(class, capacity)
    }

    /// Units of `capacity` a request of `class` (`None`: no class) must leave.
    #[inline]
    pub(crate) fn reserve_of_class(&self, class: Option<&str>, capacity: u64) -> u64 {
        let ppm = class
            .and_then(|class| self.classes.iter().find(|(c, _)| **c == *class))
            .map_or(self.lowest, |&(_, ppm)| ppm);
        if ppm == 0 {
            return 0;
        }
        // Rounded up: at least the share is kept.
        let units = (u128::from(capacity) * u128::from(ppm)).div_ceil(1_000_000);
        u64::try_from(units).unwrap_or(u64::MAX)
    }

    /// `descriptor_match::admits` with the class descriptor counted as named by the rule, so that
    /// under `"exact"` matching a request carrying a class still reaches it.
    #[inline]
    pub(crate) fn admits(
        &self,
        mode: DescriptorMatch,
        named: &[(usize, MatchSpec)],
        values: &[Option<&str>],
    ) -> bool {
        match mode {
            DescriptorMatch::Subset => true,
            DescriptorMatch::Exact => values.iter().enumerate().all(|(i, value)| {
                value.is_none() || i == self.descriptor || named.iter().any(|&(j, _)| j == i)
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(classes: &[&str], reserve: &[(&str, &str)]) -> PriorityConfig {
        PriorityConfig {
            descriptor: "priority".to_owned(),
            classes: classes.iter().map(|c| (*c).to_owned()).collect(),
            reserve: reserve
                .iter()
                .map(|(c, s)| ((*c).to_owned(), (*s).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn headroom_is_the_sum_of_the_shares_above() {
        let (classes, lowest) = resolve(&config(
            &["critical", "normal", "batch"],
            &[("critical", "20%"), ("normal", "12.5%")],
        ))
        .unwrap();
        assert_eq!(
            classes,
            vec![
                ("critical".to_owned(), 0),
                ("normal".to_owned(), 200_000),
                ("batch".to_owned(), 325_000)
            ]
        );
        assert_eq!(lowest, 325_000);
        let (classes, lowest) = resolve(&config(&[], &[("critical", "20%")])).unwrap();
        assert_eq!(classes, vec![("critical".to_owned(), 0)]);
        assert_eq!(lowest, 200_000);
    }

    #[test]
    fn bad_priorities_are_typed_errors() {
        let bad = |classes: &[&str], reserve: &[(&str, &str)]| {
            resolve(&config(classes, reserve)).unwrap_err()
        };
        for share in ["20", "0%", "100%", "-5%", "x%", "NaN%"] {
            assert!(matches!(
                bad(&[], &[("critical", share)]),
                PriorityError::Share { .. }
            ));
        }
        assert_eq!(bad(&[], &[]), PriorityError::NoReserve);
        assert_eq!(
            bad(&[], &[("a", "10%"), ("b", "10%")]),
            PriorityError::NeedsClasses
        );
        assert_eq!(
            bad(&["a"], &[("b", "10%")]),
            PriorityError::UnknownClass("b".into())
        );
        assert_eq!(
            bad(&["a", "a"], &[("a", "10%")]),
            PriorityError::DuplicateClass("a".into())
        );
        assert_eq!(
            bad(&["a", "b"], &[("a", "60%"), ("b", "40%")]),
            PriorityError::TotalTooLarge
        );
        let fine = config(&[], &[("critical", "20%")]);
        assert_eq!(
            validate(&fine, Storage::Striped, true),
            Err(PriorityError::Storage)
        );
        assert_eq!(
            validate(&fine, Storage::Atomic, false),
            Err(PriorityError::Storage)
        );
        assert_eq!(validate(&fine, Storage::Atomic, true), Ok(()));
    }
}
