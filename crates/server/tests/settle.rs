//! `POST /v1/reserve` and `POST /v1/settle` against the server process: the surplus comes back,
//! an overdraft puts the key into debt, a full table refuses without taking anything, an expired
//! reservation stays at its estimate, a reload that removed the rule makes the settle a counted
//! no-op, a Redis domain is refused with the reason, and bad input (unknown id, twice, negative,
//! fractional, textual or too large actual) is a JSON error that changes nothing.

mod common;

use common::{Server, temp_dir, with_ports};
use serde_json::Value;

/// A tenant's token budget: 1000 an hour (so a test's milliseconds refill nothing), on a window
/// (exact accounting) and a bucket.
fn config(extra_server: &str, rules: &str) -> String {
    format!(
        r#"
[server.reservations]
{extra_server}

[[domains]]
name = "llm"
[domains.policy]
{rules}

[[domains]]
name = "shared"
backend = {{ redis = {{ url = "redis://127.0.0.1:1/" }} }}
[domains.policy]
[[domains.policy.rules]]
name = "tokens"
match = {{ tenant = "any" }}
key = ["tenant"]
limit = 1000
period = "1h"
"#
    )
}

const TOKENS: &str = r#"
[[domains.policy.rules]]
name = "tokens"
match = { tenant = "any" }
key = ["tenant"]
algorithm = "fixed_window"
limit = 1000
period = "1h"
capacity = 1000
"#;

