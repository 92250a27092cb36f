//! gRPC served on a unix socket to clients in any language: the connections the agent accepts on the sockets
//! where node-local programs call it (device plugin registration, the pod-resources API).
//!
//! A gRPC client dialing a unix socket has no host name to put in the request's `:authority`. Go clients that
//! dial the socket's path with a dialer of their own (the device plugins built on the kubelet's plugin stub,
//! the kubelet's own pod-resources client) send the path, percent-encoded; Java and Python clients send it as
//! it is. Neither is a valid URI authority, and the server's HTTP/2 library refuses such a request with
//! `PROTOCOL_ERROR`, where the kubelet's Go server takes it. Nothing on a unix socket routes by authority, so
//! each accepted connection ([`GrpcUnixStream`]) rewrites what the client sends before the HTTP/2 server reads
//! it: an invalid `:authority` becomes `localhost` ([`authority`] says how). The agent's writes to the client
//! pass unchanged. Only these unix sockets are served this way; the kubelet API on TCP is not.

pub mod authority;
#[cfg(test)]
mod tests;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::server::{Connected, UdsConnectInfo};

use authority::Rewriter;

/// How much is read from the socket at a time.
const READ_CHUNK: usize = 16 * 1024;

/// A connection accepted on a unix socket, whose requests reach the server with a valid `:authority` (see the
/// module docs).
#[derive(Debug)]
pub struct GrpcUnixStream {
    inner: UnixStream,
    rewriter: Rewriter,
    /// Rewritten bytes the server has not read yet, from `ready_at` on.
    ready: Vec<u8>,
    ready_at: usize,
    chunk: Box<[u8]>,
}

impl GrpcUnixStream {
    /// Wraps an accepted connection.
    pub fn new(inner: UnixStream) -> Self {
        Self {
            inner,
            rewriter: Rewriter::default(),
            ready: Vec::new(),
            ready_at: 0,
            chunk: vec![0; READ_CHUNK].into_boxed_slice(),
        }
    }
}

/// The connections accepted on `listener`, each wrapped in a [`GrpcUnixStream`]: the incoming stream for
/// tonic's `serve_with_incoming*`.
pub fn incoming(listener: UnixListener) -> impl Stream<Item = io::Result<GrpcUnixStream>> {
    UnixListenerStream::new(listener).map(|accepted| accepted.map(GrpcUnixStream::new))
}

impl AsyncRead for GrpcUnixStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.ready_at < this.ready.len() {
                let n = buf.remaining().min(this.ready.len() - this.ready_at);
                buf.put_slice(&this.ready[this.ready_at..this.ready_at + n]);
                this.ready_at += n;
                if this.ready_at == this.ready.len() {
                    this.ready.clear();
                    this.ready_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut chunk = ReadBuf::new(&mut this.chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut chunk) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                // the client closed its side: the server sees the end, whatever was held back
                Poll::Ready(Ok(())) if chunk.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => {
                    if let Err(e) = this.rewriter.push(chunk.filled(), &mut this.ready) {
                        tracing::warn!(error = %e, "closing a gRPC connection on a unix socket");
                        return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
                    }
                }
            }
        }
    }
}

impl AsyncWrite for GrpcUnixStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl Connected for GrpcUnixStream {
    type ConnectInfo = UdsConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}
