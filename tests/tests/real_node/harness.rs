//! The real node every test of this binary shares: the binary's control plane (its controller-manager
//! allocating pod CIDRs from this binary's pod subnet), a private containerd started with the project's
//! `tests/containerd/setup.sh` (CNI configured from the pod CIDR the agent hands it, as a kubelet's runtime is),
//! and the `node-agent` binary with `--runtime remote` registered as node [`NODE`] with a loopback InternalIP,
//! its own root and log directories under one temp directory, and its own `cgroupRoot` (`/na-real-node-<pid>`), so
//! its QoS and pod cgroups never meet another run's. Its disk eviction thresholds are [`EVICTION`]'s unless the
//! binary's [`NodeOptions`] set `evictionHard`.
//!
//! Started by the first test that asks ([`RealNode::get`]); torn down when the test binary exits, however it
//! exits (see `e2e::containerd::start_reaper`): the agent is killed, `tests/containerd/teardown.sh` kills the
//! containers and stops containerd by PID. The node needs root; a test whose node cannot start fails, saying
//! why. `NODE_AGENT_SKIP_REAL_NODE=1` skips every test of the binary instead (printed once).

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, bail};
use e2e::wait_for;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Api;
use kube::api::PostParams;
use tokio::sync::OnceCell;

/// The node's name.
pub const NODE: &str = "real-node";
/// Cluster DNS the agent is configured with (`clusterDNS`, `clusterDomain`).
pub const CLUSTER_DNS: &str = "10.96.0.10";
pub const CLUSTER_DOMAIN: &str = "cluster.local";
/// The agent's `syncFrequency`: how soon ConfigMap and Secret updates reach running pods.
pub const SYNC_FREQUENCY: &str = "5s";

/// The tests' eviction thresholds: disk at 2 % (the kubelet's defaults are 10 % / 15 %) — the tests share the
/// machine's disk with builds, and a development machine below 15 % free would otherwise see DiskPressure
/// refuse and evict the tests' pods.
pub const EVICTION: &str =
    "evictionHard: {memory.available: 100Mi, nodefs.available: 2%, imagefs.available: 2%}\n";

/// The shared real node.
pub struct RealNode {
    pub cp: &'static testenv::ControlPlane,
    /// containerd's CRI socket.
    pub socket: PathBuf,
    /// containerd's state directory (`NA_CRI_DIR` of `tests/containerd/setup.sh`).
    pub containerd_dir: PathBuf,
    /// This binary's pod subnet (`NA_CRI_SUBNET`): the controller-manager's cluster CIDR.
    pub subnet: (Ipv4Addr, u8),
    /// The Node's `spec.podCIDR`, handed to containerd by the agent.
    pub pod_cidr: (Ipv4Addr, u8),
    /// Where the agent writes pod logs (`podLogsDir`).
    pub pod_logs_dir: PathBuf,
    /// The agent's `--root-dir` (pod volumes under its `pods/`).
    pub agent_root: PathBuf,
    /// The agent's stderr.
    pub agent_log: PathBuf,
    /// The agent's `staticPodPath` (empty unless a test writes a manifest there).
    pub manifests: PathBuf,
    /// The agent's `cgroupRoot`: its pods' cgroups are under `<cgroupRoot>/kubepods`.
    pub cgroup_root: String,
    /// The agent (killed with this process, never before, unless [`RealNode::restart_agent`] replaces it).
    #[allow(dead_code)] // held for its drop; read by restart_agent, which only some test binaries use
    agent: Mutex<Option<testenv::process::Proc>>,
    /// The agent's program and arguments, to start it again (the arguments replaced by
    /// [`RealNode::set_agent_args`]).
    #[allow(dead_code)]
    agent_command: Mutex<(PathBuf, Vec<String>)>,
}

