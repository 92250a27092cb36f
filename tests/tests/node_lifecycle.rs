//! Node lifecycle against the real control plane, with node credentials under the Node authorizer and
//! NodeRestriction: registration with every field, the lease, the status loop, the controller-manager's view of
//! a dead agent, restart, runtime faults, idle write volume, graceful stop and configuration errors; in
//! [`recovery`], what the agent does about changes others make: a Node left by a previous run, a lease
//! conflict, a deleted Node, repeated events.
//!
//! Agents run in-process (library + the in-memory fake runtime) except where the process matters: killing it
//! (SIGKILL), stopping it (SIGTERM) and a bad configuration file (exit code) run the `node-agent` binary.
//! The control plane of this test binary runs the controller-manager with a 20 s node-monitor grace period and
//! the API server with an audit log of every request made by a node identity, so write volume is measured by
//! the API server itself as well as by the agent's own counters.

#[path = "node_lifecycle/recovery.rs"]
mod recovery;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context, bail};
use cri_fake::{FakeConfig, FakeRuntime};
use e2e::init_logging;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::Api;
use kube::api::ListParams;
use node_agent::{Agent, AgentConfig, KubeletConfig, MachineInfo, Metrics, RunningAgent};
use tokio::time::Instant;

/// The controller-manager's `--node-monitor-grace-period` in this binary's control plane.
const GRACE: Duration = Duration::from_secs(20);

fn audit_dir() -> PathBuf {
    std::env::temp_dir().join(format!("node-lifecycle-audit-{}", std::process::id()))
}

fn audit_log() -> PathBuf {
    audit_dir().join("audit.log")
}

/// The control plane of this test binary: short node grace period, audit log of node requests.
async fn control_plane() -> anyhow::Result<&'static testenv::ControlPlane> {
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
        ..Default::default()
    })
    .await
}

// ---------------------------------------------------------------------------------------------------------
// helpers

struct InProcess {
    agent: RunningAgent,
    runtime: FakeRuntime,
    metrics: Arc<Metrics>,
}

async fn start_in_process(cp: &testenv::ControlPlane, name: &str) -> anyhow::Result<InProcess> {
    start_with(
        cp,
        name,
        KubeletConfig::default(),
        Arc::new(Metrics::unregistered()),
    )
    .await
}

/// An in-process agent with this kubelet configuration, counting into `metrics`.
async fn start_with(
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
        .build()?
        .start();
    Ok(InProcess {
        agent,
        runtime,
        metrics,
    })
}

fn condition<'a>(node: &'a Node, ty: &str) -> Option<&'a k8s_openapi::api::core::v1::NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == ty)
}

fn ready_status(node: &Node) -> Option<String> {
    condition(node, "Ready").map(|c| c.status.clone())
}

fn taint_keys(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().map(|t| format!("{}:{}", t.key, t.effect)).collect())
        .unwrap_or_default()
}

/// Polls every 50 ms until `check` gives `Some`, failing after `timeout`.
async fn poll<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
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

