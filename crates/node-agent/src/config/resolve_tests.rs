//! Tests of defaults and validation.
use std::time::Duration;

use super::*;
use crate::config::Threshold;
use crate::config::check::parse_threshold;
use crate::config::tls_settings;

fn from_yaml(body: &str) -> Result<KubeletConfig, ConfigError> {
    let text = format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{body}");
    resolve_kubelet_config(&LoadedConfig::parse(&text, "t.yaml")?)
}

#[test]
fn defaults_equal_the_kubelets() {
    let d = KubeletConfig::default();
    assert_eq!(d.node_status_update_frequency, Duration::from_secs(10));
    assert_eq!(d.node_status_report_frequency, Duration::from_secs(300));
    assert_eq!(d.node_lease_duration_seconds, 40);
    assert_eq!(d.lease_renew_interval(), Duration::from_secs(10));
    assert_eq!(d.sync_frequency, Duration::from_secs(60));
    assert_eq!(d.file_check_frequency, Duration::from_secs(20));
    assert_eq!(d.port, 10250);
    assert_eq!(d.read_only_port, 0);
    assert_eq!(d.healthz_port, 10248);
    assert_eq!(d.address.to_string(), "0.0.0.0");
    assert_eq!(d.healthz_bind_address.to_string(), "127.0.0.1");
    assert_eq!(d.max_pods, 110);
    assert_eq!(d.pod_pids_limit, -1);
    assert_eq!(d.node_status_max_images, Some(50));
    assert!(d.register_node);
    assert_eq!((d.kube_api_qps, d.kube_api_burst), (50, 100));
    assert_eq!((d.event_record_qps, d.event_burst), (50, 100));
    assert_eq!((d.registry_pull_qps, d.registry_burst), (5, 10));
    assert_eq!(d.runtime_request_timeout, Duration::from_secs(120));
    assert_eq!(
        d.container_runtime_endpoint,
        "unix:///run/containerd/containerd.sock"
    );
    assert_eq!(d.image_service_endpoint, d.container_runtime_endpoint);
    assert_eq!(
        (
            d.image_gc_high_threshold_percent,
            d.image_gc_low_threshold_percent
        ),
        (85, 80)
    );
    assert_eq!(d.image_minimum_gc_age, Duration::from_secs(120));
    assert_eq!(d.eviction_pressure_transition_period, Duration::from_secs(300));
    assert_eq!(d.container_log_max_size.to_string(), "10Mi");
    assert_eq!(d.container_log_max_files, 5);
    assert_eq!(d.container_log_max_workers, 1);
    assert_eq!(d.container_log_monitor_interval, Duration::from_secs(10));
    assert!(d.serialize_image_pulls);
    assert_eq!(d.eviction_hard.len(), 5);
    assert_eq!(
        d.eviction_hard["memory.available"],
        Threshold::Quantity("100Mi".parse().unwrap())
    );
    assert_eq!(d.eviction_hard["nodefs.available"], Threshold::Percentage(0.1));
    assert_eq!(d.authorization.mode, AuthorizationMode::Webhook);
    assert!(d.authentication.webhook_enabled && !d.authentication.anonymous_enabled);
    assert_eq!(d.hairpin_mode, "promiscuous-bridge");
    assert_eq!(d.cgroup_driver, "cgroupfs");
    assert!(d.cgroups_per_qos);
    assert_eq!(d.cgroup_root, "/");
}

#[test]
fn an_unknown_cgroup_driver_and_a_relative_cgroup_root_are_refused_by_name() {
    let e = from_yaml("cgroupDriver: openrc\ncgroupRoot: kube\n").unwrap_err();
    let text = e.to_string();
    assert!(e.fields().contains(&"cgroupDriver"), "{text}");
    assert!(e.fields().contains(&"cgroupRoot"), "{text}");
    assert!(text.contains("must be cgroupfs or systemd"), "{text}");
    let c = from_yaml("cgroupDriver: systemd\n").unwrap();
    assert_eq!(c.cgroup_driver, "systemd");
    let c = from_yaml("cgroupRoot: /custom\ncgroupsPerQOS: false\n").unwrap();
    assert_eq!((c.cgroup_root.as_str(), c.cgroups_per_qos), ("/custom", false));
}

#[test]
fn qos_reserved_is_a_memory_percentage_as_the_kubelet_parses_it() {
    assert_eq!(from_yaml("").unwrap().qos_reserved_memory, None);
    let c = from_yaml("qosReserved: {memory: 50%}\n").unwrap();
    assert_eq!(c.qos_reserved_memory, Some(50));
    assert_eq!(
        from_yaml("qosReserved: {memory: 0%}\n")
            .unwrap()
            .qos_reserved_memory,
        Some(0)
    );
    for bad in [
        "{cpu: 50%}",
        "{memory: '50'}",
        "{memory: 101%}",
        "{memory: 1.5%}",
        "{memory: 100Mi}",
    ] {
        let e = from_yaml(&format!("qosReserved: {bad}\n")).unwrap_err();
        assert_eq!(e.fields(), vec!["qosReserved"], "{bad}: {e}");
    }
}

