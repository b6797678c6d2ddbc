//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over the [`LiveDomains`].
//!
//! Served as [`RequestErrors`]`<`[`RateLimitServiceServer`]`<`[`Rls`]`>>`: a request whose bytes do
//! not decode is answered `INVALID_ARGUMENT` and one over [`MAX_REQUEST_BYTES`]
//! `RESOURCE_EXHAUSTED`, both counted in `tollgate_server_errors_total{api="grpc"}`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_core::{Decision, Quota};
use tollgate_http::EdgeVerdict;
use tonic::codegen::Service;
use tonic::server::NamedService;
use tonic::{Request, Response, Status};

use crate::answer::Answer;
use crate::request::RequestError;
use crate::service::LiveDomains;
use crate::telemetry::Api;

pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;

/// The RLS implementation.
#[derive(Clone)]
pub struct Rls {
    limiter: Arc<LiveDomains>,
}

impl Rls {
    /// Over `limiter`.
    pub fn new(limiter: Arc<LiveDomains>) -> Self {
        Rls { limiter }
    }
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    /// Answers `NOT_FOUND` (unknown domain) or `INVALID_ARGUMENT` (malformed request) when it
    /// cannot decide, and no other error: [`RequestErrors`] relies on that to tell tonic's
    /// answers to undecodable requests from this method's own.
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let hits = u64::from(req.hits_addend);
        let descriptors: Vec<(Vec<(&str, &str)>, u64)> = req
            .descriptors
            .iter()
            .map(|d| {
                let entries = d
                    .entries
                    .iter()
                    .map(|e| (e.key.as_str(), e.value.as_str()))
                    .collect();
                // A descriptor's own hits_addend wins over the request's, whose 0 (unset) means
                // 1, as in Envoy. A descriptor's explicit 0 stays 0: a decision that takes nothing
                // (refused only where a key is overdrawn), or a charge of nothing.
                let cost = d.hits_addend.as_ref().map_or(hits.max(1), |h| h.value);
                (entries, cost)
            })
            .collect();
        let answer = match self.limiter.check(&req.domain, &descriptors).await {
            Ok(answer) => answer,
            Err(e) => {
                let (label, status) = match e {
                    RequestError::UnknownDomain(d) => (
                        "unknown_domain",
                        Status::not_found(format!("unknown domain `{d}`")),
                    ),
                    RequestError::Malformed(m) => ("malformed", Status::invalid_argument(m)),
                };
                metrics::counter!("tollgate_server_errors_total", "api" => "grpc", "reason" => label)
                    .increment(1);
                tracing::debug!(domain = %req.domain, error = %status.message(), "rejected");
                return Err(status);
            }
        };
        let response = to_response(&answer);
        answer.metrics.record(Api::Grpc, answer.ok, started);
        Ok(Response::new(response))
    }
}

/// The most bytes one request message may have (tonic's default decoding limit, stated): larger
/// ones are answered `RESOURCE_EXHAUSTED`. A request at [`MAX_DESCRIPTORS`](crate::request::MAX_DESCRIPTORS)
/// descriptors of [`MAX_ENTRIES`](crate::request::MAX_ENTRIES) entries fits with kilobytes per
/// entry to spare.
pub const MAX_REQUEST_BYTES: usize = 4 << 20;

/// The RLS service as served: [`RateLimitServiceServer::new`] over `rls`, its decoding limit
/// [`MAX_REQUEST_BYTES`], inside [`RequestErrors`].
pub fn service(rls: Rls) -> RequestErrors<RateLimitServiceServer<Rls>> {
    RequestErrors {
        inner: RateLimitServiceServer::new(rls).max_decoding_message_size(MAX_REQUEST_BYTES),
    }
}

/// Puts tonic's answers to a request it cannot decode in the terms the gRPC status code guide
/// gives a client's bad input, and counts them.
///
/// tonic decodes the request before the method runs and answers itself when it cannot: bytes
/// that are not the message (garbage, invalid UTF-8 in a string field, a truncated frame, a bad
/// compression flag, no message at all) as `INTERNAL`, a message over the decoding limit as
/// `OUT_OF_RANGE`, each a trailers-only response (`grpc-status` in the headers). Those are the
/// caller's errors, not the server's: this layer rewrites a headers-borne `INTERNAL` to
/// `INVALID_ARGUMENT` and `OUT_OF_RANGE` to `RESOURCE_EXHAUSTED` (the message is kept), and counts
/// them in `tollgate_server_errors_total{api="grpc", reason="malformed" | "too_large"}`. The
/// method itself never answers either code ([`Rls::should_rate_limit`]), so nothing it says is
/// rewritten; a decided call's status is in its trailers, which this does not touch.
///
/// A layer rather than a custom codec: the generated service fixes its codec, and the size check
/// happens before any codec runs.
#[derive(Clone, Debug)]
pub struct RequestErrors<S> {
    inner: S,
}

