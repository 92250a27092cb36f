//! A long run of a hollow fleet against a real control plane: `SOAK_NODES` (1,000) nodes of the `hollow` binary
//! with node churn (`--churn-nodes`, `--churn-per-minute`: a node leaves, its Node deleted, and one with a fresh
//! name joins) and pod churn (every `SOAK_EVERY_SECS` a batch of `SOAK_BATCH` pods bound to random nodes is
//! created and the oldest batch deleted once `SOAK_LIVE_BATCHES` exist) for `SOAK_MINUTES` (30). Once a minute
//! it samples the fleet process's resident memory, open file descriptors and tasks (threads), the Ready nodes
//! and the Running pods; at the end it deletes every pod, samples once more and prints each series' slope per
//! hour over the whole run and its second half. A hollow node makes no mounts, cgroups or network namespaces,
//! so those are not sampled here (the real node's soak does). Nothing is asserted: a benchmark, not a test.
//!
//! ```sh
//! cargo bench -p hollow --bench soak
//! SOAK_MINUTES=10 SOAK_NODES=1000 SOAK_CHURN_NODES=50 SOAK_CHURN_PER_MINUTE=20 cargo bench -p hollow --bench soak
//! SOAK_HOLLOW_BIN=target/debug/hollow cargo bench ...   # soak another build of the fleet
//! ```

#[path = "density/cluster.rs"]
#[allow(dead_code)]
mod cluster;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use e2e::soak::{Series, load};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;

const PREFIX: &str = "soak";

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn env_num<T: std::str::FromStr>(name: &str, default: &str) -> anyhow::Result<T> {
    env_or(name, default)
        .parse()
        .map_err(|_| anyhow::anyhow!("{name}: not a number"))
}

struct Settings {
    minutes: u64,
    nodes: usize,
    churn_nodes: usize,
    churn_per_minute: f64,
    every: Duration,
    batch: usize,
    live_batches: usize,
}

fn count_dir(path: &str) -> usize {
    std::fs::read_dir(path).map(|d| d.count()).unwrap_or(0)
}

/// A cheap pseudo-random sequence (splitmix64) for picking nodes; no need for a crate.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

async fn take_sample(
    series: &mut Series,
    minute: f64,
    pid: u32,
    client: &kube::Client,
) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let (_, ready) = cluster::ready_nodes(&nodes, PREFIX).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let list = pods.list(&ListParams::default().labels("app=soak")).await?;
    let running = list
        .items
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count();
    series.push(
        minute,
        &[
            (
                "rss_mib",
                testenv::process::rss_bytes(pid)? as f64 / (1 << 20) as f64,
            ),
            ("fds", count_dir(&format!("/proc/{pid}/fd")) as f64),
            ("tasks", count_dir(&format!("/proc/{pid}/task")) as f64),
            ("nodes_ready", ready as f64),
            ("pods_running", running as f64),
        ],
    );
    eprintln!("soak: {}", series.last_line());
    Ok(())
}

