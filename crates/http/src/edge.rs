//! The transport-free edge: request facts in, one [`EdgeVerdict`] out.
//!
//! Every edge over a [`Policy`] (the tower [`PolicyLayer`](crate::PolicyLayer), tollgate-pingora's
//! filters, tollgate-server's RLS and JSON answers) goes through this module and only renders what
//! it returns:
//!
//! 1. [`RequestFacts`] (peer address, method, path, headers) become descriptors, named by one
//!    [`DescriptorNames`] (defaults: `remote_address`, `route`, `method`; headers you add);
//! 2. [`Policy::check_next_at`] decides them;
//! 3. [`EdgeVerdict::of_check`] turns the decision into the status to answer, the delay to hold,
//!    and the `RateLimit`, `RateLimit-Policy` and `Retry-After` values, each computed here once.
//!
//! # One answer per question (the rows that used to differ between edges)
//!
//! | | tower layer | Pingora | Envoy RLS (tollgate-server) |
//! |---|---|---|---|
//! | descriptor names | [`DescriptorNames`] | [`DescriptorNames`] | Envoy's (the route's actions name them) |
//! | an empty header value | dropped | dropped | — (Envoy builds the descriptors) |
//! | a cost no rule can ever admit | 413, no `Retry-After` | 413, no `Retry-After` | `OVER_LIMIT`, no `Retry-After` |
//! | a two-stage delay | held (tokio timer) | held (tokio timer, in `request_filter`) | refused when the config loads |
//!
//! * **An empty header value is dropped**, like an absent header: the descriptor is left out, so
//!   rules that match it do not apply. Sending `""` would put every request without a real value
//!   on one shared key (one client's empty API key throttling every other one's).
//! * **A cost no rule can ever admit is 413** (`Payload Too Large`: the request itself is too
//!   large for the quota) with no `Retry-After`, because retrying can never succeed; a 429 would
//!   invite a retry loop. Envoy's RLS protocol has only `OK` and `OVER_LIMIT` (Envoy answers 429
//!   for the latter), so the RLS edge answers `OVER_LIMIT`, still without `Retry-After` or
//!   `RateLimit` fields, and tollgate-server's JSON check marks the descriptor `cost_too_large`.
//! * **A two-stage delay is held** by the edges that own the request (the tower layer, Pingora).
//!   An RLS answer cannot hold a request (Envoy forwards on `OK` at once), so tollgate-server
//!   refuses a domain with a delay rule when its config loads instead of silently admitting
//!   without the wait.
//!
//! # `r` and `t` on a denial of more than one unit
//!
//! `RateLimit`'s `r` and `t` describe the key's quota, not the request (see [`crate::headers`]):
//! `r` is the units the key could spend now and `t` the seconds until it could spend more than
//! `r`. A denial consumes nothing, so after a denial of cost 3 with 2 units left, `r=2` and `t` is
//! the wait for a third unit; `Retry-After` is the wait until the 3 units fit (never shorter than
//! `t`). This is what the keyed layer always did; the policy paths used to answer `r=0` and the
//! cost's wait as `t`, which tells a client that could send a smaller request now that it cannot.
//! It costs two read-only lookups, on such denials only. A store that cannot look without a round
//! trip (Redis in tollgate-server) passes no look-up and gets the conservative values, `r=0` and
//! `t` = `Retry-After`: never a promise the quota does not keep.

use std::cell::OnceCell;
use std::fmt;
use std::sync::Arc;

use http::StatusCode;
use http::header::HeaderName;
use tollgate_core::{Clock, MonotonicClock, Nanos};
use tollgate_policy::{Admission, Policy, PolicyError};

use crate::explain::{ExplainHeader, refused};
use crate::key::ClientIp;
use crate::policy_fields::PolicyFields;

mod addr_text;
mod descriptors;
mod verdict;

