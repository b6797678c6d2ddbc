//! A policy file decided request by request: which rule decides, and what a client is told.
//! The clock is a manual one, so the output is the same on every run.
//!
//! ```text
//! cargo run -p tollgate-policy --example policy_file                # the rules in gateway.toml
//! cargo run -p tollgate-policy --example policy_file -- my-rules.toml
//! ```

use std::time::Duration;

use tollgate_core::{Decision, ManualClock};
use tollgate_policy::{Policy, PolicyConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/examples/gateway.toml").to_owned()
    });
    let config = PolicyConfig::from_toml(&std::fs::read_to_string(&path)?)?;
    let clock = ManualClock::new();
    let policy = Policy::with_clock(config, clock.clone())?;
    println!("{path}: rules {:?}", policy.rules());

    let request = |ip, key| {
        [
            ("remote_address", ip),
            ("api_key", key),
            ("route", "/v1/items"),
        ]
    };
    let mut denied_by = Vec::new();
    // One client on the free plan: per_ip's burst of 3, then per_ip denies (and the denied request
    // costs the API key nothing). 2 s later per_ip has refilled and the free key's 5 per minute is
    // what runs out, whichever address sends it; the pro key has its own plan. The shadow rule
    // (4 per minute per route) reports the requests it would deny and lets them through.
    for (at_ms, ip, key) in [
        (0, "192.0.2.7", "key-free"),
        (0, "192.0.2.7", "key-free"),
        (0, "192.0.2.7", "key-free"),
        (0, "192.0.2.7", "key-free"),
        (2_000, "192.0.2.7", "key-free"),
        (2_000, "192.0.2.7", "key-free"),
        (2_000, "198.51.100.9", "key-free"),
        (2_000, "198.51.100.9", "key-pro"),
    ] {
        clock.set(Duration::from_millis(at_ms).as_nanos() as u64);
        let verdict = policy.check(&request(ip, key), 1)?;
        let answer = match verdict.decision {
            Decision::Allowed { remaining, .. } => format!("allowed, {remaining} left"),
            Decision::Denied { retry_after, .. } => format!("429, retry after {retry_after:?}"),
        };
        println!(
            "t={at_ms:>5} ms {ip:<13} {key:<8} -> {answer:<28} decided by {:?}{}",
            verdict.rule,
            if verdict.shadow_denied {
                " (a shadow rule would deny)"
            } else {
                ""
            }
        );
        if !verdict.is_allowed() {
            denied_by.push(verdict.rule);
        }
    }
    // What the sequence above is for: each denial names the rule that made it.
    assert_eq!(denied_by, [Some("per_ip"), Some("per_api_key")]);
    Ok(())
}
