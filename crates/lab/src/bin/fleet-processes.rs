//! Fleet accuracy with separate processes: 4 limiter instances, each its own OS process with its own
//! connection, share one quota on one key in real time, per-request scripts (GCRA, fixed window) and
//! the lease mode, at demand 0.5×, 1× and 4× the quota; combined admissions against what the quota
//! allows over the run.
//!
//! ```text
//! cargo run --release -p tollgate-lab --bin fleet-processes -- [--secs 5] [--json PATH] [--no-cluster]
//! ```
//! The coordinator (this program without `--member`) starts a `redis-server` and a 3+3 Redis Cluster
//! on free loopback ports (the harness of tollgate-redis's `tests/common`, killed by PID on exit),
//! then for each backend, mode and demand starts 4 copies of itself with `--member ...` at once, each pacing its
//! share of the demand from a common start instant, and sums the JSON line each prints.
//! `results/redis-fleet/run.sh` runs it.

// The redis-server and Redis Cluster harness of tollgate-redis's tests, shared by path.
#[path = "../../../redis/tests/common/mod.rs"]
mod common;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionLike;
use serde_json::{Value, json};
use tollgate_core::{FixedWindow, Gcra, Quota};
use tollgate_redis::{
    LeaseConfig, LeasedLimiter, RedisConfig, RedisLimiter, TimeSource, connect, connect_cluster,
};

const MEMBERS: usize = 4;
/// The shared quota: RATE per second, GCRA burst BURST (the fixed window: RATE per aligned second).
const RATE: u64 = 1000;
const BURST: u64 = 100;
/// Lease sizing for the lease mode.
const LEASE: LeaseConfig = LeaseConfig {
    size: 20,
    ttl: Duration::from_millis(100),
    min_grant: 1,
    max_keys: 16,
    renew_below: 0,
};
/// Concurrent tasks per member (so a slow call does not hold back the schedule).
const TASKS: u64 = 4;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64
}

fn main() {
    if std::env::args().any(|a| a == "--member") {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let out = rt.block_on(member());
        println!("{out}");
    } else {
        coordinator();
    }
}

/// One fleet member: `--urls a,b,...` (`--cluster` to treat them as one cluster), `--mode
/// gcra|fixed|lease`, `--prefix P`, `--demand D` (this member's requests/s), `--secs S`,
/// `--start-us T` (Unix µs of request 0). Sends exactly D × S requests on key `fleet`, request `j`
/// not before `T + j / D`, and prints one JSON line with what it admitted.
async fn member() -> Value {
    let urls: Vec<String> = arg("--urls")
        .expect("--urls")
        .split(',')
        .map(str::to_owned)
        .collect();
    let mode = arg("--mode").expect("--mode");
    let cfg = RedisConfig::default()
        .with_prefix(arg("--prefix").expect("--prefix"))
        .with_timeout(Duration::from_secs(1))
        .with_time(TimeSource::Server);
    if std::env::args().any(|a| a == "--cluster") {
        let conn = connect_cluster(urls, &cfg).await.expect("cluster");
        run_member(conn, &mode, cfg).await
    } else {
        let conn = connect(&urls[0], &cfg).expect("url");
        run_member(conn, &mode, cfg).await
    }
}

/// Something a member can ask: a decision for the fleet's key, or an error (counted apart).
enum Limiter<C> {
    Gcra(RedisLimiter<Gcra, C>),
    Fixed(RedisLimiter<FixedWindow, C>),
    Lease(Box<LeasedLimiter<C>>),
}

impl<C: ConnectionLike + Clone + Send + Sync> Limiter<C> {
    async fn try_check(&self) -> Result<bool, tollgate_redis::Error> {
        Ok(match self {
            Limiter::Gcra(l) => l.try_check("fleet", 1).await?.is_allowed(),
            Limiter::Fixed(l) => l.try_check("fleet", 1).await?.is_allowed(),
            Limiter::Lease(l) => l.try_check("fleet", 1).await?.is_allowed(),
        })
    }
}