pub use crate::facts::RequestFacts;
pub(crate) use descriptors::with_descriptors;
pub use descriptors::{DescriptorNames, DescriptorSourceError};
pub use verdict::{Admitted, EdgeVerdict};

/// A [`Policy`] as an HTTP edge sees it: descriptors from [`RequestFacts`], one decision, one
/// [`EdgeVerdict`]. Cheap to share behind an `Arc`; the tower layer and tollgate-pingora each
/// hold one.
///
/// ```
/// use std::sync::Arc;
/// use http::{HeaderMap, StatusCode};
/// use tollgate_http::{ClientIp, PolicyEdge, RequestFacts};
/// use tollgate_policy::{Policy, PolicyConfig};
///
/// let policy = Arc::new(Policy::new(PolicyConfig::from_toml(r#"
///     [[rules]]
///     name = "per_ip"
///     match = { remote_address = "any" }
///     key = ["remote_address"]
///     limit = 1
///     period = "1m"
///     capacity = 1024
/// "#)?)?);
/// let edge = PolicyEdge::new(policy).client_ip(ClientIp::trusting([]));
/// let headers = HeaderMap::new();
/// let facts = RequestFacts {
///     peer: Some([192, 0, 2, 1].into()),
///     method: "GET",
///     path: "/",
///     headers: &headers,
/// };
/// assert_eq!(edge.decide(&facts, 1).status, StatusCode::OK);
/// let denied = edge.decide(&facts, 1);
/// assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
/// assert_eq!(denied.retry_after, Some(60));
/// assert_eq!(denied.fields.unwrap().ratelimit, "\"per_ip\";r=0;t=60");
/// assert_eq!(edge.decide(&facts, 2).status, StatusCode::PAYLOAD_TOO_LARGE);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct PolicyEdge<C = MonotonicClock> {
    policy: Arc<Policy<C>>,
    client_ip: Option<ClientIp>,
    names: DescriptorNames,
    fields: PolicyFields,
    /// The opt-in trace header and whom it is for (`None`, the default: never).
    pub(crate) explain: Option<ExplainHeader>,
}

impl<C> fmt::Debug for PolicyEdge<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyEdge")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

