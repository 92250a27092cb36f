//! Volumes and environment sources on hollow nodes against the real control plane: a hollow node reads the
//! ConfigMaps, Secrets and service account tokens its pods name, as a kubelet does, so a missing object holds a
//! pod back exactly as on a real node — `CreateContainerConfigError` for an environment reference,
//! `FailedMount` for a volume — and the pod runs once the object exists. Every pod's service account token
//! (the `kube-api-access-*` volume the API server adds) is requested from the TokenRequest API. Objects are
//! followed by watches of their own (the default `Watch` strategy), never read by GET, and let go when the pods
//! naming them are gone. Services, RuntimeClasses and CSIDrivers come from one informer of each for the fleet.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use e2e::{init_logging, wait_for};
use hollow::client_pool::{ClientPool, PoolLimits, PoolSize};
use hollow::fleet::{Fleet, FleetSpec};
use hollow::profiles;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Pod, ServiceAccount};
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use node_agent::Metrics;
use node_agent::pods::PodMetrics;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const NS: &str = "hollow-volumes";
const NODES: usize = 2;

fn pod(name: &str, container: serde_json::Value, volumes: serde_json::Value) -> anyhow::Result<Pod> {
    let mut c = container;
    c["name"] = json!("app");
    c["image"] = json!("registry.test/app:1");
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"nodeSelector": {"fleet": "volumes"}, "containers": [c], "volumes": volumes},
    }))?)
}

/// The waiting reason and message of the pod's container, if it waits.
fn waiting(p: &Pod) -> Option<(String, String)> {
    let s = p.status.as_ref()?.container_statuses.as_ref()?.first()?;
    let w = s.state.as_ref()?.waiting.as_ref()?;
    Some((w.reason.clone()?, w.message.clone().unwrap_or_default()))
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

async fn event_for(client: &kube::Client, pod: &str, reason: &str) -> anyhow::Result<Option<String>> {
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let list = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={pod}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .find(|e| e.reason.as_deref() == Some(reason))
        .and_then(|e| e.message))
}

