//! SIGTERM seen by an HTTP/2 client that writes its own frames: what the server does with a stream
//! the client opens after the server's final GOAWAY (a client whose HEADERS crossed the server's
//! shutdown PING, or one that ignores the first GOAWAY). The server should ignore every frame on
//! such a stream (RFC 9113 §6.8) and finish the call in flight on a lower stream.
//!
//! Found here: h2 (0.4.21, the server's HTTP/2 under hyper and tonic) ignores HEADERS, DATA and
//! RST_STREAM on such a stream but answers a WINDOW_UPDATE on it with GOAWAY PROTOCOL_ERROR and
//! closes the connection, losing the call in flight. That is the PROTOCOL_ERROR a client saw on
//! SIGTERM; the fix is in h2 (`recv_window_update` lacks the `id > max_stream_id` ignore its
//! siblings have), so that case is an ignored test until the dependency has it.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use common::{Server, descriptor, request, temp_dir};
use prost::Message;

const CONFIG: &str = r#"
[[domains]]
name = "edge"
[domains.policy]
descriptor_match = "subset"
[[domains.policy.rules]]
name = "all"
limit = 5
period = "1h"
"#;

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const WINDOW_UPDATE: u8 = 8;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// One frame read from the server.
#[derive(Debug)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

fn encode(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut f = Vec::with_capacity(9 + payload.len());
    f.extend_from_slice(&len[1..]);
    f.push(kind);
    f.push(flags);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A ShouldRateLimit request's header block: HPACK static-table indices and literals without
/// indexing (no Huffman), so no encoder is needed.
fn header_block(authority: &str) -> Vec<u8> {
    let path = b"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
    let mut h = vec![0x83, 0x86]; // :method POST, :scheme http
    let mut literal = |name_index: &[u8], value: &[u8]| {
        h.extend_from_slice(name_index);
        h.push(u8::try_from(value.len()).unwrap());
        h.extend_from_slice(value);
    };
    literal(&[0x04], path); // :path
    literal(&[0x01], authority.as_bytes()); // :authority
    literal(&[0x0f, 0x10], b"application/grpc"); // content-type (static index 31)
    literal(&[0x00, 0x02, b't', b'e'], b"trailers");
    h
}

/// A raw HTTP/2 connection: frames written by hand; a reader thread hands over every frame the
/// server sends, acknowledging its SETTINGS and PINGs as any client would. Writes go through one
/// lock, so the acknowledgements never interleave with the test's frames.
struct Raw {
    socket: Arc<Mutex<TcpStream>>,
    frames: mpsc::Receiver<Frame>,
}

impl Raw {
    fn connect(server: &Server) -> Raw {
        let mut socket = TcpStream::connect(server.grpc).expect("connect");
        // The preface first: the server sends its SETTINGS at once, and their ACK must follow it.
        socket
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .expect("preface");
        socket
            .write_all(&encode(SETTINGS, 0, 0, &[]))
            .expect("settings");
        let mut reader = socket.try_clone().expect("clone");
        let socket = Arc::new(Mutex::new(socket));
        let acker = Arc::clone(&socket);
        let (tx, frames) = mpsc::channel();
        std::thread::spawn(move || {
            loop {
                let mut head = [0u8; 9];
                if reader.read_exact(&mut head).is_err() {
                    return;
                }
                let len =
                    usize::try_from(u32::from_be_bytes([0, head[0], head[1], head[2]])).unwrap();
                let mut payload = vec![0u8; len];
                if reader.read_exact(&mut payload).is_err() {
                    return;
                }
                let (kind, flags) = (head[3], head[4]);
                let ack = match kind {
                    SETTINGS if flags & ACK == 0 => Some(encode(SETTINGS, ACK, 0, &[])),
                    PING if flags & ACK == 0 => Some(encode(PING, ACK, 0, &payload)),
                    _ => None,
                };
                if let Some(ack) = ack {
                    let _ = acker.lock().expect("socket").write_all(&ack);
                }
                let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
                if tx
                    .send(Frame {
                        kind,
                        flags,
                        stream,
                        payload,
                    })
                    .is_err()
                {
                    return;
                }
            }
        });
        Raw { socket, frames }
    }

    fn send(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        self.socket
            .lock()
            .expect("socket")
            .write_all(&encode(kind, flags, stream, payload))
            .expect("write");
    }

    /// The next frame for which `want` holds (bounded wait); every frame on the way is in `seen`.
    fn until(&self, seen: &mut Vec<Frame>, want: impl Fn(&Frame) -> bool) -> Option<usize> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let frame = self.frames.recv_timeout(left).ok()?;
            let hit = want(&frame);
            seen.push(frame);
            if hit {
                return Some(seen.len() - 1);
            }
        }
    }
}

