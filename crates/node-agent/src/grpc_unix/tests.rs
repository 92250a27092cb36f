use std::time::Duration;

use loona_hpack::Decoder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;

use super::authority::{LOCAL_AUTHORITY, MAX_BLOCK, PREFACE, RewriteError, Rewriter};
use super::incoming;

/// What a grpc-go 1.79 client writes when it dials `/var/lib/kubelet/device-plugins/kubelet.sock` with a dialer
/// of its own, as the kubelet's device plugin stub does, and calls `grpc.health.v1.Health/Check` twice (the
/// server it met answered nothing, so each call ends with `RST_STREAM CANCEL`): the preface, `SETTINGS`, a
/// `SETTINGS` ack, then per call `HEADERS` (the first with Huffman-coded literals indexed into the dynamic
/// table, the second naming them by index), `DATA` and `RST_STREAM`.
const GO_CLIENT: &str = concat!(
    "505249202a20485454502f322e300d0a0d0a534d0d0a0d0a000000040000000000000000040100000000000079010400",
    "00000183864595626b2b22f394742675fb857c651d099d8bd3949d7f41a754587b8ec545868346a8b0f5b632d054aa2c",
    "3217b98855aba2d98d5215161eb6c65a0a95d072755f8b1d75d0620d263d4c4d65647a8b9acac8b4c7602bbafaecff40",
    "027465864d833505b11f40899acac8b24d494f6a7f867df7de0bb6ff0000050001000000010000000000000004030000",
    "0000010000000800000f0104000000038386c3c2c1c0bf7e867df7de7836ff0000050001000000030000000000000004",
    "03000000000300000008",
);

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

/// The frames after the preface.
fn frames(bytes: &[u8]) -> Vec<Frame> {
    let mut rest = bytes.strip_prefix(PREFACE).expect("the preface");
    let mut out = Vec::new();
    while !rest.is_empty() {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        out.push(Frame {
            kind: rest[3],
            flags: rest[4],
            stream: u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) & 0x7fff_ffff,
            payload: rest[9..9 + len].to_vec(),
        });
        rest = &rest[9 + len..];
    }
    out
}

fn preface_and(frames: &[Frame]) -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    for f in frames {
        let len = u32::try_from(f.payload.len()).expect("small").to_be_bytes();
        out.extend_from_slice(&len[1..]);
        out.extend_from_slice(&[f.kind, f.flags]);
        out.extend_from_slice(&f.stream.to_be_bytes());
        out.extend_from_slice(&f.payload);
    }
    out
}

type Fields = Vec<(String, String)>;

fn decode(decoder: &mut Decoder<'static>, block: &[u8]) -> Fields {
    let mut fields = Vec::new();
    decoder
        .decode_with_cb(block, |n, v| {
            fields.push((
                String::from_utf8_lossy(&n).into_owned(),
                String::from_utf8_lossy(&v).into_owned(),
            ));
        })
        .expect("a valid header block");
    fields
}

fn field<'a>(fields: &'a Fields, name: &str) -> Option<&'a str> {
    fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

/// The bytes `input` becomes, fed in pieces of `piece` bytes.
fn rewrite(input: &[u8], piece: usize) -> Result<Vec<u8>, RewriteError> {
    let mut rewriter = Rewriter::default();
    let mut out = Vec::new();
    for chunk in input.chunks(piece) {
        rewriter.push(chunk, &mut out)?;
    }
    Ok(out)
}

/// A header block of literal fields (no Huffman, no indexing).
fn literal_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (n, v) in fields {
        out.push(0);
        for s in [n, v] {
            assert!(s.len() < 127);
            out.push(u8::try_from(s.len()).expect("short"));
            out.extend_from_slice(s.as_bytes());
        }
    }
    out
}

