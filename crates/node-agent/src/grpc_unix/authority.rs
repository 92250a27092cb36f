//! The client-to-server half of an HTTP/2 connection, rewritten so that every request's header block carries an
//! `:authority` the server's HTTP/2 library accepts ([`Rewriter`]). It works on bytes alone (no I/O), so that
//! the stream around it ([`super::GrpcUnixStream`]) stays a thin adapter.
//!
//! The bytes pass unchanged except the header blocks: a `HEADERS` frame and the `CONTINUATION` frames that
//! complete it are gathered, decoded with the client's HPACK state, and sent on as one block of literal fields
//! that never touch the dynamic table (so the server's table stays empty and the client's table is tracked
//! here alone), split into frames no larger than the smallest frame size HTTP/2 allows. Padding is dropped;
//! the priority fields and `END_STREAM` are kept. An `:authority` that is not a valid URI authority becomes
//! [`LOCAL_AUTHORITY`]; everything else, in the client's order, is kept. A connection that does not open with
//! the HTTP/2 preface is passed through untouched for the server to refuse.

use loona_hpack::Decoder;
use loona_hpack::encoder::encode_integer_into;

/// The bytes a client opens an HTTP/2 connection with.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// What an `:authority` the server would refuse is replaced with: what gRPC clients that name the socket by
/// the `unix` scheme send.
pub const LOCAL_AUTHORITY: &[u8] = b"localhost";
/// The largest header block gathered (its frames together): far above the header list the server accepts, so
/// only a broken or hostile client meets it.
pub const MAX_BLOCK: usize = 1 << 20;

const FRAME_HEADER: usize = 9;
/// Every HTTP/2 peer accepts frames of this size: the blocks sent on are cut to it.
const MIN_MAX_FRAME: usize = 16_384;
/// The dynamic table size the client may use: HTTP/2's default, which the server does not change.
const TABLE_SIZE: usize = 4_096;

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// Why the connection cannot be carried on.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    /// A header block was larger than [`MAX_BLOCK`].
    #[error("a header block of more than {MAX_BLOCK} bytes")]
    TooLarge,
    /// A frame other than `CONTINUATION` came in the middle of a header block, or a `HEADERS` frame was too short
    /// for its padding or priority fields.
    #[error("malformed HTTP/2 header frames: {0}")]
    Malformed(&'static str),
    /// The header block did not decode.
    #[error("HPACK decoding failed: {0}")]
    Hpack(loona_hpack::decoder::DecoderError),
}

enum Phase {
    /// The preface, of which this many bytes have been seen.
    Preface(usize),
    /// Frames.
    Frames,
    /// Not HTTP/2 with a preface: everything passes.
    Untouched,
}

/// A header block being gathered.
struct Block {
    stream_id: u32,
    end_stream: bool,
    /// The stream dependency and weight, when the `HEADERS` frame carried them.
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// The rewriting of one connection's client-to-server bytes (see the module docs).
pub struct Rewriter {
    phase: Phase,
    /// Bytes received and not yet handled.
    pending: Vec<u8>,
    /// What is left of the payload of a frame that passes unchanged.
    passing: usize,
    block: Option<Block>,
    decoder: Decoder<'static>,
}

impl Default for Rewriter {
    fn default() -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(TABLE_SIZE);
        Self {
            phase: Phase::Preface(0),
            pending: Vec::new(),
            passing: 0,
            block: None,
            decoder,
        }
    }
}

