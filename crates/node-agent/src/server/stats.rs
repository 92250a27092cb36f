//! Resource usage of one node from its runtime's CRI stats: `/stats/summary` (the Summary API,
//! `stats/v1alpha1`) and `/metrics/resource` (what metrics-server scrapes, with the kubelet's metric names and
//! labels).
//!
//! The figures come from the agent's [`StatsProvider`](crate::stats::StatsProvider) (the runtime's CRI stats and,
//! on a real node, the machine's memory and filesystems); this module only words them.

use axum::Extension;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::NodeEndpoint;
use super::respond::{json_response, runtime_error};

pub use crate::stats::{ContainerUsage, PodUsage, Summary};

/// The node and every ready pod's usage, from the agent's stats provider.
pub async fn collect(node: &NodeEndpoint) -> Result<Summary, Response> {
    node.ctx
        .stats
        .summary()
        .await
        .map_err(|e| runtime_error(e.call, &e.source))
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

/// The Summary API document for `node`: the node's figures and its pods'.
pub fn summary_json(node: &NodeEndpoint, summary: &Summary) -> Value {
    let pods = &summary.pods;
    let n = &summary.node;
    let now = rfc3339(n.time_ns);
    let nodefs = n.nodefs.unwrap_or_default();
    let imagefs = n.imagefs.unwrap_or_default();
    let fs_json = |fs: &crate::stats::FsStats| {
        let mut v = json!({"time": now, "capacityBytes": fs.capacity_bytes, "usedBytes": fs.used_bytes(),
                           "availableBytes": fs.available_bytes});
        if let (Some(inodes), Some(free)) = (fs.inodes, fs.inodes_free) {
            v["inodes"] = json!(inodes);
            v["inodesFree"] = json!(free);
            v["inodesUsed"] = json!(inodes.saturating_sub(free));
        }
        v
    };
    let fs_capacity = nodefs.capacity_bytes;
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
                                   "capacityBytes": imagefs.capacity_bytes,
                                   "availableBytes": imagefs.available_bytes},
                    })
                }).collect::<Vec<_>>(),
                "cpu": cpu(&t, p.nano_cores, p.core_nanos),
                "memory": {"time": t, "usageBytes": p.working_set, "workingSetBytes": p.working_set},
                "network": {"time": t, "name": "eth0", "rxBytes": p.rx_bytes, "txBytes": p.tx_bytes,
                            "interfaces": [{"name": "eth0", "rxBytes": p.rx_bytes, "txBytes": p.tx_bytes}]},
                "volume": p.volumes.iter().map(|v| {
                    let mut j = json!({"time": rfc3339(v.time_ns), "name": v.name,
                                       "capacityBytes": v.capacity_bytes, "usedBytes": v.used_bytes,
                                       "availableBytes": v.available_bytes});
                    if let Some((inodes, free, used)) = v.inodes {
                        j["inodes"] = json!(inodes);
                        j["inodesFree"] = json!(free);
                        j["inodesUsed"] = json!(used);
                    }
                    if let Some((namespace, name)) = &v.claim {
                        j["pvcRef"] = json!({"name": name, "namespace": namespace});
                    }
                    j
                }).collect::<Vec<_>>(),
                "ephemeral-storage": {"time": t, "usedBytes": pod_rootfs,
                                      "capacityBytes": fs_capacity,
                                      "availableBytes": nodefs.available_bytes},
            })
        })
        .collect();
    json!({
        "node": {
            "nodeName": node.ctx.node_name(),
            "systemContainers": [],
            "cpu": cpu(&now, n.nano_cores, n.core_nanos),
            "memory": {
                "time": now,
                "availableBytes": n.memory_available(),
                "usageBytes": n.memory_working_set,
                "workingSetBytes": n.memory_working_set,
            },
            "fs": fs_json(&nodefs),
            "runtime": {"imageFs": fs_json(&imagefs)},
            "rlimit": n.pids.map(|(max, running)| json!({"time": now, "maxpid": max, "curproc": running})),
        },
        "pods": pods_json,
    })
}

/// `GET /stats/summary`.
pub async fn summary(Extension(node): Extension<NodeEndpoint>) -> Response {
    match collect(&node).await {
        Ok(summary) => json_response(StatusCode::OK, &summary_json(&node, &summary)),
        Err(resp) => resp,
    }
}

fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The `/metrics/resource` exposition for `summary` (Prometheus text, sample timestamps in milliseconds).
pub fn resource_metrics_text(summary: &Summary) -> String {
    let pods = &summary.pods[..];
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
    let node_cpu = summary.node.core_nanos;
    let node_mem = summary.node.memory_working_set;
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
        Ok(summary) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
            resource_metrics_text(&summary),
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
        let summary = Summary {
            node: crate::stats::NodeUsage {
                core_nanos: 2_500_000_000,
                memory_working_set: 64 << 20,
                ..Default::default()
            },
            pods: vec![pod()],
        };
        let text = resource_metrics_text(&summary);
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