async fn churn(settings: &Settings, pid: u32, client: &kube::Client) -> anyhow::Result<(Series, usize)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut series = Series::default();
    let t0 = tokio::time::Instant::now();
    let minute = |t: tokio::time::Instant| t.duration_since(t0).as_secs_f64() / 60.0;
    take_sample(&mut series, 0.0, pid, client).await?;
    let mut next_sample = t0 + Duration::from_secs(60);
    let end = t0 + Duration::from_secs(settings.minutes * 60);
    let mut batches: VecDeque<Vec<String>> = VecDeque::new();
    let mut created = 0usize;
    let mut seed = u64::from(pid);
    let mut tick = tokio::time::interval(settings.every);
    while tokio::time::Instant::now() < end {
        tick.tick().await;
        let mut batch = Vec::with_capacity(settings.batch);
        for _ in 0..settings.batch {
            let name = format!("soak-{created}");
            let node = format!("{PREFIX}-{}", next(&mut seed) % settings.nodes as u64);
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"app": "soak"}},
                "spec": {
                    "nodeName": node,
                    "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}],
                    "tolerations": [{"operator": "Exists"}],
                },
            }))?;
            // a loaded API server may refuse now and then: the churn goes on
            if let Err(e) = pods.create(&PostParams::default(), &pod).await {
                eprintln!("soak: creating {name} failed: {e}");
            }
            created += 1;
            batch.push(name);
        }
        batches.push_back(batch);
        while batches.len() > settings.live_batches {
            for name in batches.pop_front().unwrap_or_default() {
                // gone already when its node left (the pod GC removes pods of deleted nodes)
                let _ = pods.delete(&name, &DeleteParams::default()).await;
            }
        }
        let now = tokio::time::Instant::now();
        if now >= next_sample {
            take_sample(&mut series, minute(now), pid, client).await?;
            next_sample += Duration::from_secs(60);
        }
    }
    for name in batches.into_iter().flatten() {
        let _ = pods.delete(&name, &DeleteParams::default()).await;
    }
    e2e::wait_for("every soak pod gone", Duration::from_secs(300), || async {
        Ok(pods
            .list(&ListParams::default().labels("app=soak"))
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(20)).await;
    take_sample(&mut series, minute(tokio::time::Instant::now()), pid, client).await?;
    Ok((series, created))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // `cargo test --all-targets` runs bench targets without --bench: a soak of minutes has no place there
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("soak: skipped (not run by cargo bench); run `cargo bench -p hollow --bench soak`");
        return Ok(());
    }
    let settings = Settings {
        minutes: env_num("SOAK_MINUTES", "30")?,
        nodes: env_num("SOAK_NODES", "1000")?,
        churn_nodes: env_num("SOAK_CHURN_NODES", "50")?,
        churn_per_minute: env_num("SOAK_CHURN_PER_MINUTE", "20")?,
        every: Duration::from_secs_f64(env_num("SOAK_EVERY_SECS", "2")?),
        batch: env_num("SOAK_BATCH", "20")?,
        live_batches: env_num("SOAK_LIVE_BATCHES", "10")?,
    };
    anyhow::ensure!(
        settings.minutes > 0 && settings.nodes > 0,
        "SOAK_MINUTES and SOAK_NODES must be over 0"
    );
    let load_before = load();
    let cp = testenv::ControlPlane::start(testenv::Options::default()).await?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let bin = std::env::var_os("SOAK_HOLLOW_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_hollow")));
    let mut args = vec![
        "run".to_owned(),
        "--nodes".to_owned(),
        settings.nodes.to_string(),
        "--name-template".to_owned(),
        format!("{PREFIX}-{{index}}"),
        "--register-qps".to_owned(),
        "500".to_owned(),
        "--metrics-address".to_owned(),
        format!("127.0.0.1:{port}"),
    ];
    if settings.churn_nodes > 0 {
        args.extend([
            "--churn-nodes".to_owned(),
            settings.churn_nodes.to_string(),
            "--churn-per-minute".to_owned(),
            settings.churn_per_minute.to_string(),
        ]);
    }
    let mut child = Command::new(&bin)
        .args(&args)
        .arg("--kubeconfig")
        .arg(cp.admin_kubeconfig())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let t0 = std::time::Instant::now();
    let result = async {
        let client = cp.admin_client().await?;
        let nodes: Api<Node> = Api::all(client.clone());
        cluster::wait_ready(&nodes, PREFIX, settings.nodes, Duration::from_secs(900)).await?;
        eprintln!(
            "soak: {} nodes Ready after {:.0} s; churn for {} min",
            settings.nodes,
            t0.elapsed().as_secs_f64(),
            settings.minutes
        );
        churn(&settings, child.id(), &client).await
    }
    .await;
    let _ = child.kill();
    let _ = child.wait();
    cp.stop().await?;
    let (series, created) = result?;
    println!(
        "soak of a hollow fleet: {} nodes, churn {} nodes at {}/min; {:.1} min in all, {created} pods created and \
         deleted ({} every {:?}, {} batches alive); load {load_before} -> {}",
        settings.nodes,
        settings.churn_nodes,
        settings.churn_per_minute,
        t0.elapsed().as_secs_f64() / 60.0,
        settings.batch,
        settings.every,
        settings.live_batches,
        load()
    );
    series.print();
    Ok(())
}
