//! What the agent does about changes others make, against the real control plane: a Node left by a previous
//! run (stale labels, our shutdown cordon, an old boot ID, conditions the controller-manager set to Unknown,
//! a pod CIDR), a lease someone else updated, a Node someone deleted, and a repeated event.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use node_agent::node::object::ANNOTATION_CORDONED_ON_SHUTDOWN;
use node_agent::{KubeletConfig, Metrics};
use serde_json::json;
use tokio::time::Instant;

use e2e::init_logging;

use super::support::{
    condition, control_plane, event_reasons, poll, ready_status, start_in_process, start_with, wait_node,
};

const OLD: &str = "2024-01-01T00:00:00Z";
/// Inside the controller-manager's cluster CIDR (10.128.0.0/9), far above what it hands out in order.
const LEFT_CIDR: &str = "10.200.77.0/24";

/// A Node as a previous run leaves it after a graceful stop with --mark-unschedulable-on-shutdown and a
/// reboot: the controller-manager has set every condition to Unknown.
fn left_behind(name: &str) -> anyhow::Result<Node> {
    let unknown = |ty: &str| {
        json!({"type": ty, "status": "Unknown", "reason": "NodeStatusUnknown",
               "message": "Kubelet stopped posting node status.",
               "lastHeartbeatTime": OLD, "lastTransitionTime": OLD})
    };
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name,
                     "labels": {"kubernetes.io/hostname": "stale", "custom": "kept"},
                     "annotations": {ANNOTATION_CORDONED_ON_SHUTDOWN: "true"}},
        "spec": {"unschedulable": true, "podCIDR": LEFT_CIDR, "podCIDRs": [LEFT_CIDR]},
        "status": {"nodeInfo": {"bootID": "old-boot", "machineID": "", "systemUUID": "", "kernelVersion": "",
                                "osImage": "", "containerRuntimeVersion": "", "kubeletVersion": "",
                                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
                   "conditions": [unknown("MemoryPressure"), unknown("DiskPressure"), unknown("PIDPressure"),
                                  unknown("Ready")]}
    }))?)
}

