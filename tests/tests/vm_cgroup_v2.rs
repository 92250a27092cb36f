//! A real node on cgroup v2 with the cgroupfs driver, in a Debian guest (see `vm_node/harness.rs`): pods of the
//! three QoS classes run in the kubelet's cgroups of the unified hierarchy with the kubelet's limits, the node's
//! `podPidsLimit` and the kubelet's OOM scores, as read from the guest's cgroup and proc files; `kubepods` is
//! limited to the node's allocatable; a container past its memory limit is OOM-killed and reported so; the
//! node's and pods' figures come from the v2 files. Needs root (or `NODE_AGENT_SKIP_REAL_NODE=1` to skip).

#[path = "vm_node/checks.rs"]
mod checks;
#[path = "vm_node/harness.rs"]
mod harness;

use e2e::init_logging;
use harness::{NodeSetup, VmNode};

const NS: &str = "vm-cgroups";
const TAG: &str = "vm_cgroup_v2";
const SETUP: NodeSetup = NodeSetup {
    systemd: false,
    config: "",
    huge_pages: 0,
};

#[tokio::test]
async fn qos_pods_run_in_the_kubelets_v2_cgroups_with_their_limits() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = VmNode::get(SETUP).await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    checks::qos_pods_run_in_their_cgroups(node, &pods, TAG).await
}

#[tokio::test]
async fn kubepods_is_limited_to_the_nodes_allocatable() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = VmNode::get(SETUP).await? else {
        return Ok(());
    };
    checks::pods_cgroup_is_limited_to_allocatable(node, TAG).await
}

#[tokio::test]
async fn a_container_past_its_memory_limit_is_oom_killed() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = VmNode::get(SETUP).await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    checks::a_container_past_its_limit_is_oom_killed(node, &pods, TAG).await
}
