//! Raw block volumes (`volumeMode: Block`, a container's `volumeDevices`): a `local` PersistentVolume on a loop
//! device whose bytes one pod writes through its device and the next pod reads back, a claim used the wrong way
//! refused with the kubelet's message, and a block volume provisioned by the real external-provisioner on the
//! mock driver — staged and published with the kubelet's block layout, a device in the container, a loop device
//! over its file — torn down (loop device detached, unpublished, unstaged) after its pod was deleted while the
//! agent was down.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use e2e::wait_for;
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};

use crate::driver::{Driver, calls};
use crate::harness::{NODE, RealNode};
use crate::objects::{ensure_csi_driver, running};

/// A loop device over a file of the test's, detached on drop.
struct LoopDevice {
    device: String,
}

impl LoopDevice {
    /// Attaches a loop device to a new file of `size` bytes at `file`; fails saying so when the host has none.
    fn attach(file: &Path, size: u64) -> anyhow::Result<Self> {
        std::fs::File::create(file)?.set_len(size)?;
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(file)
            .output()
            .context("running losetup (util-linux) to get a loop device for the block volume")?;
        anyhow::ensure!(
            out.status.success(),
            "no loop device for the block volume test: losetup -f --show {} failed: {} (the test needs \
             /dev/loop-control and a free loop device)",
            file.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(Self {
            device: String::from_utf8(out.stdout)?.trim().to_owned(),
        })
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.device]).status();
    }
}

/// `losetup -a`: every loop device with its backing file.
fn loop_devices() -> anyhow::Result<String> {
    let out = Command::new("losetup").arg("-a").output()?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The mount points at or below `dir` (the agent runs in this process's mount namespace).
fn mounts_below(dir: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    let dir = dir.display().to_string();
    Ok(text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(&dir))
        .map(str::to_owned)
        .collect())
}

/// A pod of one busybox container running `script` with the claim `data` as the device `/dev/xvda`.
fn block_pod(name: &str, script: &str, restart: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": restart,
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:local",
                "command": ["sh", "-c", script],
                "volumeDevices": [{"name": "data", "devicePath": "/dev/xvda"}],
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        },
    }))?)
}

/// The claim `data` in `ns` with `volumeMode: Block`: bound to `pv_name`, or provisioned from `class`.
async fn block_claim(
    admin: &kube::Client,
    ns: &str,
    pv_name: Option<&str>,
    class: &str,
) -> anyhow::Result<()> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), ns);
    let mut spec = serde_json::json!({"accessModes": ["ReadWriteOnce"], "storageClassName": class,
        "volumeMode": "Block", "resources": {"requests": {"storage": "16Mi"}}});
    if let Some(pv) = pv_name {
        spec["volumeName"] = pv.into();
    }
    let claim: PersistentVolumeClaim =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "data"}, "spec": spec}))?;
    claims.create(&PostParams::default(), &claim).await?;
    Ok(())
}

/// The pod's container log through the node's kubelet API (what `kubectl logs` shows).
async fn log(node: &RealNode, ns: &str, pod: &str) -> anyhow::Result<String> {
    let (status, body) = node
        .kubelet_get(&format!("/containerLogs/{ns}/{pod}/main"))
        .await?;
    anyhow::ensure!(status == 200, "containerLogs answered {status}: {body}");
    Ok(body)
}

