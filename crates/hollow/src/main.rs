//! `hollow`: a fleet of node agents in one process, each against its own in-memory fake CRI runtime.
//!
//! `hollow run --nodes N` starts N agents — the same node-agent code a real node runs — sharing a small pool
//! of HTTP/2 API connections (or, with `--node-credentials per-node`, each on its own connection with its own
//! client certificate), and serves `/healthz` and `/metrics` for the whole fleet. It stops on SIGINT or
//! SIGTERM (optionally deleting its Node objects).
//!
//! `hollow slo` puts pods onto a cluster (a hollow fleet's, or any) at a set pace, measures their start-up
//! the way clusterloader2 does, merges the fleet's node-side stage histograms, and reports the SLO verdict
//! with a table, PerfData JSON and plots. It exits 0 when the SLO is met, 3 when it is not.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use hollow::chaos::{ChaosMetrics, ChaosSpec};
use hollow::cidrs::NodeCidrs;
use hollow::client_pool::{ClientPool, PoolLimits, PoolSize};
use hollow::credentials::NodeCa;
use hollow::fleet::{Fleet, FleetSpec, KubeletApi, WatchMode};
use hollow::profiles;
use hollow::server::{self, FleetGauges};
use hollow::statefulset::{self, ProcessPorts};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams};
use node_agent::pods::PodMetrics;
use node_agent::{KubeletConfig, Metrics};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

mod allocator;
mod cli;

use cli::{Cli, Command, CredentialsArg, RunArgs, WatchArg};

/// Where per-node identities come from.
enum NodeIdentities {
    Shared,
    Minted(Box<NodeCa>),
    Bootstrap(PathBuf),
}

/// KubeletConfiguration fields only a real node acts on, so `--config` giving them is warned about: the runtime
/// connection, the host's cgroups and log directories (a hollow node's runtime is in memory), and the per-node
/// servers (the fleet serves the kubelet API itself, on `--node-ip` and `--kubelet-port` + index, with
/// `--serve-kubelet-api`, and `/healthz` on `--metrics-address`).
const REAL_NODE_ONLY: &[&str] = &[
    "containerRuntimeEndpoint",
    "cgroupsPerQOS",
    "cgroupRoot",
    "podPidsLimit",
    "podLogsDir",
    "enableServer",
    "address",
    "port",
    "healthzPort",
    "healthzBindAddress",
];

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Run(args) => {
            #[cfg(all(feature = "jemalloc", not(feature = "dhat-heap")))]
            allocator::background_threads();
            run(*args).await
        }
        Command::Slo(args) => {
            if !hollow::slo::cli::main(args).await? {
                std::process::exit(3);
            }
            Ok(())
        }
        Command::Healthz(args) => {
            let ports = ProcessPorts::of(args.process_index, args.metrics_address, 0, 0)?;
            Ok(statefulset::healthz(ports.metrics, Duration::from_secs(5))?)
        }
        Command::StopFleet(args) => {
            let config =
                statefulset::client_config(args.kubeconfig.as_deref(), args.server.as_deref()).await?;
            let namespace = args.namespace.unwrap_or_else(|| config.default_namespace.clone());
            let client = kube::Client::try_from(config)?;
            Ok(statefulset::stop_statefulset(client, &namespace, &args.statefulset, args.timeout).await?)
        }
    }
}

fn runtime_profile(path: Option<&PathBuf>) -> anyhow::Result<cri_fake::Profile> {
    let Some(path) = path else {
        return Ok(cri_fake::Profile::default());
    };
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let map: std::collections::BTreeMap<String, serde_yaml::Value> =
        serde_yaml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let pairs = map.into_iter().map(|(k, v)| {
        let v = match v {
            serde_yaml::Value::String(s) => s,
            other => serde_yaml::to_string(&other)
                .unwrap_or_default()
                .trim()
                .to_owned(),
        };
        (k, v)
    });
    cri_fake::Profile::from_pairs(pairs).with_context(|| format!("{}", path.display()))
}

