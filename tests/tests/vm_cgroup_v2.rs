//! A real node on cgroup v2 with the cgroupfs driver, in a Debian guest (see `vm_node/harness.rs`): pods of the
//! three QoS classes run in the kubelet's cgroups of the unified hierarchy with the kubelet's limits and the
//! node's `podPidsLimit`, as read from the guest's cgroup files; a container past its memory limit is OOM-killed
//! and reported so; the node's and pods' figures come from the v2 files. Needs root (or `NODE_AGENT_SKIP_REAL_NODE=1` to skip).

#[path = "vm_node/harness.rs"]
mod harness;

use std::time::Duration;

use anyhow::Context;
use e2e::{init_logging, wait_for};
use harness::{NODE, POD_PIDS_LIMIT, VmNode};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;

const NS: &str = "vm-cgroups";

fn pod(name: &str, script: &str, resources: serde_json::Value) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": "Never",
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:local",
                "command": ["sh", "-c", script],
                "resources": resources,
            }],
        },
    }))?)
}

/// The pod once Running: its UID and its container's runtime ID.
async fn running(node: &VmNode, pods: &Api<Pod>, name: &str) -> anyhow::Result<(String, String)> {
    let p = wait_for(
        &format!("pod {name} Running"),
        Duration::from_secs(180),
        || async {
            let p = pods.get(name).await?;
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            Ok((phase == Some("Running")).then_some(p))
        },
    )
    .await;
    let p = match p {
        Ok(p) => p,
        Err(e) => return Err(e.context(format!("agent log:\n{}", node.agent_log_tail().await))),
    };
    let uid = p.metadata.uid.clone().context("uid")?;
    let id = p
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .and_then(|c| c.container_id)
        .context("containerID")?;
    let id = id
        .strip_prefix("containerd://")
        .context("containerd's ID")?
        .to_owned();
    Ok((uid, id))
}

/// `file` of the guest's cgroup `cgroup` (relative to `/sys/fs/cgroup`), trimmed.
async fn cgroup_file(node: &VmNode, cgroup: &str, file: &str) -> anyhow::Result<String> {
    Ok(node
        .vm
        .read(&format!("/sys/fs/cgroup/{cgroup}/{file}"))
        .await?
        .trim()
        .to_owned())
}