async fn wait_node(
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

async fn event_reasons(admin: &kube::Client, node: &str) -> anyhow::Result<Vec<String>> {
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let list = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={node}")))
        .await?;
    Ok(list.items.iter().filter_map(|e| e.reason.clone()).collect())
}

/// The `node-agent` binary of this build (built on demand; cargo does not build other packages' binaries for a
/// test of this package), or the one `NODE_AGENT_BIN` names.
fn node_agent_binary() -> anyhow::Result<PathBuf> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("NODE_AGENT_BIN") {
            return Ok(PathBuf::from(bin));
        }
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .ok_or("no target dir")?
            .to_path_buf();
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(&workspace)
            .args(["build", "-q", "-p", "node-agent", "--bin", "node-agent"]);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().map_err(|e| format!("running cargo build: {e}"))?;
        if !status.success() {
            return Err(format!("cargo build -p node-agent failed: {status}"));
        }
        Ok(profile_dir.join("node-agent"))
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

struct AgentProcess {
    child: Child,
    log: PathBuf,
}

impl AgentProcess {
    fn start(cp: &testenv::ControlPlane, name: &str, extra: &[&str]) -> anyhow::Result<Self> {
        let bin = node_agent_binary()?;
        let log = audit_dir().join(format!(
            "{name}-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_millis()
        ));
        let child = Command::new(bin)
            .arg("--kubeconfig")
            .arg(cp.node_kubeconfig(name)?)
            .args([
                "--hostname-override",
                name,
                "--runtime",
                "fake",
                "--node-ip",
                "127.0.0.1",
            ])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting node-agent")?;
        Ok(Self { child, log })
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn signal(&self, sig: nix::sys::signal::Signal) -> anyhow::Result<()> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id())?);
        nix::sys::signal::kill(pid, sig)?;
        Ok(())
    }

    async fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<std::process::ExitStatus> {
        poll("node-agent to exit", timeout, || {
            let r = self.child.try_wait();
            async move { Ok(r?) }
        })
        .await
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------------------
// must-show tests

/// A started agent's Node is Ready within 5 s with every field a kubelet fills; the lease and events exist.
#[tokio::test]
async fn node_is_ready_within_five_seconds_with_every_field() -> anyhow::Result<()> {
    init_logging();
    let cp = control_plane().await?;
    let admin = cp.admin_client().await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    let name = "nl-ready";

    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry));
    let t0 = Instant::now();
    let a = start_with(cp, name, KubeletConfig::default(), metrics).await?;
    let node = wait_node(&nodes, name, "Ready=True", Duration::from_secs(5), |n| {
        ready_status(n).as_deref() == Some("True")
    })
    .await?;
    let ready_after = t0.elapsed();
    println!("[node_lifecycle] {name}: Ready {ready_after:?} after agent start");
    assert!(ready_after < Duration::from_secs(5));

    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("kubernetes.io/hostname").map(String::as_str),
        Some(name)
    );
    assert_eq!(labels.get("kubernetes.io/os").map(String::as_str), Some("linux"));
    assert_eq!(
        labels.get("kubernetes.io/arch").map(String::as_str),
        Some(node_agent::machine::go_arch())
    );
    assert_eq!(
        labels.get("beta.kubernetes.io/os").map(String::as_str),
        Some("linux")
    );
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get("volumes.kubernetes.io/controller-managed-attach-detach")
            .map(String::as_str),
        Some("true")
    );

    let st = node.status.clone().context("status")?;
    let addrs: Vec<(String, String)> = st
        .addresses
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert_eq!(
        addrs,
        vec![
            ("InternalIP".into(), "127.0.0.1".into()),
            ("Hostname".into(), name.into())
        ]
    );
    let info = st.node_info.clone().context("nodeInfo")?;
    println!(
        "[node_lifecycle] {name}: labels {labels:?}\n[node_lifecycle] {name}: addresses {addrs:?}\n\
         [node_lifecycle] {name}: nodeInfo {info:?}\n[node_lifecycle] {name}: capacity {:?}\n\
         [node_lifecycle] {name}: allocatable {:?}",
        st.capacity
            .as_ref()
            .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.0)).collect::<Vec<_>>()),
        st.allocatable
            .as_ref()
            .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.0)).collect::<Vec<_>>()),
    );
    let machine = MachineInfo::synthetic(name);
    assert_eq!(info.machine_id, machine.machine_id);
    assert_eq!(info.system_uuid, machine.system_uuid);
    assert!(!info.boot_id.is_empty() && !info.kernel_version.is_empty() && !info.os_image.is_empty());
    assert!(
        info.container_runtime_version.starts_with("cri-fake://"),
        "{}",
        info.container_runtime_version
    );
    assert_eq!(info.kubelet_version, node_agent::config::KUBELET_VERSION);
    assert_eq!(
        (info.operating_system.as_str(), info.architecture.as_str()),
        ("linux", node_agent::machine::go_arch())
    );
    let q = |m: &Option<BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
             k: &str| {
        m.as_ref()
            .and_then(|m| m.get(k))
            .map(|q| q.0.clone())
            .unwrap_or_default()
    };
    assert_eq!(q(&st.capacity, "cpu"), "4");
    assert_eq!(q(&st.capacity, "memory"), "16Gi");
    assert_eq!(q(&st.capacity, "pods"), "110");
    assert_eq!(q(&st.capacity, "ephemeral-storage"), "100Gi");
    assert_eq!(
        q(&st.allocatable, "memory"),
        "16284Mi",
        "16Gi - evictionHard memory.available 100Mi"
    );
    // 100Gi - 10 % (float32 percentage, as the kubelet computes it); the API server re-canonicalizes the string
    let eph: node_agent::quantity::Quantity = q(&st.allocatable, "ephemeral-storage").parse()?;
    assert_eq!(eph.value(), 96_636_764_000);
    assert_eq!(q(&st.allocatable, "cpu"), "4");
    assert_eq!(
        st.daemon_endpoints
            .as_ref()
            .and_then(|d| d.kubelet_endpoint.as_ref())
            .map(|e| e.port),
        Some(10250)
    );
    let images: Vec<String> = st
        .images
        .clone()
        .unwrap_or_default()
        .into_iter()
        .flat_map(|i| i.names.unwrap_or_default())
        .collect();
    assert!(
        images.iter().any(|i| i == "registry.k8s.io/pause:3.10"),
        "{images:?}"
    );
    for (ty, reason) in [
        ("MemoryPressure", "KubeletHasSufficientMemory"),
        ("DiskPressure", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "KubeletHasSufficientPID"),
        ("Ready", "KubeletReady"),
    ] {
        let c = condition(&node, ty).with_context(|| format!("{ty} condition"))?;
        assert_eq!(c.reason.as_deref(), Some(reason), "{ty}");
    }

    // The controller-manager assigns the pod CIDR; the agent hands it to the runtime.
    let node = wait_node(&nodes, name, "spec.podCIDR", Duration::from_secs(15), |n| {
        n.spec.as_ref().and_then(|s| s.pod_cidr.as_ref()).is_some()
    })
    .await?;
    let cidr = node
        .spec
        .as_ref()
        .and_then(|s| s.pod_cidr.clone())
        .unwrap_or_default();
    poll("the runtime to get the pod CIDR", Duration::from_secs(15), || {
        let got = a.runtime.pod_cidr();
        let cidr = cidr.clone();
        async move { Ok((got == cidr).then_some(())) }
    })
    .await?;
    println!(
        "[node_lifecycle] {name}: podCIDR {cidr} assigned by the controller-manager and handed to the runtime"
    );
    // ... and published to the agent's other managers (pod admission reads the Node from here)
    let snapshot = a.agent.context().node.borrow().clone().context("node snapshot")?;
    assert_eq!(snapshot.pod_cidrs, vec![cidr.clone()]);
    assert_eq!(
        snapshot.addresses[0],
        ("InternalIP".to_string(), "127.0.0.1".to_string())
    );

    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    let lease = leases.get(name).await?;
    let spec = lease.spec.context("lease spec")?;
    assert_eq!(spec.holder_identity.as_deref(), Some(name));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    assert!(spec.renew_time.is_some());
    let owner = lease.metadata.owner_references.unwrap_or_default();
    assert_eq!(owner.len(), 1);
    assert_eq!(
        (owner[0].kind.as_str(), owner[0].uid.as_str()),
        ("Node", node.metadata.uid.as_deref().unwrap_or(""))
    );

    let want = [
        "Starting",
        "NodeHasSufficientMemory",
        "NodeHasNoDiskPressure",
        "NodeHasSufficientPID",
    ];
    let reasons = poll("node events", Duration::from_secs(10), || async {
        let r = event_reasons(&admin, name).await?;
        Ok(want.iter().all(|w| r.iter().any(|x| x == w)).then_some(r))
    })
    .await?;
    println!("[node_lifecycle] {name}: events {reasons:?}");
    assert_eq!(a.metrics.request_count("create", "nodes", 201), 1);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    for phase in ["", "_pre_registration", "_registration", "_post_registration"] {
        let line = format!("kubelet_node_startup{phase}_duration_seconds_count 1");
        assert!(text.contains(&line), "{line} missing from\n{text}");
    }
    a.agent.stop(Duration::from_secs(10)).await?;
    Ok(())
}

