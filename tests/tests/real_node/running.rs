//! A pod's life on the real node as a user sees it through the API server: scheduled, Running with an IP from
//! the node's pod CIDR, its output served by `kubectl logs`, and deleted: its containers stopped in containerd.

use std::time::{Duration, Instant};

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, LogParams};
use runtime_api::{Runtime, cri};

use super::harness::{NODE, RealNode, contains};

#[tokio::test]
async fn busybox_pod_runs_with_an_ip_from_the_pod_cidr_logs_and_stops_on_deletion() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace("rn-running").await?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "hello"},
        "spec": {
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:local",
                "command": ["sh", "-c", "echo hello from $(hostname); trap 'echo bye; exit 0' TERM; \
                            while :; do sleep 1 & wait $!; done"],
            }],
        },
    }))?;
    let t0 = Instant::now();
    let created = node.create_pod(&pods, &pod).await?;
    let uid = created.metadata.uid.clone().context("uid")?;
    let running = wait_for("pod hello Running", Duration::from_secs(60), || async {
        let p = pods.get("hello").await?;
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        Ok((phase == Some("Running")).then_some(p))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    let took = t0.elapsed();
    let spec = running.spec.as_ref().context("spec")?;
    let status = running.status.as_ref().context("status")?;
    let ip: std::net::Ipv4Addr = status.pod_ip.as_deref().context("podIP")?.parse()?;
    println!("[real_node] pod hello Running on {NODE} with IP {ip} {took:?} after creation (polled)");
    assert_eq!(spec.node_name.as_deref(), Some(NODE));
    assert!(
        contains(node.pod_cidr, ip),
        "pod IP {ip} outside the node's podCIDR {:?}",
        node.pod_cidr
    );
    assert!(
        contains(node.subnet, ip),
        "pod IP {ip} outside the test subnet {:?}",
        node.subnet
    );
    assert_eq!(status.host_ip.as_deref(), Some("127.0.0.1"));
    let container = &status.container_statuses.as_ref().context("containerStatuses")?[0];
    assert!(container.ready, "{container:?}");
    let container_id = container.container_id.clone().context("containerID")?;
    let container_id = container_id
        .strip_prefix("containerd://")
        .with_context(|| format!("containerID {container_id} is not containerd's"))?
        .to_owned();

    let logs = wait_for("the pod's log line", Duration::from_secs(20), || async {
        let logs = pods.logs("hello", &LogParams::default()).await?;
        Ok(logs.contains("hello from").then_some(logs))
    })
    .await?;
    assert_eq!(logs, "hello from hello\n", "kubectl logs through the API server");
    // the file it is served from, where the kubelet keeps it: <podLogsDir>/<ns>_<pod>_<uid>/<container>/0.log
    let file = node
        .pod_logs_dir
        .join(format!("rn-running_hello_{uid}"))
        .join("main/0.log");
    let text = std::fs::read_to_string(&file).with_context(|| file.display().to_string())?;
    assert!(text.contains(" stdout F hello from hello"), "{text:?}");

    let cri = node.cri().await?;
    let state = cri
        .container_status(cri::ContainerStatusRequest {
            container_id: container_id.clone(),
            verbose: false,
        })
        .await?
        .status
        .context("container status")?
        .state;
    assert_eq!(state, cri::ContainerState::ContainerRunning as i32);

    // which way the binary learns of container changes, as it says at start: containerd 2.x streams events, 1.6
    // has none (relisted). What the events do — an exit reported with relisting and periodic syncs an hour
    // apart — is shown by real_node_v2's evented_pleg, on the library, whose relist period can be set.
    let log = std::fs::read_to_string(&node.agent_log)?;
    let evented = log.contains("following the runtime's container events (evented PLEG)");
    let relisted = log.contains("runtime has no container events, relisting");
    assert_eq!(
        (evented, relisted),
        (crate::CONTAINERD == "2", crate::CONTAINERD == "1.6"),
        "PLEG mode on containerd {}",
        crate::CONTAINERD
    );

    let t1 = Instant::now();
    pods.delete("hello", &DeleteParams::default()).await?;
    wait_for("pod hello gone from the API", Duration::from_secs(60), || async {
        Ok(pods.get_opt("hello").await?.is_none().then_some(()))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    println!(
        "[real_node] pod hello deleted in {:?} (graceful: its TERM trap exits 0)",
        t1.elapsed()
    );
    // containerd: the container is stopped (or removed), no running container and no ready sandbox of the pod
    // remain
    match cri
        .container_status(cri::ContainerStatusRequest {
            container_id: container_id.clone(),
            verbose: false,
        })
        .await
    {
        Ok(r) => {
            let state = r.status.context("container status")?.state;
            assert_eq!(
                state,
                cri::ContainerState::ContainerExited as i32,
                "container {container_id}"
            );
        }
        Err(e) if e.code == runtime_api::Code::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    let filter = |uid: &str| [("io.kubernetes.pod.uid".to_owned(), uid.to_owned())].into();
    let containers = cri
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                label_selector: filter(&uid),
                ..Default::default()
            }),
        })
        .await?
        .containers;
    let running: Vec<_> = containers
        .iter()
        .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
        .collect();
    assert!(
        running.is_empty(),
        "containers still running after deletion: {running:?}"
    );
    let sandboxes = cri
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                label_selector: filter(&uid),
                ..Default::default()
            }),
        })
        .await?
        .items;
    let ready: Vec<_> = sandboxes
        .iter()
        .filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
        .collect();
    assert!(
        ready.is_empty(),
        "sandboxes still ready after deletion: {ready:?}"
    );
    Ok(())
}
