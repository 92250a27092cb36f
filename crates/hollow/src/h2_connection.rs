//! One HTTP/2 connection to the API server as a tower service: what every pooled `kube::Client` of the fleet
//! sends its requests over, speaking HTTP/2 through the `h2` crate itself.
//!
//! The pool's clients each hold a single connection (HTTP/2 multiplexes every request of the agents that share
//! it), and a fleet on a saturated API server has thousands of requests in flight at once, so what one request
//! in flight holds is per-node memory. Through `hyper-util`'s pooling client a request holds that client's boxed
//! request future and a task hyper spawns to wait for each response (sized for the largest of hyper's connection
//! futures), and a second such task whenever the server's flow control holds its body back. Here a request in
//! flight is one small boxed future holding h2's response handle while the connection is up; the body, always
//! whole in memory for API requests, is handed to h2 at once.
//!
//! The connection is made on first use and again on the first request after it closed (the API server went
//! away, a keep-alive ping went unanswered for 20 s); requests in flight on a connection that closes fail, and
//! their callers retry as after any failed request. At most `in_flight` requests of a connection are sent and
//! waiting for their response headers at a time; the others wait their turn, in order, before they reach h2
//! (h2 keeps a table entry per stream and buffers the frames of streams waiting to open, in tables that grow
//! to their peak and never shrink). The connection counts its open watches (a request with `watch=true` or
//! `watch=1`, from when it is sent until its response body is dropped), so that a pool can spread watches
//! over its connections ([`crate::connections`]). Settings as hyper's HTTP/2 client makes them: 2 MiB stream
//! and 5 MiB connection windows, 16 KiB frames and header lists, a 1 MiB send buffer per stream, keep-alive
//! pings every 30 s whether requests are in flight or not; and no HPACK dynamic table for response headers.
//! Connection-specific headers, which HTTP/2 forbids, are dropped from requests. Response bodies give their
//! flow-control window back as they are read.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONNECTION, TE, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, Request, Response, Uri};
use http_body::Frame;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use kube::client::Body;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How often an HTTP/2 ping checks the connection, whether requests are in flight or not.
const KEEP_ALIVE: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is given up.
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// A single HTTP/2 connection to `server`, made on first use and again after it closed; cheap to clone (the
/// clones share the connection).
#[derive(Clone)]
pub struct H2Connection {
    shared: Arc<Shared>,
}

struct Shared {
    connector: HttpsConnector<HttpConnector>,
    server: Uri,
    /// The open connection, if there is one.
    open: Mutex<Option<Open>>,
    /// Held while connecting, so that requests arriving meanwhile wait for one connection, not make several.
    connecting: tokio::sync::Mutex<()>,
    /// One permit per request in flight (sent, waiting for its response headers).
    permits: tokio::sync::Semaphore,
    /// Watches sent and not yet ended (their response body not dropped).
    open_watches: AtomicUsize,
}

/// A connection's request handle, and whether its connection has ended.
struct Open {
    sender: h2::client::SendRequest<Bytes>,
    closed: Arc<AtomicBool>,
}

impl H2Connection {
    /// A connection to `server` made through `connector` (which must negotiate `h2`), with at most `in_flight`
    /// requests in flight (at least one).
    pub fn new(connector: HttpsConnector<HttpConnector>, server: Uri, in_flight: usize) -> Self {
        Self {
            shared: Arc::new(Shared {
                connector,
                server,
                open: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                permits: tokio::sync::Semaphore::new(in_flight.clamp(1, tokio::sync::Semaphore::MAX_PERMITS)),
                open_watches: AtomicUsize::new(0),
            }),
        }
    }

    /// How many watches are open on this connection (sent and not ended).
    pub fn open_watches(&self) -> usize {
        self.shared.open_watches.load(Ordering::Acquire)
    }
}

/// Whether `uri` asks for a watch (`watch=true` or `watch=1` in its query).
pub fn is_watch(uri: &Uri) -> bool {
    uri.query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"))
}

