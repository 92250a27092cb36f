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

#[cfg(test)]
mod tests {
    //! Generated input: any bytes (a log file cut anywhere, or not a CRI log at all) and well-formed logs of
    //! random lines split at random points into partial lines.

    use proptest::prelude::*;

    use super::*;

    fn config() -> ProptestConfig {
        ProptestConfig {
            cases: 512,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn any_bytes_are_parsed_up_to_a_line_end(buf in prop::collection::vec(any::<u8>(), 0..400)) {
            let (entries, consumed) = parse(&buf);
            prop_assert!(consumed <= buf.len());
            prop_assert!(consumed == 0 || buf[consumed - 1] == b'\n');
            for e in &entries {
                prop_assert_eq!(e.text.last(), Some(&b'\n'));
            }
        }

        #[test]
        fn lines_split_into_partials_come_back_whole(
            lines in prop::collection::vec(("[^\n]{0,40}", prop::collection::vec(0usize..40, 0..3)), 1..8),
            cut in 0usize..2000,
        ) {
            let mut log = Vec::new();
            for (text, splits) in &lines {
                let bytes = text.as_bytes();
                let mut points: Vec<usize> = splits.iter().map(|s| s % (bytes.len() + 1)).collect();
                points.sort_unstable();
                let mut from = 0;
                for p in points {
                    log.extend_from_slice(b"2026-12-06T21:00:00.123456789Z stdout P ");
                    log.extend_from_slice(&bytes[from..p.max(from)]);
                    log.push(b'\n');
                    from = p.max(from);
                }
                log.extend_from_slice(b"2026-12-06T21:00:00.123456789Z stdout F ");
                log.extend_from_slice(&bytes[from..]);
                log.push(b'\n');
            }
            let (entries, consumed) = parse(&log);
            prop_assert_eq!(consumed, log.len());
            let got: Vec<Vec<u8>> = entries.into_iter().map(|e| e.text).collect();
            let want: Vec<Vec<u8>> = lines.iter().map(|(t, _)| [t.as_bytes(), b"\n"].concat()).collect();
            prop_assert_eq!(&got, &want);
            // cut anywhere: the lines before the cut come back whole; a line cut after some of its partial parts
            // comes back as those parts without a newline (all the runtime has written of it), and the rest is
            // left for the next read, which returns it as an entry of its own
            let cut = cut.min(log.len());
            let (first, used) = parse(&log[..cut]);
            for e in first.iter().rev().skip(1) {
                prop_assert_eq!(e.text.last(), Some(&b'\n'));
            }
            let (rest, _) = parse(&log[used..]);
            let again: Vec<u8> = first.into_iter().chain(rest).flat_map(|e| e.text).collect();
            prop_assert_eq!(again, want.concat());
        }
    }
}
