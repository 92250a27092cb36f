//! A real node on cgroup v2 with the systemd cgroup driver, in a Debian guest (see `vm_node/harness.rs`;
//! `cgroupDriver: systemd`, containerd with `SystemdCgroup = true`): pods of the three QoS classes run in the
//! kubelet's slices (`kubepods.slice`, `kubepods-burstable.slice`, `kubepods-burstable-pod<uid>.slice`) made by
//! systemd as transient units, with the kubelet's limits and OOM scores, as read from the guest's cgroup and proc
//! files and from systemd; `kubepods.slice` is limited to the node's allocatable; a container past its memory
//! limit is OOM-killed and reported so; a BestEffort pod filling the node's memory is evicted by the v2 figures
//! while a Guaranteed pod stays; a pod asking for huge pages has its slice's hugetlb limits and a hugetlbfs
//! emptyDir. Needs root (or `NODE_AGENT_SKIP_REAL_NODE=1` to skip).

#[path = "vm_node/checks.rs"]
mod checks;
#[path = "vm_node/harness.rs"]
mod harness;

use std::time::{Duration, Instant};

use anyhow::Context;
use e2e::{init_logging, wait_for};
use harness::{NODE, NodeSetup, RESERVED_MEMORY, VmNode};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use tokio::sync::RwLock;

const NS: &str = "vm-systemd";
const TAG: &str = "vm_systemd";
/// The hard eviction threshold on memory: 600 MiB of the guest's 2 GiB, above the reservations (384 MiB), so
/// that pods filling `kubepods.slice` reach it before the slice's limit.
const SETUP: NodeSetup = NodeSetup {
    systemd: true,
    config: "evictionHard: {memory.available: 600Mi}\nevictionPressureTransitionPeriod: 10s\n",
    huge_pages: 4,
};

/// The memory-pressure test holds it alone: under pressure the node admits no BestEffort pod.
static PRESSURE: RwLock<()> = RwLock::const_new(());

#[tokio::test]
async fn qos_pods_run_in_the_kubelets_slices_with_their_limits() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = VmNode::get(SETUP).await? else {
        return Ok(());
    };
    let _shared = PRESSURE.read().await;
    let pods = node.namespace(NS).await?;
    checks::qos_pods_run_in_their_cgroups(node, &pods, TAG).await?;
    // systemd knows the slices as units, with the limits as their properties
    let uid = pods
        .get("guaranteed")
        .await?
        .metadata
        .uid
        .context("uid")?
        .replace('-', "_");
    let unit = format!("kubepods-pod{uid}.slice");
    let show = node
        .vm
        .run(
            &format!("systemctl show -p ActiveState,MemoryMax,CPUQuotaPerSecUSec,TasksMax,Slice {unit}"),
            Duration::from_secs(30),
        )
        .await?;
    println!(
        "[{TAG}] {unit}: {}",
        show.split_whitespace().collect::<Vec<_>>().join(" ")
    );
    for line in [
        "ActiveState=active",
        "MemoryMax=67108864",
        "CPUQuotaPerSecUSec=500ms",
        "Slice=kubepods.slice",
    ] {
        assert!(show.lines().any(|l| l == line), "{unit}: {line} in {show}");
    }
    Ok(())
}

#[tokio::test]
async fn a_huge_pages_pod_is_limited_to_its_pages_and_mounts_them() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = VmNode::get(SETUP).await? else {
        return Ok(());
    };
    let _shared = PRESSURE.read().await;
    checks::a_huge_pages_pod_is_limited_to_its_pages(node, "vm-huge", TAG).await
}

#[tokio::test]
async fn kubepods_slice_is_limited_to_the_nodes_allocatable() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = VmNode::get(SETUP).await? else {
        return Ok(());
    };
    checks::pods_cgroup_is_limited_to_allocatable(node, TAG).await
}

/// The node's MemoryPressure condition.
async fn memory_pressure(nodes: &Api<Node>) -> anyhow::Result<bool> {
    Ok(nodes
        .get(NODE)
        .await?
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "MemoryPressure" && c.status == "True"))
}

