//! Faults of the real node's parts, each a test that holds the node alone (they run one after another): the
//! container runtime stopped for a minute and SIGKILLed while pods run and while a burst of pods is being
//! created ([`runtime`]: the node goes NotReady with the runtime's reason after the kubelet's 30 s allowance
//! and comes back, no pod restarted, no second sandbox or container, every pod Running at the end), and
//! node-agent SIGKILLed at random points of a 30-pod burst ([`agent_kill`]: one sandbox per pod after each
//! restart, and nothing left on the node — mounts, cgroups, network namespaces, pod directories — once the pods
//! are deleted), and the pods' directory on a full file system ([`disk`]: new pods refused with the kubelet's
//! error and nothing half-written, running pods untouched, and started once there is room). A binary of its own (its own node and control plane), since it stops the runtime and the
//! agent that every test of a node would share. Needs root (or `NODE_AGENT_SKIP_REAL_NODE=1` to skip).

/// The containerd the node runs on (2.x: its event stream is one of the things a restart breaks).
const CONTAINERD: &str = "2";

#[allow(dead_code)]
#[path = "real_node/harness.rs"]
mod harness;

#[path = "real_node_faults/agent_kill.rs"]
mod agent_kill;
#[path = "real_node_faults/control_plane.rs"]
mod control_plane;
#[path = "real_node_faults/disk.rs"]
mod disk;
#[path = "real_node_faults/runtime.rs"]
mod runtime;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use e2e::wait_for;
use harness::{NODE, NodeOptions, RealNode};
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use runtime_api::{Runtime, cri};

/// Held by each test for its whole run: every test here disrupts the node the others use.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The relay between the node and the API server ([`control_plane`] cuts it).
static RELAY: std::sync::OnceLock<e2e::relay::Relay> = std::sync::OnceLock::new();

/// The node's lease duration: the API server unreachable longer than this (and than the controller-manager's
/// grace period) makes the node Unknown.
const LEASE_SECONDS: u64 = 10;
/// The controller-manager's `--node-monitor-grace-period`, short so that the outage test is.
const NODE_MONITOR_GRACE: Duration = Duration::from_secs(20);

/// Starts [`RELAY`] to the API server at `server` (`https://127.0.0.1:P`); answers the relay's address.
fn relay_to(server: &str) -> anyhow::Result<String> {
    let target = server
        .trim_start_matches("https://")
        .parse()
        .with_context(|| format!("the API server's address {server}"))?;
    let relay = RELAY.get_or_init(|| e2e::relay::Relay::start(target).expect("a loopback listener"));
    Ok(format!("https://{}", relay.addr()))
}

/// The node and the lock that gives the calling test the node alone; `None` when the real-node tests are not
/// enabled. The node reaches the API server through [`RELAY`], with a [`LEASE_SECONDS`] lease.
async fn node() -> anyhow::Result<Option<(&'static RealNode, tokio::sync::MutexGuard<'static, ()>)>> {
    let serial = SERIAL.lock().await;
    let options = NodeOptions {
        extra_config: format!("nodeLeaseDurationSeconds: {LEASE_SECONDS}\n"),
        api_server: Some(relay_to),
        node_monitor_grace_period: Some(NODE_MONITOR_GRACE),
        ..Default::default()
    };
    let Some(node) = RealNode::get_with(&options).await? else {
        return Ok(None);
    };
    // the pods a failed test left are removed first, so that its failure is not also the next test's
    let everywhere: Api<Pod> = Api::all(node.cp.admin_client().await?);
    let left = fault_pods(&everywhere).await?;
    if !left.is_empty() {
        println!(
            "[real_node_faults] removing {} pods an earlier test left",
            left.len()
        );
        for p in &left {
            let ns: Api<Pod> = Api::namespaced(
                node.cp.admin_client().await?,
                p.metadata.namespace.as_deref().unwrap_or_default(),
            );
            let _ = ns.delete(&name(p), &DeleteParams::default()).await;
        }
        wait_for(
            "the earlier test's pods gone",
            Duration::from_secs(180),
            || async { Ok(fault_pods(&everywhere).await?.is_empty().then_some(())) },
        )
        .await?;
        wait_clean(node).await?;
    }
    Ok(Some((node, serial)))
}

