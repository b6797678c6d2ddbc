//! Why a configuration was rejected: [`ConfigError`] names the rule and field, its
//! [`ConfigErrorKind`] says what is wrong.

use std::fmt;

use tollgate_core::QuotaError;
use tollgate_sharded::KeyedError;
use tollgate_striped::StripedError;

use crate::priority::PriorityError;

/// Why a configuration was rejected: the rule (if any), the field, and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The rule's name (or the override's rule), when the error belongs to one.
    pub rule: Option<String>,
    /// The field at fault (`"limit"`, `"key"`, `"overrides"`, ...).
    pub field: &'static str,
    /// What is wrong.
    pub kind: ConfigErrorKind,
}

/// What is wrong in a [`ConfigError`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    /// The text is not valid TOML/YAML for the schema.
    Parse(String),
    /// An algorithm name that is not one of the four.
    UnknownAlgorithm(String),
    /// The quota cannot be built (zero limit, zero period, ...) or the algorithm cannot hold it.
    Quota(QuotaError),
    /// Two rules share a name.
    DuplicateName,
    /// An override names a rule that does not exist.
    UnknownRule,
    /// An override for a rule that is not keyed by exactly one descriptor.
    OverrideNeedsSingleKey,
    /// A key descriptor that the rule's match does not mention.
    KeyNotMatched(String),
    /// A keyed rule without a capacity, or a capacity on a global rule.
    Capacity,
    /// The same key value in two overrides of one rule (or twice in one): which quota it gets would
    /// depend on their order.
    DuplicateOverride(String),
    /// A capacity above [`MAX_CAPACITY`](crate::MAX_CAPACITY).
    CapacityTooLarge {
        /// The capacity asked for.
        capacity: usize,
        /// The most allowed.
        max: usize,
    },
    /// Striped storage on a keyed rule or a non-GCRA algorithm.
    Storage,
    /// A two-stage delay on a window algorithm, one too long for the quota, or on a rule with
    /// overrides.
    Delay,
    /// The keyed table could not be built or an override could not be placed.
    Keyed(KeyedError),
    /// The striped limiter could not be built.
    Striped(StripedError),
    /// Redis lease mode on a rule that is not GCRA (leases are slices of one GCRA bucket).
    LeaseNeedsGcra,
    /// Durable admissions (`WAIT` for replicas) asked for in Redis lease mode, which has none: a
    /// lease is granted by one script and spent locally.
    LeaseNotDurable,
    /// Durable admissions asked for on a Redis Cluster connection: `WAIT` counts one connection's
    /// writes on one node, which a cluster connection does not pin (not built).
    ClusterNotDurable,
    /// The rule's `priority` (classes and reserved shares) is invalid or its storage cannot keep
    /// headroom.
    Priority(PriorityError),
    /// A concurrency rule where no in-process table can hold its permits (a Redis policy).
    ConcurrencyUnsupported,
}

impl ConfigError {
    pub(crate) fn new(rule: Option<&str>, field: &'static str, kind: ConfigErrorKind) -> Self {
        ConfigError {
            rule: rule.map(str::to_owned),
            field,
            kind,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.rule {
            Some(rule) => write!(f, "rule `{rule}`, field `{}`: ", self.field)?,
            None => write!(f, "field `{}`: ", self.field)?,
        }
        match &self.kind {
            ConfigErrorKind::Parse(message) => write!(f, "cannot parse: {message}"),
            ConfigErrorKind::UnknownAlgorithm(name) => write!(
                f,
                "unknown algorithm `{name}` (gcra, leaky_bucket, fixed_window, sliding_window)"
            ),
            ConfigErrorKind::Quota(error) => write!(f, "invalid quota: {error}"),
            ConfigErrorKind::DuplicateName => f.write_str("another rule has this name"),
            ConfigErrorKind::UnknownRule => f.write_str("no rule has this name"),
            ConfigErrorKind::OverrideNeedsSingleKey => {
                f.write_str("overrides need a rule keyed by exactly one descriptor")
            }
            ConfigErrorKind::KeyNotMatched(name) => write!(
                f,
                "key descriptor `{name}` does not appear in the rule's match (add `{name} = \"any\"`)"
            ),
            ConfigErrorKind::Capacity => {
                f.write_str("keyed rules need a capacity; global rules take none")
            }
            ConfigErrorKind::DuplicateOverride(value) => {
                write!(f, "key value `{value}` has more than one override")
            }
            ConfigErrorKind::CapacityTooLarge { capacity, max } => {
                write!(
                    f,
                    "a capacity of {capacity} keys is above the most allowed, {max}"
                )
            }
            ConfigErrorKind::Storage => {
                f.write_str("striped storage is for global rules with the gcra algorithm")
            }
            ConfigErrorKind::Delay => f.write_str(
                "a delay needs a bucket algorithm (gcra, leaky_bucket) and must fit the quota",
            ),
            ConfigErrorKind::Keyed(error) => write!(f, "{error}"),
            ConfigErrorKind::Striped(error) => write!(f, "{error}"),
            ConfigErrorKind::LeaseNeedsGcra => f.write_str(
                "redis lease mode runs gcra only (leases are slices of one gcra bucket); use the \
                 per request mode for this algorithm",
            ),
            ConfigErrorKind::LeaseNotDurable => f.write_str(
                "durable admissions (WAIT for replicas) are for the per request mode; lease mode \
                 spends its leases locally",
            ),
            ConfigErrorKind::ClusterNotDurable => f.write_str(
                "durable admissions (WAIT for replicas) are not supported on a redis cluster \
                 connection",
            ),
            ConfigErrorKind::Priority(error) => write!(f, "{error}"),
            ConfigErrorKind::ConcurrencyUnsupported => f.write_str(
                "concurrency rules hold their permits in process: use Policy (not RedisPolicy) \
                 at an edge that sees each request end",
            ),
        }
    }
}

impl std::error::Error for ConfigError {}
