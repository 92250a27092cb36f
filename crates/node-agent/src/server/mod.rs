//! The kubelet HTTPS API: what `kubectl logs`, `kubectl top`, metrics-server and the API server's node proxy talk
//! to.
//!
//! A [`KubeletServer`] holds what every node it answers for shares: the TLS configuration ([`tls`]), the
//! authenticator/authorizer and its caches ([`auth`]), the routes ([`routes`], [`stats`], [`logs`],
//! [`streaming`]) and the process's metrics registry. [`KubeletServer::serve_node`] binds one listener for one
//! node — the kubelet's
//! `port`, which the node publishes in `status.daemonEndpoints.kubeletEndpoint.port` — and every connection
//! accepted there is answered for that node. A real node has one; a hollow fleet, whose nodes all publish the
//! process's one address, gives every node a port of its own on the one server, so node-scoped paths
//! (`/stats/summary`, `/metrics/resource`, `/pods`) know which node is asked and the API server reaches each
//! node's pods through its own endpoint.
//!
//! Next to it: [`KubeletServer::serve_healthz`] (plain HTTP `/healthz` on `healthzBindAddress:healthzPort`) and
//! [`KubeletServer::serve_read_only`] (plain HTTP, unauthenticated, read-only paths on `readOnlyPort`).
//!
//! The server's listeners and connections are tasks on a tracker it owns: they end when its token (or, for a
//! node's listener, the node's agent) stops, and [`KubeletServer::stopped`] waits for them. An exec, attach or
//! port-forward stream upgraded from a request is a task of its own (see [`streaming`]) that lives as long as
//! that stream, as a connection to the kubelet lives as long as its client keeps it.

pub mod auth;
pub mod logs;
pub mod remotecommand;
mod respond;
mod routes;
pub mod spdy;
pub mod stats;
pub mod stream_options;
mod stream_proxy;
pub mod streaming;
pub mod tls;

#[cfg(test)]
mod bad_input_tests;
#[cfg(test)]
mod client_certificate_tests;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode, header};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::agent::AgentContext;
use crate::config::KubeletConfig;
pub use auth::{Auth, ClientCertificate, Refusal, User};
pub use logs::{FileLogs, LogSource, ScriptedLogs};
pub use tls::ServingIdentity;

/// Why the kubelet API could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A TLS setting is unusable.
    #[error("{field}: {message}")]
    Tls {
        /// The configuration field at fault.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A port could not be bound.
    #[error("binding {addr} for {what}: {error}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// What listens there and the settings that chose the address, e.g. "the kubelet API (`address`,
        /// `port`; --address, --port)".
        what: &'static str,
        /// The I/O error (said in the message, so not also a source: a printed chain would say it twice).
        error: std::io::Error,
    },
}

/// What the kubelet API needs about one node: its agent's context and where its container logs are read.
#[derive(Clone)]
pub struct NodeEndpoint {
    /// The node's agent.
    pub ctx: AgentContext,
    /// Its container logs.
    pub logs: Arc<dyn LogSource>,
}

impl NodeEndpoint {
    /// A node whose container logs are the CRI log files the runtime reports (`ContainerStatus.logPath`).
    pub fn new(ctx: AgentContext) -> Self {
        Self {
            ctx,
            logs: Arc::new(FileLogs),
        }
    }

    /// Reads container logs from `logs` instead.
    pub fn with_logs(mut self, logs: Arc<dyn LogSource>) -> Self {
        self.logs = logs;
        self
    }
}

/// What handlers share: the kubelet settings, the metrics registry.
pub(crate) struct Shared {
    pub(crate) kubelet: Arc<KubeletConfig>,
    pub(crate) registry: Option<Arc<Registry>>,
}

/// What one TLS connection's client certificate says about its user, and the node it was accepted for.
#[derive(Clone)]
struct Connection {
    node: NodeEndpoint,
    certificate: ClientCertificate,
}

/// The kubelet API server of a process: one TLS configuration, one authorizer cache, one listener per node.
/// Clones share the listeners and connections (see [`KubeletServer::stopped`]).
#[derive(Clone)]
pub struct KubeletServer {
    tls: tokio_rustls::TlsAcceptor,
    /// What the connections' client certificates are checked against (`clientCAFile`).
    client_ca: Option<tls::ClientCa>,
    auth: Arc<Auth>,
    full: Router,
    read_only: Router,
    token: CancellationToken,
    /// The listeners and their connections.
    tasks: TaskTracker,
}

