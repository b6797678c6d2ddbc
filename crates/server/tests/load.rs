//! `tollgate-server load`, bounded short runs against a spawned server: it reports calls, sorts
//! them into OK / OVER_LIMIT / errors, and writes its JSON report.

mod common;

use std::path::Path;
use std::process::Command;

use common::{Server, temp_dir};

const CONFIG: &str = r#"
[[domains]]
name = "edge"
[domains.policy]
[[domains.policy.rules]]
name = "per_ip"
match = { remote_address = "any" }
key = ["remote_address"]
limit = 1000000000
period = "1s"
capacity = 1000

[[domains]]
name = "tight"
[domains.policy]
descriptor_match = "subset"    # "all" (no match) applies to every descriptor
[[domains.policy.rules]]
name = "all"
limit = 5
period = "1h"
"#;

/// Runs the load subcommand for a bounded time; its JSON report.
fn load(server: &Server, json: &Path, extra: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate-server"))
        .args(["load", "--target"])
        .arg(format!("http://{}", server.grpc))
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
        .expect("run load");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "load failed: {stdout} {}",
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
fn load_subcommand_reports_calls_codes_and_errors() {
    let dir = temp_dir("load");
    let server = Server::start(&dir, CONFIG);

    // A limit never reached: every call is OK, none fails.
    let pid = server.pid().to_string();
    let r = load(
        &server,
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
        // 5 per hour for the whole domain, spent in the warm-up: the window is all OVER_LIMIT.
        let r = load(
            &server,
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
            &server,
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
}

#[test]
fn serving_still_needs_a_config_and_load_rejects_bad_arguments() {
    let bin = env!("CARGO_BIN_EXE_tollgate-server");
    let out = Command::new(bin).output().expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--config"));
    let out = Command::new(bin)
        .args(["load", "--keys", "4", "--descriptor", "user=fixed"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("{key}"));
}

#[test]
fn the_server_serves_on_one_or_two_workers_and_refuses_zero() {
    let bin = env!("CARGO_BIN_EXE_tollgate-server");
    let out = Command::new(bin)
        .args(["--config", "unused.toml", "--workers", "0"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--workers"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // One worker (a current-thread runtime) and two: both serve. (Their threads are not counted:
    // tokio names its blocking-pool threads like its workers, and some come and go.)
    for workers in ["2", "1"] {
        let dir = temp_dir(&format!("workers{workers}"));
        let server = Server::start_with_args(&dir, CONFIG, &["--workers", workers]);
        // And it serves: a load run of a few calls, all OK.
        let r = load(&server, &dir.join("ok.json"), &["--domain", "edge"]);
        assert!(count(&r, "ok") > 0, "{r}");
        assert_eq!(count(&r, "errors"), 0, "{r}");
    }
}
