//! A long run of node-agent on a real node: the containerd of `tests/containerd/setup.sh` and a testenv control
//! plane, pods created and deleted every few seconds for `SOAK_MINUTES` (30), and once a minute a sample of
//! what would show a leak: the agent's resident memory, open file descriptors and tasks (threads), the mounts
//! and network namespaces below the run's directory (containerd keeps its netns there), the cgroups below the
//! agent's `cgroupRoot`, and the sandboxes and containers containerd holds. At the end every pod is deleted,
//! one more sample is taken, and the least-squares slope of each series per hour is printed, over the whole
//! run and over its second half (after the first pods have warmed the caches); the goal is flat. Nothing is
//! asserted: this is a benchmark, not a test.
//!
//! The node is the `kubelet` benchmark's (same configuration, same clean-up), so this needs root, and a pod
//! subnet of its own beside other real-node runs:
//!
//! ```sh
//! NA_CRI_SUBNET=10.78.0.0/16 flock /tmp/node-agent-realmode.lock cargo bench -p node-agent-bin --bench soak
//! SOAK_MINUTES=10 SOAK_EVERY_SECS=3 SOAK_LIVE=6 cargo bench -p node-agent-bin --bench soak
//! SOAK_AGENT_BIN=target/debug/node-agent cargo bench ...   # soak another build of the agent
//! ```

#[path = "kubelet/agent.rs"]
#[allow(dead_code)]
mod agent;
#[path = "kubelet/host.rs"]
#[allow(dead_code)]
mod host;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use runtime_api::{Runtime, cri};
use serde_json::json;

use agent::{Agent, Kind};
use e2e::soak::{self as sample, Series};

const NAMESPACE: &str = "soak";

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn env_num<T: std::str::FromStr>(name: &str, default: &str) -> anyhow::Result<T> {
    env_or(name, default)
        .parse()
        .map_err(|_| anyhow::anyhow!("{name}: not a number"))
}

struct Settings {
    minutes: u64,
    every: Duration,
    live: usize,
}

/// Mount points below `dir`: (network namespaces, other mounts).
fn mounts_below(dir: &Path) -> (usize, usize) {
    let prefix = format!("{}/", dir.display());
    let mut netns = 0;
    let mut other = 0;
    for line in std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
    {
        let mut fields = line.split(' ');
        let (Some(_), Some(point), Some(kind)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        if point.starts_with(&prefix) {
            if kind == "nsfs" {
                netns += 1;
            } else {
                other += 1;
            }
        }
    }
    (netns, other)
}

/// Directories below `cgroup_root` in every hierarchy (the v2 unified one or each v1 one).
fn cgroups_below(cgroup_root: &str) -> usize {
    fn count(dir: &Path) -> usize {
        std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| 1 + count(&e.path()))
                    .sum()
            })
            .unwrap_or(0)
    }
    let base = Path::new("/sys/fs/cgroup");
    if base.join("cgroup.controllers").exists() {
        return count(&base.join(cgroup_root));
    }
    std::fs::read_dir(base)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| count(&e.path().join(cgroup_root)))
                .sum()
        })
        .unwrap_or(0)
}

fn count_dir(path: &str) -> usize {
    std::fs::read_dir(path).map(|d| d.count()).unwrap_or(0)
}

/// A pod of one busybox container bound to `node`.
fn pod(name: &str, node: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "soak"}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "sleep",
                "image": "localhost/busybox:local",
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"],
            }],
        },
    }))?)
}

