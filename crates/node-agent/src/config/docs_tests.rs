//! `docs/configuration.md` against the code: the documented status of every KubeletConfiguration field and flag
//! equals what the tables in [`super::fields`] say and what the start-up warning actually names when every
//! accepted field is given.

use std::collections::{BTreeMap, BTreeSet};

use clap::{CommandFactory, Parser};

use super::fields::{ACCEPTED_WITHOUT_EFFECT, KNOWN_FIELDS, PARTIAL, READ_WITHOUT_EFFECT};
use super::file::FileConfig;
use super::{Flags, Unacted};

const DOC: &str = include_str!("../../../../docs/configuration.md");

const ACTS: &str = "acts";
const PARTIAL_STATUS: &str = "partial";
const NO_EFFECT: &str = "accepted, no effect";

/// The rows of the table under the `## {heading}` section: the cells of each row, backticks removed.
fn table(heading: &str) -> Vec<Vec<String>> {
    let start = DOC
        .find(&format!("\n## {heading}\n"))
        .unwrap_or_else(|| panic!("docs/configuration.md has no section {heading:?}"));
    let section = &DOC[start + 1..];
    let section = &section[..section[1..].find("\n## ").map_or(section.len(), |i| i + 1)];
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().trim_matches('`').to_owned())
                .collect()
        })
        .collect()
}

/// Field -> documented status.
fn documented_fields() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for row in table("KubeletConfiguration fields") {
        let status = row[1].clone();
        assert!(
            [ACTS, PARTIAL_STATUS, NO_EFFECT].contains(&status.as_str()),
            "{}: unknown status {status:?}",
            row[0]
        );
        assert!(
            out.insert(row[0].clone(), status).is_none(),
            "{} documented twice",
            row[0]
        );
    }
    out
}

fn with_status(docs: &BTreeMap<String, String>, status: &str) -> BTreeSet<String> {
    docs.iter()
        .filter(|(_, s)| s.as_str() == status)
        .map(|(f, _)| f.clone())
        .collect()
}

fn set(names: impl IntoIterator<Item = impl ToString>) -> BTreeSet<String> {
    names.into_iter().map(|n| n.to_string()).collect()
}

/// What the code says has no effect: the upstream-only fields and the read-but-not-acted ones.
fn code_no_effect() -> BTreeSet<String> {
    set(ACCEPTED_WITHOUT_EFFECT.iter().chain(READ_WITHOUT_EFFECT))
}

#[test]
fn documented_statuses_match_the_field_tables() {
    let docs = documented_fields();
    assert_eq!(with_status(&docs, NO_EFFECT), code_no_effect());
    assert_eq!(
        with_status(&docs, PARTIAL_STATUS),
        set(PARTIAL.iter().map(|p| p.field))
    );
    let read: BTreeSet<String> = set(KNOWN_FIELDS
        .iter()
        .filter(|f| !["apiVersion", "kind"].contains(f)));
    let documented_read: BTreeSet<String> = docs
        .keys()
        .filter(|f| !ACCEPTED_WITHOUT_EFFECT.contains(&f.as_str()))
        .cloned()
        .collect();
    assert_eq!(
        documented_read, read,
        "every field read is documented, and nothing else"
    );
    for f in READ_WITHOUT_EFFECT.iter().chain(PARTIAL.iter().map(|p| &p.field)) {
        assert!(KNOWN_FIELDS.contains(f), "{f} is warned about but not read");
    }
}

/// Every field read, with a valid value (together they validate); partial fields with the value that asks for
/// their missing part.
const EVERY_READ_FIELD: &str = r#"
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
enableServer: true
address: 0.0.0.0
port: 10250
readOnlyPort: 0
healthzPort: 10248
healthzBindAddress: 127.0.0.1
tlsCertFile: /etc/kubelet/tls.crt
tlsPrivateKeyFile: /etc/kubelet/tls.key
tlsMinVersion: VersionTLS12
tlsCipherSuites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]
serverTLSBootstrap: false
rotateCertificates: false
authentication:
  x509: {clientCAFile: /etc/kubelet/ca.crt}
  webhook: {enabled: true, cacheTTL: 2m}
  anonymous: {enabled: false}
authorization:
  mode: Webhook
  webhook: {cacheAuthorizedTTL: 5m, cacheUnauthorizedTTL: 30s}