/// The OOM kill is checked first, in the same test: in a guest that has just been through memory pressure, a
/// container past its limit stays Running with no kill seen, which is not understood yet (docs/benchmarks.md,
/// "CI: where its time goes").
#[tokio::test]
async fn a_container_past_its_limit_is_oom_killed_then_a_best_effort_hog_is_evicted_and_the_guaranteed_pod_stays()
-> anyhow::Result<()> {
    init_logging();
    let Some(node) = VmNode::get(SETUP).await? else {
        return Ok(());
    };
    let _alone = PRESSURE.write().await;
    let oom_pods = node.namespace(NS).await?;
    Box::pin(checks::a_container_past_its_limit_is_oom_killed(
        node, &oom_pods, TAG,
    ))
    .await?;
    let pods = node.namespace("vm-pressure").await?;
    let nodes: Api<Node> = Api::all(node.cp.admin_client().await?);
    node.create_pod(
        &pods,
        &checks::pod(
            "steady",
            "while :; do sleep 1; done",
            serde_json::json!({"limits": {"cpu": "100m", "memory": "32Mi"}}),
        )?,
    )
    .await?;
    checks::running(node, &pods, "steady").await?;
    // The hog fills a memory-backed emptyDir (pages charged to the pod that no reclaim can take back) as large
    // as the volume holds: 64 MiB short of the pods' cgroup limit (capacity less the reservations), so that the
    // kernel never has to OOM-kill in `kubepods.slice` however late the eviction manager looks, and past the hard
    // threshold (600 MiB available) by 152 MiB plus all the node uses besides the pods.
    let capacity = checks::memory_capacity(node).await?;
    let fill_mib = (capacity - RESERVED_MEMORY) / (1 << 20) - 64;
    let mut hog: Pod = checks::pod(
        "hog",
        "i=0; while dd if=/dev/zero of=/fill/$i bs=1M count=10 2>/dev/null; do i=$((i+1)); sleep 0.2; done; \
         while :; do sleep 1; done",
        serde_json::json!({}),
    )?;
    let spec = hog.spec.as_mut().context("spec")?;
    spec.volumes = Some(serde_json::from_value(serde_json::json!([
        {"name": "fill", "emptyDir": {"medium": "Memory", "sizeLimit": format!("{fill_mib}Mi")}}
    ]))?);
    spec.containers[0].volume_mounts = Some(serde_json::from_value(serde_json::json!([
        {"name": "fill", "mountPath": "/fill"}
    ]))?);
    let t0 = Instant::now();
    node.create_pod(&pods, &hog).await?;
    checks::running(node, &pods, "hog").await?;
    let evicted = wait_for("the hog evicted", Duration::from_secs(300), || async {
        let status = pods.get("hog").await?.status.context("status")?;
        Ok((status.phase.as_deref() == Some("Failed")).then_some(status))
    })
    .await;
    let evicted = match evicted {
        Ok(s) => s,
        Err(e) => return Err(e.context(format!("agent log:\n{}", node.agent_log_tail().await))),
    };
    println!(
        "[{TAG}] hog ({fill_mib} MiB emptyDir) Failed {:?} after its creation: {:?} {:?}",
        t0.elapsed(),
        evicted.reason,
        evicted.message.as_deref().unwrap_or_default()
    );
    let steady = pods.get("steady").await?.status.context("status")?;
    if steady.phase.as_deref() != Some("Running") {
        let oom = node
            .vm
            .sh(
                "dmesg | grep -i -E 'oom|killed process' | tail -n 20",
                Duration::from_secs(30),
            )
            .await
            .map(|o| o.stdout)
            .unwrap_or_default();
        panic!(
            "the Guaranteed pod stays Running: {steady:?}\nguest kernel:\n{oom}\nagent log:\n{}",
            node.agent_log_tail().await
        );
    }
    assert_eq!(evicted.reason.as_deref(), Some("Evicted"), "{evicted:?}");
    assert!(
        evicted.message.as_deref().unwrap_or_default().contains("memory"),
        "the eviction names the memory signal: {evicted:?}"
    );
    // the other tests' BestEffort pods are admitted again once the pressure is gone, and scheduled again once
    // the node lifecycle controller has taken its memory-pressure taint off
    wait_for(
        "MemoryPressure False and its taint gone",
        Duration::from_secs(180),
        || async {
            let tainted = nodes
                .get(NODE)
                .await?
                .spec
                .and_then(|s| s.taints)
                .unwrap_or_default()
                .iter()
                .any(|t| t.key == "node.kubernetes.io/memory-pressure");
            Ok((!memory_pressure(&nodes).await? && !tainted).then_some(()))
        },
    )
    .await?;
    Ok(())
}
