//! Generated input for the SPDY/3.1 codec and session: any frame head and payload decodes or is refused with an
//! error naming the frame type (or the version, the header block, the size); generated frames round-trip
//! through one zlib stream per direction; a corrupted or cut header block is refused as a header block; a
//! session fed generated frames followed by any bytes accepts the streams opened before the bytes went bad and
//! then ends, never hangs or panics.

use std::time::Duration;

use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::frame::{self, Deflater, Frame, FrameError, FrameHead, Headers, Inflater};
use super::session::Session;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// The frame type names the codec's refusals use.
const KINDS: &[&str] = &[
    "SYN_STREAM",
    "SYN_REPLY",
    "RST_STREAM",
    "SETTINGS",
    "PING",
    "GOAWAY",
    "HEADERS",
    "WINDOW_UPDATE",
    "header block",
];

/// The refusal says what is wrong: which frame type (or header block) and why, the version, or the size.
fn names_what_is_wrong(e: &FrameError) -> bool {
    let text = e.to_string();
    match e {
        FrameError::Malformed { kind, why } => KINDS.contains(kind) && !why.is_empty() && text.contains(kind),
        FrameError::Version(v) => text.contains(&format!("version {v}")),
        FrameError::Compression(why) => !why.is_empty() && text.starts_with("header block"),
        FrameError::TooLarge(_) => text.contains("16 MiB"),
    }
}

fn headers() -> impl Strategy<Value = Headers> {
    prop::collection::vec(("[a-z][a-z0-9-]{0,15}", "[ -~]{0,40}"), 0..8)
}

fn stream_id() -> impl Strategy<Value = u32> {
    0u32..0x8000_0000
}

fn any_frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (stream_id(), stream_id(), 0u8..8, 0u8..4, headers()).prop_map(
            |(stream_id, associated_id, priority, flags, headers)| Frame::SynStream {
                stream_id,
                associated_id,
                priority,
                flags,
                headers
            }
        ),
        (stream_id(), 0u8..2, headers()).prop_map(|(stream_id, flags, headers)| Frame::SynReply {
            stream_id,
            flags,
            headers
        }),
        (stream_id(), any::<u32>()).prop_map(|(stream_id, status)| Frame::RstStream { stream_id, status }),
        (
            any::<u8>(),
            prop::collection::vec((any::<u8>(), 0u32..0x0100_0000, any::<u32>()), 0..6)
        )
            .prop_map(|(flags, entries)| Frame::Settings { flags, entries }),
        any::<u32>().prop_map(|id| Frame::Ping { id }),
        (stream_id(), any::<u32>()).prop_map(|(last_stream_id, status)| Frame::GoAway {
            last_stream_id,
            status
        }),
        (stream_id(), 0u8..2, headers()).prop_map(|(stream_id, flags, headers)| Frame::Headers {
            stream_id,
            flags,
            headers
        }),
        (stream_id(), stream_id()).prop_map(|(stream_id, delta)| Frame::WindowUpdate { stream_id, delta }),
        (stream_id(), 0u8..2, prop::collection::vec(any::<u8>(), 0..200)).prop_map(
            |(stream_id, flags, data)| Frame::Data {
                stream_id,
                flags,
                data
            }
        ),
    ]
}

