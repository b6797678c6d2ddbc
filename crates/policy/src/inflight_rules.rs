//! The compiled concurrency rules of one rule set ([`InFlightSet`]): each rule's matching, key,
//! priority classes and permit table, built beside the rate rules and kept across a reload where a
//! rule's name, key and capacity stay. Taking permits is [`Policy::admit`](crate::Policy::admit)'s
//! (`inflight.rs`).

use std::sync::{Arc, Mutex};

use tollgate_core::{CheckError, Clock, Decision, InFlight, Nanos};
use tollgate_sharded::{KeyPermit, KeyedError, KeyedInFlight, KeyedLimiter};

use crate::config::{ConcurrencyConfig, MatchSpec, PolicyConfig};
use crate::config_error::{ConfigError, ConfigErrorKind};
use crate::decision::Descriptors;
use crate::descriptor_match::DescriptorMatch;
use crate::priority::Priority;
use crate::reload_plan::ReloadReport;
use crate::rules::{KeyBuf, intern};

/// A rule's table, whatever the policy's clock type.
pub(crate) trait Table: Send + Sync {
    /// A permit of `cost` units, leaving `reserve` free for higher priority classes (0: none).
    fn take(
        &self,
        key: &[u8],
        now: Nanos,
        cost: u64,
        reserve: u64,
    ) -> Result<Result<KeyPermit<'static>, Decision>, CheckError>;
    fn in_flight(&self, key: &[u8]) -> u64;
    fn set_algorithm(&self, algorithm: InFlight);
}

impl<C: Clock + 'static> Table for Arc<KeyedInFlight<[u8], C>> {
    fn take(
        &self,
        key: &[u8],
        now: Nanos,
        cost: u64,
        reserve: u64,
    ) -> Result<Result<KeyPermit<'static>, Decision>, CheckError> {
        // A reserve of 0 takes the plain path there.
        self.try_acquire_reserving_at(key, now, cost, reserve)
    }

    fn in_flight(&self, key: &[u8]) -> u64 {
        KeyedInFlight::in_flight(self, key)
    }

    fn set_algorithm(&self, algorithm: InFlight) {
        self.table().set_default(algorithm);
    }
}

/// One compiled concurrency rule.
pub(crate) struct InFlightRule {
    pub(crate) name: &'static str,
    pub(crate) config: ConcurrencyConfig,
    matches: Box<[(Box<str>, MatchSpec)]>,
    /// The class descriptor's name and the compiled classes (`None`: every request alike).
    priority: Option<(Box<str>, Priority)>,
    pub(crate) table: Arc<dyn Table>,
}

impl InFlightRule {
    /// Whether the rule applies, by the policy's descriptor matching.
    pub(crate) fn applies(&self, descriptors: &Descriptors<'_>, mode: DescriptorMatch) -> bool {
        let named = self
            .matches
            .iter()
            .all(|(name, spec)| value(descriptors, name).is_some_and(|value| spec.matches(value)));
        // Under exact matching the class descriptor counts as named (a request carrying a class
        // still reaches the rule).
        let class = self.priority.as_ref().map(|(name, _)| &**name);
        named
            && (mode == DescriptorMatch::Subset
                || descriptors.iter().all(|(name, _)| {
                    Some(*name) == class || self.matches.iter().any(|(n, _)| **n == **name)
                }))
    }

    /// Units of the limit this request must leave free, by its class.
    pub(crate) fn reserve(&self, descriptors: &Descriptors<'_>) -> u64 {
        self.priority.as_ref().map_or(0, |(name, priority)| {
            priority.reserve_of_class(value(descriptors, name), self.config.limit)
        })
    }

    /// The key bytes, encoded as a rate rule's (one value as is, several length-prefixed).
    pub(crate) fn key<'a>(
        &self,
        descriptors: &Descriptors<'a>,
        buf: &'a mut KeyBuf,
    ) -> Option<&'a [u8]> {
        match self.config.key.as_slice() {
            [] => Some(&[]),
            [one] => value(descriptors, one).map(str::as_bytes),
            many => {
                buf.clear();
                for name in many {
                    let value = value(descriptors, name)?;
                    let len = u32::try_from(value.len()).unwrap_or(u32::MAX);
                    buf.extend_from_slice(&len.to_le_bytes());
                    buf.extend_from_slice(value.as_bytes());
                }
                Some(&buf[..])
            }
        }
    }
}

