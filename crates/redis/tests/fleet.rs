//! Fleet accuracy: 4 limiter instances, each on its own connection, share one quota on one key, at
//! demand 0.5×, 1× and 4× the rate, per-request scripts and lease mode, on simulated time (every call
//! passes its instant, so runs are exact and bounded: no sleeps).
//!
//! The one wall-clock dependence left is Redis's own: a key's TTL is its state's remaining life in
//! *simulated* time (a drained GCRA bucket: its burst's worth), counted down in real time. So the
//! simulated unit is a minute, not a second: a drained bucket's key lives 6 real seconds, and a stall
//! of a loaded test process cannot expire it mid-run (with per-second figures a 100 ms stall did:
//! a fresh bucket, `burst` more admitted).

mod common;

use std::time::Duration;

use common::RedisServer;
use tollgate_core::{FixedWindow, Nanos, Quota};
use tollgate_redis::{
    LeaseConfig, LeasedLimiter, RedisConfig, RedisEncoding, RedisLimiter, connect,
};

/// Around 2023 in ns since the Unix epoch (a whole minute, so the fixed windows align with it).
const T0: Nanos = 1_699_999_980_000_000_000;
/// The simulated unit of the rates below: one minute.
const UNIT: Duration = Duration::from_secs(60);
const UNIT_NS: Nanos = 60_000_000_000;
const INSTANCES: usize = 4;
const RATE: u64 = 500; // per UNIT
const BURST: u64 = 50;
const UNITS: u64 = 2; // simulated
const LEASE: u64 = 10;
/// A tenth of the unit (as 100 ms to a second).
const LEASE_TTL: Duration = Duration::from_secs(6);

fn config(prefix: &str) -> RedisConfig {
    RedisConfig::default()
        .with_prefix(prefix)
        .with_timeout(Duration::from_secs(2))
}

fn quota() -> Quota {
    Quota::per(UNIT, RATE).unwrap().with_burst(BURST).unwrap()
}

/// Request `j` of a demand of `per_unit` requests per UNIT: its instant, and the instance that sends
/// it (round robin).
fn schedule(per_unit: u64) -> impl Iterator<Item = (Nanos, usize)> {
    let step = UNIT_NS / per_unit;
    (0..per_unit * UNITS).map(move |j| (T0 + j * step, j as usize % INSTANCES))
}

struct Run {
    demand: u64,
    requests: u64,
    admitted: u64,
    redis_calls: u64,
    stranded: u64,
    held: u64,
}

/// GCRA: admitted ≤ burst + rate × elapsed, from a full bucket.
fn gcra_allowance() -> u64 {
    BURST + RATE * UNITS
}

async fn per_request_gcra(server: &RedisServer, prefix: &str, demand: u64) -> Run {
    let limiters = (0..INSTANCES)
        .map(|_| {
            let cfg = config(prefix);
            RedisLimiter::gcra(connect(&server.url(), &cfg).unwrap(), quota(), cfg).unwrap()
        })
        .collect();
    per_request(limiters, demand).await
}

async fn per_request_fixed(server: &RedisServer, prefix: &str, demand: u64) -> Run {
    let limiters = (0..INSTANCES)
        .map(|_| {
            let cfg = config(prefix);
            RedisLimiter::<FixedWindow, _>::new(
                connect(&server.url(), &cfg).unwrap(),
                Quota::per(UNIT, RATE).unwrap(),
                cfg,
            )
            .unwrap()
        })
        .collect();
    per_request(limiters, demand).await
}

/// The shared schedule through one script call per request, spread over `limiters`.
async fn per_request<A: RedisEncoding>(limiters: Vec<RedisLimiter<A>>, demand: u64) -> Run {
    let mut admitted = 0;
    for (at, i) in schedule(demand) {
        admitted += u64::from(
            limiters[i]
                .try_check_at("fleet", at, 1)
                .await
                .unwrap()
                .is_allowed(),
        );
    }
    Run {
        demand,
        requests: demand * UNITS,
        admitted,
        redis_calls: demand * UNITS,
        stranded: 0,
        held: 0,
    }
}

