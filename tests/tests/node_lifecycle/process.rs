//! Node lifecycle tests where the process matters, run against the `node-agent` binary (`--runtime fake`):
//! killing it (SIGKILL), stopping it (SIGTERM), a bad configuration file (exit code), and its kubelet API
//! (`kubectl logs` through the API server, `/healthz`).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use e2e::init_logging;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;
use tokio::time::Instant;

use super::support::{
    GRACE, audit_dir, condition, control_plane, event_reasons, poll, ready_status, taint_keys, wait_node,
};

/// A `node-agent` binary (`--runtime fake`) run by a test; killed when dropped.
pub struct AgentProcess {
    child: Child,
    log: PathBuf,
    /// Its plain-HTTP healthz port.
    pub healthz: u16,
}

impl AgentProcess {
    fn start(cp: &testenv::ControlPlane, name: &str, extra: &[&str]) -> anyhow::Result<Self> {
        Self::start_as(&cp.node_kubeconfig(name)?, name, extra)
    }

    /// The agent of node `name` with `--kubeconfig kubeconfig` (which may not exist yet, for TLS bootstrap).
    pub fn start_as(kubeconfig: &std::path::Path, name: &str, extra: &[&str]) -> anyhow::Result<Self> {
        let bin = e2e::node_agent_binary()?;
        let log = audit_dir().join(format!(
            "{name}-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_millis()
        ));
        // the kubelet API and healthz ports: free loopback ports of this test's own
        let free = || -> anyhow::Result<String> {
            Ok(std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port()
                .to_string())
        };
        let (port, healthz) = (free()?, free()?);
        let child = Command::new(bin)
            .args([
                "--address",
                "127.0.0.1",
                "--port",
                &port,
                "--healthz-port",
                &healthz,
            ])
            .arg("--kubeconfig")
            .arg(kubeconfig)
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
        Ok(Self {
            child,
            log,
            healthz: healthz.parse()?,
        })
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
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
    let bin = e2e::node_agent_binary()?;
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

/// Graceful node shutdown: SIGTERM with `shutdownGracePeriod: 10s`, `shutdownGracePeriodCriticalPods: 4s` and
/// `--shutdown-trigger=sigterm` (the machine's shutdown on a host without systemd-logind).
/// The Node turns NotReady ("node is shutting down") with a NodeShutdown event; the regular pods are stopped
/// first (one in its own 3 s, one killed when the regular 6 s are over), the critical pod
/// (system-cluster-critical) only after them; each reported as the kubelet reports it (Failed, reason
/// Terminated, the shutdown message, DisruptionTarget); then the agent exits 0.
#[tokio::test]
async fn sigterm_with_a_shutdown_grace_period_stops_regular_pods_then_critical_ones() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::{Namespace, Pod};
    use kube::api::PostParams;
    use serde_json::json;

    init_logging();
    let cp = control_plane().await?;
    let admin = cp.admin_client().await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    let name = "nl-shutdown";
    let dir = audit_dir();
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("shutdown.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 4s\n",
    )?;
    let mut agent = AgentProcess::start(
        cp,
        name,
        &[
            "--config",
            &config.display().to_string(),
            "--shutdown-trigger=sigterm",
        ],
    )?;
    if let Err(e) = wait_node(&nodes, name, "Ready=True", Duration::from_secs(30), |n| {
        ready_status(n).as_deref() == Some("True")
    })
    .await
    {
        bail!("{e}\nagent log:\n{}", agent.log_tail());
    }

    let ns = "nl-shutdown";
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    if namespaces.get_opt(ns).await?.is_none() {
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
            )
            .await?;
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    for (pod, class, stop) in [
        ("regular", None, "3s"),
        ("stubborn", None, "60s"),
        ("critical", Some("system-cluster-critical"), "2s"),
    ] {
        let spec = json!({
            "nodeName": name,
            "priorityClassName": class,
            "automountServiceAccountToken": false,
            "containers": [{"name": "app", "image": "nginx:1.27"}],
        });
        let body = json!({
            "metadata": {"name": pod, "annotations": {"cri-fake.node-agent.io/stop-duration": stop}},
            "spec": spec,
        });
        pods.create(&PostParams::default(), &serde_json::from_value(body)?)
            .await?;
    }
    let phase = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default()
    };
    poll("three pods Running", Duration::from_secs(60), || async {
        let list = pods.list(&ListParams::default()).await?;
        Ok((list.items.len() == 3 && list.items.iter().all(|p| phase(p) == "Running")).then_some(()))
    })
    .await?;

