//! The Helm chart installed for real: a control plane whose worker is the real-mode node-agent on containerd
//! (the harness's node), the fleet's development image (this build's `hollow` packed by
//! `hack/build-image.sh --binaries`) pushed to a registry on loopback,
//! `helm install` of `charts/hollow`, and the fleet's pods pulled and run by containerd on the real node with
//! `hostNetwork` (this machine is loopback-only: the pods reach the API server on 127.0.0.1, named by
//! `apiServer.url`).
//!
//! * in-cluster: 2 processes × 50 hollow nodes register into the same cluster and become Ready, tainted; a
//!   200-replica Deployment that tolerates the taint runs on them, a pod that does not lands on the real node;
//!   a restarted fleet pod brings back the same node names; `helm uninstall` removes every hollow node (the
//!   pre-delete hook stops the fleet, which deletes its nodes).
//! * external target: the fleet runs in this cluster and registers its nodes, with per-node credentials, into a
//!   second control plane named by a kubeconfig Secret; neither cluster gets a ClusterRole.
//!
//! Needs root (or `NODE_AGENT_SKIP_REAL_NODE=1` to skip); a binary of its own: it fills the node with fleet pods.

/// The containerd the node runs on (Debian's 1.6).
const CONTAINERD: &str = "1.6";

#[allow(dead_code)]
#[path = "real_node/harness.rs"]
mod harness;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::Context;
use e2e::chart::{
    TAINT, fleet_nodes, fleet_pods, free_ports, helm, helm_install, http_get, names, push_image, run,
    wait_nodes_ready,
};
use e2e::{init_logging, wait_for};
use harness::{LoopbackRegistry, NODE, RealNode};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use runtime_api::{Runtime, cri};