#[test]
fn the_go_clients_socket_path_authority_becomes_localhost_in_every_request() {
    let input = hex(GO_CLIENT);
    let original = frames(&input);
    // what the client sent: the socket path, percent-encoded
    let mut client_table = Decoder::new();
    let sent: Vec<Fields> = original
        .iter()
        .filter(|f| f.kind == 1)
        .map(|f| decode(&mut client_table, &f.payload))
        .collect();
    assert_eq!(sent.len(), 2);
    for fields in &sent {
        assert_eq!(
            field(fields, ":authority"),
            Some("%2Fvar%2Flib%2Fkubelet%2Fdevice-plugins%2Fkubelet.sock")
        );
    }
    assert!(!super::authority::is_valid_authority(
        b"%2Fvar%2Flib%2Fkubelet%2Fdevice-plugins%2Fkubelet.sock"
    ));

    // the same whatever pieces the socket delivers it in
    for piece in [1, 2, 7, 64, input.len()] {
        let out = rewrite(&input, piece).expect("rewritten");
        let rewritten = frames(&out);
        assert_eq!(
            rewritten.len(),
            original.len(),
            "one frame for each, in pieces of {piece}"
        );
        // a fresh table: the blocks sent on never index into it
        let mut server_table = Decoder::new();
        for (before, after) in original.iter().zip(&rewritten) {
            if before.kind != 1 {
                assert_eq!(before, after, "frames other than HEADERS pass unchanged");
                continue;
            }
            assert_eq!((after.flags, after.stream), (before.flags, before.stream));
            let fields = decode(&mut server_table, &after.payload);
            let mut expected = decode(&mut Decoder::new(), &as_literals(&input, before));
            for (n, v) in &mut expected {
                if n == ":authority" {
                    *v = String::from_utf8_lossy(LOCAL_AUTHORITY).into_owned();
                }
            }
            assert_eq!(fields, expected);
            assert_eq!(field(&fields, ":path"), Some("/grpc.health.v1.Health/Check"));
        }
    }
}

/// `frame`'s fields as the client's table decodes them at that point of `input` (the blocks before it decoded
/// first), re-encoded as literals so that a fresh table reads them.
fn as_literals(input: &[u8], frame: &Frame) -> Vec<u8> {
    let mut table = Decoder::new();
    for f in frames(input).iter().filter(|f| f.kind == 1) {
        let fields = decode(&mut table, &f.payload);
        if f == frame {
            let pairs: Vec<(&str, &str)> = fields.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
            return literal_block(&pairs);
        }
    }
    panic!("the frame is not in the input");
}

#[test]
fn a_valid_authority_is_kept() {
    let block = literal_block(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/v1beta1.Registration/Register"),
        (":authority", "localhost:1234"),
        ("content-type", "application/grpc"),
    ]);
    let input = preface_and(&[Frame {
        kind: 1,
        flags: 0x4,
        stream: 1,
        payload: block.clone(),
    }]);
    let out = frames(&rewrite(&input, 3).expect("rewritten"));
    assert_eq!(out[0].payload, block);
}

#[test]
fn padding_is_dropped_priority_kept_and_continuations_joined() {
    let block = literal_block(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/v1.PodResourcesLister/List"),
        (":authority", "/var/lib/kubelet/pod-resources/kubelet.sock"),
        ("te", "trailers"),
    ]);
    let (head, tail) = block.split_at(10);
    // PADDED | PRIORITY | END_STREAM, no END_HEADERS
    let mut first = vec![3];
    first.extend_from_slice(&[0x80, 0, 0, 0, 15]);
    first.extend_from_slice(head);
    first.extend_from_slice(&[0, 0, 0]);
    let input = preface_and(&[
        Frame {
            kind: 1,
            flags: 0x8 | 0x20 | 0x1,
            stream: 5,
            payload: first,
        },
        Frame {
            kind: 9,
            flags: 0x4,
            stream: 5,
            payload: tail.to_vec(),
        },
    ]);
    let out = frames(&rewrite(&input, 5).expect("rewritten"));
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        (out[0].kind, out[0].flags, out[0].stream),
        (1, 0x20 | 0x4 | 0x1, 5)
    );
    assert_eq!(out[0].payload[..5], [0x80, 0, 0, 0, 15]);
    let fields = decode(&mut Decoder::new(), &out[0].payload[5..]);
    assert_eq!(field(&fields, ":authority"), Some("localhost"));
    assert_eq!(field(&fields, ":path"), Some("/v1.PodResourcesLister/List"));
    assert_eq!(fields.len(), 5);
}

