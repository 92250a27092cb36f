//! Building the Node object the way the kubelet fills it: labels, annotations, taints, capacity and allocatable,
//! addresses, nodeInfo, daemon endpoints, images, runtime handlers.
//!
//! Pure functions of the agent's config and what the runtime reported; no I/O.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ContainerImage, DaemonEndpoint, Node, NodeAddress, NodeDaemonEndpoints, NodeFeatures, NodeRuntimeHandler,
    NodeRuntimeHandlerFeatures, NodeSpec, NodeStatus, NodeSwapStatus, NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use runtime_api::cri;

use crate::config::{AgentConfig, Threshold};
use crate::quantity::{Format, Quantity};
use crate::runtime_health::RuntimeHealth;

/// Resource name -> amount.
pub type ResourceList = BTreeMap<String, Quantity>;

/// `kubernetes.io/hostname`.
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
/// `kubernetes.io/os`.
pub const LABEL_OS: &str = "kubernetes.io/os";
/// `kubernetes.io/arch`.
pub const LABEL_ARCH: &str = "kubernetes.io/arch";
/// `beta.kubernetes.io/os` (still set by the kubelet for compatibility).
pub const LABEL_OS_BETA: &str = "beta.kubernetes.io/os";
/// `beta.kubernetes.io/arch` (still set by the kubelet for compatibility).
pub const LABEL_ARCH_BETA: &str = "beta.kubernetes.io/arch";
/// Annotation telling the attach/detach controller it manages this node's volumes.
pub const ANNOTATION_CONTROLLER_MANAGED_ATTACH_DETACH: &str =
    "volumes.kubernetes.io/controller-managed-attach-detach";
/// Annotation this agent sets when it cordoned the node on shutdown, so the next start can undo exactly that.
pub const ANNOTATION_CORDONED_ON_SHUTDOWN: &str = "node-agent/cordoned-on-shutdown";
/// How many names per image the status lists (the kubelet's cap).
pub const MAX_NAMES_PER_IMAGE: usize = 5;

/// The labels the kubelet owns on its Node (hostname, os, arch, and the beta os/arch aliases).
pub fn default_labels(cfg: &AgentConfig) -> [(&'static str, String); 5] {
    [
        (LABEL_HOSTNAME, cfg.hostname.clone()),
        (LABEL_OS, cfg.machine.operating_system.to_owned()),
        (LABEL_ARCH, cfg.machine.architecture.to_owned()),
        (LABEL_OS_BETA, cfg.machine.operating_system.to_owned()),
        (LABEL_ARCH_BETA, cfg.machine.architecture.to_owned()),
    ]
}

/// The labels set at registration: the default labels, then `--node-labels` (which win, as upstream).
pub fn registration_labels(cfg: &AgentConfig) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = default_labels(cfg)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    for (k, v) in cfg.node_labels.iter() {
        if labels.contains_key(k) {
            tracing::warn!(label = %k, "--node-labels overrides a label the agent sets by default");
        }
        labels.insert(k.clone(), v.clone());
    }
    labels
}

fn hugepage_resource(page_size: u64) -> String {
    format!(
        "hugepages-{}",
        Quantity::from_units(page_size as i64, Format::BinarySI)
    )
}

/// Node capacity: cpu, memory, pods, ephemeral-storage (when local storage isolation is on), hugepages.
pub fn capacity(cfg: &AgentConfig) -> ResourceList {
    let m = &cfg.machine;
    let k = &cfg.kubelet;
    let mut out = ResourceList::new();
    out.insert("cpu".into(), Quantity::from_milli(m.cpu_millis as i64));
    out.insert(
        "memory".into(),
        Quantity::from_units(m.memory_bytes as i64, Format::BinarySI),
    );
    let mut pods = u64::from(k.max_pods);
    if k.pods_per_core > 0 {
        pods = pods.min(u64::from(k.pods_per_core) * m.cpu_millis.div_ceil(1000));
    }
    out.insert(
        "pods".into(),
        Quantity::from_units(pods as i64, Format::DecimalSI),
    );
    if k.local_storage_capacity_isolation {
        out.insert(
            "ephemeral-storage".into(),
            Quantity::from_units(m.ephemeral_storage_bytes as i64, Format::BinarySI),
        );
    }
    for (size, total) in &m.hugepages {
        out.insert(
            hugepage_resource(*size),
            Quantity::from_units(*total as i64, Format::BinarySI),
        );
    }
    for (name, count) in &m.extended_resources {
        out.insert(
            name.clone(),
            Quantity::from_units(i64::try_from(*count).unwrap_or(i64::MAX), Format::DecimalSI),
        );
    }
    out
}

