//! Node-pressure eviction on a hollow node against the real control plane: a pod whose (scripted) memory grows
//! past `evictionHard memory.available` puts the node under MemoryPressure; the real node lifecycle controller
//! taints it `node.kubernetes.io/memory-pressure`, so the real scheduler holds a new BestEffort pod back; the
//! eviction manager evicts the BestEffort hog (Failed / Evicted, the kubelet's message, an `Evicted` event)
//! while the Guaranteed pod keeps running; after the transition period the condition and the taint go and
//! the held-back pod runs.

use std::sync::Arc;
use std::time::Duration;

use e2e::{init_logging, wait_for};
use hollow::client_pool::{ClientPool, PoolLimits, PoolSize};
use hollow::fleet::{Fleet, FleetSpec};
use hollow::profiles;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod, ServiceAccount};
use kube::Api;
use kube::api::{ListParams, PostParams};
use node_agent::Metrics;
use node_agent::config::Threshold;
use node_agent::pods::PodMetrics;
use serde_json::json;
use tokio_util::sync::CancellationToken;

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

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

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

fn tainted(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == "node.kubernetes.io/memory-pressure"))
}

async fn event(
    client: &kube::Client,
    ns: Option<&str>,
    object: &str,
    reason: &str,
) -> anyhow::Result<Option<String>> {
    let events: Api<Event> = match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let list = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={object}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .find(|e| e.reason.as_deref() == Some(reason))
        .and_then(|e| e.message))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_pressure_taints_the_node_evicts_the_best_effort_hog_and_clears() -> anyhow::Result<()> {
    init_logging();
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    let config = cp.admin_config().await?;
    let pool = ClientPool::new(&config, PoolSize::for_fleet(1, true, PoolLimits::default()))?;
    let token = CancellationToken::new();
    let metrics = Arc::new(Metrics::unregistered());
    let yaml = "profiles:\n  - name: evict\n    weight: 1\n    capacity: {cpu: \"4\", memory: 2Gi, pods: \"20\"}\n    labels: {fleet: evict}\n";
    let mut spec = FleetSpec::new(1, "evict-{index}".to_owned(), profiles::parse(yaml, "test")?)?;
    spec.kubelet.eviction_hard = [(
        "memory.available".to_owned(),
        Threshold::Quantity("500Mi".parse()?),
    )]
    .into();
    spec.kubelet.eviction_pressure_transition_period = Duration::from_secs(20);
    let fleet = Fleet::start(
        &spec,
        &pool,
        metrics.clone(),
        Arc::new(PodMetrics::new()),
        token.clone(),
    )
    .await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_for("the node Ready", Duration::from_secs(60), || async {
        let n = nodes.get_opt(NODE).await?;
        Ok(n.and_then(|n| condition(&n, "Ready"))
            .filter(|(s, _)| s == "True")
            .map(|_| ()))
    })
    .await?;
    let n = nodes.get(NODE).await?;
    assert_eq!(
        condition(&n, "MemoryPressure"),
        Some(("False".into(), "KubeletHasSufficientMemory".into()))
    );

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
        event(&admin, Some(NS), "late", "FailedScheduling").await
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
        message.starts_with("The node was low on resource: memory. Threshold quantity: 500Mi, available: "),
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
        event(&admin, Some(NS), "hog", "Evicted").await
    })
    .await?;
    assert_eq!(evicted, message);
    let reclaim = wait_for(
        "EvictionThresholdMet on the node",
        Duration::from_secs(30),
        || async { event(&admin, None, NODE, "EvictionThresholdMet").await },
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
        metrics.eviction_count("memory.available"),
        1,
        "one pod evicted for memory"
    );

    token.cancel();
    fleet.stop(Duration::from_secs(10)).await;
    Ok(())
}
