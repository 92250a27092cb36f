//! In-place pod resize on the real node, as a user sees it: `kubectl patch pod --subresource resize` of a
//! running pod's CPU changes the container's cgroup (CFS quota and shares, read on the host) and the pod
//! cgroup's, without a restart — same container ID, restart count 0 — and the status reports the new
//! resources and allocation; a resize that does not fit beside the other pods waits with `PodResizePending`
//! (`Deferred`, the kubelet's message) and the container keeps its resources (one beyond the node's whole
//! allocatable the API server refuses itself); a memory resize of a container whose
//! `resizePolicy` says `RestartContainer` restarts that container alone, with the new memory limit.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodCondition};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};

use super::harness::RealNode;

const NS: &str = "rn-resize";

fn pod() -> anyhow::Result<Pod> {
    let container = |name: &str, memory_policy: &str| {
        serde_json::json!({
            "name": name,
            "image": "localhost/busybox:local",
            "command": ["sh", "-c", "while :; do sleep 1; done"],
            "resources": {
                "requests": {"cpu": "100m", "memory": "32Mi"},
                "limits": {"cpu": "200m", "memory": "64Mi"},
            },
            "resizePolicy": [
                {"resourceName": "cpu", "restartPolicy": "NotRequired"},
                {"resourceName": "memory", "restartPolicy": memory_policy},
            ],
        })
    };
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": "resized"},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [container("main", "RestartContainer"), container("other", "NotRequired")],
        },
    }))?)
}

/// Resizes container `main` to `resources`.
async fn resize(pods: &Api<Pod>, resources: serde_json::Value) -> anyhow::Result<()> {
    let patch = serde_json::json!({"spec": {"containers": [{"name": "main", "resources": resources}]}});
    pods.patch_subresource(
        "resize",
        "resized",
        &PatchParams::default(),
        &Patch::Strategic(patch),
    )
    .await
    .context("PATCH pods/resize")?;
    Ok(())
}

fn status_of(p: &Pod, name: &str) -> Option<ContainerStatus> {
    p.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == name)
        .cloned()
}

fn condition(p: &Pod, type_: &str) -> Option<PodCondition> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .cloned()
}

fn quantity(
    map: Option<&std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    key: &str,
) -> Option<String> {
    map?.get(key).map(|q| q.0.clone())
}

/// `(status resources' cpu limit, allocated cpu request, container ID, restart count)` of `name`.
fn cpu_seen(p: &Pod, name: &str) -> Option<(String, String, String, i32)> {
    let s = status_of(p, name)?;
    let limit = quantity(s.resources.as_ref()?.limits.as_ref(), "cpu")?;
    let allocated = quantity(s.allocated_resources.as_ref(), "cpu")?;
    Some((limit, allocated, s.container_id?, s.restart_count))
}

fn read(controller: &str, cgroup: &str, file: &str) -> anyhow::Result<String> {
    let path = Path::new("/sys/fs/cgroup")
        .join(controller)
        .join(cgroup.trim_start_matches('/'))
        .join(file);
    Ok(std::fs::read_to_string(&path)
        .with_context(|| path.display().to_string())?
        .trim()
        .to_owned())
}

fn bare(id: &str) -> &str {
    id.strip_prefix("containerd://").unwrap_or(id)
}