async fn run_member<C>(conn: C, mode: &str, cfg: RedisConfig) -> Value
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let demand: u64 = arg("--demand").expect("--demand").parse().expect("demand");
    let secs: u64 = arg("--secs").expect("--secs").parse().expect("secs");
    let start_us: u64 = arg("--start-us")
        .expect("--start-us")
        .parse()
        .expect("start");
    let gcra_quota = Quota::per_second(RATE)
        .and_then(|q| q.with_burst(BURST))
        .expect("quota");
    let limiter = Arc::new(match mode {
        "gcra" => Limiter::Gcra(RedisLimiter::new(conn, gcra_quota, cfg).expect("quota")),
        "fixed" => Limiter::Fixed(
            RedisLimiter::new(conn, Quota::per_second(RATE).expect("quota"), cfg).expect("quota"),
        ),
        "lease" => Limiter::Lease(Box::new(
            LeasedLimiter::new(conn, gcra_quota, cfg, LEASE).expect("quota"),
        )),
        other => panic!("unknown --mode {other}"),
    });
    // The connection is made before the start instant (a first PING through any call is not
    // needed: the cluster client connected above; the single-node manager connects on first use).
    let total = demand * secs;
    let step_us = 1_000_000 / demand;
    // Relaxed: plain counters and extrema, read after every task has been joined.
    let admitted = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let first_us = Arc::new(AtomicU64::new(u64::MAX));
    let last_us = Arc::new(AtomicU64::new(0));
    let max_late_us = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let limiter = Arc::clone(&limiter);
        let (admitted, errors, first_us, last_us, max_late_us) = (
            Arc::clone(&admitted),
            Arc::clone(&errors),
            Arc::clone(&first_us),
            Arc::clone(&last_us),
            Arc::clone(&max_late_us),
        );
        tasks.push(tokio::spawn(async move {
            let mut j = t;
            while j < total {
                let due = start_us + j * step_us;
                let now = unix_us();
                if now < due {
                    tokio::time::sleep(Duration::from_micros(due - now)).await; // pacing the schedule
                }
                let sent = unix_us();
                max_late_us.fetch_max(sent.saturating_sub(due), Ordering::Relaxed);
                first_us.fetch_min(sent, Ordering::Relaxed);
                match limiter.try_check().await {
                    Ok(ok) => {
                        admitted.fetch_add(u64::from(ok), Ordering::Relaxed);
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                last_us.fetch_max(unix_us(), Ordering::Relaxed);
                j += TASKS;
            }
        }));
    }
    for t in tasks {
        t.await.expect("member task");
    }
    let lease = match &*limiter {
        Limiter::Lease(l) => {
            let s = l.stats();
            json!({ "leased": s.leased, "stranded": s.stranded, "held": s.held,
                    "redis_calls": s.redis_calls, "cached_denials": s.cached_denials })
        }
        _ => Value::Null,
    };
    json!({
        "requests": total, "admitted": admitted.load(Ordering::Relaxed),
        "errors": errors.load(Ordering::Relaxed),
        "first_us": first_us.load(Ordering::Relaxed), "last_us": last_us.load(Ordering::Relaxed),
        "max_late_us": max_late_us.load(Ordering::Relaxed), "lease": lease,
    })
}

/// What the quota allows between the first and the last request (µs since the epoch): GCRA from a
/// full bucket `burst + rate × elapsed`; the fixed window `limit` per aligned second touched.
fn allowance(mode: &str, first_us: u64, last_us: u64) -> u64 {
    match mode {
        "fixed" => RATE * (last_us / 1_000_000 - first_us / 1_000_000 + 1),
        _ => BURST + (last_us - first_us) * RATE / 1_000_000,
    }
}

