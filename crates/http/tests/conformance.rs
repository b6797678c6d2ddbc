//! The conformance table (`tollgate_http::conformance`) through the tower `PolicyLayer`, driven
//! in-process with `oneshot` on a manual clock; tollgate-pingora and tollgate-server run the same
//! table through their edges.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tollgate_core::ManualClock;
use tollgate_http::conformance::{API_KEY_HEADER, CASES, Case, Observed};
use tollgate_http::{ClientIp, PolicyLayer};
use tollgate_policy::{Policy, PolicyConfig};
use tower::{Layer, ServiceExt, service_fn};

fn request(case: &Case) -> Request<()> {
    let mut builder = Request::builder().method(case.method).uri(case.path);
    for (name, value) in case.headers {
        builder = builder.header(*name, *value);
    }
    let mut request = builder.body(()).expect("request");
    if let Some(peer) = case.peer_ip() {
        request
            .extensions_mut()
            .insert(SocketAddr::new(peer, 40_000));
    }
    request
}

async fn run(case: &Case) -> Observed {
    let config = PolicyConfig::from_toml(case.policy).expect("policy");
    let policy = Arc::new(Policy::with_clock(config, ManualClock::new()).expect("policy"));
    let cost = case.cost;
    let layer = PolicyLayer::builder(policy)
        .client_ip(ClientIp::trusting([]))
        .header(API_KEY_HEADER, "api_key")
        .expect("header")
        .cost(move |head: &tollgate_http::RequestHead<'_>| {
            // The request under test carries its cost in the query; the ones before cost 1.
            if head.uri.query() == Some("test") {
                cost
            } else {
                1
            }
        })
        .build();
    let service = layer.layer(service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    }));
    for _ in 0..case.before {
        let response = service
            .clone()
            .oneshot(request(case))
            .await
            .expect("infallible");
        assert_eq!(
            response.status(),
            200,
            "case `{}`: a request before",
            case.name
        );
    }
    let mut test = request(case);
    *test.uri_mut() = format!("{}?test", case.path).parse().expect("uri");
    let started = tokio::time::Instant::now();
    let response = service.oneshot(test).await.expect("infallible");
    let text = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().expect("ascii").to_owned())
    };
    Observed {
        status: response.status().as_u16(),
        ratelimit_policy: text("ratelimit-policy"),
        ratelimit: text("ratelimit"),
        retry_after: text("retry-after"),
        // Paused time: it advances only by the layer's sleep.
        delayed: started.elapsed() > std::time::Duration::ZERO,
        shadow_denied: None,
    }
}

#[tokio::test(start_paused = true)]
async fn every_case_through_the_tower_layer() {
    for case in CASES {
        let observed = run(case).await;
        case.expect
            .assert_matches("tower PolicyLayer", case.name, &observed);
    }
}
