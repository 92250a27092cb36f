//! Node-pressure eviction on the real node: a BestEffort pod that fills a memory-backed emptyDir (real memory,
//! charged to its cgroup and reported by containerd's stats) pushes the node past its
//! `allocatableMemory.available` threshold (this node's configuration: at 96 % of allocatable, a 30 s
//! transition period; a node of its own, `real_node_eviction.rs`); the agent
//! reports MemoryPressure, evicts the hog (Failed / Evicted with the kubelet's message, an `Evicted` event),
//! gives its tmpfs back, keeps the Guaranteed pod running, and clears the condition after the transition period.
//!
//! The allocatable signal counts the pods' working sets only, so the test does not depend on what else the
//! machine is doing; the hog writes 6 % of the machine's memory against a threshold at 96 % of allocatable.

use std::time::Duration;

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::Api;
use kube::api::ListParams;

use super::harness::{NODE, NodeOptions, RealNode};

const NS: &str = "rn-eviction";

fn mem_total() -> anyhow::Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo")?;
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .context("MemTotal")?
        .parse()?;
    Ok(kb * 1024)
}

fn memory_pressure(n: &Node) -> Option<(String, String)> {
    let c = n
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "MemoryPressure")?;
    Some((c.status.clone(), c.reason.clone().unwrap_or_default()))
}

#[tokio::test]
async fn a_memory_hog_is_evicted_and_the_guaranteed_pod_keeps_running() -> anyhow::Result<()> {
    init_logging();
    let options = NodeOptions {
        extra_config: "evictionHard: {memory.available: 100Mi, nodefs.available: 2%, imagefs.available: 2%, \
                       allocatableMemory.available: 96%}\nevictionPressureTransitionPeriod: 30s\n"
            .into(),
        ..Default::default()
    };
    let Some(node) = RealNode::get_with(&options).await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let admin = node.cp.admin_client().await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    let n = nodes.get(NODE).await?;
    assert_eq!(
        memory_pressure(&n),
        Some(("False".into(), "KubeletHasSufficientMemory".into()))
    );

    let guaranteed: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "guaranteed"},
        "spec": {"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "app", "image": "localhost/busybox:local",
                                 "command": ["sleep", "3600"],
                                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                                               "limits": {"cpu": "100m", "memory": "64Mi"}}}]},
    }))?;
    node.create_pod(&pods, &guaranteed).await?;
    wait_for("guaranteed Running", Duration::from_secs(60), || async {
        let p = pods.get("guaranteed").await?;
        Ok((p.status.and_then(|s| s.phase).as_deref() == Some("Running")).then_some(()))
    })
    .await?;

    let fill_mib = mem_total()? * 6 / 100 / (1 << 20);
    println!("[eviction] the hog fills {fill_mib} MiB of tmpfs");
    let hog: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "hog"},
        "spec": {"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 30,
                 "volumes": [{"name": "fill", "emptyDir": {"medium": "Memory"}}],
                 "containers": [{"name": "hog", "image": "localhost/busybox:local",
                                 "command": ["sh", "-c",
                                     format!("dd if=/dev/zero of=/fill/blob bs=1M count={fill_mib} && sleep 3600")],
                                 "volumeMounts": [{"name": "fill", "mountPath": "/fill"}]}]},
    }))?;
    let hog = node.create_pod(&pods, &hog).await?;
    let uid = hog.metadata.uid.clone().unwrap_or_default();

    let evicted = wait_for("the hog evicted", Duration::from_secs(90), || async {
        let p = pods.get("hog").await?;
        Ok((p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")).then_some(p))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    let status = evicted.status.unwrap_or_default();
    assert_eq!(status.reason.as_deref(), Some("Evicted"));
    let message = status.message.unwrap_or_default();
    assert!(
        message.starts_with("The node was low on resource: memory. Threshold quantity: ")
            && message.contains("Container hog was using ")
            && message.ends_with("request is 0, has larger consumption of memory. "),
        "{message}"
    );
    let n = nodes.get(NODE).await?;
    assert_eq!(
        memory_pressure(&n),
        Some(("True".into(), "KubeletHasInsufficientMemory".into())),
        "the condition holds for the transition period"
    );
    let events: Api<Event> = Api::namespaced(admin.clone(), NS);
    let event = wait_for("the Evicted event", Duration::from_secs(30), || async {
        let list = events
            .list(&ListParams::default().fields("involvedObject.name=hog"))
            .await?;
        Ok(list
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("Evicted"))
            .and_then(|e| e.message))
    })
    .await?;
    assert_eq!(event, message);
    // the evicted pod's tmpfs is unmounted and removed although its object stays
    let volumes = node.agent_root.join("pods").join(&uid).join("volumes");
    wait_for("the hog's volumes released", Duration::from_secs(30), || async {
        Ok((!volumes.exists()).then_some(()))
    })
    .await?;
    let p = pods.get("guaranteed").await?;
    assert_eq!(p.status.and_then(|s| s.phase).as_deref(), Some("Running"));

    wait_for("MemoryPressure False again", Duration::from_secs(90), || async {
        let n = nodes.get(NODE).await?;
        Ok(
            (memory_pressure(&n) == Some(("False".into(), "KubeletHasSufficientMemory".into())))
                .then_some(()),
        )
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    let p = pods.get("guaranteed").await?;
    assert_eq!(p.status.and_then(|s| s.phase).as_deref(), Some("Running"));
    Ok(())
}
