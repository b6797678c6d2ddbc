//! Decisions/s and latency on a Redis Cluster (3 masters + 3 replicas on loopback) beside a single
//! `redis-server` in the same process: per-request GCRA and the lease mode, at 1, 32 and 128
//! concurrent tasks, over 10 000 hash-tagged keys spread over all slots, and over 128 such keys (a
//! hot set, one key per task at 128 tasks), so that the lease mode is seen where keys are reused
//! rarely (about as often as a lease lives) and often.
//!
//! ```text
//! cargo run --release -p tollgate-lab --bin cluster-bench -- [--secs 5] [--warm 1] [--rep 1] [--json PATH]
//! cargo run --release -p tollgate-lab --bin cluster-bench -- --summarize rep1.json rep2.json ...
//! ```
//! It starts its own `redis-server` and cluster (the harness of tollgate-redis's `tests/common`), on
//! free loopback ports, killed by PID on exit. `--summarize` prints the medians over several runs' JSON files.
//! `results/redis-cluster/run.sh` runs it.

// The redis-server and Redis Cluster harness of tollgate-redis's tests, shared by path.
#[path = "../../../redis/tests/common/mod.rs"]
mod common;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use redis::aio::ConnectionLike;
use serde_json::{Value, json};
use tollgate_core::{Gcra, Quota};
use tollgate_redis::{
    LeaseConfig, LeasedLimiter, RedisConfig, RedisLimiter, TimeSource, connect, connect_cluster,
};

use common::RedisServer;
use common::cluster::{RedisCluster, slot};

/// Key-space sizes; each key is hash-tagged (`{t<i>}:api`), so its slot is that of `t<i>`.
const KEY_SETS: [usize; 2] = [10_000, 128];
const KEYS: usize = KEY_SETS[0];
const TASK_COUNTS: [usize; 3] = [1, 32, 128];

/// Lease sizing for the lease rows (stated in the results).
const LEASE: LeaseConfig = LeaseConfig {
    size: 1000,
    ttl: Duration::from_secs(1),
    min_grant: 1,
    max_keys: 2 * KEYS,
    renew_below: 0,
};

fn key(i: usize) -> String {
    format!("{{t{i}}}:api")
}

/// One measured configuration.
struct Row {
    backend: &'static str,
    mode: &'static str,
    keys: usize,
    tasks: usize,
    decisions: u64,
    allowed: u64,
    secs: f64,
    redis_calls: Option<u64>,
    hist: Histogram<u64>,
}

impl Row {
    fn json(&self) -> Value {
        json!({
            "backend": self.backend, "mode": self.mode, "keys": self.keys, "tasks": self.tasks,
            "decisions": self.decisions, "allowed": self.allowed, "secs": self.secs,
            "decisions_per_sec": self.decisions as f64 / self.secs,
            "redis_calls": self.redis_calls,
            "p50_ns": self.hist.value_at_quantile(0.5), "p99_ns": self.hist.value_at_quantile(0.99),
            "p999_ns": self.hist.value_at_quantile(0.999), "max_ns": self.hist.max(),
        })
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
}

/// `tasks` closed-loop tasks, task `t` cycling over keys `t, t + tasks, t + 2·tasks, …` below `keys`
/// (disjoint per task while `tasks ≤ keys`), calling `op(key index)`: first `warm` s unmeasured, then `secs` s with every decision
/// timed into the task's own histogram (merged after). Returns decisions, allowed, elapsed, histogram.
async fn drive<F, Fut>(
    keys: usize,
    tasks: usize,
    warm: f64,
    secs: f64,
    op: F,
) -> (u64, u64, f64, Histogram<u64>)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send,
{
    let op = Arc::new(op);
    // Every task starts at the same instants (a barrier would be as good; these are set before spawning).
    let measure_from = Instant::now() + Duration::from_secs_f64(warm);
    let deadline = measure_from + Duration::from_secs_f64(secs);
    let mut handles = Vec::new();
    for task in 0..tasks {
        let op = Arc::clone(&op);
        handles.push(tokio::spawn(async move {
            let mut hist = histogram();
            let (mut n, mut allowed) = (0u64, 0u64);
            let mut i = task % keys;
            loop {
                let t0 = Instant::now();
                if t0 >= deadline {
                    break;
                }
                let ok = op(i).await;
                i += tasks;
                if i >= keys {
                    i = task % keys;
                }
                if t0 >= measure_from {
                    allowed += u64::from(ok);
                    hist.saturating_record(t0.elapsed().as_nanos() as u64);
                    n += 1;
                }
                if n % 256 == 0 {
                    tokio::task::yield_now().await; // local decisions never yield otherwise
                }
            }
            (n, allowed, hist)
        }));
    }
    let mut total = (0, 0, histogram());
    for h in handles {
        let (n, a, hist) = h.await.expect("driver task");
        total.0 += n;
        total.1 += a;
        total.2.add(hist).expect("same bounds");
    }
    let secs = deadline
        .saturating_duration_since(measure_from)
        .as_secs_f64();
    (total.0, total.1, secs, total.2)
}

/// Both modes at every key-set size and task count over one connection `conn` (`backend` names it
/// in the output).
async fn backend_rows<C>(backend: &'static str, conn: C, rep: u32, warm: f64, secs: f64) -> Vec<Row>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let mut rows = Vec::new();
    for n_keys in KEY_SETS {
        for tasks in TASK_COUNTS {
            let tag = format!("r{rep}:{backend}:{n_keys}:{tasks}");
            rows.push(per_request_row(backend, &conn, &tag, n_keys, tasks, warm, secs).await);
            rows.push(lease_row(backend, &conn, &tag, n_keys, tasks, warm, secs).await);
        }
    }
    rows
}

/// Large enough that every request passes: the figures are the path's cost, not denials.
fn roomy_quota() -> Quota {
    Quota::per_second(1_000_000)
        .and_then(|q| q.with_burst(100_000_000))
        .expect("valid quota")
}

async fn per_request_row<C>(
    backend: &'static str,
    conn: &C,
    tag: &str,
    n_keys: usize,
    tasks: usize,
    warm: f64,
    secs: f64,
) -> Row
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let cfg = config(&format!("{tag}:gcra:"));
    let limiter =
        Arc::new(RedisLimiter::<Gcra, C>::new(conn.clone(), roomy_quota(), cfg).expect("quota"));
    let keys = Arc::new((0..n_keys).map(key).collect::<Vec<_>>());
    let l = Arc::clone(&limiter);
    prime(&keys, |k| {
        let l = Arc::clone(&l);
        async move { l.check(&k, 1).await.expect("cost 1").is_allowed() }
    })
    .await;
    let (decisions, allowed, secs, hist) = drive(n_keys, tasks, warm, secs, move |i| {
        let (l, k) = (Arc::clone(&limiter), Arc::clone(&keys));
        async move { l.check(&k[i], 1).await.expect("cost 1").is_allowed() }
    })
    .await;
    eprintln!(
        "  {backend} per-request {n_keys} keys {tasks} tasks: {:.0}/s",
        decisions as f64 / secs
    );
    Row {
        backend,
        mode: "per-request GCRA",
        keys: n_keys,
        tasks,
        decisions,
        allowed,
        secs,
        redis_calls: None,
        hist,
    }
}