/// A pod whose one container sleeps, with a memory-backed emptyDir (a tmpfs mount in the pod's directory:
/// something a crash could leave mounted).
fn sleeper(name: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"fault": "yes"}},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:local",
                "command": ["sh", "-c", "while :; do sleep 1; done"],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            }],
            "volumes": [{"name": "scratch", "emptyDir": {"medium": "Memory"}}],
        },
    }))?)
}

/// What containerd holds for one pod: sandboxes (all, ready) and containers (all, running, and never started:
/// left created, or whose start failed).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Held {
    sandboxes: usize,
    ready_sandboxes: usize,
    containers: usize,
    running: usize,
    never_started: usize,
}

/// What containerd holds, by pod UID (from the labels the agent puts on sandboxes and containers).
async fn held_by_uid(node: &RealNode) -> anyhow::Result<BTreeMap<String, Held>> {
    let cri = node.cri().await?;
    let uid_of = |labels: &std::collections::HashMap<String, String>| {
        labels.get("io.kubernetes.pod.uid").cloned().unwrap_or_default()
    };
    let mut held: BTreeMap<String, Held> = BTreeMap::new();
    for s in cri
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await?
        .items
    {
        let h = held.entry(uid_of(&s.labels)).or_default();
        h.sandboxes += 1;
        if s.state == cri::PodSandboxState::SandboxReady as i32 {
            h.ready_sandboxes += 1;
        }
    }
    for c in cri
        .list_containers(cri::ListContainersRequest { filter: None })
        .await?
        .containers
    {
        let h = held.entry(uid_of(&c.labels)).or_default();
        h.containers += 1;
        if c.state == cri::ContainerState::ContainerRunning as i32 {
            h.running += 1;
            continue;
        }
        let started = cri
            .container_status(cri::ContainerStatusRequest {
                container_id: c.id.clone(),
                verbose: false,
            })
            .await?
            .status
            .is_some_and(|s| s.started_at != 0);
        if !started {
            h.never_started += 1;
        }
    }
    Ok(held)
}

/// The pods of `api` labelled `fault=yes`.
async fn fault_pods(api: &Api<Pod>) -> anyhow::Result<Vec<Pod>> {
    Ok(api.list(&ListParams::default().labels("fault=yes")).await?.items)
}

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap_or_default()
}

fn name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

/// The pod's one container: (ready and running, container ID, restart count).
fn main_container(p: &Pod) -> (bool, Option<String>, i32) {
    let c = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.first());
    match c {
        Some(c) => (
            c.ready && c.state.as_ref().and_then(|s| s.running.as_ref()).is_some(),
            c.container_id.clone(),
            c.restart_count,
        ),
        None => (false, None, 0),
    }
}

/// Whether the pod's Ready condition is True (what the node-lifecycle controller sets False on a lost node).
fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until all `count` fault pods of `api` are Running with their container ready; returns them.
async fn all_running(
    node: &RealNode,
    api: &Api<Pod>,
    count: usize,
    within: Duration,
) -> anyhow::Result<Vec<Pod>> {
    e2e::wait_for_progress(
        &format!("{count} pods Running and ready"),
        within,
        within * 2,
        || async {
            let pods = fault_pods(api).await?;
            let ready = pods.iter().filter(|p| main_container(p).0).count();
            Ok((ready, (ready == count && pods.len() == count).then_some(pods)))
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))
}

