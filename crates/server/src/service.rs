//! The decision shared by the gRPC and HTTP front ends: a request's descriptors through its
//! domain's policy, and the live set of domains that reloads replace.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use http::{HeaderName, HeaderValue};
use tollgate_core::Decision;
use tollgate_core::MonotonicClock;
use tollgate_http::headers::{RATELIMIT, RATELIMIT_POLICY, seconds_value};
use tollgate_http::{EdgeVerdict, PolicyFields};
use tollgate_policy::{Explanation, Policy, PreparedReload, RedisPolicy};

use crate::charge;
use crate::config::{Backend, DescriptorMode, ServerConfig};
use crate::redis_backend::{self, Connections};
use crate::reservations::{Full, NotOpen, Reservations};
use crate::telemetry::DecisionMetrics;

/// Most descriptors one request may carry; more is a malformed request.
pub const MAX_DESCRIPTORS: usize = 64;
/// Most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 32;

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
    fn is_atomic(&self) -> bool {
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

/// The live domains and the decision over them.
pub struct LiveDomains {
    domains: ArcSwap<Domains>,
    connections: Connections,
    /// Serialises [`reload`](LiveDomains::reload)s: each holds every kept domain's policy reload lock
    /// between preparing and committing, and two taking them in different orders would deadlock.
    reloads: std::sync::Mutex<()>,
    /// Reservations open until settled (`POST /v1/reserve`, `POST /v1/settle`).
    reservations: Reservations,
}

/// Why a request could not be decided (answered with an error, not a decision).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestError {
    /// The domain is not configured.
    UnknownDomain(String),
    /// The request is malformed (no domain, no descriptors, an empty entry key, too many ...).
    Malformed(String),
}

/// A whole request's answer: tollgate-http's [`EdgeVerdict`] per descriptor (the same verdict the
/// tower layer and Pingora render), and which one the response's fields describe.
///
/// A descriptor whose cost no enforcing rule can ever admit has the verdict's 413, which this
/// edge answers as `OVER_LIMIT` with no `Retry-After` and no fields (Envoy's RLS has no other
/// code; retrying cannot help). A delay rule never gets here: [`ServerConfig`]'s validation
/// refuses it (an RLS answer cannot hold a request).
pub struct Answer {
    /// One verdict per descriptor, in request order.
    pub statuses: Vec<EdgeVerdict>,
    /// Whether every descriptor is OK.
    pub ok: bool,
    /// The descriptor whose fields the response carries: the denying one with the longest wait
    /// when over the limit, else the one with the fewest units left. `None` when no enforcing
    /// rule applied.
    pub deciding: Option<usize>,
    /// The domain's decision metrics, for the front end to record the request with.
    pub metrics: Arc<DecisionMetrics>,
}

impl Answer {
    /// The response headers both front ends send: the deciding descriptor's `RateLimit-Policy`
    /// and `RateLimit`, and `Retry-After` on a denial.
    pub fn headers(&self) -> Vec<(&'static HeaderName, HeaderValue)> {
        let Some(verdict) = self.deciding.and_then(|i| self.statuses.get(i)) else {
            return Vec::new();
        };
        let mut headers = Vec::with_capacity(3);
        if let Some(f) = &verdict.fields {
            headers.push((&RATELIMIT_POLICY, f.ratelimit_policy.clone()));
            headers.push((&RATELIMIT, f.ratelimit.to_value()));
        }
        if let Some(secs) = verdict.retry_after {
            headers.push((&http::header::RETRY_AFTER, seconds_value(secs)));
        }
        headers
    }
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
            return Ok(charging(domain, &dom, descriptors).await);
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
        let (verdict, why) = explained(dom, policy, entries, (*cost).max(1), policy.now());
        Ok((answer(dom, vec![verdict]), why))
    }
}

