//! ShouldRateLimit through a tonic client built from the same envoy-types protos.

mod common;

use common::{Server, descriptor, request, temp_dir};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;

const CONFIG: &str = r#"
[[domains]]
name = "edge"

[domains.policy]
[[domains.policy.rules]]
name = "per_user"
match = { user = "any" }
key = ["user"]
limit = 3
period = "60s"
capacity = 1000

[[domains.policy.rules]]
name = "shadow_route"
match = { route = { exact = "/shadow" } }
limit = 1
period = "60s"
mode = "shadow"

[[domains]]
name = "other"
[domains.policy]
# A rule with an empty match applies to every descriptor only with subset matching (the server's
# default, exact, would apply it to none).
descriptor_match = "subset"
[[domains.policy.rules]]
name = "all"
limit = 1000
period = "1s"
"#;

fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_rate_limit_statuses_headers_and_errors() {
    let dir = temp_dir("grpc");
    let server = Server::start(&dir, CONFIG);
    let mut client = server.client().await;

    // OK: statuses, the quota in Envoy's terms, and the fields from tollgate-http.
    let r = client
        .should_rate_limit(request("edge", vec![descriptor(&[("user", "a")])], 0))
        .await
        .expect("ok call")
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses.len(), 1);
    let s = &r.statuses[0];
    assert_eq!(s.code, Code::Ok as i32);
    let limit = s.current_limit.as_ref().expect("current_limit");
    assert_eq!(limit.name, "per_user");
    assert_eq!(limit.requests_per_unit, 3);
    assert_eq!(limit.unit, Unit::Minute as i32);
    assert_eq!(s.limit_remaining, 2);
    let reset = s.duration_until_reset.as_ref().expect("reset");
    assert!(reset.seconds > 0 && reset.seconds <= 60, "{reset:?}");
    assert_eq!(
        header(&r, "ratelimit-policy"),
        Some(r#""per_user";q=3;w=60"#)
    );
    assert_eq!(header(&r, "ratelimit"), Some(r#""per_user";r=2;t=20"#));
    assert_eq!(header(&r, "retry-after"), None);

    // hits_addend: the request's (2) spends two units; a descriptor's own wins over it.
    let r = client
        .should_rate_limit(request("edge", vec![descriptor(&[("user", "h")])], 2))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.statuses[0].limit_remaining, 1);
    let mut own = descriptor(&[("user", "h")]);
    own.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 1 });
    let r = client
        .should_rate_limit(request("edge", vec![own], 3))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.overall_code,
        Code::Ok as i32,
        "descriptor hits_addend 1 fits"
    );
    assert_eq!(r.statuses[0].limit_remaining, 0);

    // OVER_LIMIT, with Retry-After and r=0.
    let r = client
        .should_rate_limit(request("edge", vec![descriptor(&[("user", "h")])], 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert_eq!(header(&r, "retry-after"), Some("20"));
    assert_eq!(header(&r, "ratelimit"), Some(r#""per_user";r=0;t=20"#));

    // Shadow: the rule would deny the second call, but answers OK.
    for _ in 0..3 {
        let r = client
            .should_rate_limit(request(
                "edge",
                vec![descriptor(&[("route", "/shadow")])],
                1,
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert_eq!(r.statuses[0].code, Code::Ok as i32);
    }

    // Several descriptors in one call: one per status, in order; the over-limit one decides the
    // overall code and the headers. A descriptor no rule applies to is OK with no limit.
    let r = client
        .should_rate_limit(request(
            "edge",
            vec![
                descriptor(&[("user", "b")]),
                descriptor(&[("user", "h")]),
                descriptor(&[("nobody", "x")]),
            ],
            1,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    let codes: Vec<i32> = r.statuses.iter().map(|s| s.code).collect();
    assert_eq!(
        codes,
        [Code::Ok as i32, Code::OverLimit as i32, Code::Ok as i32]
    );
    assert_eq!(r.statuses[0].limit_remaining, 2);
    assert!(r.statuses[2].current_limit.is_none());
    assert!(header(&r, "retry-after").is_some());

    // A cost the rule can never admit: OVER_LIMIT (fails closed), and nothing consumed.
    let r = client
        .should_rate_limit(request("edge", vec![descriptor(&[("user", "c")])], 100))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    let r = client
        .should_rate_limit(request("edge", vec![descriptor(&[("user", "c")])], 3))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.overall_code,
        Code::Ok as i32,
        "the too-large cost consumed nothing"
    );

    // Unknown domain: NOT_FOUND.
    let err = client
        .should_rate_limit(request("nope", vec![descriptor(&[("user", "a")])], 1))
        .await
        .expect_err("unknown domain");
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert!(err.message().contains("nope"), "{}", err.message());

    // Malformed: INVALID_ARGUMENT with the reason.
    for (req, why) in [
        (request("edge", vec![], 1), "no descriptors"),
        (
            request("", vec![descriptor(&[("user", "a")])], 1),
            "domain is empty",
        ),
        (request("edge", vec![descriptor(&[])], 1), "no entries"),
        (
            request("edge", vec![descriptor(&[("", "a")])], 1),
            "empty key",
        ),
        (
            request(
                "edge",
                (0..65).map(|_| descriptor(&[("user", "a")])).collect(),
                1,
            ),
            "at most 64",
        ),
    ] {
        let err = client.should_rate_limit(req).await.expect_err(why);
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{why}");
        assert!(err.message().contains(why), "{why}: {}", err.message());
    }

    // Garbage bytes on the wire: the caller's error (tests/bad_requests.rs has the rest), the server
    // goes on.
    let raw = tonic::client::Grpc::new(
        tonic::transport::Channel::from_shared(format!("http://{}", server.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let mut raw = raw;
    raw.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    );
    let garbage: Result<tonic::Response<RateLimitResponse>, tonic::Status> = raw
        .unary(
            tonic::Request::new(vec![0xffu8, 0xff, 0xff, 0x01]),
            path,
            BytesCodec,
        )
        .await;
    let err = garbage.expect_err("undecodable request");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");

    // Still serving, and the other domain is separate.
    let r = client
        .should_rate_limit(request("other", vec![descriptor(&[("user", "h")])], 1))
        .await
        .expect("still serving")
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().name, "all");
}

/// Sends raw bytes as the request message and decodes the reply as a `RateLimitResponse`.
#[derive(Clone, Copy)]
struct BytesCodec;

impl tonic::codec::Codec for BytesCodec {
    type Encode = Vec<u8>;
    type Decode = RateLimitResponse;
    type Encoder = RawEncoder;
    type Decoder =
        <tonic::codec::ProstCodec<(), RateLimitResponse> as tonic::codec::Codec>::Decoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> Self::Decoder {
        tonic::codec::Codec::decoder(
            &mut tonic::codec::ProstCodec::<(), RateLimitResponse>::default(),
        )
    }
}

struct RawEncoder;

impl tonic::codec::Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}
