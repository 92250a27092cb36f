//! Device plugins on a real node: the upstream sample device plugin (`test/images/sample-device-plugin` of the
//! pinned `k8s.io/kubernetes` module, built by `hack/build-sample-device-plugin.sh`) registers on the agent's
//! `<root-dir>/device-plugins/kubelet.sock` with `example.com/resource` and two devices. The node reports them in
//! its capacity and allocatable; the real scheduler places a pod asking for one, which runs on containerd with
//! the plugin's mount (`/tmp/Dev-N`) inside its container; a pod sent to the node asking for three is refused
//! with the kubelet's reason; the pod-resources API lists the pod's device; node-agent stopped and started again
//! keeps the pod's device (checkpoint), and the next pod gets the other one; pods deleted while node-agent is
//! down leave their devices free for the next pod once it runs again.
//!
//! The plugin registers at the path the kubelet uses (`/var/lib/kubelet/device-plugins/kubelet.sock`, fixed in
//! it): it runs in a mount namespace of its own where the agent's device-plugins directory is bind-mounted there,
//! over a private tmpfs on `/var/lib`, so nothing of the machine's `/var/lib` is touched. A binary of its own (its
//! own node). Needs root (or `NODE_AGENT_SKIP_REAL_NODE=1` to skip).

/// The containerd the node runs on.
const CONTAINERD: &str = "1.6";

#[allow(dead_code)]
#[path = "real_node/harness.rs"]
mod harness;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use e2e::wait_for;
use harness::{NODE, RealNode};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::LogParams;
use node_agent::pod_resources;

const RESOURCE: &str = "example.com/resource";
const NS: &str = "rn-devices";

/// Starts the sample device plugin for `node` (see the module docs for its mount namespace).
async fn start_plugin(node: &RealNode) -> anyhow::Result<(testenv::process::Proc, PathBuf)> {
    let bin = e2e::hack_binary("build-sample-device-plugin.sh", "the sample device plugin").await?;
    let dir = node.agent_root.join("device-plugins");
    std::fs::create_dir_all(&dir)?;
    let log = node
        .agent_root
        .parent()
        .context("the node's directory")?
        .join("sample-device-plugin.log");
    let script = format!(
        "set -e; mount -t tmpfs tmpfs /var/lib; mkdir -p /var/lib/kubelet/device-plugins; \
         mount --bind '{dir}' /var/lib/kubelet/device-plugins; \
         exec env PLUGIN_SOCK_DIR=/var/lib/kubelet/device-plugins '{bin}'",
        dir = dir.display(),
        bin = bin.display()
    );
    let args = ["--mount", "--propagation", "private", "sh", "-c", &script].map(str::to_owned);
    let proc = testenv::process::Proc::start("sample-device-plugin", Path::new("unshare"), &args, &log)?;
    Ok((proc, log))
}

/// The node's (capacity, allocatable) of [`RESOURCE`].
async fn node_counts(node: &RealNode) -> anyhow::Result<(Option<String>, Option<String>)> {
    let n = Api::<Node>::all(node.cp.admin_client().await?).get(NODE).await?;
    let status = n.status.unwrap_or_default();
    let get = |m: Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| { m.and_then(|m| m.get(RESOURCE).map(|q| q.0.clone())) };
    Ok((get(status.capacity), get(status.allocatable)))
}

fn pod(name: &str, count: u32, node_name: Option<&str>) -> anyhow::Result<Pod> {
    let mut spec = serde_json::json!({
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 1,
        "containers": [{
            "name": "main",
            "image": "localhost/busybox:local",
            // the plugin's mount: /tmp/Dev-N
            "command": ["sh", "-c", "ls /tmp | grep Dev- ; trap 'exit 0' TERM; while :; do sleep 1 & wait $!; done"],
            "resources": {"limits": {RESOURCE: count.to_string()}},
        }],
    });
    if let Some(n) = node_name {
        spec["nodeName"] = n.into();
    }
    Ok(serde_json::from_value(
        serde_json::json!({"metadata": {"name": name}, "spec": spec}),
    )?)
}

