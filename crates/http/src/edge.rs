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
use std::fmt::{self, Write as _};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;
use http::{HeaderMap, StatusCode};
use tollgate_core::{Clock, Decision, MonotonicClock};
use tollgate_policy::{DescriptorSchema, Policy, PolicyDecision, PolicyError};

use crate::explain::ExplainHeader;
use crate::headers::{self, ExplainField};
use crate::key::{ClientIp, RequestHead};
use crate::policy_fields::{FieldValues, PolicyFields};

/// Headers one request can turn into descriptors (beside the client address, route and method).
pub(crate) const MAX_HEADER_DESCRIPTORS: usize = 13;
/// Descriptors one request can carry.
const MAX_DESCRIPTORS: usize = MAX_HEADER_DESCRIPTORS + 3;

/// What an edge knows about a request before deciding it, independent of its transport.
#[derive(Clone, Copy, Debug)]
pub struct RequestFacts<'a> {
    /// The TCP peer (`None` when the transport does not say).
    pub peer: Option<IpAddr>,
    /// The method.
    pub method: &'a str,
    /// The path (no query).
    pub path: &'a str,
    /// The header fields.
    pub headers: &'a HeaderMap,
}

impl<'a> RequestFacts<'a> {
    /// The facts of a tower/hyper request head (its peer from the extensions, as
    /// [`RequestHead::peer_addr`] finds it).
    pub fn of(head: &RequestHead<'a>) -> Self {
        RequestFacts {
            peer: head.peer_addr().map(|a| a.ip()),
            method: head.method.as_str(),
            path: head.uri.path(),
            headers: head.headers,
        }
    }
}

/// A header name that is not a valid HTTP field name, or more headers than a request can carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptorSourceError {
    header: String,
}

impl fmt::Display for DescriptorSourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "header `{}` cannot be a descriptor source (not a field name, or more than \
             {MAX_HEADER_DESCRIPTORS} headers)",
            self.header
        )
    }
}

impl std::error::Error for DescriptorSourceError {}

/// The descriptor each request fact becomes: the one place descriptor names are set, for every
/// HTTP edge.
///
/// Defaults: the client address as `remote_address` (when the edge has a [`ClientIp`]), the path
/// as `route`, the method as `method`, no headers.
///
/// ```
/// use tollgate_http::DescriptorNames;
/// let names = DescriptorNames::default()
///     .route(Some("path"))
///     .method(None)
///     .header("x-api-key", "api_key")?;
/// # let _ = names;
/// # Ok::<(), tollgate_http::DescriptorSourceError>(())
/// ```
#[derive(Clone, Debug)]
pub struct DescriptorNames {
    client: Option<Box<str>>,
    route: Option<Box<str>>,
    method: Option<Box<str>>,
    headers: Vec<(HeaderName, Box<str>)>,
    /// The names above that are set, in descriptor order, for [`Policy::check_next_by_at`];
    /// `sources[i]` is where name `i`'s value comes from. Rebuilt by every setter.
    schema: DescriptorSchema,
    sources: Vec<Source>,
}

/// Where a [`DescriptorNames`] schema position's value comes from.
#[derive(Clone, Copy, Debug)]
enum Source {
    Client,
    Route,
    Method,
    /// `headers[i]`.
    Header(usize),
}

impl Default for DescriptorNames {
    fn default() -> Self {
        DescriptorNames {
            client: Some("remote_address".into()),
            route: Some("route".into()),
            method: Some("method".into()),
            headers: Vec::new(),
            schema: DescriptorSchema::default(),
            sources: Vec::new(),
        }
        .with_schema()
    }
}

impl DescriptorNames {
    /// The descriptor name for the client address (`remote_address` by default; `None` leaves it
    /// out).
    pub fn client(mut self, name: Option<&str>) -> Self {
        self.client = name.map(Into::into);
        self.with_schema()
    }