/// The error code of a GOAWAY frame.
fn goaway_code(f: &Frame) -> u32 {
    u32::from_be_bytes([f.payload[4], f.payload[5], f.payload[6], f.payload[7]])
}

/// Stream 1 carries half a call when SIGTERM arrives; after the server's final GOAWAY (last
/// stream 1) the client opens stream 3 and sends `late` on it; then it finishes stream 1, whose
/// answer must come, with no GOAWAY but NO_ERROR.
fn late_frame_on_an_ignored_stream(late: (u8, &[u8])) {
    let dir = temp_dir(&format!("h2-late-{}", late.0));
    let server = Server::start(&dir, CONFIG);
    let mut raw = Raw::connect(&server);
    let authority = server.grpc.to_string();
    let message = request("edge", vec![descriptor(&[("user", "u")])], 1).encode_to_vec();
    let mut frame = vec![0];
    frame.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    frame.extend_from_slice(&message);

    raw.send(HEADERS, END_HEADERS, 1, &header_block(&authority));
    raw.send(DATA, 0, 1, &frame[..3]);
    // Our own PING: once its ACK is back, the server has stream 1 open.
    raw.send(PING, 0, 0, &[7; 8]);
    let mut seen = Vec::new();
    raw.until(&mut seen, |f| f.kind == PING && f.flags & ACK == ACK)
        .expect("ping ack");

    server.signal("TERM");
    // The two-step shutdown: GOAWAY(2^31-1), a PING we acknowledge, GOAWAY(last stream 1).
    let last = raw
        .until(&mut seen, |f| {
            f.kind == GOAWAY && f.payload[..4] == [0, 0, 0, 1]
        })
        .unwrap_or_else(|| panic!("no final GOAWAY: {seen:?}"));
    assert_eq!(goaway_code(&seen[last]), 0, "{seen:?}");

    raw.send(HEADERS, END_HEADERS, 3, &header_block(&authority));
    raw.send(late.0, 0, 3, late.1);
    raw.send(DATA, END_STREAM, 1, &frame[3..]);
    let answered = raw.until(&mut seen, |f| {
        (f.stream == 1 && f.kind == HEADERS && f.flags & END_STREAM == END_STREAM)
            || (f.kind == GOAWAY && goaway_code(f) != 0)
    });
    let answered = answered.unwrap_or_else(|| panic!("no answer on stream 1: {seen:?}"));
    assert_eq!(
        (seen[answered].kind, seen[answered].stream),
        (HEADERS, 1),
        "GOAWAY with error code {} instead of the call's answer: {seen:?}",
        goaway_code(&seen[answered])
    );
    assert!(
        seen.iter()
            .any(|f| f.kind == DATA && f.stream == 1 && f.payload.len() > 5),
        "the call's answer message: {seen:?}"
    );
    assert!(
        !seen.iter().any(|f| f.stream == 3),
        "stream 3 is ignored: {seen:?}"
    );
}

#[test]
fn rst_stream_on_a_stream_opened_after_the_final_goaway_is_ignored() {
    late_frame_on_an_ignored_stream((RST_STREAM, &8u32.to_be_bytes()));
}

#[test]
#[ignore = "h2 0.4.21 answers GOAWAY PROTOCOL_ERROR and drops the call in flight (see the module docs)"]
fn window_update_on_a_stream_opened_after_the_final_goaway_is_ignored() {
    late_frame_on_an_ignored_stream((WINDOW_UPDATE, &1000u32.to_be_bytes()));
}
