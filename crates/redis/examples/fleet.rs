//! A fleet of two processes sharing one quota through Redis: each instance runs this example with
//! `--instance`, checks the same tenant's key as fast as it can for one second, and prints what it
//! admitted; together they admit what one limiter would (burst + rate × elapsed), not twice that.
//!
//! ```text
//! cargo run -p tollgate-redis --example fleet                           # starts its own redis-server
//! cargo run -p tollgate-redis --example fleet -- redis://127.0.0.1:6379/   # or uses yours
//! ```
//!
//! Without an `--instance` argument the example is the launcher: it starts a private
//! `redis-server` on a free loopback port when no URL is given (stopped when it ends), starts two
//! instances of itself against it, and checks their sum.

#[path = "../tests/common/redis_server.rs"]
mod redis_server;

use std::process::Command;
use std::time::{Duration, Instant};

use tollgate_core::Quota;
use tollgate_redis::{RedisConfig, RedisLimiter, connect};

const INSTANCES: usize = 2;
const RUN: Duration = Duration::from_secs(1);

fn quota() -> Quota {
    // 50 per second with bursts of 20, shared by the whole fleet.
    Quota::per_second(50)
        .and_then(|q| q.with_burst(20))
        .expect("a valid quota")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, url, key] = args.as_slice() {
        if flag == "--instance" {
            return instance(url, key);
        }
    }
    let mut private = None;
    let url = match args.first() {
        Some(url) => url.clone(),
        None => private.insert(redis_server::RedisServer::start()).url(),
    };
    // A key of its own per run, so a shared Redis holds no state from an earlier one.
    let key = format!("example-fleet:tenant-a:{}", std::process::id());
    let start = Instant::now();
    let children = (0..INSTANCES)
        .map(|_| {
            Command::new(std::env::current_exe()?)
                .args(["--instance", &url, &key])
                .output()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let elapsed = start.elapsed();
    let mut total = 0;
    for (i, child) in children.iter().enumerate() {
        let out = String::from_utf8_lossy(&child.stdout);
        if !child.status.success() {
            return Err(format!(
                "instance {i} failed: {}",
                String::from_utf8_lossy(&child.stderr)
            )
            .into());
        }
        let admitted: u64 = out.trim().parse()?;
        println!("instance {i}: admitted {admitted}");
        total += admitted;
    }
    // What one limiter could admit over the whole run: the burst plus the rate times the time
    // from the first instance's start to the last one's end.
    let bound = 20 + (50.0 * elapsed.as_secs_f64()).ceil() as u64;
    println!("fleet: admitted {total} in {elapsed:.2?}; one limiter's bound {bound}");
    assert!(
        total <= bound,
        "the fleet admitted more than one limiter could"
    );
    assert!(total >= 20, "the fleet should at least have its burst");
    Ok(())
}

/// One instance: checks `key` in a loop for `RUN` and prints how many it admitted.
fn instance(url: &str, key: &str) -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let config = RedisConfig::default();
        let limiter = RedisLimiter::gcra(connect(url, &config)?, quota(), config)?;
        let end = Instant::now() + RUN;
        let mut admitted = 0u64;
        while Instant::now() < end {
            if limiter.try_check(key, 1).await?.is_allowed() {
                admitted += 1;
            }
        }
        println!("{admitted}");
        Ok(())
    })
}