/// Why a reservation could not be made (answered with an error, not a decision).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReserveError {
    /// As a check's: an unknown domain or a malformed request.
    Check(RequestError),
    /// The domain is on Redis, where reservations are not built yet.
    OnRedis(String),
    /// The table of open reservations is full ([`Full`]); nothing was decided.
    Full(Full),
}

/// What [`LiveDomains::reserve`] answers: the decision and, when admitted, the reservation's id.
pub struct ReserveAnswer {
    /// The decision, as [`LiveDomains::check`] would answer it for the estimate.
    pub answer: Answer,
    /// The id to settle with, when admitted.
    pub id: Option<String>,
    /// The estimate reserved.
    pub estimate: u64,
}

/// What [`LiveDomains::settle`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SettleAnswer {
    /// The policy's settlement. Its `stale` counts the rules a reload has removed since the
    /// reservation (settling them changed nothing any decision reads); all of them when the
    /// domain itself was removed or rebuilt.
    pub settlement: tollgate_policy::Settlement,
}

impl LiveDomains {
    /// Reserves `estimate` units for one descriptor of an embedded domain, now: the decision is
    /// the one [`check`](Self::check) would give for the estimate (every rule that applies,
    /// decided as one) and, when admitted, the reservation is held in the bounded table until
    /// [`settle`](Self::settle)d or expired (see [`crate::reservations`]).
    ///
    /// # Errors
    /// [`ReserveError`]: an unknown domain, a malformed request (more than one descriptor
    /// included), a domain on Redis, or a full table; nothing is consumed.
    pub fn reserve(
        &self,
        domain: &str,
        descriptors: &[(Vec<(&str, &str)>, u64)],
    ) -> Result<ReserveAnswer, ReserveError> {
        validate(domain, descriptors).map_err(ReserveError::Check)?;
        let [(entries, estimate)] = descriptors else {
            return Err(ReserveError::Check(RequestError::Malformed(
                "a reservation takes exactly one descriptor".into(),
            )));
        };
        if charge::is_charge(entries).map_err(ReserveError::Check)? {
            return Err(ReserveError::Check(RequestError::Malformed(
                "a reservation takes a decision, not a charge".into(),
            )));
        }
        let estimate = (*estimate).max(1);
        let dom = {
            let domains = self.domains.load();
            let Some(dom) = domains.get(domain) else {
                return Err(ReserveError::Check(RequestError::UnknownDomain(
                    domain.to_owned(),
                )));
            };
            Arc::clone(dom)
        };
        let DomainPolicy::Embedded(policy) = &dom.policy else {
            return Err(ReserveError::OnRedis(domain.to_owned()));
        };
        // The place first: a full table refuses before anything is taken.
        let slot = self
            .reservations
            .slot(std::time::Instant::now())
            .map_err(ReserveError::Full)?;
        let now = policy.now();
        let (checked, reservation) = match policy.reserve_at(entries, now, estimate) {
            Ok(reserved) => (Ok((reserved.decision, None)), reserved.reservation),
            Err(error) => (Err(error), None),
        };
        let rule = checked.as_ref().ok().and_then(|(d, _)| d.rule);
        let verdict = EdgeVerdict::of_check(checked, estimate, &dom.fields, |units| {
            policy.peek_rule_at(rule?, entries, now, units)?.ok()
        });
        let answer = answer(&dom, vec![verdict]);
        let id = reservation.map(|reservation| {
            slot.fill(
                domain,
                Arc::clone(&dom),
                reservation,
                std::time::Instant::now(),
            )
        });
        Ok(ReserveAnswer {
            answer,
            id,
            estimate,
        })
    }

