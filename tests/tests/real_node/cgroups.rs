//! QoS cgroups on the real node, as the kernel and the container see them: each pod runs in its pod cgroup under
//! the QoS class's cgroup (`<cgroupRoot>/kubepods/burstable/pod<uid>` for a Burstable pod,
//! `…/besteffort/pod<uid>`, and `…/kubepods/pod<uid>` for a Guaranteed one), the pod cgroup carries the pod's
//! limits (memory limit, cpu shares and CFS quota), and it is removed with the pod.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;
use runtime_api::{Runtime, cri};

use super::harness::RealNode;

const NS: &str = "rn-cgroups";

fn pod(name: &str, resources: serde_json::Value) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:local",
                "command": ["sh", "-c", "while :; do sleep 1; done"],
                "resources": resources,
            }],
        },
    }))?)
}

/// The pod once Running: its UID and its container's runtime ID.
async fn running(node: &RealNode, pods: &Api<Pod>, name: &str) -> anyhow::Result<(String, String)> {
    let p = wait_for(
        &format!("pod {name} Running"),
        Duration::from_secs(90),
        || async {
            let p = pods.get(name).await?;
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            Ok((phase == Some("Running")).then_some(p))
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    let uid = p.metadata.uid.clone().context("uid")?;
    let id = p
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .and_then(|c| c.container_id)
        .context("containerID")?;
    let id = id
        .strip_prefix("containerd://")
        .context("containerd's ID")?
        .to_owned();
    Ok((uid, id))
}

/// The container's own view of its cgroup in `controller` (`/proc/self/cgroup`, read with ExecSync).
async fn cgroup_in_container(node: &RealNode, id: &str, controller: &str) -> anyhow::Result<String> {
    let out = node
        .cri()
        .await?
        .exec_sync(cri::ExecSyncRequest {
            container_id: id.to_owned(),
            cmd: vec!["cat".into(), "/proc/self/cgroup".into()],
            timeout: 10,
        })
        .await?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == controller)
                .then(|| path.to_owned())
        })
        .with_context(|| format!("no {controller} line in {text:?}"))
}

fn host(controller: &str, cgroup: &str) -> PathBuf {
    Path::new("/sys/fs/cgroup")
        .join(controller)
        .join(cgroup.trim_start_matches('/'))
}

fn read(controller: &str, cgroup: &str, file: &str) -> anyhow::Result<String> {
    let path = host(controller, cgroup).join(file);
    Ok(std::fs::read_to_string(&path)
        .with_context(|| path.display().to_string())?
        .trim()
        .to_owned())
}

#[tokio::test]
async fn pods_run_in_their_qos_and_pod_cgroups_with_the_pods_limits() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let kubepods = format!("{}/kubepods", node.cgroup_root);
    // requests without a cpu limit: Burstable, memory limit declared by its only container
    let burstable = pod(
        "burstable",
        serde_json::json!({"requests": {"cpu": "100m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}}),
    )?;
    let guaranteed = pod(
        "guaranteed",
        serde_json::json!({"limits": {"cpu": "200m", "memory": "32Mi"}}),
    )?;
    let best_effort = pod("besteffort", serde_json::json!({}))?;
    for p in [&burstable, &guaranteed, &best_effort] {
        node.create_pod(&pods, p).await?;
    }

    let (uid, id) = running(node, &pods, "burstable").await?;
    let pod_cgroup = format!("{kubepods}/burstable/pod{uid}");
    let seen = cgroup_in_container(node, &id, "memory").await?;
    assert_eq!(
        seen,
        format!("{pod_cgroup}/{id}"),
        "the container's memory cgroup"
    );
    assert_eq!(
        read("memory", &pod_cgroup, "memory.limit_in_bytes")?,
        (64u64 << 20).to_string(),
        "the pod cgroup's memory limit"
    );
    assert_eq!(
        read("cpu", &pod_cgroup, "cpu.shares")?,
        "102",
        "100m of cpu requested"
    );
    assert_eq!(
        read("cpu", &pod_cgroup, "cpu.cfs_quota_us")?,
        "-1",
        "no cpu limit: no quota"
    );
    let burstable_shares: i64 = read("cpu", &format!("{kubepods}/burstable"), "cpu.shares")?.parse()?;
    assert!(
        burstable_shares >= 102,
        "the burstable class's shares cover its pods: {burstable_shares}"
    );
    println!("[real_node] Burstable pod in {seen}: memory limit 64Mi, cpu.shares 102");

    let (g_uid, g_id) = running(node, &pods, "guaranteed").await?;
    let g_cgroup = format!("{kubepods}/pod{g_uid}");
    assert_eq!(
        cgroup_in_container(node, &g_id, "cpu").await?,
        format!("{g_cgroup}/{g_id}")
    );
    assert_eq!(
        read("cpu", &g_cgroup, "cpu.cfs_quota_us")?,
        "20000",
        "200m over a 100 ms period"
    );
    assert_eq!(
        read("memory", &g_cgroup, "memory.limit_in_bytes")?,
        (32u64 << 20).to_string()
    );

    let (be_uid, be_id) = running(node, &pods, "besteffort").await?;
    let be_cgroup = format!("{kubepods}/besteffort/pod{be_uid}");
    assert_eq!(
        cgroup_in_container(node, &be_id, "memory").await?,
        format!("{be_cgroup}/{be_id}")
    );
    assert_eq!(read("cpu", &be_cgroup, "cpu.shares")?, "2");
    assert_eq!(read("cpu", &format!("{kubepods}/besteffort"), "cpu.shares")?, "2");

    pods.delete("burstable", &DeleteParams::default()).await?;
    wait_for(
        "the burstable pod's cgroup removed",
        Duration::from_secs(60),
        || async {
            let gone = pods.get_opt("burstable").await?.is_none();
            Ok(
                (gone && !host("memory", &pod_cgroup).exists() && !host("cpu", &pod_cgroup).exists())
                    .then_some(()),
            )
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    for name in ["guaranteed", "besteffort"] {
        pods.delete(name, &DeleteParams::default()).await?;
    }
    Ok(())
}