#[tokio::test]
async fn a_local_block_volume_on_a_loop_device_keeps_what_one_pod_wrote_for_the_next() -> anyhow::Result<()> {
    e2e::init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let _agent = crate::AGENT.read().await;
    let backing = node
        .agent_root
        .parent()
        .context("the node's directory")?
        .join("local-block.img");
    let device = LoopDevice::attach(&backing, 16 << 20)?;
    let admin = node.cp.admin_client().await?;
    let pv_name = "local-block-pv";
    let pvs: Api<PersistentVolume> = Api::all(admin.clone());
    if pvs.get_opt(pv_name).await?.is_some() {
        pvs.delete(pv_name, &DeleteParams::default()).await?;
        wait_for(
            "an earlier run's PersistentVolume gone",
            Duration::from_secs(30),
            || async { Ok(pvs.get_opt(pv_name).await?.is_none().then_some(())) },
        )
        .await?;
    }
    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "16Mi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "volumeMode": "Block",
            "local": {"path": device.device},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}]}]}},
        },
    }))?;
    pvs.create(&PostParams::default(), &pv).await?;
    let ns = "csi-local-block";
    let pods = node.namespace(ns).await?;
    block_claim(&admin, ns, Some(pv_name), "").await?;

    // the first pod writes through its device
    let text = "written-through-a-block-device";
    let writer = block_pod(
        "writer",
        &format!(
            "test -b /dev/xvda || exit 3; printf {text} | dd of=/dev/xvda bs=512 conv=sync,notrunc,fsync && \
             echo wrote && sleep 3600"
        ),
        "Never",
    )?;
    let t0 = Instant::now();
    let created = node.create_pod(&pods, &writer).await?;
    let uid = created.metadata.uid.context("uid")?;
    running(&pods, "writer", Duration::from_secs(90))
        .await
        .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    wait_for("the writer's log", Duration::from_secs(30), || async {
        Ok(log(node, ns, "writer").await?.contains("wrote").then_some(()))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    println!(
        "[real_node_csi] local block volume pod Running and written {:?} after its creation",
        t0.elapsed()
    );
    // the kubelet's layout: the pod's symlink to the device, the map file bind-mounted onto it; no loop device
    // of the agent's (the volume is a device already)
    let root = &node.agent_root;
    let link = root
        .join("pods")
        .join(&uid)
        .join("volumeDevices/kubernetes.io~local-volume")
        .join(pv_name);
    assert_eq!(std::fs::read_link(&link)?, PathBuf::from(&device.device));
    let map_file = root
        .join("plugins/kubernetes.io~local-volume/volumeDevices")
        .join(pv_name)
        .join(&uid);
    assert_eq!(mounts_below(&map_file)?, vec![map_file.display().to_string()]);
    assert!(!loop_devices()?.contains(&map_file.display().to_string()));

    // the writer goes: the volume is unmapped
    pods.delete("writer", &DeleteParams::default()).await?;
    wait_for(
        "the writer gone and its mapping removed",
        Duration::from_secs(60),
        || async {
            let gone = pods.get_opt("writer").await?.is_none()
                && !link.exists()
                && !map_file.exists()
                && mounts_below(&map_file)?.is_empty();
            Ok(gone.then_some(()))
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;

    // the next pod reads the bytes back through a read-only claim (a device it may only read)
    let mut reader = block_pod(
        "reader",
        &format!("dd if=/dev/xvda bs={} count=1 2>/dev/null; echo", text.len()),
        "Never",
    )?;
    if let Some(claim) = reader
        .spec
        .as_mut()
        .and_then(|s| s.volumes.as_mut())
        .and_then(|v| v.first_mut())
        .and_then(|v| v.persistent_volume_claim.as_mut())
    {
        claim.read_only = Some(true);
    }
    node.create_pod(&pods, &reader).await?;
    let read = wait_for("the reader's output", Duration::from_secs(90), || async {
        let phase = pods.get("reader").await?.status.and_then(|s| s.phase);
        if phase.as_deref() != Some("Succeeded") {
            anyhow::ensure!(phase.as_deref() != Some("Failed"), "the reader failed");
            return Ok(None);
        }
        Ok(Some(log(node, ns, "reader").await?))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    assert_eq!(read.trim(), text);

    // a block claim named in volumeMounts is refused as the kubelet refuses it
    let misuse: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "misuse"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "localhost/busybox:local", "command": ["sleep", "3600"],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        },
    }))?;
    node.create_pod(&pods, &misuse).await?;
    let events: Api<Event> = Api::namespaced(admin.clone(), ns);
    let event = wait_for(
        "the misuse's FailedMount event",
        Duration::from_secs(60),
        || async {
            Ok(events
                .list(&ListParams::default().fields("involvedObject.name=misuse"))
                .await?
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("FailedMount")))
        },
    )
    .await?;
    assert_eq!(
        event.message.as_deref(),
        Some(
            "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[], failed to process \
             volumes=[data]: volume data has volumeMode Block, but is specified in volumeMounts"
        )
    );
    assert_eq!(
        pods.get("misuse").await?.status.and_then(|s| s.phase).as_deref(),
        Some("Pending")
    );
    for name in ["reader", "misuse"] {
        pods.delete(name, &DeleteParams::default()).await?;
    }
    e2e::wait_until_empty(&pods, "the pods gone", Duration::from_secs(60)).await?;
    Ok(())
}

