//! The kubelet API's routes: which path is answered by which handler, on the secure port (every path) and on the
//! read-only port (no logs, no configuration). Also the small node-scoped handlers: `/healthz`, `/pods`,
//! `/metrics`, `/metrics/probes`, `/configz`. Streams (`/exec`, `/attach`, `/portForward`, `/run`) are in [`super::streaming`].

use std::sync::Arc;

use axum::Extension;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use runtime_api::cri;
use serde_json::json;

use super::respond::{error, json_response, runtime_error};
use super::{NodeEndpoint, Shared};
use crate::pods::model::gofmt::duration as go_duration;
use crate::pods::runtime::labels;

fn read_only_routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/pods", get(pods))
        .route("/metrics", get(metrics))
        .route("/metrics/resource", get(super::stats::resource_metrics))
        .route("/metrics/probes", get(probe_metrics))
        .route("/stats/summary", get(super::stats::summary))
        .fallback(|| async { (StatusCode::NOT_FOUND, "404 page not found\n") })
}

/// Every path of the secure port.
pub(super) fn full(shared: Arc<Shared>) -> Router {
    let mut router = read_only_routes().route("/configz", get(configz));
    if shared.kubelet.enable_debugging_handlers {
        use super::streaming;
        router = router
            .route(
                "/containerLogs/{namespace}/{pod}/{container}",
                get(super::logs::container_logs),
            )
            .route("/exec/{namespace}/{pod}/{container}", any_stream(streaming::exec))
            .route(
                "/exec/{namespace}/{pod}/{uid}/{container}",
                any_stream(streaming::exec),
            )
            .route(
                "/attach/{namespace}/{pod}/{container}",
                any_stream(streaming::attach),
            )
            .route(
                "/attach/{namespace}/{pod}/{uid}/{container}",
                any_stream(streaming::attach),
            )
            .route(
                "/portForward/{namespace}/{pod}",
                any_stream(streaming::port_forward),
            )
            .route(
                "/portForward/{namespace}/{pod}/{uid}",
                any_stream(streaming::port_forward),
            )
            .route("/run/{namespace}/{pod}/{container}", post(streaming::run))
            .route("/run/{namespace}/{pod}/{uid}/{container}", post(streaming::run));
    }
    router.with_state(shared)
}

/// A stream path answers GET and POST (the API server uses either), as the kubelet's.
fn any_stream<H, T>(handler: H) -> axum::routing::MethodRouter<Arc<Shared>>
where
    H: axum::handler::Handler<T, Arc<Shared>> + Clone,
    T: 'static,
{
    get(handler.clone()).post(handler)
}

/// The read-only port's paths.
pub(super) fn read_only(shared: Arc<Shared>) -> Router {
    read_only_routes().with_state(shared)
}

/// `/pods`: the pods this node runs, as the runtime knows them (a `v1.PodList` with each pod's identity, its
/// running containers and its IP).
async fn pods(Extension(node): Extension<NodeEndpoint>) -> Response {
    let runtime = &node.ctx.runtime;
    let ready = cri::PodSandboxFilter {
        state: Some(cri::PodSandboxStateValue {
            state: cri::PodSandboxState::SandboxReady as i32,
        }),
        ..Default::default()
    };
    let sandboxes = match runtime
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: Some(ready) })
        .await
    {
        Ok(r) => r.items,
        Err(e) => return runtime_error("ListPodSandbox", &e),
    };
    let containers = match runtime
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
    {
        Ok(r) => r.containers,
        Err(e) => return runtime_error("ListContainers", &e),
    };
    let mut items = Vec::with_capacity(sandboxes.len());
    for sb in &sandboxes {
        let Some(meta) = &sb.metadata else { continue };
        let status = runtime
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: sb.id.clone(),
                verbose: false,
            })
            .await
            .ok()
            .and_then(|r| r.status);
        let ip = status
            .as_ref()
            .and_then(|s| s.network.as_ref())
            .map(|n| n.ip.clone())
            .filter(|ip| !ip.is_empty());
        let mine: Vec<_> = containers
            .iter()
            .filter(|c| c.pod_sandbox_id == sb.id)
            .filter_map(|c| Some((c.metadata.as_ref()?.name.clone(), c)))
            .collect();
        let statuses: Vec<_> = mine
            .iter()
            .map(|(name, c)| {
                let running = c.state == cri::ContainerState::ContainerRunning as i32;
                json!({
                    "name": name,
                    "image": c.image.as_ref().map(|i| i.image.clone()).unwrap_or_default(),
                    "imageID": c.image_ref,
                    "containerID": format!("cri://{}", c.id),
                    "ready": running,
                    "restartCount": labels::restart_count(&c.annotations),
                    "state": if running { json!({"running": {}}) } else { json!({"terminated": {}}) },
                })
            })
            .collect();
        items.push(json!({
            "metadata": {"name": meta.name, "namespace": meta.namespace, "uid": meta.uid},
            "spec": {
                "nodeName": node.ctx.node_name(),
                "containers": mine.iter().map(|(name, _)| json!({"name": name})).collect::<Vec<_>>(),
            },
            "status": {
                "phase": "Running",
                "podIP": ip,
                "containerStatuses": statuses,
            },
        }));
    }
    json_response(
        StatusCode::OK,
        &json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}),
    )
}

