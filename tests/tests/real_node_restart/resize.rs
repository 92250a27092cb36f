//! A resize kept across a restart: a running pod's cpu limit resized in place, then a resize too large for what
//! the node has left beside a second pod left `Deferred`; node-agent restarted (SIGTERM) gives the pod what was
//! allocated to it before — the container runs on, same container ID, restart count 0, with the resized limit in
//! its cgroup and status — and the deferred resize still waits (judged once every pod is back, so the pod the
//! restarted agent lists first does not take the room the second one holds), then is applied in place by the new
//! process when the second pod goes.

use std::time::Duration;

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};

use super::{container, node, renew_time};

const NS: &str = "rn-restart-resize";

async fn resize(pods: &Api<Pod>, resources: serde_json::Value) -> anyhow::Result<()> {
    let patch = serde_json::json!({"spec": {"containers": [{"name": "main", "resources": resources}]}});
    pods.patch_subresource(
        "resize",
        "kept",
        &PatchParams::default(),
        &Patch::Strategic(patch),
    )
    .await
    .context("PATCH pods/resize")?;
    Ok(())
}

/// `(status resources' cpu limit, allocated cpu request, container ID, restart count)`.
fn seen(p: &Pod) -> Option<(String, String, String, i32)> {
    let c = container(p)?;
    let limit = c.resources.as_ref()?.limits.as_ref()?.get("cpu")?.0.clone();
    let allocated = c.allocated_resources.as_ref()?.get("cpu")?.0.clone();
    Some((limit, allocated, c.container_id?, c.restart_count))
}

/// The pod's own `(status.allocatedResources.cpu, status.resources.requests.cpu, status.resources.limits.cpu)`.
fn pod_level(p: &Pod) -> Option<(String, String, String)> {
    let s = p.status.as_ref()?;
    let allocated = s.allocated_resources.as_ref()?.get("cpu")?.0.clone();
    let r = s.resources.as_ref()?;
    let request = r.requests.as_ref()?.get("cpu")?.0.clone();
    let limit = r.limits.as_ref()?.get("cpu")?.0.clone();
    Some((allocated, request, limit))
}

fn pending_reason(p: &Pod) -> Option<String> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodResizePending")
        .and_then(|c| c.reason.clone())
}

/// The pod's container's CFS quota, from its cgroup on the host.
fn quota(node: &super::RealNode, p: &Pod) -> anyhow::Result<String> {
    let uid = p.metadata.uid.as_deref().context("uid")?;
    let id = container(p)
        .and_then(|c| c.container_id)
        .context("container id")?;
    let id = id.strip_prefix("containerd://").unwrap_or(&id);
    let root = node.cgroup_root.trim_start_matches('/');
    let pod_dir = format!("/sys/fs/cgroup/cpu/{root}/kubepods/burstable/pod{uid}/{id}").replace("//", "/");
    Ok(std::fs::read_to_string(format!("{pod_dir}/cpu.cfs_quota_us"))
        .with_context(|| pod_dir.clone())?
        .trim()
        .to_owned())
}

