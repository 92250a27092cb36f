//! An attachable CSI volume: the real external attacher attaches it through the driver's controller service
//! before the node stages it with the attachment's publish context, the Node reports it in use and attached, and
//! it is detached after the pod.

use std::time::{Duration, Instant};

use anyhow::Context;
use e2e::wait_for;
use k8s_openapi::api::core::v1::Node;
use kube::Api;

use crate::driver::{Driver, calls, controller_calls};
use crate::harness::{NODE, RealNode};
use crate::objects::{create_claim, ensure_csi_driver, ensure_pv, running};

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
    use k8s_openapi::api::core::v1::{Event, Pod};
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    use kube::api::{DeleteParams, ListParams};

    e2e::init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let _agent = crate::AGENT.read().await;
    let name = "csi-mock-attach.node-agent.test";
    // the mock driver with its controller service's ControllerPublish, and the real external attacher beside it
    let driver = Driver::registered(node, name, &[]).await?;
    let attacher_log = driver.log.with_file_name("csi-attacher.log");
    let attacher = driver
        .sidecar(
            node,
            "csi-attacher",
            "build-external-attacher.sh",
            "the external attacher",
            4,
        )
        .await?;
    let admin = node.cp.admin_client().await?;
    ensure_csi_driver(
        &admin,
        name,
        serde_json::json!({"attachRequired": true, "podInfoOnMount": false}),
    )
    .await?;
    let pv_name = "csi-mock-attach-volume-1";
    ensure_pv(
        &admin,
        pv_name,
        serde_json::json!({"driver": name, "volumeHandle": "1"}),
    )
    .await?;
    let ns = "csi-attach";
    let pods = node.namespace(ns).await?;
    create_claim(&admin, ns, pv_name).await?;
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
    running(&pods, "attached", Duration::from_secs(120))
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
