//! One table of cases that every edge over a policy must answer alike (not a public API: the
//! shared fixture of the edges' tests).
//!
//! Each [`Case`] starts from a fresh policy built from its [`Case::policy`] text (on a clock that
//! does not move, or one that moves less than a second during the case: every expected `t` and
//! `Retry-After` is a whole number of seconds rounded up, so sub-second drift cannot change it),
//! sends [`Case::before`] identical one-unit requests, then the request under test with
//! [`Case::cost`]. tollgate-http's `tests/conformance.rs` runs the table through the tower
//! [`PolicyLayer`](crate::PolicyLayer), tollgate-pingora's through `PingoraLimiter`, and
//! tollgate-server's through its RLS (gRPC) and JSON answers; each asserts [`Case::expect`] with
//! [`Expected::assert_matches`]. How each edge maps the statuses is in [`crate::edge`].

use std::net::IpAddr;

use http::{HeaderMap, HeaderName, HeaderValue};

/// The policy most cases run: a per-client rule with a gold tier, a per-API-key rule, and a
/// shadow rule on `/watched`.
pub const POLICY: &str = r#"
[[rules]]
name = "per_client"
match = { remote_address = "any" }
key = ["remote_address"]
limit = 4
period = "60s"
capacity = 64

[[rules]]
name = "per_api_key"
match = { api_key = "any" }
key = ["api_key"]
limit = 2
period = "60s"
capacity = 64

[[rules]]
name = "watch"
mode = "shadow"
match = { route = { prefix = "/watched" } }
limit = 1
period = "60s"

[[overrides]]
rule = "per_client"
tier = "gold"
values = ["198.51.100.9"]
limit = 10
period = "60s"
"#;

/// A two-stage rule: one request a second, later ones held up to two seconds.
pub const DELAY_POLICY: &str = r#"
[[rules]]
name = "paced"
match = { remote_address = "any" }
key = ["remote_address"]
limit = 1
period = "1s"
capacity = 64
delay = { max_delay = "2s" }
"#;

/// The header carrying the API key (descriptor `api_key`).
pub const API_KEY_HEADER: &str = "x-api-key";

/// One request and what every edge must answer to it.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// What it shows.
    pub name: &'static str,
    /// The policy (TOML, the tollgate-policy schema).
    pub policy: &'static str,
    /// The TCP peer (no proxy is trusted: it is the client); `None`: the transport gave none.
    pub peer: Option<&'static str>,
    /// The method.
    pub method: &'static str,
    /// The path.
    pub path: &'static str,
    /// Request headers.
    pub headers: &'static [(&'static str, &'static str)],
    /// Identical one-unit requests sent first.
    pub before: u32,
    /// The cost of the request under test.
    pub cost: u64,
    /// The answer.
    pub expect: Expected,
}

/// What an edge answers. Statuses are an HTTP edge's; the RLS edge answers `OK` for 200 and
/// `OVER_LIMIT` for 429 and 413 (with no `Retry-After` and no fields for 413).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expected {
    /// 200 (forwarded), 429 or 413.
    pub status: u16,
    /// `RateLimit-Policy`.
    pub ratelimit_policy: Option<&'static str>,
    /// `RateLimit`.
    pub ratelimit: Option<&'static str>,
    /// `Retry-After`.
    pub retry_after: Option<&'static str>,
    /// Held before forwarding (a two-stage rule); the RLS edge refuses such a policy at load.
    pub delayed: bool,
    /// A shadow rule would have denied.
    pub shadow_denied: bool,
}

/// What one edge answered, to compare with [`Expected`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// The status (the RLS edge maps its code back: see [`Expected`]).
    pub status: u16,
    /// `RateLimit-Policy`.
    pub ratelimit_policy: Option<String>,
    /// `RateLimit`.
    pub ratelimit: Option<String>,
    /// `Retry-After`.
    pub retry_after: Option<String>,
    /// Whether the request was held.
    pub delayed: bool,
    /// `None` where the edge does not expose it (a tower response).
    pub shadow_denied: Option<bool>,
}

impl Expected {
    /// Panics, naming the case and the edge, when `observed` differs.
    pub fn assert_matches(&self, edge: &str, case: &str, observed: &Observed) {
        let text = |v: Option<&str>| v.map(str::to_owned);
        let expected = Observed {
            status: self.status,
            ratelimit_policy: text(self.ratelimit_policy),
            ratelimit: text(self.ratelimit),
            retry_after: text(self.retry_after),
            delayed: self.delayed,
            shadow_denied: observed.shadow_denied.map(|_| self.shadow_denied),
        };
        assert_eq!(observed, &expected, "{edge}: case `{case}`");
    }
}

impl Case {
    /// The peer as an address.
    pub fn peer_ip(&self) -> Option<IpAddr> {
        self.peer.and_then(|p| p.parse().ok())
    }

