//! The policy's configuration schema: the serde types a TOML or YAML policy file is read into
//! (rules, overrides, concurrency rules, priority classes) and the names they use. Reading and
//! writing the text is `config_text.rs`; the one validation, `validate.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::descriptor_match::DescriptorMatch;
use crate::short_eq;

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
    pub concurrency: Vec<ConcurrencyConfig>,
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
/// Checked when the config is validated, so a typo of a few digits is a
/// [`ConfigError`](crate::ConfigError) before
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
            MatchSpec::Exact(exact) => short_eq::same(value.as_bytes(), exact.as_bytes()),
            MatchSpec::Prefix(prefix) => short_eq::starts_with(value.as_bytes(), prefix.as_bytes()),
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

/// One concurrency rule: at most `limit` requests in flight per key (or in all, with no key).
///
/// ```toml
/// [[concurrency]]
/// name = "upstream"
/// match = { route = { prefix = "/reports/" } }
/// limit = 8            # at most 8 report requests at once, across all clients
/// max_hold = "2m"      # a permit not given back is reclaimed after 2 to 4 minutes
/// retry_after = "2s"   # what a denial tells the client (default 1 s)
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConcurrencyConfig {
    /// Unique name among all rules (rate and concurrency): in decisions, headers and logs.
    pub name: String,
    /// Which requests the rule applies to, as a rate rule's `match`.
    #[serde(default, rename = "match")]
    pub matches: BTreeMap<String, MatchSpec>,
    /// Descriptors whose values form the key (each must be in `match`); empty: one global limit.
    #[serde(default)]
    pub key: Vec<String>,
    /// The most units (requests of cost 1) in flight at once per key, 1..=2²⁰ − 1.
    pub limit: u64,
    /// A permit not given back within this long is reclaimed between `max_hold` and
    /// `2 × max_hold` after its take (default 60 s; set it above your longest legitimate request).
    #[serde(default = "default_max_hold", with = "humantime_serde")]
    pub max_hold: Duration,
    /// Keys the table holds (keyed rules only; ≈ 23 B per key, allocated at load).
    #[serde(default)]
    pub capacity: Option<usize>,
    /// What a denial reports as `retry_after` (default 1 s).
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub retry_after: Option<Duration>,
    /// `enforce` (default) or `shadow`.
    #[serde(default)]
    pub mode: Mode,
    /// Priority classes and the share of `limit` kept for each (as a rate rule's `priority`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<PriorityConfig>,
}

fn default_max_hold() -> Duration {
    Duration::from_secs(60)
}

/// A rule's priority classes and reserved shares (the `priority` field of a rule).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriorityConfig {
    /// The descriptor whose value is the request's class (default `"priority"`). It is not part of
    /// the rule's key, and a request without it is of the lowest class.
    #[serde(default = "default_descriptor")]
    pub descriptor: String,
    /// The classes, highest first. May be left out when `reserve` names one class (it is then the
    /// one class above every other value).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<String>,
    /// Class → the share of each key's capacity kept for it and the classes above it: `"20%"`,
    /// `"12.5%"`. Each above 0 %, all together below 100 %.
    pub reserve: BTreeMap<String, String>,
}

fn default_descriptor() -> String {
    "priority".to_owned()
}