/// A watch counted open on its connection until this is dropped (with the watch's response body, or with the
/// request when it fails).
struct OpenWatch(Arc<Shared>);

impl OpenWatch {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.open_watches.fetch_add(1, Ordering::AcqRel);
        Self(shared.clone())
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.0.open_watches.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Shared {
    /// A request handle of the open connection (`None`: none yet, or it ended).
    fn open(&self) -> Option<h2::client::SendRequest<Bytes>> {
        let held = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        held.as_ref()
            .filter(|open| !open.closed.load(Ordering::Acquire))
            .map(|open| open.sender.clone())
    }

    /// A request handle of the open connection, connecting first if there is none.
    async fn connect(&self) -> Result<h2::client::SendRequest<Bytes>, BoxError> {
        let _one = self.connecting.lock().await;
        if let Some(sender) = self.open() {
            return Ok(sender);
        }
        let io = tower::ServiceExt::oneshot(self.connector.clone(), self.server.clone()).await?;
        let (sender, mut connection) = h2::client::Builder::new()
            .initial_window_size(2 << 20)
            .initial_connection_window_size(5 << 20)
            .max_frame_size(16 << 10)
            .max_header_list_size(16 << 10)
            .max_send_buffer_size(1 << 20)
            // no dynamic table for the server's response headers: a connection's decoder then keeps none (its
            // entries would be the headers every response repeats), for a few bytes more per response
            .header_table_size(0)
            .enable_push(false)
            .handshake::<_, Bytes>(TokioIo::new(io))
            .await?;
        let closed = Arc::new(AtomicBool::new(false));
        let ended = closed.clone();
        let ping_pong = connection.ping_pong();
        tokio::spawn(async move {
            tokio::select! {
                result = connection => {
                    if let Err(error) = result {
                        tracing::debug!(%error, "API server connection ended");
                    }
                }
                () = keep_alive(ping_pong) => {
                    tracing::debug!("a keep-alive ping went unanswered; API server connection given up");
                }
            }
            ended.store(true, Ordering::Release);
        });
        *self.open.lock().unwrap_or_else(PoisonError::into_inner) = Some(Open {
            sender: sender.clone(),
            closed,
        });
        Ok(sender)
    }
}

/// Pings every [`KEEP_ALIVE`]; returns when a ping is not answered within [`KEEP_ALIVE_TIMEOUT`] or fails.
async fn keep_alive(ping_pong: Option<h2::PingPong>) {
    let Some(mut ping_pong) = ping_pong else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(KEEP_ALIVE).await;
        match tokio::time::timeout(KEEP_ALIVE_TIMEOUT, ping_pong.ping(h2::Ping::opaque())).await {
            Ok(Ok(_pong)) => {}
            Ok(Err(_)) | Err(_) => return,
        }
    }
}

/// Drops the headers HTTP/2 forbids (RFC 9113 §8.2.2): connection-specific ones, and `te` other than
/// `trailers`.
fn strip_connection_headers(headers: &mut HeaderMap) {
    for name in [CONNECTION, TRANSFER_ENCODING, UPGRADE] {
        headers.remove(name);
    }
    for name in ["keep-alive", "proxy-connection"] {
        headers.remove(name);
    }
    if headers.get(TE).is_some_and(|te| te != "trailers") {
        headers.remove(TE);
    }
}

/// The body's bytes if it is whole in memory (kube builds every API request's body so): `Err` gives a body
/// that must be read first back.
fn whole(body: Body) -> Result<Bytes, Body> {
    match body.try_clone() {
        Some(once) => match futures::FutureExt::now_or_never(once.collect_bytes()) {
            Some(Ok(bytes)) => Ok(bytes),
            _ => Err(body),
        },
        None => Err(body),
    }
}

