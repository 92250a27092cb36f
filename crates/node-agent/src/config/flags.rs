//! The `node-agent` command line: kubelet-style flags, each overriding the matching file field.
//!
//! Only flags given explicitly override the file (every flag is optional); the merged result is resolved with the
//! upstream defaults by [`resolve`](super::resolve). Errors name the file field and the flag.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use super::file::{FileConfig, FileTaint};
use super::{AgentConfig, ConfigError, FieldError, KubeletConfig, Unacted, load_file, resolve};
use crate::machine::MachineInfo;

/// Which container runtime the binary drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum RuntimeKind {
    /// A CRI v1 runtime over `--container-runtime-endpoint` (containerd, CRI-O).
    #[default]
    Remote,
    /// The in-memory fake runtime (one hollow node).
    Fake,
}

/// What starts graceful node shutdown (`--shutdown-trigger`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum ShutdownTrigger {
    /// The machine's shutdown as systemd-logind announces it (a delay inhibitor lock and its
    /// `PrepareForShutdown` signal), as the kubelet does; SIGTERM only stops node-agent, pods keep running.
    #[default]
    Logind,
    /// SIGTERM, for machines without systemd-logind: any stop of node-agent (a service restart too) stops
    /// the node's pods.
    Sigterm,
}

/// `key=value` pairs (`--node-labels`, `--kube-reserved`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyValues(pub BTreeMap<String, String>);

/// A list of taints (`--register-with-taints`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaintList(pub(crate) Vec<FileTaint>);

/// The kubelet-style command line of `node-agent`.
#[derive(Debug, Clone, Default, Parser)]
#[command(
    name = "node-agent",
    disable_version_flag = true,
    about = "A Kubernetes node agent (kubelet): registers the node, keeps its lease and status, runs its pods.",
    long_about = None
)]
pub struct Flags {
    /// Print the version as the kubelet prints it (`Kubernetes v1.36.3`, the release whose node side this agent
    /// implements, with node-agent's own version as build metadata) and exit; kubeadm's preflight reads it.
    #[arg(long)]
    pub version: bool,

    /// KubeletConfiguration file (kubelet.config.k8s.io/v1beta1). Flags given explicitly override its fields.
    #[arg(long, value_name = "FILE", env = "NODE_AGENT_CONFIG")]
    pub config: Option<PathBuf>,

    /// kubeconfig holding the node's credentials (client certificate CN=system:node:<name>).
    #[arg(long, value_name = "FILE", env = "NODE_AGENT_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// kubeconfig used to obtain the node's client certificate (TLS bootstrap) when `--kubeconfig` does not exist
    /// or its certificate is no longer valid; the new kubeconfig is written at the `--kubeconfig` path.
    #[arg(long, value_name = "FILE", env = "NODE_AGENT_BOOTSTRAP_KUBECONFIG")]
    pub bootstrap_kubeconfig: Option<PathBuf>,

    /// Directory of the node's certificates (TLS bootstrap, rotation, serverTLSBootstrap); default
    /// `<root-dir>/pki`.
    #[arg(long, value_name = "DIR")]
    pub cert_dir: Option<PathBuf>,

    /// Renew the client certificate before it expires (rotateCertificates).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub rotate_certificates: Option<bool>,

    /// Node name and hostname to use instead of the machine's hostname.
    #[arg(long, value_name = "NAME", env = "NODE_AGENT_HOSTNAME_OVERRIDE")]
    pub hostname_override: Option<String>,

    /// IP address published as the node's InternalIP (default 127.0.0.1; a loopback address is accepted with a
    /// warning).
    #[arg(long, value_name = "IP", env = "NODE_AGENT_NODE_IP")]
    pub node_ip: Option<IpAddr>,

    /// Labels added when the node registers: key=value,key2=value2.
    #[arg(long, value_name = "LABELS", value_parser = parse_key_values)]
    pub node_labels: Option<KeyValues>,

