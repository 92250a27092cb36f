//! Graceful node shutdown on the real node of a machine without systemd-logind: with `shutdownGracePeriod:
//! 10s`, `shutdownGracePeriodCriticalPods: 3s` and `--shutdown-trigger=sigterm`, SIGTERM to node-agent stops the node's pods on containerd — regular
//! pods first, within 7 s, then the critical ones within 3 s — reports each Failed with the kubelet's
//! `Terminated` reason and message, marks the Node NotReady (`node is shutting down`) with a `NodeShutdown`
//! event, and only then exits. The order is read from the containers themselves: the regular pod takes 2 s to
//! leave after its SIGTERM and writes the time it leaves as its termination message; the critical pod writes
//! the time its SIGTERM reaches it (the machine's uptime, one clock for both), which must come after. A binary of its own (its own node), since it stops the agent that every test of
//! the node shares. Needs root (or `NODE_AGENT_SKIP_REAL_NODE=1` to skip).

/// The containerd the node runs on (Debian's 1.6).
const CONTAINERD: &str = "1.6";

#[allow(dead_code)]
#[path = "real_node/harness.rs"]
mod harness;

use std::time::{Duration, Instant};

use anyhow::Context;
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
        extra_config: "shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 3s\n".into(),
        // this host has no logind: SIGTERM is the machine's shutdown
        extra_args: vec!["--shutdown-trigger=sigterm".into()],
        ..Default::default()
    };
    let Some(node) = RealNode::get_with(&options).await? else {
        return Ok(());
    };
    let apps = node.namespace(NS).await?;
    let system = node.namespace("kube-system").await?;
    // the regular pod leaves 2 s after its SIGTERM, noting when; the critical one notes when its SIGTERM comes,
    // keeps running and is killed after its 3 s
    let app = node
        .create_pod(
            &apps,
            &pod(
                "app",
                "trap 'sleep 2; read up _ </proc/uptime; echo \"$up\" >/dev/termination-log; exit 0' TERM; \
                 while true; do sleep 1 & wait $!; done",
                false,
            )?,
        )
        .await?;
    let crit = node
        .create_pod(
            &system,
            &pod(
                "crit",
                "trap 'read up _ </proc/uptime; echo \"$up\" >/dev/termination-log' TERM; \
                 while true; do sleep 1 & wait $!; done",
                true,
            )?,
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

    let mut noted = Vec::new();
    for (api, name, pod) in [(&apps, "app", &app), (&system, "crit", &crit)] {
        let status = api.get(name).await?.status.unwrap_or_default();
        let terminated = status
            .container_statuses
            .iter()
            .flatten()
            .find_map(|c| c.state.as_ref()?.terminated.clone())
            .with_context(|| format!("{name}: no terminated container in {status:?}"))?;
        println!(
            "[real_node_shutdown] {name}: exit {} at {:?}, noted uptime {:?}",
            terminated.exit_code,
            terminated.finished_at.as_ref().map(|t| t.0),
            terminated.message
        );
        let at: f64 = terminated
            .message
            .as_deref()
            .unwrap_or_default()
            .trim()
            .parse()
            .with_context(|| format!("{name}'s termination message {:?}", terminated.message))?;
        noted.push((at, terminated.finished_at.map(|t| t.0)));
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
    // regular pods first: the critical pod was asked to stop only after the regular one had left
    let ((app_left, app_finished), (crit_asked, crit_finished)) = (noted[0], noted[1]);
    println!(
        "[real_node_shutdown] the critical pod got SIGTERM {:.2} s after the regular pod left",
        crit_asked - app_left
    );
    assert!(
        crit_asked >= app_left,
        "the critical pod was stopped before the regular one had finished: SIGTERM at uptime {crit_asked}, \
         regular pod left at {app_left}"
    );
    assert!(
        crit_finished >= app_finished,
        "finishedAt: critical {crit_finished:?} before regular {app_finished:?}"
    );

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