/// Prints `kubectl describe` of `objects` (a wait for one of them failed).
fn describe(cp: &testenv::ControlPlane, namespace: &str, objects: &[&str]) {
    for object in objects {
        match cp.kubectl().args(["-n", namespace, "describe", object]).output() {
            Ok(out) => println!(
                "[chart] kubectl describe {object}:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => println!("[chart] kubectl describe {object}: {e}"),
        }
    }
}

/// The image as containerd on the node holds it: its repo digests.
async fn pulled_digests(node: &RealNode, reference: &str) -> anyhow::Result<Vec<String>> {
    let status = node
        .cri()
        .await?
        .image_status(cri::ImageStatusRequest {
            image: Some(cri::ImageSpec {
                image: reference.to_owned(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await?;
    Ok(status.image.map(|i| i.repo_digests).unwrap_or_default())
}

fn tainted(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT && t.effect == "NoSchedule"))
}

async fn running_pods(pods: &Api<Pod>, selector: &str) -> anyhow::Result<Vec<Pod>> {
    Ok(pods
        .list(&ListParams::default().labels(selector))
        .await?
        .items
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .collect())
}

fn node_name(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default()
}

#[tokio::test]
async fn helm_install_runs_the_fleet_on_the_real_node() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let cp = node.cp;
    let client = cp.admin_client().await?;
    let registry = LoopbackRegistry::start(node, "chart", None)?;
    let image = push_image(&registry.addr, &node.containerd_dir.with_file_name("image-chart"))?;

    let (release, ns) = ("fleet", "hollow-fleet");
    let metrics_port = free_ports(2)?;
    let values = vec![
        format!("image.repository={}", image.repository),
        format!("image.tag={}", image.tag),
        "replicas=2".into(),
        "fleet.nodesPerProcess=50".into(),
        "fleet.registerQps=100".into(),
        "fleet.deleteNodesOnExit=true".into(),
        format!("fleet.metricsPort={metrics_port}"),
        "hostNetwork=true".into(),
        format!("apiServer.url={}", cp.server()),
    ];
    let t0 = Instant::now();
    let notes = helm_install(cp, release, ns, &values, "4m")?;
    assert!(
        notes.contains("--toleration hollow.node-agent.io/node=true:NoSchedule"),
        "{notes}"
    );

    // the fleet's pods: on the real node, from the registry's image, Ready
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let fleet = fleet_pods(&pods, release).await?;
    assert_eq!(fleet.len(), 2);
    for pod in &fleet {
        assert_eq!(node_name(pod), NODE, "fleet pods run on the real node");
        let status = pod.status.as_ref().context("status")?;
        assert_eq!(status.phase.as_deref(), Some("Running"));
        let image_id = status.container_statuses.as_ref().context("containers")?[0]
            .image_id
            .clone();
        assert!(
            image_id.contains(&image.digest),
            "{image_id} is not {}",
            image.digest
        );
    }
    let digests = pulled_digests(node, &image.reference).await?;
    assert!(
        digests.contains(&format!("{}@{}", image.repository, image.digest)),
        "containerd pulled {digests:?}, pushed {}",
        image.digest
    );
    // 2 × 50 hollow nodes, named after their fleet pod, tainted
    let nodes: Api<Node> = Api::all(client.clone());
    let expected: BTreeSet<String> = (0..2)
        .flat_map(|p| (0..50).map(move |i| format!("{release}-hollow-{p}-n{i}")))
        .collect();
    let ready = wait_nodes_ready(&nodes, release, &expected, Duration::from_secs(180)).await?;
    println!(
        "[chart] 100 hollow nodes Ready {:?} after helm install began",
        t0.elapsed()
    );
    assert!(ready.iter().all(tainted), "every hollow node carries {TAINT}");

    // each process serves its own metrics port on the shared host network
    for i in 0..2u16 {
        let body = wait_for("the fleet gauge", Duration::from_secs(30), || async {
            let body = http_get(metrics_port + i, "/metrics")?;
            Ok(body
                .lines()
                .any(|l| l == "hollow_nodes_registered 50")
                .then_some(body))
        })
        .await
        .with_context(|| format!("process {i} on 127.0.0.1:{}", metrics_port + i))?;
        assert!(body.contains("hollow_nodes 50"), "process {i}: {body:.300}");
    }

    // a workload that opts in runs on hollow nodes only; one that does not lands on the real node
    let t1 = Instant::now();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let load: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "load"},
        "spec": {
            "replicas": 200,
            "selector": {"matchLabels": {"app": "load"}},
            "template": {
                "metadata": {"labels": {"app": "load"}},
                "spec": {
                    "tolerations": [{"key": TAINT, "operator": "Exists"}],
                    "nodeSelector": {"hollow.node-agent.io/fleet": release},
                    "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}],
                },
            },
        },
    }))?;
    deployments.create(&PostParams::default(), &load).await?;
    let running = wait_for(
        "200 pods of the Deployment Running",
        Duration::from_secs(180),
        || async {
            let running = running_pods(&pods, "app=load").await?;
            Ok((running.len() == 200).then_some(running))
        },
    )
    .await?;
    println!(
        "[chart] 200 pods Running on hollow nodes {:?} after the Deployment was created",
        t1.elapsed()
    );
    let on: BTreeSet<&str> = running.iter().map(node_name).collect();
    assert!(
        on.iter().all(|n| expected.contains(*n)),
        "pods off hollow nodes: {on:?}"
    );
    let plain: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "plain"},
        "spec": {"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "main", "image": "localhost/busybox:local",
                                 "command": ["sh", "-c", "while :; do sleep 1; done"]}]},
    }))?;
    node.create_pod(&pods, &plain).await?;
    let plain = wait_for("the plain pod Running", Duration::from_secs(120), || async {
        Ok(running_pods(&pods, "")
            .await?
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some("plain")))
    })
    .await
    .inspect_err(|_| describe(node.cp, ns, &["pod/plain", &format!("node/{NODE}")]))?;
    assert_eq!(
        node_name(&plain),
        NODE,
        "a pod without the toleration stays off hollow nodes"
    );

    // a fleet pod restarted: the same nodes come back
    let old = pods.get(&format!("{release}-hollow-1")).await?;
    pods.delete(&format!("{release}-hollow-1"), &DeleteParams::default())
        .await?;
    let t2 = Instant::now();
    wait_for("fleet pod 1 replaced", Duration::from_secs(120), || async {
        let new = pods.get_opt(&format!("{release}-hollow-1")).await?;
        Ok(new.filter(|p| p.metadata.uid != old.metadata.uid && pod_ready(p)))
    })
    .await?;
    wait_nodes_ready(&nodes, release, &expected, Duration::from_secs(120)).await?;
    println!(
        "[chart] fleet pod 1 restarted, its 50 nodes Ready again under the same names in {:?}",
        t2.elapsed()
    );

    // helm uninstall: the pre-delete hook stops the fleet, which deletes its nodes
    deployments.delete("load", &DeleteParams::default()).await?;
    pods.delete("plain", &DeleteParams::default()).await?;
    let t3 = Instant::now();
    run(helm(Some(cp))?.args([
        "uninstall",
        release,
        "--namespace",
        ns,
        "--wait",
        "--timeout",
        "4m",
    ]))?;
    let left = fleet_nodes(&nodes, release, false).await?;
    assert!(
        left.is_empty(),
        "nodes left after helm uninstall: {:?}",
        names(&left)
    );
    println!(
        "[chart] helm uninstall removed the 100 nodes in {:?}",
        t3.elapsed()
    );
    assert!(fleet_pods(&pods, release).await?.is_empty());
    let roles: Api<ClusterRole> = Api::all(client.clone());
    assert!(roles.get_opt(&format!("{release}-hollow")).await?.is_none());
    Api::<Namespace>::all(client)
        .delete(ns, &DeleteParams::default())
        .await?;
    Ok(())
}

