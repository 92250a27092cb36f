//! The proxy between a client's stream request and the container runtime's streaming server: the upgrade
//! request passed on (hop-by-hop and credential headers dropped), the runtime's answer passed back, and after a
//! 101 the two upgraded connections spliced byte for byte until one side closes.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{StatusCode, Uri, header};
use axum::response::Response;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;

use super::respond::error;

/// Hop-by-hop headers a proxy does not pass on, except the upgrade pair that makes the stream.
fn forwarded(name: &header::HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "host"
            | "authorization"
            | "proxy-authorization"
            | "keep-alive"
            | "te"
            | "trailer"
            | "transfer-encoding"
    )
}

/// Proxies the client's (upgrade) request to the runtime's stream `url`; after a 101 both connections are
/// spliced until one closes.
pub(super) async fn proxy_stream(mut req: Request, url: &str) -> Response {
    let upgrade = req
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    if !upgrade {
        return error(StatusCode::BAD_REQUEST, "Upgrade request required");
    }
    let target: Uri = match url.parse() {
        Ok(u) => u,
        Err(e) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the runtime's stream URL {url:?}: {e}"),
            );
        }
    };
    if target.scheme_str() != Some("http") {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the runtime's stream URL {url:?}: only http:// streaming servers are supported"),
        );
    }
    let Some(authority) = target.authority().cloned() else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the runtime's stream URL {url:?} names no server"),
        );
    };
    let port = authority.port_u16().unwrap_or(80);
    let tcp = match tokio::net::TcpStream::connect((authority.host(), port)).await {
        Ok(t) => t,
        Err(e) => {
            return error(
                StatusCode::BAD_GATEWAY,
                format!("connecting to the runtime's streaming server {authority}: {e}"),
            );
        }
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await {
        Ok(pair) => pair,
        Err(e) => {
            return error(
                StatusCode::BAD_GATEWAY,
                format!("streaming server {authority}: {e}"),
            );
        }
    };
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "runtime stream connection ended");
        }
    });
    let client_upgrade = hyper::upgrade::on(&mut req);
    let path = target.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let mut upstream = hyper::Request::builder().method(req.method().clone()).uri(path);
    for (name, value) in req.headers() {
        if forwarded(name) {
            upstream = upstream.header(name, value);
        }
    }
    upstream = upstream.header(header::HOST, authority.as_str());
    let upstream = match upstream.body(http_body_util::Empty::<hyper::body::Bytes>::new()) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let mut answer = match sender.send_request(upstream).await {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_GATEWAY,
                format!("streaming server {authority}: {e}"),
            );
        }
    };
    let status = answer.status();
    let mut resp = Response::builder().status(status);
    for (name, value) in answer.headers() {
        resp = resp.header(name, value);
    }
    if status != StatusCode::SWITCHING_PROTOCOLS {
        // the runtime's refusal (bad command, no such container, ...) goes back as it came
        let body = match answer.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                return error(
                    StatusCode::BAD_GATEWAY,
                    format!("streaming server {authority}: {e}"),
                );
            }
        };
        return resp
            .body(Body::from(body))
            .unwrap_or_else(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()));
    }
    let runtime_upgrade = hyper::upgrade::on(&mut answer);
    tokio::spawn(async move {
        let (client, runtime) = match tokio::join!(client_upgrade, runtime_upgrade) {
            (Ok(c), Ok(r)) => (c, r),
            (Err(e), _) | (_, Err(e)) => {
                tracing::debug!(error = %e, "stream upgrade failed");
                return;
            }
        };
        let (mut client, mut runtime) = (TokioIo::new(client), TokioIo::new(runtime));
        match tokio::io::copy_bidirectional(&mut client, &mut runtime).await {
            Ok((up, down)) => tracing::debug!(up, down, "stream closed"),
            Err(e) => tracing::debug!(error = %e, "stream ended"),
        }
    });
    resp.body(Body::empty())
        .unwrap_or_else(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}
