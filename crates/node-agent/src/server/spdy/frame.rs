//! SPDY/3.1 frames: their wire layout, and the header blocks inside SYN_STREAM, SYN_REPLY and HEADERS.
//!
//! Every frame starts with 8 bytes. A control frame: the control bit and version 3 (16 bits), its type (16
//! bits), flags (8 bits) and the payload length (24 bits). A data frame: the stream id (31 bits, control bit
//! clear), flags and length. A header block is a count of pairs then, per pair, a length-prefixed lower-case
//! name and value (several values of one name joined by NUL), all big-endian 32-bit lengths; on the wire it is
//! compressed with zlib primed with [`HEADER_DICTIONARY`], ONE zlib stream per direction for the whole
//! connection, each block ending with a sync flush. So [`Deflater`] and [`Inflater`] live as long as the
//! connection and see its blocks in order.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};

use super::dictionary::HEADER_DICTIONARY;

/// The protocol version this codec speaks.
pub const VERSION: u16 = 3;
/// FLAG_FIN: the sender's last frame on the stream.
pub const FLAG_FIN: u8 = 0x01;
/// FLAG_UNIDIRECTIONAL (SYN_STREAM): the receiver may not send on the stream.
pub const FLAG_UNIDIRECTIONAL: u8 = 0x02;
/// The largest payload a frame can carry (24-bit length).
pub const MAX_PAYLOAD: usize = (1 << 24) - 1;
/// The most header pairs one block may hold.
const MAX_HEADERS: usize = 1000;
/// The most bytes one decompressed header block may take.
const MAX_HEADER_BLOCK: usize = 1 << 20;

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_SETTINGS: u16 = 4;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;
const TYPE_WINDOW_UPDATE: u16 = 9;

/// A header block's pairs, names lower-case, in order.
pub type Headers = Vec<(String, String)>;

/// One SPDY/3.1 frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// The sender opens stream `stream_id`.
    SynStream {
        /// The new stream.
        stream_id: u32,
        /// The stream it is associated with (server push), 0 for none.
        associated_id: u32,
        /// Priority, 0 (highest) to 7.
        priority: u8,
        /// FIN, UNIDIRECTIONAL.
        flags: u8,
        /// The stream's headers.
        headers: Headers,
    },
    /// The receiver accepts stream `stream_id`.
    SynReply {
        /// The stream.
        stream_id: u32,
        /// FIN.
        flags: u8,
        /// The reply's headers.
        headers: Headers,
    },
    /// Abnormal end of a stream.
    RstStream {
        /// The stream.
        stream_id: u32,
        /// Why (1 PROTOCOL_ERROR, 5 CANCEL, ...).
        status: u32,
    },
    /// Connection settings: (flags, id, value) entries.
    Settings {
        /// FLAG_SETTINGS_CLEAR_SETTINGS.
        flags: u8,
        /// The entries.
        entries: Vec<(u8, u32, u32)>,
    },
    /// A ping, echoed by the receiver.
    Ping {
        /// Its id.
        id: u32,
    },
    /// The sender stops accepting streams.
    GoAway {
        /// The last stream the sender handled.
        last_stream_id: u32,
        /// 0 OK, 1 PROTOCOL_ERROR, 2 INTERNAL_ERROR.
        status: u32,
    },
    /// More headers on an open stream.
    Headers {
        /// The stream.
        stream_id: u32,
        /// FIN.
        flags: u8,
        /// The headers.
        headers: Headers,
    },
    /// Flow control credit.
    WindowUpdate {
        /// The stream (0: the connection).
        stream_id: u32,
        /// Bytes granted.
        delta: u32,
    },
    /// Payload on a stream.
    Data {
        /// The stream.
        stream_id: u32,
        /// FIN.
        flags: u8,
        /// The bytes.
        data: Vec<u8>,
    },
    /// A control frame of a type this codec does not know (ignored, as the protocol asks).
    Unknown {
        /// Its type.
        kind: u16,
    },
}

/// Why bytes are not a frame this codec accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A control frame of another SPDY version.
    #[error("unsupported SPDY version {0} (only 3)")]
    Version(u16),
    /// The payload is too short or inconsistent for the frame's type.
    #[error("malformed {kind} frame: {why}")]
    Malformed {
        /// The frame type.
        kind: &'static str,
        /// What is wrong.
        why: String,
    },
    /// A header block could not be compressed or decompressed.
    #[error("header block: {0}")]
    Compression(String),
    /// A payload above 24 bits.
    #[error("frame payload of {0} bytes is over the 16 MiB SPDY limit")]
    TooLarge(usize),
}

