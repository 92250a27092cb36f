//! Configuration as a plain value.
//!
//! This module owns turning "a KubeletConfiguration file plus kubelet-style flags" into the values the agent runs
//! with, and nothing else reads configuration:
//!
//! * [`file`](mod@file) reads the `kubelet.config.k8s.io/v1beta1` document (upstream field names, unknown field -> error).
//! * [`flags`] is the command line ([`Flags`], clap derive) — flags override the file, field by field.
//! * [`resolve`] applies the upstream kubelet's defaults and validates, collecting every bad field into one
//!   [`ConfigError`] that names each field (and the flag it came from).
//! * [`tls_settings`] maps `tlsMinVersion` and `tlsCipherSuites` from Go's names.
//! * [`effect`] says which of the given settings take no effect, or only part of it, for the start-up warning
//!   ([`Unacted`]); `docs/configuration.md` lists every accepted setting with its status.
//! * [`KubeletConfig`] is the resolved, typed subset shared by every agent of a process (`Arc`), and
//!   [`AgentConfig`] adds what is per node: name, address, labels, machine facts.
//!
//! The core never reads environment variables or files on its own; the binary (or the hollow fleet) builds these
//! values and hands them in.

mod check;
/// One group of `shutdownGracePeriodByPodPriority`: pods with at least `priority` (and below the next group's) get `grace`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownGroup {
    /// Lowest priority of the group.
    pub priority: i32,
    /// The time the group gets.
    pub grace: std::time::Duration,
}

#[cfg(test)]
mod bad_input_tests;
#[cfg(test)]
mod docs_tests;
pub mod duration;
mod effect;
mod fields;
pub(crate) mod file;
pub mod flags;
pub mod resolve;
pub mod tls_settings;
mod validate;

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Taint;

pub use effect::Unacted;
pub use flags::{Flags, RuntimeKind, ShutdownTrigger, version_line};
pub use resolve::{LoadedConfig, load_file, resolve_kubelet_config};
pub use validate::{validate_label_key, validate_node_labels, validate_node_name};

use crate::machine::MachineInfo;
use crate::quantity::Quantity;

/// The kubelet version this agent reports in `nodeInfo.kubeletVersion` (it implements the node side of this
/// release of the API).
pub const KUBELET_VERSION: &str = "v1.36.3";

/// One bad configuration field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field, as named in the file (`nodeStatusUpdateFrequency`, `kubeReserved[cpu]`), followed by the flag
    /// it came from when a flag set it.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Why a configuration was refused. Every variant names the field at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The configuration file could not be read.
    #[error("reading config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid YAML / JSON, or not a mapping.
    #[error("config file {source_name}: {message}")]
    Syntax {
        /// The file.
        source_name: String,
        /// The parser's message.
        message: String,
    },
    /// A field the KubeletConfiguration subset does not know.
    #[error("unknown field {field:?}{}", hint.as_ref().map(|h| format!(" (did you mean {h:?}?)")).unwrap_or_default())]
    UnknownField {
        /// The unknown field.
        field: String,
        /// The closest known field, if one is close.
        hint: Option<String>,
    },
    /// A field with a value of the wrong shape.
    #[error("invalid field {field}: {message}")]
    Field {
        /// The field path (`authentication.webhook.cacheTTL`).
        field: String,
        /// What is wrong.
        message: String,
    },
    /// One or more fields failed validation.
    #[error("invalid configuration: {}", errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Invalid {
        /// Every bad field.
        errors: Vec<FieldError>,
    },
}

impl ConfigError {
    /// The names of the fields at fault.
    pub fn fields(&self) -> Vec<&str> {
        match self {
            Self::UnknownField { field, .. } | Self::Field { field, .. } => vec![field.as_str()],
            Self::Invalid { errors } => errors.iter().map(|e| e.field.as_str()).collect(),
            Self::Read { .. } | Self::Syntax { .. } => Vec::new(),
        }
    }
}

/// An eviction threshold value: an absolute quantity or a percentage of capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Threshold {
    /// An absolute amount (`100Mi`).
    Quantity(Quantity),
    /// A fraction of capacity, `0.1` for `10%` (single precision, as the kubelet keeps it).
    Percentage(f32),
}

