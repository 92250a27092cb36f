//! The KubeletConfiguration file (`kubelet.config.k8s.io/v1beta1`) as written on disk.
//!
//! This module owns reading the YAML (or JSON) document into [`FileConfig`]: every field optional (absent means
//! "use the default or the flag"), upstream field names, and errors that name the offending field — an unknown
//! field (with the closest known name as a hint), a value of the wrong type, a bad duration. Fields the upstream
//! kubelet knows but this agent does not act on are accepted and reported back so the caller can warn.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;
use super::duration::deserialize_opt as dur;
use super::fields::{ACCEPTED_WITHOUT_EFFECT, KNOWN_FIELDS};

/// serde helper: a map whose values may be written as strings or numbers (`cpu: 1`, `memory: 1Gi`).
fn string_map<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    let raw: Option<BTreeMap<String, serde_yaml::Value>> = Option::deserialize(de)?;
    let Some(raw) = raw else { return Ok(None) };
    let mut out = BTreeMap::new();
    for (k, v) in raw {
        let s = match v {
            serde_yaml::Value::String(s) => s,
            serde_yaml::Value::Number(n) => n.to_string(),
            other => {
                return Err(serde::de::Error::custom(format!(
                    "{k}: expected a string or a number, got {other:?}"
                )));
            }
        };
        out.insert(k, s);
    }
    Ok(Some(out))
}

/// The only apiVersion accepted.
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// The only kind accepted.
pub const KIND: &str = "KubeletConfiguration";

