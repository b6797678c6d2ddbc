//! The circuit breaker against a real `redis-server` killed with SIGKILL under load: decisions stay
//! fast during the outage, and the limiter is back within a second of the restart.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::RedisServer;
use hdrhistogram::Histogram;
use tollgate_core::Quota;
use tollgate_redis::{
    BreakerConfig, BreakerState, FaultPolicy, LeaseConfig, LeasedLimiter, RedisConfig,
    RedisLimiter, connect,
};

fn cfg(policy: FaultPolicy) -> RedisConfig {
    RedisConfig::default()
        .with_prefix("b:")
        .with_timeout(Duration::from_millis(200))
        .with_policy(policy)
        .with_breaker(BreakerConfig {
            failures: 3,
            probe_interval: Duration::from_millis(50),
        })
}

/// Polls `cond` every 2 ms until it holds or `within` passes; returns how long it took.
async fn wait_for(within: Duration, mut cond: impl AsyncFnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < within {
        if cond().await {
            return Some(t0.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(2)).await; // bounded poll for a server-side event
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_load_keeps_decisions_fast_and_recovers_within_a_second() {
    let mut server = RedisServer::start();
    let open = cfg(FaultPolicy::FailOpen);
    let closed = cfg(FaultPolicy::FailClosed {
        retry_after: Duration::from_millis(250),
    });
    let quota = Quota::per_second(1_000_000).unwrap();
    let script = Arc::new(
        RedisLimiter::gcra(connect(&server.url(), &open).unwrap(), quota, open.clone()).unwrap(),
    );
    let leased = Arc::new(
        LeasedLimiter::new(
            connect(&server.url(), &closed).unwrap(),
            quota,
            closed.clone(),
            LeaseConfig {
                size: 10,
                ..LeaseConfig::default()
            },
        )
        .unwrap(),
    );
    assert!(script.try_check("warm", 1).await.unwrap().is_allowed());
    assert!(leased.try_check("warm", 1).await.unwrap().is_allowed());

    // Load: 4 tasks, two per limiter, each on its own keys, timing every decision while `measure`
    // is set (from the moment both breakers are open until the restart).
    let stop = Arc::new(AtomicBool::new(false));
    let measure = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..4u32 {
        let (script, leased) = (Arc::clone(&script), Arc::clone(&leased));
        let (stop, measure) = (Arc::clone(&stop), Arc::clone(&measure));
        tasks.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
            let (mut allowed, mut denied) = (0u64, 0u64);
            let mut i = 0u64;
            // Relaxed: a stop flag; the results travel through the join.
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let key = format!("k{t}-{}", i % 64);
                let t0 = Instant::now();
                let d = if t % 2 == 0 {
                    script.check(&key, 1).await.unwrap()
                } else {
                    // cost 10 = the lease size: every call needs Redis.
                    leased.check(&key, 10).await.unwrap()
                };
                let took = t0.elapsed();
                // Relaxed: which samples count is decided per sample; no data hangs on it.
                if measure.load(Ordering::Relaxed) {
                    hist.saturating_record(took.as_nanos() as u64);
                    if d.is_allowed() {
                        allowed += 1;
                    } else {
                        denied += 1;
                    }
                }
                if i % 64 == 0 {
                    tokio::task::yield_now().await; // fast-path decisions never yield otherwise
                }
            }
            (t, hist, allowed, denied)
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await; // some load before the kill

    server.kill(); // SIGKILL
    let killed = Instant::now();
    let opened = wait_for(Duration::from_secs(5), async || {
        script.breaker().state == BreakerState::Open && leased.breaker().state == BreakerState::Open
    })
    .await
    .expect("both breakers open within 5 s of the kill");
    measure.store(true, Ordering::Relaxed);
    // The outage: 600 ms of decisions (probes included: one per 50 ms per limiter).
    tokio::time::sleep(Duration::from_millis(600)).await;
    measure.store(false, Ordering::Relaxed);

    server.restart(); // same port; returns once it answers PING
    let restarted = Instant::now();
    let recovered = wait_for(Duration::from_secs(3), async || {
        script.breaker().state == BreakerState::Closed
            && leased.breaker().state == BreakerState::Closed
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
    for task in tasks {
        let (t, h, allowed, denied) = task.await.unwrap();
        // Fail open admits everything while open, fail closed denies everything.
        if t % 2 == 0 {
            assert_eq!(denied, 0, "fail open denied during the outage");
        } else {
            assert_eq!(allowed, 0, "fail closed admitted during the outage");
        }
        assert!(h.len() > 100, "task {t} made only {} decisions", h.len());
        hist.add(h).unwrap();
    }
    let p99 = Duration::from_nanos(hist.value_at_quantile(0.99));
    let p50 = Duration::from_nanos(hist.value_at_quantile(0.5));
    eprintln!(
        "outage: breakers open {opened:?} after the kill; {} decisions, p50 {p50:?}, p99 {p99:?}, \
         max {:?}; recovered {recovered:?} after the restart ({:?} after the kill)",
        hist.len(),
        Duration::from_nanos(hist.max()),
        killed.elapsed()
    );
    assert!(
        p99 < Duration::from_micros(100),
        "p99 decision latency during the outage {p99:?} (p50 {p50:?}, {} decisions)",
        hist.len()
    );
    let recovered = recovered.expect("breakers closed within 3 s of the restart");
    assert!(
        recovered < Duration::from_secs(1),
        "recovered {recovered:?} after the restart ({:?} since)",
        restarted.elapsed()
    );
    // Decisions are real again: a fresh server, so a fresh bucket.
    assert_eq!(
        script.try_check("after", 1).await.unwrap().remaining(),
        quota.burst() - 1
    );
    assert!(leased.try_check("after", 1).await.unwrap().is_allowed());
    for (name, stats, faults) in [
        ("script", script.breaker(), script.faults()),
        ("leased", leased.breaker(), leased.faults()),
    ] {
        assert!(stats.opens >= 1 && stats.closes >= 1, "{name}: {stats:?}");
        assert_eq!(stats.state, BreakerState::Closed, "{name}");
        assert!(
            stats.open_time >= Duration::from_millis(600),
            "{name}: {stats:?}"
        );
        assert!(stats.probes >= 2, "{name}: {stats:?}");
        assert!(faults.circuit_open > 100, "{name}: {faults:?}");
        assert!(
            faults.circuit_open >= stats.rejected / 2,
            "{name}: {faults:?} {stats:?}"
        );
    }
}

/// With the breaker disabled, every call during an outage goes to the network (the behaviour the
/// breaker replaces): each one is counted as an outage, none as short-circuited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_breaker_sends_every_call_to_redis() {
    let mut server = RedisServer::start();
    let c = cfg(FaultPolicy::FailOpen).with_breaker(BreakerConfig::disabled());
    let limiter = RedisLimiter::gcra(
        connect(&server.url(), &c).unwrap(),
        Quota::per_second(10).unwrap(),
        c,
    )
    .unwrap();
    assert!(limiter.try_check("k", 1).await.unwrap().is_allowed());
    server.kill();
    let t0 = Instant::now();
    for _ in 0..10 {
        assert!(limiter.check("k", 1).await.unwrap().is_allowed());
    }
    eprintln!(
        "no breaker: {:?} per decision during the outage",
        t0.elapsed() / 10
    );
    let f = limiter.faults();
    assert_eq!((f.outages, f.circuit_open), (10, 0), "{f:?}");
    assert_eq!(limiter.breaker().state, BreakerState::Closed);
    assert_eq!(limiter.breaker().opens, 0);
}
