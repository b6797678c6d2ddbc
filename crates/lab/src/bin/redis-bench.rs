//! Decisions/s and latency of the Redis limiters against a local `redis-server`, and the lease
//! mode's accuracy with 4 simulated instances.
//!
//! ```text
//! cargo run --release -p tollgate-lab --bin redis-bench -- [--secs 3] [--json PATH] [--url redis://...]
//! ```
//! Without `--url` it starts its own `redis-server` on a free loopback port (it must be on PATH).

// The redis-server and Redis Cluster harness of tollgate-redis's tests, shared by path.
#[path = "../../../redis/tests/common/mod.rs"]
mod common;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use redis::aio::ConnectionManager;
use serde_json::{Value, json};
use tollgate_core::{FixedWindow, Gcra, Quota, SlidingWindow};
use tollgate_redis::{
    LeaseConfig, LeasedLimiter, RedisConfig, RedisEncoding, RedisLimiter, TimeSource, connect,
};

struct Run {
    name: String,
    tasks: usize,
    decisions: u64,
    allowed: u64,
    secs: f64,
    hist: Histogram<u64>,
}

impl Run {
    fn per_sec(&self) -> f64 {
        self.decisions as f64 / self.secs
    }
    fn json(&self) -> Value {
        json!({
            "scenario": self.name, "tasks": self.tasks, "decisions": self.decisions,
            "allowed": self.allowed, "secs": self.secs, "decisions_per_sec": self.per_sec(),
            "p50_ns": self.hist.value_at_quantile(0.5), "p99_ns": self.hist.value_at_quantile(0.99),
            "p999_ns": self.hist.value_at_quantile(0.999), "max_ns": self.hist.max(),
        })
    }
}

/// `tasks` closed-loop tasks calling `op(task)` until `secs` have passed; each decision timed.
async fn drive<F, Fut>(name: &str, tasks: usize, secs: f64, op: F) -> Run
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send,
{
    let op = Arc::new(op);
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let mut handles = Vec::new();
    for task in 0..tasks {
        let op = Arc::clone(&op);
        handles.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
            let (mut n, mut allowed) = (0u64, 0u64);
            loop {
                let t0 = Instant::now();
                if t0 >= deadline {
                    break;
                }
                allowed += u64::from(op(task).await);
                hist.saturating_record(t0.elapsed().as_nanos() as u64);
                n += 1;
                if n % 256 == 0 {
                    tokio::task::yield_now().await; // local decisions never yield otherwise
                }
            }
            (n, allowed, hist)
        }));
    }
    let mut run = Run {
        name: name.to_owned(),
        tasks,
        decisions: 0,
        allowed: 0,
        secs: 0.0,
        hist: Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap(),
    };
    for h in handles {
        let (n, a, hist) = h.await.unwrap();
        run.decisions += n;
        run.allowed += a;
        run.hist.add(hist).unwrap();
    }
    run.secs = start.elapsed().as_secs_f64();
    run
}

async fn server_time_us(conn: &mut ConnectionManager) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    s * 1_000_000 + us
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let secs: f64 = arg("--secs").map_or(3.0, |s| s.parse().unwrap());
    let server = arg("--url").is_none().then(common::RedisServer::start);
    let url = arg("--url").unwrap_or_else(|| server.as_ref().unwrap().url());
    let cfg = RedisConfig::default()
        .with_prefix("bench:")
        .with_timeout(Duration::from_secs(1))
        .with_time(TimeSource::Server);
    let conn = connect(&url, &cfg).unwrap();
    let mut admin = conn.clone();
    let mut runs = Vec::new();

    // Per-request scripts: one EVALSHA per decision over one multiplexed connection.
    let fast = Quota::per_second(1_000_000).unwrap();
    let c = (&conn, &cfg);
    runs.extend(script_runs::<Gcra>(c, fast, "Gcra", &[1, 64], secs).await);
    let q = Quota::per_second(100_000).unwrap();
    runs.extend(script_runs::<FixedWindow>(c, q, "FixedWindow", &[64], secs).await);
    let q = Quota::per_second(10_000).unwrap();
    runs.extend(script_runs::<SlidingWindow>(c, q, "SlidingWindow", &[64], secs).await);

    // Lease mode: one instance, leases of 1000 units, one key per task (1 M/s each, burst 10^8).
    let lease = LeaseConfig {
        size: 1000,
        ttl: Duration::from_millis(100),
        max_keys: 1024,
        renew_below: 0,
        min_grant: 1,
    };
    // A burst of 10^8 so that demand, not the quota, sets the pace (1 M/s alone would cap one key).
    let roomy = fast.with_burst(100_000_000).unwrap();
    for tasks in [1, 64] {
        let l = Arc::new(LeasedLimiter::new(conn.clone(), roomy, cfg.clone(), lease).unwrap());
        let keys: Arc<Vec<String>> =
            Arc::new((0..tasks).map(|t| format!("lease{tasks}:{t}")).collect());
        runs.push(
            drive("lease GCRA (k = 1000)", tasks, secs, move |t| {
                let (l, keys) = (Arc::clone(&l), Arc::clone(&keys));
                async move { l.check(&keys[t], 1).await.unwrap().is_allowed() }
            })
            .await,
        );
    }

    // Accuracy: 4 instances (own connections), 8 tasks each, one key, demand above the quota.
    let mut accuracy = Vec::new();
    for (rate, min_grant) in [(100_000u64, 1), (10_000, 1), (10_000, 25)] {
        let (run, acc) = lease_accuracy(&url, &cfg, &mut admin, rate, min_grant, secs * 2.0).await;
        runs.push(run);
        accuracy.push(acc);
    }

    println!("| scenario | tasks | decisions/s | allowed | p50 | p99 | p99.9 |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in &runs {
        println!(
            "| {} | {} | {:.0} | {:.1} % | {:.1} µs | {:.1} µs | {:.1} µs |",
            r.name,
            r.tasks,
            r.per_sec(),
            100.0 * r.allowed as f64 / r.decisions.max(1) as f64,
            r.hist.value_at_quantile(0.5) as f64 / 1e3,
            r.hist.value_at_quantile(0.99) as f64 / 1e3,
            r.hist.value_at_quantile(0.999) as f64 / 1e3,
        );
    }
    println!("\naccuracy: {:#}", json!(accuracy));
    if let Some(path) = arg("--json") {
        let all =
            json!({ "runs": runs.iter().map(Run::json).collect::<Vec<_>>(), "accuracy": accuracy });
        std::fs::write(path, serde_json::to_string_pretty(&all).unwrap()).unwrap();
    }
}

