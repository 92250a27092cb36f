//! The evented PLEG by what it does, not by what the agent logs: the agent's pod side (the `node-agent`
//! library, as the in-process tests and the hollow fleet run it) on a containerd 2.x of its own, with its relist
//! period and its periodic pod sync both set to an hour. A container that exits when the test tells it to is
//! reported terminated, with its exit code, in the pod's status within seconds: nothing in that lifecycle would
//! look at the pod again for an hour but the runtime's container events (`GetContainerEvents`).
//!
//! The kubelet has no relist-period setting, so the `node-agent` binary of the other tests cannot be given a
//! long one; the library's `PodConfig::relist_period` can. The pod side runs on a containerd of its own because
//! a second pod side on the node's containerd would take the node's pods for orphans (and the node agent its).
//! The pod is bound to a Node object of its own (unschedulable, so the scheduler never places the binary's
//! tests' pods there), on the host network (no CNI needed).

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use node_agent::pods::{NodeView, PodConfig, PodLifecycle, ScriptedProbes};
use runtime_api::{Runtime, cri};
use tokio_util::sync::CancellationToken;

use crate::harness::RealNode;

/// The Node the pod side runs for.
const NODE: &str = "rn-evented";
const NS: &str = "rn-evented";
/// The pod side's relist period and periodic sync: far longer than the test.
const NEVER: Duration = Duration::from_secs(3600);

/// The reaper of this test's containerd, kept for the life of the process when the test fails half-way (it
/// tears the containerd down when the process exits); stopped, tearing down at once, when the test ends.
static REAPER: Mutex<Option<testenv::process::Proc>> = Mutex::new(None);

fn exit_code(pod: &Pod) -> Option<i32> {
    let c = pod.status.as_ref()?.container_statuses.as_ref()?.first()?;
    Some(c.state.as_ref()?.terminated.as_ref()?.exit_code)
}

#[tokio::test]
async fn a_container_exit_reaches_the_status_through_containerd_events() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let cp = node.cp;
    let admin = cp.admin_client().await?;

    // containerd 2.x, below a directory of its own, torn down by its reaper
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("na-evented-{pid}"));
    std::fs::create_dir_all(&dir)?;
    let bridge = format!("naev{:x}", pid % 0xfffff);
    let reaper = e2e::containerd::start_reaper(&dir, &bridge, &[])?;
    REAPER.lock().unwrap_or_else(|p| p.into_inner()).replace(reaper);
    let containerd_dir = dir.join("containerd");
    {
        let (containerd_dir, bridge) = (containerd_dir.clone(), bridge.clone());
        // host-network pods only: the subnet is never used (TEST-NET-1)
        tokio::task::spawn_blocking(move || {
            e2e::containerd::setup(&containerd_dir, &bridge, "192.0.2.0/24", "2")
        })
        .await??;
    }
    let endpoint = format!("unix://{}", containerd_dir.join("containerd.sock").display());
    let runtime = cri_real::RemoteRuntime::connect(&endpoint).await?;

    // the Node the pod is bound to: unschedulable and not ready, as a kubelet registers
    let nodes: Api<Node> = Api::all(admin.clone());
    let object: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": NODE},
        "spec": {"unschedulable": true,
                 "taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]},
    }))?;
    if nodes.get_opt(NODE).await?.is_none() {
        nodes.create(&PostParams::default(), &object).await?;
    }

    // the pod side: relisting and periodic syncs an hour apart
    let mut config = PodConfig::new(NODE);
    config.relist_period = NEVER;
    config.sync_frequency = NEVER;
    config.layout.pod_logs_dir = dir.join("pods").display().to_string();
    let view = NodeView {
        name: NODE.into(),
        cpu_milli: 4000,
        memory: 8 << 30,
        pods: 110,
        host_ips: vec!["127.0.0.1".into()],
        ..NodeView::default()
    };
    let (_view, views) = node_agent::density::watch::channel(Some(view));
    let probes = ScriptedProbes::new(|_: &str, _| Err("this pod has no network probes".to_owned()));
    let lifecycle = PodLifecycle::new(
        config,
        admin.clone(),
        Arc::new(runtime.clone()),
        Arc::new(probes),
        views,
    );
    let cancel = CancellationToken::new();
    let run = tokio::spawn(lifecycle.run(cancel.clone()));

    let pods = node.namespace(NS).await?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "exits"},
        "spec": {
            "nodeName": NODE,
            "hostNetwork": true,
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:local",
                "command": ["sh", "-c", "while [ ! -e /tmp/exit ]; do sleep 0.2; done; exit 7"],
            }],
        },
    }))?;
    node.create_pod(&pods, &pod).await?;
    // guards against hanging only: each of these waits takes seconds
    let running = wait_for("the pod Running", Duration::from_secs(120), || async {
        let p = pods.get("exits").await?;
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        Ok((phase == Some("Running")).then_some(p))
    })
    .await?;
    let container_id = running
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref()?.first()?.container_id.clone())
        .context("containerID")?;
    let container_id = container_id
        .strip_prefix("containerd://")
        .with_context(|| format!("containerID {container_id}"))?
        .to_owned();

    // the container is told to exit; from here on only an event can tell the pod side
    let told = runtime
        .exec_sync(cri::ExecSyncRequest {
            container_id: container_id.clone(),
            cmd: vec!["touch".into(), "/tmp/exit".into()],
            timeout: 10,
        })
        .await?;
    anyhow::ensure!(told.exit_code == 0, "touch /tmp/exit: {told:?}");
    let failed = wait_for(
        "the exit in the pod's status",
        Duration::from_secs(120),
        || async {
            let p = pods.get("exits").await?;
            Ok(exit_code(&p).is_some().then_some(p))
        },
    )
    .await;
    let seen = SystemTime::now();
    let failed = failed?;
    assert_eq!(exit_code(&failed), Some(7), "{:?}", failed.status);
    assert_eq!(
        failed.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Failed")
    );
    // for the record: how long after containerd saw the exit its status was read back from the API server
    let finished = runtime
        .container_status(cri::ContainerStatusRequest {
            container_id,
            verbose: false,
        })
        .await?
        .status
        .context("container status")?
        .finished_at;
    let finished = SystemTime::UNIX_EPOCH + Duration::from_nanos(u64::try_from(finished)?);
    println!(
        "[real_node_v2] the exit reached the pod's status (seen {:?} after containerd's finishedAt) with relisting \
         and periodic syncs {NEVER:?} apart",
        seen.duration_since(finished).unwrap_or_default()
    );

    pods.delete("exits", &DeleteParams::default().grace_period(0))
        .await?;
    cancel.cancel();
    run.await??;
    nodes.delete(NODE, &DeleteParams::default()).await?;
    let reaper = REAPER.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(reaper) = reaper {
        reaper.stop(Duration::from_secs(60)).await?;
    }
    Ok(())
}