impl Threshold {
    /// The amount this threshold reserves out of `capacity`.
    pub fn amount_of(&self, capacity: &Quantity) -> Quantity {
        match self {
            Self::Quantity(q) => *q,
            Self::Percentage(p) => capacity.fraction(*p),
        }
    }
}

/// How the kubelet API authorizes requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthorizationMode {
    /// Every authenticated request is allowed.
    AlwaysAllow,
    /// SubjectAccessReview against the API server.
    Webhook,
}

/// Authentication of the kubelet API (`authentication` in the file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authentication {
    /// CA bundle for client certificates (`x509.clientCAFile`).
    pub client_ca_file: Option<PathBuf>,
    /// Bearer tokens checked by TokenReview (`webhook.enabled`, default true).
    pub webhook_enabled: bool,
    /// TokenReview cache (`webhook.cacheTTL`, default 2m).
    pub webhook_cache_ttl: Duration,
    /// Anonymous requests allowed (`anonymous.enabled`, default false).
    pub anonymous_enabled: bool,
}

/// Authorization of the kubelet API (`authorization` in the file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorization {
    /// The mode (default Webhook).
    pub mode: AuthorizationMode,
    /// Cache for allowed answers (default 5m).
    pub cache_authorized_ttl: Duration,
    /// Cache for denied answers (default 30s).
    pub cache_unauthorized_ttl: Duration,
}

