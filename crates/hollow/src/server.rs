//! The fleet's one HTTP endpoint: `/healthz`; `/metrics` (Prometheus text: the agents' metrics, aggregated
//! over the fleet because they share one registry, plus fleet gauges); and `/histograms`: the raw per-stage
//! pod start-up HDR histograms (JSON: stage name -> base64 of the HdrHistogram V2 serialization, values in
//! microseconds), which merge exactly across processes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use hdrhistogram::Histogram;
use hdrhistogram::serialization::{Deserializer, Serializer, V2Serializer};
use node_agent::pods::{PodMetrics, Stage};
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
    registry: Arc<Registry>,
    pod_metrics: Arc<PodMetrics>,
}

async fn histograms(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    match encode_histograms(&state.pod_metrics) {
        Ok(map) => (StatusCode::OK, axum::Json(map)).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
    }
}

/// Every stage's histogram (and `pod_start`, the whole span), V2-serialized and base64-encoded.
pub fn encode_histograms(metrics: &PodMetrics) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    let stages = Stage::ALL
        .iter()
        .map(|s| (s.name(), Some(*s)))
        .chain(std::iter::once(("pod_start", None)));
    for (name, stage) in stages {
        let Some(h) = metrics.stage_histogram(stage) else {
            continue;
        };
        out.insert(
            name.to_owned(),
            encode_histogram(&h).map_err(|e| format!("{name}: {e}"))?,
        );
    }
    Ok(out)
}

/// One histogram as `/histograms` serves it: V2-serialized, base64-encoded.
pub fn encode_histogram(h: &Histogram<u64>) -> Result<String, String> {
    use base64::Engine;
    let mut buf = Vec::new();
    V2Serializer::new()
        .serialize(h, &mut buf)
        .map_err(|e| format!("{e:?}"))?;
    Ok(base64::engine::general_purpose::STANDARD.encode(buf))
}

/// The inverse of [`encode_histograms`] for one stage.
pub fn decode_histogram(encoded: &str) -> Result<Histogram<u64>, String> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|e| e.to_string())?;
    Deserializer::new()
        .deserialize(&mut bytes.as_slice())
        .map_err(|e| format!("{e:?}"))
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
    registry: impl Into<Arc<Registry>>,
    pod_metrics: Arc<PodMetrics>,
    token: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let state = Arc::new(AppState {
        registry: registry.into(),
        pod_metrics,
    });
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/histograms", get(histograms))
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
