//! A persistent CSI volume of a driver that needs no attachment: staged at the global mount path, published into
//! the pod's volume directory, written by the pod, then unpublished, unstaged and its directories removed.

use std::time::{Duration, Instant};

use anyhow::Context;
use e2e::wait_for;

use crate::driver::{Driver, calls};
use crate::harness::RealNode;
use crate::objects::{create_claim, ensure_csi_driver, ensure_pv, running};

#[tokio::test]
async fn a_csi_persistent_volume_is_staged_published_used_and_torn_down() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::DeleteParams;

    e2e::init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let _agent = crate::AGENT.read().await;
    let name = "csi-mock-vol.node-agent.test";
    // the mock driver without ControllerPublish, and a CSIDriver saying so: no VolumeAttachment to wait for
    let driver = Driver::registered(node, name, &["--disable-attach"]).await?;
    let admin = node.cp.admin_client().await?;
    ensure_csi_driver(
        &admin,
        name,
        serde_json::json!({"attachRequired": false, "podInfoOnMount": false}),
    )
    .await?;
    // the mock driver's volume "2" as a PersistentVolume, bound to a claim by name
    let pv_name = "csi-mock-volume-2";
    ensure_pv(
        &admin,
        pv_name,
        serde_json::json!({"driver": name, "volumeHandle": "2", "volumeAttributes": {"purpose": "test"}}),
    )
    .await?;
    let pods = node.namespace("csi-volume").await?;
    create_claim(&admin, "csi-volume", pv_name).await?;
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
    running(&pods, "writer", Duration::from_secs(90))
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
    driver
        .called("NodeUnstageVolume", Duration::from_secs(60))
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
