//! Rules over request descriptors, decided as one: the policy engine a gateway puts in front of
//! its limiters.
//!
//! A [`Policy`] holds rules. Each rule matches requests by their descriptors (`remote_address`,
//! `route`, `method`, `api_key`, ...: exact, prefix or any value), keys its limit by some of them
//! (none: one global limit), and runs one of the core algorithms on a `KeyedLimiter` (keyed rules,
//! bounded memory), one atomic word (an exact global rule) or a `StripedLimiter` (a hot global
//! rule). [`Policy::check`] decides every applicable rule at one clock reading and returns one
//! [`PolicyDecision`]: admitted only if every enforcing rule admits; when one denies, every rule
//! that admitted the request gets its units back, so a denied request consumes nothing anywhere.
//!
//! * **Descriptor matching** ([`DescriptorMatch`]): a rule applies when the descriptors its `match`
//!   names are present and match (`subset`, the default), or, with `descriptor_match = "exact"`,
//!   only when the request carries no descriptor the rule does not name (Envoy's one descriptor
//!   per limit; tollgate-server's default).
//! * **Priority classes** per rule (`priority`, [`PriorityConfig`]): shares of each key's capacity
//!   kept for higher classes, named by a descriptor; the lowest class sheds first.
//! * **Shadow mode** per rule, and a global dry-run switch ([`Policy::set_dry_run`]).
//! * **Two-stage delay** (nginx's `burst=… delay=…`): a bucket rule with `delay.max_delay` admits its
//!   burst at once, asks the next requests to wait up to `max_delay` ([`PolicyDecision::delay`]), and
//!   denies beyond that.
//! * **Live reload** ([`Policy::reload`], or [`Policy::prepare_reload`] then
//!   [`PreparedReload::commit`]): lock-free for decisions; unchanged rules keep their state, and a
//!   quota change carries each key over as-is in units (never more than it had, nor than the new
//!   quota allows).
//! * **Config** ([`PolicyConfig`]) in TOML or YAML, validated once with typed errors naming the rule
//!   and field ([`ConfigError`]).
//! * **Counters** per rule (allowed, denied, shadow-denied, near the limit, overflow) through the
//!   `metrics` facade (install any recorder; this crate ships no exporter) and
//!   [`Policy::snapshot`].
//!
//! # One engine, several stores
//! The config compiles to a rule set that holds no state (matching, keys, quotas, tiers, delay);
//! one decision (`engine.rs`) runs it against a store: the in-process limiters of a [`Policy`], or
//! a shared Redis for a `RedisPolicy` (feature `redis`: every replica pointing at the same Redis
//! shares each rule's quota). The semantics above hold on both, the refund of a denied request
//! included; on one Redis node every rule of a request is one script call (one round trip; on a
//! Redis Cluster one per hash-slot group, see `RedisPolicy`), and in lease mode rule by rule, each
//! on its local lease.
//!
//! # Failure policy
//! A request missing a rule's descriptor is not limited by that rule (fails open *for that rule*).
//! A cost an enforcing rule can never admit is a [`PolicyError`] and consumes nothing (fails
//! closed). A bad config never replaces a working one. Redis down or slow: the
//! `RedisSettings::fail` policy, per rule (closed: a denial; open: the rule does not apply).
//!
//! # For the HTTP layer and the server
//! Build descriptors from the request, call [`Policy::check`] (or [`Policy::check_detailed`] for
//! per-rule statuses), and answer from the [`PolicyDecision`]: `decision` gives `Retry-After` and the
//! `RateLimit` fields, `rule` and `quota` give `RateLimit-Policy` (the key's override quota when it
//! has one), `delay` a wait before forwarding.

// The concurrency guide's code blocks are this crate's doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../guides/concurrency.md")]
struct GuideConcurrency;

// The rollout guide's code blocks (shadow, explain, enforce) are this crate's doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../guides/rollout.md")]
struct GuideRollout;

mod charge;
mod config;
mod config_error;
mod config_text;
mod decision;
mod descriptor_match;
mod engine;
#[cfg(feature = "redis")]
mod engine_async;
mod explain;
pub mod inflight;
mod inflight_rules;
mod limiter;
mod live;
mod pinned;
mod policy;
mod priority;
#[cfg(feature = "redis")]
mod redis_policy;
#[cfg(feature = "redis")]
mod redis_settle;
#[cfg(feature = "redis")]
mod redis_store;
mod reload;
mod reload_plan;
mod rules;
mod schema;
mod settle;
mod short_eq;
mod stats;
mod store;
mod sync;
mod validate;

pub use charge::Charged;
pub use config::{
    AlgorithmKind, DelayConfig, MAX_CAPACITY, MatchSpec, Mode, OverrideConfig, PolicyConfig,
    PriorityConfig, RuleConfig, Storage,
};
pub use config_error::{ConfigError, ConfigErrorKind};
pub use config_text::{ConfigFormat, validate_config};
pub use decision::{Descriptors, PolicyDecision, PolicyError, RuleOutcome};
pub use descriptor_match::DescriptorMatch;
pub use explain::{Explanation, QuotaView, RuleTrace, Skipped, StateView};
pub use inflight::{Admission, ConcurrencyConfig};
pub use pinned::PinnedPolicy;
pub use policy::Policy;
pub use priority::PriorityError;
#[cfg(feature = "redis")]
pub use redis_policy::RedisPolicy;
#[cfg(feature = "redis")]
pub use redis_settle::{RedisReservation, RedisReserved, Unsettled};
#[cfg(feature = "redis")]
pub use redis_store::RedisSettings;
pub use reload::PreparedReload;
pub use reload_plan::ReloadReport;
pub use schema::DescriptorSchema;
pub use settle::{Reservation, Reserved, Settlement};
pub use stats::{PolicySnapshot, RuleStats};
pub use validate::Validated;
