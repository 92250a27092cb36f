//! Garbage collection on the real node: a crash-looping pod's dead containers are removed from containerd down to
//! `--maximum-dead-containers-per-container=2` (their log files with them) while `kubectl logs --previous` still
//! shows the previous instance and the restart count keeps rising; with the image filesystem thresholds below its
//! usage, the image of a deleted pod is removed from containerd while the images of running pods and the sandbox
//! image stay, and the agent says what it removed.
//!
//! The node's settings are this binary's own ([`options`]): image GC at 1 %/0 % with a minimum age of 1 s removes
//! every unused image, which would take the imported images other test binaries' pods use. Every pod here runs
//! an image from a registry on loopback, so nothing here depends on an image that cannot be pulled again. The
//! collection periods are node-agent's own flags, shortened (10 s and 15 s instead of 1 min and 5 min).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use e2e::{init_logging, wait_for};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use runtime_api::{Runtime, cri};

use super::harness::{LoopbackRegistry, NODE, NodeOptions, RealNode, scripts};

const NS: &str = "rn-gc";

/// The node's settings for this binary (log rotation's too: `log_rotation.rs`).
pub fn options() -> NodeOptions {
    NodeOptions {
        extra_args: [
            "--maximum-dead-containers-per-container=2",
            "--container-gc-period=10s",
            "--image-gc-period=15s",
        ]
        .map(String::from)
        .into(),
        extra_config:
            "imageGCHighThresholdPercent: 1\nimageGCLowThresholdPercent: 0\nimageMinimumGCAge: 1s\n\
                       containerLogMaxSize: 2Mi\ncontainerLogMaxFiles: 10\ncontainerLogMaxWorkers: 2\n\
                       containerLogMonitorInterval: 3s\n"
                .into(),
        ..Default::default()
    }
}

/// An anonymous registry on loopback holding the node's busybox under several tags, each a distinct image (its
/// own config, shared layer); stopped on drop.
pub struct Registry(LoopbackRegistry);

impl Registry {
    pub fn start(node: &RealNode, name: &str, tags: &[&str]) -> anyhow::Result<Self> {
        let registry = Self(LoopbackRegistry::start(node, name, None)?);
        let rootfs = node.containerd_dir.join("images/busybox-rootfs");
        for tag in tags {
            registry.push(&rootfs, tag)?;
        }
        Ok(registry)
    }

    pub fn image(&self, tag: &str) -> String {
        format!("{}/gc/busybox:{tag}", self.0.addr)
    }

    fn push(&self, rootfs: &Path, tag: &str) -> anyhow::Result<()> {
        let out = Command::new("python3")
            .arg(scripts().join("oci_image.py"))
            .args(["--rootfs", &rootfs.display().to_string(), "--ref", "busybox"])
            .args(["--cmd", r#"["sh"]"#, "--label", &format!("variant={tag}")])
            .args(["--push", &self.image(tag)])
            .output()
            .context("oci_image.py --push")?;
        if !out.status.success() {
            bail!("pushing {tag} failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }
}

fn pod(name: &str, image: &str, script: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
                 "volumes": [{"name": "data", "emptyDir": {}}],
                 "containers": [{"name": "main", "image": image, "command": ["sh", "-c", script],
                                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]},
    }))?)
}

/// `kubectl -n rn-gc <args>`: exit code and stdout (stderr appended on failure).
fn kubectl(node: &RealNode, args: &[&str]) -> anyhow::Result<(i32, String)> {
    let out = node
        .cp
        .kubectl()
        .args(["-n", NS])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running kubectl")?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        text.push_str(&String::from_utf8_lossy(&out.stderr));
    }
    Ok((out.status.code().unwrap_or(-1), text))
}

fn restart_count(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map_or(0, |c| c.restart_count)
}

/// The exited containers containerd holds for pod `uid`, and all of its containers.
async fn exited(node: &RealNode, uid: &str) -> anyhow::Result<(usize, usize)> {
    let list = node
        .cri()
        .await?
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                label_selector: [("io.kubernetes.pod.uid".to_owned(), uid.to_owned())].into(),
                ..Default::default()
            }),
        })
        .await?
        .containers;
    let exited = list
        .iter()
        .filter(|c| c.state == cri::ContainerState::ContainerExited as i32)
        .count();
    Ok((exited, list.len()))
}

/// The number an instance printed (`attempt-N`).
fn attempt(text: &str) -> Option<u32> {
    text.trim().strip_prefix("attempt-")?.parse().ok()
}