async fn leased(server: &RedisServer, prefix: &str, demand: u64, renew_below: u64) -> Run {
    let lease = LeaseConfig {
        size: LEASE,
        ttl: LEASE_TTL,
        min_grant: 1,
        max_keys: 16,
        renew_below,
    };
    let limiters: Vec<_> = (0..INSTANCES)
        .map(|_| {
            let cfg = config(prefix);
            LeasedLimiter::new(connect(&server.url(), &cfg).unwrap(), quota(), cfg, lease).unwrap()
        })
        .collect();
    let mut admitted = 0;
    for (at, i) in schedule(demand) {
        admitted += u64::from(
            limiters[i]
                .try_check_at("fleet", at, 1)
                .await
                .unwrap()
                .is_allowed(),
        );
    }
    let end = T0 + UNITS * UNIT_NS;
    let stats: Vec<_> = limiters.iter().map(|l| l.stats_at(end)).collect();
    let sum = |f: fn(&tollgate_redis::LeaseStats) -> u64| stats.iter().map(f).sum::<u64>();
    assert_eq!(sum(|s| s.admitted), admitted);
    Run {
        demand,
        requests: demand * UNITS,
        admitted,
        redis_calls: sum(|s| s.redis_calls),
        stranded: sum(|s| s.stranded),
        held: sum(|s| s.held),
    }
}

/// The lease mode's documented error bound (see `LeasedLimiter`'s docs), for `instances` instances
/// over `secs` from a full bucket: every unit of the bucket is admitted, stranded (expired unspent)
/// or held in a live lease, and each instance strands or holds at most `size` units per lease
/// lifetime started, so admitted ≥ the per-request count − `instances × size × (⌈secs/ttl⌉ + 1)`;
/// with leases taken ahead below `renew_below` units, `size + renew_below` per lifetime (the next
/// lease and what the live one had left when it was taken).
fn lease_slack(renew_below: u64) -> u64 {
    let lifetimes = (UNITS * UNIT_NS).div_ceil(LEASE_TTL.as_nanos() as u64) + 1;
    INSTANCES as u64 * (LEASE + renew_below) * lifetimes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_share_one_quota_per_request_and_leased() {
    share_one_quota(0).await;
}

/// As above with each lease's successor taken ahead once it holds fewer than half its units.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_share_one_quota_with_leases_taken_ahead() {
    share_one_quota(LEASE / 2).await;
}

async fn share_one_quota(renew_below: u64) {
    let lease_slack = || lease_slack(renew_below);
    let server = RedisServer::start();
    let allowance = gcra_allowance();
    let mut rows = Vec::new();
    for (n, demand) in [RATE / 2, RATE, 4 * RATE].into_iter().enumerate() {
        let g = per_request_gcra(&server, &format!("g{n}:"), demand).await;
        let f = per_request_fixed(&server, &format!("f{n}:"), demand).await;
        let l = leased(&server, &format!("l{n}:"), demand, renew_below).await;
        let wanted = demand * UNITS;
        // Per-request GCRA: exact. Below or at the rate everything passes (evenly spaced requests,
        // full bucket); above it, burst + rate × elapsed (the last request lands just before the
        // end, so one emission interval less may have accrued).
        assert!(g.admitted <= allowance, "gcra {demand}/min: {}", g.admitted);
        assert!(
            g.admitted >= wanted.min(allowance - 1),
            "gcra {demand}/min: {}",
            g.admitted
        );
        // Fixed window: at most `limit` per window, UNITS windows touched.
        assert!(
            f.admitted <= RATE * UNITS,
            "fixed {demand}/min: {}",
            f.admitted
        );
        assert!(
            f.admitted >= wanted.min(RATE * UNITS),
            "fixed {demand}/min: {}",
            f.admitted
        );
        // Lease: never over the GCRA allowance; under it by at most the stranded/held slack.
        assert!(
            l.admitted <= allowance,
            "lease {demand}/min: {}",
            l.admitted
        );
        assert!(
            l.admitted + lease_slack() >= g.admitted,
            "lease {demand}/min: {} admitted vs {} per-request, slack {}",
            l.admitted,
            g.admitted,
            lease_slack()
        );
        assert!(l.stranded + l.held <= lease_slack(), "lease {demand}/min");
        if demand <= RATE {
            // Unsaturated, leases of 10 save most calls; saturated, with min_grant 1 every
            // instance asks again whenever the bucket accrues a unit (see `LeaseConfig::min_grant`).
            assert!(
                l.redis_calls * 4 <= l.requests,
                "leases must save calls: {}",
                l.redis_calls
            );
        }
        rows.push((g, f, l));
    }
    eprintln!(
        "fleet: {INSTANCES} instances, GCRA {RATE}/min burst {BURST}, {UNITS} min simulated, lease k = \
         {LEASE} ttl {LEASE_TTL:?}; allowance {allowance}, lease slack bound {}",
        lease_slack()
    );
    eprintln!(
        "| demand | requests | GCRA per-request | fixed window per-request | lease admitted | lease stranded + held | lease Redis calls |"
    );
    for (g, f, l) in &rows {
        eprintln!(
            "| {:.1}× | {} | {} | {} | {} | {} + {} | {} |",
            g.demand as f64 / RATE as f64,
            g.requests,
            g.admitted,
            f.admitted,
            l.admitted,
            l.stranded,
            l.held,
            l.redis_calls
        );
    }
}
