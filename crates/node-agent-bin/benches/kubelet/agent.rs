//! The two agents under test, started the same way: one KubeletConfiguration shape (kubelet API, healthz and
//! no read-only port, all on 127.0.0.1; TLS from the cluster CA; the shared containerd; cgroupfs under a
//! `cgroupRoot` of its own; its own pod log directory; the same DNS and eviction thresholds) and the same flags
//! (`--config`, `--kubeconfig` with a `system:node:<name>` client certificate minted by testenv, a private
//! `--root-dir`, `--hostname-override` with a fresh node name, `--node-ip 127.0.0.1`), run as root. The kubelet
//! refuses a loopback node IP and then publishes no address, which this benchmark does not need (no logs or
//! exec). After an agent stops, whatever it left is found, reported and removed: processes, mounts below its
//! directory, cgroups below its `cgroupRoot`, sandboxes and containers in containerd.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use runtime_api::{Runtime, cri};
use testenv::process::Proc;

/// Which agent.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    NodeAgent,
    Kubelet,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::NodeAgent => "node-agent",
            Kind::Kubelet => "kubelet",
        }
    }
}

/// A running agent and where it keeps its state.
pub struct Agent {
    pub kind: Kind,
    /// Its Node's name (fresh per run).
    pub node: String,
    /// Its directory (root dir, pod logs, config and log below it).
    pub dir: PathBuf,
    /// Its `cgroupRoot`, without the leading `/`.
    pub cgroup_root: String,
    log: PathBuf,
    proc: Option<Proc>,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The cgroup v1 hierarchies (directories, not the `cpu`→`cpu,cpuacct` style links).
fn hierarchies() -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Creates the cgroup `name` in every hierarchy (the kubelet requires its `cgroupRoot` to exist), with the
/// root's CPUs and memory nodes in the cpuset hierarchy.
fn create_cgroup_root(name: &str) -> anyhow::Result<()> {
    for h in hierarchies() {
        let dir = h.join(name);
        std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(value) = std::fs::read_to_string(h.join(file)) {
                std::fs::write(dir.join(file), value.trim())
                    .with_context(|| dir.join(file).display().to_string())?;
            }
        }
    }
    Ok(())
}

/// Mount points below `dir`, deepest first.
fn mounts_below(dir: &Path) -> Vec<String> {
    let prefix = format!("{}/", dir.display());
    let mut found: Vec<String> = std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .filter(|m| m.starts_with(&prefix))
        .map(str::to_owned)
        .collect();
    found.sort_by(|a, b| b.cmp(a));
    found
}

/// PIDs of processes (other than this one) whose command line names something below `dir`.
fn processes_naming(dir: &Path) -> Vec<u32> {
    let needle = format!("{}/", dir.display());
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
                .filter(|pid| *pid != me)
                .filter(|pid| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|c| String::from_utf8_lossy(&c).replace('\0', " ").contains(&needle))
                })
                .collect()
        })
        .unwrap_or_default()
}