async fn running(node: &RealNode, pods: &Api<Pod>, name: &str) -> anyhow::Result<Pod> {
    wait_for(
        &format!("pod {name} Running"),
        Duration::from_secs(120),
        || async {
            let p = pods.get(name).await?;
            Ok((p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).then_some(p))
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))
}

/// The device the container shows (its log's `Dev-N` line).
async fn device_seen(pods: &Api<Pod>, name: &str) -> anyhow::Result<String> {
    wait_for(
        &format!("pod {name} to list its device"),
        Duration::from_secs(60),
        || async {
            let log = pods.logs(name, &LogParams::default()).await?;
            Ok(log.lines().find(|l| l.starts_with("Dev-")).map(str::to_owned))
        },
    )
    .await
}

/// The devices pod-resources lists for pod `name`'s container.
async fn listed_devices(node: &RealNode, name: &str) -> anyhow::Result<Vec<String>> {
    let mut client = pod_resources::connect(pod_resources::socket_path(&node.agent_root)).await?;
    let list = client
        .list(pod_resources::v1::ListPodResourcesRequest {})
        .await?
        .into_inner();
    let pod = list
        .pod_resources
        .iter()
        .find(|p| p.namespace == NS && p.name == name)
        .with_context(|| format!("pod {name} not listed: {list:?}"))?;
    Ok(pod
        .containers
        .iter()
        .flat_map(|c| &c.devices)
        .filter(|d| d.resource_name == RESOURCE)
        .flat_map(|d| d.device_ids.clone())
        .collect())
}

/// The healthy devices of [`RESOURCE`] pod-resources reports allocatable, sorted.
async fn allocatable_devices(node: &RealNode) -> anyhow::Result<Vec<String>> {
    let mut client = pod_resources::connect(pod_resources::socket_path(&node.agent_root)).await?;
    let allocatable = client
        .get_allocatable_resources(pod_resources::v1::AllocatableResourcesRequest {})
        .await?
        .into_inner();
    let mut ids: Vec<String> = allocatable
        .devices
        .iter()
        .filter(|d| d.resource_name == RESOURCE)
        .flat_map(|d| d.device_ids.clone())
        .collect();
    ids.sort();
    Ok(ids)
}

/// The tails of the plugin's log and the agent's, for a wait that failed.
fn logs(node: &RealNode, plugin_log: &Path) -> String {
    format!(
        "plugin log:\n{}\nagent log:\n{}",
        testenv::process::log_tail(plugin_log, 20),
        node.agent_log_tail()
    )
}

/// Waits for the plugin to have registered with the agent started again: the agent's own answer, both devices
/// allocatable (the Node still shows what the agent before it reported).
async fn registered_again(node: &RealNode, plugin_log: &Path) -> anyhow::Result<()> {
    wait_for(
        "the plugin registered again",
        Duration::from_secs(120),
        || async {
            Ok(allocatable_devices(node)
                .await
                .is_ok_and(|ids| ids == ["Dev-1", "Dev-2"])
                .then_some(()))
        },
    )
    .await
    .with_context(|| logs(node, plugin_log))
}

