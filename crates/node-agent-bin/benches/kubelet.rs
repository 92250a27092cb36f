//! node-agent and the upstream kubelet side by side on one real node: the same containerd (started by
//! `tests/containerd/setup.sh`), the same control plane (testenv), the same settings and workloads, one agent
//! after the other, each as a fresh node with an empty runtime.
//!
//! The kubelet is built from the pinned `k8s.io/kubernetes` Go module (`hack/build-kubernetes.sh kubelet`, cached
//! beside the control plane's binaries) on this benchmark's first run; node-agent is this package's release
//! binary. For each agent: start → node Ready; after a settling pause, an idle window (RSS at its end, CPU
//! seconds per minute over it); `KBENCH_SINGLE` single pods one after another (create → Running each: median and
//! spread); a Deployment of `KBENCH_BURST` replicas (create → all Running), checked on the agent's node and in
//! containerd; a window with those pods running; then everything deleted, the agent stopped by PID, and what it
//! left (mounts, cgroups, sandboxes, kernel settings, iptables chains, log links) reported and removed. It prints
//! both agents' figures, the ratio node-agent/kubelet and pass/fail against the aims (≤ 0.8× the
//! kubelet's latency, ≤ 0.25× its RSS and CPU); nothing is asserted.
//!
//! Needs root. Hold the real-mode lock (other runs start containerds too) and give it a pod subnet of its own:
//!
//! ```sh
//! NA_CRI_SUBNET=10.89.0.0/16 flock /tmp/node-agent-realmode.lock cargo bench -p node-agent-bin --bench kubelet
//! KBENCH_IDLE_SECS=30 KBENCH_BUSY_SECS=30 KBENCH_ORDER=node-agent,kubelet KBENCH_CONTAINERD=2 cargo bench ...
//! ```

#[path = "kubelet/agent.rs"]
mod agent;
#[path = "kubelet/host.rs"]
mod host;
#[path = "kubelet/report.rs"]
mod report;
#[path = "kubelet/workload.rs"]
mod workload;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::DeleteParams;

use agent::{Agent, Kind};
use report::Figures;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn env_num<T: std::str::FromStr>(name: &str, default: &str) -> anyhow::Result<T> {
    env_or(name, default)
        .parse()
        .map_err(|_| anyhow::anyhow!("{name}: not a number"))
}

/// The settings of one run.
struct Settings {
    order: Vec<Kind>,
    single: usize,
    burst: usize,
    settle: Duration,
    idle: Duration,
    busy: Duration,
}

/// The kubelet of the pinned Kubernetes release, built into the cache when missing.
fn kubelet_binary() -> anyhow::Result<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hack/build-kubernetes.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("kubelet")
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} kubelet failed ({})", script.display(), out.status);
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("kubelet"))
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Runs one agent through the workloads; always stops it and cleans up after it (also when a step fails).
#[allow(clippy::too_many_arguments)]
async fn run_agent(
    kind: Kind,
    bin: &Path,
    cp: &testenv::ControlPlane,
    socket: &Path,
    dir: &Path,
    host: &host::HostState,
    settings: &Settings,
) -> anyhow::Result<Figures> {
    let pid = std::process::id();
    let node = format!("kbench-{}-{pid}", kind.name());
    let client = cp.admin_client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), workload::NAMESPACE);
    let cri = cri_real::RemoteRuntime::connect(&format!("unix://{}", socket.display())).await?;
    let agent_dir = dir.join(kind.name());
    let t0 = tokio::time::Instant::now();
    let mut agent = Agent::start(
        kind,
        bin,
        cp,
        socket,
        &node,
        &agent_dir,
        &format!("na-kbench-{pid}-{}", kind.name()),
    )?;
    let mut figures = Figures::new(kind);
    let measured = async {
        agent.wait_ready(&nodes, Duration::from_secs(120)).await?;
        figures.ready_secs = t0.elapsed().as_secs_f64();
        eprintln!(
            "kbench: {} Ready after {:.1}s; idle window ...",
            kind.name(),
            figures.ready_secs
        );
        tokio::time::sleep(settings.settle).await;
        let agent_pid = agent.pid()?;
        (figures.idle_rss, figures.idle_cpu) = window(agent_pid, settings.idle).await?;
        eprintln!("kbench: {} {} single pods ...", kind.name(), settings.single);
        figures.single = workload::single_pods(&pods, &node, settings.single).await?;
        eprintln!("kbench: {} burst of {} ...", kind.name(), settings.burst);
        figures.burst_pods = settings.burst;
        figures.burst_secs = workload::burst(&client, &pods, &cri, &node, settings.burst).await?;
        tokio::time::sleep(settings.settle).await;
        (figures.busy_rss, figures.busy_cpu) = window(agent_pid, settings.busy).await?;
        workload::delete_burst(&client, &pods, &node).await?;
        anyhow::Ok(())
    }
    .await
    .with_context(|| format!("{}; its log tail:\n{}", kind.name(), agent.log_tail()));
    // whatever happened: stop it and remove what it left, then put the machine back as it was
    let cleaned = agent.stop_and_clean(&cri).await;
    figures.host_changes = host.changes(dir);
    run_undo(dir)?;
    let _ = nodes.delete(&node, &DeleteParams::default()).await;
    measured?;
    figures.leftovers = Some(cleaned?);
    eprintln!("kbench: {} done", kind.name());
    Ok(figures)
}