/// What a test binary may add to the node's settings (the first caller of [`RealNode::get_with`] decides for
/// the whole binary).
#[derive(Debug, Clone, Default)]
pub struct NodeOptions {
    /// More `node-agent` arguments.
    pub extra_args: Vec<String>,
    /// More KubeletConfiguration lines (`field: value\n`).
    pub extra_config: String,
    /// The API server address the agent's kubeconfig names, from the control plane's (`https://127.0.0.1:P`):
    /// a relay of the test that can cut the node off. The control plane's own when `None`.
    pub api_server: Option<fn(&str) -> anyhow::Result<String>>,
    /// The controller-manager's `--node-monitor-grace-period` (its default when `None`).
    pub node_monitor_grace_period: Option<Duration>,
    /// More arguments for the control plane's API server, controller-manager and scheduler (a benchmark's
    /// raised client QPS and requests in flight).
    pub apiserver_args: Vec<String>,
    pub controller_manager_args: Vec<String>,
    pub scheduler_args: Vec<String>,
    /// The pod subnet when `NA_CRI_SUBNET` is not set (`10.90.0.0/16` when `None`): a benchmark beside the
    /// test binaries takes one of its own.
    pub default_subnet: Option<&'static str>,
}

/// The node, or why it could not start (every test of the binary then fails with that message, without
/// trying again).
static NODE_STATE: OnceCell<Result<RealNode, String>> = OnceCell::const_new();
/// The process that tears the node down when this test binary exits (`e2e::containerd::start_reaper`).
static REAPER: Mutex<Option<testenv::process::Proc>> = Mutex::new(None);

/// The project's containerd test scripts (`tests/containerd`).
pub use e2e::containerd::scripts;

pub fn parse_cidr(text: &str) -> anyhow::Result<(Ipv4Addr, u8)> {
    let (addr, bits) = text
        .split_once('/')
        .with_context(|| format!("{text:?}: expected a.b.c.d/n"))?;
    let bits: u8 = bits.parse().with_context(|| format!("{text:?}: prefix"))?;
    anyhow::ensure!(bits <= 32, "{text:?}: prefix over 32");
    Ok((addr.parse().with_context(|| format!("{text:?}: address"))?, bits))
}

/// Whether `ip` lies in `cidr`.
pub fn contains(cidr: (Ipv4Addr, u8), ip: Ipv4Addr) -> bool {
    let mask = if cidr.1 == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(cidr.1))
    };
    u32::from(ip) & mask == u32::from(cidr.0) & mask
}

