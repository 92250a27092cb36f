//! A real node on a modern host: the control plane on this machine's loopback, and in a Debian guest booted
//! under QEMU ([`e2e::vm`]; cgroup v2, systemd as PID 1) Debian's containerd started by the project's
//! `tests/containerd/setup.sh` (runc with the cgroup driver the [`NodeSetup`] names, containers' OOM scores as
//! asked, bridge CNI from the node's pod CIDR) and this build's `node-agent` registered as node [`NODE`], with
//! [`RESERVED`] kept from the pods. The guest reaches the API server at
//! [`e2e::vm::HOST_FROM_GUEST`] (named in its serving certificate); the agent's kubelet port is forwarded from
//! 127.0.0.1 on the host to the same port in the guest, and the Node reports 127.0.0.1 as its address, so the
//! API server reaches the agent as it reaches a node on this machine. One guest per test binary, shared by its
//! tests; gone when the binary exits. Needs root (the guest image is built with mmdebstrap) unless
//! `NODE_AGENT_SKIP_REAL_NODE=1` skips the tests.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use e2e::vm::{GUEST_SHARE, HOST_FROM_GUEST, Vm, VmOptions};
use e2e::wait_for;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Api;
use kube::api::PostParams;
use tokio::sync::OnceCell;

/// The node's name.
pub const NODE: &str = "vm-node";
/// The cluster's pod network (the guest's own: nothing on this machine routes it).
const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// Where the guest's containerd keeps its state and socket.
pub const CRI_DIR: &str = "/var/lib/na-cri";
/// `podPidsLimit` of the node.
pub const POD_PIDS_LIMIT: u32 = 1024;
/// The agent's log in the guest.
pub const AGENT_LOG: &str = "/var/log/node-agent.log";
/// The node's reservations (`kubeReserved`, `systemReserved`): 300m of cpu and 384 MiB of memory in all.
pub const RESERVED: &str =
    "kubeReserved: {cpu: 200m, memory: 256Mi}\nsystemReserved: {cpu: 100m, memory: 128Mi}\n";
/// The memory [`RESERVED`] keeps from the pods, bytes.
pub const RESERVED_MEMORY: u64 = 384 << 20;
/// The cpu [`RESERVED`] keeps from the pods, millicores.
pub const RESERVED_CPU: u64 = 300;

/// How the guest's node is set up.
#[derive(Debug, Clone, Copy)]
pub struct NodeSetup {
    /// `cgroupDriver: systemd`, containerd with `SystemdCgroup = true`; else the cgroupfs driver on both.
    pub systemd: bool,
    /// Lines added to the agent's KubeletConfiguration.
    pub config: &'static str,
    /// 2 MiB huge pages the guest reserves before the agent starts (its capacity then reports them).
    pub huge_pages: u32,
}

/// The guest node, with the control plane it is registered with.
pub struct VmNode {
    /// The control plane on the host.
    pub cp: &'static testenv::ControlPlane,
    /// The guest.
    pub vm: Vm,
    /// How it was set up.
    pub setup: NodeSetup,
    /// The port forwarded from 127.0.0.1 on the host to the guest, for the node's kubelet API.
    pub kubelet_port: u16,
}

static NODE_CELL: OnceCell<VmNode> = OnceCell::const_new();

