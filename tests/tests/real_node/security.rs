//! Security contexts on the real node, as the container sees them: the user, group and supplemental groups it
//! runs as, a read-only root filesystem, dropped capabilities and no privilege escalation, a namespaced sysctl
//! set for the sandbox; and `runAsNonRoot` with `runAsUser: 0` refused with the kubelet's reason.

use std::time::Duration;

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::core::v1::Pod;
use kube::api::LogParams;

use super::harness::RealNode;

#[tokio::test]
async fn the_container_runs_as_its_security_context_says() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace("rn-security").await?;
    let script = r#"
echo "uid=$(id -u) gid=$(id -g) groups=$(id -G)"
echo "rootfs=$(touch /probe 2>/dev/null && echo writable || echo read-only)"
echo "capeff=$(awk '$1=="CapEff:"{print $2}' /proc/self/status)"
echo "nonewprivs=$(awk '$1=="NoNewPrivs:"{print $2}' /proc/self/status)"
echo "sysctl=$(cat /proc/sys/net/ipv4/ip_unprivileged_port_start)"
while :; do sleep 1; done
"#;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "locked"},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "securityContext": {
                "runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000, "supplementalGroups": [4000],
                "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}],
            },
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:local",
                "command": ["sh", "-c", script],
                "securityContext": {
                    "readOnlyRootFilesystem": true,
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                },
            }],
        },
    }))?;
    node.create_pod(&pods, &pod).await?;
    let logs = wait_for("the container's report", Duration::from_secs(90), || async {
        let logs = pods
            .logs("locked", &LogParams::default())
            .await
            .unwrap_or_default();
        Ok(logs.contains("sysctl=").then_some(logs))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    let line = |key: &str| {
        logs.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or("<missing>")
            .to_owned()
    };
    assert_eq!(line("uid"), "1000 gid=3000 groups=3000 2000 4000", "{logs}");
    assert_eq!(line("rootfs"), "read-only");
    assert_eq!(line("capeff"), "0000000000000000", "every capability dropped");
    assert_eq!(line("nonewprivs"), "1");
    assert_eq!(
        line("sysctl"),
        "0",
        "the pod's sysctl is set in its network namespace"
    );

    // runAsNonRoot with runAsUser 0: never created, the kubelet's reason on the container
    let root: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "as-root"},
        "spec": {
            "automountServiceAccountToken": false,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 0},
            "containers": [{"name": "main", "image": "localhost/busybox:local", "command": ["sleep", "3600"]}],
        },
    }))?;
    node.create_pod(&pods, &root).await?;
    let message = wait_for("as-root refused", Duration::from_secs(60), || async {
        let p = pods.get("as-root").await?;
        let waiting = p
            .status
            .and_then(|s| s.container_statuses)
            .and_then(|c| c.into_iter().next())
            .and_then(|c| c.state)
            .and_then(|s| s.waiting);
        Ok(waiting
            .filter(|w| w.reason.as_deref() == Some("CreateContainerConfigError"))
            .and_then(|w| w.message))
    })
    .await?;
    assert!(message.contains("runAsUser breaks non-root policy"), "{message}");
    Ok(())
}
