//! The example server on a loopback port, driven by a real HTTP client (reqwest), its limiters on a
//! manual clock: no test sleeps.

#[allow(dead_code, clippy::duplicate_mod)]
#[path = "../examples/server.rs"]
mod server;

use std::net::SocketAddr;
use std::time::Duration;

use ipnet::IpNet;
use reqwest::StatusCode;
use sfv::{BareItem, List, ListEntry, Parser};
use tollgate_core::ManualClock;

/// Starts the example router on 127.0.0.1:0 and returns its address.
async fn start(clock: &ManualClock, trusted: Vec<IpNet>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = server::app(clock.clone(), trusted).unwrap();
    tokio::spawn(server::serve(listener, router));
    addr
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// One member of a RateLimit / RateLimit-Policy list, parsed by sfv's parser.
struct Member {
    name: String,
    params: Vec<(String, i64)>,
}

impl Member {
    fn param(&self, key: &str) -> i64 {
        self.params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("no parameter {key}"))
    }
}

fn parse_list(response: &reqwest::Response, field: &str) -> Vec<Member> {
    let raw = response
        .headers()
        .get(field)
        .unwrap_or_else(|| panic!("{field} missing"))
        .to_str()
        .unwrap();
    let list: List = Parser::new(raw).parse().expect("a structured-field list");
    list.into_iter()
        .map(|entry| match entry {
            ListEntry::Item(item) => Member {
                name: match item.bare_item {
                    BareItem::String(s) => s.as_str().to_owned(),
                    other => panic!("policy name is not a string: {other:?}"),
                },
                params: item
                    .params
                    .iter()
                    .map(|(k, v)| match v {
                        BareItem::Integer(i) => (k.as_str().to_owned(), i64::from(*i)),
                        other => panic!("parameter {k:?} is not an integer: {other:?}"),
                    })
                    .collect(),
            },
            ListEntry::InnerList(_) => panic!("unexpected inner list in {raw}"),
        })
        .collect()
}

fn retry_after(response: &reqwest::Response) -> u64 {
    response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn exhausted_quota_gets_429_with_fields_an_independent_parser_reads() {
    let clock = ManualClock::new();
    let base = format!("http://{}", start(&clock, vec![]).await);
    let http = client();

    for left in [2, 1, 0] {
        let ok = http.get(format!("{base}/search")).send().await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        let policy = parse_list(&ok, "ratelimit-policy");
        assert_eq!(policy.len(), 1);
        assert_eq!(policy[0].name, "search");
        assert_eq!((policy[0].param("q"), policy[0].param("w")), (3, 60));
        let limit = parse_list(&ok, "ratelimit");
        assert_eq!(limit[0].name, "search");
        assert_eq!(limit[0].param("r"), left);
    }

    let denied = http.get(format!("{base}/search")).send().await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let wait = retry_after(&denied);
    // 3 per minute: one unit every 20 s.
    assert_eq!(wait, 20);
    let limit = parse_list(&denied, "ratelimit");
    assert_eq!(limit[0].name, "search");
    assert_eq!(limit[0].param("r"), 0);
    assert_eq!(
        limit[0].param("t"),
        i64::try_from(wait).unwrap(),
        "t agrees with Retry-After"
    );
    assert_eq!(denied.headers()["content-type"], "application/json");
    let body: serde_json::Value = serde_json::from_slice(&denied.bytes().await.unwrap()).unwrap();
    assert_eq!(body["error"], "rate limit exceeded");
    assert_eq!(body["retry_after"], wait);

    // The other route has its own quota.
    let hello = http.get(format!("{base}/hello")).send().await.unwrap();
    assert_eq!(hello.status(), StatusCode::OK);
    assert_eq!(parse_list(&hello, "ratelimit-policy")[0].param("q"), 5);
}

#[tokio::test]
async fn sub_second_waits_round_up_to_one_second_not_zero() {
    let clock = ManualClock::new();
    let base = format!("http://{}", start(&clock, vec![]).await);
    let http = client();
    for _ in 0..5 {
        let ok = http.get(format!("{base}/hello")).send().await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
    }
    let denied = http.get(format!("{base}/hello")).send().await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    // 5 per second: the next unit is 200 ms away, advertised as 1 s (never 0).
    assert_eq!(retry_after(&denied), 1);
    assert_eq!(parse_list(&denied, "ratelimit")[0].param("t"), 1);
}

#[tokio::test]
async fn waiting_retry_after_makes_the_request_pass() {
    let clock = ManualClock::new();
    let base = format!("http://{}", start(&clock, vec![]).await);
    let http = client();
    for _ in 0..3 {
        assert!(
            http.get(format!("{base}/search"))
                .send()
                .await
                .unwrap()
                .status()
                .is_success()
        );
    }
    let denied = http.get(format!("{base}/search")).send().await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let wait = retry_after(&denied);

    // One second short of Retry-After is still too early...
    clock.advance(Duration::from_secs(wait - 1));
    let early = http.get(format!("{base}/search")).send().await.unwrap();
    assert_eq!(early.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&early), 1);
    // ...and the full Retry-After is enough.
    clock.advance(Duration::from_secs(1));
    let ok = http.get(format!("{base}/search")).send().await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(parse_list(&ok, "ratelimit")[0].param("r"), 0);
}

#[tokio::test]
async fn spoofed_forwarded_for_from_an_untrusted_peer_cannot_change_the_key() {
    let clock = ManualClock::new();
    // Nothing trusted: the loopback peer is the key whatever the headers say.
    let base = format!("http://{}", start(&clock, vec![]).await);
    let http = client();
    for i in 0..3 {
        let ok = http
            .get(format!("{base}/search"))
            .header("x-forwarded-for", format!("198.51.100.{i}"))
            .header("forwarded", format!("for=203.0.113.{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
    }
    let spoofed = http
        .get(format!("{base}/search"))
        .header("x-forwarded-for", "192.0.2.99")
        .header("forwarded", "for=192.0.2.98")
        .send()
        .await
        .unwrap();
    assert_eq!(spoofed.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_right_most_untrusted_hop_is_the_key() {
    let clock = ManualClock::new();
    let base = format!(
        "http://{}",
        start(&clock, vec!["127.0.0.1/32".parse().unwrap()]).await
    );
    let http = client();
    // The proxy (our loopback peer) appended the client's real address 198.51.100.7; the client
    // prepended random garbage hoping for a fresh key each time.
    for i in 0..3 {
        let ok = http
            .get(format!("{base}/search"))
            .header("x-forwarded-for", format!("10.9.9.{i}, 198.51.100.7"))
            .send()
            .await
            .unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
    }
    let again = http
        .get(format!("{base}/search"))
        .header("x-forwarded-for", "10.9.9.200, 198.51.100.7")
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::TOO_MANY_REQUESTS);
    // A different client behind the same proxy has its own quota.
    let other = http
        .get(format!("{base}/search"))
        .header("x-forwarded-for", "198.51.100.8")
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::OK);
}