fn malformed(kind: &'static str, why: impl Into<String>) -> FrameError {
    FrameError::Malformed {
        kind,
        why: why.into(),
    }
}

/// The first 8 bytes of a frame, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHead {
    /// Control frame type, or `None` for a data frame.
    pub control: Option<u16>,
    /// The version (control) or stream id (data).
    pub word: u32,
    /// Flags.
    pub flags: u8,
    /// Payload length.
    pub length: usize,
}

impl FrameHead {
    /// Parses a frame's 8-byte prefix.
    pub fn parse(b: [u8; 8]) -> Self {
        let first = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let control = b[0] & 0x80 != 0;
        let length = usize::from(b[5]) << 16 | usize::from(b[6]) << 8 | usize::from(b[7]);
        Self {
            control: control.then(|| u16::from_be_bytes([b[2], b[3]])),
            word: if control {
                u32::from(u16::from_be_bytes([b[0], b[1]]) & 0x7fff)
            } else {
                first & 0x7fff_ffff
            },
            flags: b[4],
            length,
        }
    }
}

/// The compressing side of one direction's header-block zlib stream.
pub struct Deflater(Compress);

impl Default for Deflater {
    fn default() -> Self {
        Self::new()
    }
}

impl Deflater {
    /// A fresh stream primed with the SPDY dictionary.
    pub fn new() -> Self {
        let mut c = Compress::new(Compression::default(), true);
        // only fails on a stream already started; this one is new
        let _ = c.set_dictionary(HEADER_DICTIONARY);
        Self(c)
    }

    /// Compresses one block, ending it with a sync flush.
    pub fn block(&mut self, input: &[u8]) -> Result<Vec<u8>, FrameError> {
        let mut out = Vec::with_capacity(input.len() / 2 + 64);
        let start = self.0.total_in();
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(256.max(out.capacity()));
            }
            let done = usize::try_from(self.0.total_in() - start).unwrap_or(usize::MAX);
            self.0
                .compress_vec(&input[done.min(input.len())..], &mut out, FlushCompress::Sync)
                .map_err(|e| FrameError::Compression(e.to_string()))?;
            let done = usize::try_from(self.0.total_in() - start).unwrap_or(usize::MAX);
            if done >= input.len() && out.len() < out.capacity() {
                return Ok(out);
            }
        }
    }
}

/// The decompressing side of one direction's header-block zlib stream.
pub struct Inflater(Decompress);

impl Default for Inflater {
    fn default() -> Self {
        Self::new()
    }
}

impl Inflater {
    /// A fresh stream; the dictionary is given when the stream asks for it.
    pub fn new() -> Self {
        Self(Decompress::new(true))
    }

    /// Decompresses one (sync-flushed) block.
    pub fn block(&mut self, input: &[u8]) -> Result<Vec<u8>, FrameError> {
        let err = |e: String| FrameError::Compression(e);
        let mut out = Vec::with_capacity(input.len() * 4 + 64);
        let start = self.0.total_in();
        loop {
            if out.len() == out.capacity() {
                out.reserve(out.capacity().max(256));
            }
            let (in_before, out_before) = (self.0.total_in(), out.len());
            let done = usize::try_from(in_before - start).unwrap_or(usize::MAX);
            match self
                .0
                .decompress_vec(&input[done.min(input.len())..], &mut out, FlushDecompress::Sync)
            {
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.0
                        .set_dictionary(HEADER_DICTIONARY)
                        .map_err(|e| err(e.to_string()))?;
                    continue;
                }
                Err(e) => return Err(err(e.to_string())),
            }
            if out.len() > MAX_HEADER_BLOCK {
                return Err(err(format!("over {MAX_HEADER_BLOCK} bytes decompressed")));
            }
            let done = usize::try_from(self.0.total_in() - start).unwrap_or(usize::MAX);
            if done >= input.len() && out.len() < out.capacity() {
                return Ok(out);
            }
            if self.0.total_in() == in_before && out.len() == out_before && out.len() < out.capacity() {
                return Err(err("trailing bytes after the end of the zlib stream".into()));
            }
        }
    }
}

