//! The CRI container log format the runtime writes (`<RFC 3339 time> <stream> <P|F> <text>` per line, `P` for a
//! partial line continued by the next one), parsed into whole lines. Read by the kubelet API's `containerLogs`
//! and by the termination message's fallback to the log tail.

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// One logical log line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    /// When the runtime wrote it.
    pub time: OffsetDateTime,
    /// The time as written.
    pub stamp: String,
    /// The text, with its final newline (none when the container's output ended without one: the runtime then
    /// writes it as a partial line that nothing continues).
    pub text: Vec<u8>,
}

/// Parses complete CRI log lines from `buf`, joining partial (`P`) lines with their continuation; returns the
/// entries and how many bytes were consumed (an unterminated last line, one the runtime is still writing, is
/// left for the next read). A trailing run of partial lines is an entry without a final newline, as the kubelet
/// shows it: it is all a container leaves when its output does not end in a newline, and a continuation written
/// later is then an entry of its own.
pub(crate) fn parse(buf: &[u8]) -> (Vec<Entry>, usize) {
    let mut out = Vec::new();
    let mut pending: Option<Entry> = None;
    let mut consumed = 0;
    let mut pos = 0;
    while let Some(nl) = buf[pos..].iter().position(|b| *b == b'\n') {
        let line = &buf[pos..pos + nl];
        pos += nl + 1;
        let mut parts = line.splitn(4, |b| *b == b' ');
        let (Some(stamp), Some(_stream), Some(tag), text) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let Ok(stamp) = std::str::from_utf8(stamp) else {
            continue;
        };
        let Ok(time) = OffsetDateTime::parse(stamp, &Rfc3339) else {
            continue;
        };
        let text = text.unwrap_or_default();
        let partial = tag.split(|b| *b == b':').next() == Some(&b"P"[..]);
        let entry = pending.get_or_insert_with(|| Entry {
            time,
            stamp: stamp.to_owned(),
            text: Vec::new(),
        });
        entry.text.extend_from_slice(text);
        if !partial {
            entry.text.push(b'\n');
            out.extend(pending.take());
            consumed = pos;
        }
    }
    if let Some(unended) = pending.take() {
        out.push(unended);
        consumed = pos;
    }
    (out, consumed)
}