async fn lease_row<C>(
    backend: &'static str,
    conn: &C,
    tag: &str,
    n_keys: usize,
    tasks: usize,
    warm: f64,
    secs: f64,
) -> Row
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let cfg = config(&format!("{tag}:lease:"));
    let limiter =
        Arc::new(LeasedLimiter::new(conn.clone(), roomy_quota(), cfg, LEASE).expect("quota"));
    let keys = Arc::new((0..n_keys).map(key).collect::<Vec<_>>());
    let l = Arc::clone(&limiter);
    prime(&keys, |k| {
        let l = Arc::clone(&l);
        async move { l.check(&k, 1).await.expect("cost 1").is_allowed() }
    })
    .await;
    let calls_before = limiter.stats().redis_calls;
    let l = Arc::clone(&limiter);
    let (decisions, allowed, secs_measured, hist) = drive(n_keys, tasks, warm, secs, move |i| {
        let (l, k) = (Arc::clone(&l), Arc::clone(&keys));
        async move { l.check(&k[i], 1).await.expect("cost 1").is_allowed() }
    })
    .await;
    // Calls during warm-up and measurement (the priming pass excluded), scaled to the measured part.
    let calls = limiter.stats().redis_calls - calls_before;
    eprintln!(
        "  {backend} lease {n_keys} keys {tasks} tasks: {:.0}/s, {calls} Redis calls (faults {:?})",
        decisions as f64 / secs_measured,
        limiter.faults()
    );
    Row {
        backend,
        mode: "lease",
        keys: n_keys,
        tasks,
        decisions,
        allowed,
        secs: secs_measured,
        redis_calls: Some((calls as f64 * secs_measured / (secs_measured + warm)) as u64),
        hist,
    }
}

/// One request on every key (128 at a time), so that no measured run pays for creating keys or,
/// in the lease mode, for the first lease of each.
async fn prime<F, Fut>(keys: &Arc<Vec<String>>, op: F)
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = bool> + Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for k in keys.iter() {
        if set.len() >= 128 {
            set.join_next().await;
        }
        set.spawn(op(k.clone()));
    }
    while set.join_next().await.is_some() {}
}

