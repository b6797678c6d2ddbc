//! The HTTP side: `POST /v1/check` (JSON) for callers that are not Envoy, `GET /metrics`
//! (Prometheus text) and `GET /healthz`.
//!
//! `POST /v1/check` takes
//! `{"domain":"edge","descriptors":[{"entries":{"remote_address":"192.0.2.1"},"hits_addend":1}],"hits_addend":1}`
//! (`hits_addend` optional at both levels; the request's 0 means 1, a descriptor's 0 is a decision
//! that takes nothing, refused only where a key is overdrawn, or, in a charge
//! ([`crate::charge`]), a charge of nothing) and answers `200` when every descriptor
//! is within its limits, `429` when any is over (a descriptor whose cost no rule can ever admit is
//! `OVER_LIMIT` with `"cost_too_large":true` and adds no `Retry-After`), `404` for an unknown
//! domain, `400` for a malformed request, `415` without a JSON `content-type` and `413` over
//! [`MAX_BODY_BYTES`], with `RateLimit`, `RateLimit-Policy` (and `Retry-After` on a 429) on the
//! response and in the body:
//! `{"overall_code":"OK","statuses":[{"code":"OK","rule":"per_ip","limit":100,"window_ms":1000,"remaining":99,"reset_after_ms":10,"retry_after_ms":null,"shadow_denied":false}],"headers":{"ratelimit":"..."}}`.
//!
//! With `"explain": true` (one descriptor, an embedded domain) the body also carries
//! `"explain"`, the decision's trace (tollgate-policy's `Explanation`: each rule applied or why
//! not, its key, quota and tier, state before and after, its verdict and refund, the deciding
//! rule) and `"explain_text"`, the same in one line.
//!
//! # Reserve, then settle (costs known after the response)
//!
//! For a gateway that learns a request's cost only from its response (LLM tokens, rows, bytes)
//! and whose rate-limit call cannot report it back (Envoy's filter asks once per request):
//!
//! * `POST /v1/reserve` takes `/v1/check`'s body with **one** descriptor and its estimate
//!   (`"estimate"`, else the descriptor's or the request's `hits_addend`; absent means 1, an
//!   explicit `"estimate": 0` is a `400`):
//!   `{"domain":"llm","descriptors":[{"entries":{"tenant":"acme"}}],"estimate":800}`. It answers
//!   as `/v1/check` does (`200` or `429`, the same statuses, headers and fields, decided for the
//!   estimate) and, when admitted, `"reservation":{"id":"<32 hex>","estimate":800,"expires_in_ms":300000}`.
//!   A domain on Redis answers `501` (reservations there are not built yet: use `/v1/check`); a
//!   full table of open reservations `503` (nothing taken; see [`crate::reservations`]).
//! * `POST /v1/settle` takes `{"id":"...","actual":312}` and brings the reservation to the actual
//!   cost (the surplus given back, or the difference charged: a key with nothing left goes into
//!   debt and waits it out). It answers `200` with
//!   `{"settled":{"estimate":800,"actual":312,"rules":1,"stale":0}}`; `stale` counts rules a
//!   reload has removed since the reservation (settled into state nothing reads: a no-op). An id
//!   never issued is `404`; one already settled or expired (settled at its estimate) `409`. An
//!   `actual` that is not a non-negative integer of at most 2^64 - 1 is `400` and leaves the
//!   reservation open; `0` gives the whole estimate back; a huge one is charged saturating (the key
//!   stays denied, never over-admitted).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::{Deserialize, Serialize};
use tollgate_core::Decision;
use tollgate_http::EdgeVerdict;

use crate::request::RequestError;
use crate::reservations::NotOpen;
use crate::reserve::ReserveError;
use crate::service::LiveDomains;

/// What the HTTP handlers share.
#[derive(Clone)]
pub struct HttpState {
    /// The decision.
    pub limiter: Arc<LiveDomains>,
    /// The Prometheus recorder's handle (renders `/metrics`).
    pub metrics: Option<PrometheusHandle>,
}

