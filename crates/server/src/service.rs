//! The decision shared by the gRPC and HTTP front ends: a request's descriptors through its
//! domain's policy, and the live set of domains that reloads replace.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tollgate_core::Decision;
use tollgate_http::{FieldValues, PolicyFields};
use tollgate_policy::{Policy, PolicyDecision, PolicyError};

use crate::config::{Backend, ServerConfig};
use crate::redis_backend::{Connections, RedisRules};
use crate::telemetry::DecisionMetrics;

/// Most descriptors one request may carry; more is a malformed request.
pub const MAX_DESCRIPTORS: usize = 64;
/// Most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 32;

/// One domain: its policy and the cache of its header field text.
pub struct Domain {
    /// The domain's rules and state.
    pub policy: Policy,
    /// `RateLimit` / `RateLimit-Policy` text per (rule, quota).
    pub fields: PolicyFields,
    /// Its backend.
    pub backend: Backend,
    /// The Redis backend's rule limiters (`None`: embedded, the policy holds the state).
    pub redis: Option<RedisRules>,
    /// Its decision metrics (registered once).
    pub metrics: Arc<DecisionMetrics>,
}

/// The domains served, swapped whole on reload.
pub type Domains = HashMap<String, Arc<Domain>>;

/// The live domains and the decision over them.
pub struct Limiter {
    domains: ArcSwap<Domains>,
    connections: Connections,
}

/// Why a request could not be decided (answered with an error, not a decision).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckError {
    /// The domain is not configured.
    UnknownDomain(String),
    /// The request is malformed (no domain, no descriptors, an empty entry key, too many ...).
    Malformed(String),
}

/// One descriptor's verdict.
#[derive(Clone, Copy, Debug)]
pub enum Verdict {
    /// The policy decided (allowed, denied, or allowed with a shadow denial).
    Decided(PolicyDecision),
    /// The cost can never be admitted by an enforcing rule: answered as over the limit (fails
    /// closed; retrying cannot help, so no wait is advertised).
    CostTooLarge(PolicyError),
}

impl Verdict {
    /// Whether this descriptor is within its limits.
    pub fn is_ok(&self) -> bool {
        match self {
            Verdict::Decided(d) => d.is_allowed(),
            Verdict::CostTooLarge(_) => false,
        }
    }
}

/// A whole request's answer.
pub struct Answer {
    /// One verdict per descriptor, in request order.
    pub statuses: Vec<Verdict>,
    /// Whether every descriptor is OK.
    pub ok: bool,
    /// The fields of the deciding descriptor: the denying one with the longest wait when over the
    /// limit, else the one with the fewest units left. `None` when no enforcing rule applied.
    pub fields: Option<FieldValues>,
    /// The domain's decision metrics, for the front end to record the request with.
    pub metrics: Arc<DecisionMetrics>,
}

impl Limiter {
    /// Builds every domain of `config`.
    ///
    /// # Errors
    /// The first domain whose policy cannot be built.
    pub fn new(config: &ServerConfig) -> Result<Self, String> {
        let connections = Connections::default();
        let domains = build(config, None, &connections)?;
        Ok(Limiter {
            domains: ArcSwap::from_pointee(domains),
            connections,
        })
    }

    /// Applies a new config with the policy engine's reload semantics: a domain that stays keeps
    /// its policy (unchanged rules keep their state, so no fresh burst); new domains start fresh;
    /// removed ones go. Every domain's new policy is built first, and nothing changes when any
    /// fails.
    ///
    /// # Errors
    /// The first domain that fails; the old config stays in force.
    pub fn reload(&self, config: &ServerConfig) -> Result<(), String> {
        let current = self.domains.load_full();
        let next = build(config, Some(&current), &self.connections)?;
        self.domains.store(Arc::new(next));
        self.connections.retain_used(config);
        Ok(())
    }

    /// The Redis connections kept for the domains (one per URL and timeout in use).
    pub fn redis_connections(&self) -> usize {
        self.connections.len()
    }

    /// The domains now.
    pub fn domains(&self) -> arc_swap::Guard<Arc<Domains>> {
        self.domains.load()
    }

