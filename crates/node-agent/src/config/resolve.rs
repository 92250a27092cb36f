//! Defaults and validation: [`FileConfig`] (file, with flags laid over it) -> [`KubeletConfig`].
//!
//! The defaults are the upstream kubelet's (`kubelet.config.k8s.io/v1beta1` defaulting). Validation collects every
//! problem before failing, and names each field the way the file spells it, with the flag in parentheses when a
//! flag supplied the value.
//!
//! This module reads the file and runs [`resolve`] over every field in the order the errors are reported; the
//! fields that take more than a line to check are checked in a module each: eviction thresholds (`eviction`),
//! image garbage collection and pulls (`images`), container log rotation (`container_logs`), the runtime's
//! endpoints (`runtime`), graceful shutdown (`shutdown`), and node allocatable enforcement and `qosReserved`
//! (`node_allocatable`).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::check::{Check, taint};
use super::file::{self, FileConfig};
use super::validate;
use super::{Authentication, Authorization, AuthorizationMode, ConfigError, KubeletConfig, Unacted};

mod container_logs;
mod eviction;
mod images;
mod node_allocatable;
mod runtime;
mod shutdown;

pub use eviction::default_eviction_hard;

use container_logs::container_log_rotation;
use node_allocatable::{enforce_node_allocatable, qos_reserved};

/// A configuration file read from disk (or text), before flags and defaults.
#[derive(Debug, Clone, Default)]
pub struct LoadedConfig {
    pub(crate) file: FileConfig,
    /// Upstream fields present in the file that this agent accepts without acting on them.
    pub ignored_fields: Vec<String>,
    /// The fields this agent reads that the file gives a value.
    pub(crate) present_fields: Vec<String>,
}

impl LoadedConfig {
    /// Parses KubeletConfiguration text; `source` names it in errors.
    pub fn parse(text: &str, source: &str) -> Result<Self, ConfigError> {
        let parsed = file::parse(text, source)?;
        Ok(Self {
            file: parsed.config,
            ignored_fields: parsed.ignored,
            present_fields: parsed.present,
        })
    }

    /// Whether the file gives `field` (a field this agent reads, named as in the file) a value.
    pub fn gives(&self, field: &str) -> bool {
        self.present_fields.iter().any(|f| f == field)
    }

    /// The settings of this file (with no flags laid over it) that do not take effect, given the configuration
    /// resolved from it — what a program loading a file alone warns about at start.
    pub fn unacted(&self, config: &KubeletConfig) -> Unacted {
        super::effect::unacted(
            &self.ignored_fields,
            self.present_fields.iter().map(String::as_str),
            config,
        )
    }
}

/// Reads and parses a KubeletConfiguration file.
pub fn load_file(path: &Path) -> Result<LoadedConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    LoadedConfig::parse(&text, &path.display().to_string())
}

/// Applies defaults to a loaded file (no flags) and validates it.
pub fn resolve_kubelet_config(loaded: &LoadedConfig) -> Result<KubeletConfig, ConfigError> {
    resolve(&loaded.file, &BTreeMap::new())
}

/// The upstream kubelet's defaults.
pub(crate) fn defaults() -> KubeletConfig {
    match resolve(&FileConfig::default(), &BTreeMap::new()) {
        Ok(c) => c,
        // The empty file is valid by construction; keep a total function anyway.
        Err(e) => unreachable_defaults(e),
    }
}

#[cold]
fn unreachable_defaults(e: ConfigError) -> KubeletConfig {
    panic!("built-in defaults failed validation: {e}")
}

