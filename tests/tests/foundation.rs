//! Foundation: the real control plane is what the rest of the project stands on. These tests prove it is
//! the pinned release, that node identities are held to the Node authorizer and NodeRestriction, that the
//! scheduler and controller-manager really run, and that the launcher leaves no process behind.

use std::time::Duration;

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test]
async fn api_server_reports_the_pinned_version() -> anyhow::Result<()> {
    init_logging();
    let cp = testenv::shared().await?;
    let info = cp.admin_client().await?.apiserver_version().await?;
    assert_eq!(info.git_version, testenv::assets::kubernetes_version());
    assert_eq!(info.git_version, include_str!("../../KUBERNETES_VERSION").trim());
    Ok(())
}

fn forbidden<T: std::fmt::Debug>(res: Result<T, kube::Error>) -> bool {
    matches!(res, Err(kube::Error::Api(ref s)) if s.code == 403)
}

#[tokio::test]
async fn node_identity_is_confined_to_its_own_node_and_lease() -> anyhow::Result<()> {
    init_logging();
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    let n1 = cp.node_client("n1").await?;

    // create its own Node
    let nodes: Api<Node> = Api::all(n1.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1"}},
    }))?;
    nodes
        .create(&PostParams::default(), &node)
        .await
        .context("n1 creates Node n1")?;

    // create and renew its own Lease
    let leases: Api<Lease> = Api::namespaced(n1.clone(), "kube-node-lease");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "n1", "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40, "renewTime": MicroTime(Timestamp::now())},
    }))?;
    let first = leases
        .create(&PostParams::default(), &lease)
        .await
        .context("n1 creates its Lease")?;
    let first_renew = first
        .spec
        .as_ref()
        .and_then(|s| s.renew_time.clone())
        .context("renewTime")?;
    // a renewal one second after the first: the API server keeps exactly the time n1 sends
    let next = MicroTime(
        first_renew
            .0
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(1))?,
    );
    leases
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"renewTime": next}})),
        )
        .await
        .context("n1 renews its Lease")?;
    let stored = leases.get("n1").await?.spec.and_then(|s| s.renew_time);
    assert_eq!(stored, Some(next), "the renewal is stored");

    // refused: creating another node, or touching one that exists
    let other: Node = serde_json::from_value(json!({"metadata": {"name": "n2"}}))?;
    assert!(
        forbidden(nodes.create(&PostParams::default(), &other).await),
        "n1 must not create Node n2"
    );
    Api::<Node>::all(admin.clone())
        .create(&PostParams::default(), &other)
        .await?;
    let label = Patch::Merge(json!({"metadata": {"labels": {"hijacked": "true"}}}));
    assert!(
        forbidden(nodes.patch("n2", &PatchParams::default(), &label).await),
        "n1 must not patch Node n2"
    );
    assert!(
        forbidden(
            nodes
                .patch_status(
                    "n2",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {}}))
                )
                .await
        ),
        "n1 must not patch Node n2's status"
    );
    let foreign_lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "n2", "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": "n2"},
    }))?;
    assert!(
        forbidden(leases.create(&PostParams::default(), &foreign_lease).await),
        "n1 must not create n2's Lease"
    );
    Ok(())
}

#[tokio::test]
async fn scheduler_binds_a_pod_to_a_ready_node() -> anyhow::Result<()> {
    init_logging();
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    let name = "sched-n1";
    let nodes: Api<Node> = Api::all(admin.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
    }))?;
    nodes.create(&PostParams::default(), &node).await?;
    let resources = json!({"cpu": "4", "memory": "8Gi", "pods": "110"});
    let now = Timestamp::now();
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "capacity": resources, "allocatable": resources,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "test node", "lastHeartbeatTime": now, "lastTransitionTime": now}],
            }})),
        )
        .await?;
    // the node lifecycle controller would otherwise see a silent node; give it a fresh lease
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": MicroTime(now)},
    }))?;
    Api::<Lease>::namespaced(admin.clone(), "kube-node-lease")
        .create(&PostParams::default(), &lease)
        .await?;

    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "scheduled-by-the-real-scheduler"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": name},
            "containers": [{"name": "c", "image": "localhost/pause:local",
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}],
        },
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let bound = wait_for(
        "the scheduler to bind the pod",
        Duration::from_secs(60),
        || async {
            let p = pods.get("scheduled-by-the-real-scheduler").await?;
            Ok(p.spec.as_ref().and_then(|s| s.node_name.clone()).map(|n| (n, p)))
        },
    )
    .await?;
    assert_eq!(bound.0, name);
    let scheduled = bound
        .1
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")
        .context("PodScheduled condition")?;
    assert_eq!(scheduled.status, "True");
    // the node it landed on is Ready
    let ready = nodes
        .get(name)
        .await?
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default();
    assert!(ready.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    Ok(())
}

#[tokio::test]
async fn launcher_leaves_no_process_behind() -> anyhow::Result<()> {
    init_logging();
    let cp = testenv::ControlPlane::start(testenv::Options::default()).await?;
    let pids = cp.pids();
    assert_eq!(
        pids.len(),
        4,
        "etcd, apiserver, controller-manager, scheduler: {pids:?}"
    );
    assert!(pids.iter().all(|p| testenv::process::pid_alive(*p)));
    // it works before we stop it
    cp.admin_client().await?.apiserver_version().await?;
    let dir = cp.dir().to_path_buf();
    cp.stop().await?;
    let alive: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|p| testenv::process::pid_alive(*p))
        .collect();
    assert!(alive.is_empty(), "still running after stop: {alive:?}");
    // nothing else that names its directory either
    let dir_str = dir.display().to_string();
    let mut leftovers = Vec::new();
    for entry in std::fs::read_dir("/proc")?.flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmdline).contains(&dir_str)
        {
            leftovers.push(entry.file_name());
        }
    }
    assert!(leftovers.is_empty(), "processes naming {dir_str}: {leftovers:?}");
    assert!(!dir.exists(), "its temporary directory is removed");
    Ok(())
}