    /// Decides one request: each descriptor (a list of `(key, value)` entries) with its cost is
    /// one policy check, all at one clock reading.
    ///
    /// # Atomicity
    /// Embedded: all rules that apply to one descriptor are decided as one (the policy engine's
    /// guarantee: a denial gives back what the other rules admitted). Redis: a descriptor's rules
    /// are decided in order and the first enforcing denial stops it; admissions of the rules before
    /// it are kept (see [`crate::redis_backend`]). Across descriptors of one request the
    /// decisions are independent, as in Envoy's reference service: a descriptor admitted keeps its
    /// units even when another descriptor of the same request is over its limit.
    ///
    /// # Errors
    /// [`CheckError`] for an unknown domain or a malformed request; nothing is consumed.
    pub async fn check(
        &self,
        domain: &str,
        descriptors: &[(Vec<(&str, &str)>, u64)],
    ) -> Result<Answer, CheckError> {
        if domain.is_empty() {
            return Err(CheckError::Malformed("domain is empty".into()));
        }
        if descriptors.is_empty() {
            return Err(CheckError::Malformed("no descriptors".into()));
        }
        if descriptors.len() > MAX_DESCRIPTORS {
            return Err(CheckError::Malformed(format!(
                "{} descriptors (at most {MAX_DESCRIPTORS})",
                descriptors.len()
            )));
        }
        for (i, (entries, _)) in descriptors.iter().enumerate() {
            if entries.is_empty() {
                return Err(CheckError::Malformed(format!(
                    "descriptor {i} has no entries"
                )));
            }
            if entries.len() > MAX_ENTRIES {
                return Err(CheckError::Malformed(format!(
                    "descriptor {i} has {} entries (at most {MAX_ENTRIES})",
                    entries.len()
                )));
            }
            if entries.iter().any(|(k, _)| k.is_empty()) {
                return Err(CheckError::Malformed(format!(
                    "descriptor {i} has an entry with an empty key"
                )));
            }
        }
        let dom = {
            let domains = self.domains.load();
            let Some(dom) = domains.get(domain) else {
                return Err(CheckError::UnknownDomain(domain.to_owned()));
            };
            if dom.redis.is_none() {
                return Ok(embedded(dom, descriptors));
            }
            // Held across the Redis calls: a reload meanwhile does not pull the rules away.
            Arc::clone(dom)
        };
        Ok(on_redis(&dom, descriptors).await)
    }
}

/// A Redis domain's answer: each descriptor through [`RedisRules::decide`].
async fn on_redis(dom: &Domain, descriptors: &[(Vec<(&str, &str)>, u64)]) -> Answer {
    let Some(redis) = dom.redis.as_ref() else {
        return embedded(dom, descriptors);
    };
    let mut statuses = Vec::with_capacity(descriptors.len());
    let mut hints = Vec::with_capacity(descriptors.len());
    for (entries, cost) in descriptors {
        let outcome = redis.decide(&dom.policy, entries, (*cost).max(1)).await;
        statuses.push(match outcome.result {
            Ok(d) => Verdict::Decided(d),
            Err(e) => Verdict::CostTooLarge(e),
        });
        hints.push(outcome.next_unit);
    }
    answer(dom, statuses, |i, d| {
        dom.fields
            .for_rule(d.rule?, d.quota?, &d.decision, hints[i])
    })
}

/// An embedded domain's answer: every descriptor through the policy at one clock reading.
fn embedded(dom: &Domain, descriptors: &[(Vec<(&str, &str)>, u64)]) -> Answer {
    let now = dom.policy.now();
    let mut statuses = Vec::with_capacity(descriptors.len());
    let mut hints = Vec::with_capacity(descriptors.len());
    for (entries, cost) in descriptors {
        let verdict = match dom.policy.check_next_at(entries, now, (*cost).max(1)) {
            Ok((d, next)) => {
                hints.push(next);
                Verdict::Decided(d)
            }
            Err(e) => {
                hints.push(None);
                Verdict::CostTooLarge(e)
            }
        };
        statuses.push(verdict);
    }
    answer(dom, statuses, |i, d| dom.fields.for_decision(d, hints[i]))
}

/// The answer over every descriptor's verdict, with the fields of the [`deciding`] one, which
/// `fields` makes (the embedded and Redis paths know `t` in different ways).
fn answer(
    dom: &Domain,
    statuses: Vec<Verdict>,
    fields: impl FnOnce(usize, &PolicyDecision) -> Option<FieldValues>,
) -> Answer {
    let ok = statuses.iter().all(Verdict::is_ok);
    let fields = deciding(&statuses, ok).and_then(|i| match &statuses[i] {
        Verdict::Decided(d) => fields(i, d),
        Verdict::CostTooLarge(_) => None,
    });
    Answer {
        statuses,
        ok,
        fields,
        metrics: Arc::clone(&dom.metrics),
    }
}