/// The resolved KubeletConfiguration subset: defaults applied, validated, typed. Field names follow the file's
/// (`node_status_update_frequency` is `nodeStatusUpdateFrequency`); defaults equal the upstream kubelet's.
///
/// One value is shared (`Arc`) by every agent of a process that runs with the same settings.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeletConfig {
    /// Serve the kubelet API (default true).
    pub enable_server: bool,
    /// Address of the kubelet API (default 0.0.0.0).
    pub address: IpAddr,
    /// Port of the kubelet API, published as `daemonEndpoints.kubeletEndpoint.port` (default 10250).
    pub port: u16,
    /// Read-only port, 0 = disabled (default 0).
    pub read_only_port: u16,
    /// Healthz port, 0 = disabled (default 10248).
    pub healthz_port: u16,
    /// Healthz address (default 127.0.0.1).
    pub healthz_bind_address: IpAddr,
    /// Serving certificate of the kubelet API.
    pub tls_cert_file: Option<PathBuf>,
    /// Serving key of the kubelet API.
    pub tls_private_key_file: Option<PathBuf>,
    /// The lowest TLS version the kubelet API accepts (tlsMinVersion, default TLS 1.2).
    pub tls_min_version: tls_settings::TlsMinVersion,
    /// The TLS 1.2 cipher suites the kubelet API offers, IANA numbers (tlsCipherSuites; empty: the TLS
    /// library's).
    pub tls_cipher_suites: Vec<u16>,
    /// Obtain the serving certificate from the cluster's `kubernetes.io/kubelet-serving` signer and renew it
    /// (serverTLSBootstrap, default false).
    pub server_tls_bootstrap: bool,
    /// Renew the client certificate from the cluster before it expires (rotateCertificates, default false).
    pub rotate_certificates: bool,
    /// Kubelet API authentication.
    pub authentication: Authentication,
    /// Kubelet API authorization.
    pub authorization: Authorization,
    /// Serve logs/exec/attach/port-forward (default true).
    pub enable_debugging_handlers: bool,
    /// Idle timeout of streaming connections (default 4h).
    pub streaming_connection_idle_timeout: Duration,

    /// Directory or file of static pods (default none).
    pub static_pod_path: Option<PathBuf>,
    /// URL of static pods, `http://` only (default none).
    pub static_pod_url: Option<String>,
    /// Headers sent when fetching `static_pod_url`.
    pub static_pod_url_header: std::collections::BTreeMap<String, Vec<String>>,
    /// Max period between pod syncs (default 1m).
    pub sync_frequency: Duration,
    /// How often the static pod path is checked (default 20s).
    pub file_check_frequency: Duration,
    /// How often the static pod URL is checked (default 20s).
    pub http_check_frequency: Duration,
    /// Where container logs go (default /var/log/pods).
    pub pod_logs_dir: PathBuf,

    /// How often node status is computed (default 10s).
    pub node_status_update_frequency: Duration,
    /// How often node status is written even without a change (default 5m, or the update frequency when only
    /// that one was set — as upstream).
    pub node_status_report_frequency: Duration,
    /// Lease duration (default 40); renewals every quarter of it.
    pub node_lease_duration_seconds: u32,
    /// Cap on `status.images`; `None` = no cap (file value -1). Default 50.
    pub node_status_max_images: Option<u32>,
    /// Create the Node object (default true).
    pub register_node: bool,
    /// Taints set when the Node is first created.
    pub register_with_taints: Vec<Taint>,
    /// `spec.providerID`.
    pub provider_id: Option<String>,
    /// Let the attach/detach controller manage volumes (default true; sets the node annotation).
    pub enable_controller_attach_detach: bool,

    /// Pods capacity (default 110).
    pub max_pods: u32,
    /// Pods per core, 0 = no per-core limit (default 0).
    pub pods_per_core: u32,
    /// Pod CIDR(s) set on the Node at registration (comma-separated dual-stack pair allowed); default none —
    /// the controller-manager's IPAM assigns one.
    pub pod_cidr: Option<String>,
    /// Max PIDs per pod, -1 = no limit (default -1).
    pub pod_pids_limit: i64,
    /// `enforceNodeAllocatable` (default `[pods]`; empty for `[none]`, and with `cgroupsPerQOS: false` when not
    /// given): `pods` limits the node's pod cgroup to allocatable, `kube-reserved` / `system-reserved` (and their
    /// `-compressible` forms, cpu only) limit the named reservation cgroups to the reservations.
    pub enforce_node_allocatable: Vec<String>,
    /// `kubeReservedCgroup`: the existing cgroup `kube-reserved` is enforced on (empty: none).
    pub kube_reserved_cgroup: String,
    /// `systemReservedCgroup`: the existing cgroup `system-reserved` is enforced on (empty: none).
    pub system_reserved_cgroup: String,
    /// `oomScoreAdj`: the agent's own `oom_score_adj` (default -999).
    pub oom_score_adj: i64,
    /// Resources reserved for Kubernetes daemons (`kubeReserved`).
    pub kube_reserved: BTreeMap<String, Quantity>,
    /// Resources reserved for the OS (`systemReserved`).
    pub system_reserved: BTreeMap<String, Quantity>,
    /// Hard eviction thresholds, by signal (default memory.available<100Mi, nodefs.available<10%,
    /// nodefs.inodesFree<5%, imagefs.available<15%, imagefs.inodesFree<5%).
    pub eviction_hard: BTreeMap<String, Threshold>,
    /// Soft eviction thresholds, by signal.
    pub eviction_soft: BTreeMap<String, Threshold>,
    /// Grace periods of the soft thresholds.
    pub eviction_soft_grace_period: BTreeMap<String, Duration>,
    /// How long a pressure condition stays after the signal clears (default 5m).
    pub eviction_pressure_transition_period: Duration,
    /// Max pod grace period on soft eviction, seconds (default 0).
    pub eviction_max_pod_grace_period: i64,
    /// Minimum reclaim per signal.
    pub eviction_minimum_reclaim: BTreeMap<String, Threshold>,
    /// Report and account `ephemeral-storage` (default true).
    pub local_storage_capacity_isolation: bool,

    /// API requests per second, 0 = unlimited (default 50).
    pub kube_api_qps: u32,
    /// API burst (default 100).
    pub kube_api_burst: u32,
    /// Events per second, 0 = unlimited (default 50).
    pub event_record_qps: u32,
    /// Event burst (default 100).
    pub event_burst: u32,
    /// API content type (default application/vnd.kubernetes.protobuf; this agent speaks JSON).
    pub content_type: String,

    /// CRI endpoint (default unix:///run/containerd/containerd.sock).
    pub container_runtime_endpoint: String,
    /// CRI image endpoint (default: the runtime endpoint).
    pub image_service_endpoint: String,
    /// Timeout of runtime calls (default 2m).
    pub runtime_request_timeout: Duration,
    /// Pull one image at a time (default true, false when maxParallelImagePulls >= 2).
    pub serialize_image_pulls: bool,
    /// Parallel pulls cap.
    pub max_parallel_image_pulls: Option<u32>,
    /// Image pulls per second, 0 = unlimited (default 5).
    pub registry_pull_qps: u32,
    /// Image pull burst (default 10).
    pub registry_burst: u32,
    /// Minimum age of an unused image before GC (default 2m).
    pub image_minimum_gc_age: Duration,
    /// Maximum age of an unused image, 0 = none (default 0).
    pub image_maximum_gc_age: Duration,
    /// Image GC starts above this disk usage percent (default 85).
    pub image_gc_high_threshold_percent: u8,
    /// Image GC frees down to this percent (default 80).
    pub image_gc_low_threshold_percent: u8,
    /// A running container's log is rotated once it reaches this size; negative turns rotation off (default
    /// 10Mi).
    pub container_log_max_size: Quantity,
    /// Log files kept per container, the one being written included (default 5, at least 2).
    pub container_log_max_files: u32,
    /// Containers whose logs are rotated at once (default 1).
    pub container_log_max_workers: u32,
    /// How often the container logs' sizes are checked (default 10s, at least 3s).
    pub container_log_monitor_interval: Duration,

    /// Cluster DNS domain.
    pub cluster_domain: Option<String>,
    /// Cluster DNS servers.
    pub cluster_dns: Vec<IpAddr>,
    /// resolv.conf handed to pods (default /etc/resolv.conf).
    pub resolv_conf: String,
    /// Sysctls and `*` prefix patterns pods may set beyond the safe set (`allowedUnsafeSysctls`).
    pub allowed_unsafe_sysctls: Vec<String>,
    /// How ConfigMaps and Secrets that pods use are read again: `Watch` (default), `Cache` or `Get`.
    pub config_map_and_secret_change_detection_strategy: String,
    /// Hairpin mode (default promiscuous-bridge).
    pub hairpin_mode: String,
    /// Volume stats period (default 1m).
    pub volume_stats_agg_period: Duration,
    /// Graceful node shutdown period (default 0 = off).
    pub shutdown_grace_period: Duration,
    /// Part of it kept for critical pods (default 0).
    pub shutdown_grace_period_critical_pods: Duration,
    /// Shutdown periods by pod priority (instead of the two above), lowest priority first.
    pub shutdown_grace_period_by_pod_priority: Vec<ShutdownGroup>,
    /// Refuse to run with swap on (default true).
    pub fail_swap_on: bool,
    /// Cgroup driver (default cgroupfs).
    pub cgroup_driver: String,
    /// QoS cgroup hierarchy (default true): pods in `<cgroupRoot>/kubepods/...` on a real node.
    pub cgroups_per_qos: bool,
    /// The root of the QoS cgroups (default `/`).
    pub cgroup_root: String,
    /// Feature gates as given.
    pub feature_gates: BTreeMap<String, bool>,
    /// `qosReserved`: the percentage of the Guaranteed and Burstable pods' memory requests kept from the lower QoS
    /// classes. Validated as the kubelet validates it; the kubelet applies it only with its alpha `QOSReserved`
    /// feature gate on (off by default), which node-agent does not implement (warned about then).
    pub qos_reserved_memory: Option<i64>,
}

