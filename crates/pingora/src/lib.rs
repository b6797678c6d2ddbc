//! Tollgate inside a Pingora proxy.
//!
//! [`PingoraLimiter`] is what a `ProxyHttp` implementation calls from its filters. It holds a
//! [`tollgate_http::PolicyEdge`], the transport-free edge every HTTP integration shares, and only
//! renders the [`EdgeVerdict`] it returns:
//!
//! * `request_filter` → [`PingoraLimiter::request_filter`]: the request's facts (the client
//!   address through the trusted-proxy logic of [`tollgate_http::ClientIp`], the path, the method,
//!   the configured headers) become descriptors named by a [`DescriptorNames`] (defaults
//!   `remote_address`, `route`, `method`), decided by a [`tollgate_policy::Policy`] as one. A
//!   denial is answered here with `429`, `Retry-After`, `RateLimit-Policy` and `RateLimit`, and
//!   never reaches the upstream; a two-stage rule's delay is held here (tokio's timer) before the
//!   request goes on. A single keyed limiter is a one-rule policy.
//! * `response_filter` → [`PingoraLimiter::response_filter`]: adds the `RateLimit-Policy` and
//!   `RateLimit` fields of the admitting rule to the upstream's response.
//! * With [`PingoraLimiter::explain_header`], a request the operator trusts also gets the
//!   decision's trace in one line (which rule decided, each rule's key, quota and state), on the
//!   denial and on the upstream's response alike; no other request does (see
//!   [`tollgate_http::explain`]).
//! * `logging` → [`PingoraLimiter::logging`]: gives back the request's in-flight permits, which
//!   `request_filter` took for the policy's concurrency rules and kept in the [`LimitCtx`] for
//!   the request's life. A concurrency denial is answered `503` with `Retry-After`.
//!
//! [`PingoraSettle`] is the same edge for costs known only after the response (LLM tokens,
//! rows, bytes): it reserves an estimate in `request_filter` and settles the actual cost from a
//! response header or a count of the body in the response filters (see [`settle`]; it does not
//! cut streams, and says why).
//!
//! The header syntax and every value's computation are `tollgate_http`'s; the conformance table
//! (`tests/conformance.rs`) checks that this edge answers every case as the tower layer and
//! tollgate-server do. How the edges answer an empty header value, a cost no rule can admit and a
//! delay is in [`tollgate_http::edge`].
//!
//! # Failure policy
//! A request whose client cannot be identified (an obfuscated `Forwarded` hop behind a trusted
//! proxy) or that has no peer address is decided without the client descriptor: rules keyed by it
//! do not apply (fails open for those rules, as the policy engine documents). A cost no rule can
//! ever admit is answered `413` without `Retry-After` (fails closed; retrying cannot help).

mod proxy;
#[cfg(feature = "redis")]
mod redis;
pub mod settle;

pub use proxy::SingleUpstreamProxy;
#[cfg(feature = "redis")]
pub use redis::PingoraRedisLimiter;
pub use settle::{PingoraSettle, SettleCtx};

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderName, RETRY_AFTER};
use http::{HeaderMap, StatusCode};
use pingora_http::ResponseHeader;
use pingora_proxy::Session;
use tollgate_core::{Clock, MonotonicClock};
use tollgate_http::headers::{
    ExplainField, RATELIMIT, RATELIMIT_POLICY, busy_json, denial_json, seconds_value,
};
use tollgate_http::{
    Admitted, ClientIp, DescriptorNames, DescriptorSourceError, EdgeVerdict, FieldValues,
    PolicyEdge, RequestFacts,
};
use tollgate_policy::{Admission, Policy};

const COST_BODY: &[u8] = br#"{"error":"request cost exceeds quota capacity"}"#;

/// Per-request state for the response filter: keep one in the proxy's `CTX`.
#[derive(Debug, Default)]
pub struct LimitCtx {
    fields: Option<FieldValues>,
    /// A trusted request's trace, for the response filter.
    explain: Option<Box<ExplainField>>,
    /// The request's in-flight permits (concurrency rules), held until the logging phase
    /// ([`PingoraLimiter::logging`]) or until the context is dropped, whichever comes first.
    admission: Option<Admission>,
}

