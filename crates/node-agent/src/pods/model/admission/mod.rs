//! Pod admission: the kubelet's last check before it runs a pod the scheduler (or someone setting
//! `spec.nodeName` directly) sent here.
//!
//! This module judges a pod against [`NodeView`] — the few facts about the node that pods are judged against (allocatable,
//! labels, `NoExecute` taints, host IPs) — and [`admit`], which first refuses pod fields this node does not
//! honour ([`crate::pods::model::fields`], `UnsupportedPodField`), then applies the kubelet's rules in its order:
//! node pressure (`Evicted`), sysctls (`SysctlForbidden`), the pod's OS (`PodOSSelectorNodeLabelDoesNotMatch`,
//! `PodOSNotSupported`), the supplemental groups policy (`SupplementalGroupsPolicyNotSupported`), node selector and
//! required node affinity (`NodeAffinity`), host ports (`NodePorts`), resources (`OutOfcpu`, `OutOfmemory`,
//! `OutOfephemeral-storage`, `OutOfpods`, `OutOf<extended resource>`, `OutOfhugepages-<size>`), untolerated `NoExecute` taints
//! (`TaintToleration`), and AppArmor profiles the host cannot enforce (`AppArmor`). [`admit_devices`] is the device
//! manager's check of device plugin resources (`UnexpectedAdmissionError`). A rejection carries the reason and
//! message the pod's status and event show.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Pod, Toleration};

use crate::pods::model::node_view::NodeView;
use crate::pods::model::resources::PodRequests;
use crate::pods::model::spec::DesiredPod;
use crate::sysctl::Allowlist;

/// Why a pod was refused. Its status becomes `Failed` with this reason and `Pod was rejected: <message>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The kubelet's reason: `OutOfcpu`, `OutOfmemory`, `OutOfpods`, `NodeAffinity`, `NodePorts`,
    /// `TaintToleration`, …
    pub reason: String,
    /// The human-readable explanation.
    pub message: String,
}

/// What is already committed on the node: the sum of admitted, not yet terminated pods.
#[derive(Debug, Clone, Default)]
pub struct Committed {
    /// Summed requests.
    pub requests: PodRequests,
    /// Number of pods.
    pub pods: i64,
    /// Host ports in use, as `(protocol, port)`.
    pub host_ports: HashSet<(String, i32)>,
    /// Summed effective requests of extended resources.
    pub extended: BTreeMap<String, i64>,
}

impl Committed {
    /// Adds a pod.
    pub fn add(&mut self, pod: &DesiredPod) {
        self.requests = self.requests.plus(pod.requests());
        self.pods += 1;
        self.host_ports.extend(host_ports(pod));
        for (resource, n) in scalar_requests(pod) {
            *self.extended.entry(resource).or_default() += n;
        }
    }

    /// Removes a pod added before.
    pub fn remove(&mut self, pod: &DesiredPod) {
        self.requests = self.requests.minus(pod.requests());
        self.pods -= 1;
        for p in host_ports(pod) {
            self.host_ports.remove(&p);
        }
        for (resource, n) in scalar_requests(pod) {
            if let Some(used) = self.extended.get_mut(&resource) {
                *used -= n;
                if *used <= 0 {
                    self.extended.remove(&resource);
                }
            }
        }
    }
}

fn host_ports(pod: &DesiredPod) -> impl Iterator<Item = (String, i32)> + '_ {
    pod.init_containers
        .iter()
        .chain(pod.containers.iter())
        .flat_map(|c| &c.ports)
        .filter(|(_, host, _)| *host > 0)
        .map(|(_, host, proto)| (proto.clone(), *host))
}

fn predicate(name: &str, why: &str) -> Rejection {
    Rejection {
        reason: name.to_owned(),
        message: format!("Predicate {name} failed: {why}"),
    }
}

/// The status reason of a pod refused under node pressure, and of an evicted pod.
pub const EVICTED: &str = "Evicted";