fn coordinator() {
    let secs: u64 = arg("--secs").map_or(5, |s| s.parse().expect("--secs"));
    let with_cluster = !std::env::args().any(|a| a == "--no-cluster");
    let server = common::RedisServer::start();
    let cluster =
        with_cluster.then(|| common::cluster::RedisCluster::start(Duration::from_secs(5)));
    let me = std::env::current_exe().expect("own path");
    let mut backends = vec![("single", vec![server.url()], false)];
    if let Some(c) = &cluster {
        backends.push(("cluster", c.urls(), true));
    }
    let mut rows = Vec::new();
    println!(
        "{MEMBERS} processes, quota {RATE}/s (GCRA burst {BURST}; fixed window {RATE} per aligned \
         second), lease k = {} ttl {:?} min_grant {}, {secs} s per run, server TIME\n",
        LEASE.size, LEASE.ttl, LEASE.min_grant
    );
    println!(
        "| backend | mode | demand | requests | admitted | allowance | admitted ÷ allowance | admitted ÷ requests | errors | max late | lease: leased / stranded + held / Redis calls |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for (backend, urls, is_cluster) in &backends {
        for mode in ["gcra", "fixed", "lease"] {
            for (d, mult) in [(RATE / 2, "0.5×"), (RATE, "1×"), (4 * RATE, "4×")] {
                let prefix = format!("fleet:{backend}:{mode}:{d}:");
                // Start request 0 far enough ahead for 4 processes to start and connect, on a
                // whole second, so that a run of `secs` touches `secs` fixed windows.
                let start_us = (unix_us() + 1_500_000).div_ceil(1_000_000) * 1_000_000;
                let children: Vec<_> = (0..MEMBERS)
                    .map(|_| {
                        let mut cmd = Command::new(&me);
                        cmd.args(["--member", "--mode", mode, "--prefix", &prefix])
                            .args(["--urls", &urls.join(",")])
                            .args(["--demand", &(d / MEMBERS as u64).to_string()])
                            .args(["--secs", &secs.to_string()])
                            .args(["--start-us", &start_us.to_string()])
                            .stdout(Stdio::piped());
                        if *is_cluster {
                            cmd.arg("--cluster");
                        }
                        cmd.spawn().expect("spawn member")
                    })
                    .collect();
                let members: Vec<Value> = children
                    .into_iter()
                    .map(|c| {
                        let out = c.wait_with_output().expect("member output");
                        assert!(out.status.success(), "a member failed");
                        serde_json::from_slice(&out.stdout).expect("member JSON")
                    })
                    .collect();
                let sum = |f: &str| {
                    members
                        .iter()
                        .map(|m| m[f].as_u64().unwrap_or(0))
                        .sum::<u64>()
                };
                let lease_sum = |f: &str| {
                    members
                        .iter()
                        .map(|m| m["lease"][f].as_u64().unwrap_or(0))
                        .sum::<u64>()
                };
                let first = members
                    .iter()
                    .filter_map(|m| m["first_us"].as_u64())
                    .min()
                    .unwrap_or(0);
                let last = members
                    .iter()
                    .filter_map(|m| m["last_us"].as_u64())
                    .max()
                    .unwrap_or(0);
                let late = members
                    .iter()
                    .filter_map(|m| m["max_late_us"].as_u64())
                    .max()
                    .unwrap_or(0);
                let (requests, admitted) = (sum("requests"), sum("admitted"));
                let allow = allowance(mode, first, last);
                let lease = if mode == "lease" {
                    format!(
                        "{} / {} + {} / {}",
                        lease_sum("leased"),
                        lease_sum("stranded"),
                        lease_sum("held"),
                        lease_sum("redis_calls")
                    )
                } else {
                    "–".to_owned()
                };
                println!(
                    "| {backend} | {mode} | {mult} | {requests} | {admitted} | {allow} | {:.3} | {:.3} | {} | {:.1} ms | {lease} |",
                    admitted as f64 / allow as f64,
                    admitted as f64 / requests as f64,
                    sum("errors"),
                    late as f64 / 1e3,
                );
                rows.push(json!({
                    "backend": backend, "mode": mode, "demand_per_sec": d, "requests": requests,
                    "admitted": admitted, "allowance": allow, "first_us": first, "last_us": last,
                    "elapsed_us": last - first, "errors": sum("errors"), "max_late_us": late,
                    "members": members,
                }));
            }
        }
    }
    if let Some(path) = arg("--json") {
        let all = json!({
            "members": MEMBERS, "rate_per_sec": RATE, "burst": BURST, "secs": secs,
            "tasks_per_member": TASKS,
            "lease": { "size": LEASE.size, "ttl_ms": LEASE.ttl.as_millis() as u64, "min_grant": LEASE.min_grant },
            "rows": rows,
        });
        std::fs::write(path, serde_json::to_string_pretty(&all).expect("json")).expect("write");
    }
    drop(cluster);
    drop(server);
}
