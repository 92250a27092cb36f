//! The field names of the KubeletConfiguration file: those this agent reads, those the upstream kubelet knows that
//! are accepted without effect, and which of the read ones act only in part or not yet at all.
//!
//! `docs/configuration.md` documents every field here with its status; `docs_tests.rs` keeps the two equal.

use super::KubeletConfig;

/// Fields this agent reads and validates (a bad value is refused by name, as by the kubelet) but does not act on
/// yet. Warned about at start when given a value.
pub(crate) const READ_WITHOUT_EFFECT: &[&str] = &[
    "contentType",
    "failSwapOn",
    "featureGates",
    "hairpinMode",
    "imageServiceEndpoint",
    "streamingConnectionIdleTimeout",
    "volumeStatsAggPeriod",
];

/// A field this agent acts on only in part.
pub(crate) struct Partial {
    /// The field, as named in the file.
    pub field: &'static str,
    /// What of the kubelet's behaviour is missing.
    pub missing: &'static str,
    /// Whether the resolved value asks for the missing behaviour (given, or by default): then it is warned about.
    pub on: fn(&KubeletConfig) -> bool,
}

/// Fields read and acted on only in part. Warned about at start when [`Partial::on`] says the resolved value asks
/// for the missing part.
pub(crate) const PARTIAL: &[Partial] = &[
    Partial {
        field: "enableControllerAttachDetach",
        missing: "only the node annotation is set; with false, node-agent does not attach or detach volumes itself",
        on: |k| !k.enable_controller_attach_detach,
    },
    Partial {
        field: "localStorageCapacityIsolation",
        missing: "ephemeral-storage capacity, allocatable and admission act, but a pod over its ephemeral-storage \
                  limit or an emptyDir over its sizeLimit is not evicted",
        on: |k| k.local_storage_capacity_isolation,
    },
    Partial {
        field: "qosReserved",
        missing: "validated and, as by the kubelet, not applied while the alpha QOSReserved feature gate is off; \
                  with the gate on the kubelet limits the burstable and besteffort QoS cgroups' memory, node-agent \
                  does not",
        on: |k| k.qos_reserved_memory.is_some() && k.feature_gates.get("QOSReserved") == Some(&true),
    },
];

/// Fields the upstream kubelet reads that this agent accepts without acting on them (a host-level or cgroup
/// concern that a CRI-driving node agent does not own, or a feature not built). Their values are not checked.
pub(crate) const ACCEPTED_WITHOUT_EFFECT: &[&str] = &[
    "cpuCFSQuota",
    "cpuCFSQuotaPeriod",
    "cpuManagerPolicy",
    "cpuManagerPolicyOptions",
    "cpuManagerReconcilePeriod",
    "crashLoopBackOff",
    "enableContentionProfiling",
    "enableDebugFlagsHandler",
    "enableProfilingHandler",
    "enableSystemLogHandler",
    "enableSystemLogQuery",
    "failCgroupV1",
    "imagePullCredentialsVerificationPolicy",
    "iptablesDropBit",
    "iptablesMasqueradeBit",
    "kernelMemcgNotification",
    "kubeletCgroups",
    "logging",
    "makeIPTablesUtilChains",
    "maxOpenFiles",
    "memoryManagerPolicy",
    "memoryReservationPolicy",
    "memorySwap",
    "memoryThrottlingFactor",
    "preloadedImagesVerificationAllowlist",
    "protectKernelDefaults",
    "reservedMemory",
    "reservedSystemCPUs",
    "runOnce",
    "seccompDefault",
    "showHiddenMetricsForVersion",
    "singleProcessOOMKill",
    "systemCgroups",
    "tlsCurvePreferences",
    "topologyManagerPolicy",
    "topologyManagerPolicyOptions",
    "topologyManagerScope",
    "tracing",
    "userNamespaces",
    "volumePluginDir",
];

/// The field names [`FileConfig`](super::file::FileConfig) reads (camelCase, as in the file).
pub(crate) const KNOWN_FIELDS: &[&str] = &[
    "apiVersion",
    "kind",
    "enableServer",
    "address",
    "port",
    "readOnlyPort",
    "healthzPort",
    "healthzBindAddress",
    "tlsCertFile",
    "tlsPrivateKeyFile",
    "tlsMinVersion",
    "tlsCipherSuites",
    "serverTLSBootstrap",
    "rotateCertificates",
    "authentication",
    "authorization",
    "enableDebuggingHandlers",
    "streamingConnectionIdleTimeout",
    "staticPodPath",
    "staticPodURL",
    "staticPodURLHeader",
    "syncFrequency",
    "fileCheckFrequency",
    "httpCheckFrequency",
    "podLogsDir",
    "nodeStatusUpdateFrequency",
    "nodeStatusReportFrequency",
    "nodeLeaseDurationSeconds",
    "nodeStatusMaxImages",
    "registerNode",
    "registerWithTaints",
    "providerID",
    "enableControllerAttachDetach",
    "maxPods",
    "podsPerCore",
    "podCIDR",
    "podPidsLimit",
    "enforceNodeAllocatable",
    "kubeReservedCgroup",
    "systemReservedCgroup",
    "oomScoreAdj",
    "kubeReserved",
    "systemReserved",
    "evictionHard",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "evictionPressureTransitionPeriod",
    "evictionMaxPodGracePeriod",
    "evictionMinimumReclaim",
    "mergeDefaultEvictionSettings",
    "localStorageCapacityIsolation",
    "kubeAPIQPS",
    "kubeAPIBurst",
    "eventRecordQPS",
    "eventBurst",
    "contentType",
    "containerRuntimeEndpoint",
    "imageServiceEndpoint",
    "runtimeRequestTimeout",
    "serializeImagePulls",
    "maxParallelImagePulls",
    "registryPullQPS",
    "registryBurst",
    "imageMinimumGCAge",
    "imageMaximumGCAge",
    "imageGCHighThresholdPercent",
    "imageGCLowThresholdPercent",
    "containerLogMaxSize",
    "containerLogMaxFiles",
    "containerLogMaxWorkers",
    "containerLogMonitorInterval",
    "clusterDomain",
    "clusterDNS",
    "allowedUnsafeSysctls",
    "resolvConf",
    "configMapAndSecretChangeDetectionStrategy",
    "hairpinMode",
    "volumeStatsAggPeriod",
    "shutdownGracePeriod",
    "shutdownGracePeriodCriticalPods",
    "shutdownGracePeriodByPodPriority",
    "failSwapOn",
    "cgroupDriver",
    "cgroupsPerQOS",
    "cgroupRoot",
    "featureGates",
    "qosReserved",
];