/// A taint as written in `registerWithTaints`.
/// One entry of `shutdownGracePeriodByPodPriority`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct FileShutdownGroup {
    pub priority: i32,
    pub shutdown_grace_period_seconds: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct FileTaint {
    pub key: String,
    #[serde(default)]
    pub value: Option<String>,
    pub effect: String,
    #[serde(default)]
    pub time_added: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct FileAuthentication {
    #[serde(default)]
    pub x509: Option<FileX509>,
    #[serde(default)]
    pub webhook: Option<FileAuthnWebhook>,
    #[serde(default)]
    pub anonymous: Option<FileAnonymous>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct FileX509 {
    #[serde(default, rename = "clientCAFile")]
    pub client_ca_file: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct FileAuthnWebhook {
    #[serde(default)]
    pub enabled: Option<bool>,
    #[serde(default, rename = "cacheTTL", deserialize_with = "dur")]
    pub cache_ttl: Option<Duration>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct FileAnonymous {
    #[serde(default)]
    pub enabled: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct FileAuthorization {
    #[serde(default)]
    pub mode: Option<String>,
    #[serde(default)]
    pub webhook: Option<FileAuthzWebhook>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct FileAuthzWebhook {
    #[serde(default, rename = "cacheAuthorizedTTL", deserialize_with = "dur")]
    pub cache_authorized_ttl: Option<Duration>,
    #[serde(default, rename = "cacheUnauthorizedTTL", deserialize_with = "dur")]
    pub cache_unauthorized_ttl: Option<Duration>,
}

/// The fields of the file this agent reads, each optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct FileConfig {
    #[serde(default)]
    pub api_version: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,

    // --- server
    #[serde(default)]
    pub enable_server: Option<bool>,
    #[serde(default)]
    pub address: Option<String>,
    #[serde(default)]
    pub port: Option<i64>,
    #[serde(default)]
    pub read_only_port: Option<i64>,
    #[serde(default)]
    pub healthz_port: Option<i64>,
    #[serde(default)]
    pub healthz_bind_address: Option<String>,
    #[serde(default)]
    pub tls_cert_file: Option<String>,
    #[serde(default)]
    pub tls_private_key_file: Option<String>,
    #[serde(default)]
    pub tls_min_version: Option<String>,
    #[serde(default)]
    pub tls_cipher_suites: Option<Vec<String>>,
    #[serde(default, rename = "serverTLSBootstrap")]
    pub server_tls_bootstrap: Option<bool>,
    #[serde(default)]
    pub rotate_certificates: Option<bool>,
    #[serde(default)]
    pub authentication: Option<FileAuthentication>,
    #[serde(default)]
    pub authorization: Option<FileAuthorization>,
    #[serde(default)]
    pub enable_debugging_handlers: Option<bool>,
    #[serde(default, deserialize_with = "dur")]
    pub streaming_connection_idle_timeout: Option<Duration>,

    // --- pod sources
    #[serde(default)]
    pub static_pod_path: Option<String>,
    #[serde(default, rename = "staticPodURL")]
    pub static_pod_url: Option<String>,
    #[serde(default, rename = "staticPodURLHeader")]
    pub static_pod_url_header: Option<BTreeMap<String, Vec<String>>>,
    #[serde(default, deserialize_with = "dur")]
    pub sync_frequency: Option<Duration>,
    #[serde(default, deserialize_with = "dur")]
    pub file_check_frequency: Option<Duration>,
    #[serde(default, deserialize_with = "dur")]
    pub http_check_frequency: Option<Duration>,
    #[serde(default)]
    pub pod_logs_dir: Option<String>,

    // --- node status and lease
    #[serde(default, deserialize_with = "dur")]
    pub node_status_update_frequency: Option<Duration>,
    #[serde(default, deserialize_with = "dur")]
    pub node_status_report_frequency: Option<Duration>,
    #[serde(default)]
    pub node_lease_duration_seconds: Option<i64>,
    #[serde(default)]
    pub node_status_max_images: Option<i64>,
    #[serde(default)]
    pub register_node: Option<bool>,
    #[serde(default)]
    pub register_with_taints: Option<Vec<FileTaint>>,
    #[serde(default, rename = "providerID")]
    pub provider_id: Option<String>,
    #[serde(default)]
    pub enable_controller_attach_detach: Option<bool>,

    // --- capacity
    #[serde(default)]
    pub max_pods: Option<i64>,
    #[serde(default)]
    pub pods_per_core: Option<i64>,
    #[serde(default, rename = "podCIDR")]
    pub pod_cidr: Option<String>,
    #[serde(default)]
    pub pod_pids_limit: Option<i64>,
    #[serde(default)]
    pub enforce_node_allocatable: Option<Vec<String>>,
    #[serde(default)]
    pub kube_reserved_cgroup: Option<String>,
    #[serde(default)]
    pub system_reserved_cgroup: Option<String>,
    #[serde(default, rename = "oomScoreAdj")]
    pub oom_score_adj: Option<i64>,
    #[serde(default, deserialize_with = "string_map")]
    pub kube_reserved: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "string_map")]
    pub system_reserved: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "string_map")]
    pub eviction_hard: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "string_map")]
    pub eviction_soft: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "string_map")]
    pub eviction_soft_grace_period: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "dur")]
    pub eviction_pressure_transition_period: Option<Duration>,
    #[serde(default)]
    pub eviction_max_pod_grace_period: Option<i64>,
    #[serde(default, deserialize_with = "string_map")]
    pub eviction_minimum_reclaim: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub merge_default_eviction_settings: Option<bool>,
    #[serde(default)]
    pub local_storage_capacity_isolation: Option<bool>,

    // --- API client
    #[serde(default, rename = "kubeAPIQPS")]
    pub kube_api_qps: Option<i64>,
    #[serde(default, rename = "kubeAPIBurst")]
    pub kube_api_burst: Option<i64>,
    #[serde(default, rename = "eventRecordQPS")]
    pub event_record_qps: Option<i64>,
    #[serde(default)]
    pub event_burst: Option<i64>,
    #[serde(default)]
    pub content_type: Option<String>,

    // --- runtime and images
    #[serde(default)]
    pub container_runtime_endpoint: Option<String>,
    #[serde(default)]
    pub image_service_endpoint: Option<String>,
    #[serde(default, deserialize_with = "dur")]
    pub runtime_request_timeout: Option<Duration>,
    #[serde(default)]
    pub serialize_image_pulls: Option<bool>,
    #[serde(default)]
    pub max_parallel_image_pulls: Option<i64>,
    #[serde(default, rename = "registryPullQPS")]
    pub registry_pull_qps: Option<i64>,
    #[serde(default)]
    pub registry_burst: Option<i64>,
    #[serde(default, rename = "imageMinimumGCAge", deserialize_with = "dur")]
    pub image_minimum_gc_age: Option<Duration>,
    #[serde(default, rename = "imageMaximumGCAge", deserialize_with = "dur")]
    pub image_maximum_gc_age: Option<Duration>,
    #[serde(default, rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: Option<i64>,
    #[serde(default, rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: Option<i64>,
    #[serde(default)]
    pub container_log_max_size: Option<String>,
    #[serde(default)]
    pub container_log_max_files: Option<i64>,
    #[serde(default)]
    pub container_log_max_workers: Option<i64>,
    #[serde(default, deserialize_with = "dur")]
    pub container_log_monitor_interval: Option<Duration>,

    // --- pods
    #[serde(default)]
    pub cluster_domain: Option<String>,
    #[serde(default, rename = "clusterDNS")]
    pub cluster_dns: Option<Vec<String>>,
    #[serde(default)]
    pub resolv_conf: Option<String>,
    #[serde(default)]
    pub allowed_unsafe_sysctls: Option<Vec<String>>,
    #[serde(default)]
    pub config_map_and_secret_change_detection_strategy: Option<String>,
    #[serde(default)]
    pub hairpin_mode: Option<String>,
    #[serde(default, deserialize_with = "dur")]
    pub volume_stats_agg_period: Option<Duration>,
    #[serde(default, deserialize_with = "dur")]
    pub shutdown_grace_period: Option<Duration>,
    #[serde(default, deserialize_with = "dur")]
    pub shutdown_grace_period_critical_pods: Option<Duration>,
    #[serde(default)]
    pub shutdown_grace_period_by_pod_priority: Option<Vec<FileShutdownGroup>>,
    #[serde(default)]
    pub fail_swap_on: Option<bool>,
    #[serde(default)]
    pub cgroup_driver: Option<String>,
    #[serde(default, rename = "cgroupsPerQOS")]
    pub cgroups_per_qos: Option<bool>,
    #[serde(default)]
    pub cgroup_root: Option<String>,
    #[serde(default)]
    pub feature_gates: Option<BTreeMap<String, bool>>,
    #[serde(default, rename = "qosReserved")]
    pub qos_reserved: Option<BTreeMap<String, String>>,
}

