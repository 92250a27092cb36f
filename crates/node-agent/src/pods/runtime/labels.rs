//! How pods are written into the runtime: sandbox and container configs with the kubelet's labels and
//! annotations, so that the runtime alone tells a restarted agent which pod and container every object
//! belongs to, its restart count and its spec hash.
//!
//! Labels (filterable with CRI label selectors): `io.kubernetes.pod.{uid,name,namespace}` on sandboxes and
//! containers, `io.kubernetes.container.name` on containers. Annotations on containers:
//! `io.kubernetes.container.{hash,restartCount,terminationMessagePath,terminationMessagePolicy}` and
//! `io.kubernetes.pod.terminationGracePeriod`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use runtime_api::cri;

use crate::pods::model::spec::{ContainerSpec, DesiredPod};
use crate::pods::runtime::cgroups::QosCgroups;
use crate::pods::runtime::dns::{self, NodeDns};
use crate::pods::runtime::security;

/// What the container is created with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resolved {
    /// Environment, in order.
    pub env: Vec<cri::KeyValue>,
    /// Command, expanded.
    pub command: Vec<String>,
    /// Arguments, expanded.
    pub args: Vec<String>,
    /// The effective security context.
    pub security: Option<cri::LinuxContainerSecurityContext>,
}

/// Label: the pod's UID.
pub const POD_UID: &str = "io.kubernetes.pod.uid";
/// Label: the pod's name.
pub const POD_NAME: &str = "io.kubernetes.pod.name";
/// Label: the pod's namespace.
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Label: the container's name in the pod spec.
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Annotation: hash of the container spec fields whose change restarts the container (hex).
pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
/// Annotation: how many times this container had been restarted when this instance was created.
pub const RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
/// Annotation: the termination message path.
pub const TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
/// Annotation: the termination message policy (`File` or `FallbackToLogsOnError`).
pub const TERMINATION_MESSAGE_POLICY: &str = "io.kubernetes.container.terminationMessagePolicy";
/// Annotation: the pod's termination grace period in seconds (used when the pod object is gone).
pub const TERMINATION_GRACE: &str = "io.kubernetes.pod.terminationGracePeriod";

/// Where sandbox logs go, and how the runtime is asked to run sandboxes.
#[derive(Debug, Clone)]
pub struct RuntimeLayout {
    /// Root of the per-pod log directories (`/var/log/pods`).
    pub pod_logs_dir: String,
    /// Create each sandbox's log directory before `RunPodSandbox`, as the kubelet does (a real runtime writes
    /// container logs there and does not create it). Off by default: hollow nodes have no logs on disk.
    pub create_log_dirs: bool,
    /// Where pod directories (volumes) are written, `<root-dir>/pods`; `None` (a hollow node): volume content
    /// is computed but nothing is written.
    pub pods_dir: Option<PathBuf>,
    /// The node's DNS settings, for each sandbox's resolver configuration.
    pub dns: Arc<NodeDns>,
    /// The QoS cgroups of a real node with `cgroupsPerQOS`: sandboxes get their pod's cgroup as parent.
    /// `None` (a hollow node, or `cgroupsPerQOS: false`): the runtime's default parent.
    pub cgroups: Option<Arc<QosCgroups>>,
    /// The node's memory capacity, bytes: Burstable containers' `oom_score_adj` is their request's share of it
    /// ([`oom_score`](super::oom_score)).
    pub memory_capacity: u64,
}

impl RuntimeLayout {
    /// The agent's root directory (`Localhost` seccomp profiles live in its `seccomp/`).
    pub fn root_dir(&self) -> String {
        self.pods_dir
            .as_deref()
            .and_then(std::path::Path::parent)
            .map_or_else(|| "/var/lib/kubelet".to_owned(), |p| p.display().to_string())
    }
}

impl Default for RuntimeLayout {
    fn default() -> Self {
        Self {
            pod_logs_dir: "/var/log/pods".to_owned(),
            create_log_dirs: false,
            pods_dir: None,
            dns: Arc::default(),
            cgroups: None,
            memory_capacity: 0,
        }
    }
}

fn pod_labels(pod: &DesiredPod) -> HashMap<String, String> {
    HashMap::from([
        (POD_UID.to_owned(), pod.uid.to_string()),
        (POD_NAME.to_owned(), pod.name.clone()),
        (POD_NAMESPACE.to_owned(), pod.namespace.clone()),
    ])
}

/// The label selector matching every sandbox and container of a pod.
pub fn selector(uid: &str) -> HashMap<String, String> {
    HashMap::from([(POD_UID.to_owned(), uid.to_owned())])
}