#[tokio::test]
async fn qos_pods_run_in_the_kubelets_v2_cgroups_with_their_limits() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = VmNode::get().await? else {
        return Ok(());
    };
    let fs = node
        .vm
        .run("stat -fc %T /sys/fs/cgroup", Duration::from_secs(30))
        .await?;
    assert_eq!(
        fs.trim(),
        "cgroup2fs",
        "the guest's cgroups are the unified hierarchy"
    );
    let pods = node.namespace(NS).await?;
    let sleep = "while :; do sleep 1; done";
    let classes = [
        (
            "guaranteed",
            serde_json::json!({"limits": {"cpu": "500m", "memory": "64Mi"}}),
        ),
        (
            "burstable",
            serde_json::json!({"requests": {"cpu": "250m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}),
        ),
        ("besteffort", serde_json::json!({})),
    ];
    for (name, resources) in &classes {
        node.create_pod(&pods, &pod(name, sleep, resources.clone())?)
            .await?;
    }
    let mut seen = Vec::new();
    for (name, _) in &classes {
        seen.push(running(node, &pods, name).await?);
    }
    let [(g_uid, g_id), (b_uid, b_id), (be_uid, be_id)] = <[_; 3]>::try_from(seen).expect("three pods");

    // the QoS tree with its controllers enabled level by level
    let subtree = cgroup_file(node, "kubepods", "cgroup.subtree_control").await?;
    for controller in ["cpu", "memory", "pids"] {
        assert!(
            subtree.split_whitespace().any(|c| c == controller),
            "kubepods enables {controller} for its children: {subtree:?}"
        );
    }
    assert_eq!(cgroup_file(node, "kubepods/besteffort", "cpu.weight").await?, "1");
    // the burstable class weighs its pods' cpu requests: 250m is 256 shares, weight 10
    assert_eq!(cgroup_file(node, "kubepods/burstable", "cpu.weight").await?, "10");

    let guaranteed = format!("kubepods/pod{g_uid}");
    let burstable = format!("kubepods/burstable/pod{b_uid}");
    let besteffort = format!("kubepods/besteffort/pod{be_uid}");
    let mut report = Vec::new();
    for (cgroup, weight, max, memory) in [
        (&guaranteed, "20", "50000 100000", "67108864"),
        (&burstable, "10", "max 100000", "67108864"),
        (&besteffort, "1", "max 100000", "max"),
    ] {
        let got = (
            cgroup_file(node, cgroup, "cpu.weight").await?,
            cgroup_file(node, cgroup, "cpu.max").await?,
            cgroup_file(node, cgroup, "memory.max").await?,
            cgroup_file(node, cgroup, "pids.max").await?,
        );
        report.push(format!(
            "{cgroup}: cpu.weight {} cpu.max {} memory.max {} pids.max {}",
            got.0, got.1, got.2, got.3
        ));
        let expected = (
            weight.into(),
            max.into(),
            memory.into(),
            POD_PIDS_LIMIT.to_string(),
        );
        assert_eq!(got, expected, "{cgroup}");
    }
    println!("[vm_cgroup_v2] {}", report.join("\n[vm_cgroup_v2] "));

    // each container in its pod's cgroup (runc names it by the container's ID), holding its processes
    for (cgroup, id) in [(&guaranteed, &g_id), (&burstable, &b_id), (&besteffort, &be_id)] {
        let procs = cgroup_file(node, &format!("{cgroup}/{id}"), "cgroup.procs").await?;
        assert!(!procs.is_empty(), "{cgroup}/{id} holds the container's processes");
    }
    assert_eq!(
        cgroup_file(node, &format!("{guaranteed}/{g_id}"), "memory.max").await?,
        "67108864",
        "the container's own limit"
    );
    assert_eq!(
        cgroup_file(node, &format!("{guaranteed}/{g_id}"), "memory.oom.group").await?,
        "1",
        "an OOM kill takes all of the container's processes, as the kubelet asks on v2"
    );

    // the figures the node serves, read by the runtime and the agent from the v2 files
    let port = Api::<Node>::all(node.cp.admin_client().await?)
        .get(NODE)
        .await?
        .status
        .and_then(|s| s.daemon_endpoints)
        .and_then(|d| d.kubelet_endpoint)
        .map(|e| e.port)
        .context("the node's kubelet port")?;
    let summary: serde_json::Value = wait_for(
        "a summary with the guaranteed pod",
        Duration::from_secs(90),
        || async {
            let (status, body) = e2e::kubelet_api::get(node.cp, port, "/stats/summary").await?;
            anyhow::ensure!(status == 200, "/stats/summary: {status} {body}");
            let s: serde_json::Value = serde_json::from_str(&body)?;
            let has = s["pods"].as_array().into_iter().flatten().any(|p| {
                p["podRef"]["uid"] == g_uid.as_str()
                    && p["containers"][0]["memory"]["workingSetBytes"]
                        .as_u64()
                        .unwrap_or(0)
                        > 0
                    && p["containers"][0]["cpu"]["usageCoreNanoSeconds"]
                        .as_u64()
                        .unwrap_or(0)
                        > 0
            });
            Ok(has.then_some(s))
        },
    )
    .await?;
    let node_ws = summary["node"]["memory"]["workingSetBytes"].as_u64().unwrap_or(0);
    let capacity = summary["node"]["memory"]["availableBytes"].as_u64().unwrap_or(0) + node_ws;
    println!("[vm_cgroup_v2] node memory working set {node_ws} of {capacity} bytes");
    assert!(
        node_ws > 0 && node_ws < capacity,
        "node working set {node_ws} within {capacity}"
    );
    Ok(())
}

#[tokio::test]
async fn a_container_past_its_memory_limit_is_oom_killed() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = VmNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    // busybox dd fills a 64 MiB buffer: twice the limit; it is the container's main process
    node.create_pod(
        &pods,
        &pod(
            "hog",
            "sleep 1; exec dd if=/dev/zero of=/dev/null bs=64M count=1",
            serde_json::json!({"limits": {"cpu": "100m", "memory": "32Mi"}}),
        )?,
    )
    .await?;
    let terminated = wait_for("the hog terminated", Duration::from_secs(180), || async {
        let p = pods.get("hog").await?;
        Ok(p.status
            .and_then(|s| s.container_statuses)
            .and_then(|c| c.into_iter().next())
            .and_then(|c| c.state?.terminated))
    })
    .await;
    let terminated = match terminated {
        Ok(t) => t,
        Err(e) => return Err(e.context(format!("agent log:\n{}", node.agent_log_tail().await))),
    };
    println!(
        "[vm_cgroup_v2] hog: exit {} reason {:?}",
        terminated.exit_code, terminated.reason
    );
    assert_eq!(terminated.reason.as_deref(), Some("OOMKilled"));
    assert_eq!(terminated.exit_code, 137);
    let phase = wait_for("the hog Failed", Duration::from_secs(60), || async {
        let phase = pods.get("hog").await?.status.and_then(|s| s.phase);
        Ok((phase.as_deref() == Some("Failed")).then_some(()))
    })
    .await;
    phase.context("a pod whose only container was OOM-killed, restartPolicy Never")?;
    Ok(())
}