impl Default for KubeletConfig {
    /// The upstream kubelet's defaults.
    fn default() -> Self {
        resolve::defaults()
    }
}

impl KubeletConfig {
    /// How often the lease is renewed: a quarter of its duration (10 s for the default 40 s), as upstream.
    pub fn lease_renew_interval(&self) -> Duration {
        Duration::from_secs(u64::from(self.node_lease_duration_seconds)).mul_f64(0.25)
    }
}

/// Garbage collection settings that the kubelet takes as flags rather than from its configuration file.
///
/// The container GC policy: dead containers older than `minimum_container_ttl` may be removed; at most
/// `max_dead_per_container` of them are kept per container of a pod and `max_dead_containers` on the node (a
/// negative number: no limit). The two periods are node-agent's own (`--container-gc-period`,
/// `--image-gc-period`); the kubelet's are fixed at 1 min and 5 min.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcSettings {
    /// `--minimum-container-ttl-duration` (default 0).
    pub minimum_container_ttl: Duration,
    /// `--maximum-dead-containers-per-container` (default 1).
    pub max_dead_per_container: i32,
    /// `--maximum-dead-containers` (default -1, no limit).
    pub max_dead_containers: i32,
    /// How often dead containers are collected (default 1 min).
    pub container_gc_period: Duration,
    /// How often unused images are collected (default 5 min).
    pub image_gc_period: Duration,
}