/// Deletes the fault pods of `api` and waits until they are gone from the API; on a time-out, says which are
/// left, in what state, with the agent's log.
async fn delete_all(node: &RealNode, api: &Api<Pod>) -> anyhow::Result<()> {
    for p in fault_pods(api).await? {
        let _ = api.delete(&name(&p), &DeleteParams::default()).await;
    }
    let left = std::sync::Mutex::new(Vec::new());
    wait_for("the pods gone from the API", Duration::from_secs(120), || async {
        let pods = fault_pods(api).await?;
        *left.lock().unwrap_or_else(|e| e.into_inner()) = pods
            .iter()
            .map(|p| {
                let phase = p.status.as_ref().and_then(|s| s.phase.clone());
                let states: Vec<_> = p
                    .status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .into_iter()
                    .flatten()
                    .map(|c| (c.container_id.clone(), c.state.clone()))
                    .collect();
                format!("{} {phase:?} {states:?}", name(p))
            })
            .collect();
        Ok(pods.is_empty().then_some(()))
    })
    .await
    .with_context(|| {
        format!(
            "left: {:#?}\nagent log:\n{}",
            left.lock().unwrap_or_else(|e| e.into_inner()),
            node.agent_log_tail()
        )
    })
}

/// The node's Ready condition.
async fn ready_condition(node: &RealNode) -> anyhow::Result<Option<NodeCondition>> {
    let nodes: Api<Node> = Api::all(node.cp.admin_client().await?);
    Ok(nodes
        .get(NODE)
        .await?
        .status
        .and_then(|s| s.conditions)
        .and_then(|cs| cs.into_iter().find(|c| c.type_ == "Ready")))
}

/// The mount points below `dir` (from this process's mountinfo: the agent and containerd run in the same
/// mount namespace).
fn mounts_below(dir: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    let prefix = format!("{}/", dir.display());
    Ok(text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(&prefix))
        .map(str::to_owned)
        .collect())
}

/// The network namespaces containerd holds mounted (its setup keeps them below its state directory).
fn netns_mounts(node: &RealNode) -> anyhow::Result<Vec<String>> {
    mounts_below(&node.containerd_dir.join("state"))
        .map(|m| m.into_iter().filter(|p| p.contains("/netns/")).collect())
}

/// The pod cgroup directories (`…/kubepods[/<qos>]/pod<uid>`) below the node's `cgroupRoot`, in every mounted
/// hierarchy.
fn pod_cgroups(node: &RealNode) -> anyhow::Result<Vec<PathBuf>> {
    let mut dirs = Vec::new();
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup")?.flatten() {
        let kubepods = hierarchy
            .path()
            .join(node.cgroup_root.trim_start_matches('/'))
            .join("kubepods");
        for parent in [
            kubepods.clone(),
            kubepods.join("besteffort"),
            kubepods.join("burstable"),
        ] {
            let Ok(entries) = std::fs::read_dir(&parent) else {
                continue;
            };
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with("pod") && e.path().is_dir() {
                    dirs.push(e.path());
                }
            }
        }
    }
    Ok(dirs)
}

/// The pod directories below the agent's root.
fn pod_dirs(node: &RealNode) -> anyhow::Result<Vec<PathBuf>> {
    let Ok(entries) = std::fs::read_dir(node.agent_root.join("pods")) else {
        return Ok(Vec::new());
    };
    Ok(entries.flatten().map(|e| e.path()).collect())
}

/// Everything a pod leaves on the node, counted.
#[derive(Debug, PartialEq, Eq)]
struct Leftovers {
    sandboxes: usize,
    containers: usize,
    pod_dirs: usize,
    pod_mounts: usize,
    pod_cgroups: usize,
    netns: usize,
}

async fn leftovers(node: &RealNode) -> anyhow::Result<Leftovers> {
    let held = held_by_uid(node).await?;
    Ok(Leftovers {
        sandboxes: held.values().map(|h| h.sandboxes).sum(),
        containers: held.values().map(|h| h.containers).sum(),
        pod_dirs: pod_dirs(node)?.len(),
        pod_mounts: mounts_below(&node.agent_root.join("pods"))?.len(),
        pod_cgroups: pod_cgroups(node)?.len(),
        netns: netns_mounts(node)?.len(),
    })
}

