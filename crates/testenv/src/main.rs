//! `testenv`: the test control plane from a shell.
//!
//! * `testenv up [--dir DIR]` starts etcd, kube-apiserver, kube-scheduler and kube-controller-manager on
//!   loopback, prints how to reach them, and runs until SIGINT/SIGTERM, then stops them all.
//! * `testenv down --dir DIR` stops a control plane started by `up` (signals its launcher).
//! * `testenv node-kubeconfig --dir DIR --node NAME` mints a `system:node:NAME` credential, prints its path.
//! * `testenv build` builds (or finds) the Kubernetes binaries and prints where they are.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use testenv::{ControlPlane, Options};

#[derive(Parser)]
#[command(about = "A real Kubernetes control plane on 127.0.0.1 for tests and the demo")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a control plane and run until interrupted.
    Up {
        /// Directory for certificates, kubeconfigs, logs and etcd data.
        #[arg(long, default_value = "/tmp/node-agent-control-plane")]
        dir: PathBuf,
        /// The controller-manager's --node-monitor-grace-period, in seconds.
        #[arg(long)]
        node_monitor_grace_period: Option<u64>,
        /// One more kube-apiserver flag, as `--apiserver-arg=--flag=value` (repeatable), e.g. an audit log.
        #[arg(long = "apiserver-arg", allow_hyphen_values = true)]
        apiserver_args: Vec<String>,
    },
    /// Stop a control plane started by `up`.
    Down {
        /// The directory given to `up`.
        #[arg(long, default_value = "/tmp/node-agent-control-plane")]
        dir: PathBuf,
    },
    /// Mint a node credential and print the kubeconfig's path.
    NodeKubeconfig {
        /// The directory given to `up`.
        #[arg(long, default_value = "/tmp/node-agent-control-plane")]
        dir: PathBuf,
        /// Node name (the identity is system:node:<node>).
        #[arg(long)]
        node: String,
    },
    /// Build or find the Kubernetes binaries and print their directory.
    Build,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube_client=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Cmd::Up {
            dir,
            node_monitor_grace_period,
            apiserver_args,
        } => up(dir, node_monitor_grace_period, apiserver_args).await,
        Cmd::Down { dir } => down(dir).await,
        Cmd::NodeKubeconfig { dir, node } => {
            let cp = ControlPlane::attach(&dir)?;
            println!("{}", cp.node_kubeconfig(&node)?.display());
            Ok(())
        }
        Cmd::Build => {
            let bins = tokio::task::spawn_blocking(testenv::assets::locate).await??;
            println!(
                "{}",
                bins.kube_apiserver
                    .parent()
                    .unwrap_or(&bins.kube_apiserver)
                    .display()
            );
            Ok(())
        }
    }
}

async fn up(dir: PathBuf, grace: Option<u64>, apiserver_args: Vec<String>) -> anyhow::Result<()> {
    if let Ok(old) = ControlPlane::attach(&dir)
        && let Some((_, pid)) = old.info().pids.iter().find(|(n, _)| n == "launcher")
        && testenv::process::pid_alive(*pid)
    {
        anyhow::bail!(
            "a control plane already runs in {} (launcher pid {pid})",
            dir.display()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    let opts = Options {
        dir: Some(dir.clone()),
        node_monitor_grace_period: grace.map(Duration::from_secs),
        apiserver_args,
        ..Options::default()
    };
    let cp = ControlPlane::start(opts).await?;
    println!("control plane {} ready at {}", cp.info().version, cp.server());
    println!("  export KUBECONFIG={}", cp.admin_kubeconfig().display());
    println!("  export NODE_AGENT_CONTROL_PLANE={}", cp.dir().display());
    println!("  kubectl: {}", cp.info().binaries.kubectl.display());
    println!("  logs:    {}/logs", cp.dir().display());
    println!("stop with Ctrl-C or: testenv down --dir {}", cp.dir().display());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    eprintln!("stopping the control plane");
    cp.stop().await
}

async fn down(dir: PathBuf) -> anyhow::Result<()> {
    let cp = ControlPlane::attach(&dir).context("no control plane there")?;
    let Some((_, pid)) = cp.info().pids.iter().find(|(n, _)| n == "launcher").cloned() else {
        anyhow::bail!("no launcher pid recorded");
    };
    if testenv::process::pid_alive(pid) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid)?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
    }
    // wait for every recorded process to go
    for _ in 0..300 {
        if cp
            .info()
            .pids
            .iter()
            .all(|(_, p)| !testenv::process::pid_alive(*p))
        {
            println!("stopped");
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("some processes still run: {:?}", cp.info().pids)
}
