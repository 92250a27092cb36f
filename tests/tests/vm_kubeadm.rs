//! `kubeadm join` with node-agent as the machine's kubelet, in a Debian guest (see `vm_node/harness.rs`: the
//! control plane on the host, containerd with the systemd cgroup driver in the guest, no agent started).
//! node-agent is installed as kubeadm expects a kubelet: `/usr/bin/kubelet`, the unit `kubelet.service` with the
//! kubeadm drop-in the repository ships (`dist/systemd/`), enabled and not started. On the control-plane side the
//! objects `kubeadm init` leaves for joining nodes are made by kubeadm's own phases with the admin's kubeconfig
//! (`upload-config`, `bootstrap-token`: the kubelet and kubeadm ConfigMaps, a bootstrap token, `cluster-info`
//! signed by the controller-manager's bootstrap signer, the RBAC rules), and `kubeadm token create
//! --print-join-command` gives the join command. `kubeadm join` then runs its preflight, writes the kubelet's
//! files, restarts `kubelet.service` and waits for the TLS bootstrap; the node registers and turns Ready, its
//! client certificate approved by the controller-manager, its serving certificate by an administrator (here the
//! test), and a pod the scheduler places on it runs, its log read through the API server. One test, one guest.
//! Needs root (or `NODE_AGENT_SKIP_REAL_NODE=1` to skip).

#[allow(dead_code)]
#[path = "vm_node/harness.rs"]
mod harness;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use base64::Engine;
use e2e::vm::{GUEST_SHARE, HOST_FROM_GUEST};
use e2e::{init_logging, wait_for};
use harness::{AGENT_LOG, CRI_DIR, NodeSetup, VmNode};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{ListParams, LogParams, Patch, PatchParams};

/// The guest's hostname, which kubeadm makes the node's name.
const NODE: &str = "node-vm";
/// The directory in the share holding kubeadm, the units and the configurations.
const KUBEADM: &str = "kubeadm";

/// The host directory the guest sees at [`GUEST_SHARE`] (the harness's, named after this process).
fn share() -> PathBuf {
    std::env::temp_dir().join(format!("na-vm-node-{}", std::process::id()))
}

/// The admin's kubeconfig as a machine in the guest's place uses it: the API server at the host's address seen
/// from the guest, the credentials embedded.
fn admin_kubeconfig(cp: &testenv::ControlPlane) -> anyhow::Result<String> {
    let admin = kube::config::Kubeconfig::read_from(cp.admin_kubeconfig())?;
    let file = |p: Option<&String>, what: &str| -> anyhow::Result<String> {
        let p = p.with_context(|| format!("the admin kubeconfig names no {what} file"))?;
        Ok(base64::engine::general_purpose::STANDARD.encode(std::fs::read(p)?))
    };
    let cluster = admin
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .context("the admin kubeconfig's cluster")?;
    let user = admin
        .auth_infos
        .first()
        .and_then(|u| u.auth_info.as_ref())
        .context("the admin kubeconfig's user")?;
    let port = cp.server().rsplit(':').next().context("the API server's port")?;
    Ok(format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: kubernetes\n  cluster:\n    \
         server: https://{HOST_FROM_GUEST}:{port}\n    certificate-authority-data: {}\n\
         contexts:\n- name: admin\n  context:\n    cluster: kubernetes\n    user: admin\ncurrent-context: admin\n\
         users:\n- name: admin\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
        file(cluster.certificate_authority.as_ref(), "certificate-authority")?,
        file(user.client_certificate.as_ref(), "client-certificate")?,
        file(user.client_key.as_ref(), "client-key")?,
    ))
}

/// What `kubeadm init` is given on the control plane: the cluster's endpoint as nodes reach it, and the
/// KubeletConfiguration every joining node gets (the kubelet port forwarded to the host, serving certificates
/// from the cluster).
fn init_configuration(cp: &testenv::ControlPlane, kubelet_port: u16) -> anyhow::Result<String> {
    let port = cp.server().rsplit(':').next().context("the API server's port")?;
    Ok(format!(
        "apiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\nnodeRegistration:\n  \
         criSocket: unix://{CRI_DIR}/containerd.sock\n---\n\
         apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nkubernetesVersion: {}\n\
         controlPlaneEndpoint: {HOST_FROM_GUEST}:{port}\nnetworking:\n  serviceSubnet: 10.96.0.0/16\n---\n\
         apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nport: {kubelet_port}\n\
         serverTLSBootstrap: true\n",
        testenv::assets::kubernetes_version(),
    ))
}