enableDebuggingHandlers: true
streamingConnectionIdleTimeout: 4h
staticPodPath: /etc/kubernetes/manifests
staticPodURL: http://127.0.0.1:8080/pods
staticPodURLHeader: {X-Node: [n1]}
syncFrequency: 1m
fileCheckFrequency: 20s
httpCheckFrequency: 20s
podLogsDir: /var/log/pods
nodeStatusUpdateFrequency: 10s
nodeStatusReportFrequency: 5m
nodeLeaseDurationSeconds: 40
nodeStatusMaxImages: 50
registerNode: true
registerWithTaints: [{key: a, value: b, effect: NoSchedule}]
providerID: test://n1
enableControllerAttachDetach: false
maxPods: 110
podsPerCore: 0
podCIDR: 10.0.0.0/24
podPidsLimit: -1
enforceNodeAllocatable: [pods]
kubeReservedCgroup: /kube.slice
systemReservedCgroup: /system.slice
oomScoreAdj: -999
kubeReserved: {cpu: 100m}
systemReserved: {memory: 100Mi}
evictionHard: {memory.available: 100Mi}
evictionSoft: {memory.available: 200Mi}
evictionSoftGracePeriod: {memory.available: 1m}
evictionPressureTransitionPeriod: 5m
evictionMaxPodGracePeriod: 0
evictionMinimumReclaim: {memory.available: 50Mi}
mergeDefaultEvictionSettings: false
localStorageCapacityIsolation: true
kubeAPIQPS: 50
kubeAPIBurst: 100
eventRecordQPS: 50
eventBurst: 100
contentType: application/json
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
imageServiceEndpoint: unix:///run/containerd/containerd.sock
runtimeRequestTimeout: 2m
serializeImagePulls: false
maxParallelImagePulls: 3
registryPullQPS: 5
registryBurst: 10
imageMinimumGCAge: 2m
imageMaximumGCAge: 0s
imageGCHighThresholdPercent: 85
imageGCLowThresholdPercent: 80
containerLogMaxSize: 10Mi
containerLogMaxFiles: 5
containerLogMaxWorkers: 1
containerLogMonitorInterval: 10s
clusterDomain: cluster.local
clusterDNS: [10.96.0.10]
allowedUnsafeSysctls: [net.core.somaxconn, "kernel.msg*"]
resolvConf: /etc/resolv.conf
configMapAndSecretChangeDetectionStrategy: Watch
hairpinMode: promiscuous-bridge
volumeStatsAggPeriod: 1m
shutdownGracePeriod: 0s
shutdownGracePeriodCriticalPods: 0s
shutdownGracePeriodByPodPriority: [{priority: 0, shutdownGracePeriodSeconds: 10}]
failSwapOn: true
cgroupDriver: cgroupfs
cgroupsPerQOS: true
cgroupRoot: /
featureGates: {SomeGate: true, QOSReserved: true}
qosReserved: {memory: 50%}
"#;

/// Runs `args` (plus `--config <file with text>`) through the binary's loading path.
fn load(text: &str, args: &[&str]) -> (Unacted, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubelet.yaml");
    std::fs::write(&path, text).unwrap();
    let mut argv = vec!["node-agent".to_owned(), format!("--config={}", path.display())];
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    let flags = Flags::try_parse_from(argv).unwrap();
    let (_, unacted) = flags.kubelet_config().unwrap_or_else(|e| panic!("refused: {e}"));
    let present = super::load_file(&path).unwrap().present_fields;
    (unacted, present)
}

#[test]
fn every_accepted_field_given_warns_exactly_the_documented_ones() {
    // the upstream-only fields take any value: none is checked
    let mut text = EVERY_READ_FIELD.to_owned();
    for f in ACCEPTED_WITHOUT_EFFECT {
        text.push_str(&format!("{f}: {{}}\n"));
    }
    let (unacted, present) = load(&text, &[]);
    let mut read: Vec<&str> = KNOWN_FIELDS.to_vec();
    read.sort_unstable();
    let mut present: Vec<&str> = present.iter().map(String::as_str).collect();
    present.sort_unstable();
    assert_eq!(present, read, "the test file gives every field read");

    let docs = documented_fields();
    assert_eq!(set(&unacted.no_effect), with_status(&docs, NO_EFFECT));
    let partial: BTreeSet<String> = unacted.partial.iter().map(|(f, _)| f.clone()).collect();
    assert_eq!(partial, with_status(&docs, PARTIAL_STATUS));
    assert!(unacted.partial.iter().all(|(_, missing)| !missing.is_empty()));
}