/// The agent's RSS at the end of a window of `length` and its CPU seconds per minute over it.
async fn window(pid: u32, length: Duration) -> anyhow::Result<(u64, f64)> {
    let cpu0 = testenv::process::cpu_seconds(pid)?;
    let t0 = tokio::time::Instant::now();
    tokio::time::sleep(length).await;
    let cpu = testenv::process::cpu_seconds(pid)? - cpu0;
    let minutes = t0.elapsed().as_secs_f64() / 60.0;
    Ok((testenv::process::rss_bytes(pid)?, cpu / minutes))
}

fn run_undo(dir: &Path) -> anyhow::Result<()> {
    let status = Command::new("bash").arg(dir.join("on-exit.sh")).status()?;
    anyhow::ensure!(status.success(), "on-exit.sh failed ({status})");
    Ok(())
}

async fn run(settings: &Settings, kubelet: &Path) -> anyhow::Result<Vec<Figures>> {
    e2e::containerd::reap_leftovers();
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("na-kbench-{pid}"));
    std::fs::create_dir_all(&dir)?;
    let bridge = format!("nakb{:x}", pid % 0xfffff);
    let cgroups: Vec<String> = settings
        .order
        .iter()
        .map(|k| format!("na-kbench-{pid}-{}", k.name()))
        .collect();
    // the machine's state before any agent, and the script that restores it (also run by the reaper)
    let host = host::HostState::record();
    std::fs::write(dir.join("on-exit.sh"), host.undo_script(&dir))?;
    // from here on whatever is started is torn down when this process exits, however it exits
    let reaper = e2e::containerd::start_reaper(&dir, &bridge, &cgroups)?;
    let result = measure(settings, kubelet, &dir, &bridge, &host).await;
    // containerd torn down by PID, the directory removed (the reaper must be stopped, never dropped: a
    // dropped one is killed before it tears down)
    reaper.stop(Duration::from_secs(120)).await?;
    if dir.exists() {
        if env_or("NA_CRI_KEEP", "0") == "1" {
            eprintln!(
                "kbench: kept {} (NA_CRI_KEEP=1): agents' logs and configs",
                dir.display()
            );
        } else {
            eprintln!("kbench: teardown left {} (see its teardown.log)", dir.display());
        }
    }
    result
}

/// Starts the control plane and containerd, runs the agents one after another and stops the control plane.
async fn measure(
    settings: &Settings,
    kubelet: &Path,
    dir: &Path,
    bridge: &str,
    host: &host::HostState,
) -> anyhow::Result<Vec<Figures>> {
    let subnet = env_or("NA_CRI_SUBNET", "10.89.0.0/16");
    let containerd = env_or("KBENCH_CONTAINERD", "1.6");
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
        eprintln!(
            "kbench: control plane and containerd {containerd} up; load {}",
            load()
        );
        let pods = workload::namespace(&cp.admin_client().await?).await?;
        let mut all = Vec::new();
        for &kind in &settings.order {
            let bin = match kind {
                Kind::Kubelet => kubelet.to_path_buf(),
                Kind::NodeAgent => PathBuf::from(env!("CARGO_BIN_EXE_node-agent")),
            };
            all.push(run_agent(kind, &bin, &cp, &socket, dir, host, settings).await?);
            let left = pods.list(&Default::default()).await?.items.len();
            anyhow::ensure!(left == 0, "{left} pods left in {}", workload::NAMESPACE);
        }
        anyhow::Ok(all)
    }
    .await;
    cp.stop().await?;
    result
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs bench targets without it: a real-node
    // benchmark of minutes has no place in the test suite, so that run only says how to start it.
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!(
            "kubelet: skipped (not run by cargo bench); run `cargo bench -p node-agent-bin --bench kubelet` as root"
        );
        return Ok(());
    }
    if std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self")?) != 0 {
        bail!("the kubelet benchmark needs root (containerd, cgroups, mounts, network namespaces)");
    }
    let mut order = Vec::new();
    for name in env_or("KBENCH_ORDER", "kubelet,node-agent").split(',') {
        order.push(match name.trim() {
            "kubelet" => Kind::Kubelet,
            "node-agent" => Kind::NodeAgent,
            other => bail!("KBENCH_ORDER: unknown agent {other:?} (kubelet, node-agent)"),
        });
    }
    let settings = Settings {
        order,
        single: env_num("KBENCH_SINGLE", "10")?,
        burst: env_num("KBENCH_BURST", "30")?,
        settle: Duration::from_secs(env_num("KBENCH_SETTLE_SECS", "20")?),
        idle: Duration::from_secs(env_num("KBENCH_IDLE_SECS", "60")?),
        busy: Duration::from_secs(env_num("KBENCH_BUSY_SECS", "60")?),
    };
    anyhow::ensure!(
        settings.single > 0 && settings.burst > 0,
        "KBENCH_SINGLE and KBENCH_BURST must be over 0"
    );
    let kubelet = kubelet_binary()?;
    let load_before = load();
    let figures = run(&settings, &kubelet).await?;
    report::print(&figures, &settings_line(&settings), &load_before, &load());
    Ok(())
}

fn settings_line(s: &Settings) -> String {
    format!(
        "{} single pods, burst of {}, windows: idle {} s, with pods {} s, each after {} s settling; containerd {}",
        s.single,
        s.burst,
        s.idle.as_secs(),
        s.busy.as_secs(),
        s.settle.as_secs(),
        env_or("KBENCH_CONTAINERD", "1.6"),
    )
}