impl RealNode {
    /// The shared node, started on first use; `None` (the caller returns: a skip, printed once) when
    /// `NODE_AGENT_SKIP_REAL_NODE=1`. A node that cannot start is an error, never a skip.
    pub async fn get() -> anyhow::Result<Option<&'static RealNode>> {
        Self::get_with(&NodeOptions::default()).await
    }

    /// [`RealNode::get`], the node started with `options` when this call starts it.
    pub async fn get_with(options: &NodeOptions) -> anyhow::Result<Option<&'static RealNode>> {
        if e2e::containerd::skip_real_node(env!("CARGO_CRATE_NAME")) {
            return Ok(None);
        }
        let node = NODE_STATE
            .get_or_init(|| async {
                Self::start(options).await.map_err(|e| {
                    format!(
                        "the real node of {} could not start (set {}=1 to skip the real-node tests): {e:#}",
                        env!("CARGO_CRATE_NAME"),
                        e2e::containerd::SKIP_REAL_NODE
                    )
                })
            })
            .await;
        match node {
            Ok(node) => Ok(Some(node)),
            Err(why) => Err(anyhow::anyhow!("{why}")),
        }
    }

    async fn start(options: &NodeOptions) -> anyhow::Result<Self> {
        if std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self")?) != 0 {
            bail!("the real-node tests need root (containerd, network namespaces, mounts)");
        }
        let subnet_text = std::env::var("NA_CRI_SUBNET")
            .unwrap_or_else(|_| options.default_subnet.unwrap_or("10.90.0.0/16").into());
        let subnet = parse_cidr(&subnet_text).context("NA_CRI_SUBNET")?;
        // a node an earlier run left (its process group killed) may hold a bridge on this binary's subnet
        e2e::containerd::reap_leftovers();
        let pid = std::process::id();
        let dir = std::env::temp_dir().join(format!("na-real-node-{pid}"));
        std::fs::create_dir_all(&dir)?;
        let containerd_dir = dir.join("containerd");
        let bridge = format!("narn{:x}", pid % 0xfffff);
        let cgroup = format!("na-real-node-{pid}");
        // from here on whatever setup.sh manages to start is torn down when this process exits — also when
        // the start fails half-way: the reaper is kept for the life of the process, never dropped (killed)
        let reaper = e2e::containerd::start_reaper(&dir, &bridge, std::slice::from_ref(&cgroup))?;
        REAPER.lock().unwrap_or_else(|p| p.into_inner()).replace(reaper);
        // the control plane and containerd start side by side
        let t0 = std::time::Instant::now();
        let setup = {
            let (containerd_dir, bridge, subnet_text) =
                (containerd_dir.clone(), bridge.clone(), subnet_text.clone());
            // which containerd: the including test binary's `CONTAINERD` (1.6 or 2)
            tokio::task::spawn_blocking(move || {
                e2e::containerd::setup(&containerd_dir, &bridge, &subnet_text, crate::CONTAINERD)
            })
        };
        let mut controller_manager_args = vec![format!("--cluster-cidr={subnet_text}")];
        controller_manager_args.extend(options.controller_manager_args.iter().cloned());
        let cp = testenv::shared_with(testenv::Options {
            apiserver_args: options.apiserver_args.clone(),
            controller_manager_args,
            scheduler_args: options.scheduler_args.clone(),
            node_monitor_grace_period: options.node_monitor_grace_period,
            ..Default::default()
        });
        let (setup, cp) = tokio::join!(setup, cp);
        let cp = cp?;
        setup??;
        println!(
            "[{}] control plane and containerd up in {:?}",
            env!("CARGO_CRATE_NAME"),
            t0.elapsed()
        );
        let socket = containerd_dir.join("containerd.sock");

        let agent_root = dir.join("agent");
        let pod_logs_dir = dir.join("pods");
        std::fs::create_dir_all(&agent_root)?;
        std::fs::create_dir_all(&pod_logs_dir)?;
        let manifests = dir.join("manifests");
        std::fs::create_dir_all(&manifests)?;
        let (cert, key) = cp.kubelet_serving_certificate(NODE)?;
        // the tests' disk thresholds unless the binary sets its own
        let extra_config = if options.extra_config.contains("evictionHard:") {
            options.extra_config.clone()
        } else {
            format!("{EVICTION}{}", options.extra_config)
        };
        let config = dir.join("kubelet-config.yaml");
        std::fs::write(
            &config,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
                 tlsCertFile: {}\ntlsPrivateKeyFile: {}\nauthentication:\n  x509:\n    clientCAFile: {}\n\
                 podLogsDir: {}\nclusterDNS: [{CLUSTER_DNS}]\nclusterDomain: {CLUSTER_DOMAIN}\n\
                 syncFrequency: {SYNC_FREQUENCY}\ncgroupRoot: /{cgroup}\nstaticPodPath: {}\n{}",
                cert.display(),
                key.display(),
                cp.client_ca_file().display(),
                pod_logs_dir.display(),
                manifests.display(),
                extra_config,
            ),
        )?;
        let free = || -> anyhow::Result<String> {
            Ok(std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port()
                .to_string())
        };
        let mut kubeconfig = cp.node_kubeconfig(NODE)?;
        if let Some(via) = options.api_server {
            let text = std::fs::read_to_string(&kubeconfig)?;
            let relayed = dir.join("node.kubeconfig");
            std::fs::write(&relayed, text.replace(cp.server(), &via(cp.server())?))?;
            kubeconfig = relayed;
        }
        let mut args: Vec<String> = vec![
            "--config".into(),
            config.display().to_string(),
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--hostname-override".into(),
            NODE.into(),
            "--node-ip".into(),
            "127.0.0.1".into(),
            "--runtime".into(),
            "remote".into(),
            "--container-runtime-endpoint".into(),
            format!("unix://{}", socket.display()),
            "--root-dir".into(),
            agent_root.display().to_string(),
            "--address".into(),
            "127.0.0.1".into(),
            "--port".into(),
            free()?,
            "--healthz-port".into(),
            free()?,
        ];
        args.extend(options.extra_args.iter().cloned());
        let agent_log = dir.join("node-agent.log");
        let bin = e2e::node_agent_binary()?;
        let t0 = std::time::Instant::now();
        let agent = testenv::process::Proc::start("node-agent", &bin, &args, &agent_log)?;

        let nodes: Api<Node> = Api::all(cp.admin_client().await?);
        let node = wait_for(
            "the real node Ready with a pod CIDR",
            Duration::from_secs(90),
            || async {
                Ok(nodes
                    .get_opt(NODE)
                    .await?
                    .filter(e2e::node_is_ready)
                    .filter(|n| n.spec.as_ref().and_then(|s| s.pod_cidr.as_ref()).is_some()))
            },
        )
        .await
        .with_context(|| format!("agent log tail:\n{}", testenv::process::log_tail(&agent_log, 40)))?;
        let pod_cidr = node
            .spec
            .as_ref()
            .and_then(|s| s.pod_cidr.as_deref())
            .context("podCIDR")?;
        println!(
            "[{}] node {NODE} Ready with podCIDR {pod_cidr} {:?} after the agent started",
            env!("CARGO_CRATE_NAME"),
            t0.elapsed()
        );
        Ok(Self {
            cp,
            socket,
            containerd_dir,
            subnet,
            pod_cidr: parse_cidr(pod_cidr)?,
            pod_logs_dir,
            agent_root,
            agent_log,
            manifests,
            cgroup_root: format!("/{cgroup}"),
            agent: Mutex::new(Some(agent)),
            agent_command: Mutex::new((bin, args)),
        })
    }

    /// Stops the agent — SIGTERM (a plain stop: containers keep running) or, with `kill`, SIGKILL — and starts
    /// it again with the same arguments; returns when the new process runs (not when it is ready).
    #[allow(dead_code)] // real_node_restart.rs only
    pub async fn restart_agent(&self, kill: bool) -> anyhow::Result<()> {
        let old = self.agent.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(old) = old {
            if kill {
                drop(old); // SIGKILL and reap
            } else {
                old.stop(Duration::from_secs(20)).await?;
            }
        }
        self.start_agent()
    }

    /// Starts the agent again with the same arguments after [`RealNode::stop_agent`]; returns when the process
    /// runs (not when it is ready). An error if it runs already.
    #[allow(dead_code)] // real_node_restart.rs only
    pub fn start_agent(&self) -> anyhow::Result<()> {
        let mut slot = self.agent.lock().unwrap_or_else(|p| p.into_inner());
        anyhow::ensure!(slot.is_none(), "node-agent is running already");
        let (bin, args) = self
            .agent_command
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        *slot = Some(testenv::process::Proc::start(
            "node-agent",
            &bin,
            &args,
            &self.agent_log,
        )?);
        Ok(())
    }

    /// The arguments the agent runs with (or is started with next).
    #[allow(dead_code)] // real_node_restart.rs only
    pub fn agent_args(&self) -> Vec<String> {
        self.agent_command
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .clone()
    }

    /// The agent is started with `args` from its next start on ([`RealNode::start_agent`],
    /// [`RealNode::restart_agent`]).
    #[allow(dead_code)] // real_node_restart.rs only
    pub fn set_agent_args(&self, args: Vec<String>) {
        self.agent_command.lock().unwrap_or_else(|p| p.into_inner()).1 = args;
    }

    /// Sends the agent SIGTERM and waits up to `grace` for it to exit (with `shutdownGracePeriod` set: the
    /// graceful node shutdown). The agent is not started again (until [`RealNode::start_agent`]).
    #[allow(dead_code)] // real_node_shutdown.rs and real_node_restart.rs only
    pub async fn stop_agent(&self, grace: Duration) -> anyhow::Result<()> {
        let agent = self.agent.lock().unwrap_or_else(|p| p.into_inner()).take();
        match agent {
            Some(agent) => agent.stop(grace).await,
            None => Ok(()),
        }
    }

    /// A CRI client of the node's containerd (a fresh connection: each test runs its own async runtime).
    pub async fn cri(&self) -> anyhow::Result<cri_real::RemoteRuntime> {
        let endpoint = format!("unix://{}", self.socket.display());
        Ok(cri_real::RemoteRuntime::connect(&endpoint).await?)
    }

    /// The last lines of the agent's log, for failure messages.
    pub fn agent_log_tail(&self) -> String {
        testenv::process::log_tail(&self.agent_log, 40)
    }

    /// GET `path` from the node's kubelet API (its port as the Node publishes it), presenting a client
    /// certificate of the cluster CA in `system:masters`, as a monitoring agent with full rights would; answers
    /// the status and body.
    pub async fn kubelet_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let port = Api::<Node>::all(self.cp.admin_client().await?)
            .get(NODE)
            .await?
            .status
            .and_then(|s| s.daemon_endpoints)
            .and_then(|d| d.kubelet_endpoint)
            .map(|e| e.port)
            .context("the node's kubelet port")?;
        e2e::kubelet_api::get(self.cp, port, path).await
    }

    /// A namespace of this name (created if missing), with its pods API.
    pub async fn namespace(&self, name: &str) -> anyhow::Result<Api<Pod>> {
        let client = self.cp.admin_client().await?;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        if namespaces.get_opt(name).await?.is_none() {
            let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
            match namespaces.create(&PostParams::default(), &ns).await {
                // two tests of one module may ask for their namespace at once
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Api::namespaced(client, name))
    }

    /// Creates `pod` (the scheduler places it: this is the control plane's only node), retrying while the
    /// namespace's default service account does not exist yet (the controller-manager creates it shortly after
    /// the namespace; under CI's parallel load that took over 30 s once).
    pub async fn create_pod(&self, api: &Api<Pod>, pod: &Pod) -> anyhow::Result<Pod> {
        wait_for("the pod created", Duration::from_secs(90), || async {
            match api.create(&PostParams::default(), pod).await {
                Ok(p) => Ok(Some(p)),
                Err(kube::Error::Api(e)) if e.message.contains("serviceaccount") => Ok(None),
                Err(e) => Err(e.into()),
            }
        })
        .await
    }
}

