//! The opt-in explain header at the tower edge: a trusted request gets the decision's trace, naming
//! the deciding rule; an untrusted one never does, whatever it sends; the decision and the
//! `RateLimit` fields are the ones the plain path answers.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate_core::ManualClock;
use tollgate_http::headers::TOLLGATE_EXPLAIN;
use tollgate_http::{AdmitLayer, ClientIp, PolicyEdge, PolicyLayer, RequestFacts};
use tollgate_policy::{Policy, PolicyConfig};
use tower::{Layer, Service, ServiceExt, service_fn};

type Inner = tower::util::BoxCloneService<Request<()>, Response<Full<Bytes>>, Infallible>;

fn inner() -> Inner {
    tower::util::BoxCloneService::new(service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    }))
}

const POLICY: &str = r#"
    [[rules]]
    name = "per_ip"
    match = { remote_address = "any" }
    key = ["remote_address"]
    limit = 2
    period = "1s"
    capacity = 1000

    [[rules]]
    name = "admin"
    match = { route = { prefix = "/admin/" } }
    limit = 100
    period = "1s"
"#;

/// The operators' network: the only callers trusted with a trace.
fn trusted(facts: &RequestFacts<'_>) -> bool {
    let ops: ipnet::IpNet = "10.9.0.0/16".parse().expect("net");
    facts.peer.is_some_and(|peer| ops.contains(&peer))
}

fn policy(clock: &ManualClock) -> Arc<Policy<ManualClock>> {
    let config = PolicyConfig::from_toml(POLICY).expect("config");
    Arc::new(Policy::with_clock(config, clock.clone()).expect("policy"))
}

/// A request from `peer`, asking for a trace the ways a client might (which must not matter).
fn request(peer: &str, asks: bool) -> Request<()> {
    let mut builder = Request::get("/");
    if asks {
        builder = builder
            .header(&TOLLGATE_EXPLAIN, "1")
            .header("x-explain", "true");
    }
    let mut req = builder.body(()).expect("request");
    req.extensions_mut()
        .insert(peer.parse::<SocketAddr>().expect("peer"));
    req
}

async fn send<S, B>(svc: &mut S, req: Request<()>) -> Response<B>
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible>,
{
    svc.ready()
        .await
        .expect("ready")
        .call(req)
        .await
        .expect("call")
}

fn header<B>(response: &Response<B>, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().expect("visible ascii").to_owned())
}

#[tokio::test]
async fn only_trusted_requests_see_the_trace_and_it_names_the_deciding_rule() {
    let clock = ManualClock::new();
    let mut svc = PolicyLayer::builder(policy(&clock))
        .client_ip(ClientIp::trusting([]))
        .explain_header(TOLLGATE_EXPLAIN.clone(), trusted)
        .build()
        .layer(inner());

    // Trusted: allowed twice, then denied by per_ip, each with its trace.
    for remaining in [2, 1] {
        let ok = send(&mut svc, request("10.9.0.7:1000", false)).await;
        assert_eq!(ok.status(), StatusCode::OK);
        let trace = header(&ok, "tollgate-explain").expect("trusted, allowed");
        assert!(trace.starts_with("allowed by per_ip; "), "{trace}");
        assert!(
            trace.contains(&format!(
                "per_ip: key `10.9.0.7` allowed, quota 2/1000ms burst 2, remaining {remaining} -> {}",
                remaining - 1
            )),
            "{trace}"
        );
        assert!(
            trace.contains("admin: skipped, `route` = `/` is not prefix:/admin/"),
            "{trace}"
        );
    }
    let denied = send(&mut svc, request("10.9.0.7:1000", false)).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let trace = header(&denied, "tollgate-explain").expect("trusted, denied");
    assert!(
        trace.starts_with("denied by per_ip; per_ip: key `10.9.0.7` denied"),
        "{trace}"
    );

    // Untrusted: never, asked for or not, allowed or denied.
    for asks in [false, true, true] {
        let answer = send(&mut svc, request("192.0.2.1:1000", asks)).await;
        assert_eq!(header(&answer, "tollgate-explain"), None, "asks: {asks}");
    }
    let denied = send(&mut svc, request("192.0.2.1:1000", true)).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "tollgate-explain"), None);
}

#[tokio::test]
async fn a_trusted_request_is_decided_and_advertised_as_any_other() {
    let clock = ManualClock::new();
    let policy = policy(&clock);
    let mut plain = PolicyLayer::builder(Arc::clone(&policy))
        .client_ip(ClientIp::trusting([]))
        .build()
        .layer(inner());
    let mut explaining = PolicyLayer::builder(policy)
        .client_ip(ClientIp::trusting([]))
        .explain_header(TOLLGATE_EXPLAIN.clone(), |_| true)
        .build()
        .layer(inner());
    // Two keys with the same history, one through each path: the same answers, fields included.
    for step in 0..4 {
        if step == 3 {
            clock.advance(std::time::Duration::from_millis(600));
        }
        let a = send(&mut plain, request("10.9.0.1:1000", false)).await;
        let b = send(&mut explaining, request("10.9.0.2:1000", false)).await;
        assert_eq!(a.status(), b.status(), "step {step}");
        for name in ["ratelimit", "ratelimit-policy", "retry-after"] {
            assert_eq!(header(&a, name), header(&b, name), "{name}, step {step}");
        }
        assert_eq!(header(&a, "tollgate-explain"), None);
        assert!(header(&b, "tollgate-explain").is_some());
    }
}

#[tokio::test]
async fn the_admit_layer_explains_to_trusted_callers_only() {
    let config = PolicyConfig::from_toml(
        r#"
        [[concurrency]]
        name = "one_at_a_time"
        limit = 1
        retry_after = "2s"
        "#,
    )
    .expect("config");
    let policy = Arc::new(Policy::new(config).expect("policy"));
    let edge = PolicyEdge::new(policy)
        .client_ip(ClientIp::trusting([]))
        .explain_header(TOLLGATE_EXPLAIN.clone(), trusted);
    let mut svc = AdmitLayer::new(edge).layer(inner());
    // The first response's body holds the permit while it lives.
    let held = send(&mut svc, request("10.9.0.7:1000", false)).await;
    assert_eq!(held.status(), StatusCode::OK);
    let busy = send(&mut svc, request("10.9.0.7:1000", false)).await;
    assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        header(&busy, "tollgate-explain").as_deref(),
        Some("denied by one_at_a_time")
    );
    let busy = send(&mut svc, request("192.0.2.1:1000", true)).await;
    assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&busy, "tollgate-explain"), None);
    drop(held);
}
