//! AdmitLayer: the permit lives as long as the response body; in-flight denials are 503.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tollgate_core::ManualClock;
use tollgate_http::{AdmitLayer, PolicyEdge};
use tollgate_policy::{Policy, PolicyConfig};
use tower::{Service, ServiceExt, service_fn};
use tower_layer::Layer;

fn policy(extra: &str) -> Arc<Policy<ManualClock>> {
    let toml = format!(
        r#"
        [[concurrency]]
        name = "one_at_a_time"
        limit = 1
        retry_after = "2s"
        {extra}
        "#
    );
    Arc::new(
        Policy::with_clock(PolicyConfig::from_toml(&toml).unwrap(), ManualClock::new()).unwrap(),
    )
}

async fn handler(request: Request<()>) -> Result<Response<Full<Bytes>>, Infallible> {
    if request.uri().path() == "/panic" {
        panic!("handler failed");
    }
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

fn get(path: &str) -> Request<()> {
    Request::builder().uri(path).body(()).unwrap()
}

fn in_flight(policy: &Policy<ManualClock>) -> u64 {
    policy.in_flight("one_at_a_time", &[]).unwrap()
}

#[tokio::test]
async fn the_permit_is_held_until_the_response_body_is_dropped_and_a_full_limit_answers_503() {
    let policy = policy("");
    let svc = AdmitLayer::new(PolicyEdge::new(Arc::clone(&policy))).layer(service_fn(handler));
    let first = svc.clone().oneshot(get("/a")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert!(first.body().holds_permits());
    assert_eq!(in_flight(&policy), 1);
    // The response is out but its body is not finished: the request still counts.
    let busy = svc.clone().oneshot(get("/b")).await.unwrap();
    assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(busy.headers()["retry-after"], "2");
    let body = busy.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        &body[..],
        br#"{"error":"too many requests in flight","retry_after":2}"#
    );
    // Reading the body to its end and dropping it gives the permit back.
    let body = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"ok");
    assert_eq!(in_flight(&policy), 0);
    let next = svc.oneshot(get("/c")).await.unwrap();
    assert_eq!(next.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_request_cancelled_before_its_response_gives_its_permit_back() {
    let policy = policy("");
    let mut svc = AdmitLayer::new(PolicyEdge::new(Arc::clone(&policy))).layer(service_fn(handler));
    let pending = svc.ready().await.unwrap().call(get("/a"));
    assert_eq!(in_flight(&policy), 1);
    drop(pending); // the client went away
    assert_eq!(in_flight(&policy), 0);
    let next = svc.oneshot(get("/b")).await.unwrap();
    assert_eq!(next.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_panicking_handler_gives_its_permit_back() {
    let policy = policy("");
    let svc = AdmitLayer::new(PolicyEdge::new(Arc::clone(&policy))).layer(service_fn(handler));
    let task = tokio::spawn(svc.clone().oneshot(get("/panic")));
    assert!(task.await.unwrap_err().is_panic());
    assert_eq!(in_flight(&policy), 0);
    assert_eq!(
        svc.oneshot(get("/a")).await.unwrap().status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_rate_denial_is_still_a_429_and_holds_no_permit() {
    let policy = policy(
        r#"
        [[rules]]
        name = "rate"
        limit = 1
        period = "1h"
        "#,
    );
    let svc = AdmitLayer::new(PolicyEdge::new(Arc::clone(&policy))).layer(service_fn(handler));
    let first = svc.clone().oneshot(get("/a")).await.unwrap();
    drop(first);
    let denied = svc.oneshot(get("/a")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(denied.headers().contains_key("retry-after"));
    assert!(!denied.body().holds_permits());
    assert_eq!(in_flight(&policy), 0);
}