/// The most bytes a `POST /v1/check` body may have (axum's default, stated); more is `413`.
pub const MAX_BODY_BYTES: usize = 2 << 20;

/// The router.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route(
            "/v1/check",
            post(check).layer(DefaultBodyLimit::max(MAX_BODY_BYTES)),
        )
        .route(
            "/v1/reserve",
            post(reserve).layer(DefaultBodyLimit::max(MAX_BODY_BYTES)),
        )
        .route(
            "/v1/settle",
            post(settle).layer(DefaultBodyLimit::max(MAX_BODY_BYTES)),
        )
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(state)
}

/// `POST /v1/check` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckRequest {
    /// The domain.
    pub domain: String,
    /// The descriptors, each decided as one.
    pub descriptors: Vec<JsonDescriptor>,
    /// Cost of every descriptor without its own (0 or absent: 1).
    #[serde(default)]
    pub hits_addend: u64,
    /// Answer with the decision's trace (`"explain"` in the body): one descriptor, an embedded
    /// domain. The trace names rules, keys and quotas: the endpoint is for trusted callers.
    #[serde(default)]
    pub explain: bool,
}

/// One descriptor.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonDescriptor {
    /// `name -> value`.
    pub entries: BTreeMap<String, String>,
    /// This descriptor's cost (overrides the request's).
    #[serde(default)]
    pub hits_addend: Option<u64>,
}

/// One descriptor's answer.
#[derive(Debug, Serialize)]
pub struct JsonStatus {
    /// `OK` or `OVER_LIMIT`.
    pub code: &'static str,
    /// The deciding rule, if one applied.
    pub rule: Option<&'static str>,
    /// Its quota's units per window.
    pub limit: Option<u64>,
    /// Its window.
    pub window_ms: Option<u128>,
    /// Units left (0 when denied).
    pub remaining: Option<u64>,
    /// Until the quota is whole again.
    pub reset_after_ms: Option<u128>,
    /// On a denial: the wait until the cost fits.
    pub retry_after_ms: Option<u128>,
    /// A shadow rule would have denied.
    pub shadow_denied: bool,
    /// An enforcing rule can never admit this cost.
    pub cost_too_large: bool,
}

async fn check(
    State(state): State<HttpState>,
    body: Result<Json<CheckRequest>, axum::extract::rejection::JsonRejection>,
) -> axum::response::Response {
    let started = Instant::now();
    let Json(req) = match body {
        Ok(body) => body,
        Err(e) => return rejected(&e),
    };
    let descriptors = entries(&req.descriptors, req.hits_addend);
    let checked = if req.explain {
        state
            .limiter
            .explain(&req.domain, &descriptors)
            .map(|(answer, why)| (answer, Some(why)))
    } else {
        state
            .limiter
            .check(&req.domain, &descriptors)
            .await
            .map(|answer| (answer, None))
    };
    let (answer, explanation) = match checked {
        Ok(a) => a,
        Err(e) => return request_error(e),
    };
    let (status, headers, mut body) = rendered(&answer, started);
    if let Some(why) = explanation {
        body["explain"] = serde_json::to_value(&why).unwrap_or_default();
        body["explain_text"] = serde_json::Value::String(why.to_string());
    }
    (status, headers, Json(body)).into_response()
}