/// One per-request limiter running `A` for `quota`, driven by each of `task_counts` tasks (one key
/// per task).
async fn script_runs<A: RedisEncoding>(
    (conn, cfg): (&ConnectionManager, &RedisConfig),
    quota: Quota,
    name: &str,
    task_counts: &[usize],
    secs: f64,
) -> Vec<Run> {
    let mut runs = Vec::new();
    for &tasks in task_counts {
        let l = Arc::new(RedisLimiter::<A>::new(conn.clone(), quota, cfg.clone()).unwrap());
        let keys: Arc<Vec<String>> = Arc::new((0..tasks).map(|t| format!("{name}:{t}")).collect());
        let scenario = format!("script {name}");
        runs.push(
            drive(&scenario, tasks, secs, move |t| {
                let (l, keys) = (Arc::clone(&l), Arc::clone(&keys));
                async move { l.check(&keys[t], 1).await.unwrap().is_allowed() }
            })
            .await,
        );
    }
    runs
}

/// 4 leased instances sharing one GCRA key at `rate`/s (burst = 100 ms of rate, so that a short
/// stall of this process does not let the bucket overflow), 32 tasks asking as fast as they can:
/// admitted against the allowance `burst + rate × elapsed` (server clock).
async fn lease_accuracy(
    url: &str,
    cfg: &RedisConfig,
    admin: &mut ConnectionManager,
    rate: u64,
    min_grant: u64,
    secs: f64,
) -> (Run, Value) {
    let burst = rate / 10;
    let quota = Quota::per_second(rate).unwrap().with_burst(burst).unwrap();
    let lease = LeaseConfig {
        size: 100,
        ttl: Duration::from_millis(20),
        max_keys: 16,
        renew_below: 0,
        min_grant,
    };
    let instances: Vec<Arc<LeasedLimiter>> = (0..4)
        .map(|_| {
            let c = connect(url, cfg).unwrap();
            Arc::new(LeasedLimiter::new(c, quota, cfg.clone(), lease).unwrap())
        })
        .collect();
    let key = format!("shared{rate}-{min_grant}");
    let shared = Arc::new((instances.clone(), key));
    let t0 = server_time_us(admin).await;
    let run = drive(
        &format!("lease, 4 instances, 1 key, {rate}/s, min grant {min_grant}"),
        32,
        secs,
        move |t| {
            let s = Arc::clone(&shared);
            async move { s.0[t % 4].check(&s.1, 1).await.unwrap().is_allowed() }
        },
    )
    .await;
    let t1 = server_time_us(admin).await;
    let elapsed_us = t1 - t0;
    let allowance = burst + elapsed_us * rate / 1_000_000;
    let (mut leased, mut admitted, mut stranded, mut held, mut calls, mut cached) =
        (0, 0, 0, 0, 0, 0);
    for l in &instances {
        let s = l.stats();
        leased += s.leased;
        admitted += s.admitted;
        stranded += s.stranded;
        held += s.held;
        calls += s.redis_calls;
        cached += s.cached_denials;
    }
    let acc = json!({
        "quota_per_sec": rate, "burst": burst, "lease_size": 100, "lease_ttl_ms": 20,
        "min_grant": min_grant, "instances": 4, "tasks": 32, "server_elapsed_us": elapsed_us, "allowance": allowance,
        "leased": leased, "admitted": admitted,
        "over_admitted": admitted.saturating_sub(allowance),
        "stranded_expired": stranded, "held_at_end": held,
        "error_vs_allowance": (allowance as f64 - admitted as f64) / allowance as f64,
        "unclaimed_in_bucket": allowance.saturating_sub(leased),
        "stranded_share_of_leased": (stranded + held) as f64 / leased.max(1) as f64,
        "redis_calls": calls, "cached_denials": cached, "decisions": run.decisions,
    });
    (run, acc)
}