impl Agent {
    /// Starts `kind` (`bin`) as node `node` on the control plane `cp` and the containerd at `socket`, with its
    /// state in `dir` and cgroups under `/cgroup_root`.
    pub fn start(
        kind: Kind,
        bin: &Path,
        cp: &testenv::ControlPlane,
        socket: &Path,
        node: &str,
        dir: &Path,
        cgroup_root: &str,
    ) -> anyhow::Result<Self> {
        let root = dir.join("root");
        let pod_logs = dir.join("pod-logs");
        std::fs::create_dir_all(&root)?;
        std::fs::create_dir_all(&pod_logs)?;
        create_cgroup_root(cgroup_root)?;
        let (cert, key) = cp.kubelet_serving_certificate(node)?;
        let config = dir.join("kubelet-config.yaml");
        std::fs::write(
            &config,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
                 address: 127.0.0.1\nport: {}\nhealthzBindAddress: 127.0.0.1\nhealthzPort: {}\nreadOnlyPort: 0\n\
                 tlsCertFile: {}\ntlsPrivateKeyFile: {}\nauthentication:\n  x509:\n    clientCAFile: {}\n\
                 containerRuntimeEndpoint: unix://{}\ncgroupDriver: cgroupfs\ncgroupRoot: /{cgroup_root}\n\
                 failCgroupV1: false\npodLogsDir: {}\nclusterDNS: [10.96.0.10]\nclusterDomain: cluster.local\n\
                 evictionHard: {{memory.available: 100Mi, nodefs.available: 2%, imagefs.available: 2%}}\n",
                free_port()?,
                free_port()?,
                cert.display(),
                key.display(),
                cp.client_ca_file().display(),
                socket.display(),
                pod_logs.display(),
            ),
        )?;
        let args: Vec<String> = vec![
            "--config".into(),
            config.display().to_string(),
            "--kubeconfig".into(),
            cp.node_kubeconfig(node)?.display().to_string(),
            "--root-dir".into(),
            root.display().to_string(),
            "--hostname-override".into(),
            node.into(),
            "--node-ip".into(),
            "127.0.0.1".into(),
        ];
        let log = dir.join(format!("{}.log", kind.name()));
        let proc = Proc::start(kind.name(), bin, &args, &log)?;
        Ok(Self {
            kind,
            node: node.to_owned(),
            dir: dir.to_path_buf(),
            cgroup_root: cgroup_root.to_owned(),
            log,
            proc: Some(proc),
        })
    }

    /// The agent's PID.
    pub fn pid(&self) -> anyhow::Result<u32> {
        self.proc
            .as_ref()
            .map(Proc::pid)
            .context("the agent is not running")
    }

    /// The last lines of the agent's log.
    pub fn log_tail(&self) -> String {
        testenv::process::log_tail(&self.log, 30)
    }

    /// Waits until the agent's Node is Ready with a pod CIDR (handed to containerd by the agent, so pods get
    /// IPs), or fails after `timeout` with the agent's log tail.
    pub async fn wait_ready(&mut self, nodes: &Api<Node>, timeout: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        let ready = async {
            loop {
                if let Some(p) = self.proc.as_mut() {
                    p.check_running()?;
                }
                let node = nodes.get_opt(&self.node).await?;
                if node
                    .filter(e2e::node_is_ready)
                    .is_some_and(|n| n.spec.as_ref().and_then(|s| s.pod_cidr.as_ref()).is_some())
                {
                    return Ok(());
                }
                if tokio::time::Instant::now() >= deadline {
                    bail!("node {} not Ready with a pod CIDR within {timeout:?}", self.node);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        .await;
        ready.with_context(|| format!("{} log tail:\n{}", self.kind.name(), self.log_tail()))
    }

    /// Stops the agent (SIGTERM, SIGKILL after 30 s) and removes what it left below its directory, under its
    /// cgroup root and in containerd; fails if a process of it survives.
    pub async fn stop_and_clean(&mut self, cri: &cri_real::RemoteRuntime) -> anyhow::Result<Leftovers> {
        let mut pid = None;
        if let Some(proc) = self.proc.take() {
            pid = Some(proc.pid());
            proc.stop(Duration::from_secs(30)).await?;
            anyhow::ensure!(
                !pid.is_some_and(testenv::process::pid_alive),
                "{} (pid {pid:?}) still runs",
                self.kind.name()
            );
        }
        let procs = processes_naming(&self.dir);
        anyhow::ensure!(
            procs.is_empty(),
            "processes naming {} still run: {procs:?}",
            self.dir.display()
        );
        let mounts = mounts_below(&self.dir);
        for m in &mounts {
            let ok = std::process::Command::new("umount")
                .arg(m)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                let _ = std::process::Command::new("umount").args(["-l", m]).status();
            }
        }
        let remaining = mounts_below(&self.dir);
        anyhow::ensure!(remaining.is_empty(), "cannot unmount {remaining:?}");
        let (cgroup_dirs, pod_cgroups) = self.remove_cgroups();
        let runtime = remove_all(cri).await?;
        Ok(Leftovers {
            pid,
            mounts,
            cgroup_dirs,
            pod_cgroups,
            runtime,
        })
    }

    /// Removes the agent's cgroups (deepest first); answers how many directories there were and which of
    /// them were pod cgroups (`pod<uid>`).
    fn remove_cgroups(&self) -> (usize, Vec<PathBuf>) {
        let (mut all, mut pods) = (0, Vec::new());
        for h in hierarchies() {
            let top = h.join(&self.cgroup_root);
            let mut dirs = Vec::new();
            collect_dirs(&top, &mut dirs);
            dirs.sort_by(|a, b| b.cmp(a));
            for d in dirs {
                if d != top {
                    all += 1;
                    if d.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("pod"))
                    {
                        pods.push(d.clone());
                    }
                }
                let _ = std::fs::remove_dir(&d);
            }
        }
        (all, pods)
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    if !dir.is_dir() {
        return;
    }
    out.push(dir.to_path_buf());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&e.path(), out);
            }
        }
    }
}

/// What an agent left after it stopped (all of it removed by [`Agent::stop_and_clean`]).
pub struct Leftovers {
    /// Its PID (stopped by it, gone).
    pub pid: Option<u32>,
    /// Mount points below its directory.
    pub mounts: Vec<String>,
    /// Cgroup directories under its `cgroupRoot`, over all hierarchies.
    pub cgroup_dirs: usize,
    /// Of those, pod cgroups (`pod<uid>`), as paths.
    pub pod_cgroups: Vec<PathBuf>,
    /// What was still in containerd.
    pub runtime: InRuntime,
}

/// Pod sandboxes and containers found in the runtime.
#[derive(Default, Debug)]
pub struct InRuntime {
    pub ready_sandboxes: usize,
    pub other_sandboxes: usize,
    pub running_containers: usize,
    pub other_containers: usize,
}

impl InRuntime {
    pub fn is_empty(&self) -> bool {
        self.ready_sandboxes + self.other_sandboxes + self.running_containers + self.other_containers == 0
    }
}

/// Stops and removes every pod sandbox and container in the runtime; answers what there was.
pub async fn remove_all(cri: &cri_real::RemoteRuntime) -> anyhow::Result<InRuntime> {
    let mut found = InRuntime::default();
    let containers = cri
        .list_containers(cri::ListContainersRequest::default())
        .await?
        .containers;
    for c in &containers {
        if c.state == cri::ContainerState::ContainerRunning as i32 {
            found.running_containers += 1;
        } else {
            found.other_containers += 1;
        }
    }
    for c in &containers {
        let _ = cri
            .stop_container(cri::StopContainerRequest {
                container_id: c.id.clone(),
                timeout: 0,
            })
            .await;
        cri.remove_container(cri::RemoveContainerRequest {
            container_id: c.id.clone(),
        })
        .await?;
    }
    let sandboxes = cri
        .list_pod_sandbox(cri::ListPodSandboxRequest::default())
        .await?
        .items;
    for s in &sandboxes {
        if s.state == cri::PodSandboxState::SandboxReady as i32 {
            found.ready_sandboxes += 1;
        } else {
            found.other_sandboxes += 1;
        }
        cri.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: s.id.clone(),
        })
        .await?;
        cri.remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: s.id.clone(),
        })
        .await?;
    }
    Ok(found)
}
