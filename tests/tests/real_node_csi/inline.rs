//! An inline (ephemeral) CSI volume beside a claim's: published with the pod's details and never staged, the
//! pod's fsGroup on both, the claim's volume stats from the driver in the summary and the metrics, and both torn
//! down after the pod.

use std::time::{Duration, Instant};

use anyhow::Context;
use e2e::wait_for;
use kube::Api;

use crate::driver::{Driver, calls};
use crate::harness::RealNode;
use crate::objects::{create_claim, ensure_csi_driver, ensure_pv, running};

#[tokio::test]
async fn an_inline_csi_volume_with_fs_group_and_volume_stats() -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt as _;

    use k8s_openapi::api::core::v1::Pod;
    use kube::api::DeleteParams;

    e2e::init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let _agent = crate::AGENT.read().await;
    let name = "csi-mock-inline.node-agent.test";
    let driver = Driver::registered(node, name, &["--disable-attach"]).await?;
    let admin = node.cp.admin_client().await?;
    // inline volumes allowed, the pod's details on mount, and the pod's fsGroup for every volume
    ensure_csi_driver(
        &admin,
        name,
        serde_json::json!({"attachRequired": false, "podInfoOnMount": true, "fsGroupPolicy": "File",
                 "volumeLifecycleModes": ["Persistent", "Ephemeral"]}),
    )
    .await?;
    let pv_name = "csi-mock-inline-volume-3";
    ensure_pv(
        &admin,
        pv_name,
        serde_json::json!({"driver": name, "volumeHandle": "3"}),
    )
    .await?;
    let ns = "csi-inline";
    let pods = node.namespace(ns).await?;
    create_claim(&admin, ns, pv_name).await?;
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
    let started = running(&pods, "inline", Duration::from_secs(90)).await;
    if let Err(e) = started {
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
    driver
        .called("NodeUnstageVolume", Duration::from_secs(60))
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