#[tokio::test]
async fn external_target_mode_registers_into_another_cluster() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let cp = node.cp;
    let client = cp.admin_client().await?;
    let registry = LoopbackRegistry::start(node, "chart-ext", None)?;
    let addr = registry.addr.clone();
    let out = node.containerd_dir.with_file_name("image-chart-ext");
    let (target, image) = tokio::join!(
        testenv::ControlPlane::start(testenv::Options::default()),
        tokio::task::spawn_blocking(move || push_image(&addr, &out))
    );
    let (target, image) = (target?, image??);
    let target_client = target.admin_client().await?;
    let cluster_roles = |c: kube::Client| async move {
        let roles: BTreeSet<String> = names_of(
            Api::<ClusterRole>::all(c.clone())
                .list(&Default::default())
                .await?
                .items,
        );
        let bindings = names_of(
            Api::<ClusterRoleBinding>::all(c)
                .list(&Default::default())
                .await?
                .items,
        );
        anyhow::Ok((roles, bindings))
    };
    let target_rbac = cluster_roles(target_client.clone()).await?;

    // the target's kubeconfig (its server and CA: the nodes bring their own identities) and client CA
    let (release, ns) = ("ext", "hollow-ext");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))?,
        )
        .await?;
    let ca = std::fs::read_to_string(target.client_ca_file())?;
    let ca_key = std::fs::read_to_string(target.dir().join("pki/ca.key"))?;
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: target\n  cluster:\n    server: {}\n    \
         certificate-authority-data: {}\nusers:\n- name: nodes\n  user: {{}}\ncontexts:\n- name: target\n  \
         context: {{cluster: target, user: nodes}}\ncurrent-context: target\n",
        target.server(),
        base64(&ca)
    );
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    for (name, data) in [
        ("target-kubeconfig", serde_json::json!({"kubeconfig": kubeconfig})),
        ("target-ca", serde_json::json!({"ca.crt": ca, "ca.key": ca_key})),
    ] {
        let secret: Secret =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "stringData": data}))?;
        secrets.create(&PostParams::default(), &secret).await?;
    }

    let values = vec![
        format!("image.repository={}", image.repository),
        format!("image.tag={}", image.tag),
        "target.mode=external".into(),
        "target.kubeconfigSecret=target-kubeconfig".into(),
        "fleet.nodeCredentials=per-node".into(),
        "fleet.nodeCaSecret=target-ca".into(),
        "fleet.nodesPerProcess=20".into(),
        format!("fleet.metricsPort={}", free_ports(1)?),
        "hostNetwork=true".into(),
    ];
    helm_install(cp, release, ns, &values, "4m")?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let fleet = fleet_pods(&pods, release).await?;
    assert_eq!(fleet.len(), 1);
    assert_eq!(node_name(&fleet[0]), NODE, "the fleet runs in the first cluster");

    let expected: BTreeSet<String> = (0..20).map(|i| format!("{release}-hollow-0-n{i}")).collect();
    let target_nodes: Api<Node> = Api::all(target_client.clone());
    let ready = wait_nodes_ready(&target_nodes, release, &expected, Duration::from_secs(180)).await?;
    assert!(ready.iter().all(tainted));
    let here: Api<Node> = Api::all(client.clone());
    assert!(
        fleet_nodes(&here, release, false).await?.is_empty(),
        "no hollow node in the fleet's own cluster"
    );

    // no ClusterRole or binding: none added in the target, none in the fleet's cluster for this release
    assert_eq!(
        cluster_roles(target_client).await?,
        target_rbac,
        "the target's cluster roles changed"
    );
    let mine = ListParams::default().labels(&format!("app.kubernetes.io/instance={release}"));
    assert!(
        Api::<ClusterRole>::all(client.clone())
            .list(&mine)
            .await?
            .items
            .is_empty()
    );
    assert!(
        Api::<ClusterRoleBinding>::all(client.clone())
            .list(&mine)
            .await?
            .items
            .is_empty()
    );

    run(helm(Some(cp))?.args([
        "uninstall",
        release,
        "--namespace",
        ns,
        "--wait",
        "--timeout",
        "2m",
    ]))?;
    namespaces.delete(ns, &DeleteParams::default()).await?;
    target.stop().await?;
    Ok(())
}

fn names_of<T: kube::Resource>(items: Vec<T>) -> BTreeSet<String> {
    items.into_iter().filter_map(|i| i.meta().name.clone()).collect()
}

fn base64(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