/// Waits until the node holds nothing of any pod (no pod of this binary outlives its test).
async fn wait_clean(node: &RealNode) -> anyhow::Result<Duration> {
    let t0 = std::time::Instant::now();
    let clean = Leftovers {
        sandboxes: 0,
        containers: 0,
        pod_dirs: 0,
        pod_mounts: 0,
        pod_cgroups: 0,
        netns: 0,
    };
    let done = wait_for(
        "nothing of the deleted pods left on the node",
        Duration::from_secs(120),
        || async { Ok((leftovers(node).await? == clean).then_some(())) },
    )
    .await;
    if let Err(e) = done {
        anyhow::bail!(
            "{e}: {:?}\ncgroups {:?}\nmounts {:?}\nagent log:\n{}",
            leftovers(node).await.ok(),
            pod_cgroups(node).ok(),
            mounts_below(&node.agent_root.join("pods")).ok(),
            node.agent_log_tail()
        );
    }
    Ok(t0.elapsed())
}

/// containerd's process: its PID (from setup.sh's pid file), program and arguments.
fn containerd_process(node: &RealNode) -> anyhow::Result<(i32, PathBuf, Vec<String>)> {
    let pid_file = node.containerd_dir.join("containerd.pid");
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .with_context(|| pid_file.display().to_string())?
        .trim()
        .parse()
        .context("containerd.pid")?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).context("containerd is not running")?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))?;
    let args = cmdline
        .split(|b| *b == 0)
        .skip(1)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    Ok((pid, exe, args))
}

/// Stops containerd with `signal` (its shims, and so the containers, keep running) and waits until it is gone;
/// answers how to start it again.
async fn stop_containerd(
    node: &RealNode,
    signal: nix::sys::signal::Signal,
) -> anyhow::Result<(PathBuf, Vec<String>)> {
    let (pid, exe, args) = containerd_process(node)?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)?;
    wait_for("containerd gone", Duration::from_secs(30), || async {
        // gone, or a zombie of this process (a containerd this test started), reaped by its waiter thread
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let rest = state.rfind(')').map(|i| &state[i + 1..]).unwrap_or("");
        Ok((state.is_empty() || rest.trim_start().starts_with('Z')).then_some(()))
    })
    .await?;
    Ok((exe, args))
}

/// Starts containerd again as it ran before (same program and arguments, its log appended to), records its
/// PID for the teardown, and waits until its CRI answers.
async fn start_containerd(node: &RealNode, exe: &Path, args: &[String]) -> anyhow::Result<()> {
    let log = std::fs::File::options()
        .append(true)
        .create(true)
        .open(node.containerd_dir.join("logs/containerd.log"))?;
    let mut child = std::process::Command::new(exe)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", exe.display()))?;
    std::fs::write(node.containerd_dir.join("containerd.pid"), child.id().to_string())?;
    // reaped when it exits, so that a stopped containerd is gone, not a zombie the teardown waits for
    std::thread::spawn(move || child.wait());
    wait_for(
        "containerd answering CRI Status",
        Duration::from_secs(60),
        || async {
            let Ok(cri) = node.cri().await else {
                return Ok(None);
            };
            Ok(cri
                .status(cri::StatusRequest { verbose: false })
                .await
                .ok()
                .map(|_| ()))
        },
    )
    .await
}

/// A small deterministic generator for the random points of the fault tests (seed printed, and taken from
/// `NA_FAULT_SEED` to replay a run).
struct Rng(u64);

impl Rng {
    fn seeded() -> Self {
        let seed = std::env::var("NA_FAULT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        println!("[real_node_faults] NA_FAULT_SEED={seed}");
        Self(seed | 1)
    }

    /// A number in `lo..hi` (xorshift64*).
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        lo + self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % (hi - lo)
    }
}
