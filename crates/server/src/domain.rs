//! One domain (its rules, where their state is, its field text and metrics) and the set of them a
//! config builds: prepared first, changing nothing live, then committed (see
//! [`LiveDomains::reload`](crate::service::LiveDomains::reload)).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tollgate_core::MonotonicClock;
use tollgate_http::PolicyFields;
use tollgate_policy::{Policy, PreparedReload, RedisPolicy};

use crate::backend::Backend;
use crate::config::{DescriptorMode, ServerConfig};
use crate::redis_backend::{self, Connections};
use crate::telemetry::DecisionMetrics;

/// A domain's rules and where their state is: the same engine either way.
pub enum DomainPolicy {
    /// In this process.
    Embedded(Policy),
    /// In a shared Redis ([`crate::redis_backend`]).
    Redis(RedisPolicy),
}

/// One domain: its policy and the cache of its header field text.
pub struct Domain {
    /// The domain's rules and state.
    pub policy: DomainPolicy,
    /// `RateLimit` / `RateLimit-Policy` text per (rule, quota).
    pub fields: PolicyFields,
    /// Its backend.
    pub backend: Backend,
    /// Whether a call's descriptors are decided as one (the config's `descriptors`, which a
    /// reload may change on a kept domain).
    pub atomic: AtomicBool,
    /// Its decision metrics (registered once).
    pub metrics: Arc<DecisionMetrics>,
}

impl Domain {
    /// Whether a call's descriptors are decided as one.
    pub(crate) fn is_atomic(&self) -> bool {
        // Relaxed: a switch; see `commit`.
        self.atomic.load(Ordering::Relaxed)
    }

    fn new(config: &crate::config::DomainConfig, policy: DomainPolicy) -> Self {
        Domain {
            policy,
            fields: PolicyFields::new(),
            backend: config.backend.clone(),
            atomic: AtomicBool::new(config.descriptors == DescriptorMode::Atomic),
            metrics: Arc::new(DecisionMetrics::new(&config.name)),
        }
    }
}

/// The domains served, swapped whole on reload.
pub type Domains = HashMap<String, Arc<Domain>>;

/// One domain of a config being applied, ready but not live.
pub(crate) enum Staged<'a> {
    /// An embedded domain that stays embedded: its policy's reload, prepared (committing applies
    /// it in place, so its state carries over).
    Kept(
        &'a Arc<Domain>,
        // Boxed: a prepared reload is large and lives only while a reload is applied.
        Box<PreparedReload<'a, MonotonicClock>>,
        DescriptorMode,
    ),
    /// A domain built whole: new, or on Redis, or changing backend (boxed: a Redis policy holds its
    /// connection, single node or cluster, inline).
    Built(Box<Domain>),
}

/// Prepares every domain of `config` against `current` (the live domains, `None` at start),
/// changing nothing live; dropping the result undoes everything but Redis connections opened for
/// new URLs (which the next successful reload lets go of).
pub(crate) fn build<'a>(
    config: &ServerConfig,
    current: Option<&'a Domains>,
    connections: &Connections,
) -> Result<Vec<(String, Staged<'a>)>, String> {
    let mut staged = Vec::with_capacity(config.domains.len());
    for d in &config.domains {
        let named = |e: &dyn std::fmt::Display| format!("domain `{}`: {e}", d.name);
        // Checked at parse time too; here because preparing one policy twice would wait on its
        // own reload lock.
        if staged.iter().any(|(name, _)| *name == d.name) {
            return Err(named(&"listed twice"));
        }
        let old = current.and_then(|c| c.get(&d.name));
        // An embedded domain that stays embedded keeps its policy (its state): its reload is
        // prepared. Anything else is built whole; a Redis domain's state is in Redis, and its
        // limiters and counters carry over onto the same Redis (they keep their connection).
        let kept = old.and_then(|o| match (&o.policy, &d.backend) {
            (DomainPolicy::Embedded(policy), Backend::Embedded) => Some((o, policy)),
            _ => None,
        });
        let domain = match (kept, &d.backend) {
            (Some((old, policy)), _) => Staged::Kept(
                old,
                Box::new(
                    policy
                        .prepare_reload(d.policy.clone())
                        .map_err(|e| named(&e))?,
                ),
                d.descriptors,
            ),
            (None, Backend::Embedded) => Staged::Built(Box::new(Domain::new(
                d,
                DomainPolicy::Embedded(Policy::new(d.policy.clone()).map_err(|e| named(&e))?),
            ))),
            (None, Backend::Redis(settings)) => {
                let previous = old.and_then(|old| match (&old.backend, &old.policy) {
                    (Backend::Redis(was), DomainPolicy::Redis(p))
                        if was.url == settings.url
                            && was.timeout == settings.timeout
                            && was.cluster == settings.cluster =>
                    {
                        Some(p)
                    }
                    _ => None,
                });
                let policy =
                    redis_backend::build(&d.name, settings, &d.policy, connections, previous)
                        .map_err(|e| named(&e))?;
                Staged::Built(Box::new(Domain::new(d, DomainPolicy::Redis(policy))))
            }
        };
        staged.push((d.name.clone(), domain));
    }
    Ok(staged)
}

/// Applies what [`build`] staged (cannot fail): kept domains' reloads are committed; the map of
/// the next domains is returned for the caller to swap in.
pub(crate) fn commit(staged: Vec<(String, Staged<'_>)>) -> Domains {
    staged
        .into_iter()
        .map(|(name, domain)| {
            let domain = match domain {
                Staged::Kept(old, prepared, descriptors) => {
                    let report = prepared.commit();
                    // Relaxed: a switch read by each call; it publishes no other data.
                    old.atomic
                        .store(descriptors == DescriptorMode::Atomic, Ordering::Relaxed);
                    tracing::debug!(domain = %name, ?report, "domain reloaded");
                    Arc::clone(old)
                }
                Staged::Built(domain) => Arc::new(*domain),
            };
            (name, domain)
        })
        .collect()
}