    agent.signal(nix::sys::signal::Signal::SIGTERM)?;
    let t = Instant::now();
    // a guard against hanging only: the node says it is shutting down at once
    let not_ready = wait_node(
        &nodes,
        name,
        "NotReady: shutting down",
        Duration::from_secs(60),
        |n| {
            condition(n, "Ready").is_some_and(|c| {
                c.status == "False"
                    && c.message
                        .as_deref()
                        .is_some_and(|m| m.contains("node is shutting down"))
            })
        },
    )
    .await?;
    println!(
        "[node_lifecycle] {name}: NotReady after {:?}: {:?}",
        t.elapsed(),
        condition(&not_ready, "Ready").and_then(|c| c.message.clone())
    );
    // when each pod is first seen reported stopped (Failed)
    let stopped = std::sync::Mutex::new(std::collections::BTreeMap::<String, Duration>::new());
    poll(
        "three pods reported stopped",
        Duration::from_secs(120),
        || async {
            let list = pods.list(&ListParams::default()).await?.items;
            let mut stopped = stopped.lock().unwrap_or_else(|p| p.into_inner());
            for p in list {
                let pod = p.metadata.name.clone().unwrap_or_default();
                if phase(&p) == "Failed" && !stopped.contains_key(&pod) {
                    stopped.insert(pod, t.elapsed());
                }
            }
            Ok((stopped.len() == 3).then_some(()))
        },
    )
    .await?;
    let stopped = stopped.into_inner().unwrap_or_else(|p| p.into_inner());
    println!("[node_lifecycle] {name}: pods reported stopped after SIGTERM: {stopped:?}");
    let (regular, stubborn, critical) = (stopped["regular"], stopped["stubborn"], stopped["critical"]);
    // the regular pods' share of the period is 10 s - 4 s = 6 s: the regular pod stops in its own 3 s, before
    // the stubborn one is killed when those 6 s are over (never earlier) — long before its own 60 s
    assert!(
        regular <= stubborn,
        "regular stops in its own 3 s, before stubborn is killed: {regular:?}, {stubborn:?}"
    );
    assert!(
        stubborn >= Duration::from_secs(6) && stubborn < Duration::from_secs(60),
        "stubborn is killed when the regular pods' 6 s are over, not after its own 60 s: {stubborn:?}"
    );
    assert!(
        critical >= stubborn,
        "the critical pod is reported last: {critical:?} after {stubborn:?}"
    );
    // the order itself from the containers' finishedAt (whole seconds): the critical pod starts its 2 s stop when
    // the regular pods' period is over, so it finishes at least a second after the stubborn pod is killed, even
    // when a loaded API server lets both statuses arrive between two polls
    let list = pods.list(&ListParams::default()).await?.items;
    let finished = |pod: &str| {
        list.iter()
            .find(|p| p.metadata.name.as_deref() == Some(pod))
            .and_then(|p| p.status.as_ref()?.container_statuses.as_ref()?.first().cloned())
            .and_then(|c| c.state?.terminated?.finished_at)
            .map(|t| t.0)
    };
    let (stubborn_at, critical_at) = (finished("stubborn"), finished("critical"));
    assert!(
        stubborn_at.is_some() && critical_at > stubborn_at,
        "the critical pod's container finishes last: {critical_at:?} after {stubborn_at:?}"
    );
    for p in list {
        let s = p.status.clone().unwrap_or_default();
        assert_eq!(s.reason.as_deref(), Some("Terminated"), "{s:?}");
        assert_eq!(
            s.message.as_deref(),
            Some("Pod was terminated in response to imminent node shutdown.")
        );
        let dt = s
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "DisruptionTarget")
            .cloned()
            .context("DisruptionTarget condition")?;
        assert_eq!(
            (dt.status.as_str(), dt.reason.as_deref()),
            ("True", Some("TerminationByKubelet"))
        );
    }
    let status = agent.wait_exit(Duration::from_secs(20)).await?;
    assert!(status.success(), "exit status {status}\n{}", agent.log_tail());
    let reasons = event_reasons(&admin, name).await?;
    assert!(reasons.iter().any(|r| r == "NodeShutdown"), "{reasons:?}");
    Ok(())
}

/// The binary serves the kubelet API: with a serving certificate from the cluster CA and the API server's
/// client CA, `kubectl logs` through the API server returns the pod's (scripted) log; `/healthz` answers `ok`.
#[tokio::test]
async fn the_binary_serves_logs_through_the_api_server_and_healthz() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{LogParams, PostParams};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    init_logging();
    let cp = control_plane().await?;
    let admin = cp.admin_client().await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    let name = "nl-kapi";
    let (cert, key) = cp.kubelet_serving_certificate(name)?;
    let config = audit_dir().join(format!("{name}.yaml"));
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ntlsCertFile: {}\n\
             tlsPrivateKeyFile: {}\nauthentication:\n  x509:\n    clientCAFile: {}\n",
            cert.display(),
            key.display(),
            cp.client_ca_file().display()
        ),
    )?;
    let config_arg = config.display().to_string();
    let agent = AgentProcess::start(cp, name, &["--config", &config_arg])?;
    if let Err(e) = wait_node(&nodes, name, "Ready=True", Duration::from_secs(20), |n| {
        ready_status(n).as_deref() == Some("True")
    })
    .await
    {
        bail!("{e}\nagent log:\n{}", agent.log_tail());
    }

    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", agent.healthz)).await?;
    tcp.write_all(b"GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await?;
    let mut reply = String::new();
    tcp.read_to_string(&mut reply).await?;
    assert!(
        reply.starts_with("HTTP/1.0 200") && reply.ends_with("\r\n\r\nok"),
        "{reply:?}"
    );

    let pods: Api<Pod> = Api::namespaced(admin, "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "nl-kapi-logs", "annotations": {"cri-fake.node-agent.io/logs": "one\ntwo"}},
        "spec": {"nodeName": name, "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]},
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    poll("nl-kapi-logs Running", Duration::from_secs(30), || async {
        let pod = pods.get("nl-kapi-logs").await?;
        Ok((pod.status.and_then(|s| s.phase).as_deref() == Some("Running")).then_some(()))
    })
    .await?;
    let logs = pods.logs("nl-kapi-logs", &LogParams::default()).await;
    println!("[node_lifecycle] {name}: kubectl logs through the API server: {logs:?}");
    assert_eq!(logs?, "one\ntwo\n", "agent log:\n{}", agent.log_tail());
    pods.delete("nl-kapi-logs", &Default::default()).await?;
    Ok(())
}
