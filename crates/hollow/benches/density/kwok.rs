//! KWOK beside the hollow fleet: its binary built from the Go module proxy on first use (`hack/build-kwok.sh`,
//! a pinned release cached like the Kubernetes binaries, with the stages kwokctl would give it), started
//! against a control plane, and the Node objects it is to manage (KWOK registers none: a user creates them).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;

/// The annotation KWOK is told to manage nodes by.
const MANAGED: &str = "kwok.x-k8s.io/node";

/// The KWOK binary (and its stages file beside it), built into the cache when missing.
pub fn binary() -> anyhow::Result<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hack/build-kwok.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", script.display(), out.status);
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Starts KWOK on the cluster of `kubeconfig`, managing the nodes annotated [`MANAGED`]`=fake`, with the
/// kubelet's 40 s node lease; it serves no kubelet API (no `--server-address` or `--node-port`).
pub fn start(binary: &Path, kubeconfig: &Path) -> anyhow::Result<Child> {
    let stages = binary.with_file_name("stages.yaml");
    Command::new(binary)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--config")
        .arg(&stages)
        .args([
            &format!("--manage-nodes-with-annotation-selector={MANAGED}=fake"),
            "--node-ip=127.0.0.1",
            "--node-lease-duration-seconds=40",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))
}

/// Creates `count` Node objects `<prefix>-0` … for KWOK, with the capacity of a default hollow node,
/// 64 requests in flight.
pub async fn create_nodes(client: &kube::Client, prefix: &str, count: usize) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let creates = (0..count).map(|i| {
        let nodes = nodes.clone();
        let name = format!("{prefix}-{i}");
        async move {
            let node: Node = serde_json::from_value(serde_json::json!({
                "metadata": {
                    "name": name,
                    "annotations": {MANAGED: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok"},
                },
                "status": {
                    "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110", "ephemeral-storage": "100Gi"},
                    "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110", "ephemeral-storage": "100Gi"},
                },
            }))?;
            nodes.create(&PostParams::default(), &node).await?;
            anyhow::Ok(())
        }
    });
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(creates)
        .buffer_unordered(64)
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    Ok(())
}
