//! `rls-load`, bounded short runs against a stand-in RLS server in this process whose answers are
//! known: it counts calls, sorts them into OK / OVER_LIMIT / errors, and writes its JSON report.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

/// Domain `edge`: every call OK. Domain `tight`: 5 calls OK per distinct descriptor, then
/// OVER_LIMIT. Any other domain: NOT_FOUND "unknown domain".
#[derive(Default)]
struct StandIn {
    tight_calls: Mutex<HashMap<String, u64>>,
}

#[tonic::async_trait]
impl RateLimitService for StandIn {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        let code = match request.domain.as_str() {
            "edge" => Code::Ok,
            "tight" => {
                let key = format!("{:?}", request.descriptors);
                let mut calls = self.tight_calls.lock().expect("not poisoned");
                let n = calls.entry(key).or_insert(0);
                *n += 1;
                if *n <= 5 { Code::Ok } else { Code::OverLimit }
            }
            other => return Err(Status::not_found(format!("unknown domain {other:?}"))),
        };
        Ok(Response::new(RateLimitResponse {
            overall_code: code as i32,
            ..Default::default()
        }))
    }
}

/// Starts the stand-in on a loopback port chosen by the OS, on a runtime thread that lives as long
/// as the test process.
fn start_stand_in() -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            tx.send(listener.local_addr().expect("addr")).expect("send");
            tonic::transport::Server::builder()
                .add_service(RateLimitServiceServer::new(StandIn::default()))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .expect("serve");
        });
    });
    rx.recv().expect("stand-in address")
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-lab-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Runs `rls-load` for a bounded time (100 ms warm-up, 500 ms window); its JSON report.
fn load(server: SocketAddr, json: &Path, extra: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_rls-load"))
        .arg("--target")
        .arg(format!("http://{server}"))
        .args([
            "--streams",
            "4",
            "--channels",
            "2",
            "--threads",
            "2",
            "--warmup",
            "100ms",
            "--duration",
            "500ms",
            "--json",
        ])
        .arg(json)
        .args(extra)
        .output()
        .expect("run rls-load");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "rls-load failed: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("calls/s="), "{stdout}");
    serde_json::from_str(&std::fs::read_to_string(json).expect("json report")).expect("json")
}

fn count(report: &serde_json::Value, field: &str) -> u64 {
    report[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {report}"))
}

#[test]
fn rls_load_reports_calls_codes_and_errors() {
    let dir = temp_dir("rls-load");
    let server = start_stand_in();

    // Every call OK, none fails. The stand-in runs in this process: its CPU time is ours.
    let pid = std::process::id().to_string();
    let r = load(
        server,
        &dir.join("ok.json"),
        &["--domain", "edge", "--keys", "16", "--server-pid", &pid],
    );
    let calls = count(&r, "calls");
    assert!(calls > 0, "{r}");
    assert_eq!(count(&r, "errors"), 0, "{r}");
    assert_eq!(count(&r, "ok"), calls, "{r}");
    assert!(r["calls_per_s"].as_f64().unwrap() > 0.0, "{r}");
    let lat = &r["latency_us"];
    let (p50, p99, max) = (
        lat["p50"].as_f64().unwrap(),
        lat["p99"].as_f64().unwrap(),
        lat["max"].as_f64().unwrap(),
    );
    assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{r}");
    // Both processes' CPU time over the window is read from /proc (Linux).
    for who in ["client_cpu", "server_cpu"] {
        assert!(r[who]["cores"].as_f64().is_some(), "{who} in {r}");
    }

    // Both clients (h2, the default, and tonic's) read the codes and the errors alike.
    for client in ["h2", "tonic"] {
        // 5 OK per descriptor, spent in the warm-up: the window is all OVER_LIMIT.
        let r = load(
            server,
            &dir.join(format!("tight-{client}.json")),
            &[
                "--domain",
                "tight",
                "--descriptor",
                &format!("route=/{client}"),
                "--client",
                client,
            ],
        );
        assert_eq!(r["client"], client, "{r}");
        let calls = count(&r, "calls");
        assert!(calls > 0, "{r}");
        assert_eq!(count(&r, "errors"), 0, "{r}");
        assert!(count(&r, "ok") <= 5, "{r}");
        assert_eq!(count(&r, "ok") + count(&r, "over_limit"), calls, "{r}");
        assert!(count(&r, "over_limit") > 0, "{r}");

        // An unknown domain: every call is a gRPC error, counted and named.
        let r = load(
            server,
            &dir.join(format!("unknown-{client}.json")),
            &["--domain", "nope", "--client", client],
        );
        let calls = count(&r, "calls");
        assert!(calls > 0, "{r}");
        assert_eq!(count(&r, "errors"), calls, "{r}");
        assert!(
            r["first_error"]
                .as_str()
                .is_some_and(|e| e.contains("unknown domain")),
            "{r}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rls_load_rejects_a_descriptor_without_key_over_several_keys() {
    let out = Command::new(env!("CARGO_BIN_EXE_rls-load"))
        .args(["--keys", "4", "--descriptor", "user=fixed"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("{key}"));
}