/// Allocatable: capacity - kubeReserved - systemReserved - hard eviction threshold, never below zero; memory also
/// loses the huge pages (they are not available as ordinary memory), as upstream.
pub fn allocatable(cfg: &AgentConfig, capacity: &ResourceList) -> ResourceList {
    let k = &cfg.kubelet;
    let eviction =
        |signal: &str, cap: &Quantity| k.eviction_hard.get(signal).map(|t: &Threshold| t.amount_of(cap));
    let mut out = ResourceList::new();
    for (name, cap) in capacity {
        let mut v = *cap;
        for reserved in [&k.kube_reserved, &k.system_reserved] {
            if let Some(r) = reserved.get(name) {
                v = v.saturating_sub(r);
            }
        }
        let threshold = match name.as_str() {
            "memory" => eviction("memory.available", cap),
            "ephemeral-storage" => eviction("nodefs.available", cap),
            _ => None,
        };
        if let Some(t) = threshold {
            v = v.saturating_sub(&t);
        }
        out.insert(name.clone(), v.non_negative());
    }
    let hugepages: Vec<Quantity> = capacity
        .iter()
        .filter(|(n, _)| n.starts_with("hugepages-"))
        .map(|(_, q)| *q)
        .collect();
    if let Some(mem) = out.get_mut("memory") {
        for h in hugepages {
            *mem = mem.saturating_sub(&h).non_negative();
        }
    }
    out
}

/// The API form of a resource list.
pub fn to_api(list: &ResourceList) -> BTreeMap<String, ApiQuantity> {
    list.iter().map(|(k, v)| (k.clone(), v.to_api())).collect()
}

/// `status.addresses`: InternalIP, then Hostname.
pub fn addresses(cfg: &AgentConfig) -> Vec<NodeAddress> {
    vec![
        NodeAddress {
            type_: "InternalIP".into(),
            address: cfg.node_ip.to_string(),
        },
        NodeAddress {
            type_: "Hostname".into(),
            address: cfg.hostname.clone(),
        },
    ]
}

/// `status.nodeInfo`; `containerRuntimeVersion` is `<name>://<version>` once the runtime answered `Version`.
pub fn node_info(cfg: &AgentConfig, health: &RuntimeHealth) -> NodeSystemInfo {
    let m = &cfg.machine;
    NodeSystemInfo {
        architecture: m.architecture.to_owned(),
        boot_id: m.boot_id.to_string(),
        container_runtime_version: health
            .version
            .as_ref()
            .map(|v| v.node_info_string())
            .unwrap_or_default(),
        kernel_version: m.kernel_version.to_string(),
        kube_proxy_version: String::new(),
        kubelet_version: cfg.kubelet_version.to_string(),
        machine_id: m.machine_id.to_string(),
        operating_system: m.operating_system.to_owned(),
        os_image: m.os_image.to_string(),
        // The API refuses a zero capacity: no swap is reported as no swap status.
        swap: (m.swap_bytes > 0).then_some(NodeSwapStatus {
            capacity: Some(m.swap_bytes as i64),
        }),
        system_uuid: m.system_uuid.to_string(),
    }
}

/// `status.daemonEndpoints`: the kubelet API port.
pub fn daemon_endpoints(cfg: &AgentConfig) -> NodeDaemonEndpoints {
    NodeDaemonEndpoints {
        kubelet_endpoint: Some(DaemonEndpoint {
            port: i32::from(cfg.kubelet_port),
        }),
    }
}

/// `status.images`: largest first, at most `max` images (None = all), digests then tags, at most 5 names each.
pub fn images(mut list: Vec<cri::Image>, max: Option<u32>) -> Vec<ContainerImage> {
    list.sort_by(|a, b| b.size.cmp(&a.size).then_with(|| a.id.cmp(&b.id)));
    if let Some(max) = max {
        list.truncate(max as usize);
    }
    list.into_iter()
        .map(|img| {
            let mut names = img.repo_digests;
            names.extend(img.repo_tags);
            names.truncate(MAX_NAMES_PER_IMAGE);
            ContainerImage {
                names: Some(names),
                size_bytes: Some(img.size as i64),
            }
        })
        .collect()
}

/// `status.runtimeHandlers` from the runtime's `Status`.
pub fn runtime_handlers(health: &RuntimeHealth) -> Option<Vec<NodeRuntimeHandler>> {
    if health.handlers.is_empty() {
        return None;
    }
    Some(
        health
            .handlers
            .iter()
            .map(|h| NodeRuntimeHandler {
                name: Some(h.name.clone()),
                features: h.features.as_ref().map(|f| NodeRuntimeHandlerFeatures {
                    recursive_read_only_mounts: Some(f.recursive_read_only_mounts),
                    user_namespaces: Some(f.user_namespaces),
                }),
            })
            .collect(),
    )
}

/// `status.features` from the runtime's `Status`.
pub fn features(health: &RuntimeHealth) -> Option<NodeFeatures> {
    health.supplemental_groups_policy.map(|p| NodeFeatures {
        supplemental_groups_policy: Some(p),
    })
}

