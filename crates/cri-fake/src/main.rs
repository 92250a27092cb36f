//! `cri-fake`: serve an in-memory fake CRI v1 runtime on a unix socket, so a kubelet-style client (the
//! node-agent with `--container-runtime-endpoint`, crictl, the cri-real crate) can drive it like containerd.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use cri_fake::{FakeConfig, FakeRuntime, Profile};

/// Serve a fake CRI v1 runtime (RuntimeService + ImageService) on a unix socket.
#[derive(Debug, Parser)]
#[command(name = "cri-fake", version)]
struct Args {
    /// Unix socket to listen on.
    #[arg(long, env = "CRI_FAKE_SOCKET", default_value = "/tmp/cri-fake.sock")]
    socket: PathBuf,
    /// Pod CIDR(s) to allocate pod IPs from (comma-separated for dual stack). Empty: none until the kubelet
    /// sends the node's podCIDR (UpdateRuntimeConfig); NetworkReady is false until then.
    #[arg(long, env = "CRI_FAKE_POD_CIDR", default_value = cri_fake::DEFAULT_POD_CIDR)]
    pod_cidr: String,
    /// Behaviour default KEY=VALUE (a key of the crate docs, without prefix); repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    settings: Vec<String>,
    /// JSON file with an object of behaviour defaults {"key": "value", ...}; --set overrides it.
    #[arg(long, env = "CRI_FAKE_PROFILE")]
    profile: Option<PathBuf>,
    /// Image present from the start; repeatable.
    #[arg(long = "image", value_name = "REFERENCE")]
    images: Vec<String>,
    /// Seed of the random draws (a random one when absent).
    #[arg(long)]
    seed: Option<u64>,
}

fn profile(args: &Args) -> anyhow::Result<Profile> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    if let Some(file) = &args.profile {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let map: std::collections::BTreeMap<String, String> = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a JSON object of strings", file.display()))?;
        pairs.extend(map);
    }
    for setting in &args.settings {
        let (key, value) = setting
            .split_once('=')
            .with_context(|| format!("--set {setting:?}: expected KEY=VALUE"))?;
        pairs.push((key.to_owned(), value.to_owned()));
    }
    Ok(Profile::from_pairs(pairs)?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let runtime = FakeRuntime::try_new(FakeConfig {
        pod_cidr: Some(args.pod_cidr.trim().to_owned()).filter(|c| !c.is_empty()),
        profile: Arc::new(profile(&args)?),
        images: args.images.clone(),
        seed: args.seed,
        ..FakeConfig::default()
    })?;
    let shutdown = async {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => Some(term),
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                None
            }
        };
        let sigterm = async {
            match term.as_mut() {
                Some(term) => drop(term.recv().await),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            result = tokio::signal::ctrl_c() => {
                if let Err(error) = result {
                    tracing::error!(%error, "cannot listen for ctrl-c");
                }
            }
            () = sigterm => {}
        }
        tracing::info!("shutting down");
    };
    cri_fake::serve(runtime, &args.socket, shutdown).await?;
    Ok(())
}
