//! One HTTP/2 connection to the API server as a tower service: what every pooled `kube::Client` of the fleet
//! sends its requests over.
//!
//! The pool's clients each hold a single connection (HTTP/2 multiplexes every request of the agents that share
//! it), so the general-purpose client of `hyper-util` — a pool of connections per host, a connect path raced
//! against an idle checkout — is more than they need, and it is paid per request: every request in flight
//! held that client's boxed request future, ~3.4 KiB (dhat, 10,000 idle nodes on a saturated API server:
//! ~2,400 requests in flight, 0.8 KiB per node). Here a request in flight holds hyper's own dispatch future
//! (a few dozen bytes, boxed) while the connection is up; only a request that finds it down or not yet made
//! waits in the (larger) future that connects.
//!
//! The connection is made on first use and again on the first request after it closed (the API server went
//! away, a keep-alive ping got no answer); requests already in flight on a connection that closes fail, and
//! their callers retry as they would after any failed request. Keep-alive pings every 30 s, idle or not.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http2::{Builder, SendRequest};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::Body;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How often an HTTP/2 ping checks the connection, whether requests are in flight or not.
const KEEP_ALIVE: Duration = Duration::from_secs(30);

/// A single HTTP/2 connection to `server`, made on first use and again after it closed; cheap to clone (the
/// clones share the connection).
#[derive(Clone)]
pub struct H2Connection {
    shared: Arc<Shared>,
}

struct Shared {
    connector: HttpsConnector<HttpConnector>,
    server: Uri,
    builder: Builder<TokioExecutor>,
    /// The open connection's sender, if there is one.
    sender: Mutex<Option<SendRequest<Body>>>,
    /// Held while connecting, so that requests arriving meanwhile wait for one connection, not make several.
    connecting: tokio::sync::Mutex<()>,
}

impl H2Connection {
    /// A connection to `server` made through `connector` (which must negotiate `h2`).
    pub fn new(connector: HttpsConnector<HttpConnector>, server: Uri) -> Self {
        let mut builder = Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .keep_alive_interval(KEEP_ALIVE)
            .keep_alive_while_idle(true);
        Self {
            shared: Arc::new(Shared {
                connector,
                server,
                builder,
                sender: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
            }),
        }
    }
}

impl Shared {
    /// The open connection's sender (`None`: none yet, or it closed).
    fn open(&self) -> Option<SendRequest<Body>> {
        let held = self.sender.lock().unwrap_or_else(PoisonError::into_inner);
        held.as_ref().filter(|s| !s.is_closed()).cloned()
    }

    /// The open connection's sender, connecting first if there is none.
    async fn connect(&self) -> Result<SendRequest<Body>, BoxError> {
        let _one = self.connecting.lock().await;
        if let Some(sender) = self.open() {
            return Ok(sender);
        }
        let io = tower::ServiceExt::oneshot(self.connector.clone(), self.server.clone()).await?;
        let (sender, connection) = self.builder.handshake(io).await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "API server connection closed");
            }
        });
        *self.sender.lock().unwrap_or_else(PoisonError::into_inner) = Some(sender.clone());
        Ok(sender)
    }
}

impl tower::Service<Request<Body>> for H2Connection {
    type Response = Response<Incoming>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Incoming>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // HTTP/2 queues streams past the server's limit itself; the pool caps requests in flight in front of this
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        if let Some(mut sender) = self.shared.open() {
            let sent = sender.send_request(request);
            return Box::pin(async move { Ok(sent.await?) });
        }
        let shared = self.shared.clone();
        Box::pin(async move {
            let mut sender = shared.connect().await?;
            Ok(sender.send_request(request).await?)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::{BodyExt, Full};
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
                let service = hyper::service::service_fn(move |_req: Request<Incoming>| async move {
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(hyper::body::Bytes::from(
                        format!("connection {n}"),
                    ))))
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

    fn connection(server: &Uri) -> H2Connection {
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
        H2Connection::new(https, server.clone())
    }

    async fn get(connection: &H2Connection, server: &Uri) -> Result<String, BoxError> {
        let request = Request::get(format!("{server}api")).body(Body::empty()).unwrap();
        let response = connection.clone().oneshot(request).await?;
        let body = response.into_body().collect().await?.to_bytes();
        Ok(String::from_utf8_lossy(&body).into_owned())
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