impl<S: NamedService> NamedService for RequestErrors<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<B>> for RequestErrors<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Unpin,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Rewritten<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        Rewritten(self.inner.call(request))
    }
}

/// [`RequestErrors`]' response future (the inner one, its answer rewritten when it is ready; the
/// generated service's future is boxed, so no second box).
#[derive(Debug)]
pub struct Rewritten<F>(F);

impl<F, E> Future for Rewritten<F>
where
    F: Future<Output = Result<http::Response<tonic::body::Body>, E>> + Unpin,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut response = ready!(Pin::new(&mut self.0).poll(cx))?;
        rewrite(response.headers_mut());
        Poll::Ready(Ok(response))
    }
}

fn rewrite(headers: &mut http::HeaderMap) {
    let (code, reason) = match headers.get("grpc-status").map(http::HeaderValue::as_bytes) {
        Some(b"13") => (tonic::Code::InvalidArgument, "malformed"),
        Some(b"11") => (tonic::Code::ResourceExhausted, "too_large"),
        _ => return,
    };
    headers.insert("grpc-status", http::HeaderValue::from(code as i32));
    metrics::counter!("tollgate_server_errors_total", "api" => "grpc", "reason" => reason)
        .increment(1);
    tracing::debug!(?code, "request not decoded");
}

fn code(ok: bool) -> i32 {
    if ok {
        Code::Ok as i32
    } else {
        Code::OverLimit as i32
    }
}

/// The Envoy response for an answer: each descriptor's verdict as a status (a cost no rule can
/// admit is `OVER_LIMIT` with no limit), and the answer's headers for Envoy to add.
pub fn to_response(answer: &Answer) -> RateLimitResponse {
    let statuses = answer.statuses.iter().map(status).collect();
    let headers = answer
        .headers()
        .into_iter()
        .map(|(name, value)| header(name.as_str(), value.to_str().unwrap_or_default().to_owned()))
        .collect();
    RateLimitResponse {
        overall_code: code(answer.ok),
        statuses,
        response_headers_to_add: headers,
        ..Default::default()
    }
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        ..Default::default()
    }
}

fn status(verdict: &EdgeVerdict) -> DescriptorStatus {
    match &verdict.decided {
        None => DescriptorStatus {
            code: Code::OverLimit as i32,
            ..Default::default()
        },
        Some(d) => {
            let (remaining, reset) = match d.decision {
                Decision::Allowed {
                    remaining,
                    reset_after,
                } => (remaining, reset_after),
                Decision::Denied { reset_after, .. } => (0, reset_after),
            };
            let current_limit = d.rule.zip(d.quota).map(|(rule, q)| current_limit(rule, &q));
            DescriptorStatus {
                code: code(d.is_allowed()),
                limit_remaining: if current_limit.is_some() {
                    u32::try_from(remaining).unwrap_or(u32::MAX)
                } else {
                    0
                },
                duration_until_reset: current_limit.as_ref().map(|_| proto_duration(reset)),
                current_limit,
                ..Default::default()
            }
        }
    }
}

/// The quota in Envoy's terms: `requests_per_unit` per second, minute, hour or day. A period that
/// is one of those units is exact; any other is expressed per the smallest unit at least as long,
/// scaled down (rounded down, at least 1), so Envoy is never told more than the quota gives.
pub fn current_limit(rule: &str, quota: &Quota) -> RateLimit {
    const UNITS: [(u64, Unit); 4] = [
        (1, Unit::Second),
        (60, Unit::Minute),
        (3_600, Unit::Hour),
        (86_400, Unit::Day),
    ];
    let period = u128::from(quota.period_nanos());
    let (secs, unit) = UNITS
        .iter()
        .copied()
        .find(|(s, _)| u128::from(*s) * 1_000_000_000 >= period)
        .unwrap_or(UNITS[3]);
    let unit_nanos = u128::from(secs) * 1_000_000_000;
    let per_unit = (u128::from(quota.limit()) * unit_nanos / period.max(1)).max(1);
    RateLimit {
        name: rule.to_owned(),
        requests_per_unit: u32::try_from(per_unit).unwrap_or(u32::MAX),
        unit: unit as i32,
    }
}

fn proto_duration(d: Duration) -> envoy_types::pb::google::protobuf::Duration {
    envoy_types::pb::google::protobuf::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}
