//! API clients for the fleet: a small pool of HTTP/2 connections that every agent's requests and watches are
//! multiplexed over.
//!
//! `kube::Client::try_from(config)` speaks HTTP/1.1 only, so a thousand agents each holding a watch would hold
//! a thousand TCP+TLS connections. Here each pooled client is a `kube::Client` over a hyper client that speaks
//! only HTTP/2 (ALPN `h2`, set by the connector), built from kube's own TLS configuration, base-URI and auth layers. Agent `i` uses
//! client `i % K`. The API server caps concurrent streams per connection
//! (`--http2-max-streams-per-connection`); a watch holds its stream for its lifetime, so size K so that
//! `agents / K` stays well below that cap: measured here, 1,000 agents on 2 connections stalled at 774
//! registered (requests queued behind a full stream budget), on 8 connections all were Ready within 40 s.
//! [`pool_size`] applies a per-connection bound.

use std::time::Duration;

use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{Body, ConfigExt};
use tower::ServiceBuilder;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Errors building pooled clients.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// kube could not build TLS or auth from the configuration.
    #[error("building the API client: {0}")]
    Kube(#[source] kube::Error),
    /// A pool needs at least one connection.
    #[error("the client pool needs at least one connection")]
    Empty,
}

/// One `kube::Client` speaking HTTP/2 only over a single connection pool.
pub fn http2_client(config: &kube::Config) -> Result<kube::Client, PoolError> {
    let tls = config.rustls_client_config().map_err(PoolError::Kube)?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http2()
        .wrap_connector(http);
    let hyper: HyperClient<_, Body> = HyperClient::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_only(true)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .http2_keep_alive_while_idle(true)
        .pool_max_idle_per_host(1)
        .build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().map_err(PoolError::Kube)?)
        .layer(config.extra_headers_layer().map_err(PoolError::Kube)?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}

/// How many connections a fleet of `nodes` uses: `explicit` when non-zero, else enough that no connection
/// carries more than `per_connection` nodes.
pub fn pool_size(nodes: usize, explicit: usize, per_connection: usize) -> usize {
    if explicit > 0 {
        return explicit;
    }
    nodes.div_ceil(per_connection.max(1)).max(1)
}

/// A fixed set of HTTP/2 clients; agents are sharded over them by index.
#[derive(Clone)]
pub struct ClientPool {
    clients: Vec<kube::Client>,
}

impl ClientPool {
    /// `size` HTTP/2 clients for the same configuration (each opens its own connection).
    pub fn new(config: &kube::Config, size: usize) -> Result<Self, PoolError> {
        if size == 0 {
            return Err(PoolError::Empty);
        }
        let clients = (0..size)
            .map(|_| http2_client(config))
            .collect::<Result<_, _>>()?;
        Ok(Self { clients })
    }

    /// The client agent number `index` uses.
    pub fn for_agent(&self, index: usize) -> kube::Client {
        self.clients[index % self.clients.len()].clone()
    }

    /// How many connections the pool holds.
    pub fn len(&self) -> usize {
        self.clients.len()
    }

    /// Whether the pool is empty (never, once built).
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::pool_size;

    #[test]
    fn pool_size_bounds_agents_per_connection() {
        assert_eq!(pool_size(1000, 0, 200), 5);
        assert_eq!(pool_size(1001, 0, 200), 6);
        assert_eq!(pool_size(10, 0, 200), 1);
        assert_eq!(pool_size(0, 0, 200), 1);
        assert_eq!(pool_size(10_000, 3, 200), 3, "an explicit size wins");
    }
}