/// Pod admission under pressure, as the kubelet's eviction admit handler: with no pressure, or for a
/// critical pod, `Ok`; with memory pressure alone, every pod but a BestEffort one that does not tolerate the
/// `node.kubernetes.io/memory-pressure` taint; with any other pressure, none. `Err` carries the message
/// (reason [`EVICTED`]).
pub fn admit_under_pressure(
    pressure: crate::node::Pressure,
    critical: bool,
    best_effort: bool,
    tolerates_memory_pressure: bool,
) -> Result<(), String> {
    let mut conditions = Vec::new();
    if pressure.memory {
        conditions.push("MemoryPressure");
    }
    if pressure.disk {
        conditions.push("DiskPressure");
    }
    if pressure.pid {
        conditions.push("PIDPressure");
    }
    if conditions.is_empty() || critical {
        return Ok(());
    }
    if conditions == ["MemoryPressure"] && (!best_effort || tolerates_memory_pressure) {
        return Ok(());
    }
    Err(format!("The node had condition: [{}]. ", conditions.join(" ")))
}

/// The OS this agent runs pods of.
const NODE_OS: &str = "linux";

/// The pod's sysctls, judged against the node's allowlist (`SysctlForbidden`), as the kubelet's sysctl
/// admission handler.
fn admit_sysctls(pod: &Pod, sysctls: &Allowlist) -> Result<(), Rejection> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(());
    };
    let asked = spec
        .security_context
        .as_ref()
        .and_then(|sc| sc.sysctls.as_deref())
        .unwrap_or_default();
    for s in asked {
        let host_network = spec.host_network.unwrap_or(false);
        let host_ipc = spec.host_ipc.unwrap_or(false);
        if let Err(why) = sysctls.check(&s.name, host_network, host_ipc) {
            return Err(Rejection {
                reason: "SysctlForbidden".into(),
                message: format!("forbidden sysctl: {why}"),
            });
        }
    }
    Ok(())
}

/// The pod's OS, as the kubelet judges it before its other predicates: a `kubernetes.io/os` label on the pod
/// naming another OS than the node's (`PodOSSelectorNodeLabelDoesNotMatch`), or `spec.os.name` naming another
/// (`PodOSNotSupported`).
fn admit_os(pod: &Pod) -> Result<(), Rejection> {
    // as the kubelet: the node's label counts as this OS even when it says otherwise (the node status loop
    // puts it right)
    let label = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("kubernetes.io/os"));
    if label.is_some_and(|os| os != NODE_OS) {
        return Err(Rejection {
            reason: "PodOSSelectorNodeLabelDoesNotMatch".into(),
            message: "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label".into(),
        });
    }
    let os = pod
        .spec
        .as_ref()
        .and_then(|s| s.os.as_ref())
        .map(|os| os.name.as_str());
    if os.is_some_and(|os| os != NODE_OS) {
        return Err(Rejection {
            reason: "PodOSNotSupported".into(),
            message: "Failed to admit pod as the OS field doesn't match node OS".into(),
        });
    }
    Ok(())
}

/// `supplementalGroupsPolicy: Strict` on a node whose runtime does not support it, as the kubelet refuses it.
fn admit_supplemental_groups(desired: &DesiredPod, node: &NodeView) -> Result<(), Rejection> {
    let strict = desired
        .security
        .as_deref()
        .is_some_and(|p| p.supplemental_groups_strict);
    if strict && !node.supplemental_groups_policy {
        return Err(Rejection {
            reason: "SupplementalGroupsPolicyNotSupported".into(),
            message: "SupplementalGroupsPolicy=Strict is not supported in this node".into(),
        });
    }
    Ok(())
}

/// AppArmor as the kubelet's admit handler judges it: a pod asking for any profile but `Unconfined` (by field or
/// the deprecated annotation) needs a host with AppArmor enabled, and a `Localhost` profile needs a name.
fn admit_apparmor(desired: &DesiredPod, apparmor_enabled: bool) -> Result<(), Rejection> {
    use crate::pods::model::security::{APPARMOR_ANNOTATION_PREFIX, AppArmor};
    let confined = |a: Option<&AppArmor>| a.is_some_and(|a| *a != AppArmor::Unconfined);
    let pod_level = confined(desired.security.as_deref().and_then(|p| p.apparmor.as_ref()));
    let containers = || desired.init_containers.iter().chain(desired.containers.iter());
    let own = containers().any(|c| confined(c.security.as_deref().and_then(|s| s.apparmor.as_ref())));
    let annotated = desired
        .annotations
        .iter()
        .find(|(k, _)| k.starts_with(APPARMOR_ANNOTATION_PREFIX))
        .is_some_and(|(_, v)| v != "unconfined");
    if !(pod_level || own || annotated) {
        return Ok(());
    }
    let refuse = |why: String| Rejection {
        reason: "AppArmor".into(),
        message: format!("Cannot enforce AppArmor: {why}"),
    };
    if !apparmor_enabled {
        return Err(refuse("AppArmor is not enabled on the host".into()));
    }
    for c in containers() {
        let profile = desired.apparmor(c);
        if let Some(AppArmor::Localhost(name)) = profile.as_deref()
            && name.trim().is_empty()
        {
            return Err(refuse(format!(
                "invalid empty AppArmor profile name (container {:?})",
                c.name
            )));
        }
    }
    Ok(())
}

