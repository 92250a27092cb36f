//! node-agent on cgroup v2 with the cgroupfs driver, then as a systemd service, in one Debian guest (see
//! `vm_node/harness.rs`); one test, since its last step reboots the guest the binary shares.
//!
//! First the node as the harness starts it (cgroupfs driver on the unified hierarchy): pods of the three QoS
//! classes run in the kubelet's cgroups with the kubelet's limits, the node's `podPidsLimit` and the kubelet's
//! OOM scores, as read from the guest's cgroup and proc files; `kubepods` is limited to the node's allocatable;
//! a container past its memory limit is OOM-killed and reported so; the node's and pods' figures come from the
//! v2 files.
//!
//! Then the unit the repository ships (`dist/systemd/node-agent.service`) runs the agent, configured here with
//! `shutdownGracePeriod: 60s` and `shutdownGracePeriodCriticalPods: 20s` (stopping a pod in the emulated guest
//! takes about 10 s when the machine is loaded). The agent raises logind's `InhibitDelayMaxSec` to 60 s through
//! `/etc/systemd/logind.conf.d/99-kubelet.conf` and holds a delay inhibitor lock. `systemctl restart
//! node-agent` (an upgrade) leaves the pods running — the same containers, no restart, no shutdown event —
//! while `systemctl reboot` shuts them down as the kubelet does before the guest goes down: the regular pod
//! first, the critical one after it, each reported Failed with the kubelet's reason, message and
//! `DisruptionTarget` condition, the Node NotReady (`node is shutting down`) with a `NodeShutdown` event — all
//! read from the API server on the host once the guest has rebooted (QEMU exits then). Needs root (or
//! `NODE_AGENT_SKIP_REAL_NODE=1` to skip).

#[path = "vm_node/checks.rs"]
mod checks;
#[allow(dead_code)]
#[path = "vm_node/harness.rs"]
mod harness;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use e2e::vm::GUEST_SHARE;
use e2e::{init_logging, wait_for};
use harness::{AGENT_LOG, NODE, NodeSetup, VmNode};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams};

const NS: &str = "vm-service";
/// The namespace of the cgroup checks' pods, and the tag their messages carry.
const CGROUPS_NS: &str = "vm-cgroups";
const TAG: &str = "vm_service";
/// The unit's configuration in the guest: the harness's, plus the shutdown periods.
const CONFIG: &str = "/etc/node-agent/config.yaml";
/// Where the shipped unit is found in the share.
const DIST: &str = "dist";

fn pod(name: &str, script: &str, critical: bool) -> anyhow::Result<Pod> {
    let mut spec = serde_json::json!({
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 30,
        "containers": [{"name": "main", "image": "localhost/busybox:local", "command": ["sh", "-c", script]}],
    });
    if critical {
        spec["priorityClassName"] = "system-node-critical".into();
    }
    Ok(serde_json::from_value(
        serde_json::json!({"metadata": {"name": name}, "spec": spec}),
    )?)
}

/// The host directory the guest sees at [`GUEST_SHARE`] (the harness's, named after this process).
fn share() -> PathBuf {
    std::env::temp_dir().join(format!("na-vm-node-{}", std::process::id()))
}

/// The pod once Running: its container's ID.
async fn running_container(node: &VmNode, api: &Api<Pod>, name: &str) -> anyhow::Result<String> {
    let p = wait_for(
        &format!("pod {name} Running"),
        Duration::from_secs(180),
        || async {
            let p = api.get(name).await?;
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            Ok((phase == Some("Running")).then_some(p))
        },
    )
    .await;
    let p = match p {
        Ok(p) => p,
        Err(e) => return Err(e.context(format!("agent log:\n{}", node.agent_log_tail().await))),
    };
    container_of(&p)
}

fn container_of(p: &Pod) -> anyhow::Result<String> {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.container_id.clone())
        .context("containerID")
}

fn restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map_or(-1, |c| c.restart_count)
}