/// A CNCF distribution registry on loopback (`tests/containerd/registry.sh`) that the node's containerd pulls
/// from over plain HTTP; anonymous, or with basic authentication for `USER:PASSWORD`. Stopped on drop (each test
/// holds its own: a static would never be dropped).
pub struct LoopbackRegistry {
    dir: PathBuf,
    /// `127.0.0.1:PORT`.
    pub addr: String,
}

impl LoopbackRegistry {
    /// Starts one with its state in `registry-<name>` beside the node's containerd directory.
    pub fn start(node: &RealNode, name: &str, auth: Option<&str>) -> anyhow::Result<Self> {
        let dir = node.containerd_dir.with_file_name(format!("registry-{name}"));
        let out = Command::new("bash")
            .arg(scripts().join("registry.sh"))
            .args(["start", &dir.display().to_string()])
            .args(auth)
            .env("NA_CRI_DIR", &node.containerd_dir)
            .output()
            .context("tests/containerd/registry.sh start")?;
        if !out.status.success() {
            bail!(
                "registry.sh start failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(Self {
            dir,
            addr: String::from_utf8(out.stdout)?.trim().to_owned(),
        })
    }
}

impl Drop for LoopbackRegistry {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(scripts().join("registry.sh"))
            .args(["stop", &self.dir.display().to_string()])
            .status();
    }
}
