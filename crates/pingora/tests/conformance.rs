//! The conformance table (`tollgate_http::conformance`) through `PingoraLimiter`: its decision and
//! the response head it writes (the 429 / 413 of `request_filter`, the fields `response_filter`
//! adds to the upstream's response), on a manual clock.

use std::sync::Arc;

use http::HeaderName;
use pingora_http::ResponseHeader;
use tollgate_core::ManualClock;
use tollgate_http::conformance::{API_KEY_HEADER, CASES, Case, Observed};
use tollgate_http::{ClientIp, RequestFacts};
use tollgate_pingora::{LimitCtx, PingoraLimiter};
use tollgate_policy::{Policy, PolicyConfig};

fn run(case: &Case) -> Observed {
    let config = PolicyConfig::from_toml(case.policy).expect("policy");
    let policy = Arc::new(Policy::with_clock(config, ManualClock::new()).expect("policy"));
    let limiter = PingoraLimiter::new(policy, ClientIp::trusting([]))
        .descriptor_header(HeaderName::from_static(API_KEY_HEADER), "api_key")
        .expect("header");
    let headers = case.header_map();
    let facts = RequestFacts {
        peer: case.peer_ip(),
        method: case.method,
        path: case.path,
        headers: &headers,
    };
    for _ in 0..case.before {
        assert!(
            limiter.decide_cost(&facts, 1).allowed,
            "case `{}`: a request before",
            case.name
        );
    }
    let verdict = limiter.decide_cost(&facts, case.cost);
    // `request_filter` sleeps for it before the request goes on.
    let delayed = !verdict.delay.is_zero();
    let shadow_denied = Some(verdict.shadow_denied());
    let head = if verdict.allowed {
        // What `request_filter` keeps and `response_filter` adds to the upstream's 200.
        let mut head = ResponseHeader::build(200, None).expect("head");
        let mut ctx = LimitCtx::default();
        ctx.admitted(verdict);
        limiter
            .response_filter(&mut head, &mut ctx)
            .expect("fields");
        head
    } else {
        PingoraLimiter::denial_response(&verdict)
            .expect("response")
            .0
    };
    let text = |name: &str| {
        head.headers
            .get(name)
            .map(|v| v.to_str().expect("ascii").to_owned())
    };
    Observed {
        status: head.status.as_u16(),
        ratelimit_policy: text("ratelimit-policy"),
        ratelimit: text("ratelimit"),
        retry_after: text("retry-after"),
        delayed,
        shadow_denied,
    }
}

#[test]
fn every_case_through_pingora() {
    for case in CASES {
        case.expect.assert_matches("pingora", case.name, &run(case));
    }
}