/// Decides whether `pod` may run on the node next to what is `committed`, allowing the sysctls of `sysctls`;
/// `apparmor_enabled` says whether the host enforces AppArmor profiles.
pub fn admit(
    pod: &Pod,
    desired: &DesiredPod,
    node: &NodeView,
    committed: &Committed,
    critical: bool,
    sysctls: &Allowlist,
    apparmor_enabled: bool,
) -> Result<(), Rejection> {
    let refused = crate::pods::model::fields::refusals(pod);
    if !refused.is_empty() {
        let message: Vec<String> = refused.iter().map(ToString::to_string).collect();
        return Err(Rejection {
            reason: crate::pods::model::fields::REASON.into(),
            message: message.join("; "),
        });
    }
    let spec = pod.spec.as_ref();
    let tolerates_memory_pressure = spec
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default()
        .iter()
        .any(|t| tolerates_effect(t, "node.kubernetes.io/memory-pressure", "", "NoSchedule"));
    admit_under_pressure(
        node.pressure,
        critical,
        desired.qos == crate::pods::model::resources::QosClass::BestEffort,
        tolerates_memory_pressure,
    )
    .map_err(|message| Rejection {
        reason: EVICTED.into(),
        message,
    })?;
    admit_sysctls(pod, sysctls)?;
    admit_os(pod)?;
    admit_supplemental_groups(desired, node)?;
    if !matches_node(
        spec.and_then(|s| s.node_selector.as_ref()),
        spec.and_then(required_terms),
        node,
    ) {
        return Err(predicate(
            "NodeAffinity",
            "node(s) didn't match Pod's node affinity/selector",
        ));
    }
    if host_ports(desired).any(|p| committed.host_ports.contains(&p)) {
        return Err(predicate(
            "NodePorts",
            "node(s) didn't have free ports for the requested pod ports",
        ));
    }
    if committed.pods + 1 > node.pods {
        return Err(short("pods", 1, committed.pods, node.pods));
    }
    fit_resources(desired.requests(), committed.requests, node)?;
    fit_extended(desired, committed, node)?;
    let tolerations: &[Toleration] = spec.and_then(|s| s.tolerations.as_deref()).unwrap_or_default();
    let untolerated = node
        .no_execute_taints
        .iter()
        .any(|(key, value)| !tolerations.iter().any(|t| tolerates(t, key, value)));
    if untolerated {
        return Err(predicate("TaintToleration", "node(s) had untolerated taint(s)"));
    }
    admit_apparmor(desired, apparmor_enabled)
}

fn short(name: &str, requested: i64, used: i64, capacity: i64) -> Rejection {
    Rejection {
        reason: format!("OutOf{name}"),
        message: format!(
            "Node didn't have enough resource: {name}, requested: {requested}, used: {used}, capacity: {capacity}"
        ),
    }
}

/// The pod's effective requests of extended resources and of huge pages (by the node's name for the size), as
/// admission counts them.
pub fn scalar_requests(pod: &DesiredPod) -> BTreeMap<String, i64> {
    let mut out = pod.extended_effective();
    for (size, bytes) in pod.hugepages() {
        out.insert(
            crate::pods::model::resources::hugepage_resource(size),
            i64::try_from(bytes).unwrap_or(i64::MAX),
        );
    }
    out
}

