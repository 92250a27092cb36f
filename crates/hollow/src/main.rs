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

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use hollow::chaos::{ChaosArgs, ChaosMetrics, ChaosSpec};
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

#[derive(Parser)]
#[command(about = "Thousands of hollow Kubernetes nodes in one process")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a fleet until interrupted.
    // boxed: the other commands' arguments are far smaller
    Run(Box<RunArgs>),
    /// Create pods at a pace, measure their start-up (cluster side and the fleet's stages) and report the
    /// pod start-up SLO verdict; exits 3 when the SLO is not met.
    Slo(hollow::slo::cli::SloArgs),
    /// Exit 0 when a fleet process's /healthz answers 200 (the chart's readiness check on a host network,
    /// where the port differs per process).
    Healthz(HealthzArgs),
    /// Scale a fleet's StatefulSet to zero and wait until its pods are gone, so each process deletes its
    /// nodes (the chart's pre-delete hook).
    StopFleet(StopFleetArgs),
}

#[derive(clap::Args)]
struct HealthzArgs {
    /// The fleet process's --metrics-address.
    #[arg(long, env = "HOLLOW_METRICS_ADDRESS", default_value = "127.0.0.1:10260")]
    metrics_address: SocketAddr,
    /// The fleet process's --process-index (added to the port).
    #[arg(long, env = "HOLLOW_PROCESS_INDEX", default_value_t = 0)]
    process_index: u32,
}

#[derive(clap::Args)]
struct StopFleetArgs {
    /// The fleet's StatefulSet.
    #[arg(long)]
    statefulset: String,
    /// Its namespace (default: the pod's own, or the kubeconfig's).
    #[arg(long, env = "POD_NAMESPACE")]
    namespace: Option<String>,
    /// kubeconfig for the API server (in-cluster config or $KUBECONFIG when absent).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// The API server URL, replacing the configuration's (see `hollow run --server`).
    #[arg(long, env = "HOLLOW_SERVER")]
    server: Option<String>,
    /// How long to wait for the pods to go.
    #[arg(long, value_parser = hollow::chaos::parse_duration, default_value = "5m")]
    timeout: Duration,
}

/// Whose identity the nodes use towards the API server.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum CredentialsArg {
    /// Every node uses the kubeconfig's identity, over a few shared HTTP/2 connections.
    Shared,
    /// Every node its own client certificate (system:node:<name>), minted in memory from --node-ca-cert and
    /// --node-ca-key, on a connection of its own.
    PerNode,
    /// Every node its own client certificate requested from the cluster by TLS bootstrap with
    /// --bootstrap-kubeconfig's identity (e.g. a bootstrap token), on a connection of its own; no CA key needed.
    Bootstrap,
}

/// Where per-node identities come from.
enum NodeIdentities {
    Shared,
    Minted(Box<NodeCa>),
    Bootstrap(PathBuf),
}