/// The Node to create at registration, with `status` already filled.
pub fn initial_node(cfg: &AgentConfig, status: NodeStatus) -> Node {
    let k = &cfg.kubelet;
    let mut annotations = BTreeMap::new();
    if k.enable_controller_attach_detach {
        annotations.insert(
            ANNOTATION_CONTROLLER_MANAGED_ATTACH_DETACH.to_owned(),
            "true".to_owned(),
        );
    }
    let pod_cidrs: Option<Vec<String>> = k
        .pod_cidr
        .as_ref()
        .map(|c| c.split(',').map(|s| s.trim().to_owned()).collect());
    Node {
        metadata: ObjectMeta {
            name: Some(cfg.node_name.clone()),
            labels: Some(registration_labels(cfg)),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: pod_cidrs.as_ref().and_then(|c| c.first().cloned()),
            pod_cidrs,
            provider_id: k.provider_id.clone(),
            taints: if k.register_with_taints.is_empty() {
                None
            } else {
                Some(k.register_with_taints.clone())
            },
            unschedulable: None,
            ..Default::default()
        }),
        status: Some(status),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::KubeletConfig;
    use crate::machine::MachineInfo;

    fn cfg(kubelet: KubeletConfig) -> AgentConfig {
        let mut machine = MachineInfo::synthetic("n1");
        machine.cpu_millis = 2000;
        machine.memory_bytes = 2039724 * 1024;
        machine.ephemeral_storage_bytes = 20263484 * 1024;
        AgentConfig::new("n1", "127.0.0.1".parse().unwrap(), Arc::new(kubelet), machine)
    }

    #[test]
    fn capacity_and_allocatable_match_the_kubelets_arithmetic() {
        let mut k = KubeletConfig::default();
        k.kube_reserved.insert("cpu".into(), "50m".parse().unwrap());
        k.system_reserved.insert("cpu".into(), "20m".parse().unwrap());
        let c = cfg(k);
        let cap = capacity(&c);
        let show = |l: &ResourceList| {
            l.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        assert_eq!(
            show(&cap),
            "cpu=2,ephemeral-storage=20263484Ki,memory=2039724Ki,pods=110"
        );
        let alloc = allocatable(&c, &cap);
        // memory - 100Mi, ephemeral-storage - 10 % (float32 arithmetic as upstream), cpu - 70m
        assert_eq!(
            show(&alloc),
            "cpu=1930m,ephemeral-storage=18674826824,memory=1937324Ki,pods=110"
        );
    }

    #[test]
    fn hugepages_leave_memory_and_reservations_clamp_at_zero() {
        let mut k = KubeletConfig::default();
        k.kube_reserved.insert("cpu".into(), "10".parse().unwrap());
        let mut c = cfg(k);
        c.machine.hugepages = vec![(2 << 20, 512 << 20)];
        let cap = capacity(&c);
        assert_eq!(cap["hugepages-2Mi"].to_string(), "512Mi");
        let alloc = allocatable(&c, &cap);
        assert_eq!(alloc["cpu"].to_string(), "0");
        assert_eq!(
            alloc["memory"].to_string(),
            "1413036Ki",
            "2039724Ki - 100Mi - 512Mi"
        );
    }

    #[test]
    fn pods_per_core_caps_pods() {
        let k = KubeletConfig {
            pods_per_core: 10,
            ..KubeletConfig::default()
        };
        assert_eq!(capacity(&cfg(k))["pods"].to_string(), "20");
    }

    #[test]
    fn labels_images_and_initial_node() {
        let mut c = cfg(KubeletConfig::default());
        Arc::make_mut(&mut c.node_labels).insert("team".into(), "a".into());
        let labels = registration_labels(&c);
        assert_eq!(labels[LABEL_HOSTNAME], "n1");
        assert_eq!(labels[LABEL_OS], "linux");
        assert_eq!(labels["team"], "a");
        assert!(labels.contains_key(LABEL_ARCH_BETA));

        let img = |id: &str, size, tags: &[&str]| cri::Image {
            id: id.into(),
            size,
            repo_tags: tags.iter().map(|s| s.to_string()).collect(),
            repo_digests: vec![format!("{id}@sha256:0")],
            ..Default::default()
        };
        let list = images(
            vec![
                img("small", 10, &["s:1"]),
                img("big", 99, &["b:1", "b:2", "b:3", "b:4", "b:5"]),
            ],
            Some(1),
        );
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].size_bytes, Some(99));
        assert_eq!(list[0].names.as_ref().unwrap().len(), MAX_NAMES_PER_IMAGE);
        assert_eq!(
            list[0].names.as_ref().unwrap()[0],
            "big@sha256:0",
            "digests first"
        );

        let node = initial_node(&c, NodeStatus::default());
        assert_eq!(node.metadata.name.as_deref(), Some("n1"));
        assert_eq!(
            node.metadata.annotations.as_ref().unwrap()[ANNOTATION_CONTROLLER_MANAGED_ATTACH_DETACH],
            "true"
        );
        assert!(node.spec.as_ref().unwrap().pod_cidr.is_none());
    }
}