fn config(prefix: &str) -> RedisConfig {
    RedisConfig::default()
        .with_prefix(prefix)
        .with_timeout(Duration::from_secs(1))
        .with_time(TimeSource::Server)
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    if std::env::args().any(|a| a == "--summarize") {
        summarize();
        return;
    }
    let secs: f64 = arg("--secs").map_or(5.0, |s| s.parse().expect("--secs"));
    let warm: f64 = arg("--warm").map_or(1.0, |s| s.parse().expect("--warm"));
    let rep: u32 = arg("--rep").map_or(1, |s| s.parse().expect("--rep"));

    let server = RedisServer::start();
    let cluster = tokio::task::block_in_place(|| RedisCluster::start(Duration::from_secs(5)));
    let masters: Vec<u16> = [0u16, 8000, 16000]
        .into_iter()
        .map(|s| cluster.master_of(s).port)
        .collect();
    let mut per_master = [0usize; 3];
    for i in 0..KEYS {
        let s = slot(&key(i));
        per_master[usize::from(s >= 5461) + usize::from(s >= 10923)] += 1;
    }
    eprintln!("cluster masters {masters:?}; keys per third of the slot space {per_master:?}");

    let cfg = config("probe:");
    let single = connect(&server.url(), &cfg).expect("url");
    let clustered = connect_cluster(cluster.urls(), &cfg)
        .await
        .expect("cluster");
    let mut rows = backend_rows("single", single, rep, warm, secs).await;
    rows.extend(backend_rows("cluster", clustered, rep, warm, secs).await);

    print_table(&rows.iter().map(Row::json).collect::<Vec<_>>());
    if let Some(path) = arg("--json") {
        let all = json!({
            "rep": rep, "secs": secs, "warm": warm, "keys": KEYS,
            "lease": { "size": LEASE.size, "ttl_ms": LEASE.ttl.as_millis() as u64,
                       "min_grant": LEASE.min_grant, "max_keys": LEASE.max_keys },
            "keys_per_slot_third": per_master,
            "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&all).expect("json")).expect("write");
    }
}

fn print_table(rows: &[Value]) {
    println!("| backend | mode | keys | tasks | decisions/s | p50 | p99 | Redis calls/s |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let calls = r["redis_calls"].as_f64().map_or("–".to_owned(), |c| {
            format!("{:.0}", c / r["secs"].as_f64().unwrap_or(1.0))
        });
        println!(
            "| {} | {} | {} | {} | {:.0} | {:.1} µs | {:.1} µs | {calls} |",
            r["backend"].as_str().unwrap_or("?"),
            r["mode"].as_str().unwrap_or("?"),
            r["keys"],
            r["tasks"],
            r["decisions_per_sec"].as_f64().unwrap_or(0.0),
            r["p50_ns"].as_f64().unwrap_or(0.0) / 1e3,
            r["p99_ns"].as_f64().unwrap_or(0.0) / 1e3,
        );
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Medians per (backend, mode, keys, tasks) over the JSON files named after `--summarize`, with the
/// lease/per-request and cluster/single ratios of the medians.
fn summarize() {
    let files: Vec<String> = std::env::args()
        .skip_while(|a| a != "--summarize")
        .skip(1)
        .collect();
    let rows: Vec<Value> = files
        .iter()
        .flat_map(|f| {
            let run: Value = serde_json::from_str(&std::fs::read_to_string(f).expect("read run"))
                .expect("run JSON");
            run["rows"].as_array().cloned().unwrap_or_default()
        })
        .collect();
    let med = |backend: &str, mode: &str, keys: u64, tasks: u64, field: &str| {
        median(
            rows.iter()
                .filter(|r| {
                    r["backend"] == backend
                        && r["mode"] == mode
                        && r["keys"].as_u64() == Some(keys)
                        && r["tasks"].as_u64() == Some(tasks)
                })
                .filter_map(|r| match field {
                    "calls_per_sec" => Some(r["redis_calls"].as_f64()? / r["secs"].as_f64()?),
                    f => r[f].as_f64(),
                })
                .collect(),
        )
    };
    println!("Medians of {} runs ({}).\n", files.len(), files.join(", "));
    println!(
        "| backend | mode | keys | tasks | decisions/s | p50 | p99 | Redis calls/s | lease ÷ per-request | cluster ÷ single |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut seen = Vec::new();
    for r in &rows {
        let b = r["backend"].as_str().unwrap_or("?");
        let m = r["mode"].as_str().unwrap_or("?");
        let (k, t) = (
            r["keys"].as_u64().unwrap_or(0),
            r["tasks"].as_u64().unwrap_or(0),
        );
        if seen.contains(&(b, m, k, t)) {
            continue;
        }
        seen.push((b, m, k, t));
        let rate = med(b, m, k, t, "decisions_per_sec");
        let calls = med(b, m, k, t, "calls_per_sec");
        let calls = if calls.is_nan() {
            "–".to_owned()
        } else {
            format!("{calls:.0}")
        };
        let vs_pr = if m == "lease" {
            format!(
                "{:.1}×",
                rate / med(b, "per-request GCRA", k, t, "decisions_per_sec")
            )
        } else {
            "–".to_owned()
        };
        let vs_single = if b == "cluster" {
            format!("{:.2}", rate / med("single", m, k, t, "decisions_per_sec"))
        } else {
            "–".to_owned()
        };
        println!(
            "| {b} | {m} | {k} | {t} | {rate:.0} | {:.1} µs | {:.1} µs | {calls} | {vs_pr} | {vs_single} |",
            med(b, m, k, t, "p50_ns") / 1e3,
            med(b, m, k, t, "p99_ns") / 1e3,
        );
    }
}