impl<C: Clock + Clone + 'static> PolicyEdge<C> {
    /// An edge over `policy` (share the `Arc` to reload it), with the default
    /// [`DescriptorNames`] and no client address until [`client_ip`](Self::client_ip).
    pub fn new(policy: Arc<Policy<C>>) -> Self {
        PolicyEdge {
            policy,
            client_ip: None,
            names: DescriptorNames::default(),
            fields: PolicyFields::new(),
            explain: None,
        }
    }

    /// The client address, through `client`'s trusted-proxy logic, as the client descriptor.
    pub fn client_ip(mut self, client: ClientIp) -> Self {
        self.client_ip = Some(client);
        self
    }

    /// The descriptor names.
    pub fn names(mut self, names: DescriptorNames) -> Self {
        self.names = names;
        self
    }

    /// Also passes request header `header` to the policy as descriptor `name`
    /// ([`DescriptorNames::header`]): an absent, empty or non-text value leaves it out.
    ///
    /// # Errors
    /// [`DescriptorSourceError`] for an invalid header name, or past 13 headers.
    pub fn header(mut self, header: &str, name: &str) -> Result<Self, DescriptorSourceError> {
        self.names = std::mem::take(&mut self.names).header(header, name)?;
        Ok(self)
    }

    pub(crate) fn descriptor_sources(&mut self) -> (&mut Option<ClientIp>, &mut DescriptorNames) {
        (&mut self.client_ip, &mut self.names)
    }

    /// The policy.
    pub fn policy(&self) -> &Arc<Policy<C>> {
        &self.policy
    }

    /// Calls `f` with the descriptors of `facts` (what [`decide`](Self::decide) decides), built on
    /// the stack: an edge that sends descriptors elsewhere (to an RLS) builds them the same way.
    pub fn with_descriptors<R>(
        &self,
        facts: &RequestFacts<'_>,
        f: impl FnOnce(&[(&str, &str)]) -> R,
    ) -> R {
        with_descriptors(&self.names, self.client_ip.as_ref(), facts, f)
    }

    /// Decides `facts` for `cost` units: as [`EdgeVerdict::decide`] of the descriptors
    /// [`with_descriptors`](Self::with_descriptors) lists, building only those the policy's rules
    /// use ([`Policy::check_next_by_at`]); for a request the
    /// [`explain_header`](Self::explain_header) predicate trusts, with the decision's trace in
    /// [`EdgeVerdict::explain`].
    pub fn decide(&self, facts: &RequestFacts<'_>, cost: u64) -> EdgeVerdict {
        if let Some(explain) = self.explain_for(facts) {
            return self.decide_explained(facts, cost, explain);
        }
        let client = OnceCell::new();
        let client_ip = self.client_ip.as_ref();
        let value = |i: usize| self.names.value(i, client_ip, facts, &client);
        let schema = self.names.schema();
        let now = self.policy.now();
        let checked = self.policy.check_next_by_at(schema, value, now, cost);
        let rule = checked.as_ref().ok().and_then(|(d, _)| d.rule);
        EdgeVerdict::of_check(checked, cost, &self.fields, |units| {
            self.policy
                .peek_rule_by_at(rule?, schema, value, now, units)?
                .ok()
        })
    }

    /// Reserves `estimate` units for `facts` ([`Policy::reserve_at`]: decided as a check of the
    /// estimate, atomic over the request's rules): the verdict to render and, when admitted, the
    /// reservation to settle with the actual cost ([`Policy::settle`]). The tower
    /// [`SettleLayer`](crate::SettleLayer) and tollgate-pingora's settle filters both reserve
    /// here. A two-stage rule's delay is not held by either (use rules without `delay` for cost
    /// budgets).
    pub fn reserve(
        &self,
        facts: &RequestFacts<'_>,
        estimate: u64,
    ) -> (EdgeVerdict, Option<tollgate_policy::Reservation>) {
        let policy = &self.policy;
        self.with_descriptors(facts, |descriptors| {
            let now = policy.now();
            let (checked, reservation) = match policy.reserve_at(descriptors, now, estimate) {
                Ok(reserved) => (Ok((reserved.decision, None)), reserved.reservation),
                Err(error) => (Err(error), None),
            };
            let rule = checked.as_ref().ok().and_then(|(d, _)| d.rule);
            let verdict = EdgeVerdict::of_check(checked, estimate, &self.fields, |units| {
                policy.peek_rule_at(rule?, descriptors, now, units)?.ok()
            });
            (verdict, reservation)
        })
    }
}