impl KubeletServer {
    /// A server for nodes running with `kubelet` settings (serving certificate, client CA, authentication,
    /// authorization); `identity` names the self-signed certificate made when no `tlsCertFile` is set;
    /// `/metrics` serves `registry`. Listeners stop when `token` fires.
    pub fn new(
        kubelet: Arc<KubeletConfig>,
        identity: &ServingIdentity,
        registry: Option<Arc<Registry>>,
        token: CancellationToken,
    ) -> Result<Self, ServerError> {
        Self::with_serving(kubelet, identity, None, registry, token)
    }

    /// As [`KubeletServer::new`], presenting the certificates `serving` resolves (serverTLSBootstrap) when
    /// given.
    pub fn with_serving(
        kubelet: Arc<KubeletConfig>,
        identity: &ServingIdentity,
        serving: Option<Arc<dyn rustls::server::ResolvesServerCert>>,
        registry: Option<Arc<Registry>>,
        token: CancellationToken,
    ) -> Result<Self, ServerError> {
        let tls = tls::server_config(&kubelet, identity, serving)?;
        let auth = Arc::new(Auth::new(&kubelet));
        let shared = Arc::new(Shared { kubelet, registry });
        Ok(Self {
            tls: tokio_rustls::TlsAcceptor::from(tls.config),
            client_ca: tls.client_ca,
            auth,
            full: routes::full(shared.clone()),
            read_only: routes::read_only(shared),
            token,
            tasks: TaskTracker::new(),
        })
    }

    /// Waits until every listener and connection of the server has ended (they end when its token fires; a
    /// node's listener and its connections also when the node's agent stops).
    pub fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let tasks = self.tasks.clone();
        async move {
            tasks.close();
            tasks.wait().await;
        }
    }

    /// Listens on `addr` for `node` (HTTPS, authenticated and authorized) until the server's token or the
    /// node's agent stops; returns the bound address. Must be called inside a tokio runtime.
    pub fn serve_node(&self, addr: SocketAddr, node: NodeEndpoint) -> Result<SocketAddr, ServerError> {
        self.serve_node_for(addr, node, KUBELET_PORT)
    }

    /// [`KubeletServer::serve_node`], a failure to listen naming `what` listens there (and the settings that
    /// chose the address).
    pub fn serve_node_for(
        &self,
        addr: SocketAddr,
        node: NodeEndpoint,
        what: &'static str,
    ) -> Result<SocketAddr, ServerError> {
        let listener = bind(addr, what)?;
        let bound = listener.local_addr().map_err(|source| ServerError::Bind {
            addr,
            what,
            error: source,
        })?;
        let server = self.clone();
        let agent_stopped = node.ctx.token.clone();
        self.tasks.spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = server.token.cancelled() => return,
                    () = agent_stopped.cancelled() => return,
                    a = listener.accept() => a,
                };
                let tcp = match accepted {
                    Ok((tcp, _)) => tcp,
                    Err(e) => {
                        tracing::debug!(error = %e, "kubelet API accept failed");
                        continue;
                    }
                };
                let (conn, node, agent_stopped) = (server.clone(), node.clone(), agent_stopped.clone());
                server.tasks.spawn(async move {
                    // a connection ends with the server or the node's agent, its TLS handshake too
                    tokio::select! {
                        () = conn.serve_tls(tcp, node) => {}
                        () = conn.token.cancelled() => {}
                        () = agent_stopped.cancelled() => {}
                    }
                });
            }
        });
        Ok(bound)
    }

    /// Listens on `addr` for `node` over plain HTTP with no authentication, serving the read-only paths
    /// (`readOnlyPort`). Must be called inside a tokio runtime.
    pub fn serve_read_only(&self, addr: SocketAddr, node: NodeEndpoint) -> Result<SocketAddr, ServerError> {
        let what = READ_ONLY_PORT;
        let listener = bind(addr, what)?;
        let bound = listener.local_addr().map_err(|source| ServerError::Bind {
            addr,
            what,
            error: source,
        })?;
        let router = self.read_only.clone();
        let token = self.token.clone();
        let tasks = self.tasks.clone();
        self.tasks.spawn(async move {
            loop {
                let tcp = tokio::select! {
                    () = token.cancelled() => return,
                    a = listener.accept() => match a { Ok((tcp, _)) => tcp, Err(_) => continue },
                };
                let router = router.clone();
                let node = node.clone();
                let token = token.clone();
                tasks.spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let mut req = req.map(Body::new);
                        req.extensions_mut().insert(node.clone());
                        router.clone().oneshot(req)
                    });
                    serve_connection(TokioIo::new(tcp), service, &token).await;
                });
            }
        });
        Ok(bound)
    }

    async fn serve_tls(&self, tcp: tokio::net::TcpStream, node: NodeEndpoint) {
        let tls = match self.tls.accept(tcp).await {
            Ok(tls) => tls,
            Err(e) => {
                tracing::debug!(error = %e, "kubelet API TLS handshake failed");
                return;
            }
        };
        // the handshake took any client certificate; whether it names a user is decided here, once per
        // connection (its expiry checked again at each request)
        let certificate = match (&self.client_ca, tls.get_ref().1.peer_certificates()) {
            (Some(ca), Some(chain)) => ca.identify(chain),
            _ => ClientCertificate::Absent,
        };
        let conn = Arc::new(Connection { node, certificate });
        let server = self.clone();
        let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
            let server = server.clone();
            let conn = conn.clone();
            async move { Ok::<_, Infallible>(server.handle(&conn, req.map(Body::new)).await) }
        });
        serve_connection(TokioIo::new(tls), service, &self.token).await;
    }

    async fn handle(&self, conn: &Connection, mut req: Request<Body>) -> Response<Body> {
        let ctx = &conn.node.ctx;
        let authorization = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let checked = match self
            .auth
            .authenticate(&ctx.api, &ctx.client, &conn.certificate, authorization)
            .await
        {
            Ok(user) => {
                self.auth
                    .authorize(
                        &ctx.api,
                        &ctx.client,
                        &user,
                        ctx.node_name(),
                        req.method(),
                        req.uri().path(),
                    )
                    .await
            }
            Err(refusal) => Err(refusal),
        };
        if let Err(refusal) = checked {
            let (status, body) = match refusal {
                Refusal::Unauthorized => (StatusCode::UNAUTHORIZED, "Unauthorized".to_owned()),
                Refusal::Forbidden(m) => (StatusCode::FORBIDDEN, m),
                Refusal::Error(m) => (StatusCode::INTERNAL_SERVER_ERROR, m),
            };
            return text(status, body);
        }
        req.extensions_mut().insert(conn.node.clone());
        match self.full.clone().oneshot(req).await {
            Ok(resp) => resp,
            Err(never) => match never {},
        }
    }
}

