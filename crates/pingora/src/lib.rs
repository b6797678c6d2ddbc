//! Tollgate inside a Pingora proxy.
//!
//! [`PingoraLimiter`] is what a `ProxyHttp` implementation calls from its filters:
//!
//! * `request_filter` → [`PingoraLimiter::request_filter`]: the client address through the
//!   trusted-proxy logic of [`tollgate_http::ClientIp`] (the right-most `X-Forwarded-For` hop that
//!   is not a trusted proxy), the descriptors (`remote_address`, `route` = path, `method`, and any
//!   configured headers) decided by a [`tollgate_policy::Policy`] as one; a denial is answered here
//!   with `429`, `Retry-After`, `RateLimit-Policy` and `RateLimit`, and never reaches the upstream.
//!   A single keyed limiter is a one-rule policy.
//! * `response_filter` → [`PingoraLimiter::response_filter`]: adds the `RateLimit-Policy` and
//!   `RateLimit` fields of the admitting rule to the upstream's response.
//!
//! The header syntax is `tollgate_http`'s (one home for it); this crate only moves values between
//! the policy and Pingora's session.
//!
//! # Failure policy
//! A request whose client cannot be identified (an obfuscated `Forwarded` hop behind a trusted
//! proxy) or that has no peer address is decided without the `remote_address` descriptor: rules
//! keyed by it do not apply (fails open for those rules, as the policy engine documents). A cost no
//! rule can ever admit is answered `429` without `Retry-After` (fails closed).

mod proxy;

pub use proxy::SingleUpstreamProxy;

use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Arc;

use arrayvec::ArrayString;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderName, RETRY_AFTER};
use http::{HeaderMap, HeaderValue};
use pingora_http::ResponseHeader;
use pingora_proxy::Session;
use smallvec::SmallVec;
use tollgate_core::Decision;
use tollgate_http::headers::{
    RATELIMIT, RATELIMIT_POLICY, denial_json, retry_after_secs, seconds_value,
};
use tollgate_http::{ClientIp, PolicyFields};
use tollgate_policy::Policy;

/// The longest text an [`IpAddr`] displays as (`INET6_ADDRSTRLEN`, terminator included, so 45
/// characters plus one to spare).
const IP_TEXT_MAX: usize = 46;

/// Writes `ip`'s text (as `Display` writes it) into `out`. IPv4, the common case, is written digit by
/// digit: `Display` through `fmt` cost about 40 ns of a decision (a profile of `bench decide`).
fn write_ip(out: &mut ArrayString<IP_TEXT_MAX>, ip: IpAddr) -> std::fmt::Result {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.try_push('.').map_err(|_| std::fmt::Error)?;
                }
                let mut digits = itoa::Buffer::new();
                out.try_push_str(digits.format(octet))
                    .map_err(|_| std::fmt::Error)?;
            }
            Ok(())
        }
        IpAddr::V6(_) => write!(out, "{ip}"),
    }
}

/// What one request's decision says, independent of Pingora (unit-testable).
#[derive(Clone, Debug, Default)]
pub struct Verdict {
    /// Whether the request goes on to the upstream.
    pub allowed: bool,
    /// `Retry-After` in seconds (denials only; `None` when retrying can never succeed).
    pub retry_after: Option<u64>,
    /// `RateLimit-Policy` of the deciding rule (`None` when no rule applied).
    pub policy: Option<HeaderValue>,
    /// `RateLimit` of the deciding rule.
    pub ratelimit: Option<HeaderValue>,
}

/// Per-request state for the response filter: keep one in the proxy's `CTX`.
#[derive(Debug, Default)]
pub struct LimitCtx {
    verdict: Option<Verdict>,
}

/// A Tollgate policy as seen from Pingora's filters. Cheap to share (`Arc` inside).
pub struct PingoraLimiter {
    policy: Arc<Policy>,
    client_ip: ClientIp,
    /// `(header, descriptor)` pairs copied into the descriptors when present.
    headers: Vec<(HeaderName, &'static str)>,
    /// The deciding rule's header values, the fixed part serialised once per (rule, quota): the
    /// same builder the tower layer and tollgate-server use.
    fields: PolicyFields,
}

impl std::fmt::Debug for PingoraLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PingoraLimiter")
            .field("rules", &self.policy.rules())
            .finish_non_exhaustive()
    }
}

impl PingoraLimiter {
    /// A limiter over `policy`, finding the client with `client_ip` (trusted proxies).
    pub fn new(policy: Arc<Policy>, client_ip: ClientIp) -> Self {
        PingoraLimiter {
            policy,
            client_ip,
            headers: Vec::new(),
            fields: PolicyFields::new(),
        }
    }