/// Fills `kubeadm/` in the share: kubeadm, node-agent's units for kubeadm, the admin kubeconfig and the init
/// configuration.
fn write_share(node: &VmNode) -> anyhow::Result<()> {
    let dir = share().join(KUBEADM);
    std::fs::create_dir_all(&dir)?;
    let copy = |from: &Path, to: &str| -> anyhow::Result<()> {
        let to = dir.join(to);
        if std::fs::hard_link(from, &to).is_err() {
            std::fs::copy(from, &to).with_context(|| format!("copying {}", from.display()))?;
        }
        Ok(())
    };
    copy(&testenv::assets::kubeadm()?, "kubeadm")?;
    let dist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/systemd");
    copy(&dist.join("kubelet.service"), "kubelet.service")?;
    copy(&dist.join("kubelet.service.d/10-kubeadm.conf"), "10-kubeadm.conf")?;
    std::fs::write(dir.join("admin.conf"), admin_kubeconfig(node.cp)?)?;
    std::fs::write(
        dir.join("init.yaml"),
        init_configuration(node.cp, node.kubelet_port)?,
    )?;
    Ok(())
}

/// Runs `script` in the guest, printing how long it took; fails with its output and the agent's log.
async fn step(node: &VmNode, what: &str, script: &str, timeout: Duration) -> anyhow::Result<String> {
    let t = Instant::now();
    let out = node.vm.sh(script, timeout).await?;
    println!(
        "[vm_kubeadm] {what}: exit {:?} in {:?}\n{}{}",
        out.code,
        t.elapsed(),
        out.stdout,
        out.stderr
    );
    if out.code != Some(0) {
        anyhow::bail!(
            "{what} failed (exit {:?})\nagent log:\n{}",
            out.code,
            node.agent_log_tail().await
        );
    }
    Ok(out.stdout)
}

fn condition_reason(csr: &CertificateSigningRequest, type_: &str) -> Option<String> {
    csr.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.reason.clone().unwrap_or_default())
}

/// The node's requests for `signer`.
async fn requests(admin: &kube::Client, signer: &str) -> anyhow::Result<Vec<CertificateSigningRequest>> {
    let csrs: Api<CertificateSigningRequest> = Api::all(admin.clone());
    Ok(csrs
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|c| c.spec.signer_name == signer)
        .collect())
}

