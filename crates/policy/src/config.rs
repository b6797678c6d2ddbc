//! The policy's configuration: one serde schema read from TOML or YAML, validated once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tollgate_core::{Quota, QuotaError};
use tollgate_sharded::KeyedError;
use tollgate_striped::StripedError;

use crate::descriptor_match::DescriptorMatch;
use crate::priority::{PriorityConfig, PriorityError};

/// A whole policy: its rules, per-value overrides and the global dry-run switch.
///
/// ```
/// use tollgate_policy::PolicyConfig;
/// let config = PolicyConfig::from_toml(r#"
///     [[rules]]
///     name = "per_ip"
///     match = { remote_address = "any" }
///     key = ["remote_address"]
///     algorithm = "gcra"
///     limit = 100
///     period = "1s"
///     capacity = 100000
/// "#)?;
/// assert_eq!(config.rules[0].name, "per_ip");
/// # Ok::<(), tollgate_policy::ConfigError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// Every rule evaluated as shadow: counted, never denying.
    #[serde(default)]
    pub dry_run: bool,
    /// Count decisions per rule (own counters and the `metrics` facade). Default on.
    #[serde(default = "yes")]
    pub metrics: bool,
    /// The rules, evaluated in this order.
    #[serde(default)]
    pub rules: Vec<RuleConfig>,
    /// Quotas for particular key values of keyed rules (plan tiers, single customers).
    #[serde(default)]
    pub overrides: Vec<OverrideConfig>,
    /// In-flight (concurrency) rules, decided with the rules above by
    /// [`Policy::admit`](crate::Policy::admit); see [`ConcurrencyConfig`](crate::ConcurrencyConfig).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub concurrency: Vec<crate::inflight::ConcurrencyConfig>,
    /// Labels added to every metric the rules report through the `metrics` facade, beside `rule`
    /// (and `outcome`): for a process that runs several policies whose rule names may repeat
    /// (tollgate-server sets `domain`). Read when a rule is first built; a rule that a reload keeps
    /// keeps its counters, labels included.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metric_labels: BTreeMap<String, String>,
    /// Whether a rule applies to a request whose descriptors include entries its `match` does not
    /// name: `"subset"` (yes; what unset means here, for HTTP edges that pass every fact they
    /// have) or `"exact"` (no; for Envoy's per-`rate_limits` descriptors, and what tollgate-server
    /// sets for its domains when unset). See [`DescriptorMatch`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub descriptor_match: Option<DescriptorMatch>,
}

fn yes() -> bool {
    true
}

/// The largest `capacity` a keyed rule may have: 2³⁰ keys (1 073 741 824), a table of about 24.6 GB.
/// Checked when the config is validated, so a typo of a few digits is a [`ConfigError`] before
/// anything is allocated.
pub const MAX_CAPACITY: usize = 1 << 30;

/// One rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// Unique name: in decisions, headers, logs and metrics labels.
    pub name: String,
    /// Which requests the rule applies to: every listed descriptor must be present and match. An
    /// empty match applies to every request.
    #[serde(default, rename = "match")]
    pub matches: BTreeMap<String, MatchSpec>,
    /// Descriptors whose values form the key: one limit per distinct value (tuple). Empty: one
    /// global limit. Each must also appear in `match`.
    #[serde(default)]
    pub key: Vec<String>,
    /// `gcra` (default), `leaky_bucket`, `fixed_window` or `sliding_window`.
    #[serde(default = "default_algorithm")]
    pub algorithm: String,
    /// Units per period.
    pub limit: u64,
    /// The period (`"1s"`, `"1m"`, `"250ms"`).
    #[serde(with = "humantime_serde")]
    pub period: Duration,
    /// Bucket depth for `gcra`/`leaky_bucket` (default: `limit`).
    #[serde(default)]
    pub burst: Option<u64>,
    /// Keys the rule's table holds (keyed rules only; memory ≈ 23 B per key, allocated at load). At
    /// most [`MAX_CAPACITY`]; a table the allocator cannot provide is an error too, never an abort.
    #[serde(default)]
    pub capacity: Option<usize>,
    /// `enforce` (default) or `shadow`.
    #[serde(default)]
    pub mode: Mode,
    /// Global rules only: `atomic` (default, one exact slot) or `striped` (per-core leases for a
    /// hot global cap; GCRA only).
    #[serde(default)]
    pub storage: Storage,
    /// Striped storage: the stripe count (default: available parallelism).
    #[serde(default)]
    pub stripes: Option<usize>,
    /// nginx-style two-stage limiting (bucket algorithms): after the burst, requests wait up to
    /// `max_delay` for their slot instead of being denied; beyond that they are denied.
    #[serde(default)]
    pub delay: Option<DelayConfig>,
    /// Priority classes with shares of each key's capacity kept for the higher ones (see
    /// [`PriorityConfig`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<PriorityConfig>,
}

fn default_algorithm() -> String {
    "gcra".to_owned()
}