impl LimitCtx {
    /// Keeps what the response filter adds for an admitted request (`request_filter` calls it).
    pub fn admitted(&mut self, verdict: EdgeVerdict) {
        self.fields = verdict.fields;
        self.explain = verdict.explain;
    }
}

/// A request's cost, from its facts.
type CostFn = dyn Fn(&RequestFacts<'_>) -> u64 + Send + Sync;

/// A Tollgate policy as seen from Pingora's filters.
pub struct PingoraLimiter<C = MonotonicClock> {
    edge: PolicyEdge<C>,
    /// `None`: every request costs one unit.
    cost: Option<Arc<CostFn>>,
}

impl<C> std::fmt::Debug for PingoraLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PingoraLimiter")
            .field("edge", &self.edge)
            .finish_non_exhaustive()
    }
}

impl PingoraLimiter {
    /// The response head and body for a request `verdict` does not forward: the 429 (with
    /// `Retry-After` and the fields) or the 413 for a cost no rule can ever admit.
    ///
    /// # Errors
    /// Pingora's, when a header cannot be added (not expected: every value is valid).
    pub fn denial_response(verdict: &EdgeVerdict) -> pingora_core::Result<(ResponseHeader, Bytes)> {
        let body = match verdict.retry_after {
            Some(secs) if verdict.status == StatusCode::TOO_MANY_REQUESTS => denial_json(secs),
            Some(secs) if verdict.status == StatusCode::SERVICE_UNAVAILABLE => busy_json(secs),
            _ => Bytes::from_static(COST_BODY),
        };
        let mut head = ResponseHeader::build(verdict.status, Some(6))?;
        head.insert_header(CONTENT_TYPE, "application/json")?;
        head.insert_header(CONTENT_LENGTH, body.len().to_string())?;
        if let Some(secs) = verdict.retry_after {
            head.insert_header(RETRY_AFTER, seconds_value(secs))?;
        }
        Self::add_fields(
            verdict.fields.as_ref(),
            verdict.explain.as_deref(),
            &mut head,
        )?;
        Ok((head, body))
    }

    fn add_fields(
        fields: Option<&FieldValues>,
        explain: Option<&ExplainField>,
        head: &mut ResponseHeader,
    ) -> pingora_core::Result<()> {
        if let Some(f) = fields {
            head.insert_header(RATELIMIT_POLICY.clone(), f.ratelimit_policy.clone())?;
            head.insert_header(RATELIMIT.clone(), f.ratelimit.to_value())?;
        }
        if let Some(explain) = explain {
            head.insert_header(explain.name.clone(), explain.value.clone())?;
        }
        Ok(())
    }
}