#[tokio::test]
async fn the_sample_device_plugin_gives_its_devices_to_pods_across_a_restart() -> anyhow::Result<()> {
    e2e::init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let (_plugin, plugin_log) = start_plugin(node).await?;
    let started = std::time::Instant::now();
    wait_for(
        "the node to report the plugin's devices",
        Duration::from_secs(90),
        || async {
            let counts = node_counts(node).await?;
            Ok((counts == (Some("2".into()), Some("2".into()))).then_some(()))
        },
    )
    .await
    .with_context(|| logs(node, &plugin_log))?;
    eprintln!(
        "devices in the node's status {:?} after the plugin started",
        started.elapsed()
    );

    let pods = node.namespace(NS).await?;
    // scheduled by the real scheduler onto the node's devices
    node.create_pod(&pods, &pod("one", 1, None)?).await?;
    running(node, &pods, "one").await?;
    let seen = device_seen(&pods, "one").await?;
    assert!(seen == "Dev-1" || seen == "Dev-2", "{seen}");
    assert_eq!(listed_devices(node, "one").await?, vec![seen.clone()]);
    assert_eq!(allocatable_devices(node).await?, ["Dev-1", "Dev-2"]);

    // sent to the node directly (the scheduler would hold it Pending): refused as the kubelet refuses it
    node.create_pod(&pods, &pod("three", 3, Some(NODE))?).await?;
    let refused = wait_for("pod three refused", Duration::from_secs(60), || async {
        let p = pods.get("three").await?;
        let s = p.status.unwrap_or_default();
        Ok((s.phase.as_deref() == Some("Failed")).then_some(s))
    })
    .await?;
    assert_eq!(refused.reason.as_deref(), Some("UnexpectedAdmissionError"));
    assert_eq!(
        refused.message.as_deref(),
        Some(
            "Pod was rejected: Allocate failed due to requested number of devices unavailable for \
             example.com/resource. Requested: 3, Available: 1, which is unexpected"
        )
    );

    // node-agent stopped and started again: the pod keeps its device, the next pod gets the other one
    assert!(
        node.agent_root
            .join("device-plugins/kubelet_internal_checkpoint")
            .exists()
    );
    node.restart_agent(false).await?;
    registered_again(node, &plugin_log).await?;
    let after = running(node, &pods, "one").await?;
    let restarts = after
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.first().map(|c| c.restart_count));
    assert_eq!(
        restarts,
        Some(0),
        "the pod's container ran on through the restart"
    );
    assert_eq!(listed_devices(node, "one").await?, vec![seen.clone()]);
    node.create_pod(&pods, &pod("two", 1, None)?).await?;
    running(node, &pods, "two").await?;
    let other = device_seen(&pods, "two").await?;
    assert_ne!(
        other, seen,
        "the restarted agent gave the second pod the device the first does not hold"
    );
    assert_eq!(listed_devices(node, "two").await?, vec![other]);

    // both pods deleted (forced) while node-agent is down: the checkpoint still gives them the devices; the
    // agent started again frees them, so a pod asking for both is admitted and given them
    node.stop_agent(Duration::from_secs(20)).await?;
    let now = kube::api::DeleteParams {
        grace_period_seconds: Some(0),
        ..kube::api::DeleteParams::default()
    };
    for name in ["one", "two"] {
        pods.delete(name, &now).await?;
    }
    wait_for("the pods gone from the API", Duration::from_secs(30), || async {
        Ok((pods.get_opt("one").await?.is_none() && pods.get_opt("two").await?.is_none()).then_some(()))
    })
    .await?;
    node.start_agent()?;
    let restarted = std::time::Instant::now();
    registered_again(node, &plugin_log).await?;
    node.create_pod(&pods, &pod("both", 2, Some(NODE))?).await?;
    let both = wait_for(
        "pod both Running or refused",
        Duration::from_secs(120),
        || async {
            let s = pods.get("both").await?.status.unwrap_or_default();
            Ok(matches!(s.phase.as_deref(), Some("Running" | "Failed")).then_some(s))
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    assert_eq!(
        both.phase.as_deref(),
        Some("Running"),
        "the devices of the deleted pods were not freed: {:?}",
        both.message
    );
    eprintln!(
        "a pod given the devices of pods deleted while the agent was down {:?} after its start",
        restarted.elapsed()
    );
    let mut given = listed_devices(node, "both").await?;
    given.sort();
    assert_eq!(given, ["Dev-1", "Dev-2"]);
    Ok(())
}
