//! The decision shared by the gRPC and HTTP front ends: a request's descriptors through its
//! domain's policy, and the live set of domains that reloads replace.

use std::sync::Arc;

use arc_swap::ArcSwap;
use tollgate_http::EdgeVerdict;
use tollgate_policy::{Explanation, Policy};

use crate::answer::{Answer, answer};
use crate::charge;
use crate::config::ServerConfig;
use crate::domain::{Domain, DomainPolicy, Domains, build, commit};
use crate::redis_backend::Connections;
use crate::request::{RequestError, validate};
use crate::reservations::Reservations;

/// The live domains and the decision over them.
pub struct LiveDomains {
    pub(crate) domains: ArcSwap<Domains>,
    connections: Connections,
    /// Serialises [`reload`](LiveDomains::reload)s: each holds every kept domain's policy reload lock
    /// between preparing and committing, and two taking them in different orders would deadlock.
    reloads: std::sync::Mutex<()>,
    /// Reservations open until settled (`POST /v1/reserve`, `POST /v1/settle`).
    pub(crate) reservations: Reservations,
}

impl LiveDomains {
    /// Builds every domain of `config`.
    ///
    /// # Errors
    /// The first domain whose policy cannot be built.
    pub fn new(config: &ServerConfig) -> Result<Self, String> {
        let connections = Connections::default();
        let domains = commit(build(config, None, &connections)?);
        Ok(LiveDomains {
            domains: ArcSwap::from_pointee(domains),
            connections,
            reloads: std::sync::Mutex::new(()),
            reservations: Reservations::new(config.server.reservations),
        })
    }