impl VmNode {
    /// The binary's node, set up as `setup` asks, started by the first caller; `None` when
    /// `NODE_AGENT_SKIP_REAL_NODE=1`.
    pub async fn get(setup: NodeSetup) -> anyhow::Result<Option<&'static VmNode>> {
        if e2e::containerd::skip_real_node(env!("CARGO_CRATE_NAME")) {
            return Ok(None);
        }
        NODE_CELL.get_or_try_init(|| Self::start(setup)).await.map(Some)
    }

    /// The binary's guest with containerd running as `setup` asks and no agent, for a test that starts the
    /// node's kubelet its own way; the control plane's controller-manager gets `controller_manager_args` too.
    /// `None` when `NODE_AGENT_SKIP_REAL_NODE=1`.
    // the binaries whose node runs the harness's own agent never call it
    #[allow(dead_code)]
    pub async fn get_without_agent(
        setup: NodeSetup,
        controller_manager_args: &[&str],
    ) -> anyhow::Result<Option<&'static VmNode>> {
        if e2e::containerd::skip_real_node(env!("CARGO_CRATE_NAME")) {
            return Ok(None);
        }
        NODE_CELL
            .get_or_try_init(|| Self::boot(setup, controller_manager_args))
            .await
            .map(Some)
    }

    async fn start(setup: NodeSetup) -> anyhow::Result<Self> {
        let t0 = Instant::now();
        let node = Self::boot(setup, &[]).await?;
        let (vm, port) = (&node.vm, node.kubelet_port);
        let long = Duration::from_secs(300);
        // the agent runs from the guest's disk, as a transient service with its log in a file
        vm.run(
            &format!(
                "echo {} > /proc/sys/vm/nr_hugepages && \
                 install -m 0755 {GUEST_SHARE}/node-agent /usr/local/bin/node-agent && \
                 systemd-run --unit=node-agent --property=StandardOutput=file:{AGENT_LOG} \
                 --property=StandardError=file:{AGENT_LOG} /usr/local/bin/node-agent \
                 --config {GUEST_SHARE}/kubelet-config.yaml --kubeconfig {GUEST_SHARE}/kubeconfig \
                 --hostname-override {NODE} --node-ip 127.0.0.1 --runtime remote \
                 --container-runtime-endpoint unix://{CRI_DIR}/containerd.sock --root-dir /var/lib/node-agent \
                 --address 0.0.0.0 --port {port} --healthz-port 10248",
                setup.huge_pages
            ),
            long,
        )
        .await
        .context("starting node-agent in the guest")?;
        let nodes: Api<Node> = Api::all(node.cp.admin_client().await?);
        let t1 = Instant::now();
        let ready = wait_for(
            "the guest node Ready with a pod CIDR",
            Duration::from_secs(180),
            || async {
                Ok(nodes
                    .get_opt(NODE)
                    .await?
                    .filter(e2e::node_is_ready)
                    .filter(|n| n.spec.as_ref().and_then(|s| s.pod_cidr.as_ref()).is_some()))
            },
        )
        .await;
        if let Err(e) = ready {
            return Err(e.context(format!("agent log tail:\n{}", node.agent_log_tail().await)));
        }
        println!(
            "[{}] node {NODE} Ready {:?} after the agent started, {:?} after the start",
            env!("CARGO_CRATE_NAME"),
            t1.elapsed(),
            t0.elapsed()
        );
        Ok(node)
    }

    /// The control plane, and the guest booted with containerd running in it.
    async fn boot(setup: NodeSetup, controller_manager_args: &[&str]) -> anyhow::Result<Self> {
        if std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self")?) != 0 {
            bail!("the VM tests need root (the guest image is built with mmdebstrap)");
        }
        let t0 = Instant::now();
        remove_leftovers();
        let share = std::env::temp_dir().join(format!("{SHARE_PREFIX}{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&share);
        std::fs::create_dir_all(share.join("containerd"))?;
        // the image is built (once) while the control plane starts
        let image = tokio::task::spawn_blocking(e2e::vm::image);
        let cp = testenv::shared_with(testenv::Options {
            controller_manager_args: [format!("--cluster-cidr={CLUSTER_CIDR}")]
                .into_iter()
                .chain(controller_manager_args.iter().map(|a| (*a).to_owned()))
                .collect(),
            serving_ips: vec![IpAddr::V4(HOST_FROM_GUEST.parse::<Ipv4Addr>()?)],
            ..Default::default()
        })
        .await?;
        image.await??;
        println!(
            "[{}] control plane up (guest image ready) in {:?}",
            env!("CARGO_CRATE_NAME"),
            t0.elapsed()
        );
        let port = free_port()?;
        write_share(cp, &share, setup)?;
        let mut options = VmOptions::new(&share);
        options.forwards = vec![port];
        let t_boot = Instant::now();
        let vm = Vm::boot(&options, &share.join("vm")).await?;
        println!(
            "[{}] guest booted in {:?}",
            env!("CARGO_CRATE_NAME"),
            t_boot.elapsed()
        );
        let long = Duration::from_secs(300);
        vm.run(
            &format!(
                "NA_CRI_DIR={CRI_DIR} NA_CRI_BRIDGE=cni0 NA_CRI_POD_CIDR_FROM_NODE=1 NA_CRI_SKIP_APT=1 \
                 NA_CRI_OOM_SCORE_ADJ=free NA_CRI_SYSTEMD_CGROUP={} bash {GUEST_SHARE}/containerd/setup.sh",
                u8::from(setup.systemd)
            ),
            long,
        )
        .await
        .context("starting containerd in the guest")?;
        println!(
            "[{}] containerd up in the guest {:?} after the boot",
            env!("CARGO_CRATE_NAME"),
            t_boot.elapsed()
        );
        Ok(Self {
            cp,
            vm,
            setup,
            kubelet_port: port,
        })
    }

    /// The last lines of the agent's log in the guest (or why it cannot be read).
    pub async fn agent_log_tail(&self) -> String {
        match self
            .vm
            .sh(&format!("tail -n 60 {AGENT_LOG}"), Duration::from_secs(30))
            .await
        {
            Ok(out) => out.stdout,
            Err(e) => format!(
                "(cannot read {AGENT_LOG}: {e:#}); console:\n{}",
                self.vm.console_tail(20)
            ),
        }
    }

    /// The namespace `name` (created if missing), as an admin client sees its pods.
    pub async fn namespace(&self, name: &str) -> anyhow::Result<Api<Pod>> {
        let client = self.cp.admin_client().await?;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        if namespaces.get_opt(name).await?.is_none() {
            let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
            match namespaces.create(&PostParams::default(), &ns).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Api::namespaced(client, name))
    }

    /// Creates `pod`, retrying while the namespace's default service account does not exist yet.
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

/// The shared directories' names in the temp dir, the test binary's PID following.
const SHARE_PREFIX: &str = "na-vm-node-";

/// Removes the shared directories of test binaries that are gone (their guests died with them).
fn remove_leftovers() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name
            .strip_prefix(SHARE_PREFIX)
            .and_then(|p| p.parse::<u32>().ok())
            && !testenv::process::pid_alive(pid)
        {
            // best effort: a directory that cannot go now is tried again by the next run
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A port free on the host's loopback now (the forward to the guest binds it).
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Fills the directory the guest sees: the agent, the containerd scripts, the node's credentials and a
/// kubeconfig naming the API server as the guest reaches it, and the agent's configuration.
fn write_share(cp: &testenv::ControlPlane, share: &Path, setup: NodeSetup) -> anyhow::Result<()> {
    // a hard link where the file system allows (the agent's binary is large), else a copy
    let copy = |from: &Path, to: &str| -> anyhow::Result<()> {
        let to = share.join(to);
        if std::fs::hard_link(from, &to).is_err() {
            std::fs::copy(from, &to).with_context(|| format!("copying {}", from.display()))?;
        }
        Ok(())
    };
    copy(&e2e::node_agent_binary()?, "node-agent")?;
    let scripts = e2e::containerd::scripts();
    for f in ["setup.sh", "oci_image.py"] {
        copy(&scripts.join(f), &format!("containerd/{f}"))?;
    }
    let kubeconfig = cp.node_kubeconfig(NODE)?;
    let nodes = kubeconfig.parent().context("the node kubeconfig's directory")?;
    copy(&nodes.join(format!("{NODE}.crt")), "node.crt")?;
    copy(&nodes.join(format!("{NODE}.key")), "node.key")?;
    copy(&cp.client_ca_file(), "ca.crt")?;
    let (cert, key) = cp.kubelet_serving_certificate(NODE)?;
    copy(&cert, "serving.crt")?;
    copy(&key, "serving.key")?;
    let api_port = cp.server().rsplit(':').next().context("the API server's port")?;
    let g = |f: &str| PathBuf::from(GUEST_SHARE).join(f).display().to_string();
    std::fs::write(
        share.join("kubeconfig"),
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: https://{HOST_FROM_GUEST}:{api_port}\n    \
             certificate-authority: {}\ncontexts:\n- name: local\n  context:\n    cluster: local\n    user: node\n\
             current-context: local\nusers:\n- name: node\n  user:\n    client-certificate: {}\n    client-key: {}\n",
            g("ca.crt"),
            g("node.crt"),
            g("node.key"),
        ),
    )?;
    std::fs::write(
        share.join("kubelet-config.yaml"),
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: {}\n\
             tlsCertFile: {}\ntlsPrivateKeyFile: {}\nauthentication:\n  x509:\n    clientCAFile: {}\n\
             syncFrequency: 10s\npodPidsLimit: {POD_PIDS_LIMIT}\n{RESERVED}{}",
            if setup.systemd { "systemd" } else { "cgroupfs" },
            g("serving.crt"),
            g("serving.key"),
            g("ca.crt"),
            setup.config,
        ),
    )?;
    Ok(())
}
