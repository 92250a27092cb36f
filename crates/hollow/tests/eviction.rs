//! Node-pressure eviction on hollow nodes against the real control plane, one node per test.
//!
//! * Memory: a pod whose (scripted) memory grows past `evictionHard memory.available` puts the node under
//!   MemoryPressure; the real node lifecycle controller taints it `node.kubernetes.io/memory-pressure`, so the
//!   real scheduler holds a new BestEffort pod back; the eviction manager evicts the BestEffort hog (Failed /
//!   Evicted, the kubelet's message, an `Evicted` event) while the Guaranteed pod keeps running; after the
//!   transition period the condition and the taint go and the held-back pod runs.
//! * Disk: images and writable layers (scripted sizes) fill the node's image filesystem past `evictionHard
//!   imagefs.available`; the eviction manager first reclaims node-level resources — the unused image of a deleted
//!   pod goes, no pod is evicted — and only when that cannot help (a pod's writable layer keeps growing) evicts
//!   the pod that uses the most disk.

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

/// One hollow node of its own, registered, and a namespace whose pods the API server accepts.
struct Setup {
    admin: kube::Client,
    fleet: Fleet,
    token: CancellationToken,
    metrics: Arc<Metrics>,
    nodes: Api<Node>,
    pods: Api<Pod>,
}

/// Starts a one-node fleet of `profile` (labelled `fleet: <label>`), adjusted by `adjust`, and creates `ns`.
async fn setup(
    profile: &str,
    label: &str,
    ns: &str,
    adjust: impl FnOnce(&mut FleetSpec),
) -> anyhow::Result<Setup> {
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    let config = cp.admin_config().await?;
    let pool = ClientPool::new(&config, PoolSize::for_fleet(1, true, PoolLimits::default()))?;
    let token = CancellationToken::new();
    let metrics = Arc::new(Metrics::unregistered());
    let yaml = format!(
        "profiles:\n  - name: {label}\n    weight: 1\n    capacity: {profile}\n    labels: {{fleet: {label}}}\n"
    );
    let mut spec = FleetSpec::new(1, format!("{label}-{{index}}"), profiles::parse(&yaml, "test")?)?;
    adjust(&mut spec);
    let fleet = Fleet::start(
        &spec,
        &pool,
        metrics.clone(),
        Arc::new(PodMetrics::new()),
        token.clone(),
    )
    .await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    let node = format!("{label}-0");
    wait_for("the node Ready", Duration::from_secs(60), || async {
        let n = nodes.get_opt(&node).await?;
        Ok(n.and_then(|n| condition(&n, "Ready"))
            .filter(|(s, _)| s == "True")
            .map(|_| ()))
    })
    .await?;
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    wait_for("the default service account", Duration::from_secs(30), || async {
        Ok(accounts.get_opt("default").await?.map(|_| ()))
    })
    .await?;
    Ok(Setup {
        pods: Api::namespaced(admin.clone(), ns),
        admin,
        fleet,
        token,
        metrics,
        nodes,
    })
}

impl Setup {
    async fn stop(self) {
        self.token.cancel();
        self.fleet.stop(Duration::from_secs(10)).await;
    }
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

/// The status and reason of the node's condition `ty`.
fn condition(n: &Node, ty: &str) -> Option<(String, String)> {
    let c = n
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == ty)?;
    Some((c.status.clone(), c.reason.clone().unwrap_or_default()))
}

/// The messages of `object`'s events with `reason` (`ns: None` for a Node's).
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

async fn event(
    client: &kube::Client,
    ns: Option<&str>,
    object: &str,
    reason: &str,
) -> anyhow::Result<Option<String>> {
    Ok(events(client, ns, object, reason).await?.into_iter().next())
}

mod memory {
    use super::*;

    const NS: &str = "hollow-eviction";
    const NODE: &str = "evict-0";

