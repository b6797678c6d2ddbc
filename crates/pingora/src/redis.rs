//! [`PingoraRedisLimiter`]: a tollgate-policy [`RedisPolicy`] in Pingora's filters (feature
//! `redis`): the same descriptors, answers and fields as [`PingoraLimiter`], with every rule's
//! state in a shared Redis, so every proxy in front of one upstream shares each rule's quota.

use std::net::IpAddr;
use std::sync::Arc;

use http::HeaderMap;
use pingora_http::ResponseHeader;
use pingora_proxy::Session;
use tollgate_http::{ClientIp, DescriptorSourceError, RedisPolicyEdge, RequestFacts};
use tollgate_policy::RedisPolicy;

use crate::{LimitCtx, PingoraLimiter, answer, peer_of};
use tollgate_http::EdgeVerdict;

/// A [`RedisPolicy`] as seen from Pingora's filters: [`PingoraLimiter`]'s API, decided on Redis
/// (one script call per request in per request mode). A denial of more than one unit gets the
/// conservative `RateLimit` values (a look at the rule would cost a round trip).
#[derive(Debug)]
pub struct PingoraRedisLimiter {
    edge: RedisPolicyEdge,
}

impl PingoraRedisLimiter {
    /// A limiter over `policy`, finding the client with `client_ip` (trusted proxies).
    pub fn new(policy: Arc<RedisPolicy>, client_ip: ClientIp) -> Self {
        PingoraRedisLimiter {
            edge: RedisPolicyEdge::new(policy).client_ip(client_ip),
        }
    }

    /// Also passes request header `header` to the policy as descriptor `descriptor`.
    ///
    /// # Errors
    /// [`DescriptorSourceError`] past 13 headers.
    pub fn descriptor_header(
        mut self,
        header: http::HeaderName,
        descriptor: &str,
    ) -> Result<Self, DescriptorSourceError> {
        self.edge = self.edge.header(header.as_str(), descriptor)?;
        Ok(self)
    }

    /// Decides one request (one unit) from `peer` with this method, path and headers.
    pub async fn decide(
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
        self.edge.decide(&facts, 1).await
    }

    /// As [`PingoraLimiter::request_filter`].
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
        let verdict = self
            .decide(peer, req.method.as_str(), req.uri.path(), &req.headers)
            .await;
        answer(verdict, session, ctx).await
    }

    /// As [`PingoraLimiter::response_filter`].
    ///
    /// # Errors
    /// Pingora's, when a header cannot be added.
    pub fn response_filter(
        &self,
        upstream_response: &mut ResponseHeader,
        ctx: &mut LimitCtx,
    ) -> pingora_core::Result<()> {
        PingoraLimiter::add_fields(ctx.fields.take().as_ref(), None, upstream_response)
    }
}