/// The agent takes over the Node a previous run left: the same object, kubelet labels fixed and others kept,
/// its own shutdown cordon lifted, fresh conditions and nodeInfo, every status part re-sent, the Node's pod
/// CIDR handed to the runtime and a Rebooted warning for the new boot ID.
#[tokio::test]
async fn a_node_left_by_a_previous_run_is_taken_over_and_brought_up_to_date() -> anyhow::Result<()> {
    init_logging();
    let cp = control_plane().await?;
    let admin = cp.admin_client().await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    let name = "nl-left";
    if nodes.get_opt(name).await?.is_some() {
        // left over from an earlier run against the same control plane
        nodes.delete(name, &DeleteParams::default()).await?;
        poll("the old Node to go", Duration::from_secs(10), || async {
            Ok(nodes.get_opt(name).await?.is_none().then_some(()))
        })
        .await?;
    }
    let created = nodes.create(&PostParams::default(), &left_behind(name)?).await?;
    // the API server may drop status on create: put it back the way the controller-manager left it
    let status = serde_json::to_value(&left_behind(name)?.status)?;
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await?;
    let uid = created.metadata.uid.clone();

    let t0 = Instant::now();
    let a = start_in_process(cp, name).await?;
    let node = wait_node(
        &nodes,
        name,
        "Ready=True and schedulable",
        Duration::from_secs(10),
        |n| {
            ready_status(n).as_deref() == Some("True")
                && n.spec.as_ref().and_then(|s| s.unschedulable) != Some(true)
        },
    )
    .await?;
    println!(
        "[node_lifecycle] {name}: left-behind Node taken over, Ready and uncordoned after {:?}",
        t0.elapsed()
    );
    assert_eq!(node.metadata.uid, uid, "the same Node object");
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("kubernetes.io/hostname").map(String::as_str),
        Some(name)
    );
    assert_eq!(labels.get("custom").map(String::as_str), Some("kept"));
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    assert!(
        !annotations.contains_key(ANNOTATION_CORDONED_ON_SHUTDOWN),
        "{annotations:?}"
    );
    let ready = condition(&node, "Ready").context("Ready")?;
    assert_eq!(ready.reason.as_deref(), Some("KubeletReady"));
    let transition = ready.last_transition_time.as_ref().map(|t| t.0.to_string());
    assert_ne!(transition.as_deref(), Some(OLD), "a fresh transition");
    let st = node.status.clone().context("status")?;
    let info = st.node_info.context("nodeInfo")?;
    assert_ne!(info.boot_id, "old-boot");
    assert!(
        info.container_runtime_version.starts_with("cri-fake://"),
        "{}",
        info.container_runtime_version
    );
    assert_eq!(
        st.capacity
            .as_ref()
            .and_then(|c| c.get("pods"))
            .map(|q| q.0.as_str()),
        Some("110"),
        "parts the Node lacked are sent"
    );
    poll(
        "the runtime to get the Node's pod CIDR",
        Duration::from_secs(10),
        || {
            let got = a.runtime.pod_cidr().unwrap_or_default();
            async move { Ok((got == LEFT_CIDR).then_some(())) }
        },
    )
    .await?;
    let want = ["Rebooted", "NodeReady", "NodeHasSufficientMemory"];
    let reasons = poll(
        "Rebooted and NodeReady events",
        Duration::from_secs(10),
        || async {
            let r = event_reasons(&admin, name).await?;
            Ok(want.iter().all(|w| r.iter().any(|x| x == w)).then_some(r))
        },
    )
    .await?;
    println!(
        "[node_lifecycle] {name}: podCIDR {LEFT_CIDR} kept and handed to the runtime; events {reasons:?}"
    );
    assert_eq!(
        a.metrics.request_count("create", "nodes", 409),
        1,
        "found, not duplicated"
    );
    a.agent.stop(Duration::from_secs(10)).await?;
    Ok(())
}

/// Someone else updates the node's lease: the agent's next renewal conflicts, it reads the lease again and
/// renews that (keeping the other writer's change) instead of failing on.
#[tokio::test]
async fn a_lease_updated_by_someone_else_is_read_again_and_renewed() -> anyhow::Result<()> {
    init_logging();
    let cp = control_plane().await?;
    let admin = cp.admin_client().await?;
    let name = "nl-lease-conflict";
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    let a = start_in_process(cp, name).await?;
    poll("the lease", Duration::from_secs(10), || async {
        Ok(leases.get_opt(name).await?)
    })
    .await?;

    let (conflicts0, reads0) = (
        a.metrics.request_count("update", "leases", 409),
        a.metrics.request_count("get", "leases", 200),
    );
    let touched = leases
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touched-by": "admin"}}})),
        )
        .await?;
    let touched_renew = touched.spec.and_then(|s| s.renew_time).context("renewTime")?.0;
    let t = Instant::now();
    let lease = poll(
        "a renewal after the conflict",
        Duration::from_secs(25),
        || async {
            let l = leases.get(name).await?;
            let renewed = l
                .spec
                .as_ref()
                .and_then(|s| s.renew_time.as_ref())
                .is_some_and(|r| r.0 > touched_renew);
            Ok(renewed.then_some(l))
        },
    )
    .await?;
    let conflicts = a.metrics.request_count("update", "leases", 409) - conflicts0;
    let rereads = a.metrics.request_count("get", "leases", 200) - reads0;
    println!(
        "[node_lifecycle] {name}: lease touched by admin; renewed again after {:?} ({conflicts} conflict, {rereads} re-read)",
        t.elapsed()
    );
    assert_eq!(conflicts, 1, "the first renewal after the change conflicted");
    assert_eq!(rereads, 1, "and the lease was read again");
    let labels = lease.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels.get("touched-by").map(String::as_str),
        Some("admin"),
        "the other change is kept"
    );
    assert_eq!(lease.spec.and_then(|s| s.holder_identity).as_deref(), Some(name));
    a.agent.stop(Duration::from_secs(10)).await?;
    Ok(())
}