#[tokio::test]
async fn a_resized_pod_keeps_its_allocation_across_a_restart() -> anyhow::Result<()> {
    init_logging();
    let Some((node, _serial)) = node().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let leases: Api<Lease> = Api::namespaced(node.cp.admin_client().await?, "kube-node-lease");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "kept"},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main", "image": "localhost/busybox:local",
                "command": ["sh", "-c", "while :; do sleep 1; done"],
                "resources": {"requests": {"cpu": "100m", "memory": "32Mi"},
                              "limits": {"cpu": "200m", "memory": "64Mi"}},
                "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}],
            }],
        },
    }))?;
    node.create_pod(&pods, &pod).await?;
    let (_, _, id, _) = wait_for("kept running", Duration::from_secs(60), || async {
        let p = pods.get("kept").await?;
        Ok(container(&p).filter(|c| c.ready).and_then(|_| seen(&p)))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;

    // in place: the cpu limit 200m -> 400m
    resize(&pods, serde_json::json!({"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "400m", "memory": "64Mi"}})).await?;
    let resized = wait_for("the cpu limit resized", Duration::from_secs(60), || async {
        let p = pods.get("kept").await?;
        Ok(seen(&p).filter(|s| s.0 == "400m").map(|_| p))
    })
    .await?;
    assert_eq!(quota(node, &resized)?, "40000");
    // too large for what the node has left beside a second pod (the API server refuses a resize beyond the
    // node's whole allocatable): deferred, the allocation stays
    let blocker: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "blocker"},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main", "image": "localhost/busybox:local", "command": ["sleep", "3600"],
                "resources": {"requests": {"cpu": "1000m", "memory": "16Mi"},
                              "limits": {"cpu": "1000m", "memory": "16Mi"}},
            }],
        },
    }))?;
    node.create_pod(&pods, &blocker).await?;
    wait_for("blocker running", Duration::from_secs(60), || async {
        let p = pods.get("blocker").await?;
        Ok((p.status.and_then(|s| s.phase).as_deref() == Some("Running")).then_some(()))
    })
    .await?;
    resize(&pods, serde_json::json!({"requests": {"cpu": "1500m", "memory": "32Mi"}, "limits": {"cpu": "1500m", "memory": "64Mi"}})).await?;
    let reason = wait_for("the large resize pending", Duration::from_secs(60), || async {
        Ok(pending_reason(&pods.get("kept").await?))
    })
    .await?;

    let stopped_at = k8s_openapi::jiff::Timestamp::now();
    node.restart_agent(false).await?;
    wait_for(
        "a lease renewal after the restart",
        Duration::from_secs(60),
        || async { Ok(renew_time(&leases).await?.filter(|t| *t > stopped_at).map(|_| ())) },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    // the new process has reported the pod: its status names the resize pending again after the restart
    let after = wait_for(
        "the status after the restart",
        Duration::from_secs(60),
        || async {
            let p = pods.get("kept").await?;
            let reported = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "PodResizePending"))
                .and_then(|c| c.last_transition_time.as_ref())
                .is_some();
            Ok(reported.then_some(p))
        },
    )
    .await?;
    // hold a few syncs of the new process: nothing may restart or resize the container meanwhile
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = pods.get("kept").await.unwrap_or(after);
    let (limit, allocated, id_after, restarts) = seen(&after).context("kept's status")?;
    println!(
        "[real_node] resize across a restart: limit {limit}, allocated {allocated}, pending {:?} (before: {reason})",
        pending_reason(&after)
    );
    assert_eq!(id_after, id, "the same container");
    assert_eq!(restarts, 0);
    assert_eq!(
        (limit.as_str(), allocated.as_str()),
        ("400m", "100m"),
        "the allocation, not the spec"
    );
    assert_eq!(
        quota(node, &after)?,
        "40000",
        "the cgroup keeps the allocated limit"
    );
    assert_eq!(
        pod_level(&after),
        Some(("100m".into(), "100m".into(), "400m".into())),
        "the pod's own status resources: the allocation"
    );
    assert_eq!(
        pending_reason(&after),
        Some(reason),
        "the large resize still waits"
    );

    // the room comes back: the new process applies the waiting resize in place
    pods.delete("blocker", &Default::default())
        .await
        .context("delete blocker")?;
    let applied = wait_for(
        "the waiting resize applied once the blocker is gone",
        Duration::from_secs(90),
        || async {
            let p = pods.get("kept").await?;
            Ok(seen(&p)
                .filter(|s| (s.0.as_str(), s.1.as_str()) == ("1500m", "1500m"))
                .filter(|_| pending_reason(&p).is_none())
                .map(|_| p))
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    let (_, _, id_applied, restarts) = seen(&applied).context("kept's status")?;
    assert_eq!(id_applied, id, "resized in place, the same container");
    assert_eq!(restarts, 0);
    assert_eq!(quota(node, &applied)?, "150000", "the cgroup has the new limit");
    assert_eq!(
        pod_level(&applied),
        Some(("1500m".into(), "1500m".into(), "1500m".into()))
    );
    Ok(())
}
