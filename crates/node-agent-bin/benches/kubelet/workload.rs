//! The workloads, the same for both agents: pods of one busybox container (`localhost/busybox:local`, imported
//! into containerd by its set-up, `imagePullPolicy: Never`, so no pull is measured) that sleeps and exits on
//! SIGTERM, placed by the scheduler on the agent's node (node affinity on its name), with the default service
//! account token volume as any pod has. Times run from just before the create request to the watch event that
//! shows the pod (every pod) in phase Running.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use runtime_api::{Runtime, cri};
use serde_json::json;

/// The namespace of every pod the benchmark makes.
pub const NAMESPACE: &str = "kbench";

/// Creates [`NAMESPACE`] and waits for its default service account (the pods mount its token).
pub async fn namespace(client: &kube::Client) -> anyhow::Result<Api<Pod>> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
    e2e::wait_for("the default service account", Duration::from_secs(60), || async {
        Ok(accounts.get_opt("default").await?.map(|_| ()))
    })
    .await?;
    Ok(Api::namespaced(client.clone(), NAMESPACE))
}

/// The pod template: one busybox container on `node`, labelled `app=<app>`.
fn template(node: &str, app: &str) -> serde_json::Value {
    json!({
        "metadata": {"labels": {"app": app}},
        "spec": {
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]}}},
            "terminationGracePeriodSeconds": 10,
            "containers": [{
                "name": "sleep",
                "image": "localhost/busybox:local",
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"],
            }],
        },
    })
}

fn is_running(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Watches pods matching `params` from `resource_version` until `want` distinct pods are Running; answers
/// their names. Fails after `timeout`.
async fn watch_until_running(
    pods: &Api<Pod>,
    params: &WatchParams,
    resource_version: String,
    want: usize,
    timeout: Duration,
) -> anyhow::Result<BTreeSet<String>> {
    let run = async {
        let mut running = BTreeSet::new();
        let mut rv = resource_version;
        loop {
            let mut stream = pods.watch(params, &rv).await?.boxed();
            while let Some(event) = stream.try_next().await? {
                let pod = match event {
                    WatchEvent::Added(p) | WatchEvent::Modified(p) => p,
                    WatchEvent::Deleted(p) => {
                        running.remove(p.metadata.name.as_deref().unwrap_or_default());
                        continue;
                    }
                    WatchEvent::Bookmark(b) => {
                        rv = b.metadata.resource_version;
                        continue;
                    }
                    WatchEvent::Error(e) => bail!("watch: {e:?}"),
                };
                if let Some(v) = &pod.metadata.resource_version {
                    rv.clone_from(v);
                }
                let name = pod.metadata.name.clone().unwrap_or_default();
                if is_running(&pod) {
                    running.insert(name);
                    if running.len() >= want {
                        return Ok(running);
                    }
                } else {
                    running.remove(&name);
                }
            }
            // the server ended the watch: resume from the last version seen
        }
    };
    tokio::time::timeout(timeout, run)
        .await
        .with_context(|| format!("{want} pods not Running within {timeout:?}"))?
}

/// Waits until no pod labelled `app=<app>` exists.
async fn wait_gone(pods: &Api<Pod>, app: &str, timeout: Duration) -> anyhow::Result<()> {
    let params = ListParams::default().labels(&format!("app={app}"));
    e2e::wait_for(&format!("pods app={app} gone"), timeout, || async {
        Ok(pods.list(&params).await?.items.is_empty().then_some(()))
    })
    .await
}

/// Creates `count` pods on `node` one after another, each waited for Running and deleted (and waited for
/// gone) before the next; answers each one's create → Running time in seconds.
pub async fn single_pods(pods: &Api<Pod>, node: &str, count: usize) -> anyhow::Result<Vec<f64>> {
    let mut times = Vec::with_capacity(count);
    for i in 0..count {
        let app = format!("single-{node}-{i}");
        let mut pod = template(node, &app);
        pod["metadata"]["name"] = json!(app);
        let pod: Pod = serde_json::from_value(pod)?;
        let t0 = tokio::time::Instant::now();
        let created = pods.create(&PostParams::default(), &pod).await?;
        let params = WatchParams::default().fields(&format!("metadata.name={app}"));
        let rv = created.metadata.resource_version.context("resourceVersion")?;
        watch_until_running(pods, &params, rv, 1, Duration::from_secs(120)).await?;
        times.push(t0.elapsed().as_secs_f64());
        let running = pods.get(&app).await?;
        check_node(&running, node)?;
        pods.delete(&app, &DeleteParams::default()).await?;
        wait_gone(pods, &app, Duration::from_secs(120)).await?;
    }
    Ok(times)
}

fn check_node(pod: &Pod, node: &str) -> anyhow::Result<()> {
    let on = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    anyhow::ensure!(
        on == Some(node),
        "pod {:?} runs on {on:?}, not {node}",
        pod.metadata.name
    );
    Ok(())
}

/// The burst: a Deployment of `replicas` pods on `node`; answers the time from its creation until all its pods
/// were Running. Then checks that every pod is on `node` and that containerd runs a ready sandbox and a running
/// container for each.
pub async fn burst(
    client: &kube::Client,
    pods: &Api<Pod>,
    cri: &cri_real::RemoteRuntime,
    node: &str,
    replicas: usize,
) -> anyhow::Result<f64> {
    let app = format!("burst-{node}");
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": app},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": app}},
            "template": template(node, &app),
        },
    }))?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let t0 = tokio::time::Instant::now();
    let created = deployments.create(&PostParams::default(), &deployment).await?;
    let params = WatchParams::default().labels(&format!("app={app}"));
    let rv = created.metadata.resource_version.context("resourceVersion")?;
    let names = watch_until_running(pods, &params, rv, replicas, Duration::from_secs(300)).await?;
    let secs = t0.elapsed().as_secs_f64();

    // the pods ran on this node, in this containerd
    let listed = pods
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await?
        .items;
    for pod in listed
        .iter()
        .filter(|p| names.contains(p.metadata.name.as_deref().unwrap_or_default()))
    {
        check_node(pod, node)?;
    }
    let in_namespace = |labels: &std::collections::HashMap<String, String>| {
        labels.get("io.kubernetes.pod.namespace").map(String::as_str) == Some(NAMESPACE)
            && labels
                .get("io.kubernetes.pod.name")
                .is_some_and(|n| names.contains(n))
    };
    let sandboxes = cri
        .list_pod_sandbox(cri::ListPodSandboxRequest::default())
        .await?
        .items
        .into_iter()
        .filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32 && in_namespace(&s.labels))
        .count();
    let containers = cri
        .list_containers(cri::ListContainersRequest::default())
        .await?
        .containers
        .into_iter()
        .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32 && in_namespace(&c.labels))
        .count();
    anyhow::ensure!(
        sandboxes == replicas && containers == replicas,
        "containerd runs {sandboxes} ready sandboxes and {containers} running containers of the {replicas} pods"
    );
    Ok(secs)
}

/// Deletes the burst's Deployment and waits until its pods are gone.
pub async fn delete_burst(client: &kube::Client, pods: &Api<Pod>, node: &str) -> anyhow::Result<()> {
    let app = format!("burst-{node}");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    deployments.delete(&app, &DeleteParams::background()).await?;
    wait_gone(pods, &app, Duration::from_secs(180)).await
}