#[test]
fn a_block_larger_than_the_smallest_frame_is_sent_in_frames_of_that_size() {
    let big = "x".repeat(100);
    let names: Vec<String> = (0..300).map(|i| format!("x-field-{i}")).collect();
    let mut fields: Vec<(&str, &str)> = vec![(":method", "POST"), (":authority", "/run/a.sock")];
    fields.extend(names.iter().map(|n| (n.as_str(), big.as_str())));
    let input = preface_and(&[Frame {
        kind: 1,
        flags: 0x4,
        stream: 1,
        payload: literal_block(&fields),
    }]);
    let out = frames(&rewrite(&input, 4096).expect("rewritten"));
    assert!(out.len() >= 3, "{} frames", out.len());
    assert!(out.iter().all(|f| f.payload.len() <= 16_384));
    assert_eq!(out[0].kind, 1);
    assert!(out[1..].iter().all(|f| f.kind == 9));
    let ends: Vec<bool> = out.iter().map(|f| f.flags & 0x4 != 0).collect();
    assert_eq!(ends.iter().filter(|e| **e).count(), 1);
    assert!(ends[ends.len() - 1]);
    let joined: Vec<u8> = out.iter().flat_map(|f| f.payload.clone()).collect();
    let decoded = decode(&mut Decoder::new(), &joined);
    assert_eq!(decoded.len(), 302);
    assert_eq!(field(&decoded, ":authority"), Some("localhost"));
}

#[test]
fn what_is_not_http2_passes_untouched() {
    for input in [
        &b"GET /healthz HTTP/1.1\r\nHost: /run/x.sock\r\n\r\n"[..],
        b"PRI * HTTP/1.1\r\n\r\nSM\r\n\r\n\x00\x00\x00\x01\x04",
    ] {
        for piece in [1, 3, input.len()] {
            assert_eq!(rewrite(input, piece).expect("passed"), input);
        }
    }
}

#[test]
fn a_broken_header_sequence_ends_the_connection() {
    let block = literal_block(&[(":method", "POST")]);
    // a DATA frame in the middle of a header block
    let interrupted = preface_and(&[
        Frame {
            kind: 1,
            flags: 0,
            stream: 1,
            payload: block.clone(),
        },
        Frame {
            kind: 0,
            flags: 0,
            stream: 1,
            payload: vec![0; 5],
        },
    ]);
    assert!(matches!(
        rewrite(&interrupted, 100),
        Err(RewriteError::Malformed(_))
    ));
    // a block past the limit, refused before all of it arrives
    let mut huge = preface_and(&[]);
    let len = u32::try_from(MAX_BLOCK + 1).expect("small").to_be_bytes();
    huge.extend_from_slice(&len[1..]);
    huge.extend_from_slice(&[1, 0x4, 0, 0, 0, 1]);
    assert!(matches!(rewrite(&huge, 100), Err(RewriteError::TooLarge)));
    // bytes that are not HPACK
    let garbage = preface_and(&[Frame {
        kind: 1,
        flags: 0x4,
        stream: 1,
        payload: vec![0xff; 8],
    }]);
    assert!(matches!(rewrite(&garbage, 100), Err(RewriteError::Hpack(_))));
}

/// What a raw client reads back for each stream, until streams 1 and 3 have ended.
#[derive(Debug, Default)]
struct Answers {
    /// The header blocks each stream was answered with, decoded.
    headers: Vec<(u32, Fields)>,
    /// `RST_STREAM` error codes per stream.
    resets: Vec<(u32, u32)>,
}