/// The descriptor whose fields the response carries.
fn deciding(statuses: &[Verdict], ok: bool) -> Option<usize> {
    let mut best: Option<(usize, u64, Duration)> = None;
    for (i, v) in statuses.iter().enumerate() {
        let Verdict::Decided(d) = v else { continue };
        if d.rule.is_none() {
            continue;
        }
        match (ok, d.decision) {
            (false, Decision::Denied { retry_after, .. })
                if best.is_none_or(|(_, _, w)| retry_after > w) =>
            {
                best = Some((i, 0, retry_after));
            }
            (true, Decision::Allowed { remaining, .. })
                if best.is_none_or(|(_, r, _)| remaining < r) =>
            {
                best = Some((i, remaining, Duration::ZERO));
            }
            _ => {}
        }
    }
    best.map(|(i, _, _)| i)
}

fn build(
    config: &ServerConfig,
    current: Option<&Domains>,
    connections: &Connections,
) -> Result<Domains, String> {
    // Build (and so fully check) every new policy before touching a live one.
    let mut fresh = HashMap::new();
    for d in &config.domains {
        let policy =
            Policy::new(d.policy.clone()).map_err(|e| format!("domain `{}`: {e}", d.name))?;
        let redis = match &d.backend {
            Backend::Embedded => None,
            Backend::Redis(settings) => {
                let old = current
                    .and_then(|c| c.get(&d.name))
                    .and_then(|c| c.redis.as_ref());
                Some(
                    RedisRules::build(&d.name, settings, &d.policy, connections, old)
                        .map_err(|e| format!("domain `{}`: {e}", d.name))?,
                )
            }
        };
        fresh.insert(d.name.clone(), (policy, redis));
    }
    let mut out = HashMap::new();
    for d in &config.domains {
        let built = fresh.remove(&d.name);
        // An embedded domain keeps its policy (its state); a Redis domain's state is in Redis, so
        // it is rebuilt whole (its limiters reused where unchanged, see `RedisRules::build`).
        let kept = current
            .and_then(|c| c.get(&d.name))
            .filter(|c| c.backend == Backend::Embedded && d.backend == Backend::Embedded);
        let domain = match (kept, built) {
            (Some(old), _) => {
                old.policy
                    .reload(d.policy.clone())
                    .map_err(|e| format!("domain `{}`: {e}", d.name))?;
                Arc::clone(old)
            }
            (None, Some((policy, redis))) => Arc::new(Domain {
                policy,
                fields: PolicyFields::new(),
                backend: d.backend.clone(),
                redis,
                metrics: Arc::new(DecisionMetrics::new(&d.name)),
            }),
            (None, None) => return Err(format!("domain `{}` could not be built", d.name)),
        };
        out.insert(d.name.clone(), domain);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: Option<&str>) -> ServerConfig {
        let backend = url.map_or_else(
            || "\"embedded\"".to_owned(),
            |u| format!("{{ redis = {{ url = \"{u}\" }} }}"),
        );
        ServerConfig::parse(
            &format!(
                "[[domains]]\nname = \"a\"\nbackend = {backend}\n[domains.policy]\n\
                 [[domains.policy.rules]]\nname = \"r\"\nmatch = {{ k = \"any\" }}\nlimit = 5\nperiod = \"1s\"\n"
            ),
            false,
        )
        .expect("config")
    }

    #[tokio::test]
    async fn a_reload_lets_go_of_redis_connections_no_domain_uses() {
        // Lazy connections: nothing listens on these ports, and nothing needs to.
        let limiter = Limiter::new(&config(Some("redis://127.0.0.1:1/"))).expect("limiter");
        assert_eq!(limiter.redis_connections(), 1);
        limiter
            .reload(&config(Some("redis://127.0.0.1:1/")))
            .expect("same URL");
        assert_eq!(limiter.redis_connections(), 1, "kept across the reload");
        limiter
            .reload(&config(Some("redis://127.0.0.1:2/")))
            .expect("new URL");
        assert_eq!(limiter.redis_connections(), 1, "the old URL's is gone");
        limiter.reload(&config(None)).expect("embedded");
        assert_eq!(limiter.redis_connections(), 0);
    }
}