/// What listens on the kubelet port, and the settings that choose its address.
pub const KUBELET_PORT: &str =
    "the kubelet API (KubeletConfiguration `address` and `port`; --address, --port)";
/// What listens on the read-only port, and the settings that choose its address.
const READ_ONLY_PORT: &str = "the read-only kubelet API (KubeletConfiguration `address` and `readOnlyPort`; --address, --read-only-port)";
/// What listens on the healthz port, and the settings that choose its address.
const HEALTHZ_PORT: &str = "the healthz endpoint (KubeletConfiguration `healthzBindAddress` and `healthzPort`; \
     --healthz-bind-address, --healthz-port)";

fn bind(addr: SocketAddr, what: &'static str) -> Result<tokio::net::TcpListener, ServerError> {
    let err = |source| ServerError::Bind {
        addr,
        what,
        error: source,
    };
    let listener = std::net::TcpListener::bind(addr).map_err(err)?;
    listener.set_nonblocking(true).map_err(err)?;
    tokio::net::TcpListener::from_std(listener).map_err(err)
}

/// Serves one connection (HTTP/1.1 with upgrades, or HTTP/2) until it ends or `token` fires.
async fn serve_connection<I, S>(io: I, service: S, token: &CancellationToken)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::Service<Request<hyper::body::Incoming>, Response = Response<Body>, Error = Infallible>
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection_with_upgrades(io, service);
    tokio::select! {
        r = conn => if let Err(e) = r {
            tracing::debug!(error = %e, "kubelet API connection ended");
        },
        () = token.cancelled() => {}
    }
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

impl KubeletServer {
    /// Serves plain-HTTP `/healthz` (answering `ok`) on `addr` until the server's token fires; returns the bound
    /// address.
    pub fn serve_healthz(&self, addr: SocketAddr) -> Result<SocketAddr, ServerError> {
        let what = HEALTHZ_PORT;
        let listener = bind(addr, what)?;
        let bound = listener.local_addr().map_err(|source| ServerError::Bind {
            addr,
            what,
            error: source,
        })?;
        let app = Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
        let token = self.token.clone();
        self.tasks.spawn(async move {
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(token.cancelled_owned())
                .await
            {
                tracing::warn!(error = %e, "healthz endpoint stopped");
            }
        });
        Ok(bound)
    }
}

