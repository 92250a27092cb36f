//! Pods deleted while the agent was down: node-agent is stopped with a pod that has a secret volume and a
//! memory-backed emptyDir (two tmpfs mounts in its directory) and a termination-message file, the pod is deleted
//! through the API (forced: nobody is there to confirm the deletion) together with what a crash might leave —
//! a stray pod directory and pod cgroup of a pod nobody knows — and the agent is started again. It stops and
//! removes the pod's sandbox and container, unmounts and removes its directory and removes its cgroup (and
//! the strays), while a pod that still exists keeps its container, directory and mounts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

use super::harness::RealNode;
use super::{container, in_runtime, node, renew_time};

const NS: &str = "rn-orphans";

fn pod_with_volumes(name: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:local",
                "command": ["sh", "-c", "echo hello >/scratch/x; while :; do sleep 1; done"],
                "volumeMounts": [{"name": "creds", "mountPath": "/creds"}, {"name": "scratch", "mountPath": "/scratch"}],
            }],
            "volumes": [
                {"name": "creds", "secret": {"secretName": "orphan-creds"}},
                {"name": "scratch", "emptyDir": {"medium": "Memory"}},
            ],
        },
    }))?)
}

/// The mount points below `dir` (from this process's mountinfo: the agent runs in the same mount namespace).
fn mounts_below(dir: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    let prefix = format!("{}/", dir.display());
    Ok(text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(&prefix))
        .map(str::to_owned)
        .collect())
}

/// The pod's cgroup directories (`…/kubepods/besteffort/pod<uid>`) in every mounted v1 hierarchy.
fn cgroup_dirs(node: &RealNode, uid: &str) -> anyhow::Result<Vec<PathBuf>> {
    let mut dirs = Vec::new();
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup")?.flatten() {
        let dir = hierarchy
            .path()
            .join(node.cgroup_root.trim_start_matches('/'))
            .join(format!("kubepods/besteffort/pod{uid}"));
        if dir.is_dir() {
            dirs.push(dir);
        }
    }
    Ok(dirs)
}

#[tokio::test]
async fn pods_deleted_while_the_agent_was_down_leave_nothing_behind() -> anyhow::Result<()> {
    init_logging();
    let Some((node, _serial)) = node().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let client = node.cp.admin_client().await?;
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "orphan-creds"},
        "stringData": {"token": "s3cret"},
    }))?;
    Api::<Secret>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await?;
    node.create_pod(&pods, &pod_with_volumes("doomed")?).await?;
    node.create_pod(&pods, &pod_with_volumes("kept")?).await?;
    let mut running = Vec::new();
    for name in ["doomed", "kept"] {
        let p = wait_for(&format!("{name} Running"), Duration::from_secs(60), || async {
            let p = pods.get(name).await?;
            Ok(container(&p).filter(|c| c.ready).map(|_| p))
        })
        .await
        .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
        running.push(p);
    }
    let uid = |p: &Pod| p.metadata.uid.clone().unwrap_or_default();
    let (doomed, kept) = (uid(&running[0]), uid(&running[1]));
    let kept_container = container(&running[1]).and_then(|c| c.container_id);
    let pods_dir = node.agent_root.join("pods");
    let (doomed_dir, kept_dir) = (pods_dir.join(&doomed), pods_dir.join(&kept));
    // what the pod holds on the node: two tmpfs mounts, a termination-message file, its cgroup
    assert_eq!(
        mounts_below(&doomed_dir)?.len(),
        2,
        "secret and memory emptyDir mounted"
    );
    assert_eq!(mounts_below(&kept_dir)?.len(), 2);
    assert!(
        doomed_dir.join("containers/main").is_dir(),
        "termination-message directory"
    );
    let doomed_cgroups = cgroup_dirs(node, &doomed)?;
    assert!(!doomed_cgroups.is_empty(), "the pod's cgroup");

    node.stop_agent(Duration::from_secs(20)).await?;
    let stopped_at = k8s_openapi::jiff::Timestamp::now();
    // deleted while nobody runs the node: forced, as the pod garbage collector deletes pods of a gone node
    pods.delete("doomed", &DeleteParams::default().grace_period(0))
        .await?;
    wait_for("the pod gone from the API", Duration::from_secs(30), || async {
        Ok(pods.get_opt("doomed").await?.is_none().then_some(()))
    })
    .await?;
    assert_eq!(
        in_runtime(node, &doomed).await?,
        (1, 1),
        "still running while the agent is down"
    );
    // what a crash might leave of a pod nobody knows: a directory and a cgroup
    let stray = "00000000-0000-0000-0000-0000000000aa";
    std::fs::create_dir_all(pods_dir.join(stray).join("containers/main"))?;
    std::fs::write(pods_dir.join(stray).join("containers/main/0"), "bye")?;
    let stray_cgroup = PathBuf::from("/sys/fs/cgroup/memory")
        .join(node.cgroup_root.trim_start_matches('/'))
        .join(format!("kubepods/besteffort/pod{stray}"));
    std::fs::create_dir_all(&stray_cgroup)?;

    node.start_agent()?;
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    wait_for(
        "a lease renewal after the restart",
        Duration::from_secs(60),
        || async { Ok(renew_time(&leases).await?.filter(|t| *t > stopped_at).map(|_| ())) },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    let t0 = std::time::Instant::now();
    let swept = wait_for(
        "the deleted pod's sandbox, directory, mounts and cgroup gone",
        Duration::from_secs(60),
        || async {
            let gone = in_runtime(node, &doomed).await? == (0, 0)
                && !doomed_dir.exists()
                && mounts_below(&doomed_dir)?.is_empty()
                && cgroup_dirs(node, &doomed)?.is_empty()
                && !pods_dir.join(stray).exists()
                && !stray_cgroup.exists();
            Ok(gone.then_some(()))
        },
    )
    .await;
    if let Err(e) = swept {
        anyhow::bail!(
            "{e}: runtime {:?}, dir {}, mounts {:?}, cgroups {:?}, stray dir {}, stray cgroup {}\nagent log:\n{}",
            in_runtime(node, &doomed).await.ok(),
            doomed_dir.exists(),
            mounts_below(&doomed_dir).ok(),
            cgroup_dirs(node, &doomed).ok(),
            pods_dir.join(stray).exists(),
            stray_cgroup.exists(),
            node.agent_log_tail()
        );
    }
    println!(
        "[real_node] the deleted pod's sandbox, directory, 2 mounts and cgroup gone {:?} after the agent was \
         back (and a stray directory and cgroup)",
        t0.elapsed()
    );
    let log = std::fs::read_to_string(&node.agent_log)?;
    assert!(
        log.contains("removed the directory of a pod that no longer exists"),
        "the agent says what it removed"
    );

    // the pod that exists is untouched
    let p = pods.get("kept").await?;
    let now = container(&p).context("kept's status")?;
    assert_eq!(now.container_id, kept_container, "same container");
    assert_eq!(now.restart_count, 0);
    assert_eq!(in_runtime(node, &kept).await?, (1, 1));
    assert_eq!(mounts_below(&kept_dir)?.len(), 2, "its volumes still mounted");
    assert!(kept_dir.join("containers/main").is_dir());
    pods.delete("kept", &DeleteParams::default()).await?;
    Ok(())
}