/// How a descriptor's value must look for a rule to apply. Written `"any"`, `{ exact = "GET" }` or
/// `{ prefix = "/api/" }` (in YAML: `any`, `{ exact: GET }`, `{ prefix: /api/ }`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "MatchRepr", into = "MatchRepr")]
pub enum MatchSpec {
    /// Exactly this value.
    Exact(String),
    /// Any value starting with this.
    Prefix(String),
    /// Any value, as long as the descriptor is present.
    Any,
}

/// The written form of a [`MatchSpec`]: the same in TOML and YAML (serde's default enum form
/// becomes a YAML tag, which no one writes by hand).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum MatchRepr {
    Word(String),
    Exact { exact: String },
    Prefix { prefix: String },
}

impl TryFrom<MatchRepr> for MatchSpec {
    type Error = String;
    fn try_from(repr: MatchRepr) -> Result<Self, String> {
        match repr {
            MatchRepr::Word(word) if word == "any" => Ok(MatchSpec::Any),
            MatchRepr::Word(word) => Err(format!(
                "match `{word}`: write \"any\", {{ exact = \"{word}\" }} or {{ prefix = \"{word}\" }}"
            )),
            MatchRepr::Exact { exact } => Ok(MatchSpec::Exact(exact)),
            MatchRepr::Prefix { prefix } => Ok(MatchSpec::Prefix(prefix)),
        }
    }
}

impl From<MatchSpec> for MatchRepr {
    fn from(spec: MatchSpec) -> Self {
        match spec {
            MatchSpec::Any => MatchRepr::Word("any".to_owned()),
            MatchSpec::Exact(exact) => MatchRepr::Exact { exact },
            MatchSpec::Prefix(prefix) => MatchRepr::Prefix { prefix },
        }
    }
}

impl MatchSpec {
    /// Whether `value` satisfies this spec.
    #[inline]
    pub fn matches(&self, value: &str) -> bool {
        match self {
            MatchSpec::Exact(exact) => value == exact,
            MatchSpec::Prefix(prefix) => value.starts_with(prefix.as_str()),
            MatchSpec::Any => true,
        }
    }
}

/// Whether a rule can deny.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Denies when over its limit.
    #[default]
    Enforce,
    /// Evaluated and counted, never denies (and never keeps quota for a request another rule
    /// denied).
    Shadow,
}

/// Where a global rule's state lives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Storage {
    /// One exact atomic word (a reload hands its state over, carried as-is in units, in one
    /// compare-and-swap that retires the old word).
    #[default]
    Atomic,
    /// `StripedLimiter`: per-core leases of one GCRA quota, for many threads on one hot cap.
    Striped,
}

/// The two-stage delay of a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelayConfig {
    /// The longest a request may be asked to wait (`"500ms"`).
    #[serde(with = "humantime_serde")]
    pub max_delay: Duration,
}

/// A quota for particular values of a keyed rule's key (a plan tier, or one customer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverrideConfig {
    /// The rule it applies to (must be keyed by exactly one descriptor).
    pub rule: String,
    /// A label for the tier (documentation and errors only).
    #[serde(default)]
    pub tier: Option<String>,
    /// The key values that get this quota.
    pub values: Vec<String>,
    /// Units per period.
    pub limit: u64,
    /// The period.
    #[serde(with = "humantime_serde")]
    pub period: Duration,
    /// Bucket depth (default: `limit`).
    #[serde(default)]
    pub burst: Option<u64>,
}

/// The algorithms a rule may name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AlgorithmKind {
    /// [`tollgate_core::Gcra`].
    Gcra,
    /// [`tollgate_core::LeakyBucket`].
    LeakyBucket,
    /// [`tollgate_core::FixedWindow`].
    FixedWindow,
    /// [`tollgate_core::SlidingWindow`].
    SlidingWindow,
}

impl AlgorithmKind {
    /// The algorithm for a config name.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "gcra" | "token_bucket" => AlgorithmKind::Gcra,
            "leaky_bucket" => AlgorithmKind::LeakyBucket,
            "fixed_window" => AlgorithmKind::FixedWindow,
            "sliding_window" => AlgorithmKind::SlidingWindow,
            _ => return None,
        })
    }

    /// The canonical config name (`token_bucket` is read as `gcra`).
    pub fn name(self) -> &'static str {
        match self {
            AlgorithmKind::Gcra => "gcra",
            AlgorithmKind::LeakyBucket => "leaky_bucket",
            AlgorithmKind::FixedWindow => "fixed_window",
            AlgorithmKind::SlidingWindow => "sliding_window",
        }
    }

    /// Whether the state is a bucket timestamp (the two-stage delay needs one).
    pub fn is_bucket(self) -> bool {
        matches!(self, AlgorithmKind::Gcra | AlgorithmKind::LeakyBucket)
    }
}

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
    /// A capacity above [`MAX_CAPACITY`].
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

