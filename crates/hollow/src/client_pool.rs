//! API clients for the fleet: a small pool of HTTP/2 connections that every agent's requests and watches are
//! multiplexed over.
//!
//! `kube::Client::try_from(config)` speaks HTTP/1.1 only, so a thousand agents each holding a watch would hold
//! a thousand TCP+TLS connections. Here the fleet's agents share one `kube::Client` over a few HTTP/2
//! connections ([`H2Connection`]: ALPN `h2`, set by the connector; [`Connections`] picks one per request),
//! built from kube's own TLS configuration, base-URI and auth layers.
//!
//! The API server advertises at most 100 concurrent streams per HTTP/2 connection
//! (`--http2-max-streams-per-connection`, 100 by default), and a
//! client queues any further request until a stream closes. A watch holds its stream for its whole life, so
//! one connection carrying 100 agents' pod watches has no stream left for anything else: every request on it
//! (registrations, lease renewals) waits forever. The pool therefore keeps two kinds of connection:
//!
//! * request connections carry the short requests, one `agents_per_connection` agents' worth each, taken in
//!   turn (queueing there only adds latency, every stream ends); a watch's LIST is such a request;
//! * watch connections carry the per-node watches — each node's pod watch and the watch of its own Node
//!   object — each watch on the connection with the fewest, at most `watches_per_connection` per connection
//!   when the pool is sized for the fleet, well under the server's cap.
//!
//! In `shared` watch mode there is one pod watch for the whole process; the per-node Node watches remain.
//!
//! With per-node credentials ([`ClientPool::per_node`]) none of that sharing is possible: a TLS client
//! certificate authenticates a connection, not a request, so every node gets a client and one HTTP/2
//! connection of its own, carrying its requests and its one pod watch (a watch takes 1 of the server's 100
//! streams). That costs a TCP+TLS connection with its buffers per node, on both sides, where shared
//! credentials put ~200 nodes' requests on one connection and 48 nodes' watches on another.

use hyper_util::client::legacy::connect::HttpConnector;
use kube::client::ConfigExt;
use node_agent::client::ApiClient;
use tower::ServiceBuilder;

use crate::connections::Connections;
use crate::credentials::{CredentialsError, NodeCa, NodeCredential};
use crate::h2_connection::H2Connection;

/// Errors building pooled clients.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// kube could not build TLS or auth from the configuration.
    #[error("building the API client: {0}")]
    Kube(#[source] kube::Error),
    /// A pool needs at least one connection.
    #[error("the client pool needs at least one connection")]
    Empty,
    /// A node's credentials could not be minted.
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
}

/// `config` with its identity replaced by `credential`'s client certificate (every other credential of the
/// original dropped; the server, its CA and the timeouts kept).
pub fn with_node_identity(config: &kube::Config, credential: &NodeCredential) -> kube::Config {
    node_agent::certs::client::with_identity(config, &credential.cert_pem, &credential.key_pem)
}

/// By default at most this many requests of one pooled connection are in flight (sent, waiting for their
/// response headers) at a time; the rest wait their turn, in order, before they reach the connection
/// (`--requests-in-flight-per-connection`).
///
/// An HTTP/2 connection keeps a table entry per open stream and buffers the frames of streams waiting to open,
/// in tables that grow to their peak and never shrink. Without a cap, a thousand agents starting at once put a
/// thousand requests on a handful of connections, and the tables stay sized for that burst for the fleet's
/// life. A watch holds its permit only until its response starts, so the cap never holds watches back; it is
/// under the API server's 100 streams.
///
/// A lower cap trades the other way (docs/density.md, "The HTTP/2 client pool"): a request in flight holds more
/// in this process than one waiting in the queue, so a lower cap holds less per node while the API server is
/// saturated; but during a burst of pod starts on a control plane that keeps up it lets requests pile up in the
/// queue with their bodies, which costs more per running pod. The default favours the burst.
pub const REQUESTS_IN_FLIGHT: usize = 64;

/// One `kube::Client` speaking HTTP/2 only over a single connection, which carries its requests and watches.
pub fn http2_client(config: &kube::Config, in_flight: usize) -> Result<kube::Client, PoolError> {
    let tls = config.rustls_client_config().map_err(PoolError::Kube)?;
    client_over(config, tls, 1, 0, in_flight)
}

/// One HTTP/2 connection to the configuration's server; `tls` is built once for all the connections of one
/// identity, so that they share one session-resumption cache rather than each building its own.
fn connection(config: &kube::Config, tls: rustls::ClientConfig, in_flight: usize) -> H2Connection {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http2()
        .wrap_connector(http);
    H2Connection::new(https, config.cluster_url.clone(), in_flight)
}

