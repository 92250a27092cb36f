//! The fleet's HTTP/2 connections behind one tower service, so that every agent's requests go through one
//! `kube::Client`.
//!
//! A `kube::Client` puts a `tower` buffer in front of its service: a channel of up to 1,024 requests and a task
//! that hands them on, a sizeable allocation that a client per connection would repeat on every connection.
//! Here the connections of a fleet share one client, and this service picks the connection:
//!
//! * a watch (`watch=true`) goes to the watch connection with the fewest open watches, counted from when it is
//!   sent until its response body is dropped ([`H2Connection::open_watches`]), so each carries its share and
//!   stays under the API server's stream cap when the pool was sized for it;
//! * any other request goes to the next request connection in turn. A watch's LIST is such a request: the
//!   watch connections carry watches only, and their stream tables stay at the size their watches need.
//!
//! Each connection still lets at most its `in_flight` requests wait for response headers at a time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use http::{Request, Response};
use kube::client::Body;

use crate::h2_connection::{H2Connection, RecvBody, is_watch};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Request connections and watch connections behind one service (cheap to clone).
#[derive(Clone)]
pub struct Connections {
    shared: Arc<Lanes>,
}

struct Lanes {
    requests: Box<[H2Connection]>,
    watches: Box<[H2Connection]>,
    /// The request connection the next request goes to (modulo their number).
    next: AtomicUsize,
}

impl Connections {
    /// `requests` for short requests, `watches` for watches; a list left empty takes the other's connections
    /// (one connection may carry both). `None` when both are empty.
    pub fn new(requests: Vec<H2Connection>, watches: Vec<H2Connection>) -> Option<Self> {
        let (requests, watches) = match (requests.is_empty(), watches.is_empty()) {
            (true, true) => return None,
            (true, false) => (watches.clone(), watches),
            (false, true) => (requests.clone(), requests),
            (false, false) => (requests, watches),
        };
        Some(Self {
            shared: Arc::new(Lanes {
                requests: requests.into(),
                watches: watches.into(),
                next: AtomicUsize::new(0),
            }),
        })
    }

    /// The connection `request` goes to.
    fn pick(&self, request: &Request<Body>) -> &H2Connection {
        let lanes = &self.shared;
        if is_watch(request.uri()) {
            // the first of the least watched: with none closed, connections fill evenly in order
            lanes
                .watches
                .iter()
                .min_by_key(|c| c.open_watches())
                .unwrap_or(&lanes.watches[0])
        } else {
            let i = lanes.next.fetch_add(1, Ordering::Relaxed) % lanes.requests.len();
            &lanes.requests[i]
        }
    }
}

impl tower::Service<Request<Body>> for Connections {
    type Response = Response<RecvBody>;
    type Error = BoxError;
    type Future = <H2Connection as tower::Service<Request<Body>>>::Future;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // every connection is always ready: a request waits for its turn in its own future
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let mut connection = self.pick(&request).clone();
        connection.call(request)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use futures::StreamExt;
    use http_body::Frame;
    use http_body_util::{BodyExt, Full, StreamBody};
    use hyper::body::Incoming;
    use hyper::server::conn::http2;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use tower::ServiceExt;

    use super::*;

    /// An HTTP/2 server (prior knowledge, no TLS) answering every request with the number of the connection it
    /// came on; a watch (`watch=true`) gets its headers and then a body that never ends.
    async fn server() -> http::Uri {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut accepted = 0;
            while let Ok((stream, _)) = listener.accept().await {
                accepted += 1;
                let n = accepted;
                let service = hyper::service::service_fn(move |req: Request<Incoming>| async move {
                    let answer = Bytes::from(format!("connection {n}"));
                    let body = if is_watch(req.uri()) {
                        let first =
                            futures::stream::once(async move { Ok::<_, hyper::Error>(Frame::data(answer)) });
                        BodyExt::boxed(StreamBody::new(first.chain(futures::stream::pending())))
                    } else {
                        Full::new(answer)
                            .map_err(|e: std::convert::Infallible| -> hyper::Error { match e {} })
                            .boxed()
                    };
                    Ok::<_, hyper::Error>(Response::new(body))
                });
                tokio::spawn(async move {
                    let _ = http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        format!("http://{addr}").parse().unwrap()
    }

    fn connection(server: &http::Uri) -> H2Connection {
        crate::h2_connection::tests::plain_connection(server, 64)
    }

    /// Sends a request for `path`; the first chunk of its body, and the body (a watch's stays open while held).
    async fn first_chunk(connections: &Connections, server: &http::Uri, path: &str) -> (String, RecvBody) {
        let request = Request::get(format!("{server}{path}"))
            .body(Body::empty())
            .unwrap();
        let response = tokio::time::timeout(Duration::from_secs(30), connections.clone().oneshot(request))
            .await
            .unwrap()
            .unwrap();
        let mut body = response.into_body();
        let chunk = body.frame().await.unwrap().unwrap().into_data().unwrap();
        (String::from_utf8_lossy(&chunk).into_owned(), body)
    }

    #[tokio::test]
    async fn watches_spread_over_the_watch_connections_and_requests_take_the_others_in_turn() {
        let server = server().await;
        let (requests, watches) = (
            vec![connection(&server), connection(&server)],
            vec![connection(&server), connection(&server), connection(&server)],
        );
        let connections = Connections::new(requests, watches.clone()).unwrap();
        // six watches: two on each watch connection, held open
        let mut open = Vec::new();
        let mut seen = std::collections::BTreeMap::<String, usize>::new();
        for _ in 0..6 {
            let (answer, body) = first_chunk(&connections, &server, "api/v1/pods?watch=true").await;
            *seen.entry(answer).or_default() += 1;
            open.push(body);
        }
        assert_eq!(seen.len(), 3, "three watch connections used: {seen:?}");
        assert!(seen.values().all(|&n| n == 2), "two watches each: {seen:?}");
        assert!(watches.iter().all(|c| c.open_watches() == 2));
        // a watch ended (its body dropped) leaves room where it was: the next watch goes there
        let ended = open.remove(0);
        drop(ended);
        let emptier = watches.iter().position(|c| c.open_watches() == 1).unwrap();
        let (_, body) = first_chunk(&connections, &server, "api/v1/nodes?watch=1").await;
        assert_eq!(watches[emptier].open_watches(), 2);
        open.push(body);
        // other requests (a watch's LIST among them) alternate over the two request connections, none on a
        // watch connection (their connection numbers come after the watch connections' in this server's count)
        let mut answers = Vec::new();
        for _ in 0..4 {
            answers.push(
                first_chunk(&connections, &server, "api/v1/pods?limit=500")
                    .await
                    .0,
            );
        }
        assert_eq!(answers[0], answers[2]);
        assert_eq!(answers[1], answers[3]);
        assert_ne!(answers[0], answers[1]);
        assert!(
            seen.keys().all(|w| !answers.contains(w)),
            "{answers:?} vs watches {seen:?}"
        );
    }

    #[tokio::test]
    async fn one_connection_may_carry_both() {
        let server = server().await;
        let only = connection(&server);
        let connections = Connections::new(vec![only.clone()], Vec::new()).unwrap();
        let (answer, _watch) = first_chunk(&connections, &server, "api/v1/pods?watch=true").await;
        let (other, _) = first_chunk(&connections, &server, "api/v1/pods").await;
        assert_eq!(answer, other);
        assert_eq!(only.open_watches(), 1);
        assert!(Connections::new(Vec::new(), Vec::new()).is_none());
    }
}
