//! The Kubernetes remote-command protocol (what `kubectl exec` becomes between the API server and a
//! kubelet), served by the node itself over a SPDY/3.1 [`Session`] for runtimes without a streaming server.
//!
//! The protocol version is negotiated before the upgrade ([`negotiate`], the `X-Stream-Protocol-Version`
//! header; the first version the client lists that this node speaks wins). After the 101 the client opens one
//! stream per channel, each named by its `streamtype` header: `error` always, `stdin`/`stdout`/`stderr` as the
//! query asked, `resize` with a TTY (v3 and later). [`serve_exec`] waits for them (30 s, the kubelet's stream
//! creation timeout), runs the command to completion (ExecSync: the runtime answers with the whole output and
//! the exit code, so stdin is read and discarded and output arrives when the command ends), writes stdout and
//! stderr (with a TTY, stderr goes to stdout: a terminal has one output), then the outcome on the `error`
//! stream — v4 and later a JSON `metav1.Status` (`Success`, or `Failure` with reason `NonZeroExitCode` and an
//! `ExitCode` cause), earlier versions the error text or nothing on success — closes every stream and the
//! connection.

use std::future::Future;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite};

use super::spdy::Session;
use super::stream_options::StreamOptions;

/// How long the client has to open its streams after the upgrade (the kubelet's value).
pub const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

/// A remote-command protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Protocol {
    /// `channel.k8s.io`.
    V1,
    /// `v2.channel.k8s.io`: the error stream carries error text.
    V2,
    /// `v3.channel.k8s.io`: adds the resize stream.
    V3,
    /// `v4.channel.k8s.io`: the error stream carries a JSON Status with the exit code.
    V4,
    /// `v5.channel.k8s.io`: as v4 over SPDY (its CLOSE signal is WebSocket only).
    V5,
}

impl Protocol {
    /// Every version, newest first.
    pub const ALL: [Protocol; 5] = [Self::V5, Self::V4, Self::V3, Self::V2, Self::V1];

    /// The header value naming the version.
    pub fn name(self) -> &'static str {
        match self {
            Self::V1 => "channel.k8s.io",
            Self::V2 => "v2.channel.k8s.io",
            Self::V3 => "v3.channel.k8s.io",
            Self::V4 => "v4.channel.k8s.io",
            Self::V5 => "v5.channel.k8s.io",
        }
    }
}

/// Why no version was agreed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Negotiation {
    /// The client named no version (400).
    Missing,
    /// None of the client's versions is spoken here (403).
    NoCommon(Vec<String>),
}

/// The version for the client's `X-Stream-Protocol-Version` values (each may list several, comma-separated).
pub fn negotiate<'a>(values: impl IntoIterator<Item = &'a str>) -> Result<Protocol, Negotiation> {
    let asked: Vec<String> = values
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
        .collect();
    if asked.is_empty() {
        return Err(Negotiation::Missing);
    }
    asked
        .iter()
        .find_map(|a| Protocol::ALL.into_iter().find(|p| p.name() == a))
        .ok_or(Negotiation::NoCommon(asked))
}

/// What a command did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Its standard output.
    pub stdout: Vec<u8>,
    /// Its standard error.
    pub stderr: Vec<u8>,
    /// Its exit code.
    pub exit_code: i32,
}

/// The streams of one exec, by id.
#[derive(Debug, Default)]
struct Streams {
    error: Option<u32>,
    stdin: Option<u32>,
    stdout: Option<u32>,
    stderr: Option<u32>,
    resize: Option<u32>,
}

impl Streams {
    fn complete(&self, opts: &StreamOptions, protocol: Protocol) -> bool {
        self.error.is_some()
            && (!opts.stdin || self.stdin.is_some())
            && (!opts.stdout || self.stdout.is_some())
            && (!opts.stderr || self.stderr.is_some())
            && (!opts.tty || protocol < Protocol::V3 || self.resize.is_some())
    }
}