/// Watches of `resource` in `scope` the API server holds open now: `cluster` (every namespace), `namespace`,
/// or `resource` (one object, named by `fieldSelector=metadata.name=...`).
async fn watches(client: &kube::Client, resource: &str, scope: &str) -> anyhow::Result<u64> {
    let text = client
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    let (resource, scope) = (format!("resource=\"{resource}\""), format!("scope=\"{scope}\""));
    Ok(text
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_longrunning_requests{")
                && l.contains(&resource)
                && l.contains(&scope)
                && l.contains("verb=\"WATCH\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

/// The cluster-wide watches of Services, RuntimeClasses and CSIDrivers held now.
async fn informer_watches(client: &kube::Client) -> anyhow::Result<[u64; 3]> {
    Ok([
        watches(client, "services", "cluster").await?,
        watches(client, "runtimeclasses", "cluster").await?,
        watches(client, "csidrivers", "cluster").await?,
    ])
}

/// Watches of single ConfigMaps and Secrets (the nodes' per-object watches, and the control plane's own of a few
/// objects).
async fn object_watches(client: &kube::Client) -> anyhow::Result<u64> {
    Ok(watches(client, "configmaps", "resource").await? + watches(client, "secrets", "resource").await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_objects_hold_pods_back_with_the_kubelets_reasons_until_they_exist() -> anyhow::Result<()> {
    init_logging();
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    let config = cp.admin_config().await?;
    let (before, control_plane_objects) = (informer_watches(&admin).await?, object_watches(&admin).await?);
    let pool = ClientPool::new(&config, PoolSize::for_fleet(NODES, true, PoolLimits::default()))?;
    let metrics = Arc::new(Metrics::unregistered());
    let token = CancellationToken::new();
    let yaml = "profiles:\n  - name: volumes\n    weight: 1\n    labels: {fleet: volumes}\n";
    let spec = FleetSpec::new(NODES, "vol-{index}".to_owned(), profiles::parse(yaml, "test")?)?;
    let fleet = Fleet::start(
        &spec,
        &pool,
        metrics.clone(),
        Arc::new(PodMetrics::new()),
        token.clone(),
    )
    .await?;
    wait_for("the fleet registered", Duration::from_secs(60), || async {
        Ok((fleet.view().registered() == NODES).then_some(()))
    })
    .await?;
    // the fleet's nodes share one informer of each kind: one more cluster-wide watch each, not one per node
    let held = std::sync::Mutex::new([0; 3]);
    let shared = wait_for(
        "one Services, RuntimeClasses and CSIDrivers watch for the fleet",
        Duration::from_secs(30),
        || async {
            let now = informer_watches(&admin).await?;
            let added = [0, 1, 2].map(|i| now[i].saturating_sub(before[i]));
            *held.lock().unwrap() = added;
            Ok((added == [1, 1, 1]).then_some(()))
        },
    )
    .await;
    println!(
        "[volumes] cluster-wide watches the fleet added (services, runtimeclasses, csidrivers): {:?}",
        held.lock().unwrap()
    );
    shared?;

    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}}))?;
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    // the API server refuses pods until the namespace's default service account exists
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), NS);
    wait_for("the default service account", Duration::from_secs(30), || async {
        Ok(accounts.get_opt("default").await?.map(|_| ()))
    })
    .await?;

    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let pp = PostParams::default();
    let env_ref = json!({"env": [{"name": "GREETING",
        "valueFrom": {"configMapKeyRef": {"name": "app-config", "key": "greeting"}}}]});
    pods.create(&pp, &pod("env-ref", env_ref, json!([]))?).await?;
    let bad_key = json!({"env": [{"name": "X",
        "valueFrom": {"configMapKeyRef": {"name": "app-config", "key": "nope"}}}]});
    pods.create(&pp, &pod("bad-key", bad_key, json!([]))?).await?;
    let volume = json!([{"name": "cfg", "configMap": {"name": "app-config"}}]);
    let mount = json!({"volumeMounts": [{"name": "cfg", "mountPath": "/etc/app"}]});
    pods.create(&pp, &pod("vol-ref", mount, volume)?).await?;
    let optional = json!({"env": [{"name": "X", "valueFrom": {"secretKeyRef":
        {"name": "nowhere", "key": "k", "optional": true}}}]});
    pods.create(&pp, &pod("optional", optional, json!([]))?).await?;

    // before the ConfigMap exists
    let missing = "configmap \"app-config\" not found";
    wait_for(
        "env-ref waits with CreateContainerConfigError",
        Duration::from_secs(60),
        || async {
            let p = pods.get("env-ref").await?;
            Ok((waiting(&p) == Some(("CreateContainerConfigError".into(), missing.into()))).then_some(()))
        },
    )
    .await?;
    let failed = wait_for("a Failed event for env-ref", Duration::from_secs(30), || async {
        event_for(&admin, "env-ref", "Failed").await
    })
    .await?;
    assert_eq!(failed, format!("Error: {missing}"));
    let mount_failed = wait_for(
        "a FailedMount event for vol-ref",
        Duration::from_secs(60),
        || async { event_for(&admin, "vol-ref", "FailedMount").await },
    )
    .await?;
    assert_eq!(
        mount_failed,
        format!("MountVolume.SetUp failed for volume \"cfg\" : {missing}")
    );
    let vol_ref = pods.get("vol-ref").await?;
    assert_eq!(phase(&vol_ref), "Pending");
    assert_eq!(
        waiting(&vol_ref).map(|w| w.0).as_deref(),
        Some("ContainerCreating"),
        "no container is created while a volume is missing"
    );
    wait_for("the optional reference runs", Duration::from_secs(60), || async {
        Ok((phase(&pods.get("optional").await?) == "Running").then_some(()))
    })
    .await?;

    // the default strategy (Watch) follows each object with a watch of its own: no node reads one by GET
    let gets = |code| metrics.request_count("get", "configmaps", code);
    assert_eq!(
        (gets(200), gets(404)),
        (0, 0),
        "ConfigMaps read by GET (200, 404)"
    );

    // the ConfigMap appears: both pods that waited for it run, the one naming a missing key still waits
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "app-config", "namespace": NS}, "data": {"greeting": "hello"}
    }))?;
    Api::<ConfigMap>::namespaced(admin.clone(), NS)
        .create(&pp, &cm)
        .await?;
    let appeared = std::time::Instant::now();
    for name in ["env-ref", "vol-ref"] {
        wait_for(&format!("{name} Running"), Duration::from_secs(120), || async {
            Ok((phase(&pods.get(name).await?) == "Running").then_some(()))
        })
        .await?;
    }
    println!(
        "[volumes] both pods Running {:.1} s after the ConfigMap appeared",
        appeared.elapsed().as_secs_f64(),
    );
    assert_eq!(
        (gets(200), gets(404)),
        (0, 0),
        "ConfigMaps read by GET (200, 404)"
    );
    let followed = object_watches(&admin)
        .await?
        .saturating_sub(control_plane_objects);
    println!("[volumes] the nodes' ConfigMap and Secret watches the API server holds: {followed}");
    // each node's pods name their namespace's kube-root-ca.crt (the token volume) and app-config
    assert!(followed >= 4, "the nodes follow {followed} objects by watch");
    wait_for("bad-key names its key", Duration::from_secs(60), || async {
        let p = pods.get("bad-key").await?;
        let want = (
            "CreateContainerConfigError".to_owned(),
            format!("couldn't find key nope in ConfigMap {NS}/app-config"),
        );
        Ok((waiting(&p) == Some(want)).then_some(()))
    })
    .await?;

    // every pod's kube-api-access volume: a bound token per pod from the TokenRequest API
    let with_token = pods
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|p| {
            p.spec.iter().flat_map(|s| s.volumes.iter().flatten()).any(|v| {
                v.projected
                    .iter()
                    .flat_map(|pr| pr.sources.iter().flatten())
                    .any(|s| s.service_account_token.is_some())
            })
        })
        .count();
    assert_eq!(with_token, 4, "the API server gave every pod a token volume");
    let issued = metrics.request_count("create", "serviceaccounts/token", 201);
    assert!(
        issued >= 4,
        "one token request per pod at least, counted {issued}"
    );
    println!("[volumes] {issued} service account tokens issued to the fleet's pods");

    // a pod naming a RuntimeClass gets its handler from the fleet's informer, never by GET
    let class: RuntimeClass = serde_json::from_value(json!({
        "metadata": {"name": "hollow-volumes-class"}, "handler": "runc"
    }))?;
    let classes: Api<RuntimeClass> = Api::all(admin.clone());
    classes.create(&pp, &class).await?;
    let mut with_class = pod("with-class", json!({}), json!([]))?;
    with_class.spec.as_mut().context("spec")?.runtime_class_name = Some("hollow-volumes-class".into());
    pods.create(&pp, &with_class).await?;
    wait_for("with-class Running", Duration::from_secs(60), || async {
        Ok((phase(&pods.get("with-class").await?) == "Running").then_some(()))
    })
    .await?;
    let reads = (
        metrics.request_count("get", "runtimeclasses", 200),
        metrics.request_count("get", "runtimeclasses", 404),
        metrics.request_count("list", "services", 200),
        metrics.request_count("get", "services", 200),
    );
    assert_eq!(
        reads,
        (0, 0, 0, 0),
        "RuntimeClasses read by GET (200, 404), Services listed, read by GET"
    );

    // the pods go: every per-object watch their nodes held ends with the last pod naming its object
    let opened = object_watches(&admin)
        .await?
        .saturating_sub(control_plane_objects);
    pods.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    let gone = std::time::Instant::now();
    wait_for("the pods gone", Duration::from_secs(60), || async {
        Ok(pods
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    wait_for(
        "the nodes' ConfigMap and Secret watches closed",
        Duration::from_secs(30),
        || async { Ok((object_watches(&admin).await? <= control_plane_objects).then_some(())) },
    )
    .await?;
    println!(
        "[volumes] {opened} ConfigMap and Secret watches closed {:.1} s after the pods' deletion",
        gone.elapsed().as_secs_f64()
    );
    classes
        .delete("hollow-volumes-class", &DeleteParams::default())
        .await?;
    token.cancel();
    fleet.stop(Duration::from_secs(10)).await;
    Ok(())
}
