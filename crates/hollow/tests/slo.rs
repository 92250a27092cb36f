//! `hollow slo` against the real control plane and hollow fleets: a run produces the table, PerfData JSON
//! and plots, its pod_startup within tens of milliseconds of the fleet's own stages and its schedule_to_watch
//! containing the node-side watch_observed → status_reported span; two extra seconds of container start show up in schedule_to_run and the node's
//! containers_started stage and decide the verdicts; a fleet split over two processes gives the merged
//! table; Deployments in bursts over two namespaces with churn, and Jobs from a user's template kept with
//! `--keep`, are measured and cleaned up; bad input is refused before any pod exists.
//!
//! Scale by environment (the CI default is small): `HOLLOW_SLO_PODS` (200), `HOLLOW_SLO_NODES` (50),
//! `HOLLOW_SLO_RATE` (50 pods/s).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use e2e::{init_logging, node_is_ready, nodes_with_prefix, wait_for};
use hollow::client_pool::{ClientPool, PoolLimits, PoolSize};
use hollow::fleet::{Fleet, FleetSpec};
use hollow::slo::cli::SloArgs;
use hollow::slo::measure::{ClusterSide, Definition, Transition};
use hollow::slo::report::PerfData;
use hollow::slo::run::{self, SloResult};
use hollow::{profiles, server};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Api;
use node_agent::Metrics;
use node_agent::pods::PodMetrics;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// The runs here measure latency: one at a time, so they do not load each other's API server.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A control plane whose scheduler and controllers may write fast enough for the load.
async fn control_plane() -> anyhow::Result<&'static testenv::ControlPlane> {
    let fast = vec![
        "--kube-api-qps=500".to_owned(),
        "--kube-api-burst=1000".to_owned(),
    ];
    testenv::shared_with(testenv::Options {
        controller_manager_args: fast.clone(),
        scheduler_args: fast,
        ..Default::default()
    })
    .await
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Profiles labelling every node `fleet=<label>`, so a run's pods land on this fleet alone.
fn profiles_yaml(label: &str) -> String {
    format!(
        "profiles:\n  - name: {label}\n    weight: 1\n    capacity: {{cpu: \"8\", memory: 32Gi, pods: \"110\"}}\n    labels: {{fleet: {label}}}\n"
    )
}

/// A fleet in this process with its own /histograms endpoint.
struct TestFleet {
    fleet: Fleet,
    addr: SocketAddr,
    token: CancellationToken,
}

async fn start_fleet(
    cp: &testenv::ControlPlane,
    prefix: &str,
    nodes: usize,
    runtime: &[(&str, &str)],
) -> anyhow::Result<TestFleet> {
    let spec = FleetSpec {
        register_qps: 200.0,
        runtime_profile: Arc::new(cri_fake::Profile::from_pairs(runtime.iter().copied())?),
        ..FleetSpec::new(
            nodes,
            format!("{prefix}-{{index}}"),
            profiles::parse(&profiles_yaml(prefix), "test")?,
        )?
    };
    let config = cp.admin_config().await?;
    let pool = ClientPool::new(&config, PoolSize::for_fleet(nodes, true, PoolLimits::default()))?;
    let mut registry = Registry::default();
    let pod_metrics = Arc::new(PodMetrics::new());
    pod_metrics.register(&mut registry);
    let token = CancellationToken::new();
    let (addr, _server) = server::serve(
        "127.0.0.1:0".parse()?,
        registry,
        pod_metrics.clone(),
        token.clone(),
    )
    .await?;
    let fleet = Fleet::start(
        &spec,
        &pool,
        Arc::new(Metrics::unregistered()),
        pod_metrics,
        token.clone(),
    )
    .await?;
    let api: Api<Node> = Api::all(cp.admin_client().await?);
    schedulable(&api, prefix, nodes).await?;
    Ok(TestFleet { fleet, addr, token })
}

/// Waits until `count` nodes named `<prefix>-…` are Ready and free of NoSchedule/NoExecute taints (the
/// controller-manager lifts `not-ready` a few seconds after Ready; until then the scheduler skips a node).
async fn schedulable(api: &Api<Node>, prefix: &str, count: usize) -> anyhow::Result<()> {
    wait_for(
        &format!("{count} {prefix} nodes schedulable"),
        Duration::from_secs(120),
        || async {
            let all = nodes_with_prefix(api, prefix).await?;
            let untainted = |n: &Node| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_none_or(|t| t.iter().all(|t| t.effect == "PreferNoSchedule"))
            };
            Ok((all.len() == count && all.iter().all(|n| node_is_ready(n) && untainted(n))).then_some(()))
        },
    )
    .await
}

impl TestFleet {
    async fn stop(self) {
        self.fleet.stop(Duration::from_secs(10)).await;
        self.token.cancel();
    }
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    slo: SloArgs,
}

/// `hollow slo` flags, parsed as the binary parses them.
fn args(flags: &[&str]) -> anyhow::Result<SloArgs> {
    Ok(Cli::try_parse_from(std::iter::once("slo").chain(flags.iter().copied()))?.slo)
}

async fn slo(cp: &testenv::ControlPlane, flags: &[&str]) -> anyhow::Result<SloResult> {
    let opts = args(flags)?.options()?;
    run::run(cp.admin_client().await?, opts).await
}

fn perfdata(dir: &std::path::Path, prefix: &str) -> anyhow::Result<PerfData> {
    let entry = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .ok_or_else(|| anyhow::anyhow!("no {prefix}*.json in {}", dir.display()))?;
    Ok(serde_json::from_slice(&std::fs::read(entry.path())?)?)
}

fn metric<'a>(p: &'a PerfData, name: &str) -> &'a BTreeMap<String, f64> {
    &p.data_items
        .iter()
        .find(|i| i.labels.get("Metric").map(String::as_str) == Some(name))
        .unwrap_or_else(|| panic!("{name} in the PerfData"))
        .data
}

fn hollow_bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hollow"));
    c.env("RUST_LOG", "warn").stdin(Stdio::null());
    c
}

#[path = "slo/processes.rs"]
mod processes;
#[path = "slo/report.rs"]
mod report;
#[path = "slo/workloads.rs"]
mod workloads;