/// Whether the pod's extended resources and huge pages fit beside what is committed, as the kubelet's resource
/// predicate judges them (`OutOf<resource>`): only extended resources the node's allocatable names are checked,
/// as the kubelet leaves out those it does not know (cluster-level resources); huge pages of a size the node
/// does not have do not fit.
fn fit_extended(desired: &DesiredPod, committed: &Committed, node: &NodeView) -> Result<(), Rejection> {
    for (resource, want) in scalar_requests(desired) {
        let capacity = match node.extended.get(&resource) {
            Some(capacity) => *capacity,
            None if resource.starts_with("hugepages-") => 0,
            None => continue,
        };
        let used = committed.extended.get(&resource).copied().unwrap_or(0);
        if want > 0 && used + want > capacity {
            return Err(short(&resource, want, used, capacity));
        }
    }
    Ok(())
}

/// Admission by the device manager, as the kubelet's resource allocation admit handler: the devices of the
/// pod's device plugin resources are reserved, or the pod is refused (`UnexpectedAdmissionError`).
pub fn admit_devices(devices: &crate::devices::DeviceManager, desired: &DesiredPod) -> Result<(), Rejection> {
    if desired.extended_requests().is_empty() {
        return Ok(());
    }
    devices
        .admit(&desired.uid, desired.extended_requests())
        .map_err(|message| Rejection {
            reason: UNEXPECTED_ADMISSION_ERROR.into(),
            message,
        })
}

/// The kubelet's reason for a pod refused by a resource manager (here: the device manager).
pub const UNEXPECTED_ADMISSION_ERROR: &str = "UnexpectedAdmissionError";

/// Whether requests `want` fit beside `used` in the node's allocatable, as the kubelet's resource predicate
/// judges them (cpu, then memory, then ephemeral storage; a resource not requested always fits).
pub fn fit_resources(want: PodRequests, used: PodRequests, node: &NodeView) -> Result<(), Rejection> {
    if want.cpu_milli > 0 && used.cpu_milli + want.cpu_milli > node.cpu_milli {
        return Err(short("cpu", want.cpu_milli, used.cpu_milli, node.cpu_milli));
    }
    if want.memory > 0 && used.memory + want.memory > node.memory {
        return Err(short("memory", want.memory, used.memory, node.memory));
    }
    if node.ephemeral > 0 && want.ephemeral > 0 && used.ephemeral + want.ephemeral > node.ephemeral {
        return Err(short(
            "ephemeral-storage",
            want.ephemeral,
            used.ephemeral,
            node.ephemeral,
        ));
    }
    Ok(())
}

fn required_terms(
    spec: &k8s_openapi::api::core::v1::PodSpec,
) -> Option<&k8s_openapi::api::core::v1::NodeSelector> {
    spec.affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()
}

fn matches_node(
    selector: Option<&BTreeMap<String, String>>,
    required: Option<&k8s_openapi::api::core::v1::NodeSelector>,
    node: &NodeView,
) -> bool {
    let selector_ok = selector.is_none_or(|s| s.iter().all(|(k, v)| node.labels.get(k) == Some(v.as_str())));
    let affinity_ok = required.is_none_or(|r| {
        r.node_selector_terms.iter().any(|term| {
            let exprs = term.match_expressions.as_deref().unwrap_or_default();
            let fields = term.match_fields.as_deref().unwrap_or_default();
            if exprs.is_empty() && fields.is_empty() {
                return false;
            }
            exprs.iter().all(|e| requirement(e, node.labels.get(&e.key)))
                && fields
                    .iter()
                    .all(|f| requirement(f, (f.key == "metadata.name").then_some(node.name.as_str())))
        })
    });
    selector_ok && affinity_ok
}

fn requirement(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(number), values.first().and_then(|s| number(s))), (Some(a), Some(b)) if a > b)
        }
        "Lt" => {
            matches!((value.and_then(number), values.first().and_then(|s| number(s))), (Some(a), Some(b)) if a < b)
        }
        _ => false,
    }
}

fn tolerates(t: &Toleration, key: &str, value: &str) -> bool {
    tolerates_effect(t, key, value, "NoExecute")
}

/// Does `t` tolerate a taint `key=value:effect`?
fn tolerates_effect(t: &Toleration, key: &str, value: &str, effect: &str) -> bool {
    if t.effect.as_deref().is_some_and(|e| !e.is_empty() && e != effect) {
        return false;
    }
    let tkey = t.key.as_deref().unwrap_or_default();
    match t.operator.as_deref() {
        Some("Exists") => tkey.is_empty() || tkey == key,
        _ => tkey == key && t.value.as_deref().unwrap_or_default() == value,
    }
}

