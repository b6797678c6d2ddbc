//! Requests the server cannot read, sent as raw bytes: gRPC messages that do not decode answer
//! INVALID_ARGUMENT and oversized ones RESOURCE_EXHAUSTED (tonic's own INTERNAL / OUT_OF_RANGE
//! rewritten), `POST /v1/check` answers 415 without a JSON content type and 413 over its size
//! limit; each is counted in `tollgate_server_errors_total`, and the connection keeps serving.

mod common;

use bytes::{BufMut, Bytes, BytesMut};
use common::{Server, temp_dir};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use prost::Message;
use tollgate_server::grpc::MAX_REQUEST_BYTES;
use tollgate_server::http_api::MAX_BODY_BYTES;

const CONFIG: &str = r#"
[[domains]]
name = "edge"
[domains.policy]
[[domains.policy.rules]]
name = "per_user"
match = { user = "any" }
key = ["user"]
limit = 5
period = "1h"
capacity = 1000
"#;

const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// A gRPC message frame: uncompressed, `len` in the prefix (normally `payload.len()`).
fn frame(payload: &[u8], len: u32) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + payload.len());
    b.put_u8(0);
    b.put_u32(len);
    b.put_slice(payload);
    b.freeze()
}

/// One unary call of `body`'s bytes on an open HTTP/2 connection: `(grpc-status, grpc-message,
/// the response message if any)`, the status from the headers (trailers-only) or the trailers.
async fn call(
    send: &mut h2::client::SendRequest<Bytes>,
    grpc: std::net::SocketAddr,
    body: Bytes,
) -> (i32, String, Option<RateLimitResponse>) {
    let request = http::Request::builder()
        .method(http::Method::POST)
        .uri(format!("http://{grpc}{PATH}"))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(())
        .unwrap();
    std::future::poll_fn(|cx| send.poll_ready(cx))
        .await
        .expect("ready");
    let (response, mut stream) = send.send_request(request, false).expect("send");
    stream.send_data(body, true).expect("send body");
    let (head, mut recv) = response.await.expect("response").into_parts();
    assert!(head.status.is_success(), "{:?}", head.status);
    let mut message = BytesMut::new();
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.expect("body");
        let _ = recv.flow_control().release_capacity(chunk.len());
        message.extend_from_slice(&chunk);
    }
    let trailers = recv.trailers().await.expect("trailers");
    let status = trailers
        .as_ref()
        .filter(|t| t.contains_key("grpc-status"))
        .unwrap_or(&head.headers);
    let code = status
        .get("grpc-status")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .expect("a grpc-status");
    let text = status
        .get("grpc-message")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let decoded = (message.len() > 5)
        .then(|| RateLimitResponse::decode(&message[5..]).expect("a response message"));
    (code, text, decoded)
}

