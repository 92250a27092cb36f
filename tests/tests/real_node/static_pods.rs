//! Static pods on the real node: a manifest written to the agent's `staticPodPath` runs on containerd without
//! the API server's say-so, and is mirrored in the API (`<name>-<node>`, the kubelet's `config.mirror`
//! annotation) with its real status — Running, an IP from the node's pod CIDR; a deleted mirror pod is recreated
//! while the static pod keeps running (same container); removing the manifest stops the pod in containerd and
//! removes the mirror.

use std::net::Ipv4Addr;
use std::time::Duration;

use e2e::{init_logging, wait_for};
use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use runtime_api::{Runtime, cri};

use super::harness::{NODE, RealNode, contains};

const NS: &str = "rn-static";

/// Ready sandboxes containerd holds for the pod named `name`.
async fn ready_sandboxes(node: &RealNode, name: &str) -> anyhow::Result<usize> {
    let cri = node.cri().await?;
    let items = cri
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                label_selector: [("io.kubernetes.pod.name".to_owned(), name.to_owned())].into(),
                ..Default::default()
            }),
        })
        .await?
        .items;
    Ok(items
        .iter()
        .filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
        .count())
}

fn container_id(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .container_id
        .clone()
}

#[tokio::test]
async fn a_static_pod_runs_on_containerd_and_is_mirrored() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let manifest = node.manifests.join("web.yaml");
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: {NS}\nspec:\n  \
             terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: localhost/busybox:local\n    \
             command: [sleep, '3600']\n"
        ),
    )?;
    let mirror_name = format!("web-{NODE}");
    let running = |pods: &kube::Api<Pod>, name: String| {
        let pods = pods.clone();
        async move {
            wait_for("the mirror pod Running", Duration::from_secs(60), || async {
                let Some(pod) = pods.get_opt(&name).await? else {
                    return Ok(None);
                };
                let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
                Ok((phase.as_deref() == Some("Running") && container_id(&pod).is_some()).then_some(pod))
            })
            .await
        }
    };
    let mirror = match running(&pods, mirror_name.clone()).await {
        Ok(p) => p,
        Err(e) => anyhow::bail!("{e}\nagent log:\n{}", node.agent_log_tail()),
    };
    let annotations = mirror.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get("kubernetes.io/config.source").map(String::as_str),
        Some("file")
    );
    assert!(
        annotations.contains_key("kubernetes.io/config.mirror"),
        "{annotations:?}"
    );
    let ip: Ipv4Addr = mirror
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .unwrap_or_default()
        .parse()?;
    assert!(contains(node.pod_cidr, ip), "{ip} outside the node's pod CIDR");
    assert_eq!(ready_sandboxes(node, &mirror_name).await?, 1);
    let first = container_id(&mirror);
    println!("[real_node] static pod {mirror_name} Running at {ip} ({first:?})");

    // the mirror is only a reflection: deleted, it comes back, and the pod was not restarted
    pods.delete(&mirror_name, &DeleteParams::default()).await?;
    let old_uid = mirror.metadata.uid.clone();
    let again = wait_for("the mirror pod recreated", Duration::from_secs(60), || async {
        let pod = pods.get_opt(&mirror_name).await?;
        Ok(pod.filter(|p| p.metadata.uid != old_uid && container_id(p).is_some()))
    })
    .await?;
    assert_eq!(container_id(&again), first, "the static pod kept its container");

    // the manifest gone: the pod stops in containerd and its mirror goes
    std::fs::remove_file(&manifest)?;
    wait_for("the mirror pod removed", Duration::from_secs(60), || async {
        Ok(pods.get_opt(&mirror_name).await?.is_none().then_some(()))
    })
    .await?;
    wait_for("the sandbox stopped", Duration::from_secs(60), || async {
        Ok((ready_sandboxes(node, &mirror_name).await? == 0).then_some(()))
    })
    .await?;
    Ok(())
}