/// Kill the agent: the controller-manager marks the node Unknown and taints it unreachable after its grace
/// period. Restart it: Ready again, taint removed by the controller-manager, same Node object.
#[tokio::test]
async fn killed_agent_goes_unknown_and_tainted_then_recovers_on_restart() -> anyhow::Result<()> {
    init_logging();
    let cp = control_plane().await?;
    let nodes: Api<Node> = Api::all(cp.admin_client().await?);
    let name = "nl-kill";

    let mut agent = AgentProcess::start(cp, name, &[])?;
    let node = match wait_node(&nodes, name, "Ready=True", Duration::from_secs(20), |n| {
        ready_status(n).as_deref() == Some("True")
    })
    .await
    {
        Ok(n) => n,
        Err(e) => bail!("{e}\nagent log:\n{}", agent.log_tail()),
    };
    let uid = node.metadata.uid.clone();

    agent.child.kill()?;
    agent.child.wait()?;
    let killed = Instant::now();
    let node = wait_node(
        &nodes,
        name,
        "Ready=Unknown with the unreachable taint",
        GRACE + Duration::from_secs(60),
        |n| {
            ready_status(n).as_deref() == Some("Unknown")
                && taint_keys(n)
                    .iter()
                    .any(|t| t.starts_with("node.kubernetes.io/unreachable:"))
        },
    )
    .await?;
    let ready = condition(&node, "Ready").context("Ready")?;
    println!(
        "[node_lifecycle] {name}: killed; controller-manager set Ready={} ({:?}: {:?}) and taints {:?} after {:?} (grace period {GRACE:?})",
        ready.status,
        ready.reason,
        ready.message,
        taint_keys(&node),
        killed.elapsed()
    );
    assert_eq!(ready.reason.as_deref(), Some("NodeStatusUnknown"));

    let restarted = Instant::now();
    let agent = AgentProcess::start(cp, name, &[])?;
    let node = match wait_node(
        &nodes,
        name,
        "Ready=True after restart",
        Duration::from_secs(20),
        |n| ready_status(n).as_deref() == Some("True"),
    )
    .await
    {
        Ok(n) => n,
        Err(e) => bail!("{e}\nagent log:\n{}", agent.log_tail()),
    };
    let ready_after = restarted.elapsed();
    let node_clean = wait_node(
        &nodes,
        name,
        "unreachable taint removed",
        Duration::from_secs(30),
        |n| {
            !taint_keys(n).iter().any(|t| {
                t.starts_with("node.kubernetes.io/unreachable:")
                    || t.starts_with("node.kubernetes.io/not-ready:")
            })
        },
    )
    .await?;
    println!(
        "[node_lifecycle] {name}: restarted; Ready after {ready_after:?}, taints cleared after {:?} (now {:?})",
        restarted.elapsed(),
        taint_keys(&node_clean)
    );
    assert_eq!(node.metadata.uid, uid, "the same Node object, not a new one");
    let same_name = nodes
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await?;
    assert_eq!(same_name.items.len(), 1);
    let admin = cp.admin_client().await?;
    let reasons = poll(
        "a NodeReady event after the restart",
        Duration::from_secs(10),
        || async {
            let r = event_reasons(&admin, name).await?;
            Ok(r.iter().any(|x| x == "NodeReady").then_some(r))
        },
    )
    .await?;
    println!("[node_lifecycle] {name}: events {reasons:?}");
    Ok(())
}

