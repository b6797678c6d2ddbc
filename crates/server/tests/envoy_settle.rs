//! Costs known after the response, behind a real Envoy, both ways tollgate-server offers:
//!
//! * the JSON settle path: client -> Envoy (a Lua filter calling `POST /v1/reserve` before the
//!   upstream and `POST /v1/settle` with the upstream's usage header) -> the upstream, on
//!   `crates/server/examples/envoy/settle.yaml` and `settle.toml`;
//! * the RLS charge: Envoy's own rate-limit filter checks one unit before the upstream and, when
//!   the stream is done (`apply_on_stream_done`), sends the usage as `hits_addend` with the entry
//!   `tollgate=charge`, on `charge.yaml` and `charge.toml`.
//!
//! The upstream is shaped like an LLM API (`x-usage-tokens`); the `llm` domain holds a per-tenant
//! token budget. Envoy runs on the example files (the ones guides/settle.md points to) with only
//! their four ports replaced; the server on the example's config with its `[server]` addresses
//! replaced and the budget on a fixed one-hour window (nothing refills during a test, so every
//! figure is exact). Envoy is the binary named by `TOLLGATE_ENVOY`; without it the tests print why
//! and pass, unless `CI=true`. Every process is stopped by PID on drop; every wait is bounded.

mod common;
#[path = "common/envoy.rs"]
mod envoy_process;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Server, temp_dir};
use envoy_process::{Envoy, envoy_binary};

const ENVOY_YAML: &str = include_str!("../examples/envoy/settle.yaml");
const SETTLE_TOML: &str = include_str!("../examples/envoy/settle.toml");
const CHARGE_YAML: &str = include_str!("../examples/envoy/charge.yaml");
const CHARGE_TOML: &str = include_str!("../examples/envoy/charge.toml");

