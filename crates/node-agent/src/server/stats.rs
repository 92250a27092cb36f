//! Resource usage of one node from its runtime's CRI stats: `/stats/summary` (the Summary API,
//! `stats/v1alpha1`) and `/metrics/resource` (what metrics-server scrapes, with the kubelet's metric names and
//! labels).
//!
//! Sources: `ListPodSandboxStats` (per pod and per container CPU, memory, network, writable layer),
//! `ListPodSandbox` and `ListContainers` (start times). Node figures are the sums over its pods, with capacity
//! from the machine facts; a node's own system processes are not counted.

use axum::Extension;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use runtime_api::cri;
use serde_json::{Value, json};

use super::NodeEndpoint;
use super::routes::{json_response, runtime_error};

/// One container's usage.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerUsage {
    /// Container name.
    pub name: String,
    /// Start (creation) time, Unix nanoseconds.
    pub start_ns: i64,
    /// Sample time, Unix nanoseconds.
    pub time_ns: i64,
    /// CPU now, nanocores.
    pub nano_cores: u64,
    /// Cumulative CPU, core-nanoseconds.
    pub core_nanos: u64,
    /// Memory working set, bytes.
    pub working_set: u64,
    /// Memory usage, bytes.
    pub memory_usage: u64,
    /// Resident set, bytes.
    pub rss: u64,
    /// Writable layer, bytes.
    pub rootfs_bytes: u64,
}

/// One pod's usage.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodUsage {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// UID.
    pub uid: String,
    /// Sandbox creation time, Unix nanoseconds.
    pub start_ns: i64,
    /// Sample time, Unix nanoseconds.
    pub time_ns: i64,
    /// CPU now, nanocores.
    pub nano_cores: u64,
    /// Cumulative CPU, core-nanoseconds.
    pub core_nanos: u64,
    /// Memory working set, bytes.
    pub working_set: u64,
    /// Network received / sent bytes of the default interface.
    pub rx_bytes: u64,
    /// Sent bytes.
    pub tx_bytes: u64,
    /// Its running containers.
    pub containers: Vec<ContainerUsage>,
}

fn v(x: Option<&cri::UInt64Value>) -> u64 {
    x.map_or(0, |x| x.value)
}

/// Every ready pod's usage, from the runtime.
pub async fn collect(node: &NodeEndpoint) -> Result<Vec<PodUsage>, Response> {
    let runtime = &node.ctx.runtime;
    let stats = runtime
        .list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest { filter: None })
        .await
        .map_err(|e| runtime_error("ListPodSandboxStats", &e))?
        .stats;
    let sandboxes = runtime
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .map_err(|e| runtime_error("ListPodSandbox", &e))?
        .items;
    let containers = runtime
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .map_err(|e| runtime_error("ListContainers", &e))?
        .containers;
    let mut pods = Vec::with_capacity(stats.len());
    for s in stats {
        let Some(attrs) = &s.attributes else { continue };
        let Some(meta) = &attrs.metadata else { continue };
        let Some(linux) = &s.linux else { continue };
        let cpu = linux.cpu.unwrap_or_default();
        let memory = linux.memory.unwrap_or_default();
        let iface = linux
            .network
            .as_ref()
            .and_then(|n| n.default_interface.clone())
            .unwrap_or_default();
        let start_ns = sandboxes
            .iter()
            .find(|sb| sb.id == attrs.id)
            .map_or(0, |sb| sb.created_at);
        let usage = linux
            .containers
            .iter()
            .filter_map(|c| {
                let a = c.attributes.as_ref()?;
                let cpu = c.cpu.unwrap_or_default();
                let mem = c.memory.unwrap_or_default();
                Some(ContainerUsage {
                    name: a.metadata.as_ref()?.name.clone(),
                    start_ns: containers
                        .iter()
                        .find(|x| x.id == a.id)
                        .map_or(0, |x| x.created_at),
                    time_ns: cpu.timestamp,
                    nano_cores: v(cpu.usage_nano_cores.as_ref()),
                    core_nanos: v(cpu.usage_core_nano_seconds.as_ref()),
                    working_set: v(mem.working_set_bytes.as_ref()),
                    memory_usage: v(mem.usage_bytes.as_ref()),
                    rss: v(mem.rss_bytes.as_ref()),
                    rootfs_bytes: v(c.writable_layer.as_ref().and_then(|w| w.used_bytes.as_ref())),
                })
            })
            .collect();
        pods.push(PodUsage {
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            start_ns,
            time_ns: cpu.timestamp,
            nano_cores: v(cpu.usage_nano_cores.as_ref()),
            core_nanos: v(cpu.usage_core_nano_seconds.as_ref()),
            working_set: v(memory.working_set_bytes.as_ref()),
            rx_bytes: v(iface.rx_bytes.as_ref()),
            tx_bytes: v(iface.tx_bytes.as_ref()),
            containers: usage,
        });
    }
    pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Ok(pods)
}

