//! Termination messages on the real node: what a container writes to its `terminationMessagePath` before it exits
//! shows in `state.terminated.message`; with `terminationMessagePolicy: FallbackToLogsOnError` a failed container
//! that wrote nothing gets its log tail instead, also when its output does not end in a newline (which the log
//! shows as written, too).

use std::time::Duration;

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};
use kube::Api;

use super::harness::RealNode;

const NS: &str = "rn-termination";

fn pod(name: &str, script: &str, container: serde_json::Value) -> anyhow::Result<Pod> {
    let mut c = serde_json::json!({
        "name": "main",
        "image": "localhost/busybox:local",
        "command": ["sh", "-c", script],
    });
    if let (Some(c), serde_json::Value::Object(extra)) = (c.as_object_mut(), container) {
        c.extend(extra);
    }
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"automountServiceAccountToken": false, "restartPolicy": "Never", "containers": [c]},
    }))?)
}

async fn terminated(
    node: &RealNode,
    pods: &Api<Pod>,
    name: &str,
) -> anyhow::Result<ContainerStateTerminated> {
    wait_for(&format!("{name} terminated"), Duration::from_secs(90), || async {
        let p = pods.get(name).await?;
        let phase = p.status.as_ref().and_then(|s| s.phase.clone());
        let t = p
            .status
            .and_then(|s| s.container_statuses)
            .and_then(|c| c.into_iter().next())
            .and_then(|c| c.state)
            .and_then(|s| s.terminated);
        Ok(t.filter(|_| matches!(phase.as_deref(), Some("Failed" | "Succeeded"))))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))
}

#[tokio::test]
async fn the_termination_message_comes_from_the_file_or_the_log_tail() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let cases = [
        pod(
            "file",
            "echo noise; printf 'bye from the file' > /dev/termination-log; exit 3",
            serde_json::json!({"terminationMessagePolicy": "FallbackToLogsOnError"}),
        )?,
        pod(
            "custom-path",
            "printf 'done' > /tmp/msg",
            serde_json::json!({"terminationMessagePath": "/tmp/msg"}),
        )?,
        pod(
            "logs",
            "echo first line; echo last line >&2; exit 1",
            serde_json::json!({"terminationMessagePolicy": "FallbackToLogsOnError"}),
        )?,
        pod("plain-fail", "echo not used; exit 1", serde_json::json!({}))?,
        pod(
            "unended",
            "echo -n DONE; exit 1",
            serde_json::json!({"terminationMessagePolicy": "FallbackToLogsOnError"}),
        )?,
    ];
    for p in &cases {
        node.create_pod(&pods, p).await?;
    }

    let t = terminated(node, &pods, "file").await?;
    assert_eq!(
        (t.exit_code, t.message.as_deref()),
        (3, Some("bye from the file")),
        "{t:?}"
    );
    let t = terminated(node, &pods, "custom-path").await?;
    assert_eq!((t.exit_code, t.message.as_deref()), (0, Some("done")), "{t:?}");
    let t = terminated(node, &pods, "logs").await?;
    // stdout and stderr reach the log file through two pipes: their lines may be in either order
    let mut lines: Vec<&str> = t.message.as_deref().unwrap_or_default().lines().collect();
    lines.sort_unstable();
    assert_eq!(
        (t.exit_code, lines),
        (1, vec!["first line", "last line"]),
        "the log tail, both streams: {t:?}"
    );
    assert!(t.message.as_deref().is_some_and(|m| m.ends_with('\n')), "{t:?}");
    let t = terminated(node, &pods, "plain-fail").await?;
    assert_eq!(
        (t.exit_code, t.message.as_deref()),
        (1, None),
        "policy File, nothing written: {t:?}"
    );
    // the runtime writes output without a final newline as a partial line nothing continues
    let t = terminated(node, &pods, "unended").await?;
    assert_eq!((t.exit_code, t.message.as_deref()), (1, Some("DONE")), "{t:?}");
    let logs = pods.logs("unended", &Default::default()).await?;
    assert_eq!(logs, "DONE");
    println!("[real_node] termination messages: from the file, a custom path and the log tail");
    Ok(())
}