/// A parsed file plus the names of fields that were accepted without effect.
#[derive(Debug, Clone, Default)]
pub(crate) struct ParsedFile {
    pub config: FileConfig,
    pub ignored: Vec<String>,
    /// The fields this agent reads that the document gives (top-level names).
    pub present: Vec<String>,
}

/// Parses a KubeletConfiguration document. `source` names the file in errors.
pub(crate) fn parse(text: &str, source: &str) -> Result<ParsedFile, ConfigError> {
    let value: serde_yaml::Value = serde_yaml::from_str(text).map_err(|e| ConfigError::Syntax {
        source_name: source.to_owned(),
        message: e.to_string(),
    })?;
    let mut map = match value {
        serde_yaml::Value::Mapping(m) => m,
        serde_yaml::Value::Null => serde_yaml::Mapping::new(),
        _ => {
            return Err(ConfigError::Syntax {
                source_name: source.to_owned(),
                message: "the document is not a mapping of field names to values".into(),
            });
        }
    };

    let mut ignored = Vec::new();
    let mut present = Vec::new();
    let mut keys = Vec::new();
    for key in map.keys() {
        match key.as_str() {
            Some(k) => keys.push(k.to_owned()),
            None => {
                return Err(ConfigError::Field {
                    field: format!("{key:?}"),
                    message: "field names must be strings".into(),
                });
            }
        }
    }
    for key in keys {
        if KNOWN_FIELDS.contains(&key.as_str()) {
            present.push(key);
            continue;
        }
        if ACCEPTED_WITHOUT_EFFECT.contains(&key.as_str()) {
            map.remove(key.as_str());
            ignored.push(key);
            continue;
        }
        return Err(ConfigError::UnknownField {
            hint: closest(&key),
            field: key,
        });
    }

    let mut config: FileConfig =
        serde_path_to_error::deserialize(serde_yaml::Value::Mapping(map)).map_err(|e| {
            let path = e.path().to_string();
            ConfigError::Field {
                field: if path == "." { "(document)".into() } else { path },
                message: e.into_inner().to_string(),
            }
        })?;

    match config.api_version.as_deref() {
        Some(API_VERSION) => {}
        Some(other) => {
            return Err(ConfigError::Field {
                field: "apiVersion".into(),
                message: format!("unsupported apiVersion {other:?}, expected {API_VERSION:?}"),
            });
        }
        None => {
            return Err(ConfigError::Field {
                field: "apiVersion".into(),
                message: format!("missing; expected {API_VERSION:?}"),
            });
        }
    }
    match config.kind.as_deref() {
        Some(KIND) => {}
        other => {
            return Err(ConfigError::Field {
                field: "kind".into(),
                message: format!("expected {KIND:?}, got {:?}", other.unwrap_or("")),
            });
        }
    }
    zero_means_unset(&mut config);
    Ok(ParsedFile {
        config,
        ignored,
        present,
    })
}