/// RFC 3339 (UTC, nanoseconds) of Unix nanoseconds.
pub fn rfc3339(ns: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ns))
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_default()
}

fn now_ns() -> i64 {
    i64::try_from(time::OffsetDateTime::now_utc().unix_timestamp_nanos()).unwrap_or(0)
}

fn cpu(time: &str, nano_cores: u64, core_nanos: u64) -> Value {
    json!({"time": time, "usageNanoCores": nano_cores, "usageCoreNanoSeconds": core_nanos})
}

/// The Summary API document for `node` and its pods.
pub fn summary_json(node: &NodeEndpoint, pods: &[PodUsage]) -> Value {
    let machine = &node.ctx.config.machine;
    let now = rfc3339(pods.iter().map(|p| p.time_ns).max().unwrap_or_else(now_ns));
    let nano_cores: u64 = pods.iter().map(|p| p.nano_cores).sum();
    let core_nanos: u64 = pods.iter().map(|p| p.core_nanos).sum();
    let working_set: u64 = pods.iter().map(|p| p.working_set).sum();
    let rootfs: u64 = pods
        .iter()
        .flat_map(|p| &p.containers)
        .map(|c| c.rootfs_bytes)
        .sum();
    let fs_capacity = machine.ephemeral_storage_bytes;
    let pods_json: Vec<Value> = pods
        .iter()
        .map(|p| {
            let t = rfc3339(p.time_ns);
            let pod_rootfs: u64 = p.containers.iter().map(|c| c.rootfs_bytes).sum();
            json!({
                "podRef": {"name": p.name, "namespace": p.namespace, "uid": p.uid},
                "startTime": rfc3339(p.start_ns),
                "containers": p.containers.iter().map(|c| {
                    let t = rfc3339(c.time_ns);
                    json!({
                        "name": c.name,
                        "startTime": rfc3339(c.start_ns),
                        "cpu": cpu(&t, c.nano_cores, c.core_nanos),
                        "memory": {"time": t, "usageBytes": c.memory_usage, "workingSetBytes": c.working_set,
                                   "rssBytes": c.rss, "pageFaults": 0, "majorPageFaults": 0},
                        "rootfs": {"time": t, "usedBytes": c.rootfs_bytes,
                                   "capacityBytes": fs_capacity,
                                   "availableBytes": fs_capacity.saturating_sub(rootfs)},
                    })
                }).collect::<Vec<_>>(),
                "cpu": cpu(&t, p.nano_cores, p.core_nanos),
                "memory": {"time": t, "usageBytes": p.working_set, "workingSetBytes": p.working_set},
                "network": {"time": t, "name": "eth0", "rxBytes": p.rx_bytes, "txBytes": p.tx_bytes,
                            "interfaces": [{"name": "eth0", "rxBytes": p.rx_bytes, "txBytes": p.tx_bytes}]},
                "volume": [],
                "ephemeral-storage": {"time": t, "usedBytes": pod_rootfs,
                                      "capacityBytes": fs_capacity,
                                      "availableBytes": fs_capacity.saturating_sub(rootfs)},
            })
        })
        .collect();
    json!({
        "node": {
            "nodeName": node.ctx.node_name(),
            "systemContainers": [],
            "cpu": cpu(&now, nano_cores, core_nanos),
            "memory": {
                "time": now,
                "availableBytes": machine.memory_bytes.saturating_sub(working_set),
                "usageBytes": working_set,
                "workingSetBytes": working_set,
            },
            "fs": {"time": now, "capacityBytes": fs_capacity, "usedBytes": rootfs,
                   "availableBytes": fs_capacity.saturating_sub(rootfs)},
            "runtime": {"imageFs": {"time": now, "capacityBytes": fs_capacity, "usedBytes": rootfs,
                                    "availableBytes": fs_capacity.saturating_sub(rootfs)}},
        },
        "pods": pods_json,
    })
}

/// `GET /stats/summary`.
pub async fn summary(Extension(node): Extension<NodeEndpoint>) -> Response {
    match collect(&node).await {
        Ok(pods) => json_response(StatusCode::OK, &summary_json(&node, &pods)),
        Err(resp) => resp,
    }
}

fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The `/metrics/resource` exposition for `pods` (Prometheus text, sample timestamps in milliseconds).
pub fn resource_metrics_text(pods: &[PodUsage]) -> String {
    use std::fmt::Write as _;
    let ms = |ns: i64| ns / 1_000_000;
    let now = pods.iter().map(|p| p.time_ns).max().unwrap_or_else(now_ns);
    let secs = |n: u64| n as f64 / 1e9;
    let mut out = String::with_capacity(256 + pods.len() * 600);
    let mut family = |name: &str, kind: &str, help: &str, samples: &mut dyn Iterator<Item = String>| {
        let _ = writeln!(out, "# HELP {name} [STABLE] {help}\n# TYPE {name} {kind}");
        for s in samples {
            let _ = writeln!(out, "{name}{s}");
        }
    };
    let containers = || {
        pods.iter().flat_map(|p| {
            p.containers.iter().map(move |c| {
                let labels = format!(
                    "{{container=\"{}\",namespace=\"{}\",pod=\"{}\"}}",
                    label(&c.name),
                    label(&p.namespace),
                    label(&p.name)
                );
                (labels, c)
            })
        })
    };
    let pod_labels = |p: &PodUsage| {
        format!(
            "{{namespace=\"{}\",pod=\"{}\"}}",
            label(&p.namespace),
            label(&p.name)
        )
    };
    family(
        "container_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the container in core-seconds",
        &mut containers().map(|(l, c)| format!("{l} {} {}", secs(c.core_nanos), ms(c.time_ns))),
    );
    family(
        "container_memory_working_set_bytes",
        "gauge",
        "Current working set of the container in bytes",
        &mut containers().map(|(l, c)| format!("{l} {} {}", c.working_set, ms(c.time_ns))),
    );
    family(
        "container_start_time_seconds",
        "gauge",
        "Start time of the container since unix epoch in seconds",
        &mut containers().map(|(l, c)| format!("{l} {} {}", c.start_ns as f64 / 1e9, ms(c.time_ns))),
    );
    let node_cpu: u64 = pods.iter().map(|p| p.core_nanos).sum();
    let node_mem: u64 = pods.iter().map(|p| p.working_set).sum();
    family(
        "node_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the node in core-seconds",
        &mut std::iter::once(format!(" {} {}", secs(node_cpu), ms(now))),
    );
    family(
        "node_memory_working_set_bytes",
        "gauge",
        "Current working set of the node in bytes",
        &mut std::iter::once(format!(" {node_mem} {}", ms(now))),
    );
    family(
        "pod_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the pod in core-seconds",
        &mut pods
            .iter()
            .map(|p| format!("{} {} {}", pod_labels(p), secs(p.core_nanos), ms(p.time_ns))),
    );
    family(
        "pod_memory_working_set_bytes",
        "gauge",
        "Current working set of the pod in bytes",
        &mut pods
            .iter()
            .map(|p| format!("{} {} {}", pod_labels(p), p.working_set, ms(p.time_ns))),
    );
    family(
        "resource_scrape_error",
        "gauge",
        "1 if there was an error while getting container metrics, 0 otherwise",
        &mut std::iter::once(" 0".to_owned()),
    );
    out
}

/// `GET /metrics/resource`.
pub async fn resource_metrics(Extension(node): Extension<NodeEndpoint>) -> Response {
    match collect(&node).await {
        Ok(pods) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
            resource_metrics_text(&pods),
        )
            .into_response(),
        Err(resp) => resp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> PodUsage {
        PodUsage {
            name: "web".into(),
            namespace: "default".into(),
            uid: "u1".into(),
            start_ns: 1_700_000_000_000_000_000,
            time_ns: 1_700_000_010_000_000_000,
            nano_cores: 250_000_000,
            core_nanos: 2_500_000_000,
            working_set: 64 << 20,
            containers: vec![ContainerUsage {
                name: "app".into(),
                start_ns: 1_700_000_001_000_000_000,
                time_ns: 1_700_000_010_000_000_000,
                nano_cores: 250_000_000,
                core_nanos: 2_500_000_000,
                working_set: 64 << 20,
                ..ContainerUsage::default()
            }],
            ..PodUsage::default()
        }
    }

    #[test]
    fn resource_metrics_use_the_kubelets_names_labels_and_units() {
        let text = resource_metrics_text(&[pod()]);
        assert!(
            text.contains(
                "container_cpu_usage_seconds_total{container=\"app\",namespace=\"default\",pod=\"web\"} 2.5 1700000010000"
            ),
            "{text}"
        );
        assert!(text.contains(
            "container_memory_working_set_bytes{container=\"app\",namespace=\"default\",pod=\"web\"} 67108864 1700000010000"
        ));
        assert!(text.contains("node_cpu_usage_seconds_total 2.5 1700000010000"));
        assert!(text.contains("node_memory_working_set_bytes 67108864 1700000010000"));
        assert!(text.contains("pod_memory_working_set_bytes{namespace=\"default\",pod=\"web\"} 67108864"));
        assert!(text.contains("# TYPE container_cpu_usage_seconds_total counter"));
        assert!(text.contains("resource_scrape_error 0"));
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(1_700_000_000_500_000_000), "2023-11-14T22:13:20.5Z");
    }
}