#[tokio::test]
async fn dead_containers_are_collected_down_to_the_policy_and_previous_logs_stay() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get_with(&options()).await? else {
        return Ok(());
    };
    let registry = Registry::start(node, "crash", &["crash"])?;
    let pods = node.namespace(NS).await?;
    // every instance counts itself in the pod's emptyDir and crashes
    let script =
        "n=$(cat /data/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /data/n; echo attempt-$n; exit 1";
    let created = node
        .create_pod(&pods, &pod("crasher", &registry.image("crash"), script)?)
        .await?;
    let uid = created.metadata.uid.clone().context("uid")?;
    let t0 = Instant::now();
    // restarts come after 0, 10, 20 s of back-off: with 3, four instances have run and died (or are about to)
    let p = wait_for("crasher restarted 3 times", Duration::from_secs(180), || async {
        let p = pods.get("crasher").await?;
        Ok((restart_count(&p) >= 3).then_some(p))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    let restarts = restart_count(&p);
    // within a collection period at most two dead instances are left, fewer than have run
    let (left, total) = wait_for("at most 2 exited containers", Duration::from_secs(30), || async {
        let (exited, total) = exited(node, &uid).await?;
        Ok((exited <= 2).then_some((exited, total)))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    assert!(
        total <= usize::try_from(restarts)?,
        "{total} containers of {} instances: none removed",
        restarts + 1
    );
    println!(
        "[real_node] crasher: {restarts} restarts, {left} exited of {total} container(s) left after {:?}",
        t0.elapsed()
    );
    // the log files of the removed instances went with them
    let logs = node.pod_logs_dir.join(format!("{NS}_crasher_{uid}")).join("main");
    let files = std::fs::read_dir(&logs)
        .with_context(|| logs.display().to_string())?
        .count();
    assert!(files <= 3, "{files} log files in {}", logs.display());

    // logs: the newest instance and, with --previous, the one before it
    let (code, now) = kubectl(node, &["logs", "crasher"])?;
    let (code_prev, previous) = kubectl(node, &["logs", "crasher", "--previous"])?;
    assert_eq!((code, code_prev), (0, 0), "{now} / {previous}");
    let (now, previous) = (attempt(&now), attempt(&previous));
    assert!(
        now.is_some() && previous.is_some() && previous < now,
        "logs {now:?}, --previous {previous:?}"
    );

    // the restart count keeps rising from the instances that are left
    let p = wait_for("another restart", Duration::from_secs(200), || async {
        let p = pods.get("crasher").await?;
        Ok((restart_count(&p) > restarts).then_some(p))
    })
    .await?;
    let last = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.last_state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .map(|t| t.exit_code);
    assert_eq!(last, Some(1), "lastState after collection: {p:?}");
    pods.delete("crasher", &DeleteParams::default()).await?;
    Ok(())
}

#[tokio::test]
async fn the_image_of_a_deleted_pod_is_collected_and_images_in_use_stay() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get_with(&options()).await? else {
        return Ok(());
    };
    let registry = Registry::start(node, "images", &["old", "keep"])?;
    let pods = node.namespace(NS).await?;
    let forever = "while :; do sleep 1; done";
    let running = |name: &'static str| {
        let pods = pods.clone();
        async move {
            wait_for(&format!("{name} running"), Duration::from_secs(90), || async {
                let p = pods.get(name).await?;
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                Ok((phase == Some("Running")).then_some(()))
            })
            .await
        }
    };
    node.create_pod(&pods, &pod("old", &registry.image("old"), forever)?)
        .await?;
    node.create_pod(&pods, &pod("keep", &registry.image("keep"), forever)?)
        .await?;
    running("old").await.with_context(|| node.agent_log_tail())?;
    running("keep").await.with_context(|| node.agent_log_tail())?;
    let cri = node.cri().await?;
    let old_id = image_id(&cri, &registry.image("old"))
        .await?
        .context("old image pulled")?;

    pods.delete("old", &DeleteParams::default()).await?;
    wait_for("old deleted", Duration::from_secs(60), || async {
        Ok(pods.get_opt("old").await?.is_none().then_some(()))
    })
    .await?;
    let t0 = Instant::now();
    wait_for("the old image removed", Duration::from_secs(120), || async {
        Ok(image_id(&cri, &registry.image("old"))
            .await?
            .is_none()
            .then_some(()))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    println!(
        "[real_node] the deleted pod's image was removed {:?} after the pod was gone",
        t0.elapsed()
    );
    assert!(
        image_id(&cri, &registry.image("keep")).await?.is_some(),
        "a running pod's image stays"
    );
    assert!(
        image_id(&cri, "localhost/pause:local").await?.is_some(),
        "the sandbox image stays"
    );
    // the agent says what it removed, and that it could not reach the low threshold
    let log = std::fs::read_to_string(&node.agent_log)?;
    assert!(
        log.lines()
            .any(|l| l.contains("removing image to free bytes") && l.contains(&old_id)),
        "no log line about {old_id}:\n{}",
        node.agent_log_tail()
    );
    let events: Api<Event> = Api::namespaced(node.cp.admin_client().await?, "default");
    let reasons = wait_for("a FreeDiskSpaceFailed event", Duration::from_secs(60), || async {
        let list = events
            .list(&ListParams::default().fields(&format!("involvedObject.name={NODE}")))
            .await?;
        let found = list
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("FreeDiskSpaceFailed"));
        Ok(found.map(|e| e.message.unwrap_or_default()))
    })
    .await?;
    assert!(
        reasons.starts_with("Insufficient free disk space on the node's image filesystem"),
        "{reasons}"
    );
    pods.delete("keep", &DeleteParams::default()).await?;
    Ok(())
}

/// The id of the image containerd holds under `reference`, if any.
async fn image_id(cri: &cri_real::RemoteRuntime, reference: &str) -> anyhow::Result<Option<String>> {
    let status = cri
        .image_status(cri::ImageStatusRequest {
            image: Some(cri::ImageSpec {
                image: reference.into(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await?;
    Ok(status.image.map(|i| i.id))
}
