//! Tests of the admission predicates through [`admit`], as the pod manager calls it, and of the node view they
//! judge against.

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

/// [`admit`] on `node` beside what is `committed`, for a pod that is not critical, with the safe sysctls and no
/// AppArmor on the host.
fn admitted(p: &Pod, d: &DesiredPod, node: &NodeView, committed: &Committed) -> Result<(), Rejection> {
    admit(p, d, node, committed, false, Allowlist::safe(), false)
}

/// [`admitted`] on the test node with nothing committed.
fn admitted_alone(p: &Pod, d: &DesiredPod) -> Result<(), Rejection> {
    admitted(p, d, &node(), &Committed::default())
}

#[test]
fn sysctls_and_the_pod_os_are_judged_first() {
    let judge = |spec: serde_json::Value, labels: serde_json::Value, list: &Allowlist| {
        let (mut p, d) = pod(spec);
        p.metadata.labels = serde_json::from_value(labels).unwrap();
        admit(&p, &d, &node(), &Committed::default(), false, list, false).map_err(|r| (r.reason, r.message))
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
    assert!(admitted(&p, &d, &node(), &committed).is_ok());
    committed.add(&d);
    let err = admitted(&p, &d, &node(), &committed).unwrap_err();
    assert_eq!(err.reason, "OutOfcpu");
    assert_eq!(
        err.message,
        "Node didn't have enough resource: cpu, requested: 1500, used: 1500, capacity: 2000"
    );
    committed.remove(&d);
    assert!(admitted(&p, &d, &node(), &committed).is_ok());
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
    assert!(admitted(&p, &d, &n, &Committed::default()).is_ok());
    n.extended.insert("example.com/foo".into(), 4);
    let mut committed = Committed::default();
    assert!(admitted(&p, &d, &n, &committed).is_ok());
    committed.add(&d);
    let err = admitted(&p, &d, &n, &committed).unwrap_err();
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
    let err = admitted(&p, &d, &n, &Committed::default()).unwrap_err();
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
    assert!(admitted(&p, &d, &n, &committed).is_ok());
    committed.add(&d);
    let err = admitted(&p, &d, &n, &committed).unwrap_err();
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
    assert_eq!(admitted_alone(&p, &d).unwrap_err().reason, "OutOfmemory");
    let (p, d) = pod(json!({"containers": [{"name": "c", "image": "i"}]}));
    let full = Committed {
        pods: 3,
        ..Default::default()
    };
    assert_eq!(admitted(&p, &d, &node(), &full).unwrap_err().reason, "OutOfpods");
}

#[test]
fn node_affinity_and_selector() {
    let (p, d) = pod(json!({"nodeSelector": {"zone": "b"}, "containers": [{"name": "c", "image": "i"}]}));
    let err = admitted_alone(&p, &d).unwrap_err();
    assert_eq!(err.reason, "NodeAffinity");
    let (p, d) = pod(json!({
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
            {"matchExpressions": [{"key": "size", "operator": "Gt", "values": ["2"]}]}
        ]}}},
        "containers": [{"name": "c", "image": "i"}]
    }));
    assert!(admitted_alone(&p, &d).is_ok(), "second term matches");
}

#[test]
fn untolerated_no_execute_taint_is_refused() {
    let (mut p, d) = pod(json!({"containers": [{"name": "c", "image": "i"}]}));
    p.spec.as_mut().unwrap().tolerations = None;
    let err = admitted_alone(&p, &d).unwrap_err();
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
        admitted(&p, &d, &node(), &committed).unwrap_err().reason,
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
    let err = admitted_alone(&p, &d).unwrap_err();
    assert_eq!(
        (err.reason.as_str(), err.message.as_str()),
        (
            "SupplementalGroupsPolicyNotSupported",
            "SupplementalGroupsPolicy=Strict is not supported in this node"
        )
    );
    let mut supported = node();
    supported.supplemental_groups_policy = true;
    assert!(admitted(&p, &d, &supported, &Committed::default()).is_ok());
}
