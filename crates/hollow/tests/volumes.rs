//! Volumes and environment sources on hollow nodes against the real control plane: a hollow node reads the
//! ConfigMaps, Secrets and service account tokens its pods name, as a kubelet does, so a missing object holds a
//! pod back exactly as on a real node — `CreateContainerConfigError` for an environment reference,
//! `FailedMount` for a volume — and the pod runs once the object exists. Every pod's service account token
//! (the `kube-api-access-*` volume the API server adds) is requested from the TokenRequest API. Objects are
//! followed by watches of their own (the default `Watch` strategy), never read by GET.

use std::sync::Arc;
use std::time::Duration;

use e2e::{init_logging, wait_for};
use hollow::client_pool::{ClientPool, PoolLimits, PoolSize};
use hollow::fleet::{Fleet, FleetSpec};
use hollow::profiles;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Pod, ServiceAccount};
use kube::Api;
use kube::api::{ListParams, PostParams};
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

/// Watches of ConfigMaps in one namespace the API server holds open now (the controllers' are cluster-wide).
async fn namespaced_config_map_watches(client: &kube::Client) -> anyhow::Result<u64> {
    let text = client
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    Ok(text
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_longrunning_requests{")
                && l.contains("resource=\"configmaps\"")
                && l.contains("scope=\"namespace\"")
                && l.contains("verb=\"WATCH\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_objects_hold_pods_back_with_the_kubelets_reasons_until_they_exist() -> anyhow::Result<()> {
    init_logging();
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    let config = cp.admin_config().await?;
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
    let watches = namespaced_config_map_watches(&admin).await?;
    println!("[volumes] ConfigMap watches in a namespace the API server holds: {watches}");
    assert!(watches >= 1, "no node follows its pods' ConfigMaps by watch");
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
    token.cancel();
    fleet.stop(Duration::from_secs(10)).await;
    Ok(())
}