async fn namespace(client: &kube::Client) -> anyhow::Result<Api<Pod>> {
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

/// Everything sampled once.
#[allow(clippy::too_many_arguments)]
async fn take_sample(
    series: &mut Series,
    minute: f64,
    agent: &Agent,
    dir: &Path,
    cri: &cri_real::RemoteRuntime,
    pods: &Api<Pod>,
) -> anyhow::Result<()> {
    let pid = agent.pid()?;
    let (netns, mounts) = mounts_below(dir);
    let sandboxes = cri
        .list_pod_sandbox(cri::ListPodSandboxRequest::default())
        .await?
        .items
        .len();
    let containers = cri
        .list_containers(cri::ListContainersRequest::default())
        .await?
        .containers
        .len();
    let running = pods
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count();
    series.push(
        minute,
        &[
            (
                "rss_mib",
                testenv::process::rss_bytes(pid)? as f64 / (1 << 20) as f64,
            ),
            ("fds", count_dir(&format!("/proc/{pid}/fd")) as f64),
            ("tasks", count_dir(&format!("/proc/{pid}/task")) as f64),
            ("mounts", mounts as f64),
            ("netns", netns as f64),
            ("cgroups", cgroups_below(&agent.cgroup_root) as f64),
            ("sandboxes", sandboxes as f64),
            ("containers", containers as f64),
            ("pods_running", running as f64),
        ],
    );
    eprintln!("soak: {}", series.last_line());
    Ok(())
}

/// Creates a pod every `every`, deleting the oldest once more than `live` exist, sampling every minute.
async fn churn(
    settings: &Settings,
    agent: &Agent,
    dir: &Path,
    cri: &cri_real::RemoteRuntime,
    pods: &Api<Pod>,
) -> anyhow::Result<(Series, usize)> {
    let mut series = Series::default();
    let t0 = tokio::time::Instant::now();
    let minute = |t: tokio::time::Instant| t.duration_since(t0).as_secs_f64() / 60.0;
    take_sample(&mut series, 0.0, agent, dir, cri, pods).await?;
    let mut next_sample = t0 + Duration::from_secs(60);
    let end = t0 + Duration::from_secs(settings.minutes * 60);
    let mut live = VecDeque::new();
    let mut created = 0usize;
    let mut tick = tokio::time::interval(settings.every);
    while tokio::time::Instant::now() < end {
        tick.tick().await;
        let name = format!("soak-{created}");
        pods.create(&PostParams::default(), &pod(&name, &agent.node)?)
            .await
            .with_context(|| format!("creating {name}"))?;
        created += 1;
        live.push_back(name);
        while live.len() > settings.live {
            let old = live.pop_front().context("a live pod")?;
            pods.delete(&old, &DeleteParams::default())
                .await
                .with_context(|| format!("deleting {old}"))?;
        }
        let now = tokio::time::Instant::now();
        if now >= next_sample {
            take_sample(&mut series, minute(now), agent, dir, cri, pods).await?;
            next_sample += Duration::from_secs(60);
        }
    }
    for name in live {
        pods.delete(&name, &DeleteParams::default()).await?;
    }
    e2e::wait_for("every soak pod gone", Duration::from_secs(180), || async {
        Ok(pods
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    // let the agent finish removing what the last pods left
    tokio::time::sleep(Duration::from_secs(20)).await;
    take_sample(
        &mut series,
        minute(tokio::time::Instant::now()),
        agent,
        dir,
        cri,
        pods,
    )
    .await?;
    Ok((series, created))
}

fn run_undo(dir: &Path) -> anyhow::Result<()> {
    let status = Command::new("bash").arg(dir.join("on-exit.sh")).status()?;
    anyhow::ensure!(status.success(), "on-exit.sh failed ({status})");
    Ok(())
}

async fn soak(settings: &Settings, dir: &Path, bridge: &str) -> anyhow::Result<(Series, usize)> {
    let subnet = env_or("NA_CRI_SUBNET", "10.78.0.0/16");
    let containerd = env_or("SOAK_CONTAINERD", "2");
    let containerd_dir = dir.join("containerd");
    let setup = {
        let (containerd_dir, bridge, subnet, containerd) = (
            containerd_dir.clone(),
            bridge.to_owned(),
            subnet.clone(),
            containerd.clone(),
        );
        tokio::task::spawn_blocking(move || {
            e2e::containerd::setup(&containerd_dir, &bridge, &subnet, &containerd)
        })
    };
    let cp = testenv::ControlPlane::start(testenv::Options {
        controller_manager_args: vec![format!("--cluster-cidr={subnet}")],
        ..Default::default()
    });
    let (setup, cp) = tokio::join!(setup, cp);
    let cp = cp?;
    let result = async {
        setup??;
        let socket = containerd_dir.join("containerd.sock");
        let client = cp.admin_client().await?;
        let nodes: Api<Node> = Api::all(client.clone());
        let pods = namespace(&client).await?;
        let cri = cri_real::RemoteRuntime::connect(&format!("unix://{}", socket.display())).await?;
        let bin = std::env::var_os("SOAK_AGENT_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_node-agent")));
        let pid = std::process::id();
        let node = format!("soak-{pid}");
        let mut agent = Agent::start(
            Kind::NodeAgent,
            &bin,
            &cp,
            &socket,
            &node,
            &dir.join("agent"),
            &format!("na-soak-{pid}"),
        )?;
        let ran = async {
            agent.wait_ready(&nodes, Duration::from_secs(180)).await?;
            eprintln!(
                "soak: node {node} Ready; a pod every {:?}, {} alive at most, for {} min",
                settings.every, settings.live, settings.minutes
            );
            churn(settings, &agent, dir, &cri, &pods).await
        }
        .await
        .with_context(|| format!("node-agent log tail:\n{}", agent.log_tail()));
        let cleaned = agent.stop_and_clean(&cri).await;
        run_undo(dir)?;
        let (series, created) = ran?;
        let left = cleaned?;
        eprintln!(
            "soak: after the agent stopped: {} mounts, {} pod cgroups, {} ready sandboxes and {} running containers left",
            left.mounts.len(),
            left.pod_cgroups.len(),
            left.runtime.ready_sandboxes,
            left.runtime.running_containers
        );
        anyhow::Ok((series, created))
    }
    .await;
    cp.stop().await?;
    result
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // `cargo test --all-targets` runs bench targets without --bench: a soak of minutes has no place there
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!(
            "soak: skipped (not run by cargo bench); run `cargo bench -p node-agent-bin --bench soak` as root"
        );
        return Ok(());
    }
    if std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self")?) != 0 {
        bail!("the soak needs root (containerd, cgroups, mounts, network namespaces)");
    }
    let settings = Settings {
        minutes: env_num("SOAK_MINUTES", "30")?,
        every: Duration::from_secs_f64(env_num("SOAK_EVERY_SECS", "3")?),
        live: env_num("SOAK_LIVE", "6")?,
    };
    anyhow::ensure!(settings.minutes > 0, "SOAK_MINUTES must be over 0");
    e2e::containerd::reap_leftovers();
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("na-soak-{pid}"));
    std::fs::create_dir_all(&dir)?;
    let bridge = format!("nask{:x}", pid % 0xfffff);
    let host = host::HostState::record();
    std::fs::write(dir.join("on-exit.sh"), host.undo_script(&dir))?;
    let reaper = e2e::containerd::start_reaper(&dir, &bridge, &[format!("na-soak-{pid}")])?;
    let load_before = sample::load();
    let t0 = std::time::Instant::now();
    let result = soak(&settings, &dir, &bridge).await;
    reaper.stop(Duration::from_secs(120)).await?;
    let (series, created) = result?;
    println!(
        "soak of the real node: {:.1} min, {created} pods created and deleted (a pod every {:?}, at most {} alive); load {load_before} -> {}",
        t0.elapsed().as_secs_f64() / 60.0,
        settings.every,
        settings.live,
        sample::load()
    );
    series.print();
    Ok(())
}