/// `tollgate_server_errors_total{api, reason}` from `/metrics` (0 when not yet counted).
fn errors(server: &Server, api: &str, reason: &str) -> u64 {
    let (status, _, metrics) = server.http("GET", "/metrics", "");
    assert_eq!(status, 200);
    metrics
        .lines()
        .filter(|l| l.starts_with("tollgate_server_errors_total{"))
        .filter(|l| l.contains(&format!("api=\"{api}\"")))
        .filter(|l| l.contains(&format!("reason=\"{reason}\"")))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_and_oversized_grpc_requests() {
    let dir = temp_dir("bad-grpc");
    let server = Server::start(&dir, CONFIG);
    let tcp = tokio::net::TcpStream::connect(server.grpc)
        .await
        .expect("connect");
    let (mut send, connection) = h2::client::handshake(tcp).await.expect("handshake");
    let connection = tokio::spawn(connection);

    let good = envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![common::descriptor(&[("user", "u")])],
        hits_addend: 1,
    }
    .encode_to_vec();
    let (code, _, response) = call(&mut send, server.grpc, frame(&good, good.len() as u32)).await;
    assert_eq!(code, 0);
    assert_eq!(response.expect("decided").overall_code, Code::Ok as i32);

    // Field 1 (domain, a string) holding bytes that are not UTF-8.
    let bad_utf8 = [0x0a, 0x02, 0xff, 0xfe];
    // A length-delimited field whose length runs past the end, then a reserved wire type.
    let garbage = [0x12, 0x7f, 0x01, 0x0f, 0xff, 0xff];
    for (i, payload) in [&bad_utf8[..], &garbage[..]].into_iter().enumerate() {
        let (code, text, _) =
            call(&mut send, server.grpc, frame(payload, payload.len() as u32)).await;
        assert_eq!(
            code,
            tonic::Code::InvalidArgument as i32,
            "{payload:x?}: {text}"
        );
        assert_eq!(errors(&server, "grpc", "malformed"), i as u64 + 1);
    }
    // A frame that promises more than it carries (the stream ends first): also the caller's error.
    let (code, text, _) = call(&mut send, server.grpc, frame(&good, good.len() as u32 + 10)).await;
    assert_eq!(code, tonic::Code::InvalidArgument as i32, "{text}");
    assert_eq!(errors(&server, "grpc", "malformed"), 3);

    // One byte over the limit: refused from the frame's length prefix, before the body is read.
    let over = u32::try_from(MAX_REQUEST_BYTES + 1).unwrap();
    let (code, text, _) = call(&mut send, server.grpc, frame(&good, over)).await;
    assert_eq!(code, tonic::Code::ResourceExhausted as i32, "{text}");
    assert_eq!(errors(&server, "grpc", "too_large"), 1);
    // The whole oversized message sent, too.
    let big = vec![0u8; MAX_REQUEST_BYTES + 1];
    let (code, text, _) = call(&mut send, server.grpc, frame(&big, big.len() as u32)).await;
    assert_eq!(code, tonic::Code::ResourceExhausted as i32, "{text}");
    assert_eq!(errors(&server, "grpc", "too_large"), 2);

    // The method's own errors are unchanged, and the connection still serves.
    let unknown = envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
        domain: "nope".into(),
        descriptors: vec![common::descriptor(&[("user", "u")])],
        hits_addend: 1,
    }
    .encode_to_vec();
    let (code, _, _) = call(
        &mut send,
        server.grpc,
        frame(&unknown, unknown.len() as u32),
    )
    .await;
    assert_eq!(code, tonic::Code::NotFound as i32);
    let no_descriptors = [0x0a, 0x04, b'e', b'd', b'g', b'e'];
    let (code, _, _) = call(
        &mut send,
        server.grpc,
        frame(&no_descriptors, no_descriptors.len() as u32),
    )
    .await;
    assert_eq!(code, tonic::Code::InvalidArgument as i32);
    let (code, _, response) = call(&mut send, server.grpc, frame(&good, good.len() as u32)).await;
    assert_eq!(code, 0);
    let response = response.expect("decided");
    assert_eq!(response.overall_code, Code::Ok as i32);
    assert_eq!(
        response.statuses[0].limit_remaining, 3,
        "only the two good calls spent units"
    );
    drop(send);
    connection.abort();
}

#[test]
fn check_without_json_or_over_its_limit() {
    let dir = temp_dir("bad-http");
    let server = Server::start(&dir, CONFIG);
    let body = r#"{"domain":"edge","descriptors":[{"entries":{"user":"u"}}]}"#;
    let request = |content_type: Option<&str>, body: &[u8]| {
        let mut r = format!(
            "POST /v1/check HTTP/1.1\r\nhost: test\r\nconnection: close\r\ncontent-length: {}\r\n",
            body.len()
        );
        if let Some(t) = content_type {
            r.push_str(&format!("content-type: {t}\r\n"));
        }
        r.push_str("\r\n");
        let mut r = r.into_bytes();
        r.extend_from_slice(body);
        r
    };
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let (status, _, text) = server.http_raw(request(content_type, body.as_bytes()));
        assert_eq!(status, 415, "{content_type:?}: {text}");
    }
    assert_eq!(errors(&server, "http", "unsupported_media_type"), 3);

    // One byte over the limit (valid JSON, padded with spaces).
    let mut big = body.as_bytes().to_vec();
    big.resize(MAX_BODY_BYTES + 1, b' ');
    let (status, _, text) = server.http_raw(request(Some("application/json"), &big));
    assert_eq!(status, 413, "{text}");
    assert_eq!(errors(&server, "http", "too_large"), 1);
    // At the limit: decided.
    big.truncate(MAX_BODY_BYTES);
    let (status, _, text) = server.http_raw(request(Some("application/json"), &big));
    assert_eq!(status, 200, "{text}");

    // Malformed JSON and a wrong field stay 400.
    for bad in [
        "{not json",
        r#"{"domain":"edge","descriptors":[],"extra":1}"#,
    ] {
        let (status, _, text) = server.http_raw(request(Some("application/json"), bad.as_bytes()));
        assert_eq!(status, 400, "{bad}: {text}");
    }
    assert_eq!(errors(&server, "http", "malformed"), 2);
}
