//! A ready `ProxyHttp`: every request to one upstream, through a [`PingoraLimiter`].

use async_trait::async_trait;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_http::ResponseHeader;
use pingora_proxy::{ProxyHttp, Session};

use crate::{LimitCtx, PingoraLimiter};

/// A reverse proxy to one plain-HTTP upstream whose filters are the limiter's: what the example
/// proxy runs and what the loopback test drives. Proxies with their own routing call
/// [`PingoraLimiter`] from their own filters instead.
pub struct SingleUpstreamProxy {
    limiter: PingoraLimiter,
    upstream: String,
}

impl SingleUpstreamProxy {
    /// Forwards to `upstream` (`host:port`, no TLS) what `limiter` admits.
    pub fn new(limiter: PingoraLimiter, upstream: impl Into<String>) -> Self {
        SingleUpstreamProxy {
            limiter,
            upstream: upstream.into(),
        }
    }
}

#[async_trait]
impl ProxyHttp for SingleUpstreamProxy {
    type CTX = LimitCtx;

    fn new_ctx(&self) -> LimitCtx {
        LimitCtx::default()
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut LimitCtx,
    ) -> pingora_core::Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(
            self.upstream.as_str(),
            false,
            String::new(),
        )))
    }

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut LimitCtx,
    ) -> pingora_core::Result<bool> {
        self.limiter.request_filter(session, ctx).await
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut LimitCtx,
    ) -> pingora_core::Result<()> {
        self.limiter.response_filter(upstream_response, ctx)
    }

    async fn logging(
        &self,
        _session: &mut Session,
        _error: Option<&pingora_core::Error>,
        ctx: &mut LimitCtx,
    ) {
        self.limiter.logging(ctx);
    }
}
