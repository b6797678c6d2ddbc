//! The conformance table (`tollgate_http::conformance`) through this server's edge: each case's
//! descriptors (built as tollgate-http's edge builds them, which is what an Envoy route's actions
//! send) through the `LiveDomains`, rendered as the RLS (gRPC) response and as the `POST /v1/check`
//! JSON answer, in-process. The tower layer and Pingora run the same table.
//!
//! The server's policies run on the monotonic clock; every expected `t` and `Retry-After` is a
//! whole number of seconds rounded up, so the few microseconds a case takes cannot change it.

use std::sync::Arc;

use axum::body::Body;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use http::Request;
use tollgate_http::conformance::{API_KEY_HEADER, CASES, Case, Observed};
use tollgate_http::{ClientIp, DescriptorNames, PolicyEdge, RequestFacts};
use tollgate_policy::{Policy, PolicyConfig};
use tollgate_server::config::{ConfigFileError, ServerConfig};
use tollgate_server::grpc::to_response;
use tollgate_server::http_api::{HttpState, router};
use tollgate_server::service::LiveDomains;
use tower::ServiceExt;

const DOMAIN: &str = "conformance";

/// The case's request as descriptor entries, built by the edge every HTTP integration uses.
fn entries(case: &Case) -> Vec<(String, String)> {
    let config = PolicyConfig::from_toml(case.policy).expect("policy");
    let edge = PolicyEdge::new(Arc::new(Policy::new(config).expect("policy")))
        .client_ip(ClientIp::trusting([]))
        .names(
            DescriptorNames::default()
                .header(API_KEY_HEADER, "api_key")
                .expect("header"),
        );
    let headers = case.header_map();
    let facts = RequestFacts {
        peer: case.peer_ip(),
        method: case.method,
        path: case.path,
        headers: &headers,
    };
    edge.with_descriptors(&facts, |d| {
        d.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    })
}

/// The status an HTTP edge would answer for the RLS code (413 when every over-limit descriptor
/// is one whose cost no rule can admit).
fn http_status(ok: bool, cost_too_large: bool) -> u16 {
    match (ok, cost_too_large) {
        (true, _) => 200,
        (false, true) => 413,
        (false, false) => 429,
    }
}

async fn through_grpc(case: &Case) -> Observed {
    let config = ServerConfig::parse(&case.server_config(DOMAIN), false).expect("config");
    let limiter = LiveDomains::new(&config).expect("limiter");
    let entries = entries(case);
    let borrowed: Vec<(&str, &str)> = entries
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    for _ in 0..case.before {
        let answer = limiter
            .check(DOMAIN, &[(borrowed.clone(), 1)])
            .await
            .expect("answer");
        assert!(answer.ok, "case `{}`: a request before", case.name);
    }
    let answer = limiter
        .check(DOMAIN, &[(borrowed, case.cost)])
        .await
        .expect("answer");
    let response = to_response(&answer);
    let header = |name: &str| {
        response
            .response_headers_to_add
            .iter()
            .find(|h| h.key == name)
            .map(|h| h.value.clone())
    };
    let ok = response.overall_code == Code::Ok as i32;
    let cost_too_large = answer.statuses.iter().any(|v| v.cost_too_large());
    if cost_too_large {
        // Envoy's RLS has no 413: the descriptor is OVER_LIMIT with no limit attached.
        assert_eq!(response.statuses[0].code, Code::OverLimit as i32);
        assert!(response.statuses[0].current_limit.is_none());
    }
    Observed {
        status: http_status(ok, cost_too_large),
        ratelimit_policy: header("ratelimit-policy"),
        ratelimit: header("ratelimit"),
        retry_after: header("retry-after"),
        delayed: false,
        shadow_denied: Some(answer.statuses.iter().any(|v| v.shadow_denied())),
    }
}

async fn through_json(case: &Case) -> Observed {
    let config = ServerConfig::parse(&case.server_config(DOMAIN), false).expect("config");
    let app = router(HttpState {
        limiter: Arc::new(LiveDomains::new(&config).expect("limiter")),
        metrics: None,
    });
    let entries: serde_json::Map<String, serde_json::Value> = entries(case)
        .into_iter()
        .map(|(k, v)| (k, serde_json::Value::String(v)))
        .collect();
    let body = |cost: u64| {
        serde_json::json!({
            "domain": DOMAIN,
            "descriptors": [{ "entries": entries, "hits_addend": cost }],
        })
        .to_string()
    };
    let post = |cost: u64| {
        Request::post("/v1/check")
            .header("content-type", "application/json")
            .body(Body::from(body(cost)))
            .expect("request")
    };
    for _ in 0..case.before {
        let response = app.clone().oneshot(post(1)).await.expect("infallible");
        assert_eq!(
            response.status(),
            200,
            "case `{}`: a request before",
            case.name
        );
    }
    let response = app.oneshot(post(case.cost)).await.expect("infallible");
    let text = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().expect("ascii").to_owned())
    };
    let (status, ratelimit_policy, ratelimit, retry_after) = (
        response.status().as_u16(),
        text("ratelimit-policy"),
        text("ratelimit"),
        text("retry-after"),
    );
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
        .await
        .expect("body");
    let json: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
    let descriptor = &json["statuses"][0];
    let cost_too_large = descriptor["cost_too_large"] == true;
    // The JSON check mirrors the RLS codes: OVER_LIMIT answers 429 (the descriptor says why).
    assert_eq!(
        status,
        if json["overall_code"] == "OK" {
            200
        } else {
            429
        }
    );
    Observed {
        status: http_status(status == 200, cost_too_large),
        ratelimit_policy,
        ratelimit,
        retry_after,
        delayed: false,
        shadow_denied: Some(descriptor["shadow_denied"] == true),
    }
}

#[tokio::test]
async fn every_case_through_the_rls_and_json_answers() {
    for case in CASES {
        if case.expect.delayed {
            // An RLS answer cannot hold a request: the config is refused, naming domain and rule.
            let err = ServerConfig::parse(&case.server_config(DOMAIN), false)
                .expect_err("a delay rule is refused");
            let ConfigFileError::Invalid(message) = err else {
                panic!("case `{}`: {err}", case.name);
            };
            assert!(
                message.contains("domain `conformance`")
                    && message.contains("rule `paced`")
                    && message.contains("delay"),
                "{message}"
            );
            continue;
        }
        case.expect
            .assert_matches("server RLS", case.name, &through_grpc(case).await);
        case.expect
            .assert_matches("server JSON", case.name, &through_json(case).await);
    }
}