    /// The descriptor name for the path (`route` by default; `None` leaves it out).
    pub fn route(mut self, name: Option<&str>) -> Self {
        self.route = name.map(Into::into);
        self.with_schema()
    }

    /// The descriptor name for the method (`method` by default; `None` leaves it out).
    pub fn method(mut self, name: Option<&str>) -> Self {
        self.method = name.map(Into::into);
        self.with_schema()
    }

    /// Sets `schema` and `sources` from the names, in the order `with_descriptors` lists them.
    fn with_schema(mut self) -> Self {
        let fixed = [
            (self.client.as_deref(), Source::Client),
            (self.route.as_deref(), Source::Route),
            (self.method.as_deref(), Source::Method),
        ];
        let named: Vec<(&str, Source)> = fixed
            .into_iter()
            .filter_map(|(name, source)| Some((name?, source)))
            .chain(
                self.headers
                    .iter()
                    .enumerate()
                    .map(|(i, (_, name))| (&**name, Source::Header(i))),
            )
            .collect();
        let schema = DescriptorSchema::new(named.iter().map(|(name, _)| *name));
        self.sources = named.into_iter().map(|(_, source)| source).collect();
        self.schema = schema;
        self
    }

    /// Request header `header` (an API key, a tenant id) as descriptor `name`; an absent, empty
    /// or non-text value leaves the descriptor out.
    ///
    /// # Errors
    /// [`DescriptorSourceError`] for an invalid field name, or past 13 headers.
    pub fn header(mut self, header: &str, name: &str) -> Result<Self, DescriptorSourceError> {
        let err = || DescriptorSourceError {
            header: header.to_owned(),
        };
        if self.headers.len() == MAX_HEADER_DESCRIPTORS {
            return Err(err());
        }
        let header = HeaderName::try_from(header).map_err(|_| err())?;
        self.headers.push((header, name.into()));
        Ok(self.with_schema())
    }

    /// The value of schema position `i` for `facts`, as `with_descriptors` lists it; the client
    /// address's text is worked out once, into `client`, and only when asked for.
    #[inline]
    fn value<'a>(
        &self,
        i: usize,
        client_ip: Option<&ClientIp>,
        facts: &RequestFacts<'a>,
        client: &'a OnceCell<Option<AddrText>>,
    ) -> Option<&'a str> {
        match *self.sources.get(i)? {
            Source::Client => client
                .get_or_init(|| client_text(client_ip, facts))
                .as_ref()
                .map(AddrText::as_str),
            Source::Route => Some(facts.path),
            Source::Method => Some(facts.method),
            Source::Header(h) => header_text(facts.headers, &self.headers.get(h)?.0),
        }
    }
}

/// An IP address's text on the stack (the longest, an IPv6 address with an IPv4 tail, is 45 bytes).
struct AddrText {
    buf: [u8; 48],
    len: usize,
}

impl fmt::Write for AddrText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        self.buf
            .get_mut(self.len..end)
            .ok_or(fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

impl AddrText {
    /// `ip` as `Display` writes it; IPv4, the common case, digit by digit (`Display` through `fmt`
    /// cost about 40 ns of a Pingora decision in a profile).
    fn of(ip: IpAddr) -> Option<Self> {
        let mut text = AddrText {
            buf: [0; 48],
            len: 0,
        };
        match ip {
            IpAddr::V4(v4) => {
                // At most 15 bytes, byte by byte: a `copy_from_slice` per octet became a `memcpy`
                // call each.
                let mut len = 0;
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        text.buf[len] = b'.';
                        len += 1;
                    }
                    if octet >= 100 {
                        text.buf[len] = b'0' + octet / 100;
                        len += 1;
                    }
                    if octet >= 10 {
                        text.buf[len] = b'0' + octet / 10 % 10;
                        len += 1;
                    }
                    text.buf[len] = b'0' + octet % 10;
                    len += 1;
                }
                text.len = len;
            }
            IpAddr::V6(_) => write!(text, "{ip}").ok()?,
        }
        Some(text)
    }

    fn as_str(&self) -> &str {
        // Only whole `&str`s were copied in.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }
}

