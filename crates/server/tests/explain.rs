//! The decision's trace at the server's edges: `POST /v1/check` with `"explain": true`, and the
//! debug log (`tollgate_server::explain`) of an RLS call.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use http::Request;
use tollgate_server::config::ServerConfig;
use tollgate_server::http_api::{HttpState, router};
use tollgate_server::request::RequestError;
use tollgate_server::service::{EXPLAIN_TARGET, LiveDomains};
use tower::ServiceExt;

const CONFIG: &str = r#"
[[domains]]
name = "edge"
[domains.policy]
descriptor_match = "subset"
[[domains.policy.rules]]
name = "per_user"
match = { user = "any" }
key = ["user"]
limit = 1
period = "1h"
capacity = 100
[[domains.policy.rules]]
name = "login"
match = { user = "any", path = { exact = "/login" } }
key = ["user"]
limit = 5
period = "1h"
capacity = 100
"#;

fn limiter() -> Arc<LiveDomains> {
    Arc::new(
        LiveDomains::new(&ServerConfig::parse(CONFIG, false).expect("config")).expect("limiter"),
    )
}

async fn post(app: &axum::Router, body: &str) -> (u16, serde_json::Value) {
    let response = app
        .clone()
        .oneshot(
            Request::post("/v1/check")
                .header("content-type", "application/json")
                .body(Body::from(body.to_owned()))
                .expect("request"),
        )
        .await
        .expect("infallible");
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("body");
    (status, serde_json::from_slice(&bytes).expect("json"))
}

#[tokio::test]
async fn check_with_explain_answers_the_decision_and_its_trace() {
    let app = router(HttpState {
        limiter: limiter(),
        metrics: None,
    });
    let request = r#"{"domain":"edge","descriptors":[{"entries":{"user":"a","path":"/home"}}],"explain":true}"#;
    let (status, first) = post(&app, request).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["explain"]["deciding"], "per_user");
    let (status, body) = post(&app, request).await;
    assert_eq!(
        status, 429,
        "the trace's decision consumed as a check does: {body}"
    );
    let why = &body["explain"];
    assert_eq!(why["allowed"], false);
    assert_eq!(why["deciding"], "per_user");
    assert_eq!(why["rules"][0]["key"], "a");
    assert_eq!(why["rules"][0]["quota"]["limit"], 1);
    assert_eq!(why["rules"][0]["before"]["remaining"], 0);
    assert_eq!(why["rules"][1]["skipped"]["reason"], "no_match");
    assert_eq!(why["rules"][1]["skipped"]["descriptor"], "path");
    assert!(
        body["explain_text"]
            .as_str()
            .is_some_and(|t| t.starts_with("denied by per_user")),
        "{body}"
    );
    // Without the flag: no trace.
    let (_, plain) = post(
        &app,
        r#"{"domain":"edge","descriptors":[{"entries":{"user":"b"}}]}"#,
    )
    .await;
    assert!(plain.get("explain").is_none(), "{plain}");
    // One descriptor only.
    let (status, error) = post(
        &app,
        r#"{"domain":"edge","descriptors":[{"entries":{"user":"c"}},{"entries":{"user":"d"}}],"explain":true}"#,
    )
    .await;
    assert_eq!(status, 400, "{error}");
}

/// A `MakeWriter` into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_explain_target_at_debug_logs_each_call_with_its_trace() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(format!(
            "{EXPLAIN_TARGET}=debug"
        )))
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let limiter = limiter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            let call = vec![(vec![("user", "a"), ("path", "/login")], 1)];
            assert!(limiter.check("edge", &call).await.expect("checked").ok);
            assert!(!limiter.check("edge", &call).await.expect("checked").ok);
        });
    });
    let log = String::from_utf8(captured.0.lock().expect("lock").clone()).expect("utf-8");
    assert!(log.contains("allowed by per_user"), "{log}");
    assert!(log.contains("denied by per_user"), "{log}");
    assert!(log.contains("login: key `a` allowed"), "{log}");
    // After per_user's denial, login is only peeked: it keeps nothing.
    assert!(log.contains("remaining 4 -> 4"), "{log}");
    assert!(log.contains("domain=\"edge\""), "{log}");
}

#[test]
fn explain_refuses_several_descriptors() {
    let limiter = limiter();
    let call = vec![(vec![("user", "a")], 1), (vec![("user", "b")], 1)];
    assert!(matches!(
        limiter.explain("edge", &call),
        Err(RequestError::Malformed(_))
    ));
}
