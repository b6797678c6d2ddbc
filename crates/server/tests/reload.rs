//! Reload on file change and on SIGHUP while a client loops: no failed call, the new limit
//! applies, kept keys get no fresh burst, a bad config is logged and the old one kept; an empty
//! config (a save caught half way) is refused at start and on reload unless `allow_empty` says
//! it is meant.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Server, descriptor, request, start_refused, temp_dir, with_ports};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

fn config(limit: u64) -> String {
    format!(
        r#"
[[domains]]
name = "edge"
[domains.policy]
[[domains.policy.rules]]
name = "per_user"
match = {{ user = "any" }}
key = ["user"]
limit = {limit}
period = "60s"
capacity = 1000
"#
    )
}

/// Replaces the file in one rename, as editors and ConfigMap updates do.
fn write_atomically(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// `(code, requests_per_unit)` of one call for `user`.
async fn call(client: &mut RateLimitServiceClient<Channel>, user: &str) -> (i32, u32) {
    let r = client
        .should_rate_limit(request("edge", vec![descriptor(&[("user", user)])], 1))
        .await
        .expect("call")
        .into_inner();
    let per_unit = r.statuses[0]
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit);
    (r.overall_code, per_unit)
}

/// Clients looping on their own keys until `stop`; returns (calls, failures).
fn loopers(
    client: &RateLimitServiceClient<Channel>,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<(u64, u64)>> {
    (0..2)
        .map(|i| {
            let mut c = client.clone();
            let stop = Arc::clone(stop);
            tokio::spawn(async move {
                let (mut calls, mut failed) = (0, 0);
                let user = format!("looper{i}");
                // Acquire: pairs with the test's Release store of `stop`.
                while !stop.load(Ordering::Acquire) {
                    match c
                        .should_rate_limit(request("edge", vec![descriptor(&[("user", &user)])], 1))
                        .await
                    {
                        Ok(_) => calls += 1,
                        Err(_) => failed += 1,
                    }
                }
                (calls, failed)
            })
        })
        .collect()
}

/// Polls (bounded) until a fresh key's call reports `per_unit` as its limit.
async fn wait_for_limit(client: &mut RateLimitServiceClient<Channel>, per_unit: u32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let probe = AtomicU64::new(0);
    loop {
        // Relaxed: a local counter for unique probe keys.
        let user = format!("probe{per_unit}-{}", probe.fetch_add(1, Ordering::Relaxed));
        if call(client, &user).await.1 == per_unit {
            return;
        }
        assert!(Instant::now() < deadline, "limit {per_unit} never applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn exercise(server: &Server, trigger: impl Fn(&str)) {
    let mut client = server.client().await;
    // Spend key "x"'s whole quota (3) under the old config.
    for _ in 0..3 {
        assert_eq!(call(&mut client, "x").await.0, Code::Ok as i32);
    }
    assert_eq!(call(&mut client, "x").await.0, Code::OverLimit as i32);

    let stop = Arc::new(AtomicBool::new(false));
    let loops = loopers(&client, &stop);

    // A bad config: logged, the old one kept.
    trigger(
        "[[domains]]\nname = \"edge\"\n[domains.policy]\n[[domains.policy.rules]]\nname = \"per_user\"\nlimit = 0\nperiod = \"1s\"\n",
    );
    assert!(
        server
            .wait_log("reload rejected", Duration::from_secs(20))
            .is_some(),
        "bad config logged"
    );
    assert_eq!(call(&mut client, "fresh-a").await.1, 3, "old config kept");

    // The new limit: 6 per minute.
    trigger(&config(6));
    wait_for_limit(&mut client, 6).await;
    // A new key gets the new quota, exactly.
    let admitted = {
        let mut n = 0;
        for _ in 0..10 {
            if call(&mut client, "y").await.0 == Code::Ok as i32 {
                n += 1;
            }
        }
        n
    };
    assert_eq!(admitted, 6, "the new limit applies to new keys");
    // "x" spent its whole old quota: its state carried over, so no fresh burst.
    assert_eq!(
        call(&mut client, "x").await.0,
        Code::OverLimit as i32,
        "a kept key gets no fresh burst"
    );

    // Release: pairs with the loopers' Acquire loads.
    stop.store(true, Ordering::Release);
    let (mut calls, mut failed) = (0, 0);
    for l in loops {
        let (c, f) = l.await.unwrap();
        calls += c;
        failed += f;
    }
    assert!(calls > 0);
    assert_eq!(
        failed, 0,
        "no call failed across the reloads ({calls} calls)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_on_file_change() {
    let dir = temp_dir("reload-file");
    let server = Server::start(&dir, &config(3));
    let path = server.config.clone();
    exercise(&server, |text| write_atomically(&path, &with_ports(text))).await;
    assert!(
        server
            .wait_log("config reloaded", Duration::from_secs(5))
            .is_some()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_on_sighup() {
    let dir = temp_dir("reload-hup");
    let path = dir.join("server.toml");
    let head = "[server]\ngrpc = \"127.0.0.1:0\"\nhttp = \"127.0.0.1:0\"\nreload_poll = \"0s\"\n";
    std::fs::write(&path, format!("{head}{}", config(3))).unwrap();
    let server = Server::start_file(&path);
    exercise(&server, |text| {
        write_atomically(&path, &format!("{head}{text}"));
        server.signal("HUP");
    })
    .await;
}

/// `config(limit)` at one unit an hour: nothing refills while a test runs.
fn hourly(limit: u64) -> String {
    config(limit).replace("period = \"60s\"", "period = \"1h\"")
}

/// The value of `tollgate_server_reloads_total{result}` on `/metrics` (0 when not yet counted).
fn reloads(server: &Server, result: &str) -> u64 {
    let (status, _, metrics) = server.http("GET", "/metrics", "");
    assert_eq!(status, 200);
    let name = format!("tollgate_server_reloads_total{{result=\"{result}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&name)?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_config_on_reload_is_refused_and_the_old_one_keeps_its_state() {
    let dir = temp_dir("reload-empty");
    let server = Server::start(&dir, &hourly(3));
    let path = server.config.clone();
    let mut client = server.client().await;
    for _ in 0..3 {
        assert_eq!(call(&mut client, "x").await.0, Code::Ok as i32);
    }
    assert_eq!(call(&mut client, "x").await.0, Code::OverLimit as i32);

    // A truncate-then-write save caught after the truncate, then a file with a [server] section
    // but no domains, then a domain with no rules: each refused, logged and counted.
    let empty_domain = "[[domains]]\nname = \"edge\"\n[domains.policy]\n";
    for (i, (text, says)) in [
        (String::new(), "no domains"),
        (with_ports(""), "no domains"),
        (with_ports(empty_domain), "domain `edge` has no rules"),
    ]
    .into_iter()
    .enumerate()
    {
        std::fs::write(&path, &text).unwrap();
        let line = server
            .wait_log("reload rejected", Duration::from_secs(20))
            .unwrap_or_else(|| panic!("{text:?} was not rejected"));
        assert!(line.contains(says), "{line}");
        assert_eq!(reloads(&server, "error"), i as u64 + 1, "{text:?} counted");
        // Calls answer as before: x is still spent, a new key gets the old quota.
        assert_eq!(call(&mut client, "x").await.0, Code::OverLimit as i32);
        assert_eq!(
            call(&mut client, &format!("new{i}")).await,
            (Code::Ok as i32, 3)
        );
    }
    assert_eq!(reloads(&server, "ok"), 0);

    // The file restored (written in place, not renamed): the domain and its state were never
    // dropped, so x gets no fresh burst.
    std::fs::write(&path, with_ports(&hourly(3))).unwrap();
    assert!(
        server
            .wait_log("config reloaded", Duration::from_secs(20))
            .is_some()
    );
    assert_eq!(reloads(&server, "ok"), 1);
    assert_eq!(
        call(&mut client, "x").await.0,
        Code::OverLimit as i32,
        "no fresh burst when the file is restored"
    );

    // Meant: `allow_empty` lets it through; the domain is gone.
    std::fs::write(
        &path,
        with_ports("").replace("[server]\n", "[server]\nallow_empty = true\n"),
    )
    .unwrap();
    assert!(
        server
            .wait_log("config reloaded", Duration::from_secs(20))
            .is_some()
    );
    let err = client
        .should_rate_limit(request("edge", vec![descriptor(&[("user", "x")])], 1))
        .await
        .expect_err("the domain is gone");
    assert_eq!(err.code(), tonic::Code::NotFound);
}

#[test]
fn an_empty_config_is_refused_at_start() {
    let dir = temp_dir("start-empty");
    let path = dir.join("server.toml");
    for (text, says) in [
        ("".to_owned(), "no domains"),
        (with_ports(""), "no domains"),
        (
            with_ports("[[domains]]\nname = \"edge\"\n[domains.policy]\n"),
            "domain `edge` has no rules",
        ),
    ] {
        std::fs::write(&path, &text).unwrap();
        let (status, stderr) = start_refused(&path);
        assert!(!status.success(), "{text:?}");
        assert!(stderr.contains(says), "{text:?}: {stderr}");
        assert!(stderr.contains("allow_empty"), "{stderr}");
    }
    // Meant: it starts.
    std::fs::write(
        &path,
        with_ports("").replace("[server]\n", "[server]\nallow_empty = true\n"),
    )
    .unwrap();
    let server = Server::start_file(&path);
    let (status, _, _) = server.http(
        "POST",
        "/v1/check",
        r#"{"domain":"edge","descriptors":[{"entries":{"user":"u"}}]}"#,
    );
    assert_eq!(status, 404);
}

/// A domain with one keyed rule `per_user` (`limit` an hour), and `extra` TOML after it.
fn domain(name: &str, limit: u64, capacity: u64, extra: &str) -> String {
    format!(
        r#"
[[domains]]
name = "{name}"
[domains.policy]
[[domains.policy.rules]]
name = "per_user"
match = {{ user = "any" }}
key = ["user"]
limit = {limit}
period = "1h"
capacity = {capacity}
{extra}"#
    )
}

/// `(code, limit_remaining, requests_per_unit)` of one call for `user` in `domain`; `None` for an
/// error (an unknown domain).
async fn call_in(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    user: &str,
) -> Option<(i32, u32, u32)> {
    let r = client
        .should_rate_limit(request(domain, vec![descriptor(&[("user", user)])], 1))
        .await
        .ok()?
        .into_inner();
    let s = &r.statuses[0];
    Some((
        r.overall_code,
        s.limit_remaining,
        s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit),
    ))
}

/// A reload is all or nothing across domains. Domain `c`'s key table (capacity 1: one probe
/// window of 32 slots) is filled with live keys, so an override for a key not in it cannot be
/// placed: that is found only against the live table, after `a` and `b` (listed first) are
/// prepared. The reload is refused and `a`, `b`, `c` decide exactly as before with their state;
/// the domain it would add is not there and the one it would remove still is. The same reload
/// without the override then applies to every domain, carrying state (no fresh burst).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_whose_third_domain_fails_changes_no_domain() {
    let v1 = [
        domain("a", 3, 1000, ""),
        domain("b", 3, 1000, ""),
        domain("c", 3, 1, ""),
        domain("gone", 3, 1000, ""),
    ]
    .concat();
    let dir = temp_dir("reload-all-or-nothing");
    let server = Server::start(&dir, &v1);
    let path = server.config.clone();
    let mut client = server.client().await;
    let ok = Code::Ok as i32;
    let over = Code::OverLimit as i32;

    // a: x spends 2 of 3. b: x spends all 3. c: 32 keys, each live for the hour.
    for left in [2, 1] {
        assert_eq!(call_in(&mut client, "a", "x").await, Some((ok, left, 3)));
    }
    for left in [2, 1, 0] {
        assert_eq!(call_in(&mut client, "b", "x").await, Some((ok, left, 3)));
    }
    for i in 0..32 {
        let user = format!("u{i}");
        assert_eq!(call_in(&mut client, "c", &user).await, Some((ok, 2, 3)));
    }

    // New quotas for a and b, an override c cannot place, a domain added and one removed.
    let override_c = "[[domains.policy.overrides]]\nrule = \"per_user\"\nvalues = [\"absent\"]\nlimit = 50\nperiod = \"1h\"\n";
    let failing = [
        domain("a", 10, 1000, ""),
        domain("b", 10, 1000, ""),
        domain("c", 3, 1, override_c),
        domain("d", 3, 1000, ""),
    ]
    .concat();
    write_atomically(&path, &with_ports(&failing));
    let line = server
        .wait_log("reload rejected", Duration::from_secs(20))
        .expect("the reload is refused");
    assert!(line.contains("domain `c`"), "{line}");
    assert_eq!(reloads(&server, "error"), 1);

    // Exactly as before: a's x has its last unit under the old quota, b's x none, c's keys one
    // unit spent each, the old domain answers and the new one does not exist.
    assert_eq!(call_in(&mut client, "a", "x").await, Some((ok, 0, 3)));
    assert_eq!(call_in(&mut client, "a", "x").await, Some((over, 0, 3)));
    assert_eq!(call_in(&mut client, "a", "fresh").await, Some((ok, 2, 3)));
    assert_eq!(call_in(&mut client, "b", "x").await, Some((over, 0, 3)));
    assert_eq!(call_in(&mut client, "c", "u0").await, Some((ok, 1, 3)));
    assert_eq!(call_in(&mut client, "gone", "x").await, Some((ok, 2, 3)));
    assert_eq!(
        call_in(&mut client, "d", "x").await,
        None,
        "d was not added"
    );

    // Without the override the same change applies everywhere, and kept keys keep their state.
    let good = [
        domain("a", 10, 1000, ""),
        domain("b", 10, 1000, ""),
        domain("c", 3, 1, ""),
        domain("d", 3, 1000, ""),
    ]
    .concat();
    write_atomically(&path, &with_ports(&good));
    assert!(
        server
            .wait_log("config reloaded", Duration::from_secs(20))
            .is_some()
    );
    assert_eq!(reloads(&server, "ok"), 1);
    assert_eq!(
        call_in(&mut client, "b", "x").await.map(|r| (r.0, r.2)),
        Some((over, 10)),
        "b's x spent its burst: no fresh one under the new quota"
    );
    assert_eq!(call_in(&mut client, "a", "new").await, Some((ok, 9, 10)));
    assert_eq!(call_in(&mut client, "c", "u1").await, Some((ok, 1, 3)));
    assert_eq!(call_in(&mut client, "d", "x").await, Some((ok, 2, 3)));
    assert_eq!(
        call_in(&mut client, "gone", "x").await,
        None,
        "gone is gone"
    );
}