/// A body axum could not read: axum's own statuses for a missing content type and an over-long
/// body; anything else (bad JSON, a wrong field, a wrong type) is the documented 400 (axum would
/// say 422 for some).
fn rejected(e: &axum::extract::rejection::JsonRejection) -> axum::response::Response {
    let (status, reason) = match e.status() {
        StatusCode::UNSUPPORTED_MEDIA_TYPE => {
            (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
        }
        StatusCode::PAYLOAD_TOO_LARGE => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
        _ => (StatusCode::BAD_REQUEST, "malformed"),
    };
    metrics::counter!("tollgate_server_errors_total", "api" => "http", "reason" => reason)
        .increment(1);
    error(status, &e.body_text())
}

/// Each descriptor's entries and cost (its own `hits_addend`, else `default`, whose 0 means 1; a
/// descriptor's explicit 0 stays 0: a decision that takes nothing, or a charge of nothing).
fn entries(descriptors: &[JsonDescriptor], default: u64) -> Vec<(Vec<(&str, &str)>, u64)> {
    descriptors
        .iter()
        .map(|d| {
            let entries = d
                .entries
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            (entries, d.hits_addend.unwrap_or(default.max(1)))
        })
        .collect()
}

/// A check's error as its status: `404` for an unknown domain, `400` for a malformed request.
fn request_error(e: RequestError) -> axum::response::Response {
    match e {
        RequestError::UnknownDomain(d) => {
            metrics::counter!("tollgate_server_errors_total", "api" => "http", "reason" => "unknown_domain")
                .increment(1);
            error(StatusCode::NOT_FOUND, &format!("unknown domain `{d}`"))
        }
        RequestError::Malformed(m) => {
            metrics::counter!("tollgate_server_errors_total", "api" => "http", "reason" => "malformed")
                .increment(1);
            error(StatusCode::BAD_REQUEST, &m)
        }
    }
}

/// An answer as `/v1/check` renders it (recorded in the decision metrics): its status, headers
/// and body.
fn rendered(
    answer: &crate::answer::Answer,
    started: Instant,
) -> (StatusCode, HeaderMap, serde_json::Value) {
    answer
        .metrics
        .record(crate::telemetry::Api::Http, answer.ok, started);
    let statuses: Vec<JsonStatus> = answer.statuses.iter().map(json_status).collect();
    let mut headers = HeaderMap::new();
    let mut shown = BTreeMap::new();
    for (name, value) in answer.headers() {
        shown.insert(
            name.as_str().to_owned(),
            value.to_str().unwrap_or_default().to_owned(),
        );
        headers.insert(name.clone(), value);
    }
    let status = if answer.ok {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let body = serde_json::json!({
        "overall_code": if answer.ok { "OK" } else { "OVER_LIMIT" },
        "statuses": statuses,
        "headers": shown,
    });
    (status, headers, body)
}

/// `POST /v1/reserve` body: `/v1/check`'s, with one descriptor and its estimate.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReserveRequest {
    /// The domain (an embedded one).
    pub domain: String,
    /// Exactly one descriptor.
    pub descriptors: Vec<JsonDescriptor>,
    /// The estimate (at least 1); absent: the descriptor's `hits_addend`, else the request's,
    /// else 1.
    #[serde(default)]
    pub estimate: Option<u64>,
    /// As in `/v1/check`: the cost of a descriptor without its own.
    #[serde(default)]
    pub hits_addend: u64,
}

/// `POST /v1/settle` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettleRequest {
    /// The id `/v1/reserve` answered.
    pub id: String,
    /// The actual cost: a non-negative integer.
    pub actual: u64,
}

async fn reserve(
    State(state): State<HttpState>,
    body: Result<Json<ReserveRequest>, axum::extract::rejection::JsonRejection>,
) -> axum::response::Response {
    let started = Instant::now();
    let Json(req) = match body {
        Ok(body) => body,
        Err(e) => return rejected(&e),
    };
    let mut descriptors = entries(&req.descriptors, req.hits_addend);
    if let Some(estimate) = req.estimate {
        let addend = req.descriptors.first().and_then(|d| d.hits_addend);
        if estimate == 0 || addend.is_some_and(|a| a != estimate) {
            metrics::counter!("tollgate_server_errors_total", "api" => "http", "reason" => "malformed")
                .increment(1);
            return error(
                StatusCode::BAD_REQUEST,
                "`estimate` must be at least 1 (and agree with the descriptor's `hits_addend` if \
                 both are given)",
            );
        }
        for d in &mut descriptors {
            d.1 = estimate;
        }
    }
    let reserved = match state.limiter.reserve(&req.domain, &descriptors) {
        Ok(reserved) => reserved,
        Err(ReserveError::Check(e)) => return request_error(e),
        Err(ReserveError::OnRedis(domain)) => {
            metrics::counter!("tollgate_server_errors_total", "api" => "http", "reason" => "unsupported")
                .increment(1);
            return error(
                StatusCode::NOT_IMPLEMENTED,
                &format!(
                    "domain `{domain}` is on redis: reservations need an embedded domain until \
                     Redis reservations are built (POST /v1/check decides a fixed cost there)"
                ),
            );
        }
        Err(ReserveError::Full(full)) => {
            metrics::counter!("tollgate_server_errors_total", "api" => "http", "reason" => "reservations_full")
                .increment(1);
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!(
                    "{} reservations open, the most [server.reservations] max_open allows: \
                     settle some (nothing was reserved)",
                    full.open
                ),
            );
        }
    };
    let (status, headers, mut body) = rendered(&reserved.answer, started);
    if let Some(id) = reserved.id {
        let expiry = state.limiter.reservations().limits().expiry;
        body["reservation"] = serde_json::json!({
            "id": id,
            "estimate": reserved.estimate,
            "expires_in_ms": u64::try_from(expiry.as_millis()).unwrap_or(u64::MAX),
        });
    }
    (status, headers, Json(body)).into_response()
}

