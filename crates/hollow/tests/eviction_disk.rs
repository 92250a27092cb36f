//! Disk pressure on a hollow node against the real control plane: images and writable layers (scripted sizes)
//! fill the node's image filesystem past `evictionHard imagefs.available`; the eviction manager first reclaims
//! node-level resources — the unused image of a deleted pod goes, no pod is evicted — and only when that cannot
//! help (a pod's writable layer keeps growing) evicts the pod that uses the most disk.

use std::sync::Arc;
use std::time::Duration;

use e2e::{init_logging, wait_for};
use hollow::client_pool::{ClientPool, PoolLimits, PoolSize};
use hollow::fleet::{Fleet, FleetSpec};
use hollow::profiles;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use node_agent::Metrics;
use node_agent::config::Threshold;
use node_agent::pods::PodMetrics;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const NS: &str = "hollow-disk";
const NODE: &str = "disk-0";

fn pod(name: &str, image: &str, annotations: serde_json::Value) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "annotations": annotations},
        "spec": {"nodeSelector": {"fleet": "disk"}, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": name, "image": image}]},
    }))?)
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

fn disk_pressure(n: &Node) -> Option<String> {
    let c = n
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "DiskPressure")?;
    Some(c.status.clone())
}

fn has_image(n: &Node, name: &str) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.images.as_ref())
        .is_some_and(|images| images.iter().any(|i| i.names.iter().flatten().any(|n| n == name)))
}

async fn events(
    client: &kube::Client,
    ns: Option<&str>,
    object: &str,
    reason: &str,
) -> anyhow::Result<Vec<String>> {
    let api: Api<Event> = match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let list = api
        .list(&ListParams::default().fields(&format!("involvedObject.name={object}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.message)
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_gc_relieves_disk_pressure_first_then_the_largest_writer_is_evicted() -> anyhow::Result<()> {
    init_logging();
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    let config = cp.admin_config().await?;
    let pool = ClientPool::new(&config, PoolSize::for_fleet(1, true, PoolLimits::default()))?;
    let token = CancellationToken::new();
    let metrics = Arc::new(Metrics::unregistered());
    let yaml = "profiles:\n  - name: disk\n    weight: 1\n    \
                capacity: {cpu: \"4\", memory: 8Gi, pods: \"20\", ephemeral-storage: 10Gi}\n    labels: {fleet: disk}\n";
    let mut spec = FleetSpec::new(1, "disk-{index}".to_owned(), profiles::parse(yaml, "test")?)?;
    spec.kubelet.eviction_hard = [(
        "imagefs.available".to_owned(),
        Threshold::Quantity("3Gi".parse()?),
    )]
    .into();
    spec.kubelet.eviction_pressure_transition_period = Duration::from_secs(5);
    spec.kubelet.image_minimum_gc_age = Duration::from_secs(1);
    // image GC passes every 2 s: they learn the images (first seen, last used) that reclaim may remove
    spec.gc.image_gc_period = Duration::from_secs(2);
    let fleet = Fleet::start(
        &spec,
        &pool,
        metrics.clone(),
        Arc::new(PodMetrics::new()),
        token.clone(),
    )
    .await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_for("the node registered", Duration::from_secs(60), || async {
        Ok(nodes.get_opt(NODE).await?.map(|_| ()))
    })
    .await?;
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
    let big = json!({"cri-fake.node-agent.io/image-size": "4Gi"});

    // a 4 GiB image that nothing uses once its pod is gone
    pods.create(&pp, &pod("old", "registry.test/big-old:1", big.clone())?)
        .await?;
    wait_for("old Running", Duration::from_secs(60), || async {
        Ok((phase(&pods.get("old").await?) == "Running").then_some(()))
    })
    .await?;
    pods.delete("old", &DeleteParams::default()).await?;
    wait_for("old gone", Duration::from_secs(60), || async {
        Ok(pods.get_opt("old").await?.is_none().then_some(()))
    })
    .await?;
    wait_for("big-old listed on the node", Duration::from_secs(30), || async {
        Ok(has_image(&nodes.get(NODE).await?, "registry.test/big-old:1").then_some(()))
    })
    .await?;

    // a second 4 GiB image: 8 GiB of 10 used, under the 3 GiB threshold
    pods.create(&pp, &pod("keep", "registry.test/big-keep:1", big.clone())?)
        .await?;
    wait_for("keep Running", Duration::from_secs(60), || async {
        Ok((phase(&pods.get("keep").await?) == "Running").then_some(()))
    })
    .await?;
    let reclaim = wait_for(
        "EvictionThresholdMet on the node",
        Duration::from_secs(60),
        || async {
            Ok(events(&admin, None, NODE, "EvictionThresholdMet")
                .await?
                .into_iter()
                .next())
        },
    )
    .await?;
    assert_eq!(reclaim, "Attempting to reclaim ephemeral-storage");
    wait_for("the unused image removed", Duration::from_secs(60), || async {
        let n = nodes.get(NODE).await?;
        Ok(
            (!has_image(&n, "registry.test/big-old:1") && has_image(&n, "registry.test/big-keep:1"))
                .then_some(()),
        )
    })
    .await?;
    wait_for("DiskPressure False", Duration::from_secs(60), || async {
        Ok((disk_pressure(&nodes.get(NODE).await?).as_deref() == Some("False")).then_some(()))
    })
    .await?;
    assert_eq!(phase(&pods.get("keep").await?), "Running");
    assert!(
        events(&admin, Some(NS), "keep", "Evicted").await?.is_empty(),
        "image GC was enough: nothing evicted"
    );

    // a writable layer growing to 5 GiB: nothing left to reclaim, the writer goes
    let filling = json!({"cri-fake.node-agent.io/disk": "1Mi, ~5Gi@10s"});
    pods.create(&pp, &pod("filler", "registry.test/small:1", filling)?)
        .await?;
    let filler = wait_for("filler evicted", Duration::from_secs(90), || async {
        let p = pods.get("filler").await?;
        Ok((phase(&p) == "Failed").then_some(p))
    })
    .await?;
    let status = filler.status.unwrap_or_default();
    assert_eq!(status.reason.as_deref(), Some("Evicted"));
    let message = status.message.unwrap_or_default();
    assert!(
        message.starts_with(
            "The node was low on resource: ephemeral-storage. Threshold quantity: 3Gi, available: "
        ),
        "{message}"
    );
    assert!(message.contains("Container filler was using "), "{message}");
    assert_eq!(phase(&pods.get("keep").await?), "Running");
    assert_eq!(metrics.eviction_count("imagefs.available"), 1);

    token.cancel();
    fleet.stop(Duration::from_secs(10)).await;
    Ok(())
}