/// One `kube::Client` over `requests` request connections and `watches` watch connections (0: the watches share
/// the request connections), each with at most `in_flight` requests in flight; see [`Connections`].
fn client_over(
    config: &kube::Config,
    tls: rustls::ClientConfig,
    requests: usize,
    watches: usize,
    in_flight: usize,
) -> Result<kube::Client, PoolError> {
    let make = |n: usize| {
        (0..n)
            .map(|_| connection(config, tls.clone(), in_flight))
            .collect::<Vec<_>>()
    };
    let connections = Connections::new(make(requests), make(watches)).ok_or(PoolError::Empty)?;
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().map_err(PoolError::Kube)?)
        .layer(config.extra_headers_layer().map_err(PoolError::Kube)?)
        .service(connections);
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}

/// How a fleet's connections are sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLimits {
    /// Request connections; 0 sizes them from `agents_per_connection`.
    pub request_connections: usize,
    /// At most this many agents' requests share one connection (when `request_connections` is 0).
    pub agents_per_connection: usize,
    /// At most this many per-node watches share one connection; keep it under the server's stream cap.
    pub watches_per_connection: usize,
    /// At most this many requests of one connection in flight at a time ([`REQUESTS_IN_FLIGHT`]).
    pub in_flight: usize,
}

impl Default for PoolLimits {
    fn default() -> Self {
        Self {
            request_connections: 0,
            agents_per_connection: 200,
            // under the server's 100 streams, and most of the 128 entries each connection's stream table
            // grows to once it holds more than 64: fewer would leave part of every table empty and need more
            // connections for the same watches
            watches_per_connection: 96,
            in_flight: REQUESTS_IN_FLIGHT,
        }
    }
}

/// The connection counts for one fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSize {
    /// Connections for short requests.
    pub request_connections: usize,
    /// Connections for pod watches.
    pub watch_connections: usize,
    /// Requests in flight per connection.
    pub in_flight: usize,
}

impl PoolSize {
    /// Connections for `nodes` agents: every node holds a watch of its Node object, and per-node pod watches
    /// one more; a shared pod watch is one watch for all.
    pub fn for_fleet(nodes: usize, per_node_watches: bool, limits: PoolLimits) -> Self {
        let request_connections = if limits.request_connections > 0 {
            limits.request_connections
        } else {
            nodes.div_ceil(limits.agents_per_connection.max(1)).max(1)
        };
        let watches = if per_node_watches {
            nodes.saturating_mul(2)
        } else {
            nodes.saturating_add(1)
        };
        let watch_connections = watches.div_ceil(limits.watches_per_connection.max(1)).max(1);
        Self {
            request_connections,
            watch_connections,
            in_flight: limits.in_flight.max(1),
        }
    }
}

/// The fleet's API clients: one over a fixed set of HTTP/2 connections that every agent shares, or, per node,
/// one each.
#[derive(Clone)]
pub struct ClientPool {
    // shared credentials: one client (every agent holds a handle on it); per node: agent `i`'s is `clients[i]`
    clients: Vec<ApiClient>,
    per_node: bool,
    size: PoolSize,
    fleet: kube::Client,
}

impl ClientPool {
    /// One client for the same configuration over `size`'s request and watch connections.
    pub fn new(config: &kube::Config, size: PoolSize) -> Result<Self, PoolError> {
        if size.request_connections == 0 || size.watch_connections == 0 {
            return Err(PoolError::Empty);
        }
        let tls = config.rustls_client_config().map_err(PoolError::Kube)?;
        let client = client_over(
            config,
            tls,
            size.request_connections,
            size.watch_connections,
            size.in_flight,
        )?;
        Ok(Self {
            fleet: client.clone(),
            clients: vec![ApiClient::new(client)],
            per_node: false,
            size: PoolSize {
                in_flight: size.in_flight.max(1),
                ..size
            },
        })
    }

    /// One HTTP/2 client per node, each authenticated as that node's kubelet (`system:node:<name>` in
    /// `system:nodes`) with a client certificate minted from `ca`; agent `i` is `names[i]`. The node's
    /// requests and its pod watch share its one connection, with at most `in_flight` requests in flight.
    /// [`ClientPool::fleet_client`] keeps the identity of `config` itself.
    pub fn per_node(
        config: &kube::Config,
        names: &[String],
        ca: &NodeCa,
        in_flight: usize,
    ) -> Result<Self, PoolError> {
        let credentials = names
            .iter()
            .map(|name| ca.issue(name))
            .collect::<Result<Vec<_>, _>>()?;
        Self::per_node_with(config, &credentials, in_flight)
    }

    /// As [`ClientPool::per_node`], with certificates obtained elsewhere (TLS bootstrap): agent `i` is
    /// `credentials[i]`'s node.
    pub fn per_node_with(
        config: &kube::Config,
        credentials: &[NodeCredential],
        in_flight: usize,
    ) -> Result<Self, PoolError> {
        if credentials.is_empty() {
            return Err(PoolError::Empty);
        }
        let clients = credentials
            .iter()
            .map(|credential| {
                http2_client(&with_node_identity(config, credential), in_flight).map(ApiClient::new)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            size: PoolSize {
                request_connections: clients.len(),
                watch_connections: 0,
                in_flight: in_flight.max(1),
            },
            clients,
            per_node: true,
            fleet: http2_client(config, in_flight)?,
        })
    }

