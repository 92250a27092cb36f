//! Start-up errors name what is wrong: `node-agent` and `hollow` started with one of their ports already taken
//! (by a listener of this test on 127.0.0.1) exit non-zero, and their error names the address and the flag or
//! KubeletConfiguration field that chose it — the kubelet port, the read-only port, the healthz port, the
//! fleet's metrics port and a hollow node's kubelet port. Each program runs against the shared real control
//! plane with real credentials, so the port is the only thing wrong.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

/// A port of 127.0.0.1 held by a listener of this process, and one free (bound and released) port.
fn taken() -> anyhow::Result<(TcpListener, u16)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    Ok((l, port))
}

fn free() -> anyhow::Result<String> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port().to_string())
}

/// Runs `program` with `args` until it exits (at most 90 s: a program that keeps running fails the test);
/// answers its exit success and standard error.
fn run(program: &Path, args: &[String]) -> anyhow::Result<(bool, String, Duration)> {
    let t0 = Instant::now();
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| program.display().to_string())?;
    loop {
        if let Some(status) = child.try_wait()? {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().context("stderr")?, &mut err)?;
            return Ok((status.success(), err, t0.elapsed()));
        }
        if t0.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("{} still runs after 90 s with a port taken", program.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `node-agent` on the fake runtime, as node `name`, with `extra` arguments (which set the port under test).
fn node_agent_args(
    cp: &testenv::ControlPlane,
    name: &str,
    root: &Path,
    extra: &[String],
) -> anyhow::Result<Vec<String>> {
    let mut args: Vec<String> = vec![
        "--kubeconfig".into(),
        cp.node_kubeconfig(name)?.display().to_string(),
        "--hostname-override".into(),
        name.into(),
        "--node-ip".into(),
        "127.0.0.1".into(),
        "--runtime".into(),
        "fake".into(),
        "--root-dir".into(),
        root.display().to_string(),
        "--address".into(),
        "127.0.0.1".into(),
    ];
    args.extend(extra.iter().cloned());
    Ok(args)
}

/// Asserts the program failed and its error names `addr` and every one of `names`.
fn assert_named(what: &str, (ok, err, took): (bool, String, Duration), addr: &str, names: &[&str]) {
    assert!(!ok, "{what}: exited successfully with its port taken:\n{err}");
    assert!(
        err.contains(addr),
        "{what}: the error does not name {addr}:\n{err}"
    );
    for n in names {
        assert!(err.contains(n), "{what}: the error does not name {n}:\n{err}");
    }
    assert!(
        err.contains("Address already in use"),
        "{what}: the error does not say why:\n{err}"
    );
    let line = err.lines().find(|l| l.contains(addr)).unwrap_or_default();
    println!("[startup_errors] {what}: exited after {took:?}: {}", line.trim());
}

#[tokio::test]
async fn node_agent_names_the_port_that_is_taken() -> anyhow::Result<()> {
    e2e::init_logging();
    let cp = testenv::shared().await?;
    let bin = e2e::node_agent_binary()?;
    let root = tempfile_dir("node-agent")?;
    // (what, the setting's flag and field, the arguments that put it on the taken port)
    type Case = (&'static str, [&'static str; 2], fn(u16, String) -> Vec<String>);
    let cases: [Case; 3] = [
        ("kubelet port", ["--port", "`port`"], |p, f| {
            vec!["--port".into(), p.to_string(), "--healthz-port".into(), f]
        }),
        ("healthz port", ["--healthz-port", "`healthzPort`"], |p, f| {
            vec!["--port".into(), f, "--healthz-port".into(), p.to_string()]
        }),
        (
            "read-only port",
            ["--read-only-port", "`readOnlyPort`"],
            |p, f| {
                vec![
                    "--port".into(),
                    f,
                    "--healthz-port".into(),
                    "0".into(),
                    "--read-only-port".into(),
                    p.to_string(),
                ]
            },
        ),
    ];
    for (i, (what, names, args)) in cases.into_iter().enumerate() {
        let (_held, port) = taken()?;
        let dir = root.join(i.to_string());
        std::fs::create_dir_all(&dir)?;
        let args = node_agent_args(cp, &format!("startup-err-{i}"), &dir, &args(port, free()?))?;
        let result = tokio::task::spawn_blocking({
            let bin = bin.clone();
            move || run(&bin, &args)
        })
        .await??;
        assert_named(
            &format!("node-agent, {what} taken"),
            result,
            &format!("127.0.0.1:{port}"),
            &names,
        );
    }
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

#[tokio::test]
async fn hollow_names_the_port_that_is_taken() -> anyhow::Result<()> {
    e2e::init_logging();
    let cp = testenv::shared().await?;
    let bin = e2e::hollow_binary()?;
    let kubeconfig = cp.admin_kubeconfig().display().to_string();
    let (_held, port) = taken()?;
    let args: Vec<String> = vec![
        "run".into(),
        "--nodes".into(),
        "1".into(),
        "--name-template".into(),
        "startup-err-m{index}".into(),
        "--kubeconfig".into(),
        kubeconfig.clone(),
        "--metrics-address".into(),
        format!("127.0.0.1:{port}"),
    ];
    let result = tokio::task::spawn_blocking({
        let bin = bin.clone();
        move || run(&bin, &args)
    })
    .await??;
    assert_named(
        "hollow, metrics port taken",
        result,
        &format!("127.0.0.1:{port}"),
        &["--metrics-address"],
    );

    let (_held, port) = taken()?;
    let args: Vec<String> = vec![
        "run".into(),
        "--nodes".into(),
        "1".into(),
        "--name-template".into(),
        "startup-err-k{index}".into(),
        "--kubeconfig".into(),
        kubeconfig,
        "--metrics-address".into(),
        format!("127.0.0.1:{}", free()?),
        "--serve-kubelet-api".into(),
        "--kubelet-port".into(),
        port.to_string(),
    ];
    let result = tokio::task::spawn_blocking(move || run(&bin, &args)).await??;
    assert_named(
        "hollow, a node's kubelet port taken",
        result,
        &format!("127.0.0.1:{port}"),
        &["--kubelet-port"],
    );
    Ok(())
}

/// A fresh directory below the system's temporary directory.
fn tempfile_dir(name: &str) -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("na-startup-errors-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
