//! The descriptors of one ShouldRateLimit call: decided as one by default (a call over the limit
//! anywhere consumes nothing), independently with `descriptors = "independent"`; embedded and on
//! Redis. On one Redis node, per request mode, a call is one Redis command whatever its number of
//! rules and descriptors.

mod common;

#[path = "../../redis/tests/common/redis_server.rs"]
mod redis_server;

use common::{Server, descriptor, request, temp_dir};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use redis_server::{RedisServer, command};
use tonic::transport::Channel;

fn config(mode: Option<&str>, backend: &str) -> String {
    let mode = mode.map_or_else(String::new, |m| format!("descriptors = \"{m}\"\n"));
    format!(
        r#"
[[domains]]
name = "edge"
backend = {backend}
{mode}
[domains.policy]
[[domains.policy.rules]]
name = "per_user"
match = {{ user = "any" }}
key = ["user"]
limit = 1
period = "1h"
capacity = 100
"#
    )
}

/// Calls with descriptors `users` (one per user): whether the call was OK, and each status.
async fn call(server: &Server, users: &[&str]) -> (bool, Vec<bool>) {
    let mut client = server.client().await;
    let descriptors = users.iter().map(|u| descriptor(&[("user", u)])).collect();
    let response = client
        .should_rate_limit(request("edge", descriptors, 1))
        .await
        .expect("answered")
        .into_inner();
    let ok = |code: i32| code == Code::Ok as i32;
    (
        ok(response.overall_code),
        response.statuses.iter().map(|s| ok(s.code)).collect(),
    )
}

async fn a_refused_call_consumes_nothing(backend: &str, name: &str) {
    let server = Server::start(&temp_dir(name), &config(None, backend));
    assert_eq!(
        call(&server, &["b"]).await,
        (true, vec![true]),
        "b spends its one unit"
    );
    // a is admitted, b is over: the call is refused, and a's unit goes back.
    assert_eq!(call(&server, &["a", "b"]).await, (false, vec![true, false]));
    assert_eq!(
        call(&server, &["a"]).await,
        (true, vec![true]),
        "a's unit came back"
    );
    assert_eq!(call(&server, &["a"]).await, (false, vec![false]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_calls_are_decided_as_one() {
    a_refused_call_consumes_nothing("\"embedded\"", "descriptors-embedded").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_calls_are_decided_as_one() {
    let redis = RedisServer::start();
    let backend = format!(
        "{{ redis = {{ url = \"{}\", timeout = \"5s\" }} }}",
        redis.url()
    );
    a_refused_call_consumes_nothing(&backend, "descriptors-redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn independent_descriptors_keep_what_they_admitted() {
    let server = Server::start(
        &temp_dir("descriptors-independent"),
        &config(Some("independent"), "\"embedded\""),
    );
    assert_eq!(call(&server, &["b"]).await, (true, vec![true]));
    assert_eq!(call(&server, &["a", "b"]).await, (false, vec![true, false]));
    assert_eq!(
        call(&server, &["a"]).await,
        (false, vec![false]),
        "a kept its unit spent"
    );
}

/// The commands clients send to a Redis, as `MONITOR` shows them, a script's own commands (shown
/// as from `[db lua]`) left out: what a call costs in round trips, whatever its scripts do inside.
struct Monitor {
    port: u16,
    reader: std::io::BufReader<std::net::TcpStream>,
    marks: u32,
}

impl Monitor {
    fn start(port: u16) -> Monitor {
        use std::io::{BufRead, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        stream.write_all(b"MONITOR\r\n").unwrap();
        let mut reader = std::io::BufReader::new(stream);
        let mut ok = String::new();
        reader.read_line(&mut ok).unwrap();
        assert_eq!(ok.trim_end(), "+OK", "MONITOR");
        Monitor {
            port,
            reader,
            marks: 0,
        }
    }

    /// The client commands (their names) Redis ran since the last call: up to an `ECHO` of a
    /// fresh mark, sent now on another connection, so every command that came before it is in.
    fn since(&mut self) -> Vec<String> {
        use std::io::BufRead;
        self.marks += 1;
        let mark = format!("monitor-mark-{}", self.marks);
        assert_eq!(command(self.port, &["ECHO", &mark]), mark);
        let mut seen = Vec::new();
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line).expect("a MONITOR line");
            assert!(!line.is_empty(), "MONITOR ended");
            if line.contains(&mark) {
                return seen;
            }
            // `+<time> [<db> <client address or lua>] "<command>" "<arg>" ...`
            let Some((from, rest)) = line.split_once('[').and_then(|(_, r)| r.split_once("] "))
            else {
                continue;
            };
            if !from.ends_with(" lua") {
                seen.push(rest.split('"').nth(1).unwrap_or_default().to_lowercase());
            }
        }
    }
}

/// One call with the three descriptors below: whether it was OK, and how many statuses came back.
async fn three_descriptors(
    client: &mut RateLimitServiceClient<Channel>,
    ip: &str,
) -> (bool, usize) {
    let descriptors = vec![
        descriptor(&[("remote_address", ip)]),
        descriptor(&[("remote_address", ip), ("path", "/api/items")]),
        descriptor(&[("generic_key", "global")]),
    ];
    let r = client
        .should_rate_limit(request("edge", descriptors, 1))
        .await
        .expect("answered")
        .into_inner();
    (r.overall_code == Code::Ok as i32, r.statuses.len())
}

/// The shape results/fleet measures: three rules, one per descriptor, and three descriptors per
/// call as Envoy sends them for a route with three `rate_limits` actions. Every call after the
/// first (which loads the batch's function library) is exactly one Redis command, an FCALL (an
/// EVALSHA on Redis before 7), admitted or not (issue 26's goal): tollgate-policy decides the
/// call's descriptors in one batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_with_three_rules_and_three_descriptors_is_one_redis_command() {
    let redis = RedisServer::start();
    let config = format!(
        r#"
[[domains]]
name = "edge"
backend = {{ redis = {{ url = "{}", mode = "per_request", timeout = "5s" }} }}
[domains.policy]
[[domains.policy.rules]]
name = "per_ip"
match = {{ remote_address = "any" }}
key = ["remote_address"]
limit = 1000
period = "1h"
[[domains.policy.rules]]
name = "per_ip_path"
match = {{ remote_address = "any", path = "any" }}
key = ["remote_address", "path"]
limit = 1000
period = "1h"
[[domains.policy.rules]]
name = "global"
match = {{ generic_key = {{ exact = "global" }} }}
limit = 5
period = "1h"
"#,
        redis.url()
    );
    let server = Server::start(&temp_dir("descriptors-one-command"), &config);
    let mut client = server.client().await;
    // The first call connects and loads the library (FCALL, FUNCTION LOAD, FCALL and what the
    // client sends on connecting).
    assert_eq!(three_descriptors(&mut client, "10.0.0.0").await, (true, 3));
    let mut monitor = Monitor::start(redis.port);
    monitor.since();
    // `global` admits 4 more, then denies: an admitted call and a denied one alike are one command.
    for (i, admitted) in [true, true, true, true, false, false]
        .into_iter()
        .enumerate()
    {
        let ip = format!("10.0.0.{i}");
        assert_eq!(
            three_descriptors(&mut client, &ip).await,
            (admitted, 3),
            "call {i}"
        );
        assert_eq!(monitor.since(), ["fcall"], "call {i}");
    }
}