/// The upstream defaulting gives these fields their default when the file holds their zero value (`0s`, `0`,
/// `""`), as kubeadm's generated configuration does for every duration it leaves to the kubelet: here they read
/// as absent, so the same default applies.
fn zero_means_unset(c: &mut FileConfig) {
    fn duration(v: &mut Option<Duration>) {
        if v.is_some_and(|d| d.is_zero()) {
            *v = None;
        }
    }
    fn number(v: &mut Option<i64>) {
        if *v == Some(0) {
            *v = None;
        }
    }
    fn text(v: &mut Option<String>) {
        if v.as_deref() == Some("") {
            *v = None;
        }
    }
    for d in [
        &mut c.sync_frequency,
        &mut c.file_check_frequency,
        &mut c.http_check_frequency,
        &mut c.streaming_connection_idle_timeout,
        &mut c.node_status_update_frequency,
        &mut c.node_status_report_frequency,
        &mut c.image_minimum_gc_age,
        &mut c.volume_stats_agg_period,
        &mut c.runtime_request_timeout,
        &mut c.eviction_pressure_transition_period,
    ] {
        duration(d);
    }
    if let Some(webhook) = c.authentication.as_mut().and_then(|a| a.webhook.as_mut()) {
        duration(&mut webhook.cache_ttl);
    }
    if let Some(authz) = c.authorization.as_mut() {
        text(&mut authz.mode);
        if let Some(webhook) = authz.webhook.as_mut() {
            duration(&mut webhook.cache_authorized_ttl);
            duration(&mut webhook.cache_unauthorized_ttl);
        }
    }
    for n in [
        &mut c.port,
        &mut c.node_lease_duration_seconds,
        &mut c.max_pods,
        &mut c.kube_api_burst,
        &mut c.event_burst,
        &mut c.registry_burst,
    ] {
        number(n);
    }
    for t in [
        &mut c.address,
        &mut c.healthz_bind_address,
        &mut c.cgroup_driver,
        &mut c.container_runtime_endpoint,
        &mut c.content_type,
        &mut c.hairpin_mode,
        &mut c.config_map_and_secret_change_detection_strategy,
        &mut c.container_log_max_size,
        &mut c.pod_logs_dir,
    ] {
        text(t);
    }
}

