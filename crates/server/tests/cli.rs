//! The binary's command line: serving needs a config; `--workers` takes one or more runtime
//! threads (one: a current-thread runtime) and refuses zero. (The load client that used to be its
//! `load` subcommand is tollgate-lab's `rls-load`, tested there.)

mod common;

use std::process::Command;

use common::{Server, descriptor, request, temp_dir};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

const CONFIG: &str = r#"
[[domains]]
name = "edge"
[domains.policy]
descriptor_match = "subset"
[[domains.policy.rules]]
name = "all"
limit = 3
period = "1h"
"#;

#[test]
fn serving_needs_a_config_and_there_is_no_load_subcommand() {
    let bin = env!("CARGO_BIN_EXE_tollgate-server");
    let out = Command::new(bin).output().expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--config"));
    let out = Command::new(bin).args(["load"]).output().expect("run");
    assert!(!out.status.success());
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
    // One worker (a current-thread runtime) and two: both serve, and decide (3 per hour: the
    // fourth call is over the limit).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    for workers in ["2", "1"] {
        let dir = temp_dir(&format!("workers{workers}"));
        let server = Server::start_with_args(&dir, CONFIG, &["--workers", workers]);
        let codes = runtime.block_on(async {
            let mut client = server.client().await;
            let mut codes = Vec::new();
            for _ in 0..4 {
                let answer = client
                    .should_rate_limit(request("edge", vec![descriptor(&[("user", "a")])], 0))
                    .await
                    .expect("call")
                    .into_inner();
                codes.push(answer.overall_code);
            }
            codes
        });
        let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
        assert_eq!(codes, [ok, ok, ok, over], "{workers} workers");
    }
}

/// `check --config FILE`: the file checked as the server's start and reload check it, printed back
/// with every default spelled out.
#[test]
fn check_prints_a_good_config_with_its_defaults_spelled_out() {
    let bin = env!("CARGO_BIN_EXE_tollgate-server");
    let dir = temp_dir("check-good");
    let file = dir.join("good.toml");
    std::fs::write(
        &file,
        r#"
[[domains]]
name = "edge"
[domains.policy]
[[domains.policy.rules]]
name = "per_ip"
match = { remote_address = "any" }
key = ["remote_address"]
limit = 100
period = "1s"
capacity = 1000

[[domains]]
name = "api"
backend = { redis = { url = "redis://127.0.0.1:1/", mode = "lease" } }
[domains.policy]
[[domains.policy.rules]]
name = "per_user"
match = { user = "any" }
key = ["user"]
limit = 5
period = "1m"
"#,
    )
    .expect("write");
    let out = Command::new(bin)
        .args(["check", "--config"])
        .arg(&file)
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for default in [
        "grpc = \"127.0.0.1:8081\"",
        "http = \"127.0.0.1:8080\"",
        "reload_poll = \"1s\"",
        "allow_empty = false",
        "backend = \"embedded\"",
        "descriptors = \"atomic\"",
        // What the server sets for its domains, and the policy's own defaults.
        "descriptor_match = \"exact\"",
        "domain = \"edge\"",
        "algorithm = \"gcra\"",
        "burst = 100",
        "mode = \"enforce\"",
        "storage = \"atomic\"",
        "dry_run = false",
        // The Redis backend's.
        "fail = \"closed\"",
        "prefix = \"tollgate:\"",
        "timeout = \"50ms\"",
        "failures = 3",
        "size = 100",
        "max_keys = 10000",
    ] {
        assert!(stdout.contains(default), "missing `{default}` in\n{stdout}");
    }
    // What it prints is itself a good config, printed back the same.
    let again = dir.join("again.toml");
    std::fs::write(&again, stdout.as_bytes()).expect("write");
    let out = Command::new(bin)
        .args(["check", "--config"])
        .arg(&again)
        .output()
        .expect("run");
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), stdout);
}

#[test]
fn check_of_a_broken_config_exits_non_zero_naming_the_rule_and_field() {
    let bin = env!("CARGO_BIN_EXE_tollgate-server");
    let dir = temp_dir("check-bad");
    let file = dir.join("bad.yaml");
    std::fs::write(
        &file,
        "domains:\n- name: edge\n  policy:\n    rules:\n    - { name: per_ip, match: { remote_address: any }, key: [remote_address], limit: 10, period: 1s, capacity: 100 }\n    - { name: login, match: { path: any }, limit: 5, period: 1s, burst: 0 }\n",
    )
    .expect("write");
    let out = Command::new(bin)
        .args(["check", "--config"])
        .arg(&file)
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "nothing printed on stdout");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("domain `edge`: rule `login`, field `burst`"),
        "{stderr}"
    );
    // The server refuses to start on it with the same message.
    let out = Command::new(bin)
        .args(["--config"])
        .arg(&file)
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("rule `login`, field `burst`"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
