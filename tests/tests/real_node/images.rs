//! Images from a real registry on loopback (the CNCF distribution registry, with basic authentication): a
//! private image is refused without credentials (`ErrImagePull`, then `ImagePullBackOff`), pulled with the
//! pod's `imagePullSecrets` (`Pulling` / `Pulled` events) and runs; a tag that does not exist backs off.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use e2e::{init_logging, wait_for};
use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use kube::Api;
use kube::api::{ListParams, PostParams};

use super::harness::{LoopbackRegistry, RealNode, scripts};

const NS: &str = "rn-images";

/// A registry with `alice:secret` basic auth holding the node's busybox as `private/busybox:1`; stopped on drop.
fn registry(node: &RealNode) -> anyhow::Result<LoopbackRegistry> {
    let registry = LoopbackRegistry::start(node, "images", Some("alice:secret"))?;
    let rootfs = node.containerd_dir.join("images/busybox-rootfs");
    push(&rootfs, &format!("{}/private/busybox:1", registry.addr))?;
    Ok(registry)
}

fn push(rootfs: &Path, reference: &str) -> anyhow::Result<()> {
    let out = Command::new("python3")
        .arg(scripts().join("oci_image.py"))
        .args([
            "--rootfs",
            &rootfs.display().to_string(),
            "--ref",
            "busybox",
            "--cmd",
            r#"["sh"]"#,
        ])
        .args(["--push", reference, "--auth", "alice:secret"])
        .output()
        .context("oci_image.py --push")?;
    if !out.status.success() {
        bail!(
            "pushing {reference} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Builds the node's busybox as `reference` with the image config's `User` set to `user`, and imports it into
/// the node's containerd (namespace `k8s.io`), as setup.sh imports the base images.
pub(super) fn import_with_user(node: &RealNode, reference: &str, user: &str) -> anyhow::Result<()> {
    let rootfs = node.containerd_dir.join("images/busybox-rootfs");
    let tar = node
        .containerd_dir
        .join("images")
        .join(format!("{}.tar", reference.replace(['/', ':'], "_")));
    let out = Command::new("python3")
        .arg(scripts().join("oci_image.py"))
        .args(["--rootfs", &rootfs.display().to_string(), "--ref", reference])
        .args(["--cmd", r#"["sh"]"#, "--user", user])
        .args(["--out", &tar.display().to_string()])
        .output()
        .context("oci_image.py --out")?;
    if !out.status.success() {
        bail!(
            "building {reference} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = Command::new("ctr")
        .args([
            "--address",
            &node.socket.display().to_string(),
            "-n",
            "k8s.io",
            "images",
            "import",
        ])
        .arg(&tar)
        .output()
        .context("ctr images import")?;
    if !out.status.success() {
        bail!(
            "importing {reference} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn pod(name: &str, image: &str, secret: bool) -> anyhow::Result<Pod> {
    let mut spec = serde_json::json!({
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": image, "imagePullPolicy": "Always",
                        "command": ["sh", "-c", "echo pulled; while :; do sleep 1; done"]}],
    });
    if secret {
        spec["imagePullSecrets"] = serde_json::json!([{"name": "regcred"}]);
    }
    Ok(serde_json::from_value(
        serde_json::json!({"metadata": {"name": name}, "spec": spec}),
    )?)
}

fn waiting_reason(p: &Pod) -> Option<String> {
    p.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .waiting
        .as_ref()?
        .reason
        .clone()
}

async fn reasons(events: &Api<Event>, pod: &str) -> anyhow::Result<Vec<String>> {
    let list = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={pod}")))
        .await?;
    Ok(list.items.into_iter().filter_map(|e| e.reason).collect())
}

#[tokio::test]
async fn private_images_pull_only_with_their_secret_and_missing_tags_back_off() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let registry = registry(node)?;
    let image = format!("{}/private/busybox:1", registry.addr);
    println!("[real_node] registry at {} with {image}", registry.addr);
    let pods = node.namespace(NS).await?;
    let client = node.cp.admin_client().await?;
    let events: Api<Event> = Api::namespaced(client.clone(), NS);

    // no credentials: refused by the registry
    node.create_pod(&pods, &pod("anonymous", &image, false)?).await?;
    wait_for(
        "anonymous in ImagePullBackOff",
        Duration::from_secs(60),
        || async {
            let p = pods.get("anonymous").await?;
            Ok((waiting_reason(&p).as_deref() == Some("ImagePullBackOff")).then_some(()))
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    // events are written on their own, after the status that reports the back-off
    let seen = wait_for("the BackOff event", Duration::from_secs(15), || async {
        let seen = reasons(&events, "anonymous").await?;
        Ok(seen.iter().any(|s| s == "BackOff").then_some(seen))
    })
    .await?;
    for r in ["Pulling", "Failed", "BackOff"] {
        assert!(seen.iter().any(|s| s == r), "{r} among {seen:?}");
    }

    // with the pod's imagePullSecrets: pulled and running
    let auth = base64_encode("alice:secret");
    let config = serde_json::json!({"auths": {registry.addr.clone(): {"auth": auth}}}).to_string();
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "regcred", "namespace": NS},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": config},
    }))?;
    Api::<Secret>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await?;
    node.create_pod(&pods, &pod("with-secret", &image, true)?).await?;
    wait_for("with-secret Running", Duration::from_secs(60), || async {
        let p = pods.get("with-secret").await?;
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        Ok((phase == Some("Running")).then_some(()))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    // events are written on their own, after the status the wait above saw
    wait_for("with-secret: a Pulled event", Duration::from_secs(30), || async {
        let seen = reasons(&events, "with-secret").await?;
        Ok(seen.iter().any(|s| s == "Pulled").then_some(()))
    })
    .await?;

    // a tag that does not exist: ErrImagePull, then back-off
    let missing = format!("{}/private/busybox:nope", registry.addr);
    node.create_pod(&pods, &pod("missing-tag", &missing, true)?)
        .await?;
    wait_for(
        "missing-tag in ImagePullBackOff",
        Duration::from_secs(60),
        || async {
            let p = pods.get("missing-tag").await?;
            Ok((waiting_reason(&p).as_deref() == Some("ImagePullBackOff")).then_some(()))
        },
    )
    .await?;
    // both Failed events: the pull's error and "Error: ErrImagePull" (events are written on their own limit,
    // after the status that shows the back-off, so they may trail it)
    let pull_error = format!("Failed to pull image \"{missing}\"");
    let failed_events = || async {
        Ok::<_, anyhow::Error>(
            events
                .list(&ListParams::default().fields("involvedObject.name=missing-tag"))
                .await?
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("Failed"))
                .filter_map(|e| e.message)
                .collect::<Vec<String>>(),
        )
    };
    let both = |failed: &[String]| {
        failed.iter().any(|m| m.starts_with(&pull_error)) && failed.iter().any(|m| m == "Error: ErrImagePull")
    };
    let waited = wait_for(
        "missing-tag's two Failed events",
        Duration::from_secs(30),
        || async {
            let failed = failed_events().await?;
            Ok(both(&failed).then_some(()))
        },
    )
    .await;
    if waited.is_err() {
        let failed = failed_events().await?;
        bail!("missing-tag's two Failed events not both written within 30 s: {failed:?}");
    }
    Ok(())
}

fn base64_encode(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}