/// Where the nodes' identities come from (checked before anything connects).
fn node_identities(args: &RunArgs) -> anyhow::Result<NodeIdentities> {
    if args.node_credentials == CredentialsArg::Shared {
        return Ok(NodeIdentities::Shared);
    }
    let flag = match args.node_credentials {
        CredentialsArg::Bootstrap => "bootstrap",
        _ => "per-node",
    };
    if args.watch_mode == WatchArg::Shared {
        anyhow::bail!(
            "--watch-mode shared does not work with --node-credentials {flag}: the shared watch lists and \
             watches every pod in the cluster, and the Node authorizer lets a node identity see only the pods \
             bound to it; use --watch-mode per-node"
        );
    }
    if args.node_credentials == CredentialsArg::Bootstrap {
        let Some(path) = &args.bootstrap_kubeconfig else {
            anyhow::bail!("--node-credentials bootstrap needs --bootstrap-kubeconfig");
        };
        return Ok(NodeIdentities::Bootstrap(path.clone()));
    }
    let (Some(cert), Some(key)) = (&args.node_ca_cert, &args.node_ca_key) else {
        anyhow::bail!("--node-credentials per-node needs --node-ca-cert and --node-ca-key");
    };
    Ok(NodeIdentities::Minted(Box::new(NodeCa::from_files(cert, key)?)))
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    #[cfg(feature = "dhat-heap")]
    let heap_profile = dhat::Profiler::new_heap();
    let identities = node_identities(&args)?;
    let kube_config = statefulset::client_config(args.kubeconfig.as_deref(), args.server.as_deref()).await?;
    let ports = ProcessPorts::of(
        args.process_index,
        args.metrics_address,
        args.kubelet_port,
        args.nodes,
    )?;
    let kubelet = match &args.config {
        Some(path) => {
            let loaded = node_agent::config::load_file(path)?;
            let kubelet = node_agent::config::resolve_kubelet_config(&loaded)?;
            // no silent settings: what node-agent does not act on, and what only a real node acts on
            let mut unacted = loaded.unacted(&kubelet);
            for field in REAL_NODE_ONLY {
                if loaded.gives(field) {
                    unacted.no_effect.push((*field).to_owned());
                }
            }
            unacted.warn("hollow");
            kubelet
        }
        None => KubeletConfig::default(),
    };
    for (set, field) in [
        (kubelet.server_tls_bootstrap, "serverTLSBootstrap"),
        (kubelet.rotate_certificates, "rotateCertificates"),
    ] {
        anyhow::ensure!(
            !set,
            "{field}: not supported by hollow fleets (their nodes' client credentials come from \
             --node-credentials, and one self-signed certificate serves every node's kubelet API)"
        );
    }
    let (profile_list, file_chaos) = match &args.profiles {
        Some(path) => profiles::load_with_chaos(path)?,
        None => (profiles::default_profiles(), ChaosSpec::default()),
    };
    let chaos = args.chaos.over(file_chaos);
    chaos.validate().context("chaos flags")?;
    if chaos.churn.is_some_and(|c| c.shutdown) && kubelet.shutdown_grace_period.is_zero() {
        anyhow::bail!(
            "churn with shutdown needs shutdownGracePeriod in the fleet's --config (graceful node shutdown is off \
             without it)"
        );
    }
    if !matches!(identities, NodeIdentities::Shared) && chaos.churn.is_some() {
        anyhow::bail!(
            "node churn does not work with per-node credentials: churned nodes take fresh names, and \
             certificates are obtained for the --nodes names only"
        );
    }
    let pod_cidrs = args
        .node_pod_cidrs
        .as_deref()
        .map(|range| NodeCidrs::new(range, args.node_cidr_mask_size))
        .transpose()?;
    if let Some(cidrs) = &pod_cidrs {
        let wanted = args.nodes + chaos.churn.as_ref().map_or(0, |c| c.nodes);
        if cidrs.len() < wanted as u64 {
            anyhow::bail!(
                "--node-pod-cidrs {} holds {} subnets of /{}, fewer than the {wanted} nodes (with churn)",
                args.node_pod_cidrs.as_deref().unwrap_or_default(),
                cidrs.len(),
                args.node_cidr_mask_size
            );
        }
    }
    let assignments = profiles::assign(&profile_list, args.nodes)?;
    let mut spec = FleetSpec {
        nodes: args.nodes,
        name_template: args.name_template.clone(),
        pod_name: args.pod_name.clone(),
        node_ip: args.node_ip,
        kubelet_port: ports.kubelet,
        kubelet_api: None,
        register_qps: args.register_qps,
        registrations_in_flight: args.registrations_in_flight,
        kubelet,
        gc: Default::default(),
        profiles: profile_list,
        assignments,
        runtime_profile: Arc::new(runtime_profile(args.runtime_profile.as_ref())?),
        watch_mode: match args.watch_mode {
            WatchArg::PerNode => WatchMode::PerNode,
            WatchArg::Shared => WatchMode::Shared,
        },
        fleet_qps: args.fleet_qps,
        pod_cidrs,
    };

    let token = CancellationToken::new();
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry));
    let pod_metrics = Arc::new(PodMetrics::new());
    pod_metrics.register(&mut registry);
    let gauges = FleetGauges::default();
    gauges.register(&mut registry);
    let chaos_metrics = ChaosMetrics::default();
    chaos_metrics.register(&mut registry);
    #[cfg(all(feature = "jemalloc", not(feature = "dhat-heap")))]
    registry.register_collector(Box::new(allocator::HeapCollector));
    let registry = Arc::new(registry);
    if args.serve_kubelet_api {
        spec.kubelet_api = Some(KubeletApi {
            registry: Some(registry.clone()),
        });
    }
    let (bound, server) = server::serve(ports.metrics, registry, pod_metrics.clone(), token.clone())
        .await
        .with_context(|| {
            format!(
                "listening on {} for /healthz and /metrics (--metrics-address {}, plus --process-index {})",
                ports.metrics, args.metrics_address, args.process_index
            )
        })?;
    tracing::info!(address = %bound, "serving /healthz and /metrics");

    let size = PoolSize::for_fleet(
        args.nodes,
        spec.watch_mode == WatchMode::PerNode,
        PoolLimits {
            request_connections: args.clients,
            agents_per_connection: args.agents_per_connection,
            watches_per_connection: args.watches_per_connection,
            in_flight: args.requests_in_flight_per_connection,
        },
    );
    if args.watches_per_connection > 100 && spec.watch_mode == WatchMode::PerNode {
        tracing::warn!(
            watches_per_connection = args.watches_per_connection,
            "the API server allows 100 concurrent streams per connection by default; watches beyond its figure wait and their nodes get no pods"
        );
    }
    let pool = match &identities {
        NodeIdentities::Shared => {
            let pool = ClientPool::new(&kube_config, size)?;
            tracing::info!(
                request_connections = size.request_connections,
                watch_connections = size.watch_connections,
                in_flight_per_connection = size.in_flight,
                nodes = args.nodes,
                "API client pool"
            );
            pool
        }
        NodeIdentities::Minted(ca) => {
            let names: Vec<String> = (0..args.nodes).map(|i| spec.node_name(i)).collect();
            let pool = ClientPool::per_node(&kube_config, &names, ca, size.in_flight)?;
            tracing::info!(
                connections = args.nodes,
                nodes = args.nodes,
                "API client pool: per-node credentials, one connection per node"
            );
            pool
        }
        NodeIdentities::Bootstrap(path) => {
            let names: Vec<String> = (0..args.nodes).map(|i| spec.node_name(i)).collect();
            let boot = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("--bootstrap-kubeconfig {}", path.display()))?;
            let boot =
                kube::Config::from_custom_kubeconfig(boot, &kube::config::KubeConfigOptions::default())
                    .await
                    .with_context(|| format!("--bootstrap-kubeconfig {}", path.display()))?;
            let boot = kube::Client::try_from(boot).context("the bootstrap API client")?;
            let started = tokio::time::Instant::now();
            let credentials = tokio::select! {
                issued = hollow::bootstrap::issue_all(&boot, &names) => issued?,
                _ = shutdown_signal() => { token.cancel(); return Ok(()); }
            };
            tracing::info!(
                nodes = args.nodes,
                took = ?started.elapsed(),
                "node client certificates issued by TLS bootstrap"
            );
            let pool = ClientPool::per_node_with(&kube_config, &credentials, size.in_flight)?;
            tracing::info!(
                connections = args.nodes,
                nodes = args.nodes,
                "API client pool: per-node credentials, one connection per node"
            );
            pool
        }
    };
    let fleet_token = token.child_token();
    let start = tokio::time::Instant::now();
    let fleet = tokio::select! {
        fleet = Fleet::start(&spec, &pool, metrics, pod_metrics.clone(), fleet_token.clone()) => fleet?,
        _ = shutdown_signal() => { token.cancel(); return Ok(()); }
    };
    let view = fleet.view();
    let refresher = {
        let (view, gauges, token) = (view.clone(), gauges.clone(), token.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tokio::select! {
                    _ = tick.tick() => view.refresh(&gauges),
                    _ = token.cancelled() => break,
                }
            }
        })
    };
    let chaos_task = (!chaos.is_empty()).then(|| {
        tracing::info!(?chaos, "chaos on");
        tokio::spawn(hollow::chaos::run(
            chaos,
            hollow::chaos::targets(&fleet),
            fleet.factory(),
            chaos_metrics,
            fleet_token.clone(),
        ))
    });
    tokio::select! {
        () = shutdown_signal() => {}
        () = async {
            hollow::progress::report(view.clone(), args.nodes, start).await;
            std::future::pending::<()>().await
        } => {}
    }
    // the heap as the running fleet holds it, before anything stops
    #[cfg(feature = "dhat-heap")]
    drop(heap_profile);
    tracing::info!("stopping the fleet");
    fleet_token.cancel();
    if let Some(task) = chaos_task {
        let _ = task.await;
    }
    let names: Vec<String> = fleet.nodes().iter().map(|n| n.name.clone()).collect();
    fleet.stop(Duration::from_secs(10)).await;
    if args.delete_nodes_on_exit {
        // the kubeconfig's identity: a node identity may not delete Node objects, not even its own
        let nodes: Api<Node> = Api::all(pool.fleet_client());
        let deletes = names.iter().map(|n| {
            let nodes = nodes.clone();
            async move { (n, nodes.delete(n, &DeleteParams::default()).await) }
        });
        for (name, res) in futures::future::join_all(deletes).await {
            if let Err(e) = res {
                tracing::warn!(node = %name, error = %e, "deleting the Node failed");
            }
        }
        tracing::info!(deleted = names.len(), "deleted Node objects");
    }
    token.cancel();
    let _ = refresher.await;
    let _ = server.await;
    Ok(())
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
