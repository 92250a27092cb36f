//! Restart adoption: node-agent stopped (SIGTERM, then SIGKILL) with pods running on containerd and started
//! again takes the running sandboxes and containers back by their labels — the same container IDs, restart
//! counts kept, no second sandbox or container, statuses unchanged — and is demonstrably back: its lease renews
//! after the restart and a pod created afterwards runs.

use std::time::Duration;

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use super::{container, in_runtime, node, pod, renew_time};

const NS: &str = "rn-restart";

#[tokio::test]
async fn a_restarted_agent_adopts_running_pods_without_duplicates() -> anyhow::Result<()> {
    init_logging();
    let Some((node, _serial)) = node().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let leases: Api<Lease> = Api::namespaced(node.cp.admin_client().await?, "kube-node-lease");
    // steady's readiness probe shows, in /metrics/probes, that a restarted agent has taken the pod on
    let mut steady = pod("steady", "while :; do sleep 1; done")?;
    if let Some(c) = steady.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        c.readiness_probe = Some(serde_json::from_value(serde_json::json!({
            "exec": {"command": ["true"]}, "periodSeconds": 1,
        }))?);
    }
    node.create_pod(&pods, &steady).await?;
    node.create_pod(&pods, &pod("crashy", "sleep 1; exit 3")?).await?;
    let steady = wait_for("steady Running", Duration::from_secs(60), || async {
        let p = pods.get("steady").await?;
        Ok(container(&p).filter(|c| c.ready).map(|c| (p, c)))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    let (steady_pod, steady_before) = steady;
    let steady_uid = steady_pod.metadata.uid.clone().context("uid")?;
    let crashy_before = wait_for("crashy restarted once", Duration::from_secs(60), || async {
        let p = pods.get("crashy").await?;
        Ok(container(&p).filter(|c| c.restart_count >= 1))
    })
    .await?;
    assert_eq!(in_runtime(node, &steady_uid).await?, (1, 1));

    for kill in [false, true] {
        let how = if kill { "SIGKILL" } else { "SIGTERM" };
        let stopped_at = k8s_openapi::jiff::Timestamp::now();
        node.restart_agent(kill).await?;
        // back: the lease renews after the restart
        wait_for(
            &format!("a lease renewal after the {how} restart"),
            Duration::from_secs(60),
            || async { Ok(renew_time(&leases).await?.filter(|t| *t > stopped_at).map(|_| ())) },
        )
        .await
        .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
        // the new process has taken steady on: its prober (counters start at zero with the process) has
        // passed steady's readiness probe twice, so the pod's first sync, where a wrong agent would restart or
        // duplicate, is behind it
        let series = format!(
            "prober_probe_total{{container=\"main\",namespace=\"{NS}\",pod=\"steady\",pod_uid=\"{steady_uid}\",\
             probe_type=\"Readiness\",result=\"successful\"}} "
        );
        let probed = wait_for(
            &format!("steady probed by the agent started after {how}"),
            Duration::from_secs(60),
            || async {
                // the kubelet API may not listen yet: not an error, a wait
                let Ok((200, text)) = node.kubelet_get("/metrics/probes").await else {
                    return Ok(None);
                };
                let count = text
                    .lines()
                    .find_map(|l| l.strip_prefix(&series)?.trim().parse::<u64>().ok());
                Ok(count.filter(|n| *n >= 2))
            },
        )
        .await
        .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
        let p = pods.get("steady").await?;
        let now = container(&p).context("steady's status")?;
        assert_eq!(
            now.container_id, steady_before.container_id,
            "same container after {how}"
        );
        assert_eq!(now.restart_count, 0, "not restarted by the {how} restart");
        assert!(
            now.ready && now.state.as_ref().and_then(|s| s.running.as_ref()).is_some(),
            "{now:?}"
        );
        assert_eq!(
            in_runtime(node, &steady_uid).await?,
            (1, 1),
            "one sandbox and one running container after {how}"
        );
        let crashy = container(&pods.get("crashy").await?).context("crashy's status")?;
        assert!(
            crashy.restart_count >= crashy_before.restart_count,
            "restart count kept after {how}: {} then {}",
            crashy_before.restart_count,
            crashy.restart_count
        );
        println!(
            "[real_node] after {how}: steady probed {probed} times, kept {}, crashy restart count {} -> {}",
            now.container_id.as_deref().unwrap_or_default(),
            crashy_before.restart_count,
            crashy.restart_count
        );
    }

    // and it takes new work
    node.create_pod(&pods, &pod("after", "while :; do sleep 1; done")?)
        .await?;
    wait_for(
        "a pod created after the restarts Running",
        Duration::from_secs(60),
        || async {
            let p = pods.get("after").await?;
            Ok(container(&p).filter(|c| c.ready).map(|_| ()))
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    Ok(())
}
