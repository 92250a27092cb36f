//! A driver's registration: in the node's `CSINode` object and its Node's labels and annotation while it runs,
//! gone when its socket goes; a driver offering no CSI version the agent speaks is told why.

use std::time::{Duration, Instant};

use anyhow::Context;
use e2e::wait_for;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver};
use kube::Api;

use crate::driver::Driver;
use crate::harness::{NODE, RealNode};

/// The mock driver's topology key (its `TopologyKey`): one segment, the same on every node.
const TOPOLOGY_KEY: &str = "io.kubernetes.storage.mock/node";

const TOPOLOGY_VALUE: &str = "some-mock-node";

async fn csi_node_driver(node: &RealNode, name: &str) -> anyhow::Result<Option<CSINodeDriver>> {
    let api: Api<CSINode> = Api::all(node.cp.admin_client().await?);
    Ok(api
        .get_opt(NODE)
        .await?
        .and_then(|c| c.spec.drivers.into_iter().find(|d| d.name == name)))
}

fn node_ids(node: &Node) -> serde_json::Value {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("csi.volume.kubernetes.io/nodeid"))
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_csi_driver_registers_in_csinode_and_leaves_when_its_socket_goes() -> anyhow::Result<()> {
    e2e::init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let _agent = crate::AGENT.read().await;
    let admin = node.cp.admin_client().await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    let csi_nodes: Api<CSINode> = Api::all(admin);

    // the agent creates its CSINode at start, owned by its Node, before any driver registers
    let csi_node = wait_for("the node's CSINode object", Duration::from_secs(30), || async {
        Ok(csi_nodes.get_opt(NODE).await?)
    })
    .await?;
    let owner = &csi_node.metadata.owner_references.clone().unwrap_or_default();
    let uid = nodes.get(NODE).await?.metadata.uid;
    assert_eq!(
        owner
            .iter()
            .map(|o| (o.kind.as_str(), o.name.as_str(), Some(o.uid.clone())))
            .collect::<Vec<_>>(),
        [("Node", NODE, uid)]
    );

    let name = "csi-mock.node-agent.test";
    let t0 = Instant::now();
    let driver = Driver::start(node, name, &["--attach-limit", "7", "--enable-topology"]).await?;
    driver.logged("serving", Duration::from_secs(20)).await?;
    assert_eq!(
        driver.logged("registration: ", Duration::from_secs(20)).await?,
        "registration: GetInfo"
    );
    assert_eq!(
        driver.logged("registration: ok", Duration::from_secs(20)).await?,
        "registration: ok"
    );
    let entry = wait_for("the driver in CSINode", Duration::from_secs(20), || {
        csi_node_driver(node, name)
    })
    .await?;
    println!(
        "[real_node_csi] driver registered and in CSINode {:?} after its start",
        t0.elapsed()
    );
    // the mock answers NodeGetInfo with its own name as node ID, the limit and topology it was given
    assert_eq!(entry.node_id, name);
    assert_eq!(entry.topology_keys, Some(vec![TOPOLOGY_KEY.to_owned()]));
    assert_eq!(entry.allocatable.and_then(|a| a.count), Some(7));
    let n = nodes.get(NODE).await?;
    assert_eq!(
        n.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(TOPOLOGY_KEY))
            .map(String::as_str),
        Some(TOPOLOGY_VALUE),
        "the driver's topology segment is a Node label"
    );
    // the other tests' drivers may be registered beside it
    assert_eq!(node_ids(&n)[name], name);

    // the driver stops and removes its registration socket: the agent removes it from CSINode and the Node's
    // node IDs; the topology label stays, as the kubelet leaves it
    let t1 = Instant::now();
    driver.proc.stop(Duration::from_secs(10)).await?;
    wait_for(
        "the driver gone from CSINode",
        Duration::from_secs(20),
        || async { Ok(csi_node_driver(node, name).await?.is_none().then_some(())) },
    )
    .await?;
    println!(
        "[real_node_csi] driver gone from CSINode {:?} after it stopped",
        t1.elapsed()
    );
    // the Node's annotation is a write of its own, after the CSINode's
    wait_for(
        "the driver's node ID gone from the Node's annotation",
        Duration::from_secs(20),
        || async {
            let n = nodes.get(NODE).await?;
            Ok(node_ids(&n).get(name).is_none().then_some(()))
        },
    )
    .await?;
    assert!(
        csi_nodes.get_opt(NODE).await?.is_some(),
        "the CSINode object stays, with no drivers"
    );
    Ok(())
}

#[tokio::test]
async fn a_driver_offering_no_supported_csi_version_is_told_why() -> anyhow::Result<()> {
    e2e::init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let _agent = crate::AGENT.read().await;
    let name = "csi-future.node-agent.test";
    let driver = Driver::start(node, name, &["--supported-version", "2.0.0"]).await?;
    let line = driver
        .logged("registration: failed", Duration::from_secs(30))
        .await?;
    let endpoint = node
        .agent_root
        .parent()
        .context("the node's directory")?
        .join(format!("csi-{name}/csi.sock"));
    assert_eq!(
        line,
        format!(
            "registration: failed: plugin validation failed with err: validation failed for CSI Driver {name} at \
             endpoint {}: CSI driver \"{name}\": none of the versions specified [\"2.0.0\"] are supported",
            endpoint.display()
        )
    );
    assert_eq!(csi_node_driver(node, name).await?, None);
    driver.proc.stop(Duration::from_secs(10)).await?;
    Ok(())
}
