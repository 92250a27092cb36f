//! The fleet's one HTTP endpoint: `/healthz`, and `/metrics` (Prometheus text: the agents' metrics, aggregated
//! over the fleet because they share one registry, plus fleet gauges).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// Fleet-wide gauges, refreshed by [`crate::fleet::FleetView::refresh`].
#[derive(Clone, Default)]
pub struct FleetGauges {
    /// Nodes started.
    pub nodes: Gauge<i64, AtomicI64>,
    /// Nodes whose Node object is registered.
    pub registered: Gauge<i64, AtomicI64>,
    /// Pod sandboxes present in the fake runtimes.
    pub sandboxes: Gauge<i64, AtomicI64>,
    /// Containers present in the fake runtimes.
    pub containers: Gauge<i64, AtomicI64>,
    /// Process resident memory.
    pub rss_bytes: Gauge<f64, AtomicU64>,
}

impl FleetGauges {
    /// Registers the gauges.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "hollow_nodes",
            "Hollow nodes started in this process",
            self.nodes.clone(),
        );
        registry.register(
            "hollow_nodes_registered",
            "Hollow nodes whose Node object exists",
            self.registered.clone(),
        );
        registry.register(
            "hollow_pod_sandboxes",
            "Pod sandboxes in the fake runtimes",
            self.sandboxes.clone(),
        );
        registry.register(
            "hollow_containers",
            "Containers in the fake runtimes",
            self.containers.clone(),
        );
        registry.register(
            "hollow_process_resident_memory_bytes",
            "Resident memory of the fleet process",
            self.rss_bytes.clone(),
        );
    }
}

struct AppState {
    registry: Registry,
}

async fn healthz() -> &'static str {
    "ok"
}

async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &state.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
            body,
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            e.to_string(),
        ),
    }
}

/// Serves the endpoint on `addr` until `token` fires; returns the bound address once listening.
pub async fn serve(
    addr: SocketAddr,
    registry: Registry,
    token: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let state = Arc::new(AppState { registry });
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let handle = tokio::spawn(async move {
        let shutdown = token.cancelled_owned();
        if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
            tracing::warn!(error = %e, "metrics endpoint stopped");
        }
    });
    Ok((bound, handle))
}

/// This process's resident set size in bytes (Linux), 0 if unknown.
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}
