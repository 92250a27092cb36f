//! Debugging a running pod on the real node as a user does: `kubectl debug` adds an ephemeral container that
//! shares the target container's processes, and `kubectl attach -it` talks to a container started with a TTY.
//! Both go through the API server to the node's kubelet API and on to containerd.

use std::io::{Read, Write};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::Api;

use super::harness::RealNode;

const NS: &str = "rn-debug";

/// `kubectl -n rn-debug <args>`: exit code, stdout, stderr.
fn kubectl(node: &RealNode, args: &[&str]) -> anyhow::Result<(i32, String, String)> {
    let out = node
        .cp
        .kubectl()
        .args(["-n", NS])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running kubectl")?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

async fn container_status(
    pods: &Api<Pod>,
    pod: &str,
    what: &str,
    pick: impl Fn(&Pod) -> Option<ContainerStatus>,
    until: impl Fn(&ContainerStatus) -> bool,
) -> anyhow::Result<ContainerStatus> {
    wait_for(what, Duration::from_secs(90), || async {
        let p = pods.get(pod).await?;
        Ok(pick(&p).filter(&until))
    })
    .await
}

fn app(p: &Pod, name: &str) -> Option<ContainerStatus> {
    let statuses = p.status.as_ref()?.container_statuses.as_ref()?;
    statuses.iter().find(|c| c.name == name).cloned()
}

fn ephemeral(p: &Pod, name: &str) -> Option<ContainerStatus> {
    let statuses = p.status.as_ref()?.ephemeral_container_statuses.as_ref()?;
    statuses.iter().find(|c| c.name == name).cloned()
}

#[tokio::test]
async fn kubectl_debug_adds_a_container_that_sees_the_target_processes() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let target: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "target"},
        "spec": {"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "main", "image": "localhost/busybox:local",
                                 "command": ["sleep", "3600"]}]},
    }))?;
    node.create_pod(&pods, &target).await?;
    container_status(
        &pods,
        "target",
        "target running",
        |p| app(p, "main"),
        |c| c.state.as_ref().is_some_and(|s| s.running.is_some()),
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;

    // the debug container prints the command line of PID 1 of the namespace it joined: the target's
    let (code, out, err) = kubectl(
        node,
        &[
            "debug",
            "target",
            "--image=localhost/busybox:local",
            "--image-pull-policy=IfNotPresent",
            "--target=main",
            "--container=dbg",
            "--",
            "sh",
            "-c",
            "echo pid1=$(tr '\\0' ' ' < /proc/1/cmdline)",
        ],
    )?;
    assert_eq!(code, 0, "kubectl debug failed: {out}{err}");
    let dbg = container_status(
        &pods,
        "target",
        "debug container finished",
        |p| ephemeral(p, "dbg"),
        |c| c.state.as_ref().is_some_and(|s| s.terminated.is_some()),
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    let done = dbg.state.and_then(|s| s.terminated).context("terminated")?;
    assert_eq!(done.exit_code, 0, "the debug container failed: {done:?}");
    assert!(!dbg.ready, "an ephemeral container is never ready");
    let (code, out, err) = kubectl(node, &["logs", "target", "-c", "dbg"])?;
    assert_eq!(code, 0, "kubectl logs of the debug container failed: {err}");
    assert_eq!(
        out.trim(),
        "pid1=sleep 3600",
        "the debug container did not see the target's processes"
    );

    // it ran once: the target keeps running and the debug container is not started again
    let main = app(&pods.get("target").await?, "main").context("main's status")?;
    assert_eq!(main.restart_count, 0);
    assert!(main.state.is_some_and(|s| s.running.is_some()));
    let events = node
        .cp
        .kubectl()
        .args(["-n", NS, "get", "events", "-o", "json"])
        .output()?;
    let events = String::from_utf8_lossy(&events.stdout);
    assert!(
        events.contains("spec.ephemeralContainers{dbg}"),
        "no event names the debug container's field path"
    );
    Ok(())
}

#[tokio::test]
async fn kubectl_attach_talks_to_a_container_with_a_tty() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let shell: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "shell"},
        "spec": {"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
                 "restartPolicy": "Never",
                 "containers": [{"name": "main", "image": "localhost/busybox:local", "command": ["sh"],
                                 "stdin": true, "tty": true}]},
    }))?;
    node.create_pod(&pods, &shell).await?;
    container_status(
        &pods,
        "shell",
        "shell running",
        |p| app(p, "main"),
        |c| c.state.as_ref().is_some_and(|s| s.running.is_some()),
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;

    // kubectl wants a terminal for -t: `script` gives it one, as a user's terminal would
    let kubectl = node.cp.kubectl();
    let mut line = format!("{}", kubectl.get_program().to_string_lossy());
    for a in kubectl.get_args() {
        line.push(' ');
        line.push_str(&a.to_string_lossy());
    }
    for (k, v) in kubectl.get_envs() {
        if let (k, Some(v)) = (k.to_string_lossy(), v) {
            line = format!("{k}={} {line}", v.to_string_lossy());
        }
    }
    line.push_str(&format!(" -n {NS} attach -it shell -c main"));
    let mut child = std::process::Command::new("script")
        .args(["-qfec", &line, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting script(1) around kubectl attach")?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let mut stdout = child.stdout.take().context("stdout")?;
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 || tx.send(String::from_utf8_lossy(&buf[..n]).into_owned()).is_err() {
                break;
            }
        }
    });
    let mut seen = String::new();
    let started = std::time::Instant::now();
    let mut typed = false;
    while !seen.contains("attached-42") {
        // type once kubectl has said it is attached (or after a while, should its greeting change)
        if !typed && (seen.contains("press enter") || started.elapsed() > Duration::from_secs(10)) {
            // the shell's arithmetic makes the answer appear only in its output, never in the echoed input
            stdin.write_all(b"echo attached-$((40+2))\n")?;
            stdin.flush()?;
            typed = true;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(60),
            "no answer through kubectl attach; it printed: {seen:?}"
        );
        if let Ok(chunk) = rx.recv_timeout(Duration::from_secs(1)) {
            seen.push_str(&chunk);
        }
    }
    stdin.write_all(b"exit\n")?;
    stdin.flush()?;
    drop(stdin);
    let done = container_status(
        &pods,
        "shell",
        "shell exited after exit",
        |p| app(p, "main"),
        |c| c.state.as_ref().is_some_and(|s| s.terminated.is_some()),
    )
    .await?;
    assert_eq!(
        done.state.and_then(|s| s.terminated).map(|t| t.exit_code),
        Some(0)
    );
    let _ = child.kill();
    let _ = child.wait();
    let _ = reader.join();
    Ok(())
}