/// `/metrics`: the process's own registry in Prometheus text format, with the node's volume statistics.
async fn metrics(State(shared): State<Arc<Shared>>, Extension(node): Extension<NodeEndpoint>) -> Response {
    let Some(registry) = &shared.registry else {
        return error(StatusCode::NOT_FOUND, "no metrics registry\n");
    };
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => {
            let volumes = node.ctx.stats.volume_metrics().await;
            if !volumes.is_empty() {
                // before the closing `# EOF`
                let end = body.rfind("# EOF").unwrap_or(body.len());
                body.insert_str(end, &volumes);
            }
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
                body,
            )
                .into_response()
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// `/metrics/probes`: the node's per-probe series (`prober_probe_total`, `prober_probe_duration_seconds`).
async fn probe_metrics(Extension(node): Extension<NodeEndpoint>) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        node.ctx.probe_metrics.encode(),
    )
        .into_response()
}

/// `/configz`: the running configuration under `kubeletconfig`, with the file's field names.
async fn configz(State(shared): State<Arc<Shared>>, Extension(node): Extension<NodeEndpoint>) -> Response {
    let k = &shared.kubelet;
    let mode = match k.authorization.mode {
        crate::config::AuthorizationMode::AlwaysAllow => "AlwaysAllow",
        crate::config::AuthorizationMode::Webhook => "Webhook",
    };
    let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string());
    let config = json!({
        "kind": "KubeletConfiguration",
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "enableServer": k.enable_server,
        "address": k.address.to_string(),
        "port": node.ctx.config.kubelet_port,
        "readOnlyPort": k.read_only_port,
        "healthzPort": k.healthz_port,
        "healthzBindAddress": k.healthz_bind_address.to_string(),
        "tlsCertFile": path(&k.tls_cert_file),
        "tlsPrivateKeyFile": path(&k.tls_private_key_file),
        "authentication": {
            "x509": {"clientCAFile": path(&k.authentication.client_ca_file)},
            "webhook": {
                "enabled": k.authentication.webhook_enabled,
                "cacheTTL": go_duration(k.authentication.webhook_cache_ttl),
            },
            "anonymous": {"enabled": k.authentication.anonymous_enabled},
        },
        "authorization": {
            "mode": mode,
            "webhook": {
                "cacheAuthorizedTTL": go_duration(k.authorization.cache_authorized_ttl),
                "cacheUnauthorizedTTL": go_duration(k.authorization.cache_unauthorized_ttl),
            },
        },
        "enableDebuggingHandlers": k.enable_debugging_handlers,
        "syncFrequency": go_duration(k.sync_frequency),
        "nodeStatusUpdateFrequency": go_duration(k.node_status_update_frequency),
        "nodeStatusReportFrequency": go_duration(k.node_status_report_frequency),
        "nodeLeaseDurationSeconds": k.node_lease_duration_seconds,
        "maxPods": k.max_pods,
        "podsPerCore": k.pods_per_core,
        "podPidsLimit": k.pod_pids_limit,
        "podLogsDir": k.pod_logs_dir.display().to_string(),
        "kubeAPIQPS": k.kube_api_qps,
        "kubeAPIBurst": k.kube_api_burst,
        "eventRecordQPS": k.event_record_qps,
        "eventBurst": k.event_burst,
        "containerRuntimeEndpoint": k.container_runtime_endpoint,
        "imageServiceEndpoint": k.image_service_endpoint,
        "runtimeRequestTimeout": go_duration(k.runtime_request_timeout),
        "serializeImagePulls": k.serialize_image_pulls,
        "registryPullQPS": k.registry_pull_qps,
        "registryBurst": k.registry_burst,
        "clusterDomain": k.cluster_domain,
        "clusterDNS": k.cluster_dns.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "resolvConf": k.resolv_conf,
        "cgroupDriver": k.cgroup_driver,
        "cgroupsPerQOS": k.cgroups_per_qos,
        "cgroupRoot": k.cgroup_root,
        "failSwapOn": k.fail_swap_on,
        "registerNode": k.register_node,
        "featureGates": k.feature_gates,
    });
    json_response(StatusCode::OK, &json!({ "kubeletconfig": config }))
}