    fn pod(name: &str, resources: serde_json::Value, memory: &str) -> anyhow::Result<Pod> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NS,
                         "annotations": {"cri-fake.node-agent.io/memory": memory}},
            "spec": {"nodeSelector": {"fleet": "evict"},
                     "containers": [{"name": name, "image": "registry.test/app:1", "resources": resources}]},
        }))?)
    }

    fn tainted(n: &Node) -> bool {
        n.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == "node.kubernetes.io/memory-pressure"))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn memory_pressure_taints_the_node_evicts_the_best_effort_hog_and_clears() -> anyhow::Result<()> {
        init_logging();
        let setup = setup("{cpu: \"4\", memory: 2Gi, pods: \"20\"}", "evict", NS, |spec| {
            spec.kubelet.eviction_hard = [(
                "memory.available".to_owned(),
                Threshold::Quantity("500Mi".parse().expect("a quantity")),
            )]
            .into();
            spec.kubelet.eviction_pressure_transition_period = Duration::from_secs(20);
        })
        .await?;
        let (admin, nodes, pods) = (&setup.admin, &setup.nodes, &setup.pods);
        let n = nodes.get(NODE).await?;
        assert_eq!(
            condition(&n, "MemoryPressure"),
            Some(("False".into(), "KubeletHasSufficientMemory".into()))
        );
        let pp = PostParams::default();
        let guaranteed = json!({"requests": {"cpu": "100m", "memory": "256Mi"},
                                "limits": {"cpu": "100m", "memory": "256Mi"}});
        pods.create(&pp, &pod("guaranteed", guaranteed, "200Mi")?).await?;
        // 2 GiB - 200 MiB - hog < 500 MiB once the hog passes ~1.35 GiB, about 15 s after it starts
        pods.create(&pp, &pod("hog", json!({}), "50Mi, ~1800Mi@20s")?)
            .await?;
        wait_for("both pods Running", Duration::from_secs(60), || async {
            let all = pods.list(&ListParams::default()).await?;
            Ok((all.items.iter().filter(|p| phase(p) == "Running").count() == 2).then_some(()))
        })
        .await?;

        wait_for(
            "MemoryPressure and its taint",
            Duration::from_secs(60),
            || async {
                let n = nodes.get(NODE).await?;
                Ok((condition(&n, "MemoryPressure")
                    == Some(("True".into(), "KubeletHasInsufficientMemory".into()))
                    && tainted(&n))
                .then_some(()))
            },
        )
        .await?;
        // the scheduler holds a BestEffort pod back from the tainted node
        pods.create(&pp, &pod("late", json!({}), "10Mi")?).await?;
        let why = wait_for("late unschedulable", Duration::from_secs(30), || async {
            event(admin, Some(NS), "late", "FailedScheduling").await
        })
        .await?;
        assert!(why.contains("untolerated taint"), "{why}");

        let hog = wait_for("the hog evicted", Duration::from_secs(60), || async {
            let p = pods.get("hog").await?;
            Ok((phase(&p) == "Failed").then_some(p))
        })
        .await?;
        let status = hog.status.unwrap_or_default();
        assert_eq!(status.reason.as_deref(), Some("Evicted"));
        let message = status.message.unwrap_or_default();
        assert!(
            message
                .starts_with("The node was low on resource: memory. Threshold quantity: 500Mi, available: "),
            "{message}"
        );
        assert!(
            message.contains("Container hog was using ")
                && message.ends_with("request is 0, has larger consumption of memory. "),
            "{message}"
        );
        let disrupted = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "DisruptionTarget")
            .map(|c| (c.status, c.reason.unwrap_or_default()));
        assert_eq!(disrupted, Some(("True".into(), "TerminationByKubelet".into())));
        let evicted = wait_for("an Evicted event", Duration::from_secs(30), || async {
            event(admin, Some(NS), "hog", "Evicted").await
        })
        .await?;
        assert_eq!(evicted, message);
        let reclaim = wait_for(
            "EvictionThresholdMet on the node",
            Duration::from_secs(30),
            || async { event(admin, None, NODE, "EvictionThresholdMet").await },
        )
        .await?;
        assert_eq!(reclaim, "Attempting to reclaim memory");
        assert_eq!(phase(&pods.get("guaranteed").await?), "Running");

        // pressure gone: after the transition period the condition clears, the controller lifts the taint and
        // the held-back pod runs
        wait_for(
            "MemoryPressure False, taint gone",
            Duration::from_secs(90),
            || async {
                let n = nodes.get(NODE).await?;
                Ok((condition(&n, "MemoryPressure")
                    == Some(("False".into(), "KubeletHasSufficientMemory".into()))
                    && !tainted(&n))
                .then_some(()))
            },
        )
        .await?;
        wait_for("late Running", Duration::from_secs(60), || async {
            Ok((phase(&pods.get("late").await?) == "Running").then_some(()))
        })
        .await?;
        assert_eq!(phase(&pods.get("guaranteed").await?), "Running");
        assert_eq!(
            setup.metrics.eviction_count("memory.available"),
            1,
            "one pod evicted for memory"
        );
        setup.stop().await;
        Ok(())
    }
}

mod disk {
    use super::*;

    const NS: &str = "hollow-disk";
    const NODE: &str = "disk-0";

    fn pod(name: &str, image: &str, annotations: serde_json::Value) -> anyhow::Result<Pod> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NS, "annotations": annotations},
            "spec": {"nodeSelector": {"fleet": "disk"}, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": name, "image": image}]},
        }))?)
    }

    fn has_image(n: &Node, name: &str) -> bool {
        n.status
            .as_ref()
            .and_then(|s| s.images.as_ref())
            .is_some_and(|images| images.iter().any(|i| i.names.iter().flatten().any(|n| n == name)))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn image_gc_relieves_disk_pressure_first_then_the_largest_writer_is_evicted() -> anyhow::Result<()>
    {
        init_logging();
        let profile = "{cpu: \"4\", memory: 8Gi, pods: \"20\", ephemeral-storage: 10Gi}";
        let setup = setup(profile, "disk", NS, |spec| {
            spec.kubelet.eviction_hard = [(
                "imagefs.available".to_owned(),
                Threshold::Quantity("3Gi".parse().expect("a quantity")),
            )]
            .into();
            spec.kubelet.eviction_pressure_transition_period = Duration::from_secs(5);
            spec.kubelet.image_minimum_gc_age = Duration::from_secs(1);
            // image GC passes every 2 s: they learn the images (first seen, last used) that reclaim may remove
            spec.gc.image_gc_period = Duration::from_secs(2);
        })
        .await?;
        let (admin, nodes, pods) = (&setup.admin, &setup.nodes, &setup.pods);
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
            || async { event(admin, None, NODE, "EvictionThresholdMet").await },
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
            let n = nodes.get(NODE).await?;
            Ok((condition(&n, "DiskPressure").map(|c| c.0).as_deref() == Some("False")).then_some(()))
        })
        .await?;
        assert_eq!(phase(&pods.get("keep").await?), "Running");
        assert!(
            events(admin, Some(NS), "keep", "Evicted").await?.is_empty(),
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
        assert_eq!(setup.metrics.eviction_count("imagefs.available"), 1);
        setup.stop().await;
        Ok(())
    }
}