// The same decisions with their trace, for a request the explain option trusts (the option and
// its rendering are in `explain.rs`; see its module docs for whom it is for).
impl<C: Clock + Clone + 'static> PolicyEdge<C> {
    /// Adds the decision's trace, as response header `name`, to the answer of every request
    /// `trust` accepts (see the [module docs](crate::explain)); default: never. `trust` sees the
    /// request's facts (the TCP peer, method, path and headers) and should accept only callers
    /// the operator trusts: the trace shows every rule's keys, quotas and remaining units.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use http::{HeaderMap, HeaderValue};
    /// use tollgate_http::headers::TOLLGATE_EXPLAIN;
    /// use tollgate_http::{ClientIp, PolicyEdge, RequestFacts};
    /// use tollgate_policy::{Policy, PolicyConfig};
    ///
    /// let policy = Arc::new(Policy::new(PolicyConfig::from_toml(r#"
    ///     [[rules]]
    ///     name = "per_ip"
    ///     match = { remote_address = "any" }
    ///     key = ["remote_address"]
    ///     limit = 1
    ///     period = "1m"
    ///     capacity = 1024
    /// "#)?)?);
    /// // Traces for peers on the operators' network only.
    /// let ops: ipnet::IpNet = "10.9.0.0/16".parse()?;
    /// let edge = PolicyEdge::new(policy)
    ///     .client_ip(ClientIp::trusting([]))
    ///     .explain_header(TOLLGATE_EXPLAIN.clone(), move |facts| {
    ///         facts.peer.is_some_and(|peer| ops.contains(&peer))
    ///     });
    /// let headers = HeaderMap::new();
    /// let from = |peer: [u8; 4]| RequestFacts {
    ///     peer: Some(peer.into()),
    ///     method: "GET",
    ///     path: "/",
    ///     headers: &headers,
    /// };
    /// assert!(edge.decide(&from([192, 0, 2, 1]), 1).explain.is_none());
    /// let operator = from([10, 9, 0, 7]);
    /// edge.decide(&operator, 1);
    /// let denied = edge.decide(&operator, 1);
    /// let trace = denied.explain.expect("trusted");
    /// assert!(trace.value.to_str()?.starts_with("denied by per_ip; per_ip: key `10.9.0.7` denied"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn explain_header(
        mut self,
        name: HeaderName,
        trust: impl Fn(&RequestFacts<'_>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.explain = Some(ExplainHeader::new(name, trust));
        self
    }

    /// The explain option, when it is set and trusts `facts`.
    #[inline]
    pub(crate) fn explain_for(&self, facts: &RequestFacts<'_>) -> Option<&ExplainHeader> {
        self.explain.as_ref().filter(|e| e.trusts(facts))
    }

    /// [`decide`](Self::decide) with the trace: [`Policy::explain_next_at`] decides, and the
    /// verdict is worked out from its answer as from `check_next_at`'s.
    ///
    /// [`Policy::explain_next_at`]: tollgate_policy::Policy::explain_next_at
    pub(crate) fn decide_explained(
        &self,
        facts: &RequestFacts<'_>,
        cost: u64,
        explain: &ExplainHeader,
    ) -> EdgeVerdict {
        self.with_descriptors(facts, |descriptors| {
            let policy = self.policy();
            let now = policy.now();
            let (checked, text) = match policy.explain_next_at(descriptors, now, cost) {
                Ok((decided, next, why)) => (Ok((decided, next)), why.to_string()),
                Err(error) => {
                    let text = refused(&error);
                    (Err(error), text)
                }
            };
            let rule = checked.as_ref().ok().and_then(|(d, _)| d.rule);
            let mut verdict = EdgeVerdict::of_check(checked, cost, &self.fields, |units| {
                policy.peek_rule_at(rule?, descriptors, now, units)?.ok()
            });
            verdict.explain = Some(explain.field(&text));
            verdict
        })
    }

    /// [`admit`](Self::admit) with the trace ([`Policy::admit_explained_at`]).
    ///
    /// [`Policy::admit_explained_at`]: tollgate_policy::Policy::admit_explained_at
    pub(crate) fn admit_explained(
        &self,
        facts: &RequestFacts<'_>,
        cost: u64,
        explain: &ExplainHeader,
    ) -> Admitted {
        self.with_descriptors(facts, |descriptors| {
            let policy = self.policy();
            let now = policy.now();
            let (admitted, text) = match policy.admit_explained_at(descriptors, now, cost) {
                Ok((admission, why)) => (Ok(admission), why.to_string()),
                Err(error) => {
                    let text = refused(&error);
                    (Err(error), text)
                }
            };
            let mut admitted = self.render_admission(admitted, descriptors, now, cost);
            admitted.verdict.explain = Some(explain.field(&text));
            admitted
        })
    }
}