    /// Also passes request header `header` to the policy as descriptor `descriptor` (an API key,
    /// a tenant id).
    pub fn descriptor_header(mut self, header: HeaderName, descriptor: &'static str) -> Self {
        self.headers.push((header, descriptor));
        self
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Decides one request of one unit from `peer` (the TCP peer) with this method, path and
    /// headers.
    pub fn decide(
        &self,
        peer: Option<IpAddr>,
        method: &str,
        path: &str,
        headers: &HeaderMap,
    ) -> Verdict {
        let client = peer.and_then(|p| self.client_ip.client_addr(p, headers).ok());
        // The address's text and the descriptors live on the stack: no heap allocation per request
        // (a profile under wrk showed the `to_string` and the `Vec`).
        let mut client_text = ArrayString::<IP_TEXT_MAX>::new();
        let client_text = client.and_then(|ip| {
            write_ip(&mut client_text, ip)
                .ok()
                .map(|()| client_text.as_str())
        });
        let mut descriptors: SmallVec<[(&str, &str); 8]> = SmallVec::new();
        if let Some(ip) = client_text {
            descriptors.push(("remote_address", ip));
        }
        descriptors.push(("route", path));
        descriptors.push(("method", method));
        for (header, name) in &self.headers {
            if let Some(v) = headers.get(header).and_then(|v| v.to_str().ok()) {
                descriptors.push((name, v));
            }
        }
        let now = self.policy.now();
        // `check_next_at`: the `t` of `RateLimit` from the same pass over the rules.
        let (decided, next_unit) = match self.policy.check_next_at(&descriptors, now, 1) {
            Ok(checked) => checked,
            Err(_) => {
                return Verdict {
                    allowed: false,
                    ..Verdict::default()
                };
            }
        };
        let retry_after = match decided.decision {
            Decision::Denied { retry_after, .. } => Some(retry_after_secs(retry_after)),
            Decision::Allowed { .. } => None,
        };
        let (policy, ratelimit) = match self.fields.for_decision(&decided, next_unit) {
            Some(f) => (Some(f.ratelimit_policy), Some(f.ratelimit)),
            None => (None, None),
        };
        Verdict {
            allowed: decided.is_allowed(),
            retry_after,
            policy,
            ratelimit,
        }
    }

    /// The 429 response head and body for a denial.
    ///
    /// # Errors
    /// Pingora's, when a header cannot be added (not expected: every value is valid).
    pub fn denial_response(verdict: &Verdict) -> pingora_core::Result<(ResponseHeader, Bytes)> {
        let body = denial_json(verdict.retry_after.unwrap_or(0));
        let mut head = ResponseHeader::build(429, Some(6))?;
        head.insert_header(CONTENT_TYPE, "application/json")?;
        head.insert_header(CONTENT_LENGTH, body.len().to_string())?;
        if let Some(s) = verdict.retry_after {
            head.insert_header(RETRY_AFTER, seconds_value(s))?;
        }
        Self::add_fields(verdict, &mut head)?;
        Ok((head, body))
    }

    fn add_fields(verdict: &Verdict, head: &mut ResponseHeader) -> pingora_core::Result<()> {
        if let Some(p) = &verdict.policy {
            head.insert_header(RATELIMIT_POLICY.clone(), p.clone())?;
        }
        if let Some(r) = &verdict.ratelimit {
            head.insert_header(RATELIMIT.clone(), r.clone())?;
        }
        Ok(())
    }

    /// Call from `ProxyHttp::request_filter`: returns `Ok(true)` when the request was denied and
    /// answered here (Pingora then stops processing it), `Ok(false)` to proxy it.
    ///
    /// # Errors
    /// Writing the 429 to the downstream failed.
    pub async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut LimitCtx,
    ) -> pingora_core::Result<bool> {
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip());
        let req = session.req_header();
        let verdict = self.decide(peer, req.method.as_str(), req.uri.path(), &req.headers);
        if verdict.allowed {
            ctx.verdict = Some(verdict);
            return Ok(false);
        }
        let (head, body) = Self::denial_response(&verdict)?;
        session.set_keepalive(None);
        session.write_response_header(Box::new(head), false).await?;
        session.write_response_body(Some(body), true).await?;
        Ok(true)
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
        match ctx.verdict.take() {
            Some(v) => Self::add_fields(&v, upstream_response),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
    fn addresses_are_written_as_display_writes_them() {
        let addrs = [
            "0.0.0.0",
            "1.2.3.4",
            "10.20.30.40",
            "255.255.255.255",
            "192.0.2.109",
            "::1",
            "2001:db8::8:800:200c:417a",
        ];
        for text in addrs {
            let ip: IpAddr = text.parse().expect("address");
            let mut out = ArrayString::<IP_TEXT_MAX>::new();
            write_ip(&mut out, ip).expect("fits");
            assert_eq!(out.as_str(), ip.to_string(), "{text}");
        }
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
            let text = v.ratelimit.expect("ratelimit");
            let text = text.to_str().expect("ascii");
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