/// The LLM-shaped upstream: answers `200` with `x-usage-tokens` set to the request's
/// `x-test-tokens` (no usage header when the request has none), and counts the requests.
fn upstream(seen: Arc<AtomicU64>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let seen = Arc::clone(&seen);
            std::thread::spawn(move || {
                let mut writer = conn.try_clone().expect("clone");
                let mut reader = BufReader::new(conn);
                loop {
                    let mut tokens = None;
                    let mut line = String::new();
                    let mut lines = 0;
                    loop {
                        line.clear();
                        match reader.read_line(&mut line) {
                            Ok(0) | Err(_) => return,
                            Ok(_) if line == "\r\n" && lines > 0 => break,
                            Ok(_) => lines += 1,
                        }
                        if let Some((name, value)) = line.split_once(':') {
                            if name.eq_ignore_ascii_case("x-test-tokens") {
                                tokens = Some(value.trim().to_owned());
                            }
                        }
                    }
                    // SeqCst: counted before the response leaves.
                    seen.fetch_add(1, Ordering::SeqCst);
                    let usage = tokens
                        .map(|t| format!("x-usage-tokens: {t}\r\n"))
                        .unwrap_or_default();
                    let reply = format!("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n{usage}\r\nok");
                    if writer.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A response: status, headers (names lower-cased), body.
struct Reply {
    status: u16,
    head: String,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

fn get(addr: SocketAddr, headers: &[(&str, &str)]) -> std::io::Result<Reply> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let extra: String = headers
        .iter()
        .map(|(n, v)| format!("{n}: {v}\r\n"))
        .collect();
    write!(
        stream,
        "GET /v1/completions HTTP/1.1\r\nhost: test\r\nconnection: close\r\n{extra}\r\n"
    )?;
    let mut out = String::new();
    stream.read_to_string(&mut out)?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line: {out:?}")))?;
    Ok(Reply {
        status,
        head: head.to_owned(),
        body: body.to_owned(),
    })
}

/// Envoy on `yaml` with its upstream (8000) and tollgate-server (`tollgate`: the example's port,
/// the test server's) ports replaced.
fn start_envoy(bin: &Path, dir: &Path, yaml: &str, tollgate: (u16, u16), up: SocketAddr) -> Envoy {
    Envoy::launch(bin, dir, yaml, &[tollgate, (8000, up.port())], |y| y)
}

/// An example's server config from `from` on (its `[server]` addresses left to the harness), the
/// budget on a fixed one-hour window.
fn server_config(example: &str, from: &str) -> String {
    let from = example.find(from).expect("the example has its section");
    let rule = "period = \"1m\"";
    assert_eq!(example.matches(rule).count(), 1);
    example[from..].replace(rule, "period = \"1h\"\nalgorithm = \"fixed_window\"")
}

#[test]
fn envoy_reserves_and_settles_through_the_json_endpoint() {
    let Some(bin) = envoy_binary() else { return };
    let dir = temp_dir("envoy-settle");
    let config = server_config(SETTLE_TOML, "[server.reservations]");
    let server = Server::start(&dir, &config);
    let seen = Arc::new(AtomicU64::new(0));
    let up = upstream(Arc::clone(&seen));
    let envoy = start_envoy(&bin, &dir, ENVOY_YAML, (8080, server.http.port()), up);
    let send = |headers: &[(&str, &str)]| {
        get(envoy.listen, headers).unwrap_or_else(|e| panic!("{e}: {}", envoy.logs()))
    };

    // 1 000 reserved, 300 used: the response carries the reservation's field (9 000 left while
    // it ran), and 700 come back when its head passes.
    let r = send(&[
        ("x-tenant", "acme"),
        ("x-max-tokens", "1000"),
        ("x-test-tokens", "300"),
    ]);
    assert_eq!((r.status, r.body.as_str()), (200, "ok"), "{}", envoy.logs());
    assert!(
        r.header("ratelimit")
            .is_some_and(|v| v.starts_with("\"tokens\";r=9000;")),
        "{}",
        r.head
    );
    // 9 700 left, which only holds if the first settled before its response reached the client.
    let r = send(&[
        ("x-tenant", "acme"),
        ("x-max-tokens", "9700"),
        ("x-test-tokens", "9700"),
    ]);
    assert_eq!(r.status, 200, "{}", r.head);
    assert!(
        r.header("ratelimit")
            .is_some_and(|v| v.starts_with("\"tokens\";r=0;"))
    );
    // Spent: refused by the Lua filter with the server's 429, before the upstream.
    let r = send(&[
        ("x-tenant", "acme"),
        ("x-max-tokens", "1"),
        ("x-test-tokens", "1"),
    ]);
    assert_eq!(r.status, 429, "{}", r.head);
    assert!(r.header("retry-after").is_some(), "{}", r.head);
    assert!(r.body.contains("OVER_LIMIT"), "{}", r.body);
    assert_eq!(
        seen.load(Ordering::SeqCst),
        2,
        "the upstream saw the admitted ones only"
    );

    // No usage header: the reservation stays open (it would expire at its estimate), so the 500
    // stay taken.
    let r = send(&[("x-tenant", "globex"), ("x-max-tokens", "500")]);
    assert_eq!(r.status, 200);
    let reserve = |estimate: u64| {
        server
            .http(
                "POST",
                "/v1/reserve",
                &format!(
                    r#"{{"domain":"llm","descriptors":[{{"entries":{{"tenant":"globex"}}}}],"estimate":{estimate}}}"#
                ),
            )
            .0
    };
    assert_eq!(reserve(9501), 429);
    assert_eq!(reserve(9500), 200);

    // No tenant: refused by the filter.
    assert_eq!(send(&[("x-max-tokens", "5")]).status, 400);
}

#[test]
fn the_example_server_config_loads_as_written() {
    let config = tollgate_server::config::ServerConfig::parse(SETTLE_TOML, false)
        .expect("settle.toml parses");
    assert_eq!(config.server.reservations.max_open, 100_000);
    tollgate_server::service::LiveDomains::new(&config).expect("settle.toml builds");
}

/// `tollgate_server_charged_units_total{domain="llm"}` from the server's `/metrics`.
fn charged(server: &Server) -> u64 {
    let (_, _, body) = server.http("GET", "/metrics", "");
    body.lines()
        .find(|l| l.starts_with("tollgate_server_charged_units_total{") && l.contains("\"llm\""))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// Waits (10 s at most) until the server has charged `units` in all: Envoy sends the stream-done
/// call after the response, so it may land after the client has read it.
fn wait_charged(server: &Server, units: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = charged(server);
        if now == units {
            return;
        }
        assert!(now < units, "charged {now}, more than the {units} expected");
        assert!(
            Instant::now() < deadline,
            "charged {now} of {units} after 10 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn envoy_charges_the_usage_when_the_stream_is_done() {
    let Some(bin) = envoy_binary() else { return };
    let dir = temp_dir("envoy-charge");
    let server = Server::start(&dir, &server_config(CHARGE_TOML, "[[domains]]"));
    let seen = Arc::new(AtomicU64::new(0));
    let up = upstream(Arc::clone(&seen));
    let envoy = start_envoy(&bin, &dir, CHARGE_YAML, (8081, server.grpc.port()), up);
    let send = |headers: &[(&str, &str)]| {
        get(envoy.listen, headers).unwrap_or_else(|e| panic!("{e}: {}", envoy.logs()))
    };

    // 1 unit checked before the upstream (9 999 left while it runs), 300 charged when done.
    let r = send(&[("x-tenant", "acme"), ("x-test-tokens", "300")]);
    assert_eq!((r.status, r.body.as_str()), (200, "ok"), "{}", envoy.logs());
    assert!(
        r.header("ratelimit")
            .is_some_and(|v| v.starts_with("\"tokens\";r=9999;")),
        "{}",
        r.head
    );
    wait_charged(&server, 300);
    // 9 699 left: this one is admitted (9 698 while it runs) and uses 9 699, one more than that.
    let r = send(&[("x-tenant", "acme"), ("x-test-tokens", "9699")]);
    assert_eq!(r.status, 200, "{}", r.head);
    assert!(
        r.header("ratelimit")
            .is_some_and(|v| v.starts_with("\"tokens\";r=9698;")),
        "{}",
        r.head
    );
    wait_charged(&server, 9_999);
    // In debt: refused before the upstream, with the server's fields.
    let r = send(&[("x-tenant", "acme"), ("x-test-tokens", "1")]);
    assert_eq!(r.status, 429, "{}", r.head);
    assert!(r.header("retry-after").is_some(), "{}", r.head);
    assert_eq!(
        seen.load(Ordering::SeqCst),
        2,
        "the upstream saw the admitted ones only"
    );
    // The state: acme's window counted 2 checks + 9 999 charged = 10 001 of 10 000.
    let (status, _, body) = server.http(
        "POST",
        "/v1/check",
        r#"{"domain":"llm","descriptors":[{"entries":{"tenant":"acme"}}]}"#,
    );
    assert_eq!(status, 429, "{body}");

    // No usage header: Envoy leaves the descriptor out, nothing is charged; a later usage is.
    let r = send(&[("x-tenant", "globex")]);
    assert_eq!(r.status, 200);
    let r = send(&[("x-tenant", "globex"), ("x-test-tokens", "40")]);
    assert_eq!(r.status, 200);
    wait_charged(&server, 10_039);
    let (status, head, _) = server.http(
        "POST",
        "/v1/check",
        r#"{"domain":"llm","descriptors":[{"entries":{"tenant":"globex"}}]}"#,
    );
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains("ratelimit: \"tokens\";r=9957;"),
        "2 checks + 40 charged + this check: {head}"
    );
}

#[test]
fn the_example_charge_config_loads_as_written() {
    let config = tollgate_server::config::ServerConfig::parse(CHARGE_TOML, false)
        .expect("charge.toml parses");
    tollgate_server::service::LiveDomains::new(&config).expect("charge.toml builds");
}
