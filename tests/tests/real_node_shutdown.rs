//! Graceful node shutdown on the real node: with `shutdownGracePeriod: 8s` and
//! `shutdownGracePeriodCriticalPods: 3s`, SIGTERM to node-agent stops the node's pods on containerd — regular
//! pods first, within 5 s, then the critical ones within 3 s — reports each Failed with the kubelet's
//! `Terminated` reason and message, marks the Node NotReady (`node is shutting down`) with a `NodeShutdown`
//! event, and only then exits. A binary of its own (its own node), since it stops the agent that every test of
//! the node shares. Needs root and `NODE_AGENT_CONTAINERD_SETUP=1`.

/// The containerd the node runs on (Debian's 1.6).
const CONTAINERD: &str = "1.6";

#[allow(dead_code)]
#[path = "real_node/harness.rs"]
mod harness;

use std::time::{Duration, Instant};

use e2e::{init_logging, wait_for};
use harness::{NODE, NodeOptions, RealNode};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::Api;
use kube::api::ListParams;
use runtime_api::{Runtime, cri};

const NS: &str = "rn-shutdown";

fn pod(name: &str, script: &str, critical: bool) -> anyhow::Result<Pod> {
    let mut spec = serde_json::json!({
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 30,
        "containers": [{"name": "main", "image": "localhost/busybox:local", "command": ["sh", "-c", script]}],
    });
    if critical {
        spec["priorityClassName"] = "system-node-critical".into();
    }
    Ok(serde_json::from_value(
        serde_json::json!({"metadata": {"name": name}, "spec": spec}),
    )?)
}

/// Running containers containerd holds for the pod with this uid.
async fn running(node: &RealNode, uid: &str) -> anyhow::Result<usize> {
    let cri = node.cri().await?;
    let items = cri
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                label_selector: [("io.kubernetes.pod.uid".to_owned(), uid.to_owned())].into(),
                state: Some(cri::ContainerStateValue {
                    state: cri::ContainerState::ContainerRunning as i32,
                }),
                ..Default::default()
            }),
        })
        .await?
        .containers;
    Ok(items.len())
}

#[tokio::test]
async fn sigterm_shuts_the_node_down_gracefully() -> anyhow::Result<()> {
    init_logging();
    let options = NodeOptions {
        extra_config: "shutdownGracePeriod: 8s\nshutdownGracePeriodCriticalPods: 3s\n".into(),
        ..Default::default()
    };
    let Some(node) = RealNode::get_with(&options).await? else {
        println!("[real_node_shutdown] skipped: needs root and NODE_AGENT_CONTAINERD_SETUP=1 ({CONTAINERD})");
        return Ok(());
    };
    let apps = node.namespace(NS).await?;
    let system = node.namespace("kube-system").await?;
    // the regular pod leaves at once on SIGTERM; the critical one ignores it and is killed after its 3 s
    let app = node
        .create_pod(
            &apps,
            &pod("app", "trap 'exit 0' TERM; while true; do sleep 1; done", false)?,
        )
        .await?;
    let crit = node
        .create_pod(
            &system,
            &pod("crit", "trap '' TERM; while true; do sleep 1; done", true)?,
        )
        .await?;
    let uid = |p: &Pod| p.metadata.uid.clone().unwrap_or_default();
    for (api, name) in [(&apps, "app"), (&system, "crit")] {
        wait_for(&format!("{name} Running"), Duration::from_secs(60), || async {
            let phase = api.get(name).await?.status.and_then(|s| s.phase);
            Ok((phase.as_deref() == Some("Running")).then_some(()))
        })
        .await?;
    }
    assert_eq!(running(node, &uid(&app)).await?, 1);
    assert_eq!(running(node, &uid(&crit)).await?, 1);

    let t0 = Instant::now();
    node.stop_agent(Duration::from_secs(40)).await?;
    let took = t0.elapsed();
    println!("[real_node_shutdown] node-agent exited {took:?} after SIGTERM");
    println!("[real_node_shutdown] agent log:\n{}", node.agent_log_tail());

    for (api, name, pod) in [(&apps, "app", &app), (&system, "crit", &crit)] {
        let status = api.get(name).await?.status.unwrap_or_default();
        println!(
            "[real_node_shutdown] {name}: {:?} {:?} {:?}",
            status.phase, status.reason, status.message
        );
        assert_eq!(status.phase.as_deref(), Some("Failed"), "{name}");
        assert_eq!(status.reason.as_deref(), Some("Terminated"), "{name}");
        assert_eq!(
            status.message.as_deref(),
            Some("Pod was terminated in response to imminent node shutdown."),
            "{name}"
        );
        assert_eq!(running(node, &uid(pod)).await?, 0, "{name} stopped in containerd");
    }
    let admin = node.cp.admin_client().await?;
    let n = Api::<Node>::all(admin.clone()).get(NODE).await?;
    let ready = n
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap_or_default();
    println!(
        "[real_node_shutdown] Ready={} ({:?})",
        ready.status, ready.message
    );
    assert_eq!(ready.status, "False");
    assert!(
        ready
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("node is shutting down"),
        "{:?}",
        ready.message
    );
    let events = Api::<Event>::all(admin)
        .list(&ListParams::default().fields(&format!("involvedObject.name={NODE}")))
        .await?;
    assert!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("NodeShutdown")),
        "a NodeShutdown event"
    );
    Ok(())
}