async fn node_shutdown_events(admin: &kube::Client) -> anyhow::Result<usize> {
    let events = Api::<Event>::all(admin.clone())
        .list(&ListParams::default().fields(&format!("involvedObject.name={NODE}")))
        .await?;
    Ok(events
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("NodeShutdown"))
        .count())
}

/// The agent's main PID in the guest (0 when it does not run).
async fn agent_pid(node: &VmNode) -> anyhow::Result<u32> {
    let out = node
        .vm
        .run(
            "systemctl show -p MainPID --value node-agent",
            Duration::from_secs(30),
        )
        .await?;
    Ok(out.trim().parse()?)
}

/// Replaces the harness's transient `node-agent` unit with the shipped unit file, started with the same flags
/// (its configuration extended by the shutdown periods).
async fn install_unit(node: &VmNode) -> anyhow::Result<()> {
    let dist = share().join(DIST);
    std::fs::create_dir_all(&dist)?;
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/systemd/node-agent.service");
    std::fs::copy(&unit, dist.join("node-agent.service"))
        .with_context(|| format!("copying {}", unit.display()))?;
    // the agent's log (stderr) goes to the serial console: it outlives the guest's throw-away disk
    let script = format!(
        r#"set -e
pid=$(systemctl show -p MainPID --value node-agent)
args=$(tr '\0' ' ' </proc/$pid/cmdline | cut -d' ' -f2- | sed 's#--config [^ ]*#--config {CONFIG}#')
systemctl stop node-agent
systemctl reset-failed node-agent 2>/dev/null || true
mkdir -p /etc/node-agent /etc/systemd/system/node-agent.service.d
cp {GUEST_SHARE}/kubelet-config.yaml {CONFIG}
printf 'shutdownGracePeriod: 60s\nshutdownGracePeriodCriticalPods: 20s\n' >> {CONFIG}
install -m 0644 {GUEST_SHARE}/{DIST}/node-agent.service /etc/systemd/system/node-agent.service
echo "NODE_AGENT_ARGS=$args" > /etc/default/node-agent
printf '[Service]\nStandardOutput=append:{AGENT_LOG}\nStandardError=journal+console\n' \
  > /etc/systemd/system/node-agent.service.d/20-log.conf
systemctl daemon-reload
systemctl enable --now node-agent
"#
    );
    node.vm
        .run(&script, Duration::from_secs(120))
        .await
        .context("installing the node-agent unit")?;
    Ok(())
}

async fn wait_ready(node: &VmNode, nodes: &Api<Node>, what: &str) -> anyhow::Result<()> {
    let ready = wait_for(what, Duration::from_secs(180), || async {
        Ok(nodes.get_opt(NODE).await?.filter(e2e::node_is_ready))
    })
    .await;
    match ready {
        Ok(_) => Ok(()),
        Err(e) => Err(e.context(format!("agent log:\n{}", node.agent_log_tail().await))),
    }
}

/// The cgroupfs driver on cgroup v2, checked in the guest before the service takes the agent over; their pods
/// are deleted after, so the reboot stops only the service test's own.
async fn cgroupfs_on_v2(node: &VmNode) -> anyhow::Result<()> {
    let pods = node.namespace(CGROUPS_NS).await?;
    let t0 = Instant::now();
    let (qos, allocatable, oom) = tokio::join!(
        checks::qos_pods_run_in_their_cgroups(node, &pods, TAG),
        checks::pods_cgroup_is_limited_to_allocatable(node, TAG),
        checks::a_container_past_its_limit_is_oom_killed(node, &pods, TAG),
    );
    // every check's outcome, not only the first failure's
    let failed: Vec<String> = [
        ("QoS pods in their cgroups", qos),
        ("kubepods limited to allocatable", allocatable),
        ("OOM kill", oom),
    ]
    .into_iter()
    .filter_map(|(what, r)| r.err().map(|e| format!("{what}: {e:#}")))
    .collect();
    anyhow::ensure!(failed.is_empty(), "cgroupfs on cgroup v2:\n{}", failed.join("\n"));
    pods.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    e2e::wait_until_empty(&pods, "the cgroup checks' pods gone", Duration::from_secs(180)).await?;
    println!("[vm_service] cgroupfs on cgroup v2 checked in {:?}", t0.elapsed());
    Ok(())
}

