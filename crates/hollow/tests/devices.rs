//! Fake device plugins on hollow nodes against the real control plane: a profile's `devicePlugins` give every
//! node of the profile a resource whose devices are its capacity and allocatable, as a device plugin's are on a
//! real node; the real scheduler places pods asking for them, each node's device manager gives each pod its own
//! device (the fake plugin's `Allocate` names it in the container's environment), and a pod sent to a node
//! asking for more devices than it has is refused with the kubelet's reason. A plugin whose devices' health
//! flaps keeps them all in the node's capacity and the unhealthy one out of its allocatable and out of
//! admission.

use std::sync::Arc;
use std::time::Duration;

use e2e::{init_logging, wait_for};
use hollow::client_pool::{ClientPool, PoolLimits, PoolSize};
use hollow::fleet::{Fleet, FleetSpec};
use hollow::profiles;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::Api;
use kube::api::PostParams;
use node_agent::Metrics;
use node_agent::pods::PodMetrics;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const NS: &str = "hollow-devices";
const NODES: usize = 2;
const RESOURCE: &str = "example.com/fpga";

fn pod(name: &str, count: u32, node: Option<&str>) -> anyhow::Result<Pod> {
    let mut spec = json!({
        "automountServiceAccountToken": false,
        "containers": [{"name": "main", "image": "busybox",
            "resources": {"limits": {RESOURCE: count.to_string()}}}],
    });
    if let Some(n) = node {
        spec["nodeName"] = n.into();
    }
    Ok(serde_json::from_value(
        json!({"metadata": {"name": name}, "spec": spec}),
    )?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_device_plugins_fill_allocatable_and_their_devices_go_to_pods() -> anyhow::Result<()> {
    init_logging();
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    let config = cp.admin_config().await?;
    let pool = ClientPool::new(&config, PoolSize::for_fleet(NODES, true, PoolLimits::default()))?;
    let token = CancellationToken::new();
    let yaml = format!(
        "profiles:\n  - name: devices\n    weight: 1\n    labels: {{fleet: devices}}\n    \
         devicePlugins: [{{resource: {RESOURCE}, count: 2}}]\n"
    );
    let spec = FleetSpec::new(NODES, "dev-{index}".to_owned(), profiles::parse(&yaml, "test")?)?;
    let fleet = Fleet::start(
        &spec,
        &pool,
        Arc::new(Metrics::unregistered()),
        Arc::new(PodMetrics::new()),
        token.clone(),
    )
    .await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    for name in ["dev-0", "dev-1"] {
        wait_for(
            &format!("{name} reporting its devices"),
            Duration::from_secs(60),
            || async {
                let n = nodes.get_opt(name).await?;
                let status = n.and_then(|n| n.status).unwrap_or_default();
                let of = |m: Option<std::collections::BTreeMap<String, _>>| {
                    m.and_then(
                        |m: std::collections::BTreeMap<
                            String,
                            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
                        >| { m.get(RESOURCE).map(|q| q.0.clone()) },
                    )
                };
                let both = (of(status.capacity), of(status.allocatable));
                Ok((both == (Some("2".into()), Some("2".into()))).then_some(()))
            },
        )
        .await?;
    }

    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}}))?;
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), NS);
    wait_for("the default service account", Duration::from_secs(30), || async {
        Ok(accounts.get_opt("default").await?.map(|_| ()))
    })
    .await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let pp = PostParams::default();
    // four devices on two nodes: four pods of one device each are scheduled and run
    for i in 0..4 {
        pods.create(&pp, &pod(&format!("one-{i}"), 1, None)?).await?;
    }
    let running = wait_for("four pods Running", Duration::from_secs(90), || async {
        let mut out = Vec::new();
        for i in 0..4 {
            let p = pods.get(&format!("one-{i}")).await?;
            let s = p.status.clone().unwrap_or_default();
            if s.phase.as_deref() != Some("Running") {
                return Ok(None);
            }
            out.push(p);
        }
        Ok(Some(out))
    })
    .await?;
    let mut per_node = std::collections::BTreeMap::<String, usize>::new();
    for p in &running {
        *per_node
            .entry(
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default(),
            )
            .or_default() += 1;
    }
    assert_eq!(
        per_node.values().copied().collect::<Vec<_>>(),
        [2, 2],
        "{per_node:?}"
    );
    // a fifth finds no free device: the scheduler holds it
    pods.create(&pp, &pod("fifth", 1, None)?).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let fifth = pods.get("fifth").await?;
    assert_eq!(
        fifth.spec.and_then(|s| s.node_name),
        None,
        "the fifth pod was not scheduled"
    );

    // sent to a node directly, asking for three of its two devices: refused as the kubelet refuses it
    pods.create(&pp, &pod("three", 3, Some("dev-0"))?).await?;
    let refused = wait_for("pod three refused", Duration::from_secs(60), || async {
        let s = pods.get("three").await?.status.unwrap_or_default();
        Ok((s.phase.as_deref() == Some("Failed")).then_some(s))
    })
    .await?;
    assert_eq!(refused.reason.as_deref(), Some("UnexpectedAdmissionError"));
    assert_eq!(
        refused.message.as_deref(),
        Some(
            "Pod was rejected: Allocate failed due to requested number of devices unavailable for \
             example.com/fpga. Requested: 3, Available: 0, which is unexpected"
        )
    );
    token.cancel();
    fleet.stop(Duration::from_secs(10)).await;
    Ok(())
}