    /// Container runtime: `remote` (CRI over --container-runtime-endpoint) or `fake` (in memory).
    #[arg(long, value_enum, default_value_t = RuntimeKind::Remote, env = "NODE_AGENT_RUNTIME")]
    pub runtime: RuntimeKind,

    /// CRI runtime endpoint, e.g. unix:///run/containerd/containerd.sock (containerRuntimeEndpoint).
    #[arg(long, value_name = "ENDPOINT", env = "NODE_AGENT_CONTAINER_RUNTIME_ENDPOINT")]
    pub container_runtime_endpoint: Option<String>,

    /// CRI image service endpoint, default the runtime endpoint (imageServiceEndpoint).
    #[arg(long, value_name = "ENDPOINT")]
    pub image_service_endpoint: Option<String>,

    /// Register the node with the API server (registerNode).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub register_node: Option<bool>,

    /// Taints set at registration: key=value:Effect,key2:Effect (registerWithTaints).
    #[arg(long, value_name = "TAINTS", value_parser = parse_taints)]
    pub register_with_taints: Option<TaintList>,

    /// Maximum number of pods (maxPods).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_pods: Option<i64>,

    /// Pod CIDR(s) to set at registration (podCIDR); normally the controller-manager assigns one.
    #[arg(long, value_name = "CIDR")]
    pub pod_cidr: Option<String>,

    /// Resources reserved for Kubernetes daemons: cpu=100m,memory=256Mi (kubeReserved).
    #[arg(long, value_name = "RESOURCES", value_parser = parse_key_values)]
    pub kube_reserved: Option<KeyValues>,

    /// Resources reserved for the OS: cpu=100m,memory=256Mi (systemReserved).
    #[arg(long, value_name = "RESOURCES", value_parser = parse_key_values)]
    pub system_reserved: Option<KeyValues>,

    /// Hard eviction thresholds: memory.available<100Mi,nodefs.available<10% (evictionHard).
    #[arg(long, value_name = "THRESHOLDS", value_parser = parse_eviction)]
    pub eviction_hard: Option<KeyValues>,

    /// How often node status is computed, e.g. 10s (nodeStatusUpdateFrequency).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub node_status_update_frequency: Option<Duration>,

    /// Max period between pod syncs, e.g. 1m (syncFrequency).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub sync_frequency: Option<Duration>,

    /// Directory of static pod manifests (staticPodPath).
    #[arg(long, value_name = "DIR")]
    pub pod_manifest_path: Option<String>,

    /// Address the kubelet API binds (address).
    #[arg(long, value_name = "IP")]
    pub address: Option<String>,

    /// Port of the kubelet API, published in daemonEndpoints (port).
    #[arg(long, value_name = "PORT", allow_negative_numbers = true)]
    pub port: Option<i64>,

    /// Read-only port, 0 disables (readOnlyPort).
    #[arg(long, value_name = "PORT", allow_negative_numbers = true)]
    pub read_only_port: Option<i64>,

    /// The lowest TLS version the kubelet API accepts: VersionTLS12 or VersionTLS13 (tlsMinVersion).
    #[arg(long, value_name = "VERSION")]
    pub tls_min_version: Option<String>,

    /// TLS 1.2 cipher suites of the kubelet API, Go names, comma-separated (tlsCipherSuites).
    #[arg(long, value_name = "SUITES", value_delimiter = ',')]
    pub tls_cipher_suites: Option<Vec<String>>,

    /// Healthz port, 0 disables (healthzPort).
    #[arg(long, value_name = "PORT", allow_negative_numbers = true)]
    pub healthz_port: Option<i64>,

    /// Healthz bind address (healthzBindAddress).
    #[arg(long, value_name = "IP")]
    pub healthz_bind_address: Option<String>,

    /// Cluster DNS domain (clusterDomain).
    #[arg(long, value_name = "DOMAIN")]
    pub cluster_domain: Option<String>,

    /// Cluster DNS server IPs, comma-separated (clusterDNS).
    #[arg(long, value_name = "IPS", value_delimiter = ',')]
    pub cluster_dns: Option<Vec<String>>,