#[test]
fn only_what_is_given_or_on_by_default_is_warned() {
    let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
    // the defaults: localStorageCapacityIsolation is on, and its missing part is named
    let (unacted, _) = load(head, &[]);
    assert!(unacted.no_effect.is_empty());
    assert_eq!(
        set(unacted.partial.iter().map(|(f, _)| f)),
        set(["localStorageCapacityIsolation"])
    );
    // turned off: nothing to warn about
    let (unacted, _) = load(&format!("{head}localStorageCapacityIsolation: false\n"), &[]);
    assert!(unacted.is_empty(), "{unacted:?}");
    // a no-effect field given by a flag is named like one given in the file
    let (unacted, _) = load(
        &format!("{head}localStorageCapacityIsolation: false\ncpuManagerPolicy: static\n"),
        &["--image-service-endpoint=unix:///run/containerd/containerd.sock"],
    );
    assert_eq!(unacted.no_effect, ["cpuManagerPolicy", "imageServiceEndpoint"]);
}

/// A value for each flag that sets a file field.
const FIELD_FLAGS: &[&str] = &[
    "--rotate-certificates=false",
    "--container-runtime-endpoint=unix:///run/containerd/containerd.sock",
    "--image-service-endpoint=unix:///run/containerd/containerd.sock",
    "--register-node=true",
    "--register-with-taints=a=b:NoSchedule",
    "--max-pods=110",
    "--pod-cidr=10.0.0.0/24",
    "--kube-reserved=cpu=100m",
    "--system-reserved=memory=100Mi",
    "--eviction-hard=memory.available<100Mi",
    "--node-status-update-frequency=10s",
    "--sync-frequency=1m",
    "--pod-manifest-path=/etc/kubernetes/manifests",
    "--address=0.0.0.0",
    "--port=10250",
    "--read-only-port=0",
    "--tls-min-version=VersionTLS12",
    "--tls-cipher-suites=TLS_AES_128_GCM_SHA256",
    "--healthz-port=10248",
    "--healthz-bind-address=127.0.0.1",
    "--cluster-domain=cluster.local",
    "--cluster-dns=10.96.0.10",
    "--kube-api-qps=50",
    "--kube-api-burst=100",
    "--event-qps=50",
    "--event-burst=100",
    "--runtime-request-timeout=2m",
    "--provider-id=test://n1",
];

#[test]
fn documented_flags_match_the_command_line() {
    let rows = table("node-agent flags");
    let documented: BTreeSet<String> = rows.iter().map(|r| r[0].clone()).collect();
    let command = Flags::command();
    let actual: BTreeSet<String> = command
        .get_arguments()
        .filter_map(|a| a.get_long())
        .filter(|l| !["help", "version"].contains(l))
        .map(|l| format!("--{l}"))
        .collect();
    assert_eq!(documented, actual, "every flag is documented, and nothing else");

    // a flag that sets a field: the field it names is the one it sets, and the status is the field's
    let fields = documented_fields();
    let mut argv = vec!["node-agent"];
    argv.extend_from_slice(FIELD_FLAGS);
    let flags = Flags::try_parse_from(argv).unwrap();
    let mut origins = BTreeMap::new();
    flags.overlay(&mut FileConfig::default(), &mut origins);
    let sets: BTreeMap<String, String> = origins
        .iter()
        .map(|(field, flag)| ((*flag).to_owned(), (*field).to_owned()))
        .collect();
    let mut documented_sets = BTreeMap::new();
    for row in &rows {
        let (flag, field, status) = (&row[0], &row[1], &row[2]);
        if field == "—" {
            assert_eq!(status, ACTS, "{flag}: node-agent's own flags all act");
            continue;
        }
        assert_eq!(Some(status), fields.get(field), "{flag}: status of {field}");
        documented_sets.insert(flag.clone(), field.clone());
    }
    assert_eq!(documented_sets, sets);
}