/// An idle agent's writes over two minutes, counted by the agent and by the API server's audit log.
#[tokio::test]
async fn idle_agent_writes_over_two_minutes() -> anyhow::Result<()> {
    init_logging();
    let cp = control_plane().await?;
    let nodes: Api<Node> = Api::all(cp.admin_client().await?);
    let name = "nl-idle";
    let a = start_in_process(cp, name).await?;
    wait_node(&nodes, name, "Ready=True", Duration::from_secs(10), |n| {
        ready_status(n).as_deref() == Some("True")
    })
    .await?;
    // let start-up settle: events written, pod CIDR learned
    tokio::time::sleep(Duration::from_secs(5)).await;

    let kinds: [(&str, &str, u16); 8] = [
        ("update", "leases", 200),
        ("create", "leases", 201),
        ("patch", "nodes/status", 200),
        ("patch", "nodes", 200),
        ("create", "nodes", 201),
        ("create", "events", 201),
        ("patch", "events", 200),
        ("get", "nodes", 200),
    ];
    let ours = |m: &Metrics| kinds.map(|(v, r, c)| m.request_count(v, r, c));
    let audited = audit_counts(&format!("system:node:{name}"));
    let before = ours(&a.metrics);
    let window = Duration::from_secs(120);
    tokio::time::sleep(window).await;
    let after = ours(&a.metrics);
    let audited_after = audit_counts(&format!("system:node:{name}"));

    println!(
        "[node_lifecycle] {name}: requests in {window:?} of idling, by the agent's counters / by the API server's audit log:"
    );
    let mut delta = BTreeMap::new();
    for (i, (verb, resource, _)) in kinds.iter().enumerate() {
        let d = after[i] - before[i];
        delta.insert((*verb, *resource), d);
        let audit = match (&audited, &audited_after) {
            (Some(b), Some(a)) => {
                let key = ((*verb).to_owned(), (*resource).to_owned());
                (a.get(&key).copied().unwrap_or(0) - b.get(&key).copied().unwrap_or(0)).to_string()
            }
            _ => "n/a".into(),
        };
        println!("[node_lifecycle]   {verb:>6} {resource:<13} agent={d:<3} audit={audit}");
    }
    if let (Some(b), Some(a)) = (&audited, &audited_after) {
        let writes = |m: &BTreeMap<(String, String), u64>| {
            m.iter()
                .filter(|((v, _), _)| v != "get" && v != "list" && v != "watch")
                .map(|(_, n)| n)
                .sum::<u64>()
        };
        println!(
            "[node_lifecycle]   total writes (audit): {}",
            writes(a) - writes(b)
        );
    }
    let lease_updates = delta[&("update", "leases")];
    assert!(
        (11..=13).contains(&lease_updates),
        "{lease_updates} lease renewals in 2 minutes (every 10 s + jitter)"
    );
    assert_eq!(
        delta[&("patch", "nodes/status")],
        0,
        "no status change, report interval 5 min: no status write"
    );
    assert_eq!(delta[&("create", "events")] + delta[&("patch", "events")], 0);
    assert_eq!(
        delta[&("create", "nodes")] + delta[&("patch", "nodes")] + delta[&("create", "leases")],
        0
    );
    if let (Some(b), Some(a)) = (&audited, &audited_after) {
        let key = ("update".to_owned(), "leases".to_owned());
        let audit_updates = a.get(&key).copied().unwrap_or(0) - b.get(&key).copied().unwrap_or(0);
        assert!(
            audit_updates.abs_diff(lease_updates) <= 1,
            "audit {audit_updates} vs agent {lease_updates}"
        );
    }
    a.agent.stop(Duration::from_secs(10)).await?;
    Ok(())
}

