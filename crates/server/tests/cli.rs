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