impl tower::Service<Request<Body>> for H2Connection {
    type Response = Response<RecvBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<RecvBody>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // a request waits for its permit in its own future, in order
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let shared = self.shared.clone();
        // counted at once: a pool choosing the connection with the fewest watches sees it before the next choice
        let watch = is_watch(request.uri()).then(|| OpenWatch::new(&shared));
        let (mut head, body) = request.into_parts();
        strip_connection_headers(&mut head.headers);
        let body = whole(body);
        Box::pin(async move {
            let data = match body {
                Ok(data) => data,
                // not reached through kube's API calls; read in a box of its own so it costs nothing otherwise
                Err(body) => Box::pin(body.collect_bytes()).await?,
            };
            // the semaphore is never closed
            let permit = shared.permits.acquire().await?;
            let sender = match shared.open() {
                Some(sender) => sender,
                None => Box::pin(shared.connect()).await?,
            };
            // a fresh handle has no stream of its own waiting to open, so this waits only on a closing connection
            let mut sender = sender.ready().await?;
            let response = {
                let (response, mut stream) =
                    sender.send_request(Request::from_parts(head, ()), data.is_empty())?;
                if !data.is_empty() {
                    stream.send_data(data, true)?;
                }
                response
            };
            drop(sender);
            let response = response.await;
            drop(permit);
            Ok(response?.map(|recv| RecvBody { recv, _watch: watch }))
        })
    }
}

/// A response body read from its HTTP/2 stream; each chunk read gives its bytes back to the stream's and the
/// connection's flow-control windows.
pub struct RecvBody {
    recv: h2::RecvStream,
    /// A watch's place in its connection's count of open watches.
    _watch: Option<OpenWatch>,
}