#[tokio::test]
async fn a_running_pods_cpu_is_resized_in_place_and_a_memory_resize_restarts_only_its_container()
-> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    node.create_pod(&pods, &pod()?).await?;
    let log = || format!("agent log:\n{}", node.agent_log_tail());
    let running = wait_for("pod resized Running", Duration::from_secs(90), || async {
        let p = pods.get("resized").await?;
        let ok = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            && cpu_seen(&p, "main").is_some()
            && cpu_seen(&p, "other").is_some();
        Ok(ok.then_some(p))
    })
    .await
    .with_context(log)?;
    let uid = running.metadata.uid.clone().context("uid")?;
    let pod_cgroup = format!("{}/kubepods/burstable/pod{uid}", node.cgroup_root);
    let (limit, allocated, main_id, restarts) = cpu_seen(&running, "main").context("main's status")?;
    assert_eq!(
        (limit.as_str(), allocated.as_str(), restarts),
        ("200m", "100m", 0)
    );
    let main_cgroup = format!("{pod_cgroup}/{}", bare(&main_id));
    assert_eq!(read("cpu", &main_cgroup, "cpu.cfs_quota_us")?, "20000");
    assert_eq!(
        read("cpu", &pod_cgroup, "cpu.cfs_quota_us")?,
        "40000",
        "200m + 200m"
    );
    let other_id = status_of(&running, "other")
        .and_then(|s| s.container_id)
        .context("other's ID")?;

    // CPU: applied in place
    let asked = std::time::Instant::now();
    resize(
        &pods,
        serde_json::json!({"requests": {"cpu": "300m", "memory": "32Mi"}, "limits": {"cpu": "400m", "memory": "64Mi"}}),
    )
    .await?;
    let resized = wait_for("main reported at 400m", Duration::from_secs(60), || async {
        let p = pods.get("resized").await?;
        let seen = cpu_seen(&p, "main");
        let done = seen
            .as_ref()
            .is_some_and(|(l, a, _, _)| l == "400m" && a == "300m")
            && condition(&p, "PodResizeInProgress").is_none();
        Ok(done.then_some(p))
    })
    .await
    .with_context(log)?;
    let took = asked.elapsed();
    let (_, _, id_after, restarts_after) = cpu_seen(&resized, "main").context("main's status")?;
    assert_eq!(id_after, main_id, "the same container: not restarted");
    assert_eq!(restarts_after, 0);
    assert_eq!(
        read("cpu", &main_cgroup, "cpu.cfs_quota_us")?,
        "40000",
        "400m over 100 ms"
    );
    assert_eq!(read("cpu", &main_cgroup, "cpu.shares")?, "307", "300m requested");
    assert_eq!(
        read("cpu", &pod_cgroup, "cpu.cfs_quota_us")?,
        "60000",
        "400m + 200m"
    );
    assert_eq!(
        read("cpu", &pod_cgroup, "cpu.shares")?,
        "409",
        "300m + 100m requested"
    );
    assert!(condition(&resized, "PodResizePending").is_none());
    println!(
        "[real_node] cpu resize applied in place in {took:?}: quota 20000 -> 40000, same container, 0 restarts"
    );

    // within the node's allocatable (the API server refuses more) but not beside another pod's 500m: waits,
    // Deferred, the container keeps its resources
    let mut filler = pod()?;
    filler.metadata.name = Some("filler".into());
    if let Some(spec) = filler.spec.as_mut() {
        spec.containers.truncate(1);
        spec.containers[0].resources = Some(serde_json::from_value(
            serde_json::json!({"requests": {"cpu": "500m", "memory": "32Mi"}, "limits": {"cpu": "500m", "memory": "64Mi"}}),
        )?);
    }
    node.create_pod(&pods, &filler).await?;
    // the filler bound and running first: the scheduler counts a pending resize at its new size, so a resize
    // sent before the filler is bound keeps the filler off the node and is then applied in place (and the
    // 1800m it holds keeps every other test's pod asking for cpu off the node)
    wait_for("pod filler Running", Duration::from_secs(90), || async {
        let p = pods.get("filler").await?;
        Ok((p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).then_some(()))
    })
    .await
    .with_context(log)?;
    resize(
        &pods,
        serde_json::json!({"requests": {"cpu": "1800m", "memory": "32Mi"}, "limits": {"cpu": "1800m", "memory": "64Mi"}}),
    )
    .await?;
    let pending = wait_for("PodResizePending", Duration::from_secs(60), || async {
        let p = pods.get("resized").await?;
        Ok(condition(&p, "PodResizePending"))
    })
    .await
    .with_context(log)?;
    assert_eq!(pending.status, "True");
    assert_eq!(pending.reason.as_deref(), Some("Deferred"));
    let message = pending.message.clone().unwrap_or_default();
    assert!(
        message.starts_with("Node didn't have enough resource: cpu, requested: 1900, used: "),
        "{message}"
    );
    let p = pods.get("resized").await?;
    let (limit, allocated, _, _) = cpu_seen(&p, "main").context("main's status")?;
    assert_eq!(
        (limit.as_str(), allocated.as_str()),
        ("400m", "300m"),
        "the allocation stays"
    );
    assert_eq!(read("cpu", &main_cgroup, "cpu.cfs_quota_us")?, "40000");
    println!("[real_node] a 1800m resize beside another pod waits: {message}");

    // memory with RestartContainer: main restarts with the new limit, other keeps running
    resize(
        &pods,
        serde_json::json!({"requests": {"cpu": "300m", "memory": "32Mi"}, "limits": {"cpu": "400m", "memory": "96Mi"}}),
    )
    .await?;
    let restarted = wait_for("main restarted at 96Mi", Duration::from_secs(90), || async {
        let p = pods.get("resized").await?;
        let main = status_of(&p, "main");
        let done = main.as_ref().is_some_and(|s| {
            s.restart_count == 1
                && s.state.as_ref().is_some_and(|st| st.running.is_some())
                && quantity(s.resources.as_ref().and_then(|r| r.limits.as_ref()), "memory").as_deref()
                    == Some("96Mi")
        }) && condition(&p, "PodResizePending").is_none();
        Ok(done.then_some(p))
    })
    .await
    .with_context(log)?;
    let main = status_of(&restarted, "main").context("main")?;
    let new_id = main.container_id.clone().context("main's ID")?;
    assert_ne!(new_id, main_id, "a new container");
    let other = status_of(&restarted, "other").context("other")?;
    assert_eq!(
        other.container_id.as_deref(),
        Some(other_id.as_str()),
        "other untouched"
    );
    assert_eq!(other.restart_count, 0);
    assert_eq!(
        read(
            "memory",
            &format!("{pod_cgroup}/{}", bare(&new_id)),
            "memory.limit_in_bytes"
        )?,
        (96u64 << 20).to_string()
    );
    println!("[real_node] memory resize with RestartContainer: main restarted once (96Mi), other untouched");

    pods.delete("resized", &DeleteParams::default()).await?;
    pods.delete("filler", &DeleteParams::default()).await?;
    Ok(())
}
