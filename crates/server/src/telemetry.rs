//! Per-domain decision metrics, registered once when a domain is built so that a decision only
//! bumps an atomic counter and pushes one histogram sample.
//!
//! Looking a labelled metric up per call (building its key, the domain label's `String`, hashing
//! it into the recorder's registry) cost about 3% of the server's CPU under load (perf,
//! results/server). Handles taken before a recorder is installed are no-ops, so
//! [`app::run`](crate::app::run) installs the Prometheus recorder before it builds the domains.

use std::time::Instant;

use metrics::{Counter, Histogram};

/// Which front end decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// Envoy RLS over gRPC.
    Grpc,
    /// `POST /v1/check`.
    Http,
}

impl Api {
    fn label(self) -> &'static str {
        match self {
            Api::Grpc => "grpc",
            Api::Http => "http",
        }
    }
}

/// One domain's `tollgate_server_requests_total{api, domain, code}` counters and the
/// `tollgate_server_decision_seconds{api}` histograms.
pub struct DecisionMetrics {
    /// Indexed by `[api][over_limit]`.
    requests: [[Counter; 2]; 2],
    /// Indexed by api.
    seconds: [Histogram; 2],
    /// `tollgate_server_charged_units_total{domain}`: units charged on the response path.
    charged: Counter,
}

impl DecisionMetrics {
    /// Registers `domain`'s handles with the installed recorder.
    pub fn new(domain: &str) -> Self {
        let counters = |api: Api| {
            [("ok", 0), ("over_limit", 1)].map(|(code, _)| {
                metrics::counter!("tollgate_server_requests_total", "api" => api.label(), "domain" => domain.to_owned(), "code" => code)
            })
        };
        let histogram = |api: Api| metrics::histogram!("tollgate_server_decision_seconds", "api" => api.label());
        DecisionMetrics {
            requests: [counters(Api::Grpc), counters(Api::Http)],
            seconds: [histogram(Api::Grpc), histogram(Api::Http)],
            charged: metrics::counter!("tollgate_server_charged_units_total", "domain" => domain.to_owned()),
        }
    }

    /// Counts one decided request and its latency since `started`.
    pub fn record(&self, api: Api, ok: bool, started: Instant) {
        let a = api as usize;
        self.requests[a][usize::from(!ok)].increment(1);
        self.seconds[a].record(started.elapsed().as_secs_f64());
    }

    /// Counts `units` charged on the response path ([`crate::charge`]).
    pub fn charged(&self, units: u64) {
        self.charged.increment(units);
    }
}