/// The sandbox config for `pod`, attempt `attempt`.
pub fn sandbox_config(pod: &DesiredPod, attempt: u32, layout: &RuntimeLayout) -> cri::PodSandboxConfig {
    let mut labels: HashMap<String, String> =
        pod.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    labels.extend(pod_labels(pod));
    let port_mappings = pod
        .containers
        .iter()
        .chain(pod.init_containers.iter())
        .flat_map(|c| &c.ports)
        .filter(|(_, host, _)| *host > 0)
        .map(|(container_port, host_port, proto)| cri::PortMapping {
            protocol: match proto.as_str() {
                "UDP" => cri::Protocol::Udp as i32,
                "SCTP" => cri::Protocol::Sctp as i32,
                _ => cri::Protocol::Tcp as i32,
            },
            container_port: *container_port,
            host_port: *host_port,
            host_ip: String::new(),
        })
        .collect();
    let (security_context, sysctls) = security::sandbox(pod, &layout.root_dir());
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: pod.name.clone(),
            uid: pod.uid.to_string(),
            namespace: pod.namespace.clone(),
            attempt,
        }),
        // as the kubelet: a pod on the host network shares the host's UTS namespace, and runc refuses to set a
        // hostname there ("unable to set hostname without a private UTS namespace")
        // a pod whose FQDN does not fit never gets here: the sandbox's creation refuses it first
        hostname: if pod.host_network {
            String::new()
        } else {
            pod.kernel_hostname(&layout.dns.cluster_domain)
                .unwrap_or_else(|_| pod.hostname().to_owned())
        },
        dns_config: Some(dns::pod_dns(pod, &layout.dns)),
        log_directory: format!(
            "{}/{}_{}_{}",
            layout.pod_logs_dir, pod.namespace, pod.name, pod.uid
        ),
        port_mappings,
        labels,
        annotations: pod
            .annotations
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: layout
                .cgroups
                .as_ref()
                .map(|c| c.pod_path(pod.qos, &pod.uid))
                .unwrap_or_default(),
            security_context: Some(security_context),
            sysctls,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The container config for `c`, its `restart_count`-th instance, with its resolved environment, command and
/// args and its volume mounts.
pub fn container_config(
    pod: &DesiredPod,
    c: &ContainerSpec,
    restart_count: u32,
    resolved: Resolved,
    mounts: Vec<cri::Mount>,
    memory_capacity: u64,
    page_sizes: &[u64],
) -> cri::ContainerConfig {
    let mut labels = pod_labels(pod);
    labels.insert(CONTAINER_NAME.to_owned(), c.name.clone());
    let annotations = HashMap::from([
        (CONTAINER_HASH.to_owned(), format!("{:x}", c.hash)),
        (RESTART_COUNT.to_owned(), restart_count.to_string()),
        (
            TERMINATION_MESSAGE_PATH.to_owned(),
            c.termination_message_path.clone(),
        ),
        (
            TERMINATION_MESSAGE_POLICY.to_owned(),
            if c.termination_fallback_to_logs {
                crate::pods::model::spec::FALLBACK_TO_LOGS
            } else {
                "File"
            }
            .to_owned(),
        ),
        (
            TERMINATION_GRACE.to_owned(),
            pod.termination_grace_secs.to_string(),
        ),
    ]);
    let resources = cri::LinuxContainerResources {
        oom_score_adj: super::oom_score::container(pod, c, memory_capacity),
        hugepage_limits: hugepage_limits(pod, &c.name, page_sizes),
        ..linux_resources(&c.resources)
    };
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: c.name.clone(),
            attempt: restart_count,
        }),
        image: Some(cri::ImageSpec {
            image: c.image.clone(),
            user_specified_image: c.image.clone(),
            ..Default::default()
        }),
        command: resolved.command,
        args: resolved.args,
        working_dir: c.working_dir.clone(),
        envs: resolved.env,
        mounts,
        labels,
        annotations,
        log_path: format!("{}/{}.log", c.name, restart_count),
        stdin: c.stdin,
        stdin_once: c.stdin_once,
        tty: c.tty,
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(resources),
            security_context: resolved.security,
        }),
        ..Default::default()
    }
}

/// A container's Linux resources as the kubelet converts them: CPU shares from the request, a CFS quota over
/// a 100 ms period from the limit, the memory limit.
pub fn linux_resources(
    r: &crate::pods::model::resources::ContainerResources,
) -> cri::LinuxContainerResources {
    cri::LinuxContainerResources {
        cpu_shares: r.cpu_request.map_or(2, |m| (m * 1024 / 1000).max(2)),
        cpu_period: if r.cpu_limit.is_some() { 100_000 } else { 0 },
        cpu_quota: r.cpu_limit.map_or(0, |m| (m * 100).max(1000)),
        memory_limit_in_bytes: r.memory_limit.unwrap_or(0),
        ..Default::default()
    }
}

