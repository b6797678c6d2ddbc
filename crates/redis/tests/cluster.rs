//! The limiters on a real Redis Cluster (3 masters + 3 replicas that each test starts on loopback):
//! keys over all slots, a slot migrated under load, a master killed.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::cluster::{RedisCluster, slot};
use tollgate_core::{FixedWindow, Gcra, LeakyBucket, Nanos, Quota, SlidingWindow};
use tollgate_redis::{
    BatchKey, BatchLimit, ClusterConnection, Error, FaultPolicy, LeaseConfig, LeasedLimiter,
    RedisBatch, RedisConfig, RedisEncoding, RedisLimiter, admitted, connect_cluster,
};

/// Around 2023 in µs since the Unix epoch.
const EPOCH_US: u64 = 1_700_000_000_000_000;
/// One frozen instant (ns) for exact counting.
const NOW: Nanos = (EPOCH_US + 12_345) * 1000;

fn config(prefix: &str) -> RedisConfig {
    RedisConfig::default()
        .with_prefix(prefix)
        .with_timeout(Duration::from_secs(2))
}

async fn conn(cluster: &RedisCluster, cfg: &RedisConfig) -> ClusterConnection {
    connect_cluster(cluster.urls(), cfg).await.unwrap()
}

/// `n` requests of cost 1 for `key` at the frozen instant; the admissions (every call must answer).
async fn admit_n<A: RedisEncoding>(
    l: &RedisLimiter<A, ClusterConnection>,
    key: &str,
    n: u64,
) -> u64 {
    let mut admitted = 0;
    for _ in 0..n {
        admitted += u64::from(l.try_check_at(key, NOW, 1).await.unwrap().is_allowed());
    }
    admitted
}