/// `[server]` comes first in the file: the reservations' table is a sub-table of it.
fn start(name: &str, extra_server: &str, rules: &str) -> Server {
    let dir = temp_dir(name);
    Server::start(&dir, &config(extra_server, rules))
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// `POST /v1/reserve` for `tenant`: `(status, body)`.
fn reserve(server: &Server, tenant: &str, estimate: u64) -> (u16, Value) {
    let (status, _, body) = server.http(
        "POST",
        "/v1/reserve",
        &format!(
            r#"{{"domain":"llm","descriptors":[{{"entries":{{"tenant":"{tenant}"}}}}],"estimate":{estimate}}}"#
        ),
    );
    (status, json(&body))
}

fn id_of(body: &Value) -> String {
    body["reservation"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no reservation id: {body}"))
        .to_owned()
}

/// `POST /v1/settle` with `actual` as raw JSON text: `(status, body)`.
fn settle(server: &Server, id: &str, actual: &str) -> (u16, Value) {
    let (status, _, body) = server.http(
        "POST",
        "/v1/settle",
        &format!(r#"{{"id":"{id}","actual":{actual}}}"#),
    );
    (status, json(&body))
}

#[test]
fn the_surplus_comes_back_and_an_overdraft_is_debt() {
    let server = start("settle-basic", "", TOKENS);
    let (status, body) = reserve(&server, "acme", 800);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["overall_code"], "OK");
    assert_eq!(body["statuses"][0]["remaining"], 200);
    assert_eq!(body["reservation"]["estimate"], 800);
    assert_eq!(body["reservation"]["expires_in_ms"], 300_000);
    let first = id_of(&body);
    assert_eq!(first.len(), 32);

    // 200 left: a second estimate of 300 is refused, and holds nothing.
    let (status, body) = reserve(&server, "acme", 300);
    assert_eq!(status, 429, "{body}");
    assert!(body.get("reservation").is_none(), "{body}");

    // The response cost 100: 700 come back.
    let (status, body) = settle(&server, &first, "100");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["settled"],
        serde_json::json!({"estimate": 800, "actual": 100, "rules": 1, "stale": 0})
    );
    let (status, body) = reserve(&server, "acme", 900);
    assert_eq!(status, 200, "900 = 1000 - 100 left: {body}");
    assert_eq!(body["statuses"][0]["remaining"], 0);

    // This one cost 1500: 600 beyond what it held; the window counts 1600 of 1000.
    let (status, body) = settle(&server, &id_of(&body), "1500");
    assert_eq!(status, 200, "{body}");
    let (status, body) = reserve(&server, "acme", 1);
    assert_eq!(status, 429, "in debt: {body}");
    // Another tenant is untouched.
    let (status, _) = reserve(&server, "globex", 1000);
    assert_eq!(status, 200);
}

#[test]
fn bad_settles_are_json_errors_that_change_nothing() {
    let server = start("settle-bad", "", TOKENS);
    let (_, body) = reserve(&server, "acme", 500);
    let id = id_of(&body);

    // Not an id this server issued: 404, whatever its shape.
    for unknown in [
        "00000000000000000000000000000000",
        &format!("{}{}", &id[..16], "0123456789abcdef"),
        "not-an-id",
        "",
    ] {
        let (status, body) = settle(&server, unknown, "1");
        assert_eq!(status, 404, "{unknown}: {body}");
        assert!(body["error"].as_str().is_some(), "{body}");
    }

    // Not a non-negative integer of at most 2^64 - 1: 400, and the reservation stays open.
    for actual in ["-1", "1.5", "\"12\"", "18446744073709551616", "1e3", "null"] {
        let (status, body) = settle(&server, &id, actual);
        assert_eq!(status, 400, "{actual}: {body}");
        assert!(body["error"].as_str().is_some(), "{body}");
    }
    let (status, _, body) = server.http("POST", "/v1/settle", &format!(r#"{{"id":"{id}"}}"#));
    assert_eq!(status, 400, "no actual: {body}");

    // Still open: settles once, at 0 (the whole estimate back)...
    let (status, body) = settle(&server, &id, "0");
    assert_eq!(status, 200, "{body}");
    // ...and not twice.
    let (status, body) = settle(&server, &id, "0");
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("no longer open"),
        "{body}"
    );
    let (status, _) = reserve(&server, "acme", 1000);
    assert_eq!(status, 200, "the estimate came back once");

    // An absurd actual is charged saturating: the key stays denied, the server stays up.
    let (_, body) = reserve(&server, "initech", 10);
    let (status, body) = settle(&server, &id_of(&body), &u64::MAX.to_string());
    assert_eq!(status, 200, "{body}");
    let (status, _) = reserve(&server, "initech", 1);
    assert_eq!(status, 429);
    let (status, _, _) = server.http("GET", "/healthz", "");
    assert_eq!(status, 200);
}

#[test]
fn bad_reserves_are_refused_with_the_reason() {
    let server = start("settle-bad-reserve", "", TOKENS);
    let post = |body: &str| {
        let (status, _, text) = server.http("POST", "/v1/reserve", body);
        (status, json(&text))
    };
    let (status, body) = post(
        r#"{"domain":"llm","descriptors":[{"entries":{"tenant":"a"}},{"entries":{"tenant":"b"}}],"estimate":1}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("exactly one descriptor")
    );
    let (status, body) =
        post(r#"{"domain":"llm","descriptors":[{"entries":{"tenant":"a"}}],"estimate":0}"#);
    assert_eq!(status, 400, "{body}");
    let (status, body) =
        post(r#"{"domain":"llm","descriptors":[{"entries":{"tenant":"a"}}],"estimate":-5}"#);
    assert_eq!(status, 400, "{body}");
    let (status, body) =
        post(r#"{"domain":"nope","descriptors":[{"entries":{"tenant":"a"}}],"estimate":1}"#);
    assert_eq!(status, 404, "{body}");
    // The estimate as /v1/check's hits_addend: the same body shape works.
    let (status, body) =
        post(r#"{"domain":"llm","descriptors":[{"entries":{"tenant":"a"},"hits_addend":7}]}"#);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["reservation"]["estimate"], 7);
    // A cost no rule can ever admit: OVER_LIMIT, cost_too_large, no reservation.
    let (status, body) =
        post(r#"{"domain":"llm","descriptors":[{"entries":{"tenant":"a"}}],"estimate":5000}"#);
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["statuses"][0]["cost_too_large"], true);
    assert!(body.get("reservation").is_none());

    // A Redis domain: 501, naming why (no Redis is contacted: nothing listens on its port).
    let (status, body) =
        post(r#"{"domain":"shared","descriptors":[{"entries":{"tenant":"a"}}],"estimate":1}"#);
    assert_eq!(status, 501, "{body}");
    assert!(body["error"].as_str().unwrap().contains("redis"), "{body}");
}

#[test]
fn a_full_table_refuses_without_taking_anything() {
    let server = start("settle-full", "max_open = 2", TOKENS);
    let (_, a) = reserve(&server, "acme", 100);
    // A denial holds no place.
    let (status, _) = reserve(&server, "acme", 950);
    assert_eq!(status, 429);
    let (status, b) = reserve(&server, "acme", 100);
    assert_eq!(status, 200, "{b}");
    // Two open: the third is refused before it is decided.
    let (status, body) = reserve(&server, "acme", 100);
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("max_open"),
        "{body}"
    );
    // Nothing was taken by the refusal: 800 are left.
    settle(&server, &id_of(&a), "100");
    let (status, body) = reserve(&server, "acme", 800);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["statuses"][0]["remaining"], 0);
    settle(&server, &id_of(&b), "100");
}

#[test]
fn an_expired_reservation_stays_at_its_estimate() {
    let server = start("settle-expiry", "expiry = \"50ms\"", TOKENS);
    let (_, body) = reserve(&server, "acme", 800);
    let id = id_of(&body);
    // Not a race: the expiry is what is tested, and 200 ms of the monotonic clock are 4 expiries.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (status, body) = settle(&server, &id, "0");
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("expired"),
        "{body}"
    );
    // Settled at its estimate: the 800 stay taken.
    let (status, _) = reserve(&server, "acme", 201);
    assert_eq!(status, 429);
    let (status, _) = reserve(&server, "acme", 200);
    assert_eq!(status, 200);
}

#[test]
fn a_settle_after_a_reload_removed_the_rule_is_a_counted_no_op() {
    let server = start("settle-reload", "", TOKENS);
    let (_, body) = reserve(&server, "acme", 800);
    let id = id_of(&body);
    let renamed = TOKENS.replace("name = \"tokens\"", "name = \"tokens_v2\"");
    std::fs::write(&server.config, with_ports(&config("", &renamed))).expect("rewrite config");
    server
        .wait_log("config reloaded", std::time::Duration::from_secs(10))
        .expect("reloaded");
    let (status, body) = settle(&server, &id, "5000");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["settled"]["rules"], 1);
    assert_eq!(body["settled"]["stale"], 1, "{body}");
    // The new rule starts fresh, and the settlement charged nothing it reads.
    let (status, body) = reserve(&server, "acme", 1000);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["statuses"][0]["rule"], "tokens_v2");
}

/// `POST path body` to `addr` on its own connection: `(status, body)`.
fn post(addr: std::net::SocketAddr, path: &str, body: &str) -> (u16, Value) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut out = String::new();
    stream.read_to_string(&mut out).expect("read");
    let (head, body) = out.split_once("\r\n\r\n").expect("a response");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    (status, json(body))
}

#[test]
fn concurrent_reserves_and_settles_account_exactly() {
    let server = start("settle-concurrent", "", TOKENS);
    let addr = server.http;
    // 4 clients × 25 requests of one tenant, each reserving 10 and settling 0..=9: at most 4 × 10
    // held at once and at most 900 settled, so every one is admitted.
    let settled: u64 = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..4u64)
            .map(|t| {
                scope.spawn(move || {
                    let mut sum = 0;
                    for i in 0..25u64 {
                        let (status, body) = post(
                            addr,
                            "/v1/reserve",
                            r#"{"domain":"llm","descriptors":[{"entries":{"tenant":"acme"}}],"estimate":10}"#,
                        );
                        assert_eq!(status, 200, "{body}");
                        let actual = (t * 7 + i) % 10;
                        let (status, body) = post(
                            addr,
                            "/v1/settle",
                            &format!(r#"{{"id":"{}","actual":{actual}}}"#, id_of(&body)),
                        );
                        assert_eq!(status, 200, "{body}");
                        sum += actual;
                    }
                    sum
                })
            })
            .collect();
        clients.into_iter().map(|c| c.join().expect("client")).sum()
    });
    // What was settled is what the window counts: exactly the rest is left.
    let (status, body) = reserve(&server, "acme", 1000 - settled);
    assert_eq!(status, 200, "{settled} settled: {body}");
    assert_eq!(body["statuses"][0]["remaining"], 0);
    let (status, _) = reserve(&server, "acme", 1);
    assert_eq!(status, 429);
}
