//! The fleet-wide in-flight limit: permits shared by instances, released, and a killed holder's
//! permits coming back within one expiry. Each test starts its own `redis-server`; the holder that
//! is killed is a child process (this test binary, run in holder mode).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::RedisServer;
use tollgate_redis::{RedisConfig, RedisInFlight, connect};

const HOLDER_ENV: &str = "TOLLGATE_INFLIGHT_HOLDER_REDIS";
const LIMIT: u64 = 3;
const EXPIRY: Duration = Duration::from_millis(1_500);

fn limiter(url: &str) -> RedisInFlight {
    let conn = connect(url, &RedisConfig::default()).unwrap();
    RedisInFlight::new(conn, "tg:inflight:", LIMIT, EXPIRY).unwrap()
}

#[test]
fn bad_limits_are_typed_errors() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _guard = runtime.enter();
    let conn = connect("redis://127.0.0.1:1/", &RedisConfig::default()).unwrap();
    assert_eq!(
        RedisInFlight::new(conn.clone(), "p:", 0, EXPIRY).unwrap_err(),
        tollgate_core::QuotaError::ZeroLimit
    );
    assert_eq!(
        RedisInFlight::new(conn, "p:", 1, Duration::from_micros(10)).unwrap_err(),
        tollgate_core::QuotaError::InvalidDuration
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_the_limit_and_a_release_frees_a_place() {
    let server = RedisServer::start();
    let (a, b) = (limiter(&server.url()), limiter(&server.url()));
    let first = a.try_acquire("api").await.unwrap().unwrap();
    let second = b.try_acquire("api").await.unwrap().unwrap();
    let third = a.try_acquire("api").await.unwrap().unwrap();
    assert_eq!(third.remaining(), 0);
    let denied = b.try_acquire("api").await.unwrap().unwrap_err();
    assert!(denied.retry_after().unwrap() <= EXPIRY, "{denied:?}");
    assert!(
        a.try_acquire("other").await.unwrap().is_ok(),
        "keys are independent"
    );
    assert!(second.release().await.unwrap());
    assert_eq!(b.in_flight("api").await.unwrap(), 2);
    let again = b.try_acquire("api").await.unwrap().unwrap();
    drop((first, third, again));
    // Dropped inside the runtime: each sends its ZREM from a task; wait for them to land.
    let deadline = Instant::now() + Duration::from_secs(5);
    while a.in_flight("api").await.unwrap() > 0 {
        assert!(Instant::now() < deadline, "drops did not release");
        tokio::task::yield_now().await;
    }
}

/// Holder mode: run by `a_killed_holders_permits_come_back_within_one_expiry` in a child process.
/// Takes every permit, says so on stdout, and waits to be killed. Does nothing in a normal run.
#[test]
#[ignore = "run as a child process by the kill -9 test"]
fn holder_child() {
    let Ok(url) = std::env::var(HOLDER_ENV) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let permits = runtime.block_on(async {
        let limiter = limiter(&url);
        let mut permits = Vec::new();
        for _ in 0..LIMIT {
            permits.push(limiter.try_acquire("api").await.unwrap().unwrap());
        }
        permits
    });
    println!("held {}", permits.len());
    loop {
        std::thread::park(); // until SIGKILL
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_permits_come_back_within_one_expiry() {
    let server = RedisServer::start();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "holder_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HOLDER_ENV, server.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let held = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            // The harness may print `test holder_child ... ` on the same line first.
            .find_map(|line| line.split_once("held ").map(|(_, n)| n.trim().to_owned()))
    })
    .await
    .unwrap();
    assert_eq!(held.as_deref(), Some("3"));
    // kill -9: the holder never releases.
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = Instant::now();
    let limiter = limiter(&server.url());
    // Its permits still count: the limit is full...
    let denied = limiter.try_acquire("api").await.unwrap().unwrap_err();
    assert!(denied.retry_after().unwrap() <= EXPIRY);
    assert_eq!(limiter.in_flight("api").await.unwrap(), LIMIT);
    // ...until they expire: each within one expiry of its take, so of the kill (polling Redis's
    // own clock, which the test cannot advance). All three are waited for: the holder took them
    // one after another, so on a loaded machine a poll can fall between their expiries.
    while limiter.in_flight("api").await.unwrap() > 0 {
        assert!(
            killed.elapsed() < EXPIRY + Duration::from_millis(1_000),
            "the killed holder's permits did not come back within one expiry"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(killed.elapsed() <= EXPIRY + Duration::from_millis(1_000));
    let permit = limiter.try_acquire("api").await.unwrap().unwrap();
    assert_eq!(
        permit.remaining(),
        LIMIT - 1,
        "all three came back, not one"
    );
    assert!(permit.release().await.unwrap());
}
