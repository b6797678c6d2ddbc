//! A whole call's answer: one verdict per descriptor, and which one the response's fields describe.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use tollgate_core::Decision;
use tollgate_http::EdgeVerdict;
use tollgate_http::headers::{RATELIMIT, RATELIMIT_POLICY, seconds_value};

use crate::domain::Domain;
use crate::telemetry::DecisionMetrics;

/// A whole request's answer: tollgate-http's [`EdgeVerdict`] per descriptor (the same verdict the
/// tower layer and Pingora render), and which one the response's fields describe.
///
/// A descriptor whose cost no enforcing rule can ever admit has the verdict's 413, which this
/// edge answers as `OVER_LIMIT` with no `Retry-After` and no fields (Envoy's RLS has no other
/// code; retrying cannot help). A delay rule never gets here: [`ServerConfig`](crate::config::ServerConfig)'s validation
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

/// The answer over every descriptor's verdict.
pub(crate) fn answer(dom: &Domain, statuses: Vec<EdgeVerdict>) -> Answer {
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
