//! Static pods through an API server outage on the real node. A pod served at the node's `staticPodURL` (by
//! this binary, on 127.0.0.1) runs on containerd and is mirrored (`<name>-<node>`, `config.source: http`, the
//! kubelet's `config.mirror`), beside one from `staticPodPath`. The control plane's API server — this binary's
//! own — is then stopped: both static pods keep running on containerd (the same containers, never restarted),
//! and a static pod added to the URL meanwhile starts without the API server. When the server returns, the
//! new pod is mirrored, and the mirrors of the first two show the same containers, Running and Ready, no
//! restart. Removing the pods from the URL and the directory removes their mirrors and stops their sandboxes.

use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use runtime_api::{Runtime, cri};

use super::harness::{NODE, RealNode, contains};
use super::{container, node, serve_static_pods, url_reads};

const NS: &str = "rn-static-outage";
const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
const CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";

fn pod(name: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:local",
                "command": ["sh", "-c", "while :; do sleep 1; done"],
            }],
        },
    })
}

/// One pod's manifest (JSON, which is YAML too).
fn manifest(name: &str) -> String {
    pod(name).to_string()
}

/// A `PodList` of these pods: what a URL serves for more than one.
fn list(names: &[&str]) -> String {
    let items: Vec<serde_json::Value> = names.iter().map(|n| pod(n)).collect();
    serde_json::json!({"apiVersion": "v1", "kind": "PodList", "items": items}).to_string()
}

/// The running containers containerd holds for the pod named `name`: (container id, attempt).
async fn running(node: &RealNode, name: &str) -> anyhow::Result<Vec<(String, u32)>> {
    let cri = node.cri().await?;
    let items = cri
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                label_selector: [("io.kubernetes.pod.name".to_owned(), name.to_owned())].into(),
                state: Some(cri::ContainerStateValue {
                    state: cri::ContainerState::ContainerRunning as i32,
                }),
                ..Default::default()
            }),
        })
        .await?
        .containers;
    Ok(items
        .into_iter()
        .map(|c| (c.id, c.metadata.map_or(0, |m| m.attempt)))
        .collect())
}