impl PolicyConfig {
    /// Parses TOML.
    ///
    /// # Errors
    /// [`ConfigErrorKind::Parse`] with the parser's message (it names the line and field).
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text)
            .map_err(|e| ConfigError::new(None, "toml", ConfigErrorKind::Parse(e.to_string())))
    }

    /// Parses YAML (the same schema).
    ///
    /// # Errors
    /// [`ConfigErrorKind::Parse`] with the parser's message.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        serde_yaml_ng::from_str(text)
            .map_err(|e| ConfigError::new(None, "yaml", ConfigErrorKind::Parse(e.to_string())))
    }

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
            if let Some(capacity) = rule.capacity.filter(|&c| c > MAX_CAPACITY) {
                return Err(ConfigError::new(
                    name,
                    "capacity",
                    ConfigErrorKind::CapacityTooLarge {
                        capacity,
                        max: MAX_CAPACITY,
                    },
                ));
            }
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
        crate::inflight::validate(self, in_process)?;
        Ok(Validated { rules })
    }
}

/// The text format of a config file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigFormat {
    /// TOML.
    Toml,
    /// YAML (the same schema).
    Yaml,
}

impl ConfigFormat {
    /// YAML for a file name ending in `.yaml` / `.yml`, TOML otherwise.
    pub fn of_path(path: &std::path::Path) -> Self {
        match path.extension().and_then(|e| e.to_str()) {
            Some("yaml" | "yml") => ConfigFormat::Yaml,
            _ => ConfigFormat::Toml,
        }
    }
}

/// The policy's `check`: parses `text`, validates it as [`Policy::new`](crate::Policy::new) and
/// [`Policy::reload`](crate::Policy::reload) do ([`PolicyConfig::validate`], the one validation),
/// and returns the config as TOML with every default spelled out ([`PolicyConfig::normalized`]).
///
/// ```
/// use tollgate_policy::{ConfigFormat, check_config};
/// let text = check_config("[[rules]]\nname = \"g\"\nlimit = 5\nperiod = \"1s\"\n", ConfigFormat::Toml)?;
/// assert!(text.contains("burst = 5"), "{text}");
/// assert!(text.contains("algorithm = \"gcra\""), "{text}");
/// let error = check_config("[[rules]]\nname = \"g\"\nlimit = 0\nperiod = \"1s\"\n", ConfigFormat::Toml)
///     .unwrap_err();
/// assert_eq!((error.rule.as_deref(), error.field), (Some("g"), "limit"));
/// # Ok::<(), tollgate_policy::ConfigError>(())
/// ```
///
/// # Errors
/// The [`ConfigError`] that loading the config would give, naming the rule and field.
pub fn check_config(text: &str, format: ConfigFormat) -> Result<String, ConfigError> {
    let config = match format {
        ConfigFormat::Toml => PolicyConfig::from_toml(text)?,
        ConfigFormat::Yaml => PolicyConfig::from_yaml(text)?,
    };
    config.normalized()?.to_toml()
}

impl PolicyConfig {
    /// Validates (as [`validate`](Self::validate)) and returns the config with every default
    /// spelled out: `descriptor_match`, each rule's canonical `algorithm` name and `burst`, a
    /// striped rule's `stripes` (this machine's parallelism), each override's `burst`. Loading the
    /// result gives the same policy as loading `self`.
    ///
    /// # Errors
    /// As [`validate`](Self::validate).
    pub fn normalized(&self) -> Result<PolicyConfig, ConfigError> {
        self.validate()?;
        Ok(self.spelled_out())
    }

    /// [`normalized`](Self::normalized) for a store that keeps no in-process tables
    /// ([`validate_shared`](Self::validate_shared)).
    ///
    /// # Errors
    /// As [`validate_shared`](Self::validate_shared).
    #[cfg(feature = "redis")]
    pub fn normalized_shared(&self) -> Result<PolicyConfig, ConfigError> {
        self.validate_shared()?;
        Ok(self.spelled_out())
    }

    /// The config as TOML (the schema [`from_toml`](Self::from_toml) reads).
    ///
    /// # Errors
    /// [`ConfigErrorKind::Parse`] when the serializer refuses it (it does not for a config this
    /// crate parsed).
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        toml::to_string(self)
            .map_err(|e| ConfigError::new(None, "toml", ConfigErrorKind::Parse(e.to_string())))
    }

    fn spelled_out(&self) -> PolicyConfig {
        let mut config = self.clone();
        config.descriptor_match.get_or_insert_default();
        for rule in &mut config.rules {
            if let Some(kind) = AlgorithmKind::parse(&rule.algorithm) {
                kind.name().clone_into(&mut rule.algorithm);
            }
            rule.burst.get_or_insert(rule.limit);
            if rule.storage == Storage::Striped {
                rule.stripes.get_or_insert_with(|| {
                    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
                });
            }
        }
        for o in &mut config.overrides {
            o.burst.get_or_insert(o.limit);
        }
        config
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