/// A descriptor's first value.
fn value<'a>(descriptors: &Descriptors<'a>, name: &str) -> Option<&'a str> {
    descriptors
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, value)| *value)
}

/// The compiled concurrency rules of one rule set.
#[derive(Default)]
pub(crate) struct InFlightSet {
    pub(crate) rules: Box<[InFlightRule]>,
    pub(crate) descriptor_match: DescriptorMatch,
    /// Limit changes of kept tables, applied at the reload's commit (a prepared reload changes
    /// nothing live).
    pending: Mutex<Vec<(Arc<dyn Table>, InFlight)>>,
}

impl InFlightSet {
    /// Compiles `config`'s concurrency rules (validated), keeping `old`'s tables where a rule's
    /// name, key and capacity are unchanged; adds each rule to `report`.
    pub(crate) fn build<C: Clock + Clone + 'static>(
        config: &PolicyConfig,
        clock: &C,
        old: Option<&InFlightSet>,
        report: &mut ReloadReport,
    ) -> Result<InFlightSet, ConfigError> {
        let mut rules = Vec::with_capacity(config.concurrency.len());
        let mut pending = Vec::new();
        for rc in &config.concurrency {
            let name = intern(&rc.name);
            let algorithm = rc.algorithm()?;
            let kept = old.and_then(|old| {
                old.rules.iter().find(|r| {
                    r.name == name && r.config.key == rc.key && r.config.capacity == rc.capacity
                })
            });
            let table = match kept {
                Some(prev) => {
                    if prev.config.algorithm()? != algorithm {
                        pending.push((Arc::clone(&prev.table), algorithm));
                    }
                    report.kept.push(name);
                    Arc::clone(&prev.table)
                }
                None => {
                    let err = |e: KeyedError| {
                        let field = match e {
                            KeyedError::CapacityTooLarge { .. } | KeyedError::ZeroCapacity => {
                                "capacity"
                            }
                            _ => "limit",
                        };
                        ConfigError::new(Some(&rc.name), field, ConfigErrorKind::Keyed(e))
                    };
                    let table = KeyedLimiter::<[u8], InFlight, C>::builder_with_clock(
                        rc.quota()?,
                        rc.capacity.unwrap_or(1),
                        clock.clone(),
                    )
                    .build()
                    .map_err(err)?;
                    // The builder made the algorithm from the quota; the retry hint is the rule's.
                    table.set_default(algorithm);
                    report.fresh.push(name);
                    Arc::new(Arc::new(KeyedInFlight::from_table(table))) as Arc<dyn Table>
                }
            };
            let priority = rc.priority.as_ref().and_then(|p| {
                // The class is read by name here: no rule-set index is needed.
                Priority::compile(p, &mut |_| 0)
                    .map(|compiled| (p.descriptor.as_str().into(), compiled))
            });
            rules.push(InFlightRule {
                name,
                priority,
                config: rc.clone(),
                matches: rc
                    .matches
                    .iter()
                    .map(|(name, spec)| (name.as_str().into(), spec.clone()))
                    .collect(),
                table,
            });
        }
        if let Some(old) = old {
            report.removed.extend(
                old.rules
                    .iter()
                    .map(|r| r.name)
                    .filter(|name| !report.kept.contains(name)),
            );
        }
        Ok(InFlightSet {
            rules: rules.into_boxed_slice(),
            descriptor_match: config.descriptor_match.unwrap_or_default(),
            pending: Mutex::new(pending),
        })
    }

    /// Applies the limit changes of kept tables (at a reload's commit).
    pub(crate) fn commit(&self) {
        let pending = std::mem::take(
            &mut *self
                .pending
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        for (table, algorithm) in pending {
            table.set_algorithm(algorithm);
        }
    }
}