    /// API requests per second, 0 = unlimited (kubeAPIQPS).
    #[arg(long, value_name = "QPS", allow_negative_numbers = true)]
    pub kube_api_qps: Option<i64>,

    /// API burst (kubeAPIBurst).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub kube_api_burst: Option<i64>,

    /// Events per second, 0 = unlimited (eventRecordQPS).
    #[arg(long, value_name = "QPS", allow_negative_numbers = true)]
    pub event_qps: Option<i64>,

    /// Event burst (eventBurst).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub event_burst: Option<i64>,

    /// Timeout of runtime calls, e.g. 2m (runtimeRequestTimeout).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub runtime_request_timeout: Option<Duration>,

    /// Provider ID set on the Node (providerID).
    #[arg(long, value_name = "ID")]
    pub provider_id: Option<String>,

    /// The agent's state directory; its filesystem is measured for ephemeral-storage capacity.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/kubelet")]
    pub root_dir: PathBuf,

    /// On SIGTERM, mark the node unschedulable before exiting (undone at the next start).
    #[arg(long)]
    pub mark_unschedulable_on_shutdown: bool,

    /// Minimum age of a dead container before it may be garbage collected, e.g. 1m (0: any age).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub minimum_container_ttl_duration: Option<Duration>,

    /// Dead instances kept per container of a pod (negative: no limit; default 1). The newest two instances of
    /// each container of a pod that still exists are kept whatever this says (restart count, lastState, logs).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub maximum_dead_containers_per_container: Option<i32>,

    /// Dead containers kept on the node in total (negative: no limit; default -1).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub maximum_dead_containers: Option<i32>,

    /// How often dead containers are garbage collected (node-agent's own; the kubelet's is fixed at 1m).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "1m")]
    pub container_gc_period: Duration,

    /// How often unused images are garbage collected (node-agent's own; the kubelet's is fixed at 5m).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "5m")]
    pub image_gc_period: Duration,

    /// What starts graceful node shutdown when `shutdownGracePeriod` is set: `logind` (the machine's shutdown,
    /// as the kubelet) or `sigterm` (for machines without systemd-logind; a restart of node-agent then stops
    /// the pods too).
    #[arg(long, value_enum, value_name = "TRIGGER", default_value_t = ShutdownTrigger::Logind)]
    pub shutdown_trigger: ShutdownTrigger,

    /// How long a graceful stop may take before tasks are abandoned, e.g. 10s.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10s")]
    pub shutdown_timeout: Duration,
}

/// What `--version` prints: the kubelet's `Kubernetes v<release>` line, a semantic version whose build metadata
/// names this agent's own version.
pub fn version_line() -> String {
    format!(
        "Kubernetes {}+node-agent.{}",
        super::KUBELET_VERSION,
        env!("CARGO_PKG_VERSION")
    )
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    super::duration::parse(s).map_err(|e| e.to_string())
}

fn parse_key_values(s: &str) -> Result<KeyValues, String> {
    let mut out = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?} is not key=value"))?;
        if k.trim().is_empty() {
            return Err(format!("{part:?} has an empty key"));
        }
        out.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    Ok(KeyValues(out))
}

fn parse_eviction(s: &str) -> Result<KeyValues, String> {
    let mut out = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('<')
            .ok_or_else(|| format!("{part:?} is not signal<threshold"))?;
        out.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    Ok(KeyValues(out))
}

fn parse_taints(s: &str) -> Result<TaintList, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (kv, effect) = part
            .rsplit_once(':')
            .ok_or_else(|| format!("{part:?} is not key[=value]:Effect"))?;
        let (key, value) = match kv.split_once('=') {
            Some((k, v)) => (k.to_owned(), Some(v.to_owned())),
            None => (kv.to_owned(), None),
        };
        out.push(FileTaint {
            key,
            value,
            effect: effect.to_owned(),
            time_added: None,
        });
    }
    Ok(TaintList(out))
}