/// The status the error stream carries, or `None` when the version writes nothing.
fn status(protocol: Protocol, outcome: &Result<Outcome, String>) -> Option<Vec<u8>> {
    let v4 = protocol >= Protocol::V4;
    match outcome {
        Ok(o) if o.exit_code == 0 => v4.then(|| br#"{"metadata":{},"status":"Success"}"#.to_vec()),
        Ok(o) => {
            let message = format!(
                "command terminated with non-zero exit code: exit status {}",
                o.exit_code
            );
            Some(if v4 {
                json!({
                    "metadata": {},
                    "status": "Failure",
                    "message": message,
                    "reason": "NonZeroExitCode",
                    "details": {"causes": [{"reason": "ExitCode", "message": o.exit_code.to_string()}]},
                })
                .to_string()
                .into_bytes()
            } else {
                message.into_bytes()
            })
        }
        Err(e) => {
            let message = format!("error executing command in container: {e}");
            Some(if v4 {
                json!({
                    "metadata": {},
                    "status": "Failure",
                    "message": format!("Internal error occurred: {message}"),
                    "reason": "InternalError",
                    "details": {"causes": [{"message": message}]},
                    "code": 500,
                })
                .to_string()
                .into_bytes()
            } else {
                message.into_bytes()
            })
        }
    }
}

/// Serves one exec over the upgraded connection `io`: waits for the client's streams, runs `run` once they
/// are there, writes its output and outcome, and closes. An error says why the exchange stopped early (the
/// client's streams never came, the connection broke).
pub async fn serve_exec<I, F, Fut>(
    io: I,
    protocol: Protocol,
    opts: &StreamOptions,
    run: F,
) -> Result<(), String>
where
    I: AsyncRead + AsyncWrite + Send + 'static,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<Outcome, String>>,
{
    let mut session = Session::start(io);
    let mut streams = Streams::default();
    let deadline = tokio::time::Instant::now() + STREAM_CREATION_TIMEOUT;
    while !streams.complete(opts, protocol) {
        let stream = match tokio::time::timeout_at(deadline, session.accept()).await {
            Ok(Some(s)) => s,
            Ok(None) => return Err("the client closed the connection before opening its streams".into()),
            Err(_) => {
                let _ = session.shutdown().await;
                return Err("timed out waiting for client to create streams".into());
            }
        };
        let slot = match stream.header("streamtype") {
            Some("error") => &mut streams.error,
            Some("stdin") => &mut streams.stdin,
            Some("stdout") => &mut streams.stdout,
            Some("stderr") => &mut streams.stderr,
            Some("resize") => &mut streams.resize,
            other => {
                tracing::debug!(streamtype = ?other, "ignoring a stream of unknown type");
                continue;
            }
        };
        *slot = Some(stream.id);
    }
    let outcome = run().await;
    if let Ok(o) = &outcome {
        let (out, err) = match (streams.stdout, streams.stderr, opts.tty) {
            (Some(out), _, true) => (Some(out), Some(out)),
            (out, err, _) => (out, err),
        };
        if let Some(id) = out {
            session.write(id, &o.stdout).await?;
        }
        if let Some(id) = err {
            session.write(id, &o.stderr).await?;
        }
    }
    let own = [streams.stdin, streams.stdout, streams.stderr, streams.resize];
    for id in own.into_iter().flatten() {
        session.close(id).await?;
    }
    if let Some(id) = streams.error {
        if let Some(status) = status(protocol, &outcome) {
            session.write(id, &status).await?;
        }
        session.close(id).await?;
    }
    session.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::super::spdy::frame::{self, Deflater, FLAG_FIN, Frame, FrameHead, Inflater};
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    #[test]
    fn versions_are_negotiated_in_the_clients_order() {
        assert_eq!(
            negotiate(["v4.channel.k8s.io, v3.channel.k8s.io"]),
            Ok(Protocol::V4)
        );
        assert_eq!(
            negotiate(["v9.channel.k8s.io", "v5.channel.k8s.io", "v4.channel.k8s.io"]),
            Ok(Protocol::V5)
        );
        assert_eq!(negotiate(["channel.k8s.io"]), Ok(Protocol::V1));
        assert_eq!(negotiate([" , "]), Err(Negotiation::Missing));
        assert_eq!(
            negotiate(["portforward.k8s.io"]),
            Err(Negotiation::NoCommon(vec!["portforward.k8s.io".into()]))
        );
    }

    /// A minimal SPDY client: its own zlib streams, frames written and read on a duplex pipe.
    struct Client {
        io: DuplexStream,
        deflater: Deflater,
        inflater: Inflater,
    }

    impl Client {
        async fn send(&mut self, f: Frame) {
            let bytes = frame::encode(&f, &mut self.deflater).unwrap();
            self.io.write_all(&bytes).await.unwrap();
        }

        async fn open(&mut self, id: u32, kind: &str) {
            self.send(Frame::SynStream {
                stream_id: id,
                associated_id: 0,
                priority: 0,
                flags: 0,
                headers: vec![("streamtype".into(), kind.into())],
            })
            .await;
        }

        /// Every frame until the server closes the connection.
        async fn frames(&mut self) -> Vec<Frame> {
            let mut all = Vec::new();
            loop {
                let mut head = [0u8; 8];
                if self.io.read_exact(&mut head).await.is_err() {
                    return all;
                }
                let head = FrameHead::parse(head);
                let mut p = vec![0u8; head.length];
                self.io.read_exact(&mut p).await.unwrap();
                all.push(frame::decode(head, &p, &mut self.inflater).unwrap());
            }
        }
    }

    fn client(io: DuplexStream) -> Client {
        Client {
            io,
            deflater: Deflater::new(),
            inflater: Inflater::new(),
        }
    }

    /// The bytes written on `id` and whether it was closed.
    fn stream(frames: &[Frame], id: u32) -> (String, bool) {
        let mut data = Vec::new();
        let mut fin = false;
        for f in frames {
            if let Frame::Data {
                stream_id,
                flags,
                data: d,
            } = f
                && *stream_id == id
            {
                data.extend_from_slice(d);
                fin |= flags & FLAG_FIN != 0;
            }
        }
        (String::from_utf8(data).unwrap(), fin)
    }

    fn opts(query: &str) -> StreamOptions {
        StreamOptions::from_query(Some(query)).unwrap()
    }

    #[tokio::test]
    async fn output_and_a_success_status_then_every_stream_closed() {
        let (server, theirs) = tokio::io::duplex(1 << 16);
        let o = opts("command=echo&command=hi&stdout=1&stderr=1");
        let served = tokio::spawn(async move {
            serve_exec(server, Protocol::V4, &o, || async {
                Ok(Outcome {
                    stdout: b"hi\n".to_vec(),
                    stderr: b"warn\n".to_vec(),
                    exit_code: 0,
                })
            })
            .await
        });
        let mut c = client(theirs);
        c.open(1, "error").await;
        c.send(Frame::Ping { id: 7 }).await;
        c.open(3, "stdout").await;
        c.open(5, "stderr").await;
        let frames = c.frames().await;
        served.await.unwrap().unwrap();
        for id in [1, 3, 5] {
            assert!(
                frames
                    .iter()
                    .any(|f| matches!(f, Frame::SynReply { stream_id, .. } if *stream_id == id)),
                "reply to {id}: {frames:?}"
            );
        }
        assert!(frames.contains(&Frame::Ping { id: 7 }));
        assert_eq!(stream(&frames, 3), ("hi\n".into(), true));
        assert_eq!(stream(&frames, 5), ("warn\n".into(), true));
        assert_eq!(
            stream(&frames, 1),
            (r#"{"metadata":{},"status":"Success"}"#.into(), true)
        );
        assert!(matches!(frames.last(), Some(Frame::GoAway { .. })));
    }

    #[tokio::test]
    async fn a_non_zero_exit_is_a_failure_status_with_the_code() {
        let (server, theirs) = tokio::io::duplex(1 << 16);
        let o = opts("command=false&stdout=1&stdin=1&tty=1");
        let served = tokio::spawn(async move {
            serve_exec(server, Protocol::V5, &o, || async {
                Ok(Outcome {
                    stdout: b"out".to_vec(),
                    stderr: b"+err".to_vec(),
                    exit_code: 3,
                })
            })
            .await
        });
        let mut c = client(theirs);
        c.open(1, "error").await;
        c.open(3, "stdin").await;
        c.send(Frame::Data {
            stream_id: 3,
            flags: FLAG_FIN,
            data: b"ignored".to_vec(),
        })
        .await;
        c.open(5, "stdout").await;
        c.open(7, "resize").await;
        let frames = c.frames().await;
        served.await.unwrap().unwrap();
        assert_eq!(
            stream(&frames, 5),
            ("out+err".into(), true),
            "a TTY has one output"
        );
        let (status, closed) = stream(&frames, 1);
        assert!(closed);
        let status: serde_json::Value = serde_json::from_str(&status).unwrap();
        assert_eq!(status["status"], "Failure");
        assert_eq!(status["reason"], "NonZeroExitCode");
        assert_eq!(status["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(status["details"]["causes"][0]["message"], "3");
    }

    #[tokio::test]
    async fn older_versions_get_error_text_and_runtime_failures_are_reported() {
        let (server, theirs) = tokio::io::duplex(1 << 16);
        let o = opts("command=x&stdout=1");
        let served = tokio::spawn(async move {
            serve_exec(server, Protocol::V2, &o, || async {
                Err("deadline exceeded".to_owned())
            })
            .await
        });
        let mut c = client(theirs);
        c.open(1, "error").await;
        c.open(3, "stdout").await;
        let frames = c.frames().await;
        served.await.unwrap().unwrap();
        assert_eq!(stream(&frames, 3), (String::new(), true));
        let (text, closed) = stream(&frames, 1);
        assert!(closed);
        assert_eq!(text, "error executing command in container: deadline exceeded");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_never_opens_its_streams_times_out() {
        let (server, theirs) = tokio::io::duplex(1 << 16);
        let o = opts("command=x&stdout=1&stderr=1");
        let served = tokio::spawn(async move {
            serve_exec(server, Protocol::V4, &o, || async { Ok(Outcome::default()) }).await
        });
        let mut c = client(theirs);
        c.open(1, "error").await;
        c.open(3, "stdout").await;
        let frames = c.frames().await;
        let e = served.await.unwrap().unwrap_err();
        assert!(
            e.contains("timed out waiting for client to create streams"),
            "{e}"
        );
        assert!(!frames.iter().any(|f| matches!(f, Frame::Data { .. })));
    }

    #[tokio::test]
    async fn garbage_ends_the_session_without_a_panic() {
        let (server, mut theirs) = tokio::io::duplex(1 << 16);
        let o = opts("command=x&stdout=1");
        let served = tokio::spawn(async move {
            serve_exec(server, Protocol::V4, &o, || async { Ok(Outcome::default()) }).await
        });
        // a control frame of SPDY version 2
        theirs.write_all(&[0x80, 0x02, 0, 1, 0, 0, 0, 0]).await.unwrap();
        let e = served.await.unwrap().unwrap_err();
        assert!(e.contains("before opening its streams"), "{e}");
    }
}