/// Serves the gRPC health service on a fresh socket, through [`incoming`] when `tolerant`, plainly otherwise,
/// and sends it the Go client's two calls.
async fn go_client_against_health(tolerant: bool) -> Answers {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("health.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    let (_reporter, health) = tonic_health::server::health_reporter();
    let token = CancellationToken::new();
    let server = tonic::transport::Server::builder().add_service(health);
    let serving = if tolerant {
        tokio::spawn(server.serve_with_incoming_shutdown(incoming(listener), token.clone().cancelled_owned()))
    } else {
        tokio::spawn(
            server.serve_with_incoming_shutdown(
                UnixListenerStream::new(listener),
                token.clone().cancelled_owned(),
            ),
        )
    };
    let sent = frames(&hex(GO_CLIENT));
    // the calls without the cancellations the Go client sent only because nothing answered it
    let calls: Vec<Frame> = sent
        .into_iter()
        .filter(|f| f.kind != 3 && !(f.kind == 4 && f.flags == 1))
        .collect();
    let mut conn = UnixStream::connect(&path).await.expect("connect");
    conn.write_all(&preface_and(&calls)).await.expect("write");

    let mut answers = Answers::default();
    let mut table = Decoder::new();
    let mut buf = Vec::new();
    let mut ended = std::collections::BTreeSet::new();
    let read = async {
        while ended.len() < 2 {
            let mut chunk = [0u8; 4096];
            let n = conn.read(&mut chunk).await.expect("read");
            assert!(n > 0, "the server closed the connection: {answers:?}");
            buf.extend_from_slice(&chunk[..n]);
            while buf.len() >= 9 {
                let len = usize::from(buf[0]) << 16 | usize::from(buf[1]) << 8 | usize::from(buf[2]);
                if buf.len() < 9 + len {
                    break;
                }
                let frame: Vec<u8> = buf.drain(..9 + len).collect();
                let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
                match frame[3] {
                    1 => {
                        answers.headers.push((stream, decode(&mut table, &frame[9..])));
                        if frame[4] & 0x1 != 0 {
                            ended.insert(stream);
                        }
                    }
                    3 => {
                        answers.resets.push((
                            stream,
                            u32::from_be_bytes([frame[9], frame[10], frame[11], frame[12]]),
                        ));
                        ended.insert(stream);
                    }
                    0 if frame[4] & 0x1 != 0 => {
                        ended.insert(stream);
                    }
                    _ => {}
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("both calls answered within 20 s");
    // the server's graceful stop waits for its connections
    drop(conn);
    token.cancel();
    tokio::time::timeout(Duration::from_secs(20), serving)
        .await
        .expect("the server stopped")
        .expect("the server task")
        .expect("served");
    answers
}

#[tokio::test]
async fn a_go_client_naming_the_socket_path_is_answered() {
    let answers = go_client_against_health(true).await;
    assert!(answers.resets.is_empty(), "{answers:?}");
    for stream in [1, 3] {
        let blocks: Vec<&Fields> = answers
            .headers
            .iter()
            .filter(|(s, _)| *s == stream)
            .map(|(_, f)| f)
            .collect();
        assert_eq!(field(blocks[0], ":status"), Some("200"), "{answers:?}");
        assert_eq!(
            blocks.iter().find_map(|f| field(f, "grpc-status")),
            Some("0"),
            "stream {stream}: {answers:?}"
        );
    }
}

/// Why the rewrite exists: served plainly, the HTTP/2 server resets the Go client's calls with
/// `PROTOCOL_ERROR` (1). Should the server come to accept them, this fails and the rewrite can go.
#[tokio::test]
async fn served_plainly_the_go_clients_calls_are_refused() {
    let answers = go_client_against_health(false).await;
    assert_eq!(answers.resets, [(1, 1), (3, 1)], "{answers:?}");
}