    /// A client with the configuration's own identity, for requests on behalf of the fleet rather than of a
    /// node (deleting Node objects on exit: the Node authorizer does not let a node delete even its own).
    /// Shared credentials: the agents' own client. Per node: a connection of its own, opened on first use.
    pub fn fleet_client(&self) -> kube::Client {
        self.fleet.clone()
    }

    /// Whether every agent has a connection and identity of its own ([`ClientPool::per_node`]).
    pub fn is_per_node(&self) -> bool {
        self.per_node
    }

    /// The client agent number `index` sends its requests over (shared credentials: the one client; per node:
    /// its own; an index past the pool's nodes wraps round to another node's identity, which the API server
    /// refuses for a different node).
    pub fn for_agent(&self, index: usize) -> ApiClient {
        self.clients[index % self.clients.len()].clone()
    }

    /// The client agent number `index` holds its watches on (its pod watch and its Node watch; for the shared
    /// pod watch: index 0): the one [`ClientPool::for_agent`] gives, whose watches go to the watch connections.
    pub fn watch_for_agent(&self, index: usize) -> ApiClient {
        self.for_agent(index)
    }

    /// How many connections the pool holds. Per node, watches share each node's one connection, so
    /// `watch_connections` is 0 and `request_connections` is the number of nodes.
    pub fn size(&self) -> PoolSize {
        self.size
    }
}

#[cfg(test)]
mod tests {
    use super::{PoolLimits, PoolSize, with_node_identity};
    use crate::credentials::NodeCredential;

    #[test]
    fn a_node_identity_replaces_every_credential_of_the_kubeconfig() {
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        config.root_cert = Some(vec![b"server CA".to_vec()]);
        config.auth_info = kube::config::AuthInfo {
            token: Some("admin-token".to_owned().into()),
            token_file: Some("/var/run/token".into()),
            client_certificate: Some("/admin.crt".into()),
            client_key: Some("/admin.key".into()),
            impersonate: Some("someone".into()),
            exec: Some(kube::config::ExecConfig {
                command: Some("get-token".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        config.headers = vec![
            ("authorization".parse().unwrap(), "Bearer x".parse().unwrap()),
            ("impersonate-user".parse().unwrap(), "someone".parse().unwrap()),
            ("x-trace".parse().unwrap(), "1".parse().unwrap()),
        ];
        let credential = NodeCredential {
            node: "n1".into(),
            cert_pem: "CERT".into(),
            key_pem: "KEY".into(),
        };
        let node = with_node_identity(&config, &credential);
        let auth = &node.auth_info;
        assert_eq!(auth.client_certificate_data.as_deref(), Some("Q0VSVA=="));
        assert!(auth.client_key_data.is_some());
        assert!(auth.token.is_none() && auth.token_file.is_none() && auth.exec.is_none());
        assert!(auth.client_certificate.is_none() && auth.client_key.is_none());
        assert!(auth.impersonate.is_none() && auth.username.is_none() && auth.auth_provider.is_none());
        let headers: Vec<_> = node.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(headers, ["x-trace"]);
        assert_eq!(node.cluster_url, config.cluster_url);
        assert_eq!(node.root_cert, config.root_cert);
    }

    #[test]
    fn watches_and_requests_get_their_own_connections() {
        let d = PoolLimits::default();
        assert_eq!(
            PoolSize::for_fleet(1000, true, d),
            PoolSize {
                request_connections: 5,
                watch_connections: 21,
                in_flight: 64
            },
            "a pod watch and a Node watch per node, 96 per connection"
        );
        assert_eq!(PoolSize::for_fleet(1001, true, d).request_connections, 6);
        assert_eq!(
            PoolSize::for_fleet(10, true, d),
            PoolSize {
                request_connections: 1,
                watch_connections: 1,
                in_flight: 64
            }
        );
        assert_eq!(
            PoolSize::for_fleet(0, true, d),
            PoolSize {
                request_connections: 1,
                watch_connections: 1,
                in_flight: 64
            }
        );
        assert_eq!(
            PoolSize::for_fleet(10_000, false, d).watch_connections,
            105,
            "a shared pod watch needs one stream, the Node watches one per node"
        );
        let explicit = PoolLimits {
            request_connections: 3,
            ..d
        };
        assert_eq!(
            PoolSize::for_fleet(10_000, true, explicit).request_connections,
            3,
            "an explicit size wins"
        );
        assert_eq!(PoolSize::for_fleet(10_000, true, explicit).watch_connections, 209);
        let none = PoolLimits { in_flight: 0, ..d };
        assert_eq!(
            PoolSize::for_fleet(10, true, none).in_flight,
            1,
            "a connection lets at least one request through"
        );
    }
}
