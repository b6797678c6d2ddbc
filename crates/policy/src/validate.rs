//! The one validation of a [`PolicyConfig`]: every check that needs no limiter built, over the
//! rate rules, their overrides and the concurrency rules, and what it works out per rule
//! ([`Validated`]) for compiling them.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tollgate_core::{InFlight, Quota, QuotaError};

use crate::config::{
    AlgorithmKind, ConcurrencyConfig, DelayConfig, MAX_CAPACITY, PolicyConfig, Storage,
};
use crate::config_error::{ConfigError, ConfigErrorKind};

impl PolicyConfig {
    /// Checks everything that can be checked without building limiters; building checks the rest
    /// (table sizes, override placement). [`Policy::new`](crate::Policy::new) and
    /// [`reload`](crate::Policy::reload) call it.
    ///
    /// # Errors
    /// The first problem found, naming the rule and field.
    pub fn validate(&self) -> Result<Validated, ConfigError> {
        self.validate_with(true)
    }

    /// [`validate`](Self::validate) for a store that keeps no in-process tables
    /// ([`RedisPolicy`](crate::RedisPolicy)): keyed rules need no `capacity`, and one given is
    /// ignored.
    ///
    /// # Errors
    /// As [`validate`](Self::validate).
    #[cfg(feature = "redis")]
    pub fn validate_shared(&self) -> Result<Validated, ConfigError> {
        self.validate_with(false)
    }

    fn validate_with(&self, in_process: bool) -> Result<Validated, ConfigError> {
        let mut names = HashSet::new();
        let mut rules = Vec::with_capacity(self.rules.len());
        for rule in &self.rules {
            let name = Some(rule.name.as_str());
            if !names.insert(rule.name.as_str()) {
                return Err(ConfigError::new(
                    name,
                    "name",
                    ConfigErrorKind::DuplicateName,
                ));
            }
            let algorithm = AlgorithmKind::parse(&rule.algorithm).ok_or_else(|| {
                ConfigError::new(
                    name,
                    "algorithm",
                    ConfigErrorKind::UnknownAlgorithm(rule.algorithm.clone()),
                )
            })?;
            for key in &rule.key {
                if !rule.matches.contains_key(key) {
                    return Err(ConfigError::new(
                        name,
                        "key",
                        ConfigErrorKind::KeyNotMatched(key.clone()),
                    ));
                }
            }
            let keyed = !rule.key.is_empty();
            if in_process && keyed != rule.capacity.is_some() {
                return Err(ConfigError::new(
                    name,
                    "capacity",
                    ConfigErrorKind::Capacity,
                ));
            }
            capacity_at_most_max(name, rule.capacity)?;
            if rule.storage == Storage::Striped && (keyed || algorithm != AlgorithmKind::Gcra) {
                return Err(ConfigError::new(name, "storage", ConfigErrorKind::Storage));
            }
            if rule.delay.is_some() && !algorithm.is_bucket() {
                return Err(ConfigError::new(name, "delay", ConfigErrorKind::Delay));
            }
            if let Some(priority) = &rule.priority {
                crate::priority::validate(priority, rule.storage, in_process).map_err(|e| {
                    ConfigError::new(name, "priority", ConfigErrorKind::Priority(e))
                })?;
            }
            let quota = quota(name, rule.limit, rule.period, rule.burst)?;
            let quota = with_delay(name, quota, rule.delay)?;
            check_algorithm(name, "limit", algorithm, quota)?;
            rules.push(ValidRule {
                algorithm,
                quota,
                overrides: Vec::new(),
            });
        }
        let index: HashMap<&str, usize> = self
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| (r.name.as_str(), i))
            .collect();
        for o in &self.overrides {
            let name = Some(o.rule.as_str());
            let Some(&i) = index.get(o.rule.as_str()) else {
                return Err(ConfigError::new(
                    name,
                    "overrides",
                    ConfigErrorKind::UnknownRule,
                ));
            };
            let rule = &self.rules[i];
            if rule.key.len() != 1 {
                return Err(ConfigError::new(
                    name,
                    "overrides",
                    ConfigErrorKind::OverrideNeedsSingleKey,
                ));
            }
            if rule.delay.is_some() {
                // A delayed rule's waits are worked out from its one quota.
                return Err(ConfigError::new(name, "overrides", ConfigErrorKind::Delay));
            }
            let quota = quota(name, o.limit, o.period, o.burst)?;
            check_algorithm(name, "overrides", rules[i].algorithm, quota)?;
            for value in &o.values {
                if rules[i].overrides.iter().any(|(v, _)| v == value) {
                    return Err(ConfigError::new(
                        name,
                        "overrides",
                        ConfigErrorKind::DuplicateOverride(value.clone()),
                    ));
                }
                rules[i].overrides.push((value.clone(), quota));
            }
        }
        validate_concurrency(self, in_process)?;
        Ok(Validated { rules })
    }
}