/// How agents watch their pods.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum WatchArg {
    /// Every node its own watch (fieldSelector spec.nodeName), like kubelets.
    PerNode,
    /// One process-wide watch, dispatched by node name.
    Shared,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Number of hollow nodes.
    #[arg(long, env = "HOLLOW_NODES", default_value_t = 10)]
    nodes: usize,
    /// kubeconfig for the API server (in-cluster config or $KUBECONFIG when absent).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// The API server URL, replacing the kubeconfig's or the in-cluster one (identity and CA are kept): for a
    /// fleet pod that reaches the API server at another address than the cluster's Service, e.g.
    /// https://127.0.0.1:6443 from the host network of a loopback-only machine.
    #[arg(long, env = "HOLLOW_SERVER")]
    server: Option<String>,
    /// This process's number among fleet processes sharing one network namespace (the StatefulSet ordinal on a
    /// host network): the metrics port is --metrics-address's + N and the nodes' kubelet ports start at
    /// --kubelet-port + N × --nodes, so no two processes bind or publish the same port.
    #[arg(long, env = "HOLLOW_PROCESS_INDEX", default_value_t = 0)]
    process_index: u32,
    /// Node name template: {index} is the node number, {pod} the value of --pod-name.
    #[arg(long, default_value = "hollow-{index}")]
    name_template: String,
    /// Replaces {pod} in the name template (the fleet pod's name when deployed by the chart).
    #[arg(long, env = "POD_NAME", default_value = "hollow")]
    pod_name: String,
    /// The InternalIP every node publishes: this process's own address.
    #[arg(long, default_value = "127.0.0.1")]
    node_ip: IpAddr,
    /// The kubelet port every node publishes; with --serve-kubelet-api the first of a range: node i publishes
    /// and serves --kubelet-port + i.
    #[arg(long, default_value_t = 10250)]
    kubelet_port: u16,
    /// Serve the kubelet API (HTTPS: logs, /stats/summary, /metrics/resource, /pods, ...) for every node, one
    /// loopback listener per node on --node-ip:(--kubelet-port + index), with the authentication and
    /// authorization of --config (self-signed certificate unless tlsCertFile is set).
    #[arg(long)]
    serve_kubelet_api: bool,
    /// HTTP/2 connections for the nodes' requests; nodes are sharded over them. 0 (the default) sizes them
    /// from --agents-per-connection. Pod watches have connections of their own (--watches-per-connection).
    #[arg(long, default_value_t = 0)]
    clients: usize,
    /// With --clients 0: at most this many nodes send their requests over one connection.
    #[arg(long, default_value_t = 200)]
    agents_per_connection: usize,
    /// At most this many per-node watches (every node's watch of its Node object, and its pod watch in
    /// per-node watch mode) share one connection. A watch holds an HTTP/2 stream for its life and the API
    /// server allows 100 concurrent streams per connection by default (--http2-max-streams-per-connection);
    /// keep this below the server's figure.
    #[arg(long, default_value_t = 96)]
    watches_per_connection: usize,
    /// At most this many requests of one connection are in flight (sent, waiting for their response headers)
    /// at a time; the others wait in the fleet's queue. A watch counts only until its response starts. A
    /// request in flight holds more memory here than one queued, for as long as the API server takes to
    /// answer: on a saturated API server a lower figure holds less; on one that keeps up, a burst of pod
    /// starts queues behind a low figure instead (docs/benchmarks.md).
    #[arg(long, default_value_t = hollow::client_pool::REQUESTS_IN_FLIGHT,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    requests_in_flight_per_connection: usize,
    /// Pod watch mode.
    #[arg(long, value_enum, default_value_t = WatchArg::PerNode)]
    watch_mode: WatchArg,
    /// Node identities. shared: every node uses the kubeconfig's identity, so ~200 nodes' requests share one
    /// HTTP/2 connection and 80 nodes' watches another. per-node: every node presents its own client
    /// certificate (CN system:node:<name>, O system:nodes, minted in memory from --node-ca-cert/--node-ca-key),
    /// so the Node authorizer and NodeRestriction apply to it as to a real kubelet; a TLS identity is per
    /// connection, so this costs one TCP+TLS connection per node (its requests and its pod watch) and rules
    /// out --watch-mode shared.
    #[arg(long, env = "HOLLOW_NODE_CREDENTIALS", value_enum, default_value_t = CredentialsArg::Shared)]
    node_credentials: CredentialsArg,
    /// With --node-credentials per-node: the PEM certificate of the CA the API server trusts for client
    /// certificates (its --client-ca-file; the first certificate in the file).
    #[arg(
        long,
        env = "HOLLOW_NODE_CA_CERT",
        required_if_eq("node_credentials", "per-node")
    )]
    node_ca_cert: Option<PathBuf>,
    /// With --node-credentials per-node: that CA's private key (PEM: PKCS#8, or PKCS#1 RSA as kubeadm writes).
    #[arg(
        long,
        env = "HOLLOW_NODE_CA_KEY",
        required_if_eq("node_credentials", "per-node")
    )]
    node_ca_key: Option<PathBuf>,
    /// With --node-credentials bootstrap: the kubeconfig whose identity files every node's certificate signing
    /// request (it needs to create CertificateSigningRequests, and the cluster's approver must approve node
    /// client requests from it — the standard bootstrap-token RBAC bindings do both).
    #[arg(
        long,
        env = "HOLLOW_BOOTSTRAP_KUBECONFIG",
        required_if_eq("node_credentials", "bootstrap")
    )]
    bootstrap_kubeconfig: Option<PathBuf>,
    /// Node registrations started per second.
    #[arg(long, default_value_t = 100.0)]
    register_qps: f64,
    /// Node profiles YAML (capacity, labels, taints, zones, shares of the fleet).
    #[arg(long)]
    profiles: Option<PathBuf>,
    /// Fake-runtime behaviour YAML: a map of cri-fake keys to values (e.g. pull-duration: 200ms).
    #[arg(long)]
    runtime_profile: Option<PathBuf>,
    /// KubeletConfiguration YAML shared by every node.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address of the /healthz and /metrics endpoint (with --process-index N: its port + N).
    #[arg(long, env = "HOLLOW_METRICS_ADDRESS", default_value = "127.0.0.1:10260")]
    metrics_address: SocketAddr,
    /// Delete the Node objects when stopping.
    #[arg(long)]
    delete_nodes_on_exit: bool,
    /// API requests per second of all nodes together, on top of each node's kubeAPIQPS (0: no cap).
    #[arg(long, default_value_t = 0)]
    fleet_qps: u64,
    /// For clusters that allocate no node CIDRs (controller-manager --allocate-node-cidrs=false): an IPv4
    /// range (e.g. 10.64.0.0/10) from which node i's runtime gets the i-th subnet of --node-cidr-mask-size
    /// at start. Without it a node's pod network is not ready (node NotReady, NetworkReady=false) until the
    /// cluster sets its spec.podCIDR, as with a kubelet; a podCIDR the cluster sets always wins.
    #[arg(long)]
    node_pod_cidrs: Option<String>,
    /// With --node-pod-cidrs: the prefix length of each node's subnet.
    #[arg(long, default_value_t = 24, requires = "node_pod_cidrs")]
    node_cidr_mask_size: u8,
    #[command(flatten)]
    chaos: ChaosArgs,
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
    let registry = Arc::new(registry);
    if args.serve_kubelet_api {
        spec.kubelet_api = Some(KubeletApi {
            registry: Some(registry.clone()),
        });
    }
    let (bound, server) = server::serve(ports.metrics, registry, pod_metrics.clone(), token.clone()).await?;
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
            fleet.chaos_targets(),
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