// Rate and concurrency rules as one: what the tower `AdmitLayer` and tollgate-pingora render.
impl<C: Clock + Clone + 'static> PolicyEdge<C> {
    /// Decides `facts` for `cost` units against the policy's rate and concurrency rules as one
    /// ([`Policy::admit_at`](tollgate_policy::Policy::admit_at)); for a request the
    /// [`explain_header`](Self::explain_header) predicate trusts, with the decision's trace in
    /// [`EdgeVerdict::explain`].
    pub fn admit(&self, facts: &RequestFacts<'_>, cost: u64) -> Admitted {
        if let Some(explain) = self.explain_for(facts) {
            return self.admit_explained(facts, cost, explain);
        }
        self.with_descriptors(facts, |descriptors| {
            let now = self.policy().now();
            let admitted = self.policy().admit_at(descriptors, now, cost);
            self.render_admission(admitted, descriptors, now, cost)
        })
    }

    /// The verdict for what `admit_at` (or its explained twin) answered for `descriptors`.
    pub(crate) fn render_admission(
        &self,
        admitted: Result<Admission, PolicyError>,
        descriptors: &[(&str, &str)],
        now: Nanos,
        cost: u64,
    ) -> Admitted {
        let policy = self.policy();
        let admission = match admitted {
            Ok(admission) => admission,
            Err(error) => {
                return Admitted {
                    verdict: EdgeVerdict::of_check(Err(error), cost, &self.fields, |_| None),
                    admission: None,
                };
            }
        };
        let rule = admission.decision.rule;
        let checked = Ok((admission.decision, admission.next_unit()));
        let mut verdict = EdgeVerdict::of_check(checked, cost, &self.fields, |n| {
            policy.peek_rule_at(rule?, descriptors, now, n)?.ok()
        });
        if admission.denied_by_concurrency() {
            verdict.status = StatusCode::SERVICE_UNAVAILABLE;
            verdict.fields = None;
        }
        Admitted {
            admission: verdict.allowed.then_some(admission),
            verdict,
        }
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use super::*;
    use crate::edge::descriptors::MAX_HEADER_DESCRIPTORS;

    fn descriptors(edge: &PolicyEdge, facts: &RequestFacts<'_>) -> Vec<(String, String)> {
        edge.with_descriptors(facts, |d| {
            d.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        })
    }

    #[test]
    fn names_are_configurable_and_empty_values_are_dropped() {
        let policy = Policy::new(tollgate_policy::PolicyConfig::default()).expect("policy");
        let edge = PolicyEdge::new(Arc::new(policy)).client_ip(ClientIp::trusting([]));
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", http::HeaderValue::from_static(""));
        headers.insert("x-tenant", http::HeaderValue::from_static("acme"));
        let facts = RequestFacts {
            peer: Some([192, 0, 2, 1].into()),
            method: "GET",
            path: "/a",
            headers: &headers,
        };
        let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        assert_eq!(
            descriptors(&edge, &facts),
            [
                pair("remote_address", "192.0.2.1"),
                pair("route", "/a"),
                pair("method", "GET"),
            ]
        );
        let edge = edge.names(
            DescriptorNames::default()
                .client(Some("ip"))
                .route(Some("path"))
                .method(None)
                .header("x-api-key", "api_key")
                .expect("header")
                .header("x-tenant", "tenant")
                .expect("header"),
        );
        assert_eq!(
            descriptors(&edge, &facts),
            [
                pair("ip", "192.0.2.1"),
                pair("path", "/a"),
                pair("tenant", "acme")
            ],
            "the empty API key is left out, not sent as \"\""
        );
        let no_peer = RequestFacts {
            peer: None,
            ..facts
        };
        assert_eq!(
            descriptors(&edge, &no_peer),
            [pair("path", "/a"), pair("tenant", "acme")]
        );
        let mut names = DescriptorNames::default();
        for i in 0..MAX_HEADER_DESCRIPTORS {
            names = names.header(&format!("x-h{i}"), "h").expect("fits");
        }
        assert!(names.header("x-one-more", "h").is_err());
        assert!(
            DescriptorNames::default()
                .header("bad header", "h")
                .is_err()
        );
    }
}