/// Every key gets 5 requests against a quota of 3: exactly 3 pass, on every master.
async fn all_slots<A: RedisEncoding + Send + Sync + 'static>(
    cluster: &RedisCluster,
    keys: &Arc<Vec<String>>,
) {
    let cfg = config(&format!("{}:", A::NAME));
    let limiter = Arc::new(
        RedisLimiter::<A, _>::new(
            conn(cluster, &cfg).await,
            Quota::per_minute(3).unwrap(),
            cfg,
        )
        .unwrap(),
    );
    let mut tasks = Vec::new();
    for chunk in 0..8 {
        let (limiter, keys) = (Arc::clone(&limiter), Arc::clone(keys));
        tasks.push(tokio::spawn(async move {
            for key in keys.iter().skip(chunk).step_by(8) {
                assert_eq!(admit_n(&limiter, key, 5).await, 3, "{} {key}", A::NAME);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_and_the_lease_mode_on_keys_over_all_slots() {
    let cluster = RedisCluster::start(Duration::from_secs(2));
    // 400 keys: spread over the slot space and hence over the three masters.
    let keys: Arc<Vec<String>> = Arc::new((0..400).map(|i| format!("user:{i}")).collect());
    let slots: Vec<u16> = keys.iter().map(|k| slot(&format!("x:{k}"))).collect();
    let masters: HashSet<u16> = [0u16, 8000, 16000]
        .into_iter()
        .map(|s| cluster.master_of(s).port)
        .collect();
    assert_eq!(masters.len(), 3);
    assert!(slots.iter().any(|&s| s < 5461) && slots.iter().any(|&s| s > 10923));
    all_slots::<Gcra>(&cluster, &keys).await;
    all_slots::<LeakyBucket>(&cluster, &keys).await;
    all_slots::<FixedWindow>(&cluster, &keys).await;
    all_slots::<SlidingWindow>(&cluster, &keys).await;

    // Every master now holds some of each limiter's keys.
    for port in &masters {
        let n: u64 = cluster.cli(*port, &["DBSIZE"]).trim().parse().unwrap();
        assert!(n >= 4 * 50, "master {port} holds only {n} keys");
    }

    // The lease mode: 4 instances (own connections) on every key, leases of 2 from a quota of 7.
    let (fcalls, evalshas) = (
        cluster.command_calls("fcall"),
        cluster.command_calls("evalsha"),
    );
    let mut instances = Vec::new();
    for _ in 0..4 {
        let cfg = config("lease:");
        let lease = LeaseConfig {
            size: 2,
            ttl: Duration::from_secs(3600),
            min_grant: 1,
            max_keys: 1000,
            renew_below: 0,
        };
        instances.push(Arc::new(
            LeasedLimiter::new(
                conn(&cluster, &cfg).await,
                Quota::per_minute(7).unwrap(),
                cfg,
                lease,
            )
            .unwrap(),
        ));
    }
    let mut tasks = Vec::new();
    for (i, l) in instances.iter().enumerate() {
        let (l, keys) = (Arc::clone(l), Arc::clone(&keys));
        tasks.push(tokio::spawn(async move {
            let mut per_key = Vec::new();
            for key in keys.iter().skip(i % 2).step_by(2).chain(keys.iter()) {
                let mut n = 0;
                for _ in 0..3 {
                    n += u64::from(l.try_check_at(key, NOW, 1).await.unwrap().is_allowed());
                }
                per_key.push((key.clone(), n));
            }
            per_key
        }));
    }
    let mut admitted: BTreeMap<String, u64> = BTreeMap::new();
    for t in tasks {
        for (k, n) in t.await.unwrap() {
            *admitted.entry(k).or_default() += n;
        }
    }
    // Each key saw 18 requests from 4 instances against 7 units, at a frozen instant: the bucket
    // granted exactly 7 units of every key, and what is not admitted is held in a live lease (at
    // most size - 1 = 1 per instance and key).
    let stats: Vec<_> = instances.iter().map(|l| l.stats_at(NOW)).collect();
    let leased: u64 = stats.iter().map(|s| s.leased).sum();
    let held: u64 = stats.iter().map(|s| s.held).sum();
    let total: u64 = admitted.values().sum();
    assert_eq!(leased, 7 * 400, "{stats:?}");
    assert_eq!(total + held, leased, "{stats:?}");
    for (k, n) in &admitted {
        assert!((3..=7).contains(n), "lease {k}: {n}");
    }
    // Each lease call went by FCALL to its key's master, none by EVALSHA; an instance's first
    // calls to a master may find the library missing (answered "Function not found", then sent
    // again after the load): one FCALL more per instance and master at most.
    let calls: u64 = stats.iter().map(|s| s.redis_calls).sum();
    let fcalls = cluster.command_calls("fcall") - fcalls;
    let most = calls + 4 * 3;
    assert!(
        (calls..=most).contains(&fcalls),
        "{fcalls} FCALLs, {calls} lease calls"
    );
    assert_eq!(cluster.command_calls("evalsha"), evalshas);

    // Hash tags: keys sharing `{tenant42}` share a slot, and still count apart.
    let cfg = config("ht:");
    let gcra = RedisLimiter::gcra(
        conn(&cluster, &cfg).await,
        Quota::per_minute(2).unwrap(),
        cfg,
    )
    .unwrap();
    assert_eq!(slot("ht:{tenant42}:login"), slot("ht:{tenant42}:search"));
    assert_eq!(admit_n(&gcra, "{tenant42}:login", 4).await, 2);
    assert_eq!(admit_n(&gcra, "{tenant42}:search", 4).await, 2);
}

/// What one loop over a set of keys did.
#[derive(Default)]
struct Tally {
    admitted: BTreeMap<String, u64>,
    errors: Vec<String>,
    during: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrated_under_load_loses_no_decision_and_holds_the_quota() {
    let cluster = RedisCluster::start(Duration::from_secs(2));
    let the_slot = slot("{mig}");
    let from = cluster.master_of(the_slot);
    let to = cluster.master_of(if the_slot < 8000 { 16000 } else { 0 });
    assert_ne!(from.port, to.port);
    // A day's quota: keys written at the frozen instant keep TTLs of many seconds (real time), so
    // none expires during the test and what they hold can be compared with what was admitted.
    const LIMIT: u64 = 50_000;
    let quota = Quota::per(Duration::from_secs(86_400), LIMIT).unwrap();
    let keys: Arc<Vec<String>> = Arc::new((0..30).map(|i| format!("{{mig}}:u{i}")).collect());

    let cfg_g = config("g:");
    let cfg_s = config("s:");
    let cfg_l = config("l:");
    let gcra = Arc::new(RedisLimiter::gcra(conn(&cluster, &cfg_g).await, quota, cfg_g).unwrap());
    let sliding =
        Arc::new(RedisLimiter::sliding_window(conn(&cluster, &cfg_s).await, quota, cfg_s).unwrap());
    let lease = LeaseConfig {
        size: 3,
        ttl: Duration::from_secs(3600),
        min_grant: 1,
        max_keys: 100,
        renew_below: 0,
    };
    let leased = Arc::new(
        LeasedLimiter::new(
            conn(&cluster, &cfg_l.clone()).await,
            quota,
            cfg_l.clone(),
            lease,
        )
        .unwrap(),
    );

    let stop = Arc::new(AtomicBool::new(false));
    let migrating = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for which in 0..3 {
        let (gcra, sliding, leased) =
            (Arc::clone(&gcra), Arc::clone(&sliding), Arc::clone(&leased));
        let (stop, migrating, progress) = (
            Arc::clone(&stop),
            Arc::clone(&migrating),
            Arc::clone(&progress),
        );
        let keys = Arc::clone(&keys);
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            let mut i = 0usize;
            // Relaxed: stop/migrating are flags read per request; results travel through the join.
            while !stop.load(Ordering::Relaxed) {
                let key = &keys[i % keys.len()];
                i += 1;
                let during = migrating.load(Ordering::Relaxed);
                let got = match which {
                    0 => gcra.try_check_at(key, NOW, 1).await,
                    1 => sliding.try_check_at(key, NOW, 1).await,
                    _ => leased.try_check_at(key, NOW, 1).await,
                };
                match got {
                    Ok(d) => {
                        *tally.admitted.entry(key.clone()).or_default() += u64::from(d.is_allowed())
                    }
                    Err(e) => tally.errors.push(format!("{key}: {e}")),
                }
                tally.during += u64::from(during);
                // Relaxed: a progress count the migration waits on (no data hangs on it).
                progress.fetch_add(1, Ordering::Relaxed);
            }
            tally
        }));
    }
    // Let every key exist on the source before the migration starts.
    let wait_progress = |more: u64| {
        let target = progress.load(Ordering::Relaxed) + more;
        let deadline = Instant::now() + Duration::from_secs(10);
        while progress.load(Ordering::Relaxed) < target && Instant::now() < deadline {
            std::thread::yield_now(); // bounded wait for the loops to make progress
        }
    };
    tokio::task::block_in_place(|| wait_progress(3 * 30 * 4));
    migrating.store(true, Ordering::Relaxed);
    let moved = tokio::task::block_in_place(|| {
        // One key per MIGRATE, and the loops make progress between batches.
        cluster.migrate_slot(the_slot, to.port, 1, || wait_progress(9))
    });
    migrating.store(false, Ordering::Relaxed);
    tokio::task::block_in_place(|| wait_progress(3 * 30 * 2)); // two more rounds after
    stop.store(true, Ordering::Relaxed);
    let mut tallies = Vec::new();
    for t in tasks {
        tallies.push(t.await.unwrap());
    }
    eprintln!(
        "migration of slot {the_slot} ({moved} keys, one per MIGRATE): requests during it: gcra {}, \
         sliding {}, lease {}",
        tallies[0].during, tallies[1].during, tallies[2].during
    );
    assert_eq!(cluster.master_of(the_slot).port, to.port, "the slot moved");
    assert_eq!(moved, 90, "30 keys per limiter moved");
    for (name, t) in ["gcra", "sliding", "lease"].iter().zip(&tallies) {
        assert!(
            t.errors.is_empty(),
            "{name}: errors surfaced: {:?}",
            &t.errors[..t.errors.len().min(5)]
        );
        assert!(
            t.during > 30,
            "{name}: only {} requests during the migration",
            t.during
        );
    }
    // No decision lost: what the keys hold now, on the target, is exactly what was admitted.
    for key in keys.iter() {
        let g = tallies[0].admitted[key];
        // A peek's `remaining` is what would be left after admitting it.
        assert_eq!(
            gcra.try_peek_at(key, NOW, 1).await.unwrap().remaining(),
            LIMIT - 1 - g,
            "gcra {key}"
        );
        let s = tallies[1].admitted[key];
        assert_eq!(
            sliding.try_peek_at(key, NOW, 1).await.unwrap().remaining(),
            LIMIT - 1 - s,
            "sliding {key}"
        );
    }
    // The lease keys hold exactly the units leased (the GCRA script reads the same key format).
    let reader = RedisLimiter::gcra(conn(&cluster, &cfg_l).await, quota, cfg_l).unwrap();
    let mut in_bucket = 0;
    for key in keys.iter() {
        in_bucket += LIMIT - 1 - reader.try_peek_at(key, NOW, 1).await.unwrap().remaining();
    }
    let stats = leased.stats_at(NOW);
    assert_eq!(in_bucket, stats.leased, "{stats:?}");
    assert_eq!(stats.admitted + stats.held, stats.leased, "{stats:?}");
    let admitted: u64 = tallies[2].admitted.values().sum();
    assert_eq!(admitted, stats.admitted);
    // Quota holds: a key's last units go, and then nothing more.
    let small = Quota::per_minute(5).unwrap();
    let cfg = config("q:");
    let g = RedisLimiter::gcra(conn(&cluster, &cfg).await, small, cfg).unwrap();
    assert_eq!(admit_n(&g, "{mig}:small", 9).await, 5);
}

/// Keys (with `stem`) whose slots the master on `port` serves.
fn keys_on(cluster: &RedisCluster, port: u16, stem: &str, n: usize) -> Vec<String> {
    let ranges = cluster
        .topology(port)
        .into_iter()
        .find(|m| m.port == port)
        .unwrap()
        .slots;
    (0..)
        .map(|i| format!("{stem}{i}"))
        .filter(|k| {
            let s = slot(&format!("f:{k}"));
            ranges.iter().any(|&(a, b)| a <= s && s <= b)
        })
        .take(n)
        .collect()
}

/// `cluster_current_epoch` as the node on `port` sees it (it grows with every election).
fn epoch(cluster: &RedisCluster, port: u16) -> u64 {
    cluster
        .cli(port, &["CLUSTER", "INFO"])
        .lines()
        .find_map(|l| l.strip_prefix("cluster_current_epoch:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_fails_over_and_the_client_follows() {
    let node_timeout = Duration::from_millis(1000);
    let mut cluster = RedisCluster::start(node_timeout);
    let victim = cluster.master_of(0);
    let epoch_start = epoch(&cluster, victim.port);
    let replica = cluster
        .topology(victim.port)
        .into_iter()
        .find(|n| n.master_id.as_deref() == Some(&victim.id))
        .expect("the victim has a replica");
    const LIMIT: u64 = 10_000_000;
    let quota = Quota::per_minute(LIMIT).unwrap();
    let cfg = config("f:")
        .with_timeout(Duration::from_millis(200))
        .with_policy(FaultPolicy::FailClosed {
            retry_after: Duration::from_millis(100),
        });
    let limiter = Arc::new(
        RedisLimiter::fixed_window(conn(&cluster, &cfg).await, quota, cfg.clone()).unwrap(),
    );
    let mut victim_keys = keys_on(&cluster, victim.port, "v", 17);
    // `check` runs at the real time: it gets a key of its own (on the victim too), so as not to
    // move the counted keys' windows.
    let gap_key = victim_keys.pop().unwrap();
    let victim_keys = Arc::new(victim_keys);

    // Four counting loops on the victim's keys (disjoint keys, so several writes are in flight at
    // the kill): the counts each was told were written.
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..4usize {
        let (limiter, stop) = (Arc::clone(&limiter), Arc::clone(&stop));
        let keys: Vec<String> = victim_keys.iter().skip(t).step_by(4).cloned().collect();
        let gap_key = gap_key.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked: BTreeMap<String, u64> = BTreeMap::new();
            let mut first_error: Option<Instant> = None;
            let mut back: Option<Instant> = None;
            let (mut errors, mut policy_denials) = (0u64, 0u64);
            let mut i = 0usize;
            // Relaxed: a stop flag.
            while !stop.load(Ordering::Relaxed) {
                let key = &keys[i % keys.len()];
                i += 1;
                match limiter.try_check_at(key, NOW, 1).await {
                    Ok(d) => {
                        assert!(d.is_allowed());
                        *acked.entry(key.clone()).or_default() += 1;
                        if first_error.is_some() && back.is_none() {
                            back = Some(Instant::now());
                        }
                    }
                    Err(e) => {
                        assert!(e.is_outage(), "{e}");
                        errors += 1;
                        first_error.get_or_insert_with(Instant::now);
                        // The fault policy's answer in the gap (no network: the breaker is open,
                        // or one more failed try). Near the end of the gap this call may be the
                        // probe that finds the promoted replica: a real decision, admitted.
                        let d = limiter.check(&gap_key, 1).await.unwrap();
                        policy_denials += u64::from(!d.is_allowed());
                        tokio::time::sleep(Duration::from_millis(5)).await; // pace the gap's loop
                    }
                }
            }
            (acked, first_error, back, errors, policy_denials)
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await; // load before the kill
    let offsets = |port: u16| {
        let info = cluster.cli(port, &["INFO", "replication"]);
        info.lines()
            .filter(|l| {
                l.starts_with("role")
                    || l.starts_with("master_repl_offset")
                    || l.starts_with("slave_repl_offset")
                    || l.starts_with("master_link_status")
                    || l.starts_with("slave0")
            })
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let before = format!(
        "master [{}] replica [{}]",
        offsets(victim.port),
        offsets(replica.port)
    );
    // Whether the roles are still those chosen at the start: on a starved host a node that misses
    // `cluster-node-timeout` of pings can be failed over *before* the kill, and then the victim
    // acknowledges writes as a stale master until it learns it was demoted (those are lost when it
    // rejoins as a replica, or here when it is killed).
    let view = cluster.topology(replica.port);
    let roles_held = view
        .iter()
        .any(|n| n.port == victim.port && n.master && !n.failed)
        && view
            .iter()
            .any(|n| n.port == replica.port && n.master_id.as_deref() == Some(&victim.id));
    let epoch_before_kill = epoch(&cluster, replica.port);
    cluster.kill(victim.port);
    let killed = Instant::now();
    // The replica takes over (cluster-node-timeout + election), then the client must follow.
    tokio::task::block_in_place(|| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let t = cluster.topology(replica.port);
            if t.iter().any(|n| n.port == replica.port && n.master) {
                break;
            }
            assert!(Instant::now() < deadline, "replica not promoted");
            std::thread::sleep(Duration::from_millis(20)); // polling the servers
        }
    });
    let promoted = killed.elapsed();
    let deadline = Instant::now() + Duration::from_secs(10);
    while limiter.try_peek_at(&victim_keys[0], NOW, 1).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the client did not follow the failover"
        );
        tokio::time::sleep(Duration::from_millis(10)).await; // bounded poll for the client
    }
    let followed = killed.elapsed();
    tokio::time::sleep(Duration::from_millis(200)).await; // some load after
    stop.store(true, Ordering::Relaxed);
    let mut acked: BTreeMap<String, u64> = BTreeMap::new();
    let (mut first_error, mut back): (Option<Instant>, Option<Instant>) = (None, None);
    let (mut errors, mut policy_denials) = (0, 0);
    for task in tasks {
        let (a, f, b, e, p) = task.await.unwrap();
        acked.extend(a);
        first_error = first_error.into_iter().chain(f).min();
        assert!(f.is_none() || b.is_some(), "a loop never got answers again");
        back = back.into_iter().chain(b).max();
        errors += e;
        policy_denials += p;
    }
    assert_eq!(
        cluster.master_of(0).port,
        replica.port,
        "the replica serves the slots"
    );
    assert!(
        errors > 0 && policy_denials * 10 >= errors * 9,
        "a gap with the policy answering: {policy_denials} denials for {errors} errors"
    );
    let (first_error, back) = (
        first_error.unwrap(),
        back.expect("the loop got answers again"),
    );

    // Over-admission window of asynchronous replication: counts acknowledged by the old master
    // that the promoted replica never received. Those units can be admitted a second time.
    // Reported, not asserted: nothing bounds it (the scripts do not WAIT; a replica can lag by any
    // amount). Seen: 0 in all but one of 37 runs; that one lost 1349 of 2778 (unexplained; the
    // roles/epoch line above and the log excerpt below are there to explain the next one).
    // The other way round, a call that timed out in the gap may still have been applied later (the
    // cluster connection had queued it): consumed, though the caller got the policy's answer.
    let (mut acked_total, mut lost, mut landed) = (0, 0, 0);
    for key in victim_keys.iter() {
        // A peek's `remaining` is what would be left after admitting it.
        let held = LIMIT - 1 - limiter.try_peek_at(key, NOW, 1).await.unwrap().remaining();
        let a = acked.get(key).copied().unwrap_or(0);
        acked_total += a;
        lost += a.saturating_sub(held);
        landed += held.saturating_sub(a);
    }
    let breaker = limiter.breaker();
    eprintln!(
        "failover: roles as chosen just before the kill: {roles_held}; cluster epoch at the start \
         {epoch_start}, before the kill {epoch_before_kill}, after {}",
        epoch(&cluster, replica.port)
    );
    eprintln!(
        "failover: replica promoted {promoted:?} after kill -9, client answering {followed:?} after; \
         gap seen by the loop {:?} ({errors} errors, {policy_denials} policy denials); acknowledged \
         {acked_total} counts, {lost} lost with the old master (the over-admission window), {landed} applied after timing \
         out; breaker \
         {breaker:?}; replication just before the kill: {before}",
        back - first_error
    );
    if lost > 0 || !roles_held {
        // Not explained yet when seen (once in ~12 early runs: 1349 of 2778 lost); the nodes' own
        // account of replication and elections, for whoever sees it next.
        eprintln!(
            "failover: {lost} lost, roles held {roles_held}; victim's log:\n{}replica's log:\n{}",
            cluster.log_excerpt(victim.port),
            cluster.log_excerpt(replica.port)
        );
    }
    assert!(followed < Duration::from_secs(15));
}

/// `RedisBatch` on a cluster: a request whose keys share a hash tag is one script on the tag's
/// master (tags spread over every master), exact; keys in different slots are refused (an error,
/// nothing written), as documented.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_one_hash_tag_is_exact_on_a_cluster_and_other_slots_are_refused() {
    let cluster = RedisCluster::start(Duration::from_secs(2));
    let cfg = config("batch:");
    let batch = RedisBatch::new(conn(&cluster, &cfg).await, cfg);
    let g = BatchLimit::for_quota::<Gcra>(Quota::per_minute(3).unwrap()).unwrap();
    let f = BatchLimit::for_quota::<FixedWindow>(Quota::per_minute(5).unwrap()).unwrap();
    let s = BatchLimit::for_quota::<SlidingWindow>(Quota::per_minute(2).unwrap()).unwrap();
    let tenants: Vec<String> = (0..30).map(|t| format!("{{tenant{t}}}")).collect();
    let masters: HashSet<u16> = tenants
        .iter()
        .map(|t| cluster.master_of(slot(&format!("batch:{t}:g"))).port)
        .collect();
    assert_eq!(masters.len(), 3, "the tags do not cover every master");
    for t in &tenants {
        let names = [format!("{t}:g"), format!("{t}:f"), format!("{t}:s")];
        let keys = [
            BatchKey::enforcing(&names[0], &g),
            BatchKey::enforcing(&names[1], &f),
            BatchKey::shadow(&names[2], &s),
        ];
        let mut outcomes = Vec::new();
        for _ in 0..5 {
            let d = batch.try_check_at(&keys, NOW, 1).await.unwrap();
            outcomes.push((admitted(&keys, &d), d[2].is_allowed()));
        }
        // GCRA's 3 decide; the shadow sliding window admits 2 of them and never denies.
        assert_eq!(
            outcomes,
            [
                (true, true),
                (true, true),
                (true, false),
                (false, false),
                (false, false)
            ],
            "{t}"
        );
        let left = batch.try_peek_at(&keys, NOW, 1).await.unwrap();
        // The fixed window counted only the 3 admitted requests.
        assert_eq!(left[1].remaining(), 5 - 3 - 1, "{t}: {left:?}");
    }
    // Two keys in different slots: refused, nothing written anywhere.
    let (a, b) = ("x:a".to_owned(), "x:b".to_owned());
    assert_ne!(slot(&format!("batch:{a}")), slot(&format!("batch:{b}")));
    let keys = [BatchKey::enforcing(&a, &g), BatchKey::enforcing(&b, &f)];
    let got = batch.try_check_at(&keys, NOW, 1).await;
    assert!(matches!(got, Err(Error::Redis(_))), "{got:?}");
    for k in [&a, &b] {
        let alone = [BatchKey::enforcing(k, &f)];
        let d = batch.try_peek_at(&alone, NOW, 1).await.unwrap();
        assert_eq!(d[0].remaining(), 4, "{k} was written: {d:?}");
    }
}
