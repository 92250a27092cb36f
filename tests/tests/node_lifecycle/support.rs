//! Shared by the node lifecycle tests: this binary's control plane (short node grace period, audit log of
//! node requests), in-process agents on the fake runtime, polling and reading Nodes and events.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use cri_fake::{FakeConfig, FakeRuntime};
use k8s_openapi::api::core::v1::{Event, Node};
use kube::Api;
use kube::api::ListParams;
use node_agent::{Agent, AgentConfig, KubeletConfig, MachineInfo, Metrics, RunningAgent};
use tokio::time::Instant;

/// The controller-manager's `--node-monitor-grace-period` in this binary's control plane.
pub const GRACE: Duration = Duration::from_secs(20);

/// The controller-manager's `--cluster-signing-duration` in this binary's control plane.
pub const SIGNING_DURATION: Duration = Duration::from_secs(180);

pub fn audit_dir() -> PathBuf {
    std::env::temp_dir().join(format!("node-lifecycle-audit-{}", std::process::id()))
}

pub fn audit_log() -> PathBuf {
    audit_dir().join("audit.log")
}

/// The control plane of this test binary: short node grace period, audit log of node requests.
pub async fn control_plane() -> anyhow::Result<&'static testenv::ControlPlane> {
    let dir = audit_dir();
    std::fs::create_dir_all(&dir)?;
    let policy = dir.join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
         - level: Metadata\n  userGroups: [\"system:nodes\"]\n- level: None\n",
    )?;
    testenv::shared_with(testenv::Options {
        node_monitor_grace_period: Some(GRACE),
        apiserver_args: vec![
            format!("--audit-policy-file={}", policy.display()),
            format!("--audit-log-path={}", audit_log().display()),
            "--audit-log-maxsize=0".into(),
        ],
        // certificates issued through the CSR API live 3 minutes (8 with the signer's 5-minute backdating),
        // so rotation happens within a test
        controller_manager_args: vec![format!(
            "--cluster-signing-duration={}s",
            SIGNING_DURATION.as_secs()
        )],
        ..Default::default()
    })
    .await
}

pub struct InProcess {
    pub agent: RunningAgent,
    pub runtime: FakeRuntime,
    pub metrics: Arc<Metrics>,
}

pub async fn start_in_process(cp: &testenv::ControlPlane, name: &str) -> anyhow::Result<InProcess> {
    start_with(
        cp,
        name,
        KubeletConfig::default(),
        Arc::new(Metrics::unregistered()),
    )
    .await
}

/// An in-process agent with this kubelet configuration, counting into `metrics`.
pub async fn start_with(
    cp: &testenv::ControlPlane,
    name: &str,
    kubelet: KubeletConfig,
    metrics: Arc<Metrics>,
) -> anyhow::Result<InProcess> {
    let client = cp.node_client(name).await?;
    let runtime = FakeRuntime::new(FakeConfig {
        images: vec!["registry.k8s.io/pause:3.10".into()],
        ..Default::default()
    });
    let config = AgentConfig::new(
        name,
        "127.0.0.1".parse()?,
        Arc::new(kubelet),
        MachineInfo::synthetic(name),
    );
    let agent = Agent::builder(config, client, Arc::new(runtime.clone()))
        .metrics(metrics.clone())
        .pods(e2e::fake_pod_options(runtime.clone()))
        .build()?
        .start();
    Ok(InProcess {
        agent,
        runtime,
        metrics,
    })
}

pub fn condition<'a>(node: &'a Node, ty: &str) -> Option<&'a k8s_openapi::api::core::v1::NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == ty)
}

pub fn ready_status(node: &Node) -> Option<String> {
    condition(node, "Ready").map(|c| c.status.clone())
}

pub fn taint_keys(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().map(|t| format!("{}:{}", t.key, t.effect)).collect())
        .unwrap_or_default()
}

/// Polls every 50 ms until `check` gives `Some`, failing after `timeout`.
pub async fn poll<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn wait_node(
    nodes: &Api<Node>,
    name: &str,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&Node) -> bool,
) -> anyhow::Result<Node> {
    poll(what, timeout, || async {
        Ok(nodes.get_opt(name).await?.filter(|n| pred(n)))
    })
    .await
}

pub async fn event_reasons(admin: &kube::Client, node: &str) -> anyhow::Result<Vec<String>> {
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let list = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={node}")))
        .await?;
    Ok(list.items.iter().filter_map(|e| e.reason.clone()).collect())
}

/// The reasons of the events about `node` that the agent itself reported (`source.component=kubelet`): the
/// node-lifecycle controller's own (`RegisteredNode`) left out.
pub async fn agent_event_reasons(admin: &kube::Client, node: &str) -> anyhow::Result<Vec<String>> {
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let list = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={node}")))
        .await?;
    Ok(list
        .items
        .iter()
        .filter(|e| e.source.as_ref().and_then(|s| s.component.as_deref()) == Some("kubelet"))
        .filter_map(|e| e.reason.clone())
        .collect())
}

/// Requests of `user` in the audit log by (verb, resource[/subresource]); `None` without an audit log
/// (attached to an outside control plane).
pub fn audit_counts(user: &str) -> Option<BTreeMap<(String, String), u64>> {
    let text = std::fs::read_to_string(audit_log()).ok()?;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["stage"] != "ResponseComplete" || v["user"]["username"] != user {
            continue;
        }
        let verb = v["verb"].as_str().unwrap_or_default().to_owned();
        let resource = v["objectRef"]["resource"].as_str().unwrap_or_default();
        let resource = match v["objectRef"]["subresource"].as_str() {
            Some(sub) if !sub.is_empty() => format!("{resource}/{sub}"),
            _ => resource.to_owned(),
        };
        *out.entry((verb, resource)).or_insert(0) += 1;
    }
    Some(out)
}
