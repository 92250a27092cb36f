//! Helpers of the pod lifecycle tests: agents on the fake runtime with the scripted probe transport, waiting for
//! nodes, namespaces and pods, reading events.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use cri_fake::{FakeConfig, FakeRuntime};
use e2e::wait_for;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use node_agent::pods::{PodMetrics, PodSource};
use node_agent::{Agent, AgentConfig, KubeletConfig, MachineInfo, RunningAgent};
use runtime_api::{Runtime, cri};
use serde_json::json;
use tokio::time::Instant;

pub struct TestAgent {
    pub agent: RunningAgent,
    pub runtime: FakeRuntime,
}

/// Tests that measure timings hold this shared; the 50-pod Deployment test holds it exclusively, so the
/// load it puts on two shared cores does not land inside a measured window.
pub static TIMING: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// What to start an agent with beyond the defaults (a fresh fake runtime, own metrics, own watch).
#[derive(Default)]
pub struct Setup {
    pub runtime: Option<FakeRuntime>,
    pub metrics: Option<Arc<PodMetrics>>,
    pub source: Option<PodSource>,
    /// The agent's KubeletConfiguration (default: the kubelet's defaults).
    pub kubelet: Option<KubeletConfig>,
}

pub async fn start_agent(
    cp: &testenv::ControlPlane,
    name: &str,
    pool: &str,
    setup: Setup,
) -> anyhow::Result<TestAgent> {
    let runtime = setup
        .runtime
        .unwrap_or_else(|| FakeRuntime::new(FakeConfig::default()));
    let mut config = AgentConfig::new(
        name,
        "127.0.0.1".parse()?,
        Arc::new(setup.kubelet.unwrap_or_default()),
        MachineInfo::synthetic(name),
    );
    config.node_labels = Arc::new([("pool".to_owned(), pool.to_owned())].into());
    let mut pods = e2e::fake_pod_options(runtime.clone());
    if let Some(m) = setup.metrics {
        pods.metrics = m;
    }
    if let Some(source) = setup.source {
        pods.source = source;
    }
    let agent = Agent::builder(config, cp.node_client(name).await?, Arc::new(runtime.clone()))
        .pods(pods)
        .build()?
        .start();
    Ok(TestAgent { agent, runtime })
}

/// Waits until the node is Ready, has a pod CIDR, and the runtime hands out addresses from it.
pub async fn wait_node_ready(admin: &kube::Client, a: &TestAgent, name: &str) -> anyhow::Result<String> {
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_for(
        &format!("node {name} ready with a pod CIDR"),
        Duration::from_secs(60),
        || async {
            let Some(node) = nodes.get_opt(name).await? else {
                return Ok(None);
            };
            let ready = node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let cidr = node.spec.as_ref().and_then(|s| s.pod_cidr.clone());
            Ok(match cidr {
                Some(cidr) if ready && a.runtime.pod_cidr().as_deref() == Some(cidr.as_str()) => Some(cidr),
                _ => None,
            })
        },
    )
    .await
}

pub async fn namespace(admin: &kube::Client, name: &str) -> anyhow::Result<()> {
    let ns: Api<Namespace> = Api::all(admin.clone());
    if ns.get_opt(name).await?.is_none() {
        ns.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}}))?,
        )
        .await?;
    }
    let sa: Api<ServiceAccount> = Api::namespaced(admin.clone(), name);
    wait_for("default service account", Duration::from_secs(30), || async {
        Ok(sa.get_opt("default").await?.map(|_| ()))
    })
    .await
}

pub fn in_cidr(ip: &str, cidr: &str) -> bool {
    let Some((net, bits)) = cidr.split_once('/') else {
        return false;
    };
    let (Ok(ip), Ok(net), Ok(bits)) = (
        ip.parse::<Ipv4Addr>(),
        net.parse::<Ipv4Addr>(),
        bits.parse::<u32>(),
    ) else {
        return false;
    };
    let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
    u32::from(ip) & mask == u32::from(net) & mask
}

pub async fn create_pod(pods: &Api<Pod>, v: serde_json::Value) -> anyhow::Result<Pod> {
    Ok(pods
        .create(&PostParams::default(), &serde_json::from_value(v)?)
        .await?)
}

pub fn pod_json(
    name: &str,
    node: &str,
    spec: serde_json::Value,
    annotations: serde_json::Value,
) -> serde_json::Value {
    let mut spec = spec;
    spec["nodeName"] = json!(node);
    json!({"metadata": {"name": name, "annotations": annotations}, "spec": spec})
}

pub fn condition(p: &Pod, ty: &str) -> Option<bool> {
    let c = p
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == ty)?;
    Some(c.status == "True")
}

