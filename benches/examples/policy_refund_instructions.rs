//! Instructions per request that the policy engine admits on a keyed rule and then denies on a
//! later rule, so the keyed admission is given back (issue 24 item 3: the refund goes back to the
//! slot the decision found). One thread, at a fixed instant; a never-inlined loop callgrind counts
//! alone:
//!
//! ```sh
//! cargo build --release -p tollgate-benches --example policy_refund_instructions
//! valgrind --tool=callgrind --toggle-collect='*stage_decide*' --callgrind-out-file=/dev/null \
//!   target/release/examples/policy_refund_instructions 200000 10000
//! ```
//! (arguments: requests, keys; a third, `admit`, runs the same loop with a global limit never
//! reached instead: the admission path the receipts add to). `results/engine/refund.sh` runs both
//! and divides by the requests.

use std::hint::black_box;

use tollgate_core::ManualClock;
use tollgate_policy::{Policy, PolicyConfig};

/// `per_client` (keyed, never the one to deny) then `global` (1 per hour, spent before the loop):
/// every request is admitted by the first and denied by the second.
const RULES: &str = r#"
    [[rules]]
    name = "per_client"
    match = { client = "any" }
    key = ["client"]
    limit = 1000000
    period = "1s"
    capacity = 1000000

    [[rules]]
    name = "global"
    limit = 1
    period = "1h"
"#;

#[inline(never)]
fn stage_decide(policy: &Policy<ManualClock>, clients: &[String], calls: usize) -> u64 {
    let now = policy.now();
    (0..calls)
        .filter(|i| {
            let client = clients[i % clients.len()].as_str();
            black_box(policy)
                .check_at(&[("client", client)], now, 1)
                .is_ok_and(|d| d.decision.is_allowed())
        })
        .count() as u64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let calls: usize = args.next().map_or(Ok(200_000), |n| n.parse())?;
    let keys: usize = args.next().map_or(Ok(10_000), |n| n.parse())?;
    let admit = args.next().is_some_and(|mode| mode == "admit");
    let rules = if admit {
        RULES.replace("limit = 1\n", "limit = 1000000000\n")
    } else {
        RULES.to_owned()
    };
    let policy = Policy::with_clock(PolicyConfig::from_toml(&rules)?, ManualClock::new())?;
    let clients: Vec<String> = (0..keys).map(|i| format!("c{i}")).collect();
    // Spend the global unit, then touch every key once (its slot inserted) outside the count.
    let now = policy.now();
    assert!(policy.check_at(&[], now, 1)?.decision.is_allowed());
    stage_warm(&policy, &clients);
    let admitted = stage_decide(&policy, &clients, calls);
    println!("admitted {admitted} of {calls} over {keys} keys");
    Ok(())
}

#[inline(never)]
fn stage_warm(policy: &Policy<ManualClock>, clients: &[String]) {
    let now = policy.now();
    for client in clients {
        let _ = black_box(policy).check_at(&[("client", client.as_str())], now, 1);
    }
}