impl<C: Clock + Clone + 'static> PingoraLimiter<C> {
    /// A limiter over `policy`, finding the client with `client_ip` (trusted proxies).
    pub fn new(policy: Arc<Policy<C>>, client_ip: ClientIp) -> Self {
        PingoraLimiter {
            edge: PolicyEdge::new(policy).client_ip(client_ip),
            cost: None,
        }
    }

    /// Also passes request header `header` to the policy as descriptor `descriptor` (an API key,
    /// a tenant id); an absent or empty value leaves the descriptor out.
    ///
    /// # Errors
    /// [`DescriptorSourceError`] past 13 headers.
    pub fn descriptor_header(
        mut self,
        header: HeaderName,
        descriptor: &str,
    ) -> Result<Self, DescriptorSourceError> {
        self.edge = self.edge.header(header.as_str(), descriptor)?;
        Ok(self)
    }

    /// Every descriptor name at once (replaces what [`descriptor_header`](Self::descriptor_header)
    /// set).
    pub fn descriptor_names(mut self, names: DescriptorNames) -> Self {
        self.edge = self.edge.names(names);
        self
    }

    /// Adds the decision's trace, as response header `name` (conventionally
    /// [`TOLLGATE_EXPLAIN`](tollgate_http::headers::TOLLGATE_EXPLAIN)), to the answers to requests
    /// `trust` accepts, and only to those ([`PolicyEdge::explain_header`]: `trust` sees the TCP
    /// peer, method, path and headers). Default: never; off, a decision pays one `None` check.
    pub fn explain_header(
        mut self,
        name: HeaderName,
        trust: impl Fn(&RequestFacts<'_>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.edge = self.edge.explain_header(name, trust);
        self
    }

    /// A per-request cost (default: one unit per request).
    pub fn cost(mut self, cost: impl Fn(&RequestFacts<'_>) -> u64 + Send + Sync + 'static) -> Self {
        self.cost = Some(Arc::new(cost));
        self
    }

    /// The policy.
    pub fn policy(&self) -> &Policy<C> {
        self.edge.policy()
    }

    /// Decides one request from `peer` (the TCP peer) with this method, path and headers, at the
    /// configured cost.
    pub fn decide(
        &self,
        peer: Option<IpAddr>,
        method: &str,
        path: &str,
        headers: &HeaderMap,
    ) -> EdgeVerdict {
        let facts = RequestFacts {
            peer,
            method,
            path,
            headers,
        };
        let cost = self.cost.as_ref().map_or(1, |cost| cost(&facts));
        self.edge.decide(&facts, cost)
    }

    /// Decides `facts` for `cost` units.
    pub fn decide_cost(&self, facts: &RequestFacts<'_>, cost: u64) -> EdgeVerdict {
        self.edge.decide(facts, cost)
    }

    /// Call from `ProxyHttp::request_filter`: returns `Ok(true)` when the request was answered here
    /// (denied, or a cost no rule can admit; Pingora then stops processing it), `Ok(false)` to
    /// proxy it, after holding it for a two-stage rule's delay.
    ///
    /// # Errors
    /// Writing the response to the downstream failed.
    pub async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut LimitCtx,
    ) -> pingora_core::Result<bool> {
        let peer = peer_of(session);
        let req = session.req_header();
        let Admitted { verdict, admission } =
            self.admit(peer, req.method.as_str(), req.uri.path(), &req.headers);
        ctx.admission = admission;
        answer(verdict, session, ctx).await
    }

    /// Decides a request against the policy's rate and concurrency rules as one
    /// ([`PolicyEdge::admit`]); keep the [`Admitted::admission`] for the request's life.
    /// [`request_filter`](Self::request_filter) calls it. A concurrency denial is `503` with
    /// `Retry-After` (see [`tollgate_http::AdmitLayer`] for why not 429).
    pub fn admit(
        &self,
        peer: Option<IpAddr>,
        method: &str,
        path: &str,
        headers: &HeaderMap,
    ) -> Admitted {
        let facts = RequestFacts {
            peer,
            method,
            path,
            headers,
        };
        let cost = self.cost.as_ref().map_or(1, |cost| cost(&facts));
        self.edge.admit(&facts, cost)
    }

    /// Call from `ProxyHttp::logging` (Pingora's last phase, run for every request, answered,
    /// proxied or failed): gives the request's in-flight permits back. Dropping the context does
    /// it too; this only makes the moment explicit.
    pub fn logging(&self, ctx: &mut LimitCtx) {
        ctx.admission = None;
    }

    /// Call from `ProxyHttp::response_filter`: adds the admitting rule's fields.
    ///
    /// # Errors
    /// Pingora's, when a header cannot be added.
    pub fn response_filter(
        &self,
        upstream_response: &mut ResponseHeader,
        ctx: &mut LimitCtx,
    ) -> pingora_core::Result<()> {
        PingoraLimiter::add_fields(
            ctx.fields.take().as_ref(),
            ctx.explain.take().as_deref(),
            upstream_response,
        )
    }
}

/// What `request_filter` does with a verdict, whatever decided it: hold an admitted request for
/// its delay and keep its fields for the response, or answer the denial here.
async fn answer(
    verdict: EdgeVerdict,
    session: &mut Session,
    ctx: &mut LimitCtx,
) -> pingora_core::Result<bool> {
    if verdict.allowed {
        if !verdict.delay.is_zero() {
            tokio::time::sleep(verdict.delay).await;
        }
        ctx.admitted(verdict);
        return Ok(false);
    }
    let (head, body) = PingoraLimiter::denial_response(&verdict)?;
    session.set_keepalive(None);
    session.write_response_header(Box::new(head), false).await?;
    session.write_response_body(Some(body), true).await?;
    Ok(true)
}

