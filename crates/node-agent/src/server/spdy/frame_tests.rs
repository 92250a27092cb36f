//! Tests of the SPDY frame codec: round trips, the dictionary, bad input.

use super::*;

fn round_trip(frames: &[Frame]) {
    let (mut d, mut i) = (Deflater::new(), Inflater::new());
    for f in frames {
        let bytes = encode(f, &mut d).unwrap();
        let head = FrameHead::parse(bytes[..8].try_into().unwrap());
        assert_eq!(head.length, bytes.len() - 8, "{f:?}");
        assert_eq!(decode(head, &bytes[8..], &mut i).unwrap(), *f);
    }
}

fn h(pairs: &[(&str, &str)]) -> Headers {
    pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
}

#[test]
fn every_frame_round_trips_through_one_zlib_stream() {
    round_trip(&[
        Frame::SynStream {
            stream_id: 1,
            associated_id: 0,
            priority: 0,
            flags: 0,
            headers: h(&[("streamtype", "error")]),
        },
        Frame::SynStream {
            stream_id: 3,
            associated_id: 0,
            priority: 7,
            flags: FLAG_UNIDIRECTIONAL,
            headers: h(&[("streamtype", "stdout"), ("x", "a\0b")]),
        },
        Frame::SynReply {
            stream_id: 3,
            flags: 0,
            headers: Vec::new(),
        },
        Frame::Headers {
            stream_id: 3,
            flags: FLAG_FIN,
            headers: h(&[("k", "v")]),
        },
        Frame::RstStream {
            stream_id: 5,
            status: 5,
        },
        Frame::Settings {
            flags: 1,
            entries: vec![(0, 7, 65536), (1, 4, 100)],
        },
        Frame::Ping { id: 42 },
        Frame::GoAway {
            last_stream_id: 7,
            status: 0,
        },
        Frame::WindowUpdate {
            stream_id: 1,
            delta: 1024,
        },
        Frame::Data {
            stream_id: 3,
            flags: FLAG_FIN,
            data: b"hi\n".to_vec(),
        },
        Frame::Data {
            stream_id: 1,
            flags: 0,
            data: Vec::new(),
        },
    ]);
}

#[test]
fn a_block_compressed_with_the_dictionary_is_decoded() {
    // a header block as zlib with the SPDY dictionary makes it: the FDICT bit set and the dictionary's
    // Adler-32 in the zlib header, so a decoder without the dictionary could not read it
    let mut c = Compress::new(Compression::best(), true);
    c.set_dictionary(HEADER_DICTIONARY).unwrap();
    let raw = encode_headers(&h(&[("streamtype", "stdout"), ("content-type", "text/plain")]));
    let mut out = Vec::with_capacity(512);
    c.compress_vec(&raw, &mut out, FlushCompress::Sync).unwrap();
    assert_eq!(out[1] & 0x20, 0x20, "FDICT");
    let headers = decode_headers(&Inflater::new().block(&out).unwrap()).unwrap();
    assert_eq!(
        headers,
        h(&[("streamtype", "stdout"), ("content-type", "text/plain")])
    );
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let mut i = Inflater::new();
    let control = |kind: u16, version: u16, payload: &[u8]| {
        let mut b = (0x8000 | version).to_be_bytes().to_vec();
        b.extend_from_slice(&kind.to_be_bytes());
        b.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        (FrameHead::parse(b[..8].try_into().unwrap()), payload.to_vec())
    };
    let (head, p) = control(TYPE_PING, 2, &[0, 0, 0, 1]);
    assert_eq!(decode(head, &p, &mut i), Err(FrameError::Version(2)));
    for (kind, payload) in [
        (TYPE_PING, vec![0, 1]),
        (TYPE_SYN_STREAM, vec![0, 0, 0, 1]),
        (TYPE_SYN_REPLY, vec![0, 0, 0, 1, 9, 9, 9]),
        (TYPE_SETTINGS, vec![0, 0, 0, 9, 1]),
        (TYPE_RST_STREAM, vec![]),
    ] {
        let (head, p) = control(kind, 3, &payload);
        assert!(decode(head, &p, &mut Inflater::new()).is_err(), "type {kind}");
    }
    assert!(decode_headers(&[0, 0, 0, 1, 0, 0, 0, 200, b'a']).is_err());
    assert!(decode_headers(&[0, 0xff, 0xff, 0xff]).is_err());
    let (head, p) = control(77, 3, &[1, 2]);
    assert_eq!(decode(head, &p, &mut i), Ok(Frame::Unknown { kind: 77 }));
}