#[tokio::test]
async fn cgroupfs_on_v2_then_a_service_restart_keeps_pods_and_a_reboot_shuts_them_down_by_priority()
-> anyhow::Result<()> {
    init_logging();
    let Some(node) = VmNode::get(NodeSetup {
        systemd: false,
        config: "",
        huge_pages: 0,
    })
    .await?
    else {
        return Ok(());
    };
    let admin = node.cp.admin_client().await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    Box::pin(cgroupfs_on_v2(node)).await?;

    // the shipped unit, and logind made to wait for the shutdown periods
    let t0 = Instant::now();
    install_unit(node).await?;
    let conf = wait_for("logind's override written", Duration::from_secs(60), || async {
        let out = node
            .vm
            .sh(
                "cat /etc/systemd/logind.conf.d/99-kubelet.conf",
                Duration::from_secs(30),
            )
            .await?;
        Ok((out.code == Some(0)).then_some(out.stdout))
    })
    .await;
    let conf = match conf {
        Ok(c) => c,
        Err(e) => return Err(e.context(format!("agent log:\n{}", node.agent_log_tail().await))),
    };
    assert!(conf.contains("InhibitDelayMaxSec=60\n"), "{conf}");
    let delay = node
        .vm
        .run(
            "busctl get-property org.freedesktop.login1 /org/freedesktop/login1 \
             org.freedesktop.login1.Manager InhibitDelayMaxUSec",
            Duration::from_secs(30),
        )
        .await?;
    assert_eq!(
        delay.trim(),
        "t 60000000",
        "logind's delay after the agent raised it"
    );
    let locks = wait_for(
        "the agent's delay inhibitor lock",
        Duration::from_secs(60),
        || async {
            let out = node
                .vm
                .run("systemd-inhibit --list --no-pager", Duration::from_secs(30))
                .await?;
            Ok(out
                .lines()
                .any(|l| l.contains("kubelet") && l.contains("shutdown") && l.contains("delay"))
                .then_some(out))
        },
    )
    .await?;
    println!(
        "[vm_service] unit started, logind armed in {:?}:\n{locks}",
        t0.elapsed()
    );
    wait_ready(node, &nodes, "the node Ready under the unit").await?;

    let apps = node.namespace(NS).await?;
    let system = node.namespace("kube-system").await?;
    // the regular pod leaves 2 s after its SIGTERM, noting when; the critical one notes when its SIGTERM comes
    // and leaves (a stop at its group's deadline takes longer than the slack under emulation)
    node.create_pod(
        &apps,
        &pod(
            "app",
            "trap 'sleep 2; read up _ </proc/uptime; echo \"$up\" >/dev/termination-log; exit 0' TERM; \
             while true; do sleep 1 & wait $!; done",
            false,
        )?,
    )
    .await?;
    node.create_pod(
        &system,
        &pod(
            "crit",
            "trap 'read up _ </proc/uptime; echo \"$up\" >/dev/termination-log; exit 0' TERM; \
             while true; do sleep 1 & wait $!; done",
            true,
        )?,
    )
    .await?;
    let app_id = running_container(node, &apps, "app").await?;
    let crit_id = running_container(node, &system, "crit").await?;

    // a service restart: the agent is replaced, the pods are not
    let pid = agent_pid(node).await?;
    let t1 = Instant::now();
    node.vm
        .run("systemctl restart node-agent", Duration::from_secs(120))
        .await?;
    let new_pid = agent_pid(node).await?;
    assert!(new_pid != 0 && new_pid != pid, "a new agent: {pid} -> {new_pid}");
    // the new agent's first sync has reported the pods: its status heartbeat and a full sync period later
    wait_ready(node, &nodes, "the node Ready after the restart").await?;
    tokio::time::sleep(Duration::from_secs(15)).await;
    println!(
        "[vm_service] systemctl restart: agent {pid} -> {new_pid}, Ready again, checked {:?} after",
        t1.elapsed()
    );
    for (api, name, id) in [(&apps, "app", &app_id), (&system, "crit", &crit_id)] {
        let p = api.get(name).await?;
        let phase = p.status.as_ref().and_then(|s| s.phase.clone());
        assert_eq!(phase.as_deref(), Some("Running"), "{name} after the restart");
        assert_eq!(
            &container_of(&p)?,
            id,
            "{name}: the same container after the restart"
        );
        assert_eq!(restarts(&p), 0, "{name}: not restarted");
        let short = id.strip_prefix("containerd://").unwrap_or(id);
        let task = node
            .vm
            .run(
                &format!("ctr -a /var/lib/na-cri/containerd.sock -n k8s.io task ls | grep '^{short}'"),
                Duration::from_secs(30),
            )
            .await?;
        assert!(task.contains("RUNNING"), "{name}'s task in containerd: {task}");
    }
    assert_eq!(
        node_shutdown_events(&admin).await?,
        0,
        "a service restart is no node shutdown"
    );

    // the machine reboots: logind waits for the agent's lock, the agent shuts the pods down first
    let t2 = Instant::now();
    let _ = node.vm.sh("systemctl reboot", Duration::from_secs(30)).await;
    let mut noted = Vec::new();
    for (api, name) in [(&apps, "app"), (&system, "crit")] {
        let status = wait_for(
            &format!("{name} Failed after the reboot began"),
            Duration::from_secs(120),
            || async {
                let s = api.get(name).await?.status.unwrap_or_default();
                Ok((s.phase.as_deref() == Some("Failed")).then_some(s))
            },
        )
        .await
        .with_context(|| format!("console:\n{}", node.vm.console_tail(40)))?;
        println!(
            "[vm_service] {name}: {:?} {:?} {:?}, {:?} after `systemctl reboot`",
            status.phase,
            status.reason,
            status.message,
            t2.elapsed()
        );
        assert_eq!(status.reason.as_deref(), Some("Terminated"), "{name}");
        assert_eq!(
            status.message.as_deref(),
            Some("Pod was terminated in response to imminent node shutdown."),
            "{name}"
        );
        let disruption = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "DisruptionTarget")
            .with_context(|| format!("{name}: no DisruptionTarget condition"))?;
        assert_eq!(disruption.status, "True");
        assert_eq!(disruption.reason.as_deref(), Some("TerminationByKubelet"));
        let terminated = status
            .container_statuses
            .iter()
            .flatten()
            .find_map(|c| c.state.as_ref()?.terminated.clone())
            .with_context(|| format!("{name}: no terminated container"))?;
        let at: f64 = terminated
            .message
            .as_deref()
            .unwrap_or_default()
            .trim()
            .parse()
            .with_context(|| format!("{name}'s termination message {:?}", terminated.message))?;
        noted.push(at);
    }
    let (app_left, crit_asked) = (noted[0], noted[1]);
    println!(
        "[vm_service] the critical pod got SIGTERM {:.2} s after the regular pod left",
        crit_asked - app_left
    );
    assert!(
        crit_asked >= app_left,
        "the critical pod was stopped before the regular one had left: SIGTERM at uptime {crit_asked}, regular \
         pod left at {app_left}"
    );
    let n = nodes.get(NODE).await?;
    let ready = n
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap_or_default();
    assert_eq!(ready.status, "False", "{:?}", ready.message);
    assert!(
        ready
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("node is shutting down"),
        "{:?}",
        ready.message
    );
    assert!(node_shutdown_events(&admin).await? >= 1, "a NodeShutdown event");
    // and only then the guest went down
    let console = wait_for("the guest rebooting", Duration::from_secs(180), || async {
        let tail = node.vm.console_tail(15);
        Ok(tail.contains("reboot: Restarting system").then_some(tail))
    })
    .await?;
    println!(
        "[vm_service] guest down {:?} after `systemctl reboot`:\n{console}",
        t2.elapsed()
    );
    Ok(())
}