/// The peer of `session`'s client connection.
fn peer_of(session: &Session) -> Option<IpAddr> {
    session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use tollgate_policy::PolicyConfig;

    const POLICY: &str = r#"
[[rules]]
name = "per_client"
match = { remote_address = "any" }
key = ["remote_address"]
capacity = 1024
limit = 2
period = "60s"
"#;

    fn limiter() -> PingoraLimiter {
        let config = PolicyConfig::from_toml(POLICY).expect("config");
        let policy = Arc::new(Policy::new(config).expect("policy"));
        PingoraLimiter::new(
            policy,
            ClientIp::trusting(["127.0.0.0/8".parse().expect("net")]),
        )
    }

    #[test]
    fn a_concurrency_permit_is_held_in_the_ctx_until_logging_and_a_full_limit_answers_503() {
        let config = PolicyConfig::from_toml(
            r#"
            [[concurrency]]
            name = "one_at_a_time"
            limit = 1
            retry_after = "2s"
            "#,
        )
        .expect("config");
        let policy = Arc::new(Policy::new(config).expect("policy"));
        let l = PingoraLimiter::new(Arc::clone(&policy), ClientIp::trusting([]));
        let headers = HeaderMap::new();
        let mut ctx = LimitCtx::default();
        let first = l.admit(None, "GET", "/", &headers);
        assert!(first.verdict.allowed);
        ctx.admission = first.admission;
        ctx.admitted(first.verdict);
        let busy = l.admit(None, "GET", "/", &headers);
        assert_eq!(busy.verdict.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(busy.admission.is_none());
        let (head, body) = PingoraLimiter::denial_response(&busy.verdict).expect("503");
        assert_eq!(head.status.as_u16(), 503);
        assert_eq!(head.headers.get(RETRY_AFTER).expect("retry-after"), "2");
        assert_eq!(
            &body[..],
            br#"{"error":"too many requests in flight","retry_after":2}"#
        );
        l.logging(&mut ctx);
        assert_eq!(policy.in_flight("one_at_a_time", &[]), Some(0));
        assert!(l.admit(None, "GET", "/", &headers).verdict.allowed);
    }

    #[test]
    fn a_trusted_request_gets_the_trace_on_the_denial_and_the_upstream_response_others_never() {
        // The operators' network, 10.9.0.0/16.
        let l = limiter().explain_header(
            tollgate_http::headers::TOLLGATE_EXPLAIN.clone(),
            |facts| matches!(facts.peer, Some(IpAddr::V4(v4)) if v4.octets()[..2] == [10, 9]),
        );
        let trusted: IpAddr = [10, 9, 0, 7].into();
        let outsider: IpAddr = [198, 51, 100, 9].into();
        let asks = {
            let mut h = HeaderMap::new();
            h.insert("tollgate-explain", HeaderValue::from_static("1"));
            h
        };
        for _ in 0..2 {
            let mut ctx = LimitCtx::default();
            let admitted = l.admit(Some(trusted), "GET", "/", &HeaderMap::new());
            assert!(admitted.verdict.allowed);
            ctx.admitted(admitted.verdict);
            let mut upstream = ResponseHeader::build(200, None).expect("head");
            l.response_filter(&mut upstream, &mut ctx).expect("fields");
            let trace = upstream.headers.get("tollgate-explain").expect("trusted");
            assert!(
                trace
                    .to_str()
                    .expect("ascii")
                    .starts_with("allowed by per_client; per_client: key `10.9.0.7` allowed"),
                "{trace:?}"
            );

            let mut ctx = LimitCtx::default();
            let admitted = l.admit(Some(outsider), "GET", "/", &asks);
            assert!(admitted.verdict.explain.is_none());
            ctx.admitted(admitted.verdict);
            let mut upstream = ResponseHeader::build(200, None).expect("head");
            l.response_filter(&mut upstream, &mut ctx).expect("fields");
            assert!(upstream.headers.get("tollgate-explain").is_none());
        }
        let denied = l
            .admit(Some(trusted), "GET", "/", &HeaderMap::new())
            .verdict;
        let (head, _) = PingoraLimiter::denial_response(&denied).expect("429");
        assert_eq!(head.status.as_u16(), 429);
        let trace = head.headers.get("tollgate-explain").expect("trusted");
        assert!(
            trace
                .to_str()
                .expect("ascii")
                .starts_with("denied by per_client; per_client: key `10.9.0.7` denied"),
            "{trace:?}"
        );
        let denied = l.admit(Some(outsider), "GET", "/", &asks).verdict;
        let (head, _) = PingoraLimiter::denial_response(&denied).expect("429");
        assert_eq!(head.status.as_u16(), 429);
        assert!(head.headers.get("tollgate-explain").is_none());
    }

    #[test]
    fn denies_past_the_limit_per_client_behind_trusted_proxy() {
        let l = limiter();
        let lo: IpAddr = [127, 0, 0, 1].into();
        let mut a = HeaderMap::new();
        a.insert("x-forwarded-for", HeaderValue::from_static("198.51.100.1"));
        let mut b = HeaderMap::new();
        b.insert("x-forwarded-for", HeaderValue::from_static("198.51.100.2"));
        assert!(l.decide(Some(lo), "GET", "/", &a).allowed);
        assert!(l.decide(Some(lo), "GET", "/", &a).allowed);
        let denied = l.decide(Some(lo), "GET", "/", &a);
        assert!(!denied.allowed);
        assert!(denied.retry_after.expect("retry") >= 1);
        assert!(
            l.decide(Some(lo), "GET", "/", &b).allowed,
            "another client has its own limit"
        );
        let (head, body) = PingoraLimiter::denial_response(&denied).expect("429");
        assert_eq!(head.status.as_u16(), 429);
        assert!(head.headers.get(RETRY_AFTER).is_some());
        let ratelimit = head
            .headers
            .get("ratelimit")
            .expect("ratelimit")
            .to_str()
            .expect("ascii");
        assert!(
            ratelimit.starts_with("\"per_client\";r=0;t="),
            "{ratelimit}"
        );
        assert_eq!(
            head.headers.get("ratelimit-policy").expect("policy"),
            "\"per_client\";q=2;w=60"
        );
        assert!(body.starts_with(br#"{"error":"rate limit exceeded""#));
    }

    #[test]
    fn allowed_responses_say_when_the_next_unit_comes() {
        let l = limiter();
        let peer: IpAddr = [198, 51, 100, 7].into();
        let h = HeaderMap::new();
        // 2 per 60 s: one left after the first, the next unit 30 s after it (29 s if this test
        // stalls for over a second on a real clock: the policy's is monotonic).
        for remaining in [1, 0] {
            let v = l.decide(Some(peer), "GET", "/", &h);
            let text = v.fields.expect("fields").ratelimit.to_string();
            let t = text
                .strip_prefix(&format!("\"per_client\";r={remaining};t="))
                .unwrap_or_else(|| panic!("{text}"));
            assert!(matches!(t, "29" | "30"), "{text}");
        }
    }

    #[test]
    fn the_longest_ipv6_text_is_a_descriptor() {
        let l = limiter();
        // Untrusted peer: the peer itself is the client; its text is 39 characters.
        let v6: IpAddr = "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff"
            .parse()
            .expect("v6");
        let mapped: IpAddr = "::ffff:255.255.255.255".parse().expect("mapped");
        for peer in [v6, mapped] {
            let h = HeaderMap::new();
            assert!(l.decide(Some(peer), "GET", "/", &h).allowed);
            assert!(l.decide(Some(peer), "GET", "/", &h).allowed);
            let denied = l.decide(Some(peer), "GET", "/", &h);
            assert!(!denied.allowed, "{peer} is keyed by its address");
        }
    }
}