/// The known field closest to `name` (case-insensitive match first, then edit distance <= 3).
fn closest(name: &str) -> Option<String> {
    let all = KNOWN_FIELDS.iter().chain(ACCEPTED_WITHOUT_EFFECT);
    if let Some(k) = all.clone().find(|k| k.eq_ignore_ascii_case(name)) {
        return Some((*k).to_owned());
    }
    all.map(|k| {
        (
            edit_distance(&name.to_ascii_lowercase(), &k.to_ascii_lowercase()),
            k,
        )
    })
    .filter(|(d, _)| *d <= 3)
    .min_by_key(|(d, _)| *d)
    .map(|(_, k)| (*k).to_owned())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

    fn parse_ok(body: &str) -> ParsedFile {
        parse(&format!("{HEAD}{body}"), "test.yaml").unwrap()
    }

    fn parse_err(body: &str) -> String {
        parse(&format!("{HEAD}{body}"), "test.yaml")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn reads_known_fields() {
        let f = parse_ok(
            "nodeStatusUpdateFrequency: 20s\nmaxPods: 50\npodCIDR: 10.0.0.0/24\nkubeAPIQPS: 20\n\
             kubeReserved:\n  cpu: 100m\nregisterWithTaints:\n- key: a\n  value: b\n  effect: NoSchedule\n",
        );
        assert_eq!(
            f.config.node_status_update_frequency,
            Some(Duration::from_secs(20))
        );
        assert_eq!(f.config.max_pods, Some(50));
        assert_eq!(f.config.pod_cidr.as_deref(), Some("10.0.0.0/24"));
        assert_eq!(f.config.kube_api_qps, Some(20));
        assert_eq!(f.config.kube_reserved.unwrap()["cpu"], "100m");
        assert_eq!(f.config.register_with_taints.unwrap()[0].effect, "NoSchedule");
        assert!(f.ignored.is_empty());
    }

    #[test]
    fn unknown_field_is_named_with_a_hint() {
        let e = parse_err("nodeStatusUpdateFrequncy: 10s\n");
        assert!(e.contains("nodeStatusUpdateFrequncy"), "{e}");
        assert!(e.contains("did you mean \"nodeStatusUpdateFrequency\""), "{e}");
        let e = parse_err("authentication:\n  webhook:\n    enabeld: true\n");
        assert!(e.contains("authentication.webhook"), "{e}");
        assert!(e.contains("enabeld"), "{e}");
    }

    #[test]
    fn invalid_values_name_the_field() {
        let e = parse_err("nodeStatusUpdateFrequency: ten\n");
        assert!(e.contains("nodeStatusUpdateFrequency"), "{e}");
        assert!(e.contains("invalid duration"), "{e}");
        let e = parse_err("maxPods: lots\n");
        assert!(e.contains("maxPods"), "{e}");
        let e = parse_err("registerWithTaints:\n- key: a\n");
        assert!(e.contains("registerWithTaints"), "{e}");
    }

    #[test]
    fn header_is_checked() {
        let e = parse("kind: KubeletConfiguration\n", "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("apiVersion"), "{e}");
        let e = parse(
            "apiVersion: kubelet.config.k8s.io/v1\nkind: KubeletConfiguration\n",
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("apiVersion"), "{e}");
        let e = parse("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: Pod\n", "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("kind"), "{e}");
        let e = parse("- a\n- b\n", "x").unwrap_err().to_string();
        assert!(e.contains("not a mapping"), "{e}");
    }

    #[test]
    fn upstream_only_fields_are_accepted_and_reported() {
        let f = parse_ok("kubeletCgroups: /k\nlogging:\n  format: text\n");
        assert_eq!(
            f.ignored,
            vec!["kubeletCgroups".to_string(), "logging".to_string()]
        );
    }
}