impl Default for GcSettings {
    /// The kubelet's defaults.
    fn default() -> Self {
        Self {
            minimum_container_ttl: Duration::ZERO,
            max_dead_per_container: 1,
            max_dead_containers: -1,
            container_gc_period: Duration::from_secs(60),
            image_gc_period: Duration::from_secs(300),
        }
    }
}

/// Everything one agent needs: the shared kubelet settings plus this node's identity and machine facts.
///
/// A plain value: the binary or the hollow fleet builds it; thousands of them share one `Arc<KubeletConfig>`.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The Node name (lowercase DNS subdomain).
    pub node_name: String,
    /// The hostname: `kubernetes.io/hostname` label and the `Hostname` address.
    pub hostname: String,
    /// The `InternalIP` address.
    pub node_ip: IpAddr,
    /// The kubelet API port this node publishes in `daemonEndpoints` (default: the shared `port`; a hollow fleet
    /// gives every node its own).
    pub kubelet_port: u16,
    /// Labels added at registration (`--node-labels`). Shared: a fleet's nodes of one profile and zone hold
    /// one copy.
    pub node_labels: Arc<BTreeMap<String, String>>,
    /// The shared kubelet settings.
    pub kubelet: Arc<KubeletConfig>,
    /// Machine facts: capacity and nodeInfo.
    pub machine: MachineInfo,
    /// `nodeInfo.kubeletVersion` (one shared copy unless changed).
    pub kubelet_version: Arc<str>,
    /// On graceful stop, mark the Node unschedulable (undone at the next start).
    pub mark_unschedulable_on_shutdown: bool,
    /// Container and image garbage collection (flags; the image thresholds are in `kubelet`). Shared: a fleet's
    /// nodes hold one copy.
    pub gc: Arc<GcSettings>,
}

impl AgentConfig {
    /// A config for node `node_name` at `node_ip` with the given shared settings and machine facts; hostname =
    /// node name, no extra labels.
    pub fn new(
        node_name: impl Into<String>,
        node_ip: IpAddr,
        kubelet: Arc<KubeletConfig>,
        machine: MachineInfo,
    ) -> Self {
        let node_name = node_name.into();
        Self {
            hostname: node_name.clone(),
            node_name,
            node_ip,
            kubelet_port: kubelet.port,
            node_labels: Arc::default(),
            kubelet,
            machine,
            kubelet_version: {
                static VERSION: std::sync::LazyLock<Arc<str>> =
                    std::sync::LazyLock::new(|| Arc::from(KUBELET_VERSION));
                VERSION.clone()
            },
            mark_unschedulable_on_shutdown: false,
            gc: Arc::default(),
        }
    }

    /// Checks the per-node fields (name, labels); the shared part was checked when it was resolved.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut errors = Vec::new();
        if let Err(message) = validate_node_name(&self.node_name) {
            errors.push(FieldError {
                field: "nodeName (--hostname-override)".into(),
                message,
            });
        }
        if self.hostname.is_empty() {
            errors.push(FieldError {
                field: "hostname".into(),
                message: "must not be empty".into(),
            });
        }
        errors.extend(validate_node_labels(&self.node_labels));
        for (field, period) in [
            (
                "containerGCPeriod (--container-gc-period)",
                self.gc.container_gc_period,
            ),
            ("imageGCPeriod (--image-gc-period)", self.gc.image_gc_period),
        ] {
            if period.is_zero() {
                errors.push(FieldError {
                    field: field.into(),
                    message: "must be greater than zero".into(),
                });
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid { errors })
        }
    }
}