#[tokio::test]
async fn kubeadm_join_makes_node_agent_the_nodes_kubelet() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = VmNode::get_without_agent(
        NodeSetup {
            systemd: true,
            config: "",
            huge_pages: 0,
        },
        // kubeadm's controllers beside the defaults: cluster-info signed for each bootstrap token
        &["--controllers=*,bootstrapsigner,tokencleaner"],
    )
    .await?
    else {
        return Ok(());
    };
    let admin = node.cp.admin_client().await?;
    write_share(node)?;
    let k = format!("{GUEST_SHARE}/{KUBEADM}");

    // node-agent installed as the machine's kubelet, its unit enabled as kubeadm's preflight wants it
    let version = step(
        node,
        "installing node-agent as the kubelet",
        &format!(
            "set -e\n\
             install -m 0755 {GUEST_SHARE}/node-agent /usr/local/bin/node-agent\n\
             ln -sf /usr/local/bin/node-agent /usr/bin/kubelet\n\
             install -m 0755 {k}/kubeadm /usr/bin/kubeadm\n\
             install -m 0644 {k}/kubelet.service /etc/systemd/system/kubelet.service\n\
             mkdir -p /etc/systemd/system/kubelet.service.d\n\
             install -m 0644 {k}/10-kubeadm.conf /etc/systemd/system/kubelet.service.d/10-kubeadm.conf\n\
             printf '[Service]\\nStandardOutput=append:{AGENT_LOG}\\nStandardError=append:{AGENT_LOG}\\n' \
               > /etc/systemd/system/kubelet.service.d/20-log.conf\n\
             echo 'KUBELET_EXTRA_ARGS=--node-ip=127.0.0.1' > /etc/default/kubelet\n\
             systemctl daemon-reload\n\
             systemctl enable kubelet\n\
             kubelet --version\n"
        ),
        Duration::from_secs(300),
    )
    .await?;
    assert!(
        version.trim().starts_with("Kubernetes v1."),
        "kubelet --version: {version}"
    );

    // what `kubeadm init` leaves on the control plane for joining nodes, made by its own phases
    let t0 = Instant::now();
    let join = step(
        node,
        "kubeadm init phases on the control plane",
        &format!(
            "set -e\n\
             a='--kubeconfig {k}/admin.conf'\n\
             kubeadm init phase upload-config kubeadm --config {k}/init.yaml $a >&2\n\
             kubeadm init phase upload-config kubelet --config {k}/init.yaml $a >&2\n\
             kubeadm init phase bootstrap-token --config {k}/init.yaml $a >&2\n\
             kubeadm token create --print-join-command $a\n"
        ),
        Duration::from_secs(600),
    )
    .await?;
    let join = join
        .lines()
        .find(|l| l.starts_with("kubeadm join "))
        .with_context(|| format!("no join command in {join:?}"))?
        .trim()
        .to_owned();
    assert!(
        join.contains(&format!("{HOST_FROM_GUEST}:"))
            && join.contains("--discovery-token-ca-cert-hash sha256:"),
        "{join}"
    );

    // the join itself, as an operator types it on the new node: every preflight check runs
    let t1 = Instant::now();
    let out = step(
        node,
        "kubeadm join",
        &format!("{join} --cri-socket unix://{CRI_DIR}/containerd.sock 2>&1"),
        Duration::from_secs(600),
    )
    .await?;
    let join_took = t1.elapsed();
    assert!(
        out.contains("This node has joined the cluster"),
        "kubeadm join's output:\n{out}"
    );

    // the files kubeadm wrote, read by the kubelet it restarted; its TLS bootstrap done
    let files = step(
        node,
        "the kubelet's files",
        "set -e\ncat /var/lib/kubelet/kubeadm-flags.env\ngrep -E 'containerRuntimeEndpoint|cgroupDriver' \
         /var/lib/kubelet/config.yaml\ngrep client-certificate /etc/kubernetes/kubelet.conf\n\
         test ! -e /etc/kubernetes/bootstrap-kubelet.conf\nsystemctl is-active kubelet\n\
         tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value kubelet)/cmdline\n",
        Duration::from_secs(60),
    )
    .await?;
    assert!(
        files.contains("/var/lib/kubelet/pki/kubelet-client-current.pem"),
        "{files}"
    );
    assert!(files.contains("cgroupDriver: systemd"), "{files}");
    assert!(
        files.contains("--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf"),
        "the kubelet runs with kubeadm's flags: {files}"
    );

    // the node, registered with the certificate the controller-manager approved
    let nodes: Api<Node> = Api::all(admin.clone());
    let ready = wait_for("the joined node Ready", Duration::from_secs(300), || async {
        Ok(nodes.get_opt(NODE).await?.filter(e2e::node_is_ready))
    })
    .await;
    let joined = match ready {
        Ok(n) => n,
        Err(e) => return Err(e.context(format!("agent log:\n{}", node.agent_log_tail().await))),
    };
    let ready_after = t1.elapsed();
    let info = joined
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .context("nodeInfo")?;
    println!(
        "[vm_kubeadm] node {NODE} Ready {ready_after:?} after `kubeadm join` began (join took {join_took:?}); \
         kubelet {} on {}",
        info.kubelet_version, info.container_runtime_version
    );
    let clients = requests(&admin, "kubernetes.io/kube-apiserver-client-kubelet").await?;
    let client = clients
        .iter()
        .find(|c| {
            c.spec
                .username
                .as_deref()
                .is_some_and(|u| u.starts_with("system:bootstrap:"))
        })
        .with_context(|| format!("no client request filed with the bootstrap token: {clients:?}"))?;
    assert_eq!(
        condition_reason(client, "Approved").as_deref(),
        Some("AutoApproved")
    );

    // its serving certificate, approved by an administrator (kubeadm leaves that to one)
    let csrs: Api<CertificateSigningRequest> = Api::all(admin.clone());
    let serving = wait_for(
        "the node's kubelet-serving request",
        Duration::from_secs(120),
        || async {
            Ok(requests(&admin, "kubernetes.io/kubelet-serving")
                .await?
                .into_iter()
                .find(|c| c.spec.username.as_deref() == Some(&format!("system:node:{NODE}"))))
        },
    )
    .await?;
    csrs.patch_approval(
        serving.metadata.name.as_deref().unwrap_or_default(),
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"conditions": [{
            "type": "Approved", "status": "True", "reason": "AdminApproved", "message": "approved by the test",
        }]}})),
    )
    .await?;

    // a pod the scheduler places on the node runs, and its log is read through the API server
    let pods = node.namespace("kubeadm").await?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "hello"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "containers": [{"name": "main", "image": "localhost/busybox:local",
                            "command": ["sh", "-c", "echo hello from the joined node; sleep 3600"]}],
        },
    }))?;
    let t2 = Instant::now();
    node.create_pod(&pods, &pod).await?;
    let running = wait_for("the pod Running", Duration::from_secs(240), || async {
        let p = pods.get("hello").await?;
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        Ok((phase == Some("Running")).then_some(p))
    })
    .await;
    let running = match running {
        Ok(p) => p,
        Err(e) => return Err(e.context(format!("agent log:\n{}", node.agent_log_tail().await))),
    };
    assert_eq!(
        running.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(NODE)
    );
    let logs = wait_for("the pod's log", Duration::from_secs(60), || async {
        Ok(pods.logs("hello", &LogParams::default()).await.ok())
    })
    .await?;
    assert_eq!(logs, "hello from the joined node\n");
    println!(
        "[vm_kubeadm] pod Running on {NODE} {:?} after its creation, log read through the API server; \
         {:?} from the first kubeadm command",
        t2.elapsed(),
        t0.elapsed()
    );
    Ok(())
}
