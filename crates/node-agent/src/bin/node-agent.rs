//! `node-agent`: one Kubernetes node agent (kubelet) for this machine.
//!
//! Builds everything the library core is handed — the configuration (KubeletConfiguration file + flags), the
//! API client (from `--kubeconfig`), the container runtime (`--container-runtime-endpoint`, or the in-memory
//! fake with `--runtime fake`) and the machine facts — then runs the agent until SIGTERM or SIGINT, and stops it
//! gracefully. Configuration errors are reported naming the field, with exit code 1, before anything else
//! happens.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use kube::config::{KubeConfigOptions, Kubeconfig};
use node_agent::config::RuntimeKind;
use node_agent::{Agent, Flags, MachineInfo, Metrics};
use prometheus_client::registry::Registry;
use runtime_api::Runtime;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn,tower=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let flags = Flags::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("node-agent: error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(flags)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("node-agent: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn machine_hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default()
}

async fn run(flags: Flags) -> anyhow::Result<()> {
    // Configuration first: a bad file or flag fails before any connection is attempted.
    let (kubelet, ignored) = flags.kubelet_config().with_context(|| match &flags.config {
        Some(path) => format!("configuration {}", path.display()),
        None => "configuration".to_owned(),
    })?;
    if !ignored.is_empty() {
        tracing::warn!(fields = ?ignored, "configuration fields accepted but not acted on by node-agent");
    }
    let kubelet = Arc::new(kubelet);
    let hostname = machine_hostname();
    let node_name = flags
        .hostname_override
        .clone()
        .unwrap_or_else(|| hostname.clone())
        .to_ascii_lowercase();
    let machine = match flags.runtime {
        RuntimeKind::Fake => MachineInfo::synthetic(&node_name),
        RuntimeKind::Remote => MachineInfo::from_host(&flags.root_dir).context("reading machine facts")?,
    };
    let config = flags.agent_config(kubelet.clone(), machine, &hostname)?;

    let kubeconfig_path = flags
        .kubeconfig
        .clone()
        .context("--kubeconfig is required (the node's credentials)")?;
    let kubeconfig = Kubeconfig::read_from(&kubeconfig_path)
        .with_context(|| format!("reading kubeconfig {}", kubeconfig_path.display()))?;
    let client_config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("loading kubeconfig {}", kubeconfig_path.display()))?;
    let client = kube::Client::try_from(client_config).context("building the API client")?;

    let runtime: Arc<dyn Runtime> = match flags.runtime {
        RuntimeKind::Fake => {
            tracing::info!("using the in-memory fake container runtime");
            Arc::new(cri_fake::FakeRuntime::new(cri_fake::FakeConfig::default()))
        }
        RuntimeKind::Remote => {
            let endpoint = &kubelet.container_runtime_endpoint;
            let remote = cri_real::RemoteConfig {
                request_timeout: kubelet.runtime_request_timeout,
                ..Default::default()
            };
            let rt = cri_real::RemoteRuntime::connect_with(endpoint, remote)
                .await
                .with_context(|| format!("connecting to the container runtime at {endpoint}"))?;
            tracing::info!(%endpoint, "connected to the container runtime");
            Arc::new(rt)
        }
    };

    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry));
    let token = CancellationToken::new();
    let node = config.node_name.clone();
    let agent = Agent::builder(config, client, runtime)
        .token(token.clone())
        .metrics(metrics)
        .build()?
        .start();
    tracing::info!(%node, "node agent started");

    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received, stopping"),
        _ = int.recv() => tracing::info!("SIGINT received, stopping"),
        () = token.cancelled() => {}
    }
    agent.stop(flags.shutdown_timeout).await?;
    tracing::info!(%node, "node agent stopped");
    Ok(())
}