/// A header block, uncompressed.
pub fn encode_headers(headers: &[(String, String)]) -> Vec<u8> {
    let mut b = Vec::new();
    let len = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes();
    b.extend_from_slice(&len(headers.len()));
    for (name, value) in headers {
        let name = name.to_ascii_lowercase();
        b.extend_from_slice(&len(name.len()));
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&len(value.len()));
        b.extend_from_slice(value.as_bytes());
    }
    b
}

/// Reads a big-endian u32 at `*at`, moving past it.
fn take_u32(b: &[u8], at: &mut usize, kind: &'static str) -> Result<u32, FrameError> {
    let bytes = b
        .get(*at..*at + 4)
        .ok_or_else(|| malformed(kind, format!("{} bytes, expected more", b.len())))?;
    *at += 4;
    Ok(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
}

/// Parses an uncompressed header block.
pub fn decode_headers(b: &[u8]) -> Result<Headers, FrameError> {
    const KIND: &str = "header block";
    let mut at = 0;
    let count = take_u32(b, &mut at, KIND)? as usize;
    if count > MAX_HEADERS {
        return Err(malformed(
            KIND,
            format!("{count} headers (at most {MAX_HEADERS})"),
        ));
    }
    let mut headers = Vec::with_capacity(count);
    let string = |at: &mut usize| -> Result<String, FrameError> {
        let n = take_u32(b, at, KIND)? as usize;
        let s = b
            .get(*at..at.saturating_add(n))
            .ok_or_else(|| malformed(KIND, format!("a {n}-byte string past its end")))?;
        *at += n;
        Ok(String::from_utf8_lossy(s).into_owned())
    };
    for _ in 0..count {
        let name = string(&mut at)?;
        let value = string(&mut at)?;
        headers.push((name.to_ascii_lowercase(), value));
    }
    Ok(headers)
}

fn control(kind: u16, flags: u8, payload: &[u8]) -> Result<Vec<u8>, FrameError> {
    if payload.len() > MAX_PAYLOAD {
        return Err(FrameError::TooLarge(payload.len()));
    }
    let mut b = Vec::with_capacity(8 + payload.len());
    b.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&(u32::from(flags) << 24 | payload.len() as u32).to_be_bytes());
    b.extend_from_slice(payload);
    Ok(b)
}

fn with_block(prefix: &[u8], headers: &[(String, String)], z: &mut Deflater) -> Result<Vec<u8>, FrameError> {
    let mut p = prefix.to_vec();
    p.extend_from_slice(&z.block(&encode_headers(headers))?);
    Ok(p)
}

/// A frame's bytes; header blocks go through `z`, which must see every block of the direction in order.
pub fn encode(frame: &Frame, z: &mut Deflater) -> Result<Vec<u8>, FrameError> {
    let id = |n: u32| (n & 0x7fff_ffff).to_be_bytes();
    match frame {
        Frame::SynStream {
            stream_id,
            associated_id,
            priority,
            flags,
            headers,
        } => {
            let mut prefix = id(*stream_id).to_vec();
            prefix.extend_from_slice(&id(*associated_id));
            prefix.extend_from_slice(&[(priority & 0x7) << 5, 0]);
            control(TYPE_SYN_STREAM, *flags, &with_block(&prefix, headers, z)?)
        }
        Frame::SynReply {
            stream_id,
            flags,
            headers,
        } => control(TYPE_SYN_REPLY, *flags, &with_block(&id(*stream_id), headers, z)?),
        Frame::Headers {
            stream_id,
            flags,
            headers,
        } => control(TYPE_HEADERS, *flags, &with_block(&id(*stream_id), headers, z)?),
        Frame::RstStream { stream_id, status } => {
            let mut p = id(*stream_id).to_vec();
            p.extend_from_slice(&status.to_be_bytes());
            control(TYPE_RST_STREAM, 0, &p)
        }
        Frame::Settings { flags, entries } => {
            let mut p = (entries.len() as u32).to_be_bytes().to_vec();
            for (f, key, value) in entries {
                p.extend_from_slice(&(u32::from(*f) << 24 | (key & 0x00ff_ffff)).to_be_bytes());
                p.extend_from_slice(&value.to_be_bytes());
            }
            control(TYPE_SETTINGS, *flags, &p)
        }
        Frame::Ping { id: ping } => control(TYPE_PING, 0, &ping.to_be_bytes()),
        Frame::GoAway {
            last_stream_id,
            status,
        } => {
            let mut p = id(*last_stream_id).to_vec();
            p.extend_from_slice(&status.to_be_bytes());
            control(TYPE_GOAWAY, 0, &p)
        }
        Frame::WindowUpdate { stream_id, delta } => {
            let mut p = id(*stream_id).to_vec();
            p.extend_from_slice(&(delta & 0x7fff_ffff).to_be_bytes());
            control(TYPE_WINDOW_UPDATE, 0, &p)
        }
        Frame::Data {
            stream_id,
            flags,
            data,
        } => {
            if data.len() > MAX_PAYLOAD {
                return Err(FrameError::TooLarge(data.len()));
            }
            let mut b = Vec::with_capacity(8 + data.len());
            b.extend_from_slice(&id(*stream_id));
            b.extend_from_slice(&(u32::from(*flags) << 24 | data.len() as u32).to_be_bytes());
            b.extend_from_slice(data);
            Ok(b)
        }
        Frame::Unknown { kind } => control(*kind, 0, &[]),
    }
}