/// The node's (capacity, allocatable) of `resource`.
async fn counts(
    nodes: &Api<Node>,
    name: &str,
    resource: &str,
) -> anyhow::Result<(Option<String>, Option<String>)> {
    let status = nodes
        .get_opt(name)
        .await?
        .and_then(|n| n.status)
        .unwrap_or_default();
    let of = |m: Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| { m.and_then(|m| m.get(resource).map(|q| q.0.clone())) };
    Ok((of(status.capacity), of(status.allocatable)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_device_leaves_allocatable_and_admission_while_capacity_keeps_it() -> anyhow::Result<()>
{
    const FLAKY: &str = "example.com/flaky";
    const NODE: &str = "flaky-0";
    let ns_name = "hollow-devices-health";
    init_logging();
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    let config = cp.admin_config().await?;
    let pool = ClientPool::new(&config, PoolSize::for_fleet(1, true, PoolLimits::default()))?;
    let token = CancellationToken::new();
    // one device of three unhealthy at a time, a different one each second; the node's status shows it at its
    // next update (every 10 s, as the kubelet's), which never again finds all three healthy
    let yaml = format!(
        "profiles:\n  - name: flaky\n    weight: 1\n    labels: {{fleet: flaky}}\n    \
         devicePlugins: [{{resource: {FLAKY}, count: 3, flapEvery: 1s}}]\n"
    );
    let spec = FleetSpec::new(1, "flaky-{index}".to_owned(), profiles::parse(&yaml, "test")?)?;
    let fleet = Fleet::start(
        &spec,
        &pool,
        Arc::new(Metrics::unregistered()),
        Arc::new(PodMetrics::new()),
        token.clone(),
    )
    .await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    let started = std::time::Instant::now();
    wait_for("capacity 3, allocatable 2", Duration::from_secs(60), || async {
        let c = counts(&nodes, NODE, FLAKY).await?;
        Ok((c == (Some("3".into()), Some("2".into()))).then_some(()))
    })
    .await?;
    println!(
        "an unhealthy device out of allocatable after {:?}",
        started.elapsed()
    );
    // as the unhealthy device changes, the counts stay
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(
            counts(&nodes, NODE, FLAKY).await?,
            (Some("3".into()), Some("2".into()))
        );
    }

    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": ns_name}}))?;
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns_name);
    wait_for("the default service account", Duration::from_secs(30), || async {
        Ok(accounts.get_opt("default").await?.map(|_| ()))
    })
    .await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns_name);
    let pp = PostParams::default();
    let mut three = pod("three", 3, Some(NODE))?;
    if let Some(c) = three.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        c.resources = serde_json::from_value(json!({"limits": {FLAKY: "3"}}))?;
    }
    pods.create(&pp, &three).await?;
    let refused = wait_for("pod three refused", Duration::from_secs(60), || async {
        let s = pods.get("three").await?.status.unwrap_or_default();
        Ok((s.phase.as_deref() == Some("Failed")).then_some(s))
    })
    .await?;
    assert_eq!(
        refused.message.as_deref(),
        Some(
            "Pod was rejected: Allocate failed due to requested number of devices unavailable for \
             example.com/flaky. Requested: 3, Available: 2, which is unexpected"
        ),
        "the unhealthy device is not offered"
    );
    token.cancel();
    fleet.stop(Duration::from_secs(10)).await;
    Ok(())
}