#[tokio::test]
async fn a_provisioned_csi_block_volume_is_a_device_in_the_container_and_torn_down_after_a_restart()
-> anyhow::Result<()> {
    use k8s_openapi::api::storage::v1::StorageClass;

    e2e::init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let _agent = crate::AGENT.write().await;
    let name = "csi-mock-block.node-agent.test";
    let driver = Driver::registered(node, name, &["--disable-attach"]).await?;
    let provisioner_log = driver.log.with_file_name("csi-provisioner.log");
    let provisioner = driver
        .sidecar(
            node,
            "csi-provisioner",
            "build-external-provisioner.sh",
            "the external provisioner",
            2,
        )
        .await?;
    let admin = node.cp.admin_client().await?;
    ensure_csi_driver(
        &admin,
        name,
        serde_json::json!({"attachRequired": false, "podInfoOnMount": false}),
    )
    .await?;
    let classes: Api<StorageClass> = Api::all(admin.clone());
    let class = "csi-mock-block";
    if classes.get_opt(class).await?.is_none() {
        let sc: StorageClass = serde_json::from_value(serde_json::json!({
            "metadata": {"name": class}, "provisioner": name, "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        }))?;
        classes.create(&PostParams::default(), &sc).await?;
    }
    let ns = "csi-block";
    let pods = node.namespace(ns).await?;
    block_claim(&admin, ns, None, class).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), ns);
    let pv_name = wait_for(
        "the claim provisioned and bound",
        Duration::from_secs(90),
        || async {
            let claim = claims.get("data").await?;
            let bound = claim.status.and_then(|s| s.phase).as_deref() == Some("Bound");
            Ok(claim.spec.and_then(|s| s.volume_name).filter(|_| bound))
        },
    )
    .await
    .with_context(|| {
        format!(
            "provisioner log:\n{}",
            testenv::process::log_tail(&provisioner_log, 20)
        )
    })?;
    let pv = Api::<PersistentVolume>::all(admin.clone()).get(&pv_name).await?;
    assert_eq!(
        pv.spec.as_ref().and_then(|s| s.volume_mode.as_deref()),
        Some("Block")
    );

    let pod = block_pod(
        "user",
        "test -b /dev/xvda && echo block device at /dev/xvda; printf through-the-device | dd of=/dev/xvda \
         conv=notrunc,fsync 2>/dev/null && dd if=/dev/xvda bs=18 count=1 2>/dev/null; echo; sleep 3600",
        "Always",
    )?;
    let t0 = Instant::now();
    let created = node.create_pod(&pods, &pod).await?;
    let uid = created.metadata.uid.context("uid")?;
    let events: Api<Event> = Api::namespaced(admin.clone(), ns);
    if let Err(e) = running(&pods, "user", Duration::from_secs(90)).await {
        let seen = events.list(&ListParams::default()).await?.items;
        let seen: Vec<String> = seen
            .iter()
            .map(|e| format!("{:?}: {:?}", e.reason, e.message))
            .collect();
        return Err(e.context(format!(
            "events: {seen:#?}\ndriver log:\n{}\nagent log:\n{}",
            testenv::process::log_tail(&driver.log, 20),
            node.agent_log_tail()
        )));
    }
    let out = wait_for("the container's output", Duration::from_secs(30), || async {
        let out = log(node, ns, "user").await?;
        Ok(out.contains("through-the-device").then_some(out))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    println!(
        "[real_node_csi] CSI block volume pod Running, its device written and read {:?} after its creation",
        t0.elapsed()
    );
    assert!(out.contains("block device at /dev/xvda"), "{out}");

    // staged and published with a block access type at the kubelet's block paths
    let root = &node.agent_root;
    let block_dir = root.join("plugins/kubernetes.io/csi/volumeDevices");
    let staging = block_dir.join("staging").join(&pv_name);
    let target = block_dir.join("publish").join(&pv_name).join(&uid);
    let staged = calls(&driver, "NodeStageVolume");
    assert_eq!(staged.len(), 1, "{staged:?}");
    assert!(
        staged[0].contains(&format!("\"staging_target_path\":\"{}\"", staging.display()))
            && staged[0].contains("\"AccessType\":{\"Block\":{}}")
            && staged[0].ends_with("-> ok"),
        "{}",
        staged[0]
    );
    let published = calls(&driver, "NodePublishVolume");
    assert_eq!(published.len(), 1, "{published:?}");
    assert!(
        published[0].contains(&format!("\"target_path\":\"{}\"", target.display()))
            && published[0].contains("\"AccessType\":{\"Block\":{}}"),
        "{}",
        published[0]
    );
    // the driver published a file: mapped for the pod, a loop device over the pod's map file
    let link = root
        .join("pods")
        .join(&uid)
        .join("volumeDevices/kubernetes.io~csi")
        .join(&pv_name);
    // the pod's symlink leads where the publish path does (the driver's file: the kubelet evaluates the path)
    assert_eq!(std::fs::read_link(&link)?, std::fs::canonicalize(&target)?);
    let map_file = block_dir.join(&pv_name).join("dev").join(&uid);
    let loops = loop_devices()?;
    assert!(
        loops.contains(&map_file.display().to_string()),
        "losetup -a:\n{loops}"
    );
    let vol_data: serde_json::Value = serde_json::from_slice(&std::fs::read(
        block_dir.join(&pv_name).join("data/vol_data.json"),
    )?)?;
    assert_eq!(vol_data["driverName"], name);
    assert_eq!(vol_data["specVolID"], pv_name.as_str());

    // the pod is deleted while the agent is down; started again, the agent tears its volume down
    node.stop_agent(Duration::from_secs(20)).await?;
    let deleted = pods
        .delete("user", &DeleteParams::default().grace_period(0))
        .await
        .map(|_| ());
    node.start_agent()?;
    deleted?;
    let t1 = Instant::now();
    driver
        .called("NodeUnstageVolume", Duration::from_secs(90))
        .await
        .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    wait_for(
        "the block volume's directories removed",
        Duration::from_secs(30),
        || async {
            let gone = !link.exists()
                && !map_file.exists()
                && !target.exists()
                && !staging.exists()
                && !block_dir.join(&pv_name).exists();
            Ok(gone.then_some(()))
        },
    )
    .await?;
    println!(
        "[real_node_csi] CSI block volume of a pod deleted while the agent was down unmapped, unpublished and \
         unstaged {:?} after the agent's start",
        t1.elapsed()
    );
    let unpublished = calls(&driver, "NodeUnpublishVolume");
    assert_eq!(unpublished.len(), 1, "{unpublished:?}");
    assert!(unpublished[0].contains(&format!("\"target_path\":\"{}\"", target.display())));
    assert!(
        calls(&driver, "NodeUnstageVolume")[0]
            .contains(&format!("\"staging_target_path\":\"{}\"", staging.display()))
    );
    let loops = loop_devices()?;
    assert!(
        !loops.contains(&map_file.display().to_string()),
        "losetup -a:\n{loops}"
    );
    assert!(!loops.contains(&uid), "losetup -a:\n{loops}");
    assert_eq!(mounts_below(&block_dir)?, Vec::<String>::new());

    claims.delete("data", &DeleteParams::default()).await?;
    provisioner.stop(Duration::from_secs(10)).await?;
    driver.proc.stop(Duration::from_secs(10)).await?;
    Ok(())
}