/// Requests of `user` in the audit log by (verb, resource[/subresource]); `None` without an audit log
/// (attached to an outside control plane).
fn audit_counts(user: &str) -> Option<BTreeMap<(String, String), u64>> {
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

/// The fake runtime reports RuntimeReady=false: Ready=False with the reason; back when it recovers. Same for
/// the network.
#[tokio::test]
async fn runtime_down_makes_the_node_not_ready_with_the_reason() -> anyhow::Result<()> {
    init_logging();
    let cp = control_plane().await?;
    let admin = cp.admin_client().await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    let name = "nl-runtime";
    let a = start_in_process(cp, name).await?;
    wait_node(&nodes, name, "Ready=True", Duration::from_secs(10), |n| {
        ready_status(n).as_deref() == Some("True")
    })
    .await?;

    for (what, fault) in [("runtime", true), ("network", false)] {
        let set = |ok: bool| {
            if fault {
                a.runtime.set_runtime_ready(ok)
            } else {
                a.runtime.set_network_ready(ok)
            }
        };
        set(false);
        let t = Instant::now();
        let node = wait_node(&nodes, name, "Ready=False", Duration::from_secs(20), |n| {
            ready_status(n).as_deref() == Some("False")
        })
        .await?;
        let c = condition(&node, "Ready").context("Ready")?;
        println!(
            "[node_lifecycle] {name}: {what} down -> Ready=False after {:?}: reason {:?}, message {:?}",
            t.elapsed(),
            c.reason,
            c.message
        );
        assert_eq!(c.reason.as_deref(), Some("KubeletNotReady"));
        let msg = c.message.clone().unwrap_or_default();
        let expected = if fault {
            "container runtime not ready: RuntimeReady=false"
        } else {
            "container runtime network not ready: NetworkReady=false"
        };
        assert!(msg.starts_with(expected), "{msg}");

        set(true);
        let t = Instant::now();
        wait_node(&nodes, name, "Ready=True again", Duration::from_secs(20), |n| {
            ready_status(n).as_deref() == Some("True")
        })
        .await?;
        println!(
            "[node_lifecycle] {name}: {what} back -> Ready=True after {:?}",
            t.elapsed()
        );
    }
    let reasons = poll(
        "NodeNotReady and NodeReady events",
        Duration::from_secs(10),
        || async {
            let r = event_reasons(&admin, name).await?;
            Ok((r.iter().any(|x| x == "NodeNotReady") && r.iter().any(|x| x == "NodeReady")).then_some(r))
        },
    )
    .await?;
    println!("[node_lifecycle] {name}: events {reasons:?}");
    a.agent.stop(Duration::from_secs(10)).await?;
    Ok(())
}

/// SIGTERM: the agent stops cleanly (exit 0); with --mark-unschedulable-on-shutdown the node is cordoned, and
/// the next start lifts exactly that cordon.
#[tokio::test]
async fn sigterm_stops_gracefully_and_the_shutdown_cordon_is_undone_at_restart() -> anyhow::Result<()> {
    init_logging();
    let cp = control_plane().await?;
    let nodes: Api<Node> = Api::all(cp.admin_client().await?);
    let name = "nl-term";
    let flags = ["--mark-unschedulable-on-shutdown"];
    let mut agent = AgentProcess::start(cp, name, &flags)?;
    if let Err(e) = wait_node(&nodes, name, "Ready=True", Duration::from_secs(20), |n| {
        ready_status(n).as_deref() == Some("True")
    })
    .await
    {
        bail!("{e}\nagent log:\n{}", agent.log_tail());
    }
    agent.signal(nix::sys::signal::Signal::SIGTERM)?;
    let t = Instant::now();
    let status = agent.wait_exit(Duration::from_secs(20)).await?;
    println!(
        "[node_lifecycle] {name}: SIGTERM -> exited {status} after {:?}",
        t.elapsed()
    );
    assert!(status.success(), "exit status {status}\n{}", agent.log_tail());
    let node = nodes.get(name).await?;
    assert_eq!(node.spec.as_ref().and_then(|s| s.unschedulable), Some(true));

    let agent = AgentProcess::start(cp, name, &flags)?;
    if let Err(e) = wait_node(&nodes, name, "schedulable again", Duration::from_secs(20), |n| {
        n.spec.as_ref().and_then(|s| s.unschedulable) != Some(true)
            && ready_status(n).as_deref() == Some("True")
    })
    .await
    {
        bail!("{e}\nagent log:\n{}", agent.log_tail());
    }
    Ok(())
}

/// A bad configuration file: a clear error naming the field, exit code != 0.
#[tokio::test]
async fn bad_config_file_exits_non_zero_naming_the_field() -> anyhow::Result<()> {
    init_logging();
    let bin = node_agent_binary()?;
    let dir = audit_dir();
    std::fs::create_dir_all(&dir)?;
    let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
    for (body, field) in [
        ("nodeStatusUpdateFrequncy: 10s\n", "nodeStatusUpdateFrequncy"),
        ("nodeStatusUpdateFrequency: soon\n", "nodeStatusUpdateFrequency"),
        ("maxPods: -3\n", "maxPods"),
        (
            "evictionHard:\n  memory.available: lots\n",
            "evictionHard[memory.available]",
        ),
        (
            "registerWithTaints:\n- key: a\n  effect: Sometimes\n",
            "registerWithTaints[0]",
        ),
    ] {
        let path = dir.join(format!("bad-{field}.yaml"));
        std::fs::write(&path, format!("{head}{body}"))?;
        let out = Command::new(&bin)
            .arg("--config")
            .arg(&path)
            .args(["--runtime", "fake"])
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        let error_line = stderr
            .lines()
            .find(|l| l.contains("error"))
            .unwrap_or_default()
            .to_owned();
        println!(
            "[node_lifecycle] bad config ({field}): exit {:?}: {error_line}",
            out.status.code()
        );
        assert!(!out.status.success(), "exit status {}", out.status);
        assert_eq!(out.status.code(), Some(1));
        assert!(error_line.contains(field), "{stderr}");
    }
    Ok(())
}