/// Resolves `f` (the file with flags laid over it) into a validated [`KubeletConfig`]. `origins` maps a file
/// field to the flag that set it, for error messages.
pub(crate) fn resolve(
    f: &FileConfig,
    origins: &BTreeMap<&'static str, &'static str>,
) -> Result<KubeletConfig, ConfigError> {
    let mut c = Check::new(origins);
    let secs = Duration::from_secs;

    // Report frequency defaults to the update frequency when only that one was set (upstream compatibility rule).
    let update = c.positive(
        "nodeStatusUpdateFrequency",
        f.node_status_update_frequency,
        secs(10),
    );
    let report_default = if f.node_status_update_frequency.is_some() {
        update
    } else {
        secs(300)
    };
    let report = c.positive(
        "nodeStatusReportFrequency",
        f.node_status_report_frequency,
        report_default,
    );

    let lease = f.node_lease_duration_seconds.unwrap_or(40);
    let node_lease_duration_seconds = match u32::try_from(lease) {
        Ok(v) if v > 0 => v,
        _ => {
            c.err(
                "nodeLeaseDurationSeconds",
                format!("{lease} must be greater than zero"),
            );
            40
        }
    };
    let max_images = f.node_status_max_images.unwrap_or(50);
    let node_status_max_images = match max_images {
        -1 => None,
        n if n >= 0 => Some(u32::try_from(n).unwrap_or(u32::MAX)),
        n => {
            c.err(
                "nodeStatusMaxImages",
                format!("{n} must be -1 (no cap) or greater"),
            );
            Some(50)
        }
    };

    let mut register_with_taints = Vec::new();
    for (i, t) in f.register_with_taints.iter().flatten().enumerate() {
        match taint(t) {
            Ok(t) => register_with_taints.push(t),
            Err(message) => c.err(&format!("registerWithTaints[{i}]"), message),
        }
    }

    let pod_cidr = f.pod_cidr.clone().filter(|s| !s.is_empty());
    if let Some(cidrs) = &pod_cidr {
        let parts: Vec<&str> = cidrs.split(',').map(str::trim).collect();
        if parts.len() > 2 {
            c.err("podCIDR", "at most two CIDRs (one per IP family) may be given");
        }
        for p in parts {
            if let Err(m) = validate::validate_cidr(p) {
                c.err("podCIDR", m);
            }
        }
    }
    let pod_pids_limit = match f.pod_pids_limit {
        None => -1,
        Some(n) if n < 0 => -1,
        Some(n) => n,
    };

    let oom_score_adj = f.oom_score_adj.unwrap_or(-999);
    if !(-1000..=1000).contains(&oom_score_adj) {
        c.err(
            "oomScoreAdj",
            format!("{oom_score_adj} must be between -1000 and 1000, inclusive"),
        );
    }
    let kube_reserved_cgroup = f.kube_reserved_cgroup.clone().unwrap_or_default();
    let system_reserved_cgroup = f.system_reserved_cgroup.clone().unwrap_or_default();
    let enforce_node_allocatable = enforce_node_allocatable(
        &mut c,
        f.enforce_node_allocatable.as_deref(),
        f.cgroups_per_qos.unwrap_or(true),
        &kube_reserved_cgroup,
        &system_reserved_cgroup,
    );
    let kube_reserved = c.reserved("kubeReserved", f.kube_reserved.as_ref());
    let system_reserved = c.reserved("systemReserved", f.system_reserved.as_ref());
    let eviction::Eviction {
        eviction_hard,
        eviction_soft,
        eviction_minimum_reclaim,
        eviction_soft_grace_period,
    } = eviction::eviction(&mut c, f);

    let images::Images {
        image_gc_high_threshold_percent,
        image_gc_low_threshold_percent,
        image_minimum_gc_age,
        image_maximum_gc_age,
        max_parallel_image_pulls,
        serialize_image_pulls,
    } = images::images(&mut c, f);

    let container_logs = container_log_rotation(&mut c, f);

    let mut cluster_dns = Vec::new();
    for s in f.cluster_dns.iter().flatten() {
        match s.parse::<IpAddr>() {
            Ok(ip) => cluster_dns.push(ip),
            Err(_) => c.err("clusterDNS", format!("{s:?} is not an IP address")),
        }
    }

    let allowed_unsafe_sysctls = f.allowed_unsafe_sysctls.clone().unwrap_or_default();
    if let Err(e) = crate::sysctl::Allowlist::new(allowed_unsafe_sysctls.iter().map(String::as_str)) {
        c.err("allowedUnsafeSysctls", e);
    }

    let hairpin_mode = f
        .hairpin_mode
        .clone()
        .unwrap_or_else(|| "promiscuous-bridge".into());
    if !matches!(
        hairpin_mode.as_str(),
        "promiscuous-bridge" | "hairpin-veth" | "none"
    ) {
        c.err(
            "hairpinMode",
            format!("{hairpin_mode:?} must be promiscuous-bridge, hairpin-veth or none"),
        );
    }
    let change_detection = f
        .config_map_and_secret_change_detection_strategy
        .clone()
        .unwrap_or_else(|| "Watch".into());
    if !matches!(change_detection.as_str(), "Watch" | "Cache" | "Get") {
        c.err(
            "configMapAndSecretChangeDetectionStrategy",
            format!("{change_detection:?} must be Watch, Cache or Get"),
        );
    }
    let cgroup_driver = f.cgroup_driver.clone().unwrap_or_else(|| "cgroupfs".into());
    match cgroup_driver.as_str() {
        "cgroupfs" | "systemd" => {}
        _ => c.err(
            "cgroupDriver",
            format!("{cgroup_driver:?} must be cgroupfs or systemd"),
        ),
    }
    let qos_reserved_memory = qos_reserved(&mut c, f.qos_reserved.as_ref());
    let cgroup_root = f
        .cgroup_root
        .clone()
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| "/".into());
    if !cgroup_root.starts_with('/') {
        c.err(
            "cgroupRoot",
            format!("{cgroup_root:?} must be an absolute cgroup path"),
        );
    }

    let (container_runtime_endpoint, image_service_endpoint) = runtime::endpoints(&mut c, f);

    let shutdown::Shutdown {
        shutdown_grace_period,
        shutdown_grace_period_critical_pods,
        shutdown_grace_period_by_pod_priority,
    } = shutdown::shutdown(&mut c, f);

    let authn = f.authentication.clone().unwrap_or_default();
    let authz = f.authorization.clone().unwrap_or_default();
    let mode = match authz.mode.as_deref() {
        None | Some("Webhook") => AuthorizationMode::Webhook,
        Some("AlwaysAllow") => AuthorizationMode::AlwaysAllow,
        Some(other) => {
            c.err(
                "authorization.mode",
                format!("{other:?} must be AlwaysAllow or Webhook"),
            );
            AuthorizationMode::Webhook
        }
    };

    let any = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
    let localhost = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let config = KubeletConfig {
        enable_server: f.enable_server.unwrap_or(true),
        address: c.ip("address", f.address.as_deref(), any),
        port: c.port("port", f.port, 10250, false),
        read_only_port: c.port("readOnlyPort", f.read_only_port, 0, true),
        healthz_port: c.port("healthzPort", f.healthz_port, 10248, true),
        healthz_bind_address: c.ip("healthzBindAddress", f.healthz_bind_address.as_deref(), localhost),
        tls_cert_file: Check::path(f.tls_cert_file.as_ref()),
        tls_private_key_file: Check::path(f.tls_private_key_file.as_ref()),
        tls_min_version: super::tls_settings::min_version(f.tls_min_version.as_deref().unwrap_or(""))
            .unwrap_or_else(|e| {
                c.err("tlsMinVersion", e);
                super::tls_settings::TlsMinVersion::default()
            }),
        tls_cipher_suites: super::tls_settings::cipher_suites(
            f.tls_cipher_suites.as_deref().unwrap_or_default(),
        )
        .unwrap_or_else(|errors| {
            for e in errors {
                c.err("tlsCipherSuites", e);
            }
            Vec::new()
        }),
        server_tls_bootstrap: f.server_tls_bootstrap.unwrap_or(false),
        rotate_certificates: f.rotate_certificates.unwrap_or(false),
        authentication: Authentication {
            client_ca_file: Check::path(authn.x509.as_ref().and_then(|x| x.client_ca_file.as_ref())),
            webhook_enabled: authn.webhook.as_ref().and_then(|w| w.enabled).unwrap_or(true),
            webhook_cache_ttl: authn
                .webhook
                .as_ref()
                .and_then(|w| w.cache_ttl)
                .unwrap_or(secs(120)),
            anonymous_enabled: authn.anonymous.as_ref().and_then(|a| a.enabled).unwrap_or(false),
        },
        authorization: Authorization {
            mode,
            cache_authorized_ttl: authz
                .webhook
                .as_ref()
                .and_then(|w| w.cache_authorized_ttl)
                .unwrap_or(secs(300)),
            cache_unauthorized_ttl: authz
                .webhook
                .as_ref()
                .and_then(|w| w.cache_unauthorized_ttl)
                .unwrap_or(secs(30)),
        },
        enable_debugging_handlers: f.enable_debugging_handlers.unwrap_or(true),
        streaming_connection_idle_timeout: f.streaming_connection_idle_timeout.unwrap_or(secs(4 * 3600)),

        static_pod_path: Check::path(f.static_pod_path.as_ref()),
        static_pod_url: static_pod_url(&mut c, f.static_pod_url.as_deref()),
        static_pod_url_header: f.static_pod_url_header.clone().unwrap_or_default(),
        sync_frequency: c.positive("syncFrequency", f.sync_frequency, secs(60)),
        file_check_frequency: c.positive("fileCheckFrequency", f.file_check_frequency, secs(20)),
        http_check_frequency: c.positive("httpCheckFrequency", f.http_check_frequency, secs(20)),
        pod_logs_dir: Check::path(f.pod_logs_dir.as_ref()).unwrap_or_else(|| PathBuf::from("/var/log/pods")),

        node_status_update_frequency: update,
        node_status_report_frequency: report,
        node_lease_duration_seconds,
        node_status_max_images,
        register_node: f.register_node.unwrap_or(true),
        register_with_taints,
        provider_id: f.provider_id.clone().filter(|s| !s.is_empty()),
        enable_controller_attach_detach: f.enable_controller_attach_detach.unwrap_or(true),

        max_pods: c.non_negative("maxPods", f.max_pods, 110),
        pods_per_core: c.non_negative("podsPerCore", f.pods_per_core, 0),
        pod_cidr,
        pod_pids_limit,
        enforce_node_allocatable,
        kube_reserved_cgroup,
        system_reserved_cgroup,
        oom_score_adj,
        kube_reserved,
        system_reserved,
        eviction_hard,
        eviction_soft,
        eviction_soft_grace_period,
        eviction_pressure_transition_period: f.eviction_pressure_transition_period.unwrap_or(secs(300)),
        eviction_max_pod_grace_period: f.eviction_max_pod_grace_period.unwrap_or(0),
        eviction_minimum_reclaim,
        local_storage_capacity_isolation: f.local_storage_capacity_isolation.unwrap_or(true),

        kube_api_qps: c.non_negative("kubeAPIQPS", f.kube_api_qps, 50),
        kube_api_burst: c.non_negative("kubeAPIBurst", f.kube_api_burst, 100),
        event_record_qps: c.non_negative("eventRecordQPS", f.event_record_qps, 50),
        event_burst: c.non_negative("eventBurst", f.event_burst, 100),
        content_type: f
            .content_type
            .clone()
            .unwrap_or_else(|| "application/vnd.kubernetes.protobuf".into()),

        container_runtime_endpoint,
        image_service_endpoint,
        runtime_request_timeout: c.positive("runtimeRequestTimeout", f.runtime_request_timeout, secs(120)),
        serialize_image_pulls,
        max_parallel_image_pulls,
        registry_pull_qps: c.non_negative("registryPullQPS", f.registry_pull_qps, 5),
        registry_burst: c.non_negative("registryBurst", f.registry_burst, 10),
        image_minimum_gc_age,
        image_maximum_gc_age,
        image_gc_high_threshold_percent,
        image_gc_low_threshold_percent,
        container_log_max_size: container_logs.max_size,
        container_log_max_files: container_logs.max_files,
        container_log_max_workers: container_logs.max_workers,
        container_log_monitor_interval: container_logs.monitor_interval,

        cluster_domain: f.cluster_domain.clone().filter(|s| !s.is_empty()),
        cluster_dns,
        resolv_conf: f.resolv_conf.clone().unwrap_or_else(|| "/etc/resolv.conf".into()),
        allowed_unsafe_sysctls,
        config_map_and_secret_change_detection_strategy: change_detection,
        hairpin_mode,
        volume_stats_agg_period: f.volume_stats_agg_period.unwrap_or(secs(60)),
        shutdown_grace_period,
        shutdown_grace_period_critical_pods,
        shutdown_grace_period_by_pod_priority,
        fail_swap_on: f.fail_swap_on.unwrap_or(true),
        cgroup_driver,
        cgroups_per_qos: f.cgroups_per_qos.unwrap_or(true),
        cgroup_root,
        feature_gates: f.feature_gates.clone().unwrap_or_default(),
        qos_reserved_memory,
    };
    if c.errors.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError::Invalid { errors: c.errors })
    }
}

/// `staticPodURL`: an `http://` URL with a host (fetching over TLS is not built; such a URL is refused by
/// name rather than ignored).
fn static_pod_url(c: &mut Check<'_>, v: Option<&str>) -> Option<String> {
    let url = v.filter(|s| !s.is_empty())?;
    match url.parse::<hyper::Uri>() {
        Ok(u) if u.scheme_str() == Some("http") && u.host().is_some() => Some(url.to_owned()),
        Ok(u) if u.scheme_str() == Some("https") => {
            c.err(
                "staticPodURL",
                format!("{url:?}: only http:// URLs are supported"),
            );
            None
        }
        _ => {
            c.err("staticPodURL", format!("{url:?} is not an http:// URL"));
            None
        }
    }
}

#[cfg(test)]
#[path = "resolve_tests.rs"]
mod tests;