/// A frame head: anything, or a SPDY/3 control frame of any type (most of the codec's paths).
fn head() -> impl Strategy<Value = [u8; 8]> {
    prop_oneof![
        any::<[u8; 8]>(),
        (0u16..12, any::<u8>(), any::<[u8; 3]>()).prop_map(|(kind, flags, len)| {
            let k = kind.to_be_bytes();
            [0x80, 0x03, k[0], k[1], flags, len[0], len[1], len[2]]
        }),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_head_and_payload_decode_or_are_refused_naming_what_is_wrong(
        head in head(),
        payload in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        let head = FrameHead::parse(head);
        match frame::decode(head, &payload, &mut Inflater::new()) {
            Ok(_) => {}
            Err(e) => prop_assert!(names_what_is_wrong(&e), "{e:?}: {e}"),
        }
    }

    #[test]
    fn generated_frames_round_trip_through_one_zlib_stream(frames in prop::collection::vec(any_frame(), 1..12)) {
        let (mut d, mut i) = (Deflater::new(), Inflater::new());
        for f in &frames {
            let bytes = frame::encode(f, &mut d).expect("encode");
            let head = FrameHead::parse(bytes[..8].try_into().expect("8 bytes"));
            prop_assert_eq!(head.length, bytes.len() - 8);
            prop_assert_eq!(&frame::decode(head, &bytes[8..], &mut i).expect("decode"), f);
        }
    }

    #[test]
    fn a_corrupted_or_cut_header_block_is_refused_as_a_header_block(
        headers in headers(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 0..4),
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
    ) {
        let bytes = frame::encode(
            &Frame::SynReply { stream_id: 1, flags: 0, headers: headers.clone() },
            &mut Deflater::new(),
        ).expect("encode");
        let mut payload = bytes[8..].to_vec();
        let block = 4..payload.len();
        for (at, x) in &flips {
            let at = block.start + at.index(block.len());
            payload[at] ^= x;
        }
        if do_cut {
            payload.truncate(block.start + cut.index(block.len()));
        }
        let head = FrameHead::parse(bytes[..8].try_into().expect("8 bytes"));
        match frame::decode(head, &payload, &mut Inflater::new()) {
            Ok(Frame::SynReply { headers: got, .. }) => {
                if flips.is_empty() && !do_cut {
                    prop_assert_eq!(got, headers);
                }
            }
            Ok(other) => prop_assert!(false, "a SYN_REPLY decoded as {other:?}"),
            Err(e) => prop_assert!(
                names_what_is_wrong(&e)
                    && matches!(&e, FrameError::Compression(_) | FrameError::Malformed { kind: "header block" | "SYN_REPLY", .. }),
                "{e:?}: {e}"
            ),
        }
    }

    #[test]
    fn header_blocks_of_any_bytes_decode_or_are_refused(b in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Err(e) = frame::decode_headers(&b) {
            prop_assert!(names_what_is_wrong(&e), "{e:?}: {e}");
        }
    }
}

/// Feeds `frames`, then `tail`, to a session and closes the client's side: the streams the session accepted,
/// or `None` if it did not end within 5 s.
async fn feed(frames: &[Frame], tail: &[u8]) -> Option<Vec<u32>> {
    let (server, client) = tokio::io::duplex(1 << 20);
    let mut session = Session::start(server);
    let mut d = Deflater::new();
    let mut bytes = Vec::new();
    for f in frames {
        bytes.extend(frame::encode(f, &mut d).expect("encode"));
    }
    bytes.extend_from_slice(tail);
    let (mut rd, mut wr) = tokio::io::split(client);
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&bytes).await;
        let _ = wr.shutdown().await;
    });
    // whatever the session answers is read and dropped, so it never blocks on a full pipe
    let reader = tokio::spawn(async move {
        let mut sink = Vec::new();
        let _ = rd.read_to_end(&mut sink).await;
    });
    let accepted = tokio::time::timeout(Duration::from_secs(5), async {
        let mut ids = Vec::new();
        while let Some(s) = session.accept().await {
            ids.push(s.id);
        }
        ids
    })
    .await
    .ok();
    drop(session);
    writer.abort();
    reader.abort();
    accepted
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..config() })]

    #[test]
    fn a_session_fed_frames_then_any_bytes_ends_with_the_streams_opened_before(
        frames in prop::collection::vec(any_frame(), 0..8),
        tail in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        // a GOAWAY from the client ends the session there; streams after it are not accepted
        let until = frames.iter().position(|f| matches!(f, Frame::GoAway { .. })).unwrap_or(frames.len());
        let opened: Vec<u32> = frames[..until]
            .iter()
            .filter_map(|f| match f {
                Frame::SynStream { stream_id, .. } => Some(*stream_id),
                _ => None,
            })
            .collect();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let accepted = runtime.block_on(feed(&frames, &tail));
        let accepted = accepted.expect("the session ends once the client is gone");
        prop_assert!(
            accepted.len() >= opened.len() && accepted[..opened.len()] == opened[..],
            "opened {opened:?}, accepted {accepted:?}"
        );
    }
}
