//! The CSI node side on a real node: a real CSI driver — the Kubernetes e2e suite's mock driver from the pinned
//! `k8s.io/kubernetes` module, built by `hack/build-csi-mock-driver.sh` with a minimal registrar of its own
//! (`tests/csi-mock-driver`: node-driver-registrar is not to be had from the Go module proxy) — registers through
//! the agent's `plugins_registry`, and the agent publishes it in the node's `CSINode` object and Node labels as
//! the kubelet does. A binary of its own, with its own node, so its drivers never meet the other real-node tests.
//! Needs root (or `NODE_AGENT_SKIP_REAL_NODE=1` to skip).

/// The containerd the node runs on.
const CONTAINERD: &str = "1.6";

#[allow(dead_code)]
#[path = "real_node/harness.rs"]
mod harness;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use e2e::wait_for;
use harness::{NODE, RealNode};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver};
use kube::Api;

/// The mock driver's topology key (its `TopologyKey`): one segment, the same on every node.
const TOPOLOGY_KEY: &str = "io.kubernetes.storage.mock/node";
const TOPOLOGY_VALUE: &str = "some-mock-node";

/// The mock driver (`hack/build-csi-mock-driver.sh` builds it on first use and caches it).
async fn driver_binary() -> anyhow::Result<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/build-csi-mock-driver.sh");
    let built = tokio::task::spawn_blocking(move || std::process::Command::new("bash").arg(script).output())
        .await??;
    anyhow::ensure!(
        built.status.success(),
        "building the CSI mock driver: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    Ok(PathBuf::from(String::from_utf8(built.stdout)?.trim()))
}

/// A running mock driver and its log.
struct Driver {
    proc: testenv::process::Proc,
    log: PathBuf,
}

impl Driver {
    /// Starts the driver `name` on a socket of its own, registering in `node`'s `plugins_registry`.
    async fn start(node: &RealNode, name: &str, extra: &[&str]) -> anyhow::Result<Self> {
        let bin = driver_binary().await?;
        let dir = node
            .agent_root
            .parent()
            .context("the node's directory")?
            .join(format!("csi-{name}"));
        std::fs::create_dir_all(&dir)?;
        let log = dir.join("driver.log");
        let _ = std::fs::remove_file(&log);
        let mut args = vec![
            "--name".to_owned(),
            name.to_owned(),
            "--csi-endpoint".to_owned(),
            dir.join("csi.sock").display().to_string(),
            "--registration-dir".to_owned(),
            node.agent_root.join("plugins_registry").display().to_string(),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let proc = testenv::process::Proc::start(name, &bin, &args, &log)?;
        Ok(Self { proc, log })
    }

    /// Waits until the driver's log has a line starting with `prefix`; returns that line.
    async fn logged(&self, prefix: &str, timeout: Duration) -> anyhow::Result<String> {
        wait_for(&format!("the driver to log {prefix:?}"), timeout, || async {
            Ok(std::fs::read_to_string(&self.log)
                .unwrap_or_default()
                .lines()
                .find(|l| l.starts_with(prefix))
                .map(str::to_owned))
        })
        .await
        .with_context(|| format!("driver log:\n{}", testenv::process::log_tail(&self.log, 20)))
    }
}

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
    assert_eq!(node_ids(&n), serde_json::json!({name: name}));

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
    let n = nodes.get(NODE).await?;
    assert_eq!(node_ids(&n), serde_json::Value::Null);
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