#[cfg(test)]
mod pressure_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    fn node() -> NodeView {
        let n: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"zone": "a", "size": "4"}},
            "spec": {"taints": [{"key": "dedicated", "value": "x", "effect": "NoExecute"},
                                {"key": "soft", "effect": "NoSchedule"}]},
            "status": {
                "allocatable": {"cpu": "2", "memory": "1Gi", "pods": "3"},
                "addresses": [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "10.0.0.1"}]
            }
        }))
        .unwrap();
        NodeView::from_node(&n)
    }

    fn pod(spec: serde_json::Value) -> (Pod, std::sync::Arc<DesiredPod>) {
        let mut spec = spec;
        spec["tolerations"] = json!([{"key": "dedicated", "operator": "Exists"}]);
        let p: Pod =
            serde_json::from_value(json!({"metadata": {"name": "p", "uid": "u"}, "spec": spec})).unwrap();
        let d = DesiredPod::from_pod(&p).unwrap();
        (p, d)
    }

    #[test]
    fn sysctls_and_the_pod_os_are_judged_first() {
        let judge = |spec: serde_json::Value, labels: serde_json::Value, list: &Allowlist| {
            let (mut p, d) = pod(spec);
            p.metadata.labels = serde_json::from_value(labels).unwrap();
            admit(&p, &d, &node(), &Committed::default(), false, list, false)
                .map_err(|r| (r.reason, r.message))
        };
        let sysctls = |names: &[&str]| {
            json!({"securityContext": {"sysctls": names.iter().map(|n| json!({"name": n, "value": "1"}))
                .collect::<Vec<_>>()}})
        };
        let safe = Allowlist::safe();
        assert!(judge(sysctls(&["net.ipv4.tcp_syncookies"]), json!(null), safe).is_ok());
        assert_eq!(
            judge(sysctls(&["kernel.msgmax"]), json!(null), safe).unwrap_err(),
            (
                "SysctlForbidden".to_owned(),
                "forbidden sysctl: \"kernel.msgmax\" not allowlisted".to_owned()
            )
        );
        let more = Allowlist::new(["kernel.msg*"]).unwrap();
        assert!(judge(sysctls(&["kernel.msgmax"]), json!(null), &more).is_ok());

        assert!(
            judge(
                json!({"os": {"name": "linux"}}),
                json!({"kubernetes.io/os": "linux"}),
                safe
            )
            .is_ok()
        );
        assert_eq!(
            judge(json!({"os": {"name": "windows"}}), json!(null), safe)
                .unwrap_err()
                .0,
            "PodOSNotSupported"
        );
        assert_eq!(
            judge(json!({}), json!({"kubernetes.io/os": "windows"}), safe).unwrap_err(),
            (
                "PodOSSelectorNodeLabelDoesNotMatch".to_owned(),
                "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label".to_owned()
            )
        );
    }

    #[test]
    fn node_view_reads_allocatable_and_addresses() {
        let n = node();
        assert_eq!((n.cpu_milli, n.memory, n.pods), (2000, 1 << 30, 3));
        assert_eq!(n.host_ips, vec!["10.0.0.1".to_owned()]);
        assert_eq!(
            n.no_execute_taints,
            vec![("dedicated".to_owned(), "x".to_owned())]
        );
    }

    #[test]
    fn out_of_cpu_names_request_use_and_capacity() {
        let (p, d) = pod(json!({"containers": [
            {"name": "c", "image": "i", "resources": {"requests": {"cpu": "1500m"}}}
        ]}));
        let mut committed = Committed::default();
        assert!(admit(&p, &d, &node(), &committed, false, Allowlist::safe(), false).is_ok());
        committed.add(&d);
        let err = admit(&p, &d, &node(), &committed, false, Allowlist::safe(), false).unwrap_err();
        assert_eq!(err.reason, "OutOfcpu");
        assert_eq!(
            err.message,
            "Node didn't have enough resource: cpu, requested: 1500, used: 1500, capacity: 2000"
        );
        committed.remove(&d);
        assert!(admit(&p, &d, &node(), &committed, false, Allowlist::safe(), false).is_ok());
    }

    #[test]
    fn extended_resources_are_checked_when_the_node_reports_them() {
        let (p, d) = pod(json!({
            "initContainers": [{"name": "init", "image": "i",
                "resources": {"limits": {"example.com/foo": "3"}}}],
            "containers": [
                {"name": "a", "image": "i", "resources": {"limits": {"example.com/foo": "1"}}},
                {"name": "b", "image": "i", "resources": {"requests": {"example.com/foo": "1"},
                                                          "limits": {"example.com/foo": "1"}}},
            ]
        }));
        // the largest init container's request beats the app containers' sum
        assert_eq!(d.extended_effective().get("example.com/foo"), Some(&3));
        let mut n = node();
        // a resource the node does not report is not checked (the kubelet's cluster-level resources)
        assert!(admit(&p, &d, &n, &Committed::default(), false, Allowlist::safe(), false).is_ok());
        n.extended.insert("example.com/foo".into(), 4);
        let mut committed = Committed::default();
        assert!(admit(&p, &d, &n, &committed, false, Allowlist::safe(), false).is_ok());
        committed.add(&d);
        let err = admit(&p, &d, &n, &committed, false, Allowlist::safe(), false).unwrap_err();
        assert_eq!(err.reason, "OutOfexample.com/foo");
        assert_eq!(
            err.message,
            "Node didn't have enough resource: example.com/foo, requested: 3, used: 3, capacity: 4"
        );
        committed.remove(&d);
        assert!(committed.extended.is_empty());
    }

    #[test]
    fn huge_pages_fit_the_nodes_allocatable_or_the_pod_is_refused() {
        let (p, d) = pod(json!({"containers": [{"name": "c", "image": "i", "resources": {
            "limits": {"memory": "16Mi", "hugepages-2048Ki": "4Mi"}}}]}));
        let mut n = node();
        let err = admit(&p, &d, &n, &Committed::default(), false, Allowlist::safe(), false).unwrap_err();
        assert_eq!(
            err.reason, "OutOfhugepages-2Mi",
            "a node without the size has none"
        );
        assert_eq!(
            err.message,
            "Node didn't have enough resource: hugepages-2Mi, requested: 4194304, used: 0, capacity: 0"
        );
        n.extended.insert("hugepages-2Mi".into(), 6 << 20);
        let mut committed = Committed::default();
        assert!(admit(&p, &d, &n, &committed, false, Allowlist::safe(), false).is_ok());
        committed.add(&d);
        let err = admit(&p, &d, &n, &committed, false, Allowlist::safe(), false).unwrap_err();
        assert_eq!(
            err.message,
            "Node didn't have enough resource: hugepages-2Mi, requested: 4194304, used: 4194304, capacity: 6291456"
        );
        committed.remove(&d);
        assert!(committed.extended.is_empty());
    }

    #[test]
    fn out_of_memory_and_pods() {
        let (p, d) = pod(json!({"containers": [
            {"name": "c", "image": "i", "resources": {"requests": {"memory": "2Gi"}}}
        ]}));
        assert_eq!(
            admit(
                &p,
                &d,
                &node(),
                &Committed::default(),
                false,
                Allowlist::safe(),
                false
            )
            .unwrap_err()
            .reason,
            "OutOfmemory"
        );
        let (p, d) = pod(json!({"containers": [{"name": "c", "image": "i"}]}));
        let full = Committed {
            pods: 3,
            ..Default::default()
        };
        assert_eq!(
            admit(&p, &d, &node(), &full, false, Allowlist::safe(), false)
                .unwrap_err()
                .reason,
            "OutOfpods"
        );
    }

    #[test]
    fn node_affinity_and_selector() {
        let (p, d) = pod(json!({"nodeSelector": {"zone": "b"}, "containers": [{"name": "c", "image": "i"}]}));
        let err = admit(
            &p,
            &d,
            &node(),
            &Committed::default(),
            false,
            Allowlist::safe(),
            false,
        )
        .unwrap_err();
        assert_eq!(err.reason, "NodeAffinity");
        let (p, d) = pod(json!({
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                {"matchExpressions": [{"key": "size", "operator": "Gt", "values": ["2"]}]}
            ]}}},
            "containers": [{"name": "c", "image": "i"}]
        }));
        assert!(
            admit(
                &p,
                &d,
                &node(),
                &Committed::default(),
                false,
                Allowlist::safe(),
                false
            )
            .is_ok(),
            "second term matches"
        );
    }

    #[test]
    fn untolerated_no_execute_taint_is_refused() {
        let (mut p, d) = pod(json!({"containers": [{"name": "c", "image": "i"}]}));
        p.spec.as_mut().unwrap().tolerations = None;
        let err = admit(
            &p,
            &d,
            &node(),
            &Committed::default(),
            false,
            Allowlist::safe(),
            false,
        )
        .unwrap_err();
        assert_eq!(err.reason, "TaintToleration");
    }

    #[test]
    fn host_port_conflicts() {
        let (p, d) = pod(json!({"containers": [
            {"name": "c", "image": "i", "ports": [{"containerPort": 80, "hostPort": 8080}]}
        ]}));
        let mut committed = Committed::default();
        committed.add(&d);
        assert_eq!(
            admit(&p, &d, &node(), &committed, false, Allowlist::safe(), false)
                .unwrap_err()
                .reason,
            "NodePorts"
        );
    }

    #[test]
    fn apparmor_needs_a_host_that_enforces_it() {
        let admit_on = |spec: serde_json::Value, annotations: serde_json::Value, enabled: bool| {
            let p: Pod = serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": annotations},
                "spec": spec, "status": {"phase": "Pending"}}))
            .unwrap();
            let d = DesiredPod::from_pod(&p).unwrap();
            admit(
                &p,
                &d,
                &node(),
                &Committed::default(),
                false,
                Allowlist::safe(),
                enabled,
            )
            .map_err(|r| (r.reason, r.message))
        };
        let tolerate = json!([{"key": "dedicated", "operator": "Exists"}]);
        let confined = json!({"tolerations": tolerate, "containers": [{"name": "a", "image": "i",
            "securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}}}]});
        let refused = (
            "AppArmor".to_owned(),
            "Cannot enforce AppArmor: AppArmor is not enabled on the host".to_owned(),
        );
        assert_eq!(admit_on(confined.clone(), json!({}), false), Err(refused.clone()));
        assert_eq!(admit_on(confined, json!({}), true), Ok(()));
        let pod_level = json!({"tolerations": tolerate,
            "securityContext": {"appArmorProfile": {"type": "Localhost", "localhostProfile": "x"}},
            "containers": [{"name": "a", "image": "i"}]});
        assert_eq!(admit_on(pod_level, json!({}), false), Err(refused.clone()));
        let plain = json!({"tolerations": tolerate, "containers": [{"name": "a", "image": "i"}]});
        let annotated = json!({"container.apparmor.security.beta.kubernetes.io/a": "runtime/default"});
        assert_eq!(admit_on(plain.clone(), annotated, false), Err(refused));
        let unconfined = json!({"container.apparmor.security.beta.kubernetes.io/a": "unconfined"});
        assert_eq!(
            admit_on(plain.clone(), unconfined, false),
            Ok(()),
            "Unconfined needs nothing of the host"
        );
        let empty = json!({"container.apparmor.security.beta.kubernetes.io/a": "localhost/ "});
        let err = admit_on(plain, empty, true).unwrap_err();
        assert_eq!(err.0, "AppArmor");
        assert!(
            err.1
                .starts_with("Cannot enforce AppArmor: invalid empty AppArmor profile name"),
            "{}",
            err.1
        );
    }

    #[test]
    fn strict_supplemental_groups_need_the_runtimes_support() {
        let (p, d) = pod(json!({"securityContext": {"supplementalGroupsPolicy": "Strict"},
                                "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                                "containers": [{"name": "a", "image": "i"}]}));
        let err = admit(
            &p,
            &d,
            &node(),
            &Committed::default(),
            false,
            Allowlist::safe(),
            false,
        )
        .unwrap_err();
        assert_eq!(
            (err.reason.as_str(), err.message.as_str()),
            (
                "SupplementalGroupsPolicyNotSupported",
                "SupplementalGroupsPolicy=Strict is not supported in this node"
            )
        );
        let mut supported = node();
        supported.supplemental_groups_policy = true;
        assert!(
            admit(
                &p,
                &d,
                &supported,
                &Committed::default(),
                false,
                Allowlist::safe(),
                false
            )
            .is_ok()
        );
    }
}