/// The frame whose 8-byte prefix is `head` and payload `p`; header blocks go through `z`, which must see
/// every block of the direction in order.
pub fn decode(head: FrameHead, p: &[u8], z: &mut Inflater) -> Result<Frame, FrameError> {
    let Some(kind) = head.control else {
        return Ok(Frame::Data {
            stream_id: head.word,
            flags: head.flags,
            data: p.to_vec(),
        });
    };
    let version = u16::try_from(head.word).unwrap_or(u16::MAX);
    if version != VERSION {
        return Err(FrameError::Version(version));
    }
    let mut at = 0;
    let stream = |at: &mut usize, k| take_u32(p, at, k).map(|v| v & 0x7fff_ffff);
    let frame = match kind {
        TYPE_SYN_STREAM => {
            const K: &str = "SYN_STREAM";
            let stream_id = stream(&mut at, K)?;
            let associated_id = stream(&mut at, K)?;
            let prio = p.get(at).ok_or_else(|| malformed(K, "no priority"))?;
            at += 2;
            let block = p.get(at..).ok_or_else(|| malformed(K, "no header block"))?;
            Frame::SynStream {
                stream_id,
                associated_id,
                priority: prio >> 5,
                flags: head.flags,
                headers: decode_headers(&z.block(block)?)?,
            }
        }
        TYPE_SYN_REPLY | TYPE_HEADERS => {
            let k = if kind == TYPE_HEADERS {
                "HEADERS"
            } else {
                "SYN_REPLY"
            };
            let stream_id = stream(&mut at, k)?;
            let headers = decode_headers(&z.block(&p[at..])?)?;
            if kind == TYPE_HEADERS {
                Frame::Headers {
                    stream_id,
                    flags: head.flags,
                    headers,
                }
            } else {
                Frame::SynReply {
                    stream_id,
                    flags: head.flags,
                    headers,
                }
            }
        }
        TYPE_RST_STREAM => Frame::RstStream {
            stream_id: stream(&mut at, "RST_STREAM")?,
            status: take_u32(p, &mut at, "RST_STREAM")?,
        },
        TYPE_SETTINGS => {
            const K: &str = "SETTINGS";
            let n = take_u32(p, &mut at, K)? as usize;
            if n.saturating_mul(8) != p.len() - 4 {
                return Err(malformed(K, format!("{n} entries in {} bytes", p.len())));
            }
            let mut entries = Vec::with_capacity(n);
            for _ in 0..n {
                let key = take_u32(p, &mut at, K)?;
                let value = take_u32(p, &mut at, K)?;
                entries.push(((key >> 24) as u8, key & 0x00ff_ffff, value));
            }
            Frame::Settings {
                flags: head.flags,
                entries,
            }
        }
        TYPE_PING => Frame::Ping {
            id: take_u32(p, &mut at, "PING")?,
        },
        TYPE_GOAWAY => Frame::GoAway {
            last_stream_id: stream(&mut at, "GOAWAY")?,
            // SPDY/3 GOAWAY carries a status; SPDY/2 peers sent only the stream id
            status: take_u32(p, &mut at, "GOAWAY").unwrap_or(0),
        },
        TYPE_WINDOW_UPDATE => Frame::WindowUpdate {
            stream_id: stream(&mut at, "WINDOW_UPDATE")?,
            delta: stream(&mut at, "WINDOW_UPDATE")?,
        },
        other => Frame::Unknown { kind: other },
    };
    Ok(frame)
}

#[cfg(test)]
#[path = "frame_tests.rs"]
mod tests;