#[test]
fn report_frequency_follows_an_explicit_update_frequency() {
    let c = from_yaml("nodeStatusUpdateFrequency: 20s\n").unwrap();
    assert_eq!(c.node_status_report_frequency, Duration::from_secs(20));
    let c = from_yaml("nodeStatusUpdateFrequency: 20s\nnodeStatusReportFrequency: 1m\n").unwrap();
    assert_eq!(c.node_status_report_frequency, Duration::from_secs(60));
}

#[test]
fn eviction_hard_replaces_defaults_unless_merged() {
    let c = from_yaml("evictionHard:\n  memory.available: 200Mi\n").unwrap();
    assert_eq!(c.eviction_hard.len(), 1);
    let c =
        from_yaml("evictionHard:\n  memory.available: 200Mi\nmergeDefaultEvictionSettings: true\n").unwrap();
    assert_eq!(c.eviction_hard.len(), 5);
    assert_eq!(
        c.eviction_hard["memory.available"],
        Threshold::Quantity("200Mi".parse().unwrap())
    );
}

#[test]
fn every_bad_field_is_named() {
    let e = from_yaml(
        "port: 70000\nmaxPods: -1\nkubeReserved:\n  cpu: lots\n  gpu: 1\n\
         evictionHard:\n  memory.avail: 1Mi\nregisterWithTaints:\n- key: a\n  effect: Sometimes\n\
         imageGCLowThresholdPercent: 90\npodCIDR: 10.0.0.0/99\n",
    )
    .unwrap_err();
    let fields = e.fields();
    // (a zero period or lease duration is the kubelet's default, as kubeadm's configuration writes it)
    for f in [
        "port",
        "maxPods",
        "kubeReserved[cpu]",
        "kubeReserved[gpu]",
        "evictionHard[memory.avail]",
        "registerWithTaints[0]",
        "imageGCLowThresholdPercent",
        "podCIDR",
    ] {
        assert!(fields.contains(&f), "{f} missing from {fields:?}");
    }
}

#[test]
fn image_gc_settings_are_checked_as_the_kubelet_does() {
    for (yaml, field) in [
        (
            "imageGCHighThresholdPercent: 80\nimageGCLowThresholdPercent: 80\n",
            "imageGCLowThresholdPercent",
        ),
        (
            "imageGCHighThresholdPercent: 101\n",
            "imageGCHighThresholdPercent",
        ),
        (
            "imageMinimumGCAge: 10m\nimageMaximumGCAge: 5m\n",
            "imageMaximumGCAge",
        ),
    ] {
        let e = from_yaml(yaml).unwrap_err();
        assert_eq!(e.fields(), vec![field], "{yaml}: {e}");
    }
    let c = from_yaml(
        "imageGCHighThresholdPercent: 1\nimageGCLowThresholdPercent: 0\nimageMinimumGCAge: 1s\n\
         imageMaximumGCAge: 1h\n",
    )
    .unwrap();
    assert_eq!(
        (
            c.image_gc_high_threshold_percent,
            c.image_gc_low_threshold_percent
        ),
        (1, 0)
    );
    assert_eq!(
        (c.image_minimum_gc_age, c.image_maximum_gc_age),
        (Duration::from_secs(1), Duration::from_secs(3600))
    );
}

#[test]
fn thresholds_parse() {
    assert_eq!(parse_threshold("10%"), Ok(Threshold::Percentage(0.1)));
    assert!(parse_threshold("101%").is_err());
    assert!(parse_threshold("-1Mi").is_err());
    assert!(matches!(parse_threshold("1Gi"), Ok(Threshold::Quantity(_))));
}