    /// The request headers as a map.
    pub fn header_map(&self) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in self.headers {
            if let (Ok(name), Ok(value)) =
                (HeaderName::try_from(*name), HeaderValue::try_from(*value))
            {
                map.append(name, value);
            }
        }
        map
    }

    /// The case's policy as one tollgate-server domain named `domain` (TOML).
    pub fn server_config(&self, domain: &str) -> String {
        // The request's facts arrive as one descriptor, as the HTTP edges pass them to the policy:
        // rules match the subset they name (Envoy's exact matching is for one descriptor per rule).
        format!(
            "[[domains]]\nname = \"{domain}\"\n[domains.policy]\ndescriptor_match = \"subset\"\n{}",
            self.policy
                .replace("[[rules]]", "[[domains.policy.rules]]")
                .replace("[[overrides]]", "[[domains.policy.overrides]]")
        )
    }
}

const PEER: Option<&str> = Some("192.0.2.1");
const POLICY_4: Option<&str> = Some("\"per_client\";q=4;w=60");
const NONE: Expected = Expected {
    status: 200,
    ratelimit_policy: None,
    ratelimit: None,
    retry_after: None,
    delayed: false,
    shadow_denied: false,
};

/// The cases.
pub const CASES: &[Case] = &[
    Case {
        name: "under the limit",
        policy: POLICY,
        peer: PEER,
        method: "GET",
        path: "/",
        headers: &[],
        before: 1,
        cost: 1,
        expect: Expected {
            ratelimit_policy: POLICY_4,
            ratelimit: Some("\"per_client\";r=2;t=15"),
            ..NONE
        },
    },
    Case {
        name: "at the limit",
        policy: POLICY,
        peer: PEER,
        method: "GET",
        path: "/",
        headers: &[],
        before: 3,
        cost: 1,
        expect: Expected {
            ratelimit_policy: POLICY_4,
            ratelimit: Some("\"per_client\";r=0;t=15"),
            ..NONE
        },
    },
    Case {
        name: "denied, cost 1",
        policy: POLICY,
        peer: PEER,
        method: "GET",
        path: "/",
        headers: &[],
        before: 4,
        cost: 1,
        expect: Expected {
            status: 429,
            ratelimit_policy: POLICY_4,
            ratelimit: Some("\"per_client\";r=0;t=15"),
            retry_after: Some("15"),
            ..NONE
        },
    },
    Case {
        // Three units are left, fewer than the four asked: `r` says so, `t` is the wait for a
        // fourth, `Retry-After` the wait until four fit.
        name: "denied, cost above 1",
        policy: POLICY,
        peer: PEER,
        method: "GET",
        path: "/",
        headers: &[],
        before: 1,
        cost: 4,
        expect: Expected {
            status: 429,
            ratelimit_policy: POLICY_4,
            ratelimit: Some("\"per_client\";r=3;t=15"),
            retry_after: Some("15"),
            ..NONE
        },
    },
    Case {
        name: "cost above capacity",
        policy: POLICY,
        peer: PEER,
        method: "GET",
        path: "/",
        headers: &[],
        before: 0,
        cost: 5,
        expect: Expected {
            status: 413,
            ..NONE
        },
    },
    Case {
        name: "shadow denial",
        policy: POLICY,
        peer: PEER,
        method: "GET",
        path: "/watched/x",
        headers: &[],
        before: 1,
        cost: 1,
        expect: Expected {
            ratelimit_policy: POLICY_4,
            ratelimit: Some("\"per_client\";r=2;t=15"),
            shadow_denied: true,
            ..NONE
        },
    },
    Case {
        name: "delay rule",
        policy: DELAY_POLICY,
        peer: PEER,
        method: "GET",
        path: "/",
        headers: &[],
        before: 1,
        cost: 1,
        expect: Expected {
            ratelimit_policy: Some("\"paced\";q=1;w=1"),
            ratelimit: Some("\"paced\";r=0;t=1"),
            delayed: true,
            ..NONE
        },
    },
    Case {
        name: "missing descriptor",
        policy: POLICY,
        peer: None,
        method: "GET",
        path: "/",
        headers: &[],
        before: 4,
        cost: 1,
        expect: NONE,
    },
    Case {
        // Sent as "", the value would be a key of `per_api_key` (2 a minute: `r=1`, the
        // tightest rule); dropped, only `per_client` applies.
        name: "empty header value",
        policy: POLICY,
        peer: PEER,
        method: "GET",
        path: "/",
        headers: &[(API_KEY_HEADER, "")],
        before: 0,
        cost: 1,
        expect: Expected {
            ratelimit_policy: POLICY_4,
            ratelimit: Some("\"per_client\";r=3;t=15"),
            ..NONE
        },
    },
    Case {
        name: "override tier",
        policy: POLICY,
        peer: Some("198.51.100.9"),
        method: "GET",
        path: "/",
        headers: &[],
        before: 0,
        cost: 1,
        expect: Expected {
            ratelimit_policy: Some("\"per_client\";q=10;w=60"),
            ratelimit: Some("\"per_client\";r=9;t=6"),
            ..NONE
        },
    },
];
