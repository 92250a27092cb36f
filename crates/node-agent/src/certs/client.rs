//! An API client whose TLS client certificate can be replaced while it is in use.
//!
//! A client certificate authenticates a connection, not a request, so a new certificate needs new
//! connections. The client here sends every request through the connection pool current at the time of the
//! request; [`IdentitySwitch::install`] builds a pool for the new certificate and makes it current. Requests
//! and watches already under way finish on the connections they started on (a watch ends within the API
//! server's watch timeout and is reopened by its watcher on the new pool); nothing is cut off, and the old
//! connections close once their last stream ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine;
use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{Body, ConfigExt};
use tower::ServiceBuilder;

use super::{CertError, CertPair};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Pool = HyperClient<TimeoutConnector<hyper_rustls::HttpsConnector<HttpConnector>>, Body>;

/// Which HTTP the client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1, a connection per request in flight (as kube's default client).
    Http1,
    /// HTTP/2 only, all requests multiplexed over one connection.
    Http2,
}

/// `config` with its identity replaced by `pair`'s client certificate: every other credential of the original
/// (token, token file, basic auth, exec or auth-provider plugin, impersonation, an `Authorization` or
/// `Impersonate-*` extra header) is dropped; the server, its CA and the timeouts are kept.
pub fn with_identity(config: &kube::Config, cert_pem: &str, key_pem: &str) -> kube::Config {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut config = config.clone();
    config.auth_info = kube::config::AuthInfo {
        client_certificate_data: Some(b64.encode(cert_pem)),
        client_key_data: Some(b64.encode(key_pem).into()),
        ..Default::default()
    };
    config.headers.retain(|(name, _)| {
        let name = name.as_str();
        name != "authorization" && !name.starts_with("impersonate-")
    });
    config
}

fn pool(config: &kube::Config, protocol: Protocol) -> Result<Pool, kube::Error> {
    let tls = config.rustls_client_config()?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let mut client = HyperClient::builder(TokioExecutor::new());
    client.timer(TokioTimer::new()).pool_timer(TokioTimer::new());
    let https = match protocol {
        Protocol::Http1 => builder.enable_http1().wrap_connector(http),
        Protocol::Http2 => {
            client
                .http2_only(true)
                .http2_keep_alive_interval(Duration::from_secs(30))
                .http2_keep_alive_while_idle(true)
                .pool_max_idle_per_host(1);
            builder.enable_http2().wrap_connector(http)
        }
    };
    // kube's own client has these: a connection that goes silent under a watch is noticed
    let mut timed = TimeoutConnector::new(https);
    timed.set_connect_timeout(config.connect_timeout);
    timed.set_read_timeout(config.read_timeout);
    timed.set_write_timeout(config.write_timeout);
    Ok(client.build(timed))
}

/// Replaces the identity of the client it was made with (see the module documentation).
#[derive(Clone)]
pub struct IdentitySwitch {
    base: kube::Config,
    protocol: Protocol,
    current: Arc<RwLock<Pool>>,
    serial: Arc<RwLock<String>>,
}

impl std::fmt::Debug for IdentitySwitch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentitySwitch")
            .field("serial", &self.serial())
            .finish_non_exhaustive()
    }
}

impl IdentitySwitch {
    /// From now on requests authenticate with `pair`.
    pub fn install(&self, pair: &CertPair) -> Result<(), CertError> {
        let config = with_identity(&self.base, &pair.cert_pem, &pair.key_pem);
        let next = pool(&config, self.protocol)
            .map_err(|e| CertError::invalid(format!("client certificate {}", pair.serial), e))?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = next;
        *self.serial.write().unwrap_or_else(|p| p.into_inner()) = pair.serial.clone();
        Ok(())
    }

    /// The serial number of the certificate requests are sent with.
    pub fn serial(&self) -> String {
        self.serial.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[derive(Clone)]
struct Switched {
    current: Arc<RwLock<Pool>>,
}

impl tower::Service<hyper::Request<Body>> for Switched {
    type Response = hyper::Response<hyper::body::Incoming>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: hyper::Request<Body>) -> Self::Future {
        let pool = self.current.read().unwrap_or_else(|p| p.into_inner()).clone();
        Box::pin(async move { pool.request(request).await.map_err(BoxError::from) })
    }
}

/// A client for `config`'s server authenticating with `pair`, and the switch that replaces `pair` later.
pub fn switchable_client(
    config: &kube::Config,
    pair: &CertPair,
    protocol: Protocol,
) -> Result<(kube::Client, IdentitySwitch), CertError> {
    let bad = |e: kube::Error| CertError::invalid("building the API client", e);
    let base = with_identity(config, "", "");
    let first = pool(&with_identity(config, &pair.cert_pem, &pair.key_pem), protocol).map_err(bad)?;
    let current = Arc::new(RwLock::new(first));
    let service = ServiceBuilder::new()
        .layer(base.base_uri_layer())
        .layer(base.extra_headers_layer().map_err(bad)?)
        .service(Switched {
            current: current.clone(),
        });
    let client = kube::Client::new(service, base.default_namespace.clone());
    let switch = IdentitySwitch {
        base,
        protocol,
        current,
        serial: Arc::new(RwLock::new(pair.serial.clone())),
    };
    Ok((client, switch))
}