/// The addresses one node's servers listen on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// The kubelet API (HTTPS).
    pub secure: SocketAddr,
    /// The read-only port, when `readOnlyPort` is set.
    pub read_only: Option<SocketAddr>,
    /// The healthz port, when `healthzPort` is set.
    pub healthz: Option<SocketAddr>,
}

/// Everything one (real) node serves, per its settings: the kubelet API on `address:port` with a self-signed
/// certificate for the node's hostname and IP unless `tlsCertFile` is set, the read-only port when non-zero,
/// and `/healthz` on `healthzBindAddress:healthzPort` when non-zero, until the node's agent stops. Nothing when
/// `enableServer` is false. The server comes back with the addresses: its
/// [`stopped`](KubeletServer::stopped) is what the agent waits for at shutdown (e.g.
/// [`RunningAgent::spawn`](crate::RunningAgent::spawn)).
pub fn serve_agent(
    node: NodeEndpoint,
    registry: Option<Arc<Registry>>,
    serving: Option<Arc<dyn rustls::server::ResolvesServerCert>>,
) -> Result<Option<(Bound, KubeletServer)>, ServerError> {
    let ctx = &node.ctx;
    let kubelet = ctx.config.kubelet.clone();
    if !kubelet.enable_server {
        return Ok(None);
    }
    let identity = ServingIdentity {
        hostnames: vec![ctx.config.hostname.clone()],
        ips: vec![ctx.config.node_ip],
    };
    let server =
        KubeletServer::with_serving(kubelet.clone(), &identity, serving, registry, ctx.token.clone())?;
    let secure = server.serve_node(
        SocketAddr::new(kubelet.address, ctx.config.kubelet_port),
        node.clone(),
    )?;
    let read_only = match kubelet.read_only_port {
        0 => None,
        port => Some(server.serve_read_only(SocketAddr::new(kubelet.address, port), node.clone())?),
    };
    let healthz = match kubelet.healthz_port {
        0 => None,
        port => Some(server.serve_healthz(SocketAddr::new(kubelet.healthz_bind_address, port))?),
    };
    tracing::info!(node = %ctx.node_name(), %secure, ?read_only, ?healthz, "kubelet API listening");
    let bound = Bound {
        secure,
        read_only,
        healthz,
    };
    Ok(Some((bound, server)))
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::Duration;

    use super::*;
    use crate::agent::Agent;
    use crate::config::AgentConfig;
    use crate::machine::MachineInfo;
    use crate::testing::TestRuntime;

    /// A node whose API requests never get an answer.
    pub(super) fn endpoint() -> NodeEndpoint {
        let service = tower::service_fn(|_req: http::Request<kube::client::Body>| {
            std::future::pending::<Result<http::Response<kube::client::Body>, Infallible>>()
        });
        let config = AgentConfig::new(
            "n1",
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            Arc::new(KubeletConfig::default()),
            MachineInfo::synthetic("n1"),
        );
        let agent = Agent::builder(
            config,
            kube::Client::new(service, "default"),
            Arc::new(TestRuntime::new()),
        )
        .build()
        .expect("a valid agent");
        NodeEndpoint::new(agent.context().clone())
    }

    #[tokio::test(start_paused = true)]
    async fn the_servers_listeners_and_connections_are_waited_for_and_end_with_its_token() {
        let token = CancellationToken::new();
        let server = KubeletServer::new(
            Arc::new(KubeletConfig::default()),
            &ServingIdentity::default(),
            None,
            token.clone(),
        )
        .expect("a server");
        let any = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
        let node = endpoint();
        let ports = [
            server.serve_node(any, node.clone()).expect("the secure port"),
            server.serve_read_only(any, node).expect("the read-only port"),
            server.serve_healthz(any).expect("the healthz port"),
        ];
        // a connection to each that says nothing: the secure one waits in its TLS handshake
        let mut held = Vec::new();
        for port in ports {
            held.push(tokio::net::TcpStream::connect(port).await.expect("a connection"));
        }
        let stopped = tokio::spawn(server.stopped());
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
        assert!(!stopped.is_finished(), "the listeners and connections run");
        token.cancel();
        tokio::time::timeout(Duration::from_secs(5), stopped)
            .await
            .expect("every listener and connection ends with the server's token")
            .expect("the wait");
        drop(held);
    }
}