impl Flags {
    /// Lays the explicitly given flags over `file`, recording in `origins` which field each flag set.
    pub(crate) fn overlay(&self, file: &mut FileConfig, origins: &mut BTreeMap<&'static str, &'static str>) {
        macro_rules! set {
            ($flag:expr, $field:ident, $name:literal, $flagname:literal) => {
                if let Some(v) = &$flag {
                    file.$field = Some(v.clone().into());
                    origins.insert($name, $flagname);
                }
            };
        }
        set!(
            self.container_runtime_endpoint,
            container_runtime_endpoint,
            "containerRuntimeEndpoint",
            "--container-runtime-endpoint"
        );
        set!(
            self.image_service_endpoint,
            image_service_endpoint,
            "imageServiceEndpoint",
            "--image-service-endpoint"
        );
        set!(
            self.register_node,
            register_node,
            "registerNode",
            "--register-node"
        );
        set!(
            self.rotate_certificates,
            rotate_certificates,
            "rotateCertificates",
            "--rotate-certificates"
        );
        set!(self.max_pods, max_pods, "maxPods", "--max-pods");
        set!(self.pod_cidr, pod_cidr, "podCIDR", "--pod-cidr");
        set!(
            self.node_status_update_frequency,
            node_status_update_frequency,
            "nodeStatusUpdateFrequency",
            "--node-status-update-frequency"
        );
        set!(
            self.sync_frequency,
            sync_frequency,
            "syncFrequency",
            "--sync-frequency"
        );
        set!(
            self.pod_manifest_path,
            static_pod_path,
            "staticPodPath",
            "--pod-manifest-path"
        );
        set!(self.address, address, "address", "--address");
        set!(self.port, port, "port", "--port");
        set!(
            self.read_only_port,
            read_only_port,
            "readOnlyPort",
            "--read-only-port"
        );
        set!(self.healthz_port, healthz_port, "healthzPort", "--healthz-port");
        set!(
            self.tls_min_version,
            tls_min_version,
            "tlsMinVersion",
            "--tls-min-version"
        );
        set!(
            self.tls_cipher_suites,
            tls_cipher_suites,
            "tlsCipherSuites",
            "--tls-cipher-suites"
        );
        set!(
            self.healthz_bind_address,
            healthz_bind_address,
            "healthzBindAddress",
            "--healthz-bind-address"
        );
        set!(
            self.cluster_domain,
            cluster_domain,
            "clusterDomain",
            "--cluster-domain"
        );
        set!(self.cluster_dns, cluster_dns, "clusterDNS", "--cluster-dns");
        set!(self.kube_api_qps, kube_api_qps, "kubeAPIQPS", "--kube-api-qps");
        set!(
            self.kube_api_burst,
            kube_api_burst,
            "kubeAPIBurst",
            "--kube-api-burst"
        );
        set!(self.event_qps, event_record_qps, "eventRecordQPS", "--event-qps");
        set!(self.event_burst, event_burst, "eventBurst", "--event-burst");
        set!(
            self.runtime_request_timeout,
            runtime_request_timeout,
            "runtimeRequestTimeout",
            "--runtime-request-timeout"
        );
        set!(self.provider_id, provider_id, "providerID", "--provider-id");
        if let Some(v) = &self.kube_reserved {
            file.kube_reserved = Some(v.0.clone());
            origins.insert("kubeReserved", "--kube-reserved");
        }
        if let Some(v) = &self.system_reserved {
            file.system_reserved = Some(v.0.clone());
            origins.insert("systemReserved", "--system-reserved");
        }
        if let Some(v) = &self.eviction_hard {
            file.eviction_hard = Some(v.0.clone());
            origins.insert("evictionHard", "--eviction-hard");
        }
        if let Some(v) = &self.register_with_taints {
            file.register_with_taints = Some(v.0.clone());
            origins.insert("registerWithTaints", "--register-with-taints");
        }
    }

