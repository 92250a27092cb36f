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

/// The driver's CSI calls of `method` (its log lines "csi: /csi.v1.Node/<method> <request> -> <outcome>").
fn calls(driver: &Driver, method: &str) -> Vec<String> {
    let needle = format!("csi: /csi.v1.Node/{method} ");
    std::fs::read_to_string(&driver.log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix(&needle).map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn a_csi_persistent_volume_is_staged_published_used_and_torn_down() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
    use k8s_openapi::api::storage::v1::CSIDriver;
    use kube::api::{DeleteParams, PostParams};

    e2e::init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let name = "csi-mock-vol.node-agent.test";
    // the mock driver without ControllerPublish, and a CSIDriver saying so: no VolumeAttachment to wait for
    let driver = Driver::start(node, name, &["--disable-attach"]).await?;
    driver.logged("registration: ok", Duration::from_secs(30)).await?;
    let admin = node.cp.admin_client().await?;
    let csi_drivers: Api<CSIDriver> = Api::all(admin.clone());
    let object: CSIDriver = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"attachRequired": false, "podInfoOnMount": false},
    }))?;
    if csi_drivers.get_opt(name).await?.is_none() {
        csi_drivers.create(&PostParams::default(), &object).await?;
    }
    // the mock driver's volume "2" as a PersistentVolume, bound to a claim by name
    let pv_name = "csi-mock-volume-2";
    let pvs: Api<PersistentVolume> = Api::all(admin.clone());
    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "csi": {"driver": name, "volumeHandle": "2", "volumeAttributes": {"purpose": "test"}},
        },
    }))?;
    if pvs.get_opt(pv_name).await?.is_none() {
        pvs.create(&PostParams::default(), &pv).await?;
    }
    let pods = node.namespace("csi-volume").await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), "csi-volume");
    let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv_name,
                 "resources": {"requests": {"storage": "1Gi"}}},
    }))?;
    claims.create(&PostParams::default(), &claim).await?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "writer"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:local",
                "command": ["sh", "-c", "echo written-by-the-pod > /data/file && cat /data/file && sleep 3600"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        },
    }))?;
    let t0 = Instant::now();
    let created = node.create_pod(&pods, &pod).await?;
    let uid = created.metadata.uid.clone().context("uid")?;
    wait_for("the pod Running", Duration::from_secs(90), || async {
        let p = pods.get("writer").await?;
        Ok((p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).then_some(()))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    println!(
        "[real_node_csi] CSI volume pod Running {:?} after its creation",
        t0.elapsed()
    );

    // staged at the kubelet's global mount path, published into the pod's volume directory
    let root = &node.agent_root;
    let staging = root
        .join("plugins/kubernetes.io/csi")
        .join(name)
        // sha256("2")
        .join("d4735e3a265e16eee03f59718b9b5d03019c07d8b6c51f90da3a666eec13ab35")
        .join("globalmount");
    let target = root
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~csi")
        .join(pv_name)
        .join("mount");
    let staged = calls(&driver, "NodeStageVolume");
    assert_eq!(staged.len(), 1, "{staged:?}");
    assert!(
        staged[0].contains(&format!("\"staging_target_path\":\"{}\"", staging.display())),
        "{}",
        staged[0]
    );
    assert!(staged[0].ends_with("-> ok"), "{}", staged[0]);
    let published = calls(&driver, "NodePublishVolume");
    assert_eq!(published.len(), 1, "{published:?}");
    assert!(
        published[0].contains(&format!("\"target_path\":\"{}\"", target.display())),
        "{}",
        published[0]
    );
    assert!(
        published[0].contains("\"purpose\":\"test\""),
        "the volume context: {}",
        published[0]
    );
    let vol_data: serde_json::Value = serde_json::from_slice(&std::fs::read(
        target.parent().context("parent")?.join("vol_data.json"),
    )?)?;
    assert_eq!(vol_data["driverName"], name);
    assert_eq!(vol_data["volumeHandle"], "2");
    assert_eq!(vol_data["specVolID"], pv_name);
    // what the pod wrote is in the published directory (the mock driver publishes a plain directory)
    let written = wait_for("the pod's file", Duration::from_secs(30), || async {
        Ok(std::fs::read_to_string(target.join("file")).ok())
    })
    .await?;
    assert_eq!(written, "written-by-the-pod\n");

    // the pod goes: unpublished, then unstaged (no other pod uses the volume), directories removed
    let t1 = Instant::now();
    pods.delete("writer", &DeleteParams::default()).await?;
    wait_for("the volume unstaged", Duration::from_secs(60), || async {
        Ok(calls(&driver, "NodeUnstageVolume").first().cloned())
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    println!(
        "[real_node_csi] CSI volume unpublished and unstaged {:?} after the pod's deletion",
        t1.elapsed()
    );
    let unpublished = calls(&driver, "NodeUnpublishVolume");
    assert_eq!(unpublished.len(), 1, "{unpublished:?}");
    assert!(unpublished[0].contains(&format!("\"target_path\":\"{}\"", target.display())));
    assert!(
        calls(&driver, "NodeUnstageVolume")[0]
            .contains(&format!("\"staging_target_path\":\"{}\"", staging.display()))
    );
    // the driver logs each call when it is made; the agent removes the directories once the calls have returned
    let volume_dir = target.parent().context("parent")?.to_path_buf();
    wait_for(
        "the pod's CSI volume directory and the global mount directory removed",
        Duration::from_secs(30),
        || async { Ok((!volume_dir.exists() && !staging.exists()).then_some(())) },
    )
    .await?;
    driver.proc.stop(Duration::from_secs(10)).await?;
    Ok(())
}

/// The external attacher (`hack/build-external-attacher.sh` builds it on first use and caches it).
async fn attacher_binary() -> anyhow::Result<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/build-external-attacher.sh");
    let built = tokio::task::spawn_blocking(move || std::process::Command::new("bash").arg(script).output())
        .await??;
    anyhow::ensure!(
        built.status.success(),
        "building the external attacher: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    Ok(PathBuf::from(String::from_utf8(built.stdout)?.trim()))
}

/// The driver's CSI calls of the Controller service's `method`.
fn controller_calls(driver: &Driver, method: &str) -> Vec<String> {
    let needle = format!("csi: /csi.v1.Controller/{method} ");
    std::fs::read_to_string(&driver.log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix(&needle).map(str::to_owned))
        .collect()
}

/// The Node's `volumesInUse` and the names in its `volumesAttached`.
async fn node_volumes(node: &RealNode) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let nodes: Api<Node> = Api::all(node.cp.admin_client().await?);
    let status = nodes.get(NODE).await?.status.unwrap_or_default();
    Ok((
        status.volumes_in_use.unwrap_or_default(),
        status
            .volumes_attached
            .unwrap_or_default()
            .into_iter()
            .map(|a| a.name)
            .collect(),
    ))
}

#[tokio::test]
async fn an_attachable_csi_volume_waits_for_the_real_attacher_and_is_detached_after_the_pod()
-> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim, Pod};
    use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
    use kube::api::{DeleteParams, ListParams, PostParams};

    e2e::init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let name = "csi-mock-attach.node-agent.test";
    // the mock driver with its controller service's ControllerPublish, and the real external attacher beside it
    let driver = Driver::start(node, name, &[]).await?;
    driver.logged("registration: ok", Duration::from_secs(30)).await?;
    let attacher_log = driver.log.with_file_name("attacher.log");
    let attacher = testenv::process::Proc::start(
        "csi-attacher",
        &attacher_binary().await?,
        &[
            format!(
                "--csi-address={}",
                driver.log.with_file_name("csi.sock").display()
            ),
            format!("--kubeconfig={}", node.cp.admin_kubeconfig().display()),
            "--leader-election=false".to_owned(),
            "--timeout=30s".to_owned(),
            "--v=4".to_owned(),
        ],
        &attacher_log,
    )?;
    let admin = node.cp.admin_client().await?;
    let csi_drivers: Api<CSIDriver> = Api::all(admin.clone());
    let object: CSIDriver = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"attachRequired": true, "podInfoOnMount": false},
    }))?;
    if csi_drivers.get_opt(name).await?.is_none() {
        csi_drivers.create(&PostParams::default(), &object).await?;
    }
    let pv_name = "csi-mock-attach-volume-1";
    let pvs: Api<PersistentVolume> = Api::all(admin.clone());
    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "csi": {"driver": name, "volumeHandle": "1"},
        },
    }))?;
    if pvs.get_opt(pv_name).await?.is_none() {
        pvs.create(&PostParams::default(), &pv).await?;
    }
    let ns = "csi-attach";
    let pods = node.namespace(ns).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), ns);
    let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv_name,
                 "resources": {"requests": {"storage": "1Gi"}}},
    }))?;
    claims.create(&PostParams::default(), &claim).await?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "attached"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:local",
                "command": ["sh", "-c", "echo on-an-attached-volume > /data/file && sleep 3600"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        },
    }))?;
    let unique = format!("kubernetes.io/csi/{name}^1");
    let t0 = Instant::now();
    node.create_pod(&pods, &pod).await?;
    wait_for("the pod Running", Duration::from_secs(120), || async {
        let p = pods.get("attached").await?;
        Ok((p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).then_some(()))
    })
    .await
    .with_context(|| {
        format!(
            "agent log:\n{}\nattacher log:\n{}",
            node.agent_log_tail(),
            testenv::process::log_tail(&attacher_log, 20)
        )
    })?;
    println!(
        "[real_node_csi] attachable CSI volume pod Running {:?} after its creation",
        t0.elapsed()
    );

    // the attach/detach controller made the VolumeAttachment, the real attacher attached it through the driver's
    // ControllerPublishVolume, and the node staged with the publish context the attachment carries
    let attachments: Api<VolumeAttachment> = Api::all(admin.clone());
    let va = attachments
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .find(|va| va.spec.source.persistent_volume_name.as_deref() == Some(pv_name))
        .context("the VolumeAttachment of the volume")?;
    let attachment_name = va.metadata.name.clone().context("name")?;
    assert_eq!(va.spec.attacher, name);
    assert_eq!(va.spec.node_name, NODE);
    let status = va.status.context("the VolumeAttachment's status")?;
    assert!(status.attached);
    let metadata = status.attachment_metadata.unwrap_or_default();
    assert_eq!(metadata.get("device").map(String::as_str), Some("/dev/mock"));
    let published = controller_calls(&driver, "ControllerPublishVolume");
    assert!(
        published
            .iter()
            .any(|c| c.contains(&format!("\"node_id\":\"{name}\"")) && c.ends_with("-> ok")),
        "{published:?}"
    );
    let staged = calls(&driver, "NodeStageVolume");
    assert_eq!(staged.len(), 1, "{staged:?}");
    assert!(
        staged[0].contains("\"device\":\"/dev/mock\""),
        "the publish context: {}",
        staged[0]
    );
    assert!(staged[0].ends_with("-> ok"), "{}", staged[0]);
    let vol_data: serde_json::Value = serde_json::from_slice(&std::fs::read(
        node.agent_root
            .join("pods")
            .join(pods.get("attached").await?.metadata.uid.context("uid")?)
            .join("volumes/kubernetes.io~csi")
            .join(pv_name)
            .join("vol_data.json"),
    )?)?;
    assert_eq!(vol_data["attachmentID"], attachment_name.as_str());
    // the node reports the volume in use; the controller reports it attached
    let (in_use, attached) = node_volumes(node).await?;
    assert!(in_use.contains(&unique), "volumesInUse {in_use:?}");
    assert!(attached.contains(&unique), "volumesAttached {attached:?}");
    // the controller's event on the pod
    let events: Api<Event> = Api::namespaced(admin.clone(), ns);
    let attach_event = wait_for(
        "the SuccessfulAttachVolume event",
        Duration::from_secs(30),
        || async {
            Ok(events
                .list(&ListParams::default().fields("involvedObject.name=attached"))
                .await?
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("SuccessfulAttachVolume")))
        },
    )
    .await?;
    assert_eq!(
        attach_event.message.as_deref(),
        Some(format!("AttachVolume.Attach succeeded for volume \"{pv_name}\" ").as_str())
    );

    // the pod goes: unpublished and unstaged, no longer in use, then detached by the controller and the attacher
    let t1 = Instant::now();
    pods.delete("attached", &DeleteParams::default()).await?;
    wait_for("the volume no longer in use", Duration::from_secs(60), || async {
        Ok((!node_volumes(node).await?.0.contains(&unique)).then_some(()))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    let not_in_use = t1.elapsed();
    assert_eq!(calls(&driver, "NodeUnstageVolume").len(), 1);
    wait_for("the VolumeAttachment gone", Duration::from_secs(120), || async {
        Ok(attachments
            .get_opt(&attachment_name)
            .await?
            .is_none()
            .then_some(()))
    })
    .await
    .with_context(|| format!("attacher log:\n{}", testenv::process::log_tail(&attacher_log, 20)))?;
    wait_for(
        "the volume gone from volumesAttached",
        Duration::from_secs(60),
        || async { Ok((!node_volumes(node).await?.1.contains(&unique)).then_some(())) },
    )
    .await?;
    println!(
        "[real_node_csi] after the pod's deletion: volume not in use {not_in_use:?}, detached {:?}",
        t1.elapsed()
    );
    let unpublished = controller_calls(&driver, "ControllerUnpublishVolume");
    assert!(
        unpublished.iter().any(|c| c.ends_with("-> ok")),
        "{unpublished:?}"
    );
    attacher.stop(Duration::from_secs(10)).await?;
    driver.proc.stop(Duration::from_secs(10)).await?;
    Ok(())
}

#[tokio::test]
async fn an_inline_csi_volume_with_fs_group_and_volume_stats() -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt as _;

    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
    use k8s_openapi::api::storage::v1::CSIDriver;
    use kube::api::{DeleteParams, PostParams};

    e2e::init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let name = "csi-mock-inline.node-agent.test";
    let driver = Driver::start(node, name, &["--disable-attach"]).await?;
    driver.logged("registration: ok", Duration::from_secs(30)).await?;
    let admin = node.cp.admin_client().await?;
    let csi_drivers: Api<CSIDriver> = Api::all(admin.clone());
    // inline volumes allowed, the pod's details on mount, and the pod's fsGroup for every volume
    let object: CSIDriver = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"attachRequired": false, "podInfoOnMount": true, "fsGroupPolicy": "File",
                 "volumeLifecycleModes": ["Persistent", "Ephemeral"]},
    }))?;
    if csi_drivers.get_opt(name).await?.is_none() {
        csi_drivers.create(&PostParams::default(), &object).await?;
    }
    let pv_name = "csi-mock-inline-volume-3";
    let pvs: Api<PersistentVolume> = Api::all(admin.clone());
    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "csi": {"driver": name, "volumeHandle": "3"},
        },
    }))?;
    if pvs.get_opt(pv_name).await?.is_none() {
        pvs.create(&PostParams::default(), &pv).await?;
    }
    let ns = "csi-inline";
    let pods = node.namespace(ns).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), ns);
    let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv_name,
                 "resources": {"requests": {"storage": "1Gi"}}},
    }))?;
    claims.create(&PostParams::default(), &claim).await?;
    // a user that is not root writes to both volumes: only the fsGroup lets it
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "inline"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsUser": 1000, "fsGroup": 4321},
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:local",
                "command": ["sh", "-c", "echo scratch > /scratch/file && echo data > /data/file && sleep 3600"],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"},
                                 {"name": "data", "mountPath": "/data"}],
            }],
            "volumes": [
                {"name": "scratch", "csi": {"driver": name, "volumeAttributes": {"size": "small"}}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
            ],
        },
    }))?;
    let t0 = Instant::now();
    let created = node.create_pod(&pods, &pod).await?;
    let uid = created.metadata.uid.clone().context("uid")?;
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(admin.clone(), ns);
    let running = wait_for("the pod Running", Duration::from_secs(90), || async {
        let p = pods.get("inline").await?;
        Ok((p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).then_some(()))
    })
    .await;
    if let Err(e) = running {
        let seen: Vec<String> = events
            .list(&kube::api::ListParams::default())
            .await?
            .items
            .into_iter()
            .map(|e| format!("{:?}: {:?}", e.reason, e.message))
            .collect();
        anyhow::bail!(
            "{e:#}\nevents: {seen:#?}\ndriver log:\n{}",
            testenv::process::log_tail(&driver.log, 20)
        );
    }
    println!(
        "[real_node_csi] inline CSI volume pod Running {:?} after its creation",
        t0.elapsed()
    );
    let volumes = node
        .agent_root
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~csi");
    let scratch = volumes.join("scratch/mount");
    // the inline volume: published, never staged, under the kubelet's handle, with the pod's details
    let published = calls(&driver, "NodePublishVolume");
    let inline = published
        .iter()
        .find(|c| c.contains(&format!("\"target_path\":\"{}\"", scratch.display())))
        .with_context(|| format!("{published:?}"))?;
    for part in [
        "\"size\":\"small\"".to_owned(),
        "\"csi.storage.k8s.io/ephemeral\":\"true\"".to_owned(),
        "\"csi.storage.k8s.io/pod.name\":\"inline\"".to_owned(),
        format!("\"csi.storage.k8s.io/pod.uid\":\"{uid}\""),
        format!("\"csi.storage.k8s.io/pod.namespace\":\"{ns}\""),
    ] {
        assert!(inline.contains(&part), "{part} in {inline}");
    }
    assert!(inline.ends_with("-> ok"), "{inline}");
    let vol_data: serde_json::Value =
        serde_json::from_slice(&std::fs::read(volumes.join("scratch/vol_data.json"))?)?;
    assert_eq!(vol_data["volumeLifecycleMode"], "Ephemeral");
    let handle = vol_data["volumeHandle"].as_str().context("handle")?.to_owned();
    assert!(handle.starts_with("csi-") && handle.len() == 68, "{handle}");
    assert!(
        inline.contains(&format!("\"volume_id\":\"{handle}\"")),
        "{inline}"
    );
    let staged = calls(&driver, "NodeStageVolume");
    assert_eq!(
        staged.len(),
        1,
        "only the persistent volume is staged: {staged:?}"
    );
    // the pod's fsGroup on both published directories; the user wrote to both
    for dir in [scratch.clone(), volumes.join(pv_name).join("mount")] {
        let written = wait_for("the pod's file", Duration::from_secs(30), || async {
            Ok(std::fs::metadata(dir.join("file")).ok())
        })
        .await;
        let written = match written {
            Ok(w) => w,
            Err(e) => {
                let logs = node
                    .kubelet_get(&format!("/containerLogs/{ns}/inline/main"))
                    .await?;
                let meta = std::fs::metadata(&dir).map(|m| (m.uid(), m.gid(), format!("{:o}", m.mode())));
                let status = pods.get("inline").await?.status;
                anyhow::bail!(
                    "{e:#} in {}: {meta:?}\ncontainer log: {logs:?}\nstatus: {status:?}",
                    dir.display()
                );
            }
        };
        assert_eq!(std::fs::metadata(&dir)?.gid(), 4321, "{}", dir.display());
        assert_eq!((written.uid(), written.gid()), (1000, 4321), "{}", dir.display());
    }

    // NodeGetVolumeStats into the pod's volume stats and the claim's kubelet_volume_stats_* metrics
    let (code, body) = node.kubelet_get("/stats/summary").await?;
    assert_eq!(code, 200, "{body}");
    let summary: serde_json::Value = serde_json::from_str(&body)?;
    let pod_stats = summary["pods"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["podRef"]["uid"] == uid.as_str()))
        .with_context(|| format!("the pod in {body}"))?;
    let data = pod_stats["volume"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "data"))
        .with_context(|| format!("the claim's volume in {pod_stats}"))?;
    // the mock driver's volumes hold 100 GiB
    assert_eq!(data["capacityBytes"], 100u64 << 30, "{data}");
    assert_eq!(
        data["pvcRef"],
        serde_json::json!({"name": "data", "namespace": ns})
    );
    assert!(!calls(&driver, "NodeGetVolumeStats").is_empty());
    let (code, metrics) = node.kubelet_get("/metrics").await?;
    assert_eq!(code, 200);
    let line = format!(
        "kubelet_volume_stats_capacity_bytes{{namespace=\"{ns}\",persistentvolumeclaim=\"data\"}} {}",
        100u64 << 30
    );
    assert!(metrics.lines().any(|l| l == line), "{line} in /metrics");

    // the pod goes: the inline volume is unpublished
    let t1 = Instant::now();
    pods.delete("inline", &DeleteParams::default()).await?;
    wait_for(
        "the inline volume unpublished",
        Duration::from_secs(60),
        || async {
            Ok(calls(&driver, "NodeUnpublishVolume")
                .into_iter()
                .find(|c| c.contains(&format!("\"target_path\":\"{}\"", scratch.display()))))
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    wait_for("the claim's volume unstaged", Duration::from_secs(60), || async {
        Ok(calls(&driver, "NodeUnstageVolume").first().cloned())
    })
    .await?;
    println!(
        "[real_node_csi] inline and claim volumes torn down {:?} after the pod's deletion",
        t1.elapsed()
    );
    // as above: the directories go after the calls have returned
    wait_for(
        "the pod's volume directories removed",
        Duration::from_secs(30),
        || async {
            let empty = !volumes.exists() || std::fs::read_dir(&volumes)?.next().is_none();
            Ok(empty.then_some(()))
        },
    )
    .await?;
    driver.proc.stop(Duration::from_secs(10)).await?;
    Ok(())
}

/// The request of the driver's last `method` call (its log line's JSON), with its outcome.
fn last_request(driver: &Driver, method: &str) -> anyhow::Result<(serde_json::Value, String)> {
    let line = calls(driver, method)
        .pop()
        .with_context(|| format!("no {method} call"))?;
    let (body, outcome) = line.rsplit_once(" -> ").context("an outcome")?;
    Ok((serde_json::from_str(body)?, outcome.to_owned()))
}

#[tokio::test]
async fn csi_secrets_and_service_account_tokens_reach_the_driver() -> anyhow::Result<()> {
    use k8s_openapi::api::authentication::v1::TokenReview;
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, Secret};
    use k8s_openapi::api::storage::v1::CSIDriver;
    use kube::api::{DeleteParams, PostParams};

    e2e::init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let name = "csi-mock-secrets.node-agent.test";
    let driver = Driver::start(node, name, &["--disable-attach"]).await?;
    driver.logged("registration: ok", Duration::from_secs(30)).await?;
    let admin = node.cp.admin_client().await?;
    let audience = "csi-secrets-audience";
    // tokens for an audience of the driver's, in the volume context, renewed by publishing again at every sync
    // of the pod; inline volumes allowed
    let object: CSIDriver = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"attachRequired": false, "podInfoOnMount": true, "requiresRepublish": true,
                 "tokenRequests": [{"audience": audience, "expirationSeconds": 3600}],
                 "volumeLifecycleModes": ["Persistent", "Ephemeral"]},
    }))?;
    let csi_drivers: Api<CSIDriver> = Api::all(admin.clone());
    if csi_drivers.get_opt(name).await?.is_none() {
        csi_drivers.create(&PostParams::default(), &object).await?;
    }
    let ns = "csi-secrets";
    let pods = node.namespace(ns).await?;
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), ns);
    for (secret, key, value) in [
        ("stage-creds", "user", "stager"),
        ("publish-creds", "password", "publisher"),
        ("inline-creds", "key", "inline-secret"),
    ] {
        let s: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": secret}, "stringData": {key: value},
        }))?;
        secrets.create(&PostParams::default(), &s).await?;
    }
    // the mock driver's volume "1" with a stage and a publish secret
    let pv_name = "csi-mock-secrets-volume-1";
    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "csi": {"driver": name, "volumeHandle": "1",
                    "nodeStageSecretRef": {"name": "stage-creds", "namespace": ns},
                    "nodePublishSecretRef": {"name": "publish-creds", "namespace": ns}},
        },
    }))?;
    let pvs: Api<PersistentVolume> = Api::all(admin.clone());
    if pvs.get_opt(pv_name).await?.is_none() {
        pvs.create(&PostParams::default(), &pv).await?;
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), ns);
    let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv_name,
                 "resources": {"requests": {"storage": "1Gi"}}},
    }))?;
    claims.create(&PostParams::default(), &claim).await?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "with-secrets"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:local",
                "command": ["sleep", "3600"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"},
                                 {"name": "inline", "mountPath": "/inline"}],
            }],
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                {"name": "inline", "csi": {"driver": name, "nodePublishSecretRef": {"name": "inline-creds"}}},
            ],
        },
    }))?;
    let created = node.create_pod(&pods, &pod).await?;
    let uid = created.metadata.uid.clone().context("uid")?;
    wait_for("the pod Running", Duration::from_secs(90), || async {
        let p = pods.get("with-secrets").await?;
        Ok((p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).then_some(()))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;

    // the stage secret with NodeStageVolume, the publish secrets with each NodePublishVolume
    let (staged, outcome) = last_request(&driver, "NodeStageVolume")?;
    assert_eq!(outcome, "ok");
    assert_eq!(staged["secrets"], serde_json::json!({"user": "stager"}));
    let published: Vec<serde_json::Value> = calls(&driver, "NodePublishVolume")
        .iter()
        .filter_map(|l| serde_json::from_str(l.rsplit_once(" -> ")?.0).ok())
        .collect();
    assert!(published.len() >= 2, "{published:?}");
    let by_target = |part: &str| {
        published
            .iter()
            .find(|r| r["target_path"].as_str().is_some_and(|t| t.contains(part)))
            .cloned()
            .with_context(|| format!("a NodePublishVolume into {part}"))
    };
    let pv_publish = by_target(&format!("/volumes/kubernetes.io~csi/{pv_name}/"))?;
    let inline_publish = by_target("/volumes/kubernetes.io~csi/inline/")?;
    assert_eq!(
        pv_publish["secrets"],
        serde_json::json!({"password": "publisher"})
    );
    assert_eq!(
        inline_publish["secrets"],
        serde_json::json!({"key": "inline-secret"})
    );

    // a token for the driver's audience, bound to the pod, in each volume context
    for request in [&pv_publish, &inline_publish] {
        let context = &request["volume_context"];
        assert_eq!(context["csi.storage.k8s.io/pod.name"], "with-secrets");
        let tokens: serde_json::Value = serde_json::from_str(
            context["csi.storage.k8s.io/serviceAccount.tokens"]
                .as_str()
                .context("the tokens in the volume context")?,
        )?;
        let token = tokens[audience]["token"].as_str().context("a token")?;
        assert!(
            tokens[audience]["expirationTimestamp"]
                .as_str()
                .is_some_and(|t| t.ends_with('Z'))
        );
        let review: TokenReview = serde_json::from_value(serde_json::json!({
            "spec": {"token": token, "audiences": [audience]},
        }))?;
        let reviewed = Api::<TokenReview>::all(admin.clone())
            .create(&PostParams::default(), &review)
            .await?
            .status
            .context("a review")?;
        assert_eq!(reviewed.authenticated, Some(true), "{reviewed:?}");
        let user = reviewed.user.context("a user")?;
        assert_eq!(
            user.username.as_deref(),
            Some("system:serviceaccount:csi-secrets:default")
        );
        let extra = user.extra.unwrap_or_default();
        assert_eq!(
            extra.get("authentication.kubernetes.io/pod-uid"),
            Some(&vec![uid.clone()]),
            "the token is bound to the pod"
        );
    }

    // requiresRepublish: both volumes published again (with their secrets) at the pod's next syncs, the
    // claim's volume never staged again
    let t0 = Instant::now();
    wait_for(
        "both volumes published again",
        Duration::from_secs(60),
        || async {
            let again = calls(&driver, "NodePublishVolume")
                .iter()
                .filter(|l| l.contains("\"secrets\":{\"") && l.ends_with("-> ok"))
                .count();
            Ok((again >= 4).then_some(()))
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    println!(
        "[real_node_csi] volumes of a driver with requiresRepublish published again within {:?}",
        t0.elapsed()
    );
    assert_eq!(calls(&driver, "NodeStageVolume").len(), 1, "staged once");

    pods.delete("with-secrets", &DeleteParams::default()).await?;
    wait_for("the volume unstaged", Duration::from_secs(60), || async {
        Ok(calls(&driver, "NodeUnstageVolume").first().cloned())
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    driver.proc.stop(Duration::from_secs(10)).await?;
    Ok(())
}
