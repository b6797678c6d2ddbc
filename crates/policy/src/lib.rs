//! Rules over request descriptors, decided as one: the policy engine a gateway puts in front of
//! its limiters.
//!
//! A [`Policy`] holds rules. Each rule matches requests by their descriptors (`remote_address`,
//! `route`, `method`, `api_key`, ...: exact, prefix or any value), keys its limit by some of them
//! (none: one global limit), and runs one of the core algorithms on a `KeyedLimiter` (keyed rules,
//! bounded memory), an `AtomicLimiter` or a `StripedLimiter` (global rules). [`Policy::check`]
//! decides every applicable rule at one clock reading and returns one [`PolicyDecision`]: admitted
//! only if every enforcing rule admits; when one denies, every rule that admitted the request gets
//! its units back, so a denied request consumes nothing anywhere.
//!
//! * **Descriptor matching** ([`DescriptorMatch`]): a rule applies when the descriptors its `match`
//!   names are present and match (`subset`, the default), or, with `descriptor_match = "exact"`,
//!   only when the request carries no descriptor the rule does not name (Envoy's one descriptor
//!   per limit; tollgate-server's default).
//! * **Shadow mode** per rule, and a global dry-run switch ([`Policy::set_dry_run`]).
//! * **Two-stage delay** (nginx's `burst=… delay=…`): a bucket rule with `delay.max_delay` admits its
//!   burst at once, asks the next requests to wait up to `max_delay` ([`PolicyDecision::delay`]), and
//!   denies beyond that.
//! * **Live reload** ([`Policy::reload`]): lock-free for decisions; unchanged rules keep their state,
//!   so a quota change reaches existing keys without a fresh burst.
//! * **Config** ([`PolicyConfig`]) in TOML or YAML, validated once with typed errors naming the rule
//!   and field ([`ConfigError`]).
//! * **Counters** per rule (allowed, denied, shadow-denied, near the limit, overflow) through the
//!   `metrics` facade (install any recorder; this crate ships no exporter) and
//!   [`Policy::snapshot`].
//!
//! # Failure policy
//! A request missing a rule's descriptor is not limited by that rule (fails open *for that rule*).
//! A cost an enforcing rule can never admit is a [`PolicyError`] and consumes nothing (fails
//! closed). A bad config never replaces a working one.
//!
//! # For the HTTP layer and the server
//! Build descriptors from the request, call [`Policy::check`] (or [`Policy::check_detailed`] for
//! per-rule statuses), and answer from the [`PolicyDecision`]: `decision` gives `Retry-After` and the
//! `RateLimit` fields, `rule` and `quota` give `RateLimit-Policy` (the key's override quota when it
//! has one), `delay` a wait before forwarding.

mod config;
mod descriptor_match;
mod limiter;
mod policy;
mod reloadable;
mod stats;
mod sync;

pub use config::{
    AlgorithmKind, ConfigError, ConfigErrorKind, DelayConfig, MatchSpec, Mode, OverrideConfig,
    PolicyConfig, RuleConfig, Storage, Validated,
};
pub use descriptor_match::DescriptorMatch;
pub use policy::{
    Applicable, Descriptors, Policy, PolicyDecision, PolicyError, ReloadReport, RuleOutcome,
};
pub use reloadable::Reloadable;
pub use stats::{PolicySnapshot, RuleStats};