/// The client address's text (through `client_ip`'s trusted proxies), if it can be found.
#[inline]
fn client_text(client_ip: Option<&ClientIp>, facts: &RequestFacts<'_>) -> Option<AddrText> {
    client_ip?
        .client_addr(facts.peer?, facts.headers)
        .ok()
        .and_then(AddrText::of)
}

/// A header's first value as text, if present, non-empty and visible ASCII.
fn header_text<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Option<&'h str> {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .filter(|value| !value.is_empty())
}

/// The decision an edge renders: whether to forward, after how long, with which status and
/// which field values. Made by [`PolicyEdge::decide`] or [`EdgeVerdict::of_check`] only.
#[derive(Clone, Debug)]
pub struct EdgeVerdict {
    /// Whether the request goes on (after [`delay`](Self::delay)).
    pub allowed: bool,
    /// What an HTTP edge answers: `200 OK` (forward; the upstream's status is what the client
    /// sees), `429 Too Many Requests`, or `413 Payload Too Large` for a cost no enforcing rule
    /// can ever admit.
    pub status: StatusCode,
    /// How long to hold an admitted request before forwarding it (a two-stage rule's wait; zero
    /// for most).
    pub delay: Duration,
    /// `Retry-After` in whole seconds (rounded up, at least 1): on a 429 only.
    pub retry_after: Option<u64>,
    /// `RateLimit-Policy` and `RateLimit` of the deciding rule with the key's own quota; `None`
    /// when no enforcing rule applied or the cost can never be admitted.
    pub fields: Option<FieldValues>,
    /// The policy's decision (`None` for a cost no rule can ever admit).
    pub decided: Option<PolicyDecision>,
    /// Why it could not be decided (a cost no enforcing rule can ever admit).
    pub error: Option<PolicyError>,
    /// The decision's trace as a response header: only for a request the edge's
    /// [`explain_header`](PolicyEdge::explain_header) predicate trusts, else `None`.
    pub explain: Option<Box<ExplainField>>,
}

impl EdgeVerdict {
    /// The verdict for `checked`, what [`Policy::check_next_at`] answered for `cost` units:
    /// the one place the status, `Retry-After` and the `RateLimit` service limit `(r, t)` are
    /// worked out.
    ///
    /// `peek(units)` is a read-only look at the deciding rule for `units` units (what
    /// `Policy::peek_rule_at` answers); it is asked only on a denial of more than one unit, to
    /// find how many units are left (see the [module docs](self)). A store that cannot look
    /// cheaply answers `None` and gets the conservative `r=0`, `t` = `Retry-After`.
    pub fn of_check(
        checked: Result<(PolicyDecision, Option<Duration>), PolicyError>,
        cost: u64,
        fields: &PolicyFields,
        peek: impl FnMut(u64) -> Option<Decision>,
    ) -> Self {
        let (decided, next_unit) = match checked {
            Ok(checked) => checked,
            Err(error) => {
                return EdgeVerdict {
                    allowed: false,
                    status: StatusCode::PAYLOAD_TOO_LARGE,
                    delay: Duration::ZERO,
                    retry_after: None,
                    fields: None,
                    decided: None,
                    error: Some(error),
                    explain: None,
                };
            }
        };
        let allowed = decided.is_allowed();
        let retry_after = decided.decision.retry_after().map(headers::retry_secs);
        let limit = headers::service_limit(
            &decided.decision,
            cost,
            crate::policy_fields::with_next_unit(&decided.decision, next_unit, peek),
        );
        EdgeVerdict {
            allowed,
            status: if allowed {
                StatusCode::OK
            } else {
                StatusCode::TOO_MANY_REQUESTS
            },
            delay: if allowed {
                decided.delay
            } else {
                Duration::ZERO
            },
            retry_after,
            fields: decided
                .rule
                .zip(decided.quota)
                .and_then(|(rule, quota)| fields.with_limit(rule, quota, limit, retry_after)),
            decided: Some(decided),
            error: None,
            explain: None,
        }
    }