pub fn app_status(p: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerStatus> {
    p.status.as_ref()?.container_statuses.as_ref()?.first()
}

pub async fn wait_pod(
    pods: &Api<Pod>,
    name: &str,
    what: &str,
    secs: u64,
    pred: impl Fn(&Pod) -> bool,
) -> anyhow::Result<Pod> {
    wait_for(&format!("{name}: {what}"), Duration::from_secs(secs), || async {
        Ok(pods.get_opt(name).await?.filter(|p| pred(p)))
    })
    .await
}

pub async fn pod_events(admin: &kube::Client, ns: &str, pod: &str) -> anyhow::Result<Vec<(String, String)>> {
    let events: Api<Event> = Api::namespaced(admin.clone(), ns);
    let list = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={pod}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect())
}

/// Stops the agent (an error when it does not stop within 10 s); the runtime it leaves.
pub async fn stop(a: TestAgent) -> anyhow::Result<FakeRuntime> {
    a.agent.stop(Duration::from_secs(10)).await?;
    Ok(a.runtime)
}

/// The sum of the samples of `metrics` whose line starts with `prefix` (a name, with `{` or its whole label
/// set), as the text exposition writes them; 0 when there is none.
pub fn pod_metric_sum(metrics: &PodMetrics, prefix: &str) -> f64 {
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("metrics encode into a String");
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Every container the runtime holds: `(id, attempt, state)`, sorted.
pub async fn containers(rt: &FakeRuntime) -> anyhow::Result<Vec<(String, u32, i32)>> {
    let list = rt.list_containers(cri::ListContainersRequest::default()).await?;
    let mut v: Vec<(String, u32, i32)> = list
        .containers
        .into_iter()
        .map(|c| (c.id, c.metadata.map(|m| m.attempt).unwrap_or(u32::MAX), c.state))
        .collect();
    v.sort();
    Ok(v)
}

/// Deletes pod `name` with `grace` seconds and follows it until it is gone: how long that took, and the
/// last version of the object seen before (its final status).
pub async fn delete_and_watch(
    pods: &Api<Pod>,
    name: &str,
    grace: u32,
) -> anyhow::Result<(Duration, Option<Pod>)> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher::watcher(pods.clone(), config).boxed();
    let asked = Instant::now();
    pods.delete(
        name,
        &DeleteParams {
            grace_period_seconds: Some(grace),
            ..Default::default()
        },
    )
    .await?;
    let mut last: Option<Pod> = None;
    let follow = async {
        while let Some(ev) = stream.next().await {
            match ev? {
                watcher::Event::Delete(p) => {
                    // the object as it was when deleted: its final status
                    last = Some(p);
                    return Ok(asked.elapsed());
                }
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => last = Some(p),
                _ => {}
            }
        }
        anyhow::bail!("watch of {name} ended")
    };
    // a guard against hanging only: the tests' deletions take seconds
    let took = tokio::time::timeout(Duration::from_secs(120), follow).await??;
    Ok((took, last))
}

/// Checks what the Deployment test expects of every pod — Running, Ready, its IP in its node's pod CIDR, host
/// IP, conditions, a complete container status — and returns its node.
pub fn check_running_pod(p: &Pod, cidrs: &HashMap<String, String>) -> anyhow::Result<String> {
    let name = p.metadata.name.clone().unwrap_or_default();
    let node = p
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .context("bound")?;
    let s = p.status.as_ref().context("status")?;
    assert_eq!(s.phase.as_deref(), Some("Running"), "{name}");
    let ip = s.pod_ip.as_deref().context("podIP")?;
    assert!(
        in_cidr(ip, &cidrs[&node]),
        "{name} on {node}: {ip} not in {}",
        cidrs[&node]
    );
    assert_eq!(s.pod_ips.as_ref().map(|v| v[0].ip.as_str()), Some(ip));
    assert_eq!(s.host_ip.as_deref(), Some("127.0.0.1"), "{name}");
    assert_eq!(s.qos_class.as_deref(), Some("Burstable"));
    assert!(s.start_time.is_some());
    for ty in [
        "PodReadyToStartContainers",
        "Initialized",
        "ContainersReady",
        "Ready",
        "PodScheduled",
    ] {
        assert_eq!(condition(p, ty), Some(true), "{name} {ty}");
    }
    let c = app_status(p).context("containerStatuses")?;
    assert!(
        c.ready && c.started == Some(true) && c.restart_count == 0,
        "{name}: {c:?}"
    );
    assert!(
        c.container_id
            .as_deref()
            .is_some_and(|id| id.starts_with("cri-fake://")),
        "{c:?}"
    );
    assert!(!c.image.is_empty() && !c.image_id.is_empty(), "{c:?}");
    assert!(
        c.state
            .as_ref()
            .and_then(|st| st.running.as_ref())
            .and_then(|r| r.started_at.as_ref())
            .is_some()
    );
    Ok(node)
}
