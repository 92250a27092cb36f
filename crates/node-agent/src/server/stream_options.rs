//! The query of a streaming request (`/exec`, `/attach`): which streams the client wants, the command, whether
//! a terminal is asked for — parsed as the kubelet parses them.

/// What a stream carries: the kubelet's query parameters `stdin`, `stdout`, `stderr`, `tty` and every
/// `command` (exec only).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamOptions {
    /// The command (exec).
    pub command: Vec<String>,
    /// Attach the client's stdin.
    pub stdin: bool,
    /// Stream stdout.
    pub stdout: bool,
    /// Stream stderr (never with a TTY, whose output is one stream).
    pub stderr: bool,
    /// Allocate a terminal.
    pub tty: bool,
}

impl StreamOptions {
    /// Parses a raw query string as the kubelet does: a flag is on only when its value is `1` (what the API
    /// server sends), and a TTY folds stderr into stdout.
    pub fn from_query(query: Option<&str>) -> Result<Self, String> {
        let mut o = Self::default();
        for (k, v) in form_pairs(query.unwrap_or("")) {
            match k.as_str() {
                "command" => o.command.push(v),
                "input" | "stdin" => o.stdin = v == "1",
                "output" | "stdout" => o.stdout = v == "1",
                "error" | "stderr" => o.stderr = v == "1",
                "tty" => o.tty = v == "1",
                _ => {}
            }
        }
        if o.tty {
            o.stderr = false;
        }
        if !(o.stdin || o.stdout || o.stderr) {
            return Err("you must specify at least 1 of stdin, stdout, stderr".into());
        }
        Ok(o)
    }
}

/// The `key=value` pairs of a URL query, percent- and plus-decoded, in order (keys may repeat).
pub(super) fn form_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let hex = |b: u8| char::from(b).to_digit(16);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(hi), Some(lo)) => {
                    out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'?'));
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_flags_are_on_only_with_1_and_a_tty_takes_stderr() {
        let o = StreamOptions::from_query(Some("command=sh&command=-c&command=echo+hi%21&stdout=1&stderr=1"))
            .unwrap();
        assert_eq!(o.command, ["sh", "-c", "echo hi!"]);
        assert!(o.stdout && o.stderr && !o.stdin && !o.tty);
        let o = StreamOptions::from_query(Some("command=sh&stdin=1&stdout=1&stderr=1&tty=1")).unwrap();
        assert!(o.tty && !o.stderr);
        let o = StreamOptions::from_query(Some("command=ls&stdout=true&stdin=1")).unwrap();
        assert!(!o.stdout && o.stdin, "only 1 turns a flag on");
        let e = StreamOptions::from_query(Some("command=ls")).unwrap_err();
        assert!(e.contains("at least 1 of stdin, stdout, stderr"), "{e}");
        assert!(StreamOptions::from_query(None).is_err());
    }
}