/// The huge pages limits of container `name` for the runtime, as the kubelet gives them: one for each of the
/// node's `page_sizes`, the container's limit of that size (or the pod level's) or else 0.
pub fn hugepage_limits(pod: &DesiredPod, name: &str, page_sizes: &[u64]) -> Vec<cri::HugepageLimit> {
    let limits = pod.container_hugepages(name);
    page_sizes
        .iter()
        .map(|size| cri::HugepageLimit {
            page_size: super::cgroups::page_size_name(*size),
            limit: limits.get(size).copied().unwrap_or(0),
        })
        .collect()
}

/// The restart count recorded on a container, 0 when absent.
pub fn restart_count(annotations: &HashMap<String, String>) -> u32 {
    annotations
        .get(RESTART_COUNT)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The spec hash recorded on a container.
pub fn hash(annotations: &HashMap<String, String>) -> Option<u64> {
    annotations
        .get(CONTAINER_HASH)
        .and_then(|v| u64::from_str_radix(v, 16).ok())
}

/// The termination grace period recorded on a container.
pub fn grace_secs(annotations: &HashMap<String, String>) -> Option<i64> {
    annotations.get(TERMINATION_GRACE).and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_page_size_of_the_node_is_limited_for_each_container() {
        let pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [
                {"name": "a", "image": "i", "resources": {"limits": {"memory": "8Mi", "hugepages-2Mi": "4Mi"}}},
                {"name": "b", "image": "i"}
            ]}
        }))
        .unwrap();
        let d = DesiredPod::from_pod(&pod).unwrap();
        let resolved = Resolved::default();
        let sizes = [2 << 20, 1 << 30];
        let cc = container_config(&d, &d.containers[0], 0, resolved, Vec::new(), 1 << 30, &sizes);
        let limits = cc.linux.unwrap().resources.unwrap().hugepage_limits;
        let pairs: Vec<(&str, u64)> = limits.iter().map(|l| (l.page_size.as_str(), l.limit)).collect();
        assert_eq!(pairs, [("2MB", 4 << 20), ("1GB", 0)]);
        let other: Vec<u64> = hugepage_limits(&d, "b", &sizes).iter().map(|l| l.limit).collect();
        assert_eq!(other, [0, 0], "a container asking for none gets 0 of every size");
        assert!(
            hugepage_limits(&d, "a", &[]).is_empty(),
            "a node without huge pages"
        );
    }

    #[test]
    fn configs_carry_kubelet_labels_and_annotations() {
        let pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1", "labels": {"app": "x"},
                          "annotations": {"cri-fake.node-agent.io/exit-after": "5s"}},
            "spec": {"containers": [{"name": "app", "image": "nginx:1", "env": [
                {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
            ], "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}}]}
        }))
        .unwrap();
        let d = DesiredPod::from_pod(&pod).unwrap();
        let sb = sandbox_config(&d, 1, &RuntimeLayout::default());
        assert_eq!(sb.labels[POD_UID], "u1");
        assert_eq!(sb.labels["app"], "x");
        assert_eq!(sb.annotations["cri-fake.node-agent.io/exit-after"], "5s");
        assert_eq!(sb.metadata.as_ref().unwrap().attempt, 1);
        assert_eq!(sb.log_directory, "/var/log/pods/ns_web_u1");
        assert_eq!(sb.hostname, "web");
        let mut host = (*d).clone();
        host.host_network = true;
        assert_eq!(sandbox_config(&host, 1, &RuntimeLayout::default()).hostname, "");

        let resolved = Resolved {
            env: vec![cri::KeyValue {
                key: "IP".into(),
                value: "10.1.0.5".into(),
            }],
            ..Default::default()
        };
        let cc = container_config(&d, &d.containers[0], 3, resolved, Vec::new(), 1 << 30, &[]);
        assert_eq!(cc.labels[CONTAINER_NAME], "app");
        assert_eq!(cc.labels[POD_NAMESPACE], "ns");
        assert_eq!(restart_count(&cc.annotations), 3);
        assert_eq!(hash(&cc.annotations), Some(d.containers[0].hash));
        assert_eq!(grace_secs(&cc.annotations), Some(30));
        assert_eq!(cc.envs[0].value, "10.1.0.5");
        assert_eq!(cc.log_path, "app/3.log");
        let res = cc.linux.unwrap().resources.unwrap();
        assert_eq!(
            (res.cpu_quota, res.cpu_period, res.memory_limit_in_bytes),
            (50_000, 100_000, 64 << 20)
        );
    }
}