    /// Decides `descriptors` for `cost` units with `policy` at `now`: [`Policy::check_next_at`],
    /// then [`of_check`](Self::of_check) with the policy's own read-only look at the deciding
    /// rule. For a caller that has descriptors rather than request facts (an RLS server).
    pub fn decide<C: Clock + Clone + 'static>(
        policy: &Policy<C>,
        descriptors: &[(&str, &str)],
        now: tollgate_core::Nanos,
        cost: u64,
        fields: &PolicyFields,
    ) -> Self {
        let checked = policy.check_next_at(descriptors, now, cost);
        let rule = checked.as_ref().ok().and_then(|(d, _)| d.rule);
        EdgeVerdict::of_check(checked, cost, fields, |units| {
            policy.peek_rule_at(rule?, descriptors, now, units)?.ok()
        })
    }

    /// Whether the cost asked can never be admitted (answered 413 / `OVER_LIMIT`, no retry).
    pub fn cost_too_large(&self) -> bool {
        self.error.is_some()
    }

    /// Whether a shadow rule (or any rule under dry run) would have denied.
    pub fn shadow_denied(&self) -> bool {
        self.decided.is_some_and(|d| d.shadow_denied)
    }
}

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
    pub(crate) fields: PolicyFields,
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

    /// Changes the descriptor names in place.
    pub fn names_mut(&mut self) -> &mut DescriptorNames {
        &mut self.names
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
        let schema = &self.names.schema;
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

/// Calls `f` with the descriptors of `facts` under `names` (the client address through
/// `client_ip`), built on the stack: every policy edge builds them this way.
pub(crate) fn with_descriptors<R>(
    names: &DescriptorNames,
    client_ip: Option<&ClientIp>,
    facts: &RequestFacts<'_>,
    f: impl FnOnce(&[(&str, &str)]) -> R,
) -> R {
    {
        let client = match names.client {
            Some(_) => client_text(client_ip, facts),
            None => None,
        };
        let fixed = [
            (
                names.client.as_deref(),
                client.as_ref().map(AddrText::as_str),
            ),
            (names.route.as_deref(), Some(facts.path)),
            (names.method.as_deref(), Some(facts.method)),
        ];
        let headers = names
            .headers
            .iter()
            .map(|(header, name)| (Some(&**name), header_text(facts.headers, header)));
        let mut descriptors: [(&str, &str); MAX_DESCRIPTORS] = [("", ""); MAX_DESCRIPTORS];
        let mut len = 0;
        for pair in fixed.into_iter().chain(headers) {
            if let (Some(name), Some(value), Some(slot)) =
                (pair.0, pair.1, descriptors.get_mut(len))
            {
                *slot = (name, value);
                len += 1;
            }
        }
        f(&descriptors[..len])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        let addrs = [
            "0.0.0.0",
            "1.2.3.4",
            "10.20.30.40",
            "255.255.255.255",
            "192.0.2.109",
            "::1",
            "2001:db8::8:800:200c:417a",
            "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff",
            "::ffff:255.255.255.255",
        ];
        for text in addrs {
            let ip: IpAddr = text.parse().expect("address");
            let written = AddrText::of(ip).expect("fits");
            assert_eq!(written.as_str(), ip.to_string(), "{text}");
        }
    }

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

    #[test]
    fn a_denial_without_a_look_promises_no_units() {
        let denied = Decision::denied(2_500_000_000, 10_000_000_000);
        assert_eq!(headers::service_limit(&denied, 3, |_| None), (0, 3));
        let left_two = |units: u64| {
            Some(if units <= 2 {
                Decision::allowed(2 - units, 0)
            } else {
                Decision::denied(1_200_000_000, 0)
            })
        };
        assert_eq!(
            headers::service_limit(&denied, 3, left_two),
            (2, 2),
            "two left, a third in 1.2 s"
        );
    }
}