impl std::fmt::Debug for Rewriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rewriter")
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl Rewriter {
    /// Takes `input`, the next bytes from the client, and appends to `out` what the server is to read of them
    /// and of the bytes held back before. An error ends the connection.
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        self.pending.extend_from_slice(input);
        let mut at = 0;
        let result = self.drain(&mut at, out);
        self.pending.drain(..at);
        result
    }

    fn drain(&mut self, at: &mut usize, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        loop {
            let rest = &self.pending[*at..];
            if rest.is_empty() {
                return Ok(());
            }
            match self.phase {
                Phase::Untouched => {
                    out.extend_from_slice(rest);
                    *at = self.pending.len();
                }
                Phase::Preface(seen) => {
                    let want = &PREFACE[seen..];
                    let n = want.len().min(rest.len());
                    if rest[..n] != want[..n] {
                        // whatever it is, the server answers it, not this layer
                        out.extend_from_slice(&PREFACE[..seen]);
                        self.phase = Phase::Untouched;
                        continue;
                    }
                    *at += n;
                    self.phase = if seen + n == PREFACE.len() {
                        out.extend_from_slice(PREFACE);
                        Phase::Frames
                    } else {
                        Phase::Preface(seen + n)
                    };
                }
                Phase::Frames if self.passing > 0 => {
                    let n = self.passing.min(rest.len());
                    out.extend_from_slice(&rest[..n]);
                    self.passing -= n;
                    *at += n;
                }
                Phase::Frames => {
                    if rest.len() < FRAME_HEADER {
                        return Ok(());
                    }
                    let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
                    let kind = rest[3];
                    let flags = rest[4];
                    let stream_id = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) & 0x7fff_ffff;
                    let in_block = self.block.is_some();
                    if kind != HEADERS && kind != CONTINUATION && !in_block {
                        out.extend_from_slice(&rest[..FRAME_HEADER]);
                        self.passing = len;
                        *at += FRAME_HEADER;
                        continue;
                    }
                    if kind == CONTINUATION && !in_block {
                        // out of place: the server refuses it
                        out.extend_from_slice(&rest[..FRAME_HEADER]);
                        self.passing = len;
                        *at += FRAME_HEADER;
                        continue;
                    }
                    if kind != CONTINUATION && in_block {
                        return Err(RewriteError::Malformed("a header block interrupted"));
                    }
                    let gathered = self.block.as_ref().map_or(0, |b| b.fragment.len());
                    if gathered + len > MAX_BLOCK {
                        return Err(RewriteError::TooLarge);
                    }
                    if rest.len() < FRAME_HEADER + len {
                        return Ok(());
                    }
                    let payload = &rest[FRAME_HEADER..FRAME_HEADER + len];
                    if kind == HEADERS {
                        self.block = Some(open_block(stream_id, flags, payload)?);
                    } else if let Some(block) = &mut self.block {
                        if block.stream_id != stream_id {
                            return Err(RewriteError::Malformed(
                                "a header block continued on another stream",
                            ));
                        }
                        block.fragment.extend_from_slice(payload);
                    }
                    *at += FRAME_HEADER + len;
                    if flags & END_HEADERS != 0
                        && let Some(block) = self.block.take()
                    {
                        self.finish(block, out)?;
                    }
                }
            }
        }
    }

    /// Decodes a whole block and sends it on as literal fields.
    fn finish(&mut self, block: Block, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let mut encoded = Vec::with_capacity(block.fragment.len() + 64);
        self.decoder
            .decode_with_cb(&block.fragment, |name, value| {
                let value: &[u8] = if &*name == b":authority" && !is_valid_authority(&value) {
                    LOCAL_AUTHORITY
                } else {
                    &value
                };
                literal(&name, value, &mut encoded);
            })
            .map_err(RewriteError::Hpack)?;
        let mut first = Vec::with_capacity(5 + encoded.len().min(MIN_MAX_FRAME));
        let mut flags = 0;
        if let Some(priority) = block.priority {
            first.extend_from_slice(&priority);
            flags |= PRIORITY;
        }
        if block.end_stream {
            flags |= END_STREAM;
        }
        let room = MIN_MAX_FRAME - first.len();
        let (head, mut tail) = encoded.split_at(encoded.len().min(room));
        first.extend_from_slice(head);
        if tail.is_empty() {
            flags |= END_HEADERS;
        }
        frame(HEADERS, flags, block.stream_id, &first, out);
        while !tail.is_empty() {
            let (chunk, rest) = tail.split_at(tail.len().min(MIN_MAX_FRAME));
            let flags = if rest.is_empty() { END_HEADERS } else { 0 };
            frame(CONTINUATION, flags, block.stream_id, chunk, out);
            tail = rest;
        }
        Ok(())
    }
}

/// The block a `HEADERS` frame opens: its fragment without padding, and its priority fields.
fn open_block(stream_id: u32, flags: u8, payload: &[u8]) -> Result<Block, RewriteError> {
    let mut body = payload;
    if flags & PADDED != 0 {
        let (&pad, rest) = body.split_first().ok_or(RewriteError::Malformed(
            "a padded HEADERS frame without its pad length",
        ))?;
        let keep = rest
            .len()
            .checked_sub(usize::from(pad))
            .ok_or(RewriteError::Malformed("HEADERS padding longer than the frame"))?;
        body = &rest[..keep];
    }
    let mut priority = None;
    if flags & PRIORITY != 0 {
        let (fields, rest) = body.split_first_chunk::<5>().ok_or(RewriteError::Malformed(
            "HEADERS too short for its priority fields",
        ))?;
        priority = Some(*fields);
        body = rest;
    }
    Ok(Block {
        stream_id,
        end_stream: flags & END_STREAM != 0,
        priority,
        fragment: body.to_vec(),
    })
}

/// Whether the server's HTTP/2 library takes `value` as an `:authority`.
pub fn is_valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// A literal field without indexing, with a literal name, neither string Huffman-coded.
fn literal(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0);
    string(name, out);
    string(value, out);
}

fn string(s: &[u8], out: &mut Vec<u8>) {
    // writing to a Vec cannot fail
    let _ = encode_integer_into(s.len(), 7, 0, out);
    out.extend_from_slice(s);
}

fn frame(kind: u8, flags: u8, stream_id: u32, payload: &[u8], out: &mut Vec<u8>) {
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX).to_be_bytes();
    out.extend_from_slice(&len[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream_id.to_be_bytes());
    out.extend_from_slice(payload);
}