    /// Applies a new config, all or nothing across its domains, with the policy engine's reload
    /// semantics per domain: an embedded domain that stays keeps its policy (unchanged rules keep
    /// their state, so no fresh burst); new domains start fresh; removed ones go; a Redis domain
    /// is rebuilt (its state is in Redis; unchanged rules keep their limiters).
    ///
    /// First every domain is prepared, changing nothing live: each kept domain's reload is
    /// prepared ([`Policy::prepare_reload`]: built and checked against the live tables, no
    /// throwaway policy) and each new or rebuilt domain is built. When any fails, those
    /// preparations are dropped and nothing has changed. Only then are the kept domains' reloads
    /// committed (which cannot fail) and the domain map swapped. In the moment between the first
    /// commit and the swap (nothing there can fail) a request may see a kept domain's new rules
    /// while an added domain is not there yet.
    ///
    /// # Errors
    /// The first domain that fails; the old config stays in force, every domain as it was.
    pub fn reload(&self, config: &ServerConfig) -> Result<(), String> {
        let _serial = self
            .reloads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let current = self.domains.load_full();
        let next = commit(build(config, Some(&current), &self.connections)?);
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
    /// All rules that apply to one descriptor are decided as one, embedded or on Redis (the policy
    /// engine's guarantee: a denial gives back what the other rules admitted). The descriptors of
    /// one call are decided as one too, by default (`descriptors = "atomic"`): when any is over its
    /// limit, what the others admitted is given back. With `descriptors = "independent"` they are
    /// decided as Envoy's reference service decides them: an admitted descriptor keeps its units
    /// even when another of the same call is over its limit.
    ///
    /// # Errors
    /// [`RequestError`] for an unknown domain or a malformed request; nothing is consumed.
    pub async fn check(
        &self,
        domain: &str,
        descriptors: &[(Vec<(&str, &str)>, u64)],
    ) -> Result<Answer, RequestError> {
        validate(domain, descriptors)?;
        let charges = charge::any_charge(descriptors)?;
        let dom = {
            let domains = self.domains.load();
            let Some(dom) = domains.get(domain) else {
                return Err(RequestError::UnknownDomain(domain.to_owned()));
            };
            if let (DomainPolicy::Embedded(policy), false) = (&dom.policy, charges) {
                return Ok(embedded(domain, dom, policy, descriptors));
            }
            // Held across the Redis calls: a reload meanwhile does not pull the rules away.
            Arc::clone(dom)
        };
        if charges {
            // Boxed: a call with charges is rare, and its future would otherwise size every call's.
            return Ok(Box::pin(charging(domain, &dom, descriptors)).await);
        }
        Ok(on_redis(&dom, descriptors).await)
    }

    /// [`check`](Self::check) of one descriptor with the decision's trace
    /// ([`Policy::explain_at`]): `POST /v1/check` with `"explain": true`. The same decision as
    /// `check` (it consumes as `check` does).
    ///
    /// # Errors
    /// As [`check`](Self::check), and [`RequestError::Malformed`] for more than one descriptor or a
    /// domain on Redis (whose state a trace cannot look at without round trips).
    pub fn explain(
        &self,
        domain: &str,
        descriptors: &[(Vec<(&str, &str)>, u64)],
    ) -> Result<(Answer, Explanation), RequestError> {
        validate(domain, descriptors)?;
        let [(entries, cost)] = descriptors else {
            return Err(RequestError::Malformed(
                "explain takes exactly one descriptor".into(),
            ));
        };
        if charge::is_charge(entries)? {
            return Err(RequestError::Malformed(
                "explain takes a decision, not a charge".into(),
            ));
        }
        let domains = self.domains.load();
        let Some(dom) = domains.get(domain) else {
            return Err(RequestError::UnknownDomain(domain.to_owned()));
        };
        let DomainPolicy::Embedded(policy) = &dom.policy else {
            return Err(RequestError::Malformed(format!(
                "explain needs an embedded domain; `{domain}` is on redis"
            )));
        };
        let (verdict, why) = explained(dom, policy, entries, *cost, policy.now());
        Ok((answer(dom, vec![verdict]), why))
    }
}

/// The target of the per-decision trace in the debug log: `RUST_LOG=tollgate_server::explain=debug`
/// logs, for each embedded call of one descriptor, the decision with its trace.
pub const EXPLAIN_TARGET: &str = "tollgate_server::explain";

/// One descriptor of an embedded domain decided with its trace, as [`EdgeVerdict::decide`] would
/// decide it.
fn explained(
    dom: &Domain,
    policy: &Policy,
    entries: &[(&str, &str)],
    cost: u64,
    now: tollgate_core::Nanos,
) -> (EdgeVerdict, Explanation) {
    let (checked, why) = match policy.explain_next_at(entries, now, cost) {
        Ok((decision, next, why)) => (Ok((decision, next)), why),
        Err(error) => (
            Err(error),
            Explanation {
                rules: Vec::new(),
                deciding: None,
                allowed: false,
                dry_run: policy.dry_run(),
            },
        ),
    };
    let rule = checked.as_ref().ok().and_then(|(d, _)| d.rule);
    let verdict = EdgeVerdict::of_check(checked, cost, &dom.fields, |units| {
        policy.peek_rule_at(rule?, entries, now, units)?.ok()
    });
    (verdict, why)
}

/// A call with charges ([`crate::charge`]): each charged descriptor charged and answered `OK`, the
/// others decided together as a call of their own would be, the answers in request order.
async fn charging(name: &str, dom: &Domain, descriptors: &[(Vec<(&str, &str)>, u64)]) -> Answer {
    let mut statuses: Vec<Option<EdgeVerdict>> = Vec::with_capacity(descriptors.len());
    let mut decided = Vec::new();
    for (entries, cost) in descriptors {
        // Checked by the caller: no marker has another value.
        if charge::is_charge(entries).unwrap_or(false) {
            charge::charge(name, dom, &charge::unmarked(entries), *cost).await;
            statuses.push(Some(charge::charged_verdict(dom)));
        } else {
            decided.push((entries.clone(), *cost));
            statuses.push(None);
        }
    }
    let mut rest = if decided.is_empty() {
        Vec::new()
    } else {
        let answer = match &dom.policy {
            DomainPolicy::Embedded(policy) => embedded(name, dom, policy, &decided),
            DomainPolicy::Redis(_) => on_redis(dom, &decided).await,
        };
        answer.statuses
    }
    .into_iter();
    let statuses = statuses
        .into_iter()
        // One verdict per decided descriptor, in order.
        .filter_map(|status| status.or_else(|| rest.next()))
        .collect();
    answer(dom, statuses)
}

/// A Redis domain's answer: each descriptor through its [`RedisPolicy`]. A look at a rule would
/// cost a round trip, so a denial of more than one unit gets the conservative fields (see
/// [`tollgate_http::edge`]).
async fn on_redis(dom: &Domain, descriptors: &[(Vec<(&str, &str)>, u64)]) -> Answer {
    let policy = match &dom.policy {
        DomainPolicy::Embedded(policy) => return embedded("", dom, policy, descriptors),
        DomainPolicy::Redis(policy) => policy,
    };
    let requests = requests(descriptors);
    let statuses = if dom.is_atomic() {
        let checked = policy.check_all(&requests).await;
        checked
            .into_iter()
            .zip(&requests)
            .map(|(checked, &(_, cost))| {
                EdgeVerdict::of_check(checked, cost, &dom.fields, |_| None)
            })
            .collect()
    } else {
        let mut statuses = Vec::with_capacity(requests.len());
        for &(entries, cost) in &requests {
            let checked = policy.check(entries, cost).await;
            statuses.push(EdgeVerdict::of_check(checked, cost, &dom.fields, |_| None));
        }
        statuses
    };
    answer(dom, statuses)
}

/// Each descriptor as a policy request: its entries and its cost. A cost of 0 (a descriptor's
/// explicit `hits_addend` of 0; the request's 0 already means 1) is a decision that takes nothing:
/// admitted unless a rule's key is overdrawn, as Envoy's reference service answers it.
fn requests<'a>(
    descriptors: &'a [(Vec<(&'a str, &'a str)>, u64)],
) -> Vec<(&'a [(&'a str, &'a str)], u64)> {
    descriptors
        .iter()
        .map(|(entries, cost)| (entries.as_slice(), *cost))
        .collect()
}

