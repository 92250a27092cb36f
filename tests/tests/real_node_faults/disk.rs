//! A full disk under the pods' state: the agent's `pods` directory (where each pod's volumes, `etc-hosts` and
//! termination-message files live) on a 2 MiB tmpfs that a file of the test then fills. A pod running before
//! keeps running untouched; a new pod with a configMap volume does not start, and says why in the kubelet's
//! words (an event naming the volume and "no space left on device"), leaving no half-written file behind —
//! no temporary file, no truncated `etc-hosts` or volume file; once space is freed it starts by itself, its
//! files whole. Then everything is cleaned up as usual.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use e2e::{init_logging, wait_for};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod};
use kube::Api;
use kube::api::{ListParams, PostParams};

use super::harness::RealNode;
use super::{all_running, delete_all, main_container, name, node, sleeper, uid, wait_clean};

const NS: &str = "rf-disk";

/// A pod of [`sleeper`]'s kind that also mounts the configMap `cfg` at `/cfg`.
fn with_config(pod_name: &str) -> anyhow::Result<Pod> {
    let mut pod = sleeper(pod_name)?;
    let spec = pod.spec.as_mut().context("spec")?;
    spec.volumes
        .get_or_insert_default()
        .push(serde_json::from_value(serde_json::json!({
            "name": "cfg", "configMap": {"name": "cfg"},
        }))?);
    spec.containers[0]
        .volume_mounts
        .get_or_insert_default()
        .push(serde_json::from_value(
            serde_json::json!({"name": "cfg", "mountPath": "/cfg"}),
        )?);
    Ok(pod)
}

/// Fills the file system of `dir` with one file (`dir/filler`); answers its size.
fn fill(dir: &Path) -> anyhow::Result<u64> {
    let mut f = std::fs::File::create(dir.join("filler"))?;
    let chunk = vec![0u8; 16 * 1024];
    let mut size = 0;
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(n) => size += n as u64,
            Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
            Err(e) => return Err(e.into()),
        }
    }
    // the last partial page too
    while let Ok(1) = f.write(&[0u8]) {
        size += 1;
    }
    Ok(size)
}

/// Files below `dir` a crash or a failed write could leave half-written: temporary files of the atomic writer.
fn temp_files(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let n = e.file_name().to_string_lossy().into_owned();
            if n.contains(".tmp") {
                found.push(p.display().to_string());
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            }
        }
    }
    found
}

/// The `etc-hosts` of a pod, if written: whole (its header and the pod's own line) or not there at all.
fn check_etc_hosts(node: &RealNode, pod_uid: &str, pod_name: &str) -> anyhow::Result<bool> {
    let path = node.agent_root.join("pods").join(pod_uid).join("etc-hosts");
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            if !(text.starts_with("# Kubernetes-managed hosts file")
                && text.contains(pod_name)
                && text.ends_with('\n'))
            {
                bail!("{} half-written: {text:?}", path.display());
            }
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[tokio::test]
async fn a_full_disk_under_the_pods_fails_new_pods_cleanly_until_space_is_freed() -> anyhow::Result<()> {
    init_logging();
    let Some((node, _serial)) = node().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let client = node.cp.admin_client().await?;
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "cfg"},
        "data": {"settings": "x".repeat(64 * 1024)},
    }))?;
    Api::<ConfigMap>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &cm)
        .await?;
    // no pod on the node: the pods directory is empty and can take the small file system
    wait_clean(node).await?;
    let pods_dir = node.agent_root.join("pods");
    std::fs::create_dir_all(&pods_dir)?;
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "na-full-disk"])
        .arg(&pods_dir)
        .status()?;
    anyhow::ensure!(
        status.success(),
        "mounting a tmpfs on {}: {status}",
        pods_dir.display()
    );
    let result = full_disk(node, &pods, &pods_dir).await;
    // whatever happened, the pods go and the file system with them
    let cleanup = async {
        delete_all(node, &pods).await?;
        let _ = std::fs::remove_file(pods_dir.join("filler"));
        wait_clean(node).await?;
        let status = Command::new("umount").arg(&pods_dir).status()?;
        anyhow::ensure!(status.success(), "unmounting {}: {status}", pods_dir.display());
        anyhow::Ok(())
    }
    .await;
    result.and(cleanup)
}

async fn full_disk(node: &RealNode, pods: &Api<Pod>, pods_dir: &Path) -> anyhow::Result<()> {
    let events: Api<Event> = Api::namespaced(node.cp.admin_client().await?, NS);
    node.create_pod(pods, &with_config("before")?).await?;
    let before = all_running(node, pods, 1, Duration::from_secs(90)).await?;
    let before_container = main_container(&before[0]).1;
    let filled = fill(pods_dir)?;

    node.create_pod(pods, &with_config("after")?).await?;
    let after_uid = uid(&pods.get("after").await?);
    let t0 = Instant::now();
    let refusal = wait_for(
        "an event of the new pod saying the disk is full",
        Duration::from_secs(90),
        || async {
            let list = events
                .list(&ListParams::default().fields("involvedObject.name=after"))
                .await?;
            // the OS's words, as Go ("no space ...") and Rust ("No space ...") print them
            Ok(list.items.into_iter().find(|e| {
                e.message
                    .as_deref()
                    .unwrap_or_default()
                    .to_ascii_lowercase()
                    .contains("no space left on device")
            }))
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    let refused_after = t0.elapsed();
    let p = pods.get("after").await?;
    assert!(
        !main_container(&p).0,
        "a pod on a full disk is not Running: {:?}",
        p.status
    );
    assert!(
        temp_files(pods_dir).is_empty(),
        "half-written files: {:?}",
        temp_files(pods_dir)
    );
    check_etc_hosts(node, &after_uid, "after")?;
    let p = pods.get("before").await?;
    let (ready, id, restarts) = main_container(&p);
    assert!(
        ready && restarts == 0 && id == before_container,
        "the running pod untouched: {:?}",
        p.status
    );

    std::fs::remove_file(pods_dir.join("filler"))?;
    let freed = Instant::now();
    let all = all_running(node, pods, 2, Duration::from_secs(120)).await?;
    let started_after = freed.elapsed();
    assert!(
        check_etc_hosts(node, &after_uid, "after")?,
        "etc-hosts written once there is room"
    );
    let settings = pods_dir
        .join(&after_uid)
        .join("volumes/kubernetes.io~configmap/cfg/settings");
    let text = std::fs::read_to_string(&settings).with_context(|| settings.display().to_string())?;
    assert_eq!(text.len(), 64 * 1024, "the configMap file whole");
    assert!(temp_files(pods_dir).is_empty(), "{:?}", temp_files(pods_dir));
    println!(
        "[real_node_faults] pods directory full ({filled} bytes of filler on a 2 MiB tmpfs): the new pod refused \
         after {refused_after:?} ({}: {}), the running one untouched; Running {started_after:?} after space was \
         freed ({} pods)",
        refusal.reason.as_deref().unwrap_or_default(),
        refusal.message.as_deref().unwrap_or_default(),
        all.iter().map(name).collect::<Vec<_>>().join(", ")
    );
    Ok(())
}