    /// Reads `--config` (if given), lays the flags over it and resolves the result with the kubelet's defaults.
    /// Also returns the settings given (in the file or by flags) that do not take effect, for a warning.
    pub fn kubelet_config(&self) -> Result<(KubeletConfig, Unacted), ConfigError> {
        let loaded = match &self.config {
            Some(path) => load_file(path)?,
            None => Default::default(),
        };
        let mut file = loaded.file;
        let mut origins = BTreeMap::new();
        self.overlay(&mut file, &mut origins);
        let config = resolve::resolve(&file, &origins)?;
        let set = loaded
            .present_fields
            .iter()
            .map(String::as_str)
            .chain(origins.keys().copied());
        let unacted = super::effect::unacted(&loaded.ignored_fields, set, &config);
        Ok((config, unacted))
    }

    /// The per-node config: the node name is `--hostname-override` or `machine_hostname`, lowercased.
    pub fn agent_config(
        &self,
        kubelet: Arc<KubeletConfig>,
        machine: MachineInfo,
        machine_hostname: &str,
    ) -> Result<AgentConfig, ConfigError> {
        let hostname = self
            .hostname_override
            .as_deref()
            .unwrap_or(machine_hostname)
            .trim()
            .to_ascii_lowercase();
        if hostname.is_empty() {
            return Err(ConfigError::Invalid {
                errors: vec![FieldError {
                    field: "nodeName (--hostname-override)".into(),
                    message: "empty: the machine has no hostname and --hostname-override was not given"
                        .into(),
                }],
            });
        }
        let node_ip = self.node_ip.unwrap_or(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
        let mut cfg = AgentConfig::new(hostname, node_ip, kubelet, machine);
        cfg.node_labels = Arc::new(self.node_labels.clone().map(|l| l.0).unwrap_or_default());
        cfg.mark_unschedulable_on_shutdown = self.mark_unschedulable_on_shutdown;
        let defaults = super::GcSettings::default();
        cfg.gc = Arc::new(super::GcSettings {
            minimum_container_ttl: self
                .minimum_container_ttl_duration
                .unwrap_or(defaults.minimum_container_ttl),
            max_dead_per_container: self
                .maximum_dead_containers_per_container
                .unwrap_or(defaults.max_dead_per_container),
            max_dead_containers: self
                .maximum_dead_containers
                .unwrap_or(defaults.max_dead_containers),
            container_gc_period: self.container_gc_period,
            image_gc_period: self.image_gc_period,
        });
        cfg.validate()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> Flags {
        let mut argv = vec!["node-agent"];
        argv.extend_from_slice(args);
        Flags::try_parse_from(argv).unwrap()
    }

    /// kubeadm's preflight takes the whole output of `kubelet --version` as `Kubernetes v<semver>`.
    #[test]
    fn version_reads_as_the_kubelets() {
        assert!(flags(&["--version"]).version);
        let line = version_line();
        let semver = line.strip_prefix("Kubernetes v").unwrap();
        let (release, build) = semver.split_once('+').unwrap();
        assert_eq!(format!("v{release}"), crate::config::KUBELET_VERSION);
        assert_eq!(release.split('.').filter(|p| p.parse::<u32>().is_ok()).count(), 3);
        assert!(
            build
                .split('.')
                .all(|id| !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')),
            "{build}"
        );
    }

    #[test]
    fn flags_override_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet.yaml");
        std::fs::write(
            &path,
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 20\nport: 11000\n\
             nodeStatusUpdateFrequency: 20s\n",
        )
        .unwrap();
        let f = flags(&[
            "--config",
            path.to_str().unwrap(),
            "--max-pods=30",
            "--register-with-taints=a=b:NoSchedule,c:NoExecute",
            "--eviction-hard=memory.available<1Gi",
            "--kube-reserved=cpu=100m,memory=1Gi",
            "--register-node=false",
        ]);
        let (c, unacted) = f.kubelet_config().unwrap();
        assert!(unacted.no_effect.is_empty(), "{unacted:?}");
        assert_eq!(c.max_pods, 30, "flag wins");
        assert_eq!(c.port, 11000, "file kept where no flag");
        assert_eq!(c.node_status_update_frequency, Duration::from_secs(20));
        assert_eq!(c.register_with_taints.len(), 2);
        assert_eq!(c.register_with_taints[0].value.as_deref(), Some("b"));
        assert_eq!(c.register_with_taints[1].effect, "NoExecute");
        assert_eq!(c.eviction_hard.len(), 1);
        assert_eq!(c.kube_reserved["cpu"].milli(), 100);
        assert!(!c.register_node);
    }

    #[test]
    fn flag_errors_name_field_and_flag() {
        let f = flags(&["--max-pods=-3", "--kube-reserved=gpu=1"]);
        let e = f.kubelet_config().unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("maxPods (--max-pods)"), "{msg}");
        assert!(msg.contains("kubeReserved[gpu] (--kube-reserved)"), "{msg}");
        assert!(Flags::try_parse_from(["node-agent", "--node-status-update-frequency=soon"]).is_err());
        assert!(Flags::try_parse_from(["node-agent", "--node-labels=novalue"]).is_err());
    }

    #[test]
    fn agent_config_from_flags() {
        let f = flags(&[
            "--hostname-override=Node-1",
            "--node-ip=10.1.2.3",
            "--node-labels=a=b,node.kubernetes.io/pool=x",
        ]);
        let cfg = f
            .agent_config(
                Arc::new(KubeletConfig::default()),
                MachineInfo::synthetic("node-1"),
                "ignored",
            )
            .unwrap();
        assert_eq!(cfg.node_name, "node-1");
        assert_eq!(cfg.node_ip.to_string(), "10.1.2.3");
        assert_eq!(cfg.node_labels.len(), 2);
        let f = flags(&["--node-labels=node-role.kubernetes.io/master="]);
        let e = f
            .agent_config(
                Arc::new(KubeletConfig::default()),
                MachineInfo::synthetic("h"),
                "h",
            )
            .unwrap_err();
        assert!(e.to_string().contains("node-role.kubernetes.io/master"), "{e}");
        let f = flags(&[]);
        let cfg = f
            .agent_config(
                Arc::new(KubeletConfig::default()),
                MachineInfo::synthetic("h"),
                "My-Host",
            )
            .unwrap();
        assert_eq!(cfg.node_name, "my-host");
        assert!(cfg.node_ip.is_loopback());
        assert_eq!(
            *cfg.gc,
            crate::config::GcSettings::default(),
            "the kubelet's GC defaults"
        );
    }

    #[test]
    fn container_gc_flags_reach_the_agent_config() {
        let f = flags(&[
            "--minimum-container-ttl-duration=1m30s",
            "--maximum-dead-containers-per-container=2",
            "--maximum-dead-containers=-1",
            "--container-gc-period=5s",
            "--image-gc-period=10s",
        ]);
        let cfg = f
            .agent_config(
                Arc::new(KubeletConfig::default()),
                MachineInfo::synthetic("h"),
                "h",
            )
            .unwrap();
        assert_eq!(cfg.gc.minimum_container_ttl, Duration::from_secs(90));
        assert_eq!(
            (cfg.gc.max_dead_per_container, cfg.gc.max_dead_containers),
            (2, -1)
        );
        assert_eq!(
            (cfg.gc.container_gc_period, cfg.gc.image_gc_period),
            (Duration::from_secs(5), Duration::from_secs(10))
        );
        let e = flags(&["--image-gc-period=0"])
            .agent_config(
                Arc::new(KubeletConfig::default()),
                MachineInfo::synthetic("h"),
                "h",
            )
            .unwrap_err();
        assert!(e.to_string().contains("imageGCPeriod (--image-gc-period)"), "{e}");
        assert!(Flags::try_parse_from(["node-agent", "--minimum-container-ttl-duration=-1s"]).is_err());
    }
}