/// An embedded domain's answer: every descriptor through the policy at one clock reading. With
/// [`EXPLAIN_TARGET`] at debug, a call of one descriptor is decided with its trace, and the trace
/// logged (the same decision: one descriptor is its own group).
fn embedded(
    name: &str,
    dom: &Domain,
    policy: &Policy,
    descriptors: &[(Vec<(&str, &str)>, u64)],
) -> Answer {
    let now = policy.now();
    if let [(entries, cost)] = descriptors {
        if tracing::enabled!(target: EXPLAIN_TARGET, tracing::Level::DEBUG) {
            let (verdict, why) = explained(dom, policy, entries, *cost, now);
            tracing::debug!(target: EXPLAIN_TARGET, domain = name, descriptor = ?entries, "{why}");
            return answer(dom, vec![verdict]);
        }
    }
    let requests = requests(descriptors);
    let statuses = if dom.is_atomic() {
        policy
            .check_all_at(&requests, now)
            .into_iter()
            .zip(&requests)
            .map(|(checked, &(entries, cost))| {
                let rule = checked.as_ref().ok().and_then(|(d, _)| d.rule);
                EdgeVerdict::of_check(checked, cost, &dom.fields, |units| {
                    policy.peek_rule_at(rule?, entries, now, units)?.ok()
                })
            })
            .collect()
    } else {
        requests
            .iter()
            .map(|&(entries, cost)| EdgeVerdict::decide(policy, entries, now, cost, &dom.fields))
            .collect()
    };
    answer(dom, statuses)
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
        let limiter = LiveDomains::new(&config(Some("redis://127.0.0.1:1/"))).expect("limiter");
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