    /// Settles the reservation `id` at `actual` units now (tollgate-policy's
    /// [`Policy::settle`]): the surplus is given back, or the difference charged (a key with
    /// nothing left goes into debt). A rule a reload has removed since is settled into the state
    /// it had: a no-op, counted in the settlement's `stale`.
    ///
    /// # Errors
    /// [`NotOpen`]: an id never issued, or one already settled or expired (an expired one was
    /// settled at its estimate). Nothing changes.
    pub fn settle(&self, id: &str, actual: u64) -> Result<SettleAnswer, NotOpen> {
        let open = self.reservations.take(id, std::time::Instant::now())?;
        let current = self
            .domains
            .load()
            .get(&open.name)
            .is_some_and(|dom| Arc::ptr_eq(dom, &open.domain));
        let DomainPolicy::Embedded(policy) = &open.domain.policy else {
            // Only embedded domains reserve, and a domain's policy never changes backend (a
            // domain that does is rebuilt whole): not reached. Dropping settles at the estimate.
            return Err(NotOpen::Closed);
        };
        let mut settlement = policy.settle(open.reservation, actual);
        if !current {
            settlement.stale = settlement.rules;
        }
        Ok(SettleAnswer { settlement })
    }

    /// The open reservations' table.
    pub fn reservations(&self) -> &Reservations {
        &self.reservations
    }
}

/// The target of the per-decision trace in the debug log: `RUST_LOG=tollgate_server::explain=debug`
/// logs, for each embedded call of one descriptor, the decision with its trace.
pub const EXPLAIN_TARGET: &str = "tollgate_server::explain";

/// Checks what a request must satisfy before anything is decided.
fn validate(domain: &str, descriptors: &[(Vec<(&str, &str)>, u64)]) -> Result<(), RequestError> {
    if domain.is_empty() {
        return Err(RequestError::Malformed("domain is empty".into()));
    }
    if descriptors.is_empty() {
        return Err(RequestError::Malformed("no descriptors".into()));
    }
    if descriptors.len() > MAX_DESCRIPTORS {
        return Err(RequestError::Malformed(format!(
            "{} descriptors (at most {MAX_DESCRIPTORS})",
            descriptors.len()
        )));
    }
    for (i, (entries, _)) in descriptors.iter().enumerate() {
        if entries.is_empty() {
            return Err(RequestError::Malformed(format!(
                "descriptor {i} has no entries"
            )));
        }
        if entries.len() > MAX_ENTRIES {
            return Err(RequestError::Malformed(format!(
                "descriptor {i} has {} entries (at most {MAX_ENTRIES})",
                entries.len()
            )));
        }
        if entries.iter().any(|(k, _)| k.is_empty()) {
            return Err(RequestError::Malformed(format!(
                "descriptor {i} has an entry with an empty key"
            )));
        }
    }
    Ok(())
}

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

/// Each descriptor as a policy request: its entries and its cost (0 meaning 1: a decision always
/// takes at least one unit).
fn requests<'a>(
    descriptors: &'a [(Vec<(&'a str, &'a str)>, u64)],
) -> Vec<(&'a [(&'a str, &'a str)], u64)> {
    descriptors
        .iter()
        .map(|(entries, cost)| (entries.as_slice(), (*cost).max(1)))
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
            let (verdict, why) = explained(dom, policy, entries, (*cost).max(1), now);
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

/// The answer over every descriptor's verdict.
fn answer(dom: &Domain, statuses: Vec<EdgeVerdict>) -> Answer {
    let ok = statuses.iter().all(|v| v.allowed);
    Answer {
        deciding: deciding(&statuses, ok),
        statuses,
        ok,
        metrics: Arc::clone(&dom.metrics),
    }
}

/// The descriptor whose fields the response carries.
fn deciding(statuses: &[EdgeVerdict], ok: bool) -> Option<usize> {
    let mut best: Option<(usize, u64, Duration)> = None;
    for (i, v) in statuses.iter().enumerate() {
        let Some(d) = &v.decided else { continue };
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

/// One domain of a config being applied, ready but not live.
enum Staged<'a> {
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
fn build<'a>(
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
fn commit(staged: Vec<(String, Staged<'_>)>) -> Domains {
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