impl http_body::Body for RecvBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        match self.recv.poll_data(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Ok(data))) => {
                let _ = self.recv.flow_control().release_capacity(data.len());
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error))),
            Poll::Ready(None) => {}
        }
        match self.recv.poll_trailers(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(Some(trailers))) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Poll::Ready(Ok(None)) => Poll::Ready(None),
            Poll::Ready(Err(error)) => Poll::Ready(Some(Err(error))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::{BodyExt, Full};
    use hyper::body::Incoming;
    use hyper::server::conn::http2;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use tower::ServiceExt;

    use super::*;

    /// An HTTP/2 server (prior knowledge, no TLS) answering every request with the number of the connection
    /// it came on; the serving task of each connection is sent to `conns` so a test can cut it.
    async fn server() -> (
        Uri,
        tokio::sync::mpsc::UnboundedReceiver<tokio::task::JoinHandle<()>>,
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let accepted = Arc::new(AtomicUsize::new(0));
            while let Ok((stream, _)) = listener.accept().await {
                let n = accepted.fetch_add(1, Ordering::SeqCst) + 1;
                let service = hyper::service::service_fn(move |req: Request<Incoming>| async move {
                    let answer = match req.uri().path() {
                        // 6 MiB: more than the stream's and the connection's flow-control windows
                        "/big" => Bytes::from(vec![b'x'; 6 << 20]),
                        "/echo" => {
                            let body = req.into_body().collect().await?.to_bytes();
                            Bytes::from(format!("{} bytes", body.len()))
                        }
                        _ => Bytes::from(format!("connection {n}")),
                    };
                    Ok::<_, hyper::Error>(Response::new(Full::new(answer)))
                });
                let served = tokio::spawn(async move {
                    let _ = http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
                let _ = tx.send(served);
            }
        });
        (format!("http://{addr}").parse().unwrap(), rx)
    }

    /// A connection to a plain-HTTP/2 test server (prior knowledge, no TLS) with `in_flight` requests in
    /// flight at most.
    pub(crate) fn plain_connection(server: &Uri, in_flight: usize) -> H2Connection {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(
                rustls::ClientConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
            )
            .https_or_http()
            .enable_http2()
            .wrap_connector(http);
        H2Connection::new(https, server.clone(), in_flight)
    }

    fn connection(server: &Uri) -> H2Connection {
        plain_connection(server, 64)
    }

    async fn send(connection: &H2Connection, request: Request<Body>) -> Result<Bytes, BoxError> {
        let response = connection.clone().oneshot(request).await?;
        Ok(response.into_body().collect().await?.to_bytes())
    }

    async fn get(connection: &H2Connection, server: &Uri) -> Result<String, BoxError> {
        let request = Request::get(format!("{server}api")).body(Body::empty()).unwrap();
        let body = send(connection, request).await?;
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn bodies_larger_than_the_flow_control_windows_go_both_ways() {
        let (server, _conns) = server().await;
        let connection = connection(&server);
        let guard = Duration::from_secs(60);
        // a request body past the server's 64 KiB initial window, sent whole
        let upload = Request::post(format!("{server}echo"))
            .header("connection", "keep-alive")
            .body(Body::from(vec![7u8; 3 << 20]))
            .unwrap();
        let echoed = tokio::time::timeout(guard, send(&connection, upload))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(echoed, "3145728 bytes");
        // two responses past the client's stream and connection windows, read one after the other: each read
        // gives its window back, or the second would stall
        for _ in 0..2 {
            let download = Request::get(format!("{server}big")).body(Body::empty()).unwrap();
            let body = tokio::time::timeout(guard, send(&connection, download))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(body.len(), 6 << 20);
        }
    }

    #[tokio::test]
    async fn requests_share_one_connection_and_a_closed_one_is_made_again() {
        let (server, mut conns) = server().await;
        let connection = connection(&server);
        // requests that arrive together before there is a connection make one between them
        let answers = futures::future::join_all((0..8).map(|_| get(&connection, &server))).await;
        for answer in answers {
            assert_eq!(answer.unwrap(), "connection 1");
        }
        assert_eq!(get(&connection, &server).await.unwrap(), "connection 1");
        // the server cuts the connection: once the client has seen it close, the next request makes a new one
        conns.recv().await.unwrap().abort();
        while connection.shared.open().is_some() {
            tokio::task::yield_now().await;
        }
        assert_eq!(get(&connection, &server).await.unwrap(), "connection 2");
        assert_eq!(get(&connection, &server).await.unwrap(), "connection 2");
    }

    #[tokio::test]
    async fn at_most_in_flight_requests_wait_for_headers_and_the_rest_wait_their_turn() {
        // a server that answers a request only when the test lets it, counting the requests that reached it
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server: Uri = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let arrived = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        let (seen, gate) = (arrived.clone(), release.clone());
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let service = hyper::service::service_fn(move |_req: Request<Incoming>| {
                let (seen, gate) = (seen.clone(), gate.clone());
                async move {
                    seen.fetch_add(1, Ordering::SeqCst);
                    gate.acquire().await.unwrap().forget();
                    Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from("done"))))
                }
            });
            let _ = http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        let connection = plain_connection(&server, 2);
        let requests: Vec<_> = (0..5)
            .map(|_| {
                let (connection, server) = (connection.clone(), server.clone());
                tokio::spawn(async move { get(&connection, &server).await.unwrap() })
            })
            .collect();
        let guard = Duration::from_secs(30);
        let until = |n: usize| {
            let arrived = arrived.clone();
            tokio::time::timeout(guard, async move {
                while arrived.load(Ordering::SeqCst) < n {
                    tokio::task::yield_now().await;
                }
            })
        };
        until(2).await.unwrap();
        // both permits are taken: the other three wait for one, unsent
        assert_eq!(connection.shared.permits.available_permits(), 0);
        assert_eq!(arrived.load(Ordering::SeqCst), 2);
        // an answer lets the next one through
        release.add_permits(1);
        until(3).await.unwrap();
        release.add_permits(4);
        for request in requests {
            assert_eq!(
                tokio::time::timeout(guard, request).await.unwrap().unwrap(),
                "done"
            );
        }
        assert_eq!(arrived.load(Ordering::SeqCst), 5);
        assert_eq!(connection.shared.permits.available_permits(), 2);
    }

    #[tokio::test]
    async fn a_server_that_is_not_there_is_an_error_not_a_hang() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server: Uri = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        drop(listener);
        let connection = connection(&server);
        assert!(get(&connection, &server).await.is_err());
    }
}