/// Waits for the mirror pod `name` to show a Running, ready container; returns it.
async fn mirrored(pods: &Api<Pod>, name: &str) -> anyhow::Result<Pod> {
    wait_for(
        &format!("the mirror pod {name} Running and ready"),
        Duration::from_secs(60),
        || async {
            let Some(pod) = pods.get_opt(name).await? else {
                return Ok(None);
            };
            let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
            let ready = container(&pod).is_some_and(|c| c.ready && c.container_id.is_some());
            Ok((phase.as_deref() == Some("Running") && ready).then_some(pod))
        },
    )
    .await
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The container id of a pod's status as containerd names it (without the `containerd://` scheme).
fn status_container_id(pod: &Pod) -> String {
    let id = container(pod).and_then(|c| c.container_id).unwrap_or_default();
    id.rsplit("://").next().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn static_pods_outlive_an_api_server_outage() -> anyhow::Result<()> {
    init_logging();
    let Some((node, _serial)) = node().await? else {
        return Ok(());
    };
    let result = Box::pin(scenario(node)).await;
    // whatever happened, the API server is back for whoever comes next
    if node.cp.start_apiserver().await.is_ok() {
        println!("[real_node] the API server started again after a failure");
    }
    serve_static_pods("");
    let _ = std::fs::remove_file(node.manifests.join("outage-file.yaml"));
    result.with_context(|| format!("agent log:\n{}", node.agent_log_tail()))
}

async fn scenario(node: &RealNode) -> anyhow::Result<()> {
    let pods = node.namespace(NS).await?;
    serve_static_pods(&list(&["from-url"]));
    std::fs::write(node.manifests.join("outage-file.yaml"), manifest("from-file"))?;
    let (url_mirror, file_mirror) = (format!("from-url-{NODE}"), format!("from-file-{NODE}"));

    // the URL's pod runs on containerd and is mirrored, with its IP from the node's pod CIDR
    let url_pod = mirrored(&pods, &url_mirror).await?;
    assert_eq!(annotation(&url_pod, CONFIG_SOURCE), Some("http"));
    assert!(
        annotation(&url_pod, CONFIG_MIRROR).is_some(),
        "{:?}",
        url_pod.metadata.annotations
    );
    let ip: Ipv4Addr = url_pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .unwrap_or_default()
        .parse()?;
    assert!(contains(node.pod_cidr, ip), "{ip} outside the node's pod CIDR");
    let file_pod = mirrored(&pods, &file_mirror).await?;
    assert_eq!(annotation(&file_pod, CONFIG_SOURCE), Some("file"));
    let before = [
        running(node, &url_mirror).await?,
        running(node, &file_mirror).await?,
    ];
    for (pod, containers) in [&url_pod, &file_pod].into_iter().zip(&before) {
        assert_eq!(containers.len(), 1, "one running container");
        assert_eq!(containers[0].0, status_container_id(pod), "the mirror shows it");
    }
    println!(
        "[real_node] static pods from a URL ({url_mirror} at {ip}) and a file mirrored; stopping the API server"
    );

    // the API server away: the pods keep running, and a pod added to the URL starts without it
    node.cp.stop_apiserver().await?;
    let away = std::time::Instant::now();
    serve_static_pods(&list(&["from-url", "late"]));
    let late_mirror = format!("late-{NODE}");
    let late = wait_for(
        "the pod added to the URL running while the API server is away",
        Duration::from_secs(60),
        || async {
            let c = running(node, &late_mirror).await?;
            Ok((c.len() == 1).then_some(c))
        },
    )
    .await?;
    // the agent goes on without the API server: it reads its URL twice more (each read a pass of its static pod
    // sources, 5 s apart), and the static pods keep their containers all along
    let reads = url_reads();
    wait_for(
        "two more reads of the static pod URL while the API server is away",
        Duration::from_secs(60),
        || async {
            for (name, was) in [(&url_mirror, &before[0]), (&file_mirror, &before[1])] {
                let now = running(node, name).await?;
                anyhow::ensure!(
                    &now == was,
                    "{name}: the same container, not restarted: {now:?}, was {was:?}"
                );
            }
            Ok((url_reads() >= reads + 2).then_some(()))
        },
    )
    .await?;
    println!(
        "[real_node] API server away {:?}: both static pods kept their containers; {late_mirror} started ({})",
        away.elapsed(),
        late[0].0
    );
    node.cp.start_apiserver().await?;

    // back: the new pod is mirrored, the others' mirrors show the containers that ran all along
    let late_pod = mirrored(&pods, &late_mirror).await?;
    assert_eq!(status_container_id(&late_pod), late[0].0);
    assert_eq!(annotation(&late_pod, CONFIG_SOURCE), Some("http"));
    for (name, was) in [(&url_mirror, &before[0]), (&file_mirror, &before[1])] {
        let pod = mirrored(&pods, name).await?;
        assert_eq!(status_container_id(&pod), was[0].0, "{name}: the same container");
        assert_eq!(container(&pod).map(|c| c.restart_count), Some(0), "{name}");
        assert_eq!(&running(node, name).await?, was, "{name}");
    }
    println!("[real_node] after the API server returned: {late_mirror} mirrored, the others unchanged");

    // the URL and the directory emptied: mirrors gone, sandboxes stopped
    serve_static_pods("");
    std::fs::remove_file(node.manifests.join("outage-file.yaml"))?;
    for name in [&url_mirror, &file_mirror, &late_mirror] {
        wait_for(&format!("{name} removed"), Duration::from_secs(60), || async {
            let gone = pods.get_opt(name).await?.is_none() && running(node, name).await?.is_empty();
            Ok(gone.then_some(()))
        })
        .await?;
    }
    Ok(())
}