#[test]
fn container_log_rotation_settings_are_checked_as_the_kubelet_checks_them() {
    let k = from_yaml(
        "containerLogMaxSize: 1Mi\ncontainerLogMaxFiles: 3\ncontainerLogMaxWorkers: 2\n\
         containerLogMonitorInterval: 3s\n",
    )
    .unwrap();
    assert_eq!(k.container_log_max_size.value(), 1 << 20);
    assert_eq!(k.container_log_max_files, 3);
    assert_eq!(k.container_log_max_workers, 2);
    assert_eq!(k.container_log_monitor_interval, Duration::from_secs(3));
    // a negative size turns rotation off; zero rotates at every check
    assert!(
        from_yaml("containerLogMaxSize: \"-1\"\n")
            .unwrap()
            .container_log_max_size
            .is_negative()
    );
    assert!(from_yaml("containerLogMaxSize: \"0\"\n").is_ok());
    for (yaml, field) in [
        ("containerLogMaxSize: 1500m\n", "containerLogMaxSize"),
        ("containerLogMaxSize: ten\n", "containerLogMaxSize"),
        ("containerLogMaxFiles: 1\n", "containerLogMaxFiles"),
        ("containerLogMaxWorkers: 0\n", "containerLogMaxWorkers"),
        ("containerLogMonitorInterval: 2s\n", "containerLogMonitorInterval"),
    ] {
        let e = from_yaml(yaml).unwrap_err();
        assert_eq!(e.fields(), [field], "{yaml}: {e}");
    }
}

#[test]
fn tls_min_version_and_cipher_suites_are_taken_or_refused_naming_the_field() {
    let c = from_yaml(
        "tlsMinVersion: VersionTLS13\ntlsCipherSuites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_AES_128_GCM_SHA256]\n",
    )
    .unwrap();
    assert_eq!(c.tls_min_version, tls_settings::TlsMinVersion::Tls13);
    assert_eq!(c.tls_cipher_suites, [0xc02f, 0x1301]);
    assert_eq!(
        KubeletConfig::default().tls_min_version,
        tls_settings::TlsMinVersion::Tls12
    );
    let e = from_yaml("tlsMinVersion: VersionTLS10\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("tlsMinVersion") && e.contains("not supported"), "{e}");
    let e = from_yaml("tlsCipherSuites: [TLS_RSA_WITH_AES_128_CBC_SHA, TLS_BOGUS]\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tlsCipherSuites")
            && e.contains("TLS_RSA_WITH_AES_128_CBC_SHA is not supported")
            && e.contains("unknown cipher suite \"TLS_BOGUS\""),
        "{e}"
    );
}

/// The configuration `kubeadm join` writes (`/var/lib/kubelet/config.yaml`: the cluster's kubelet-config with the
/// node's `containerRuntimeEndpoint` laid over it) loads, and its zero values take the kubelet's defaults.
#[test]
fn kubeadms_configuration_loads_with_the_defaults_for_its_zero_values() {
    let c = from_yaml(
        "authentication:\n  anonymous:\n    enabled: false\n  webhook:\n    cacheTTL: 0s\n    enabled: true\n  \
         x509:\n    clientCAFile: /etc/kubernetes/pki/ca.crt\nauthorization:\n  mode: Webhook\n  webhook:\n    \
         cacheAuthorizedTTL: 0s\n    cacheUnauthorizedTTL: 0s\ncgroupDriver: systemd\nclusterDNS:\n- 10.96.0.10\n\
         clusterDomain: cluster.local\ncontainerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n\
         cpuManagerReconcilePeriod: 0s\ncrashLoopBackOff: {}\nevictionPressureTransitionPeriod: 0s\n\
         fileCheckFrequency: 0s\nhealthzBindAddress: 127.0.0.1\nhealthzPort: 10248\nhttpCheckFrequency: 0s\n\
         imageMaximumGCAge: 0s\nimageMinimumGCAge: 0s\nlogging:\n  flushFrequency: 0\n  options:\n    json:\n      \
         infoBufferSize: \"0\"\n    text:\n      infoBufferSize: \"0\"\n  verbosity: 0\nmemorySwap: {}\n\
         nodeStatusReportFrequency: 0s\nnodeStatusUpdateFrequency: 0s\nrotateCertificates: true\n\
         runtimeRequestTimeout: 0s\nshutdownGracePeriod: 0s\nshutdownGracePeriodCriticalPods: 0s\n\
         staticPodPath: /etc/kubernetes/manifests\nstreamingConnectionIdleTimeout: 0s\nsyncFrequency: 0s\n\
         volumeStatsAggPeriod: 0s\n",
    )
    .unwrap();
    let d = KubeletConfig::default();
    assert_eq!(c.node_status_update_frequency, d.node_status_update_frequency);
    assert_eq!(c.node_status_report_frequency, d.node_status_report_frequency);
    assert_eq!(c.sync_frequency, d.sync_frequency);
    assert_eq!(c.file_check_frequency, d.file_check_frequency);
    assert_eq!(c.runtime_request_timeout, d.runtime_request_timeout);
    assert!(c.rotate_certificates);
    // an explicit zero where the kubelet keeps it stays zero
    let c = from_yaml("readOnlyPort: 0\nimageMaximumGCAge: 0s\n").unwrap();
    assert_eq!(c.read_only_port, 0);
    assert!(c.image_maximum_gc_age.is_zero());
}
