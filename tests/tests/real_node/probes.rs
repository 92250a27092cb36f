//! Probes, the pod network and memory limits on the real node: an httpGet readiness probe flips the pod Ready
//! when its server starts listening, and a second pod reaches that server over the pod network; a failing exec
//! liveness probe restarts its container (`Unhealthy`, then `Killing`, restart count 1); a container allocating
//! past its memory limit is OOMKilled with exit code 137. The node's `/metrics/probes` counts both probes' runs
//! by result under the kubelet's names.

use std::time::{Duration, Instant};

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Api;
use kube::api::{ListParams, LogParams};

use super::harness::RealNode;

const NS: &str = "rn-probes";

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

#[tokio::test]
async fn readiness_liveness_pod_network_and_oom() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let events: Api<Event> = Api::namespaced(node.cp.admin_client().await?, NS);
    let spec = |name: &str, container: serde_json::Value| -> anyhow::Result<Pod> {
        let mut c = container;
        c["name"] = serde_json::json!("main");
        c["image"] = serde_json::json!("localhost/busybox:local");
        Ok(serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
                     "restartPolicy": if name == "oom" { "Never" } else { "Always" }, "containers": [c]},
        }))?)
    };

    // readiness: the server listens after 4 s
    let server = spec(
        "web",
        serde_json::json!({
            "command": ["sh", "-c", "mkdir -p /www && echo served-by-web > /www/index.html && sleep 4 && \
                        exec httpd -f -p 8080 -h /www"],
            "ports": [{"containerPort": 8080}],
            "readinessProbe": {"httpGet": {"path": "/index.html", "port": 8080}, "periodSeconds": 1},
        }),
    )?;
    let liveness = spec(
        "liveness",
        serde_json::json!({
            "command": ["sh", "-c", "touch /tmp/healthy; sleep 3; rm /tmp/healthy; while :; do sleep 1; done"],
            "livenessProbe": {"exec": {"command": ["cat", "/tmp/healthy"]}, "periodSeconds": 1,
                              "failureThreshold": 1},
        }),
    )?;
    let oom = spec(
        "oom",
        serde_json::json!({
            "command": ["sh", "-c", "tail /dev/zero"],
            "resources": {"limits": {"memory": "24Mi"}},
        }),
    )?;
    let t0 = Instant::now();
    for p in [&server, &liveness, &oom] {
        node.create_pod(&pods, p).await?;
    }
    wait_for("web Running", Duration::from_secs(60), || async {
        let p = pods.get("web").await?;
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        Ok((phase == Some("Running")).then_some(()))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    let waited = wait_for("web Ready", Duration::from_secs(30), || async {
        Ok(ready(&pods.get("web").await?).then_some(()))
    })
    .await;
    if let Err(e) = waited {
        let report = e2e::pod_report(&node.cp.admin_client().await?, NS, "web").await;
        return Err(e.context(format!("{report}\nagent log:\n{}", node.agent_log_tail())));
    }
    let ready_after = t0.elapsed();
    println!("[real_node] web Ready {ready_after:?} after creation (its server listens after 4 s)");
    assert!(
        ready_after >= Duration::from_secs(4),
        "Ready before the server listened"
    );

    // the pod network: another pod fetches the page from web's IP
    let ip = pods
        .get("web")
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .context("web's pod IP")?;
    let client = spec(
        "client",
        serde_json::json!({
            "command": ["sh", "-c", format!("wget -q -O - http://{ip}:8080/index.html; while :; do sleep 1; done")],
        }),
    )?;
    node.create_pod(&pods, &client).await?;
    let fetched = wait_for("client fetched the page", Duration::from_secs(60), || async {
        let logs = pods
            .logs("client", &LogParams::default())
            .await
            .unwrap_or_default();
        Ok(logs.contains("served-by-web").then_some(logs))
    })
    .await?;
    assert_eq!(fetched, "served-by-web\n");

    // liveness: restarted once the file is gone
    let restarted = wait_for("liveness restarted", Duration::from_secs(60), || async {
        let p = pods.get("liveness").await?;
        let count = p
            .status
            .and_then(|s| s.container_statuses)
            .and_then(|c| c.into_iter().next())
            .map_or(0, |c| c.restart_count);
        Ok((count >= 1).then_some(count))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    let list = events
        .list(&ListParams::default().fields("involvedObject.name=liveness"))
        .await?;
    let unhealthy = list
        .items
        .iter()
        .find(|e| e.reason.as_deref() == Some("Unhealthy"));
    let killing = list.items.iter().find(|e| e.reason.as_deref() == Some("Killing"));
    let (unhealthy, killing) = (
        unhealthy.context("an Unhealthy event")?,
        killing.context("a Killing event")?,
    );
    assert!(
        unhealthy
            .message
            .as_deref()
            .unwrap_or_default()
            .starts_with("Liveness probe failed"),
        "{unhealthy:?}"
    );
    assert!(
        killing
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("failed liveness probe"),
        "{killing:?}"
    );
    println!("[real_node] liveness restarted (count {restarted}) after its probe failed");

    // /metrics/probes: web's readiness failed until its server listened, then passed; liveness failed
    let series = |pod: &str, uid: &str, kind: &str, result: &str| {
        format!(
            "prober_probe_total{{container=\"main\",namespace=\"{NS}\",pod=\"{pod}\",pod_uid=\"{uid}\",\
             probe_type=\"{kind}\",result=\"{result}\"}} "
        )
    };
    let (status, text) = node.kubelet_get("/metrics/probes").await?;
    assert_eq!(status, 200, "{text}");
    let count = |pod: &Pod, kind: &str, result: &str| -> Option<u64> {
        let name = pod.metadata.name.as_deref()?;
        let prefix = series(name, pod.metadata.uid.as_deref()?, kind, result);
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
    };
    let (web, live) = (pods.get("web").await?, pods.get("liveness").await?);
    println!(
        "[real_node] /metrics/probes: web readiness {:?} successful, {:?} failed; liveness {:?} failed",
        count(&web, "Readiness", "successful"),
        count(&web, "Readiness", "failed"),
        count(&live, "Liveness", "failed"),
    );
    assert!(count(&web, "Readiness", "successful") >= Some(1), "{text}");
    assert!(count(&web, "Readiness", "failed") >= Some(1), "{text}");
    assert!(count(&live, "Liveness", "failed") >= Some(1), "{text}");
    assert!(
        text.contains(&format!(
            "prober_probe_duration_seconds_count{{container=\"main\",namespace=\"{NS}\",pod=\"web\",\
             probe_type=\"Readiness\"}}"
        )),
        "{text}"
    );

    // OOM: terminated by the kernel at its memory limit. The runtime may see the exit before it learns of the OOM
    // kill (the container's reason is `Error` until then); the pod's final status, read afresh once its
    // containers stopped, carries `OOMKilled`.
    let terminated = wait_for("oom terminated as OOMKilled", Duration::from_secs(60), || async {
        let p = pods.get("oom").await?;
        Ok(p.status
            .and_then(|s| s.container_statuses)
            .and_then(|c| c.into_iter().next())
            .and_then(|c| c.state)
            .and_then(|s| s.terminated)
            .filter(|t| t.reason.as_deref() == Some("OOMKilled")))
    })
    .await;
    let terminated = match terminated {
        Ok(t) => t,
        Err(e) => {
            let status = pods.get("oom").await?.status;
            anyhow::bail!(
                "{e:#}\npod status: {status:?}\nagent log:\n{}",
                node.agent_log_tail()
            );
        }
    };
    assert_eq!(
        (terminated.reason.as_deref(), terminated.exit_code),
        (Some("OOMKilled"), 137),
        "{terminated:?}"
    );
    assert_eq!(
        pods.get("oom").await?.status.and_then(|s| s.phase).as_deref(),
        Some("Failed")
    );
    Ok(())
}