async fn settle(
    State(state): State<HttpState>,
    body: Result<Json<SettleRequest>, axum::extract::rejection::JsonRejection>,
) -> axum::response::Response {
    let Json(req) = match body {
        Ok(body) => body,
        Err(e) => return rejected(&e),
    };
    match state.limiter.settle(&req.id, req.actual) {
        Ok(settled) => {
            let s = settled.settlement;
            Json(serde_json::json!({
                "settled": {
                    "estimate": s.estimate,
                    "actual": s.actual,
                    "rules": s.rules,
                    "stale": s.stale,
                }
            }))
            .into_response()
        }
        Err(not_open) => {
            let (status, reason, message) = match not_open {
                NotOpen::Unknown => (
                    StatusCode::NOT_FOUND,
                    "unknown_reservation",
                    "no reservation with this id was made here",
                ),
                NotOpen::Closed => (
                    StatusCode::CONFLICT,
                    "reservation_closed",
                    "the reservation is no longer open: already settled, or expired (settled at \
                     its estimate)",
                ),
                NotOpen::Expired => (
                    StatusCode::CONFLICT,
                    "reservation_closed",
                    "the reservation expired: settled at its estimate",
                ),
            };
            metrics::counter!("tollgate_server_errors_total", "api" => "http", "reason" => reason)
                .increment(1);
            error(status, message)
        }
    }
}

fn json_status(v: &EdgeVerdict) -> JsonStatus {
    match &v.decided {
        None => JsonStatus {
            code: "OVER_LIMIT",
            rule: None,
            limit: None,
            window_ms: None,
            remaining: None,
            reset_after_ms: None,
            retry_after_ms: None,
            shadow_denied: false,
            cost_too_large: true,
        },
        Some(d) => {
            let (remaining, reset, retry) = match d.decision {
                Decision::Allowed {
                    remaining,
                    reset_after,
                } => (remaining, reset_after, None),
                Decision::Denied {
                    retry_after,
                    reset_after,
                    ..
                } => (0, reset_after, Some(retry_after.as_millis())),
            };
            let applied = d.rule.is_some();
            JsonStatus {
                code: if d.is_allowed() { "OK" } else { "OVER_LIMIT" },
                rule: d.rule,
                limit: d.quota.map(|q| q.limit()),
                window_ms: d.quota.map(|q| q.period().as_millis()),
                remaining: applied.then_some(remaining),
                reset_after_ms: applied.then_some(reset.as_millis()),
                retry_after_ms: retry,
                shadow_denied: d.shadow_denied,
                cost_too_large: false,
            }
        }
    }
}

fn error(status: StatusCode, message: &str) -> axum::response::Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

async fn metrics_text(State(state): State<HttpState>) -> axum::response::Response {
    match &state.metrics {
        Some(handle) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4",
            )],
            handle.render(),
        )
            .into_response(),
        None => error(StatusCode::NOT_FOUND, "no metrics recorder installed"),
    }
}