/// Checks a policy's concurrency rules (names unique among all rules, keys matched, capacities,
/// limits). `in_process: false` (a store with no in-process tables) refuses any.
fn validate_concurrency(config: &PolicyConfig, in_process: bool) -> Result<(), ConfigError> {
    let mut names: HashSet<&str> = config.rules.iter().map(|r| r.name.as_str()).collect();
    for rule in &config.concurrency {
        let name = Some(rule.name.as_str());
        if !in_process {
            return Err(ConfigError::new(
                name,
                "concurrency",
                ConfigErrorKind::ConcurrencyUnsupported,
            ));
        }
        if !names.insert(rule.name.as_str()) {
            return Err(ConfigError::new(
                name,
                "name",
                ConfigErrorKind::DuplicateName,
            ));
        }
        if let Some(key) = rule.key.iter().find(|k| !rule.matches.contains_key(*k)) {
            return Err(ConfigError::new(
                name,
                "key",
                ConfigErrorKind::KeyNotMatched(key.clone()),
            ));
        }
        if rule.key.is_empty() != rule.capacity.is_none() {
            return Err(ConfigError::new(
                name,
                "capacity",
                ConfigErrorKind::Capacity,
            ));
        }
        capacity_at_most_max(name, rule.capacity)?;
        rule.algorithm()?;
        if let Some(priority) = &rule.priority {
            crate::priority::validate(priority, Storage::Atomic, true)
                .map_err(|e| ConfigError::new(name, "priority", ConfigErrorKind::Priority(e)))?;
        }
    }
    Ok(())
}

impl ConcurrencyConfig {
    /// The in-flight algorithm the rule's `limit`, `max_hold` and `retry_after` make.
    pub(crate) fn algorithm(&self) -> Result<InFlight, ConfigError> {
        let name = Some(self.name.as_str());
        let field = |e| match e {
            QuotaError::ZeroPeriod | QuotaError::PeriodTooLong => "max_hold",
            _ => "limit",
        };
        let algorithm = InFlight::new(self.limit, self.max_hold)
            .map_err(|e| ConfigError::new(name, field(e), ConfigErrorKind::Quota(e)))?;
        Ok(match self.retry_after {
            Some(retry) => algorithm.with_retry_after(retry),
            None => algorithm,
        })
    }

    /// The quota of [`algorithm`](Self::algorithm).
    pub(crate) fn quota(&self) -> Result<Quota, ConfigError> {
        self.algorithm()
            .map(|a| *tollgate_core::Algorithm::quota(&a))
    }
}

/// What validation worked out per rule, in config order: the algorithm, the effective quota (with a
/// delay's extra depth) and the override quotas by key value. Compiling the rules reads it.
#[derive(Clone, Debug)]
pub struct Validated {
    pub(crate) rules: Vec<ValidRule>,
}

#[derive(Clone, Debug)]
pub(crate) struct ValidRule {
    pub algorithm: AlgorithmKind,
    pub quota: Quota,
    pub overrides: Vec<(String, Quota)>,
}

fn quota(
    rule: Option<&str>,
    limit: u64,
    period: Duration,
    burst: Option<u64>,
) -> Result<Quota, ConfigError> {
    let q = Quota::per(period, limit)
        .map_err(|e| ConfigError::new(rule, field_of(e), ConfigErrorKind::Quota(e)))?;
    match burst {
        Some(burst) => q
            .with_burst(burst)
            .map_err(|e| ConfigError::new(rule, "burst", ConfigErrorKind::Quota(e))),
        None => Ok(q),
    }
}

fn field_of(error: QuotaError) -> &'static str {
    match error {
        QuotaError::ZeroPeriod | QuotaError::PeriodTooLong => "period",
        QuotaError::ZeroBurst | QuotaError::BurstTooLarge => "burst",
        _ => "limit",
    }
}

/// The quota a delayed rule runs: the burst extended by the units that fit in `max_delay`.
fn with_delay(
    rule: Option<&str>,
    quota: Quota,
    delay: Option<DelayConfig>,
) -> Result<Quota, ConfigError> {
    let Some(delay) = delay else {
        return Ok(quota);
    };
    let extra = delay_units(&quota, delay.max_delay);
    quota
        .burst()
        .checked_add(extra)
        .and_then(|burst| quota.with_burst(burst).ok())
        .ok_or_else(|| ConfigError::new(rule, "delay", ConfigErrorKind::Delay))
}

/// Units of a quota that fit in `max_delay` (rounded down: never more waiting than configured).
pub(crate) fn delay_units(quota: &Quota, max_delay: Duration) -> u64 {
    let nanos = u64::try_from(max_delay.as_nanos()).unwrap_or(u64::MAX);
    nanos / quota.emission_interval_nanos()
}

fn check_algorithm(
    rule: Option<&str>,
    field: &'static str,
    algorithm: AlgorithmKind,
    quota: Quota,
) -> Result<(), ConfigError> {
    use tollgate_core::{Algorithm, FixedWindow, SlidingWindow};
    let result = match algorithm {
        AlgorithmKind::Gcra | AlgorithmKind::LeakyBucket => Ok(()),
        AlgorithmKind::FixedWindow => FixedWindow::from_quota(quota).map(drop),
        AlgorithmKind::SlidingWindow => SlidingWindow::from_quota(quota).map(drop),
    };
    result.map_err(|e| ConfigError::new(rule, field, ConfigErrorKind::Quota(e)))
}

/// A table's `capacity` no larger than [`MAX_CAPACITY`] (rate and concurrency rules alike).
fn capacity_at_most_max(rule: Option<&str>, capacity: Option<usize>) -> Result<(), ConfigError> {
    match capacity.filter(|&c| c > MAX_CAPACITY) {
        Some(capacity) => Err(ConfigError::new(
            rule,
            "capacity",
            ConfigErrorKind::CapacityTooLarge {
                capacity,
                max: MAX_CAPACITY,
            },
        )),
        None => Ok(()),
    }
}
