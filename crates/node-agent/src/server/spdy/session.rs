//! The server side of a SPDY/3.1 connection, as much of it as a remote-command stream needs.
//!
//! [`Session::start`] takes the upgraded connection and runs two tasks: a reader that decodes the client's
//! frames — a SYN_STREAM becomes an [`IncomingStream`] (answered with SYN_REPLY at once, as the kubelet's
//! streaming server does), a PING is echoed, a GOAWAY or a protocol error ends the session — and a writer that
//! encodes what the caller sends through [`Session`]'s methods, keeping header blocks in wire order for the
//! one zlib stream. DATA the client sends (stdin, terminal resizes) is read and dropped: the streams this node
//! serves are output only. No flow control is done (the Kubernetes SPDY peers send no WINDOW_UPDATE they
//! wait on).

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::frame::{self, Deflater, FLAG_FIN, Frame, FrameHead, Headers, Inflater};

/// The most bytes one DATA frame the session writes carries.
const CHUNK: usize = 32 * 1024;

/// A stream the client opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncomingStream {
    /// Its id.
    pub id: u32,
    /// Its SYN_STREAM headers (lower-case names).
    pub headers: Headers,
}

impl IncomingStream {
    /// The value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

enum Out {
    Frame(Frame),
    /// Write GOAWAY, flush and close the connection.
    Shutdown,
}

/// A server-side SPDY/3.1 session.
pub struct Session {
    incoming: mpsc::Receiver<IncomingStream>,
    out: mpsc::Sender<Out>,
    _reader: AbortOnDrop,
    writer: JoinHandle<Result<(), String>>,
}

impl Session {
    /// Runs the session over `io` (the connection after the 101 answer).
    pub fn start<I>(io: I) -> Self
    where
        I: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (rd, wr) = tokio::io::split(io);
        let (out_tx, out_rx) = mpsc::channel(64);
        let (in_tx, incoming) = mpsc::channel(16);
        let reader = AbortOnDrop(tokio::spawn(read_frames(rd, in_tx, out_tx.clone())));
        let writer = tokio::spawn(write_frames(wr, out_rx));
        Self {
            incoming,
            out: out_tx,
            _reader: reader,
            writer,
        }
    }

    /// The next stream the client opens; `None` once the client stopped (closed, GOAWAY, protocol error).
    pub async fn accept(&mut self) -> Option<IncomingStream> {
        self.incoming.recv().await
    }

    async fn send(&self, frame: Frame) -> Result<(), String> {
        self.out
            .send(Out::Frame(frame))
            .await
            .map_err(|_| "the connection is closed".to_owned())
    }

    /// Writes `data` on stream `id`, in frames of at most 32 KiB.
    pub async fn write(&self, id: u32, data: &[u8]) -> Result<(), String> {
        for chunk in data.chunks(CHUNK) {
            self.send(Frame::Data {
                stream_id: id,
                flags: 0,
                data: chunk.to_vec(),
            })
            .await?;
        }
        Ok(())
    }

    /// Ends the server's side of stream `id` (an empty DATA frame with FIN).
    pub async fn close(&self, id: u32) -> Result<(), String> {
        self.send(Frame::Data {
            stream_id: id,
            flags: FLAG_FIN,
            data: Vec::new(),
        })
        .await
    }

    /// Writes GOAWAY, waits until everything written reached the connection, and closes it.
    pub async fn shutdown(self) -> Result<(), String> {
        let _ = self.out.send(Out::Shutdown).await;
        drop(self.out);
        match self.writer.await {
            Ok(r) => r,
            Err(e) => Err(e.to_string()),
        }
    }
}

/// The reader task, stopped when the session is dropped (a client that never closes holds nothing).
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn read_frames<R: AsyncRead + Unpin>(
    mut rd: R,
    incoming: mpsc::Sender<IncomingStream>,
    out: mpsc::Sender<Out>,
) {
    let mut inflater = Inflater::new();
    let mut last_id = 0;
    loop {
        let mut head = [0u8; 8];
        if let Err(e) = rd.read_exact(&mut head).await {
            tracing::debug!(error = %e, "SPDY connection closed by the client");
            return;
        }
        let head = FrameHead::parse(head);
        let mut payload = vec![0u8; head.length];
        if let Err(e) = rd.read_exact(&mut payload).await {
            tracing::debug!(error = %e, "SPDY connection closed inside a frame");
            return;
        }
        let frame = match frame::decode(head, &payload, &mut inflater) {
            Ok(f) => f,
            Err(e) => {
                tracing::debug!(error = %e, "SPDY protocol error, closing the session");
                let _ = out
                    .send(Out::Frame(Frame::GoAway {
                        last_stream_id: last_id,
                        status: 1,
                    }))
                    .await;
                return;
            }
        };
        match frame {
            Frame::SynStream {
                stream_id, headers, ..
            } => {
                last_id = stream_id;
                let reply = Frame::SynReply {
                    stream_id,
                    flags: 0,
                    headers: Vec::new(),
                };
                if out.send(Out::Frame(reply)).await.is_err() {
                    return;
                }
                let stream = IncomingStream {
                    id: stream_id,
                    headers,
                };
                // nobody accepting any more: later streams are answered and ignored
                let _ = incoming.send(stream).await;
            }
            Frame::Ping { id } if out.send(Out::Frame(Frame::Ping { id })).await.is_err() => return,
            Frame::GoAway { .. } => return,
            // client data (stdin, resizes), stream resets, settings, flow control: nothing to do
            _ => {}
        }
    }
}

async fn write_frames<W: AsyncWrite + Unpin>(mut wr: W, mut out: mpsc::Receiver<Out>) -> Result<(), String> {
    let mut deflater = Deflater::new();
    while let Some(next) = out.recv().await {
        let frame = match next {
            Out::Frame(f) => f,
            Out::Shutdown => {
                let bye = Frame::GoAway {
                    last_stream_id: 0,
                    status: 0,
                };
                let bytes = frame::encode(&bye, &mut deflater).map_err(|e| e.to_string())?;
                wr.write_all(&bytes).await.map_err(|e| e.to_string())?;
                wr.flush().await.map_err(|e| e.to_string())?;
                return wr.shutdown().await.map_err(|e| e.to_string());
            }
        };
        let bytes = frame::encode(&frame, &mut deflater).map_err(|e| e.to_string())?;
        wr.write_all(&bytes).await.map_err(|e| e.to_string())?;
        if out.is_empty() {
            wr.flush().await.map_err(|e| e.to_string())?;
        }
    }
    wr.shutdown().await.map_err(|e| e.to_string())
}