/// An administrator deletes the Node: the agent notices at its next status report and registers it again,
/// and the lease follows the new Node. (The report interval is 10 s here so the test takes seconds.)
#[tokio::test]
async fn a_deleted_node_is_registered_again_and_the_lease_follows() -> anyhow::Result<()> {
    init_logging();
    let cp = control_plane().await?;
    let admin = cp.admin_client().await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    let name = "nl-deleted";
    let kubelet = KubeletConfig {
        node_status_report_frequency: Duration::from_secs(10),
        ..KubeletConfig::default()
    };
    let a = start_with(cp, name, kubelet, Arc::new(Metrics::unregistered())).await?;
    let node = wait_node(&nodes, name, "Ready=True", Duration::from_secs(10), |n| {
        ready_status(n).as_deref() == Some("True")
    })
    .await?;
    let old_uid = node.metadata.uid.clone().context("uid")?;
    poll("the lease", Duration::from_secs(10), || async {
        Ok(leases.get_opt(name).await?)
    })
    .await?;

    nodes.delete(name, &DeleteParams::default()).await?;
    let t = Instant::now();
    let node = wait_node(
        &nodes,
        name,
        "the Node registered again",
        Duration::from_secs(30),
        |n| n.metadata.uid.as_deref() != Some(old_uid.as_str()) && ready_status(n).as_deref() == Some("True"),
    )
    .await?;
    let registered_after = t.elapsed();
    let new_uid = node.metadata.uid.clone().context("uid")?;
    let owner = |l: &Lease| {
        l.metadata
            .owner_references
            .as_ref()
            .and_then(|o| o.iter().find(|r| r.kind == "Node"))
            .map(|r| r.uid.clone())
    };
    poll(
        "the lease to name the new Node as owner",
        Duration::from_secs(30),
        || async {
            let l = leases.get_opt(name).await?;
            Ok(l.filter(|l| owner(l).as_deref() == Some(new_uid.as_str()))
                .map(|_| ()))
        },
    )
    .await?;
    println!(
        "[node_lifecycle] {name}: deleted; registered again after {registered_after:?}, lease owned by the new Node after {:?}",
        t.elapsed()
    );
    assert_eq!(a.metrics.request_count("create", "nodes", 201), 2);
    a.agent.stop(Duration::from_secs(10)).await?;
    Ok(())
}

/// The same event twice: one Event with count 2, as the kubelet's recorder does.
#[tokio::test]
async fn a_repeated_event_is_counted_not_duplicated() -> anyhow::Result<()> {
    init_logging();
    let cp = control_plane().await?;
    let admin = cp.admin_client().await?;
    let name = "nl-events";
    let a = start_in_process(cp, name).await?;
    let ctx = a.agent.context();
    let node_ref = ctx.node_reference();
    ctx.events.warning(&node_ref, "TestRepeated", "the same message");
    ctx.events.warning(&node_ref, "TestRepeated", "the same message");
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let fields = format!("involvedObject.name={name},reason=TestRepeated");
    let list = poll(
        "one TestRepeated event with count 2",
        Duration::from_secs(15),
        || async {
            let l = events.list(&ListParams::default().fields(&fields)).await?.items;
            Ok((l.iter().any(|e| e.count == Some(2))).then_some(l))
        },
    )
    .await?;
    assert_eq!(list.len(), 1, "{list:?}");
    let e = &list[0];
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(e.involved_object.kind.as_deref(), Some("Node"));
    assert_eq!(
        e.source.as_ref().and_then(|s| s.component.as_deref()),
        Some("kubelet")
    );
    assert_eq!(e.source.as_ref().and_then(|s| s.host.as_deref()), Some(name));
    a.agent.stop(Duration::from_secs(10)).await?;
    Ok(())
}
