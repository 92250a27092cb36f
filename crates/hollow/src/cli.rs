//! The `hollow` command line: its subcommands and their arguments.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use hollow::chaos::ChaosArgs;

#[derive(Parser)]
#[command(about = "Thousands of hollow Kubernetes nodes in one process")]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
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
pub(crate) struct HealthzArgs {
    /// The fleet process's --metrics-address.
    #[arg(long, env = "HOLLOW_METRICS_ADDRESS", default_value = "127.0.0.1:10260")]
    pub(crate) metrics_address: SocketAddr,
    /// The fleet process's --process-index (added to the port).
    #[arg(long, env = "HOLLOW_PROCESS_INDEX", default_value_t = 0)]
    pub(crate) process_index: u32,
}

#[derive(clap::Args)]
pub(crate) struct StopFleetArgs {
    /// The fleet's StatefulSet.
    #[arg(long)]
    pub(crate) statefulset: String,
    /// Its namespace (default: the pod's own, or the kubeconfig's).
    #[arg(long, env = "POD_NAMESPACE")]
    pub(crate) namespace: Option<String>,
    /// kubeconfig for the API server (in-cluster config or $KUBECONFIG when absent).
    #[arg(long, env = "KUBECONFIG")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// The API server URL, replacing the configuration's (see `hollow run --server`).
    #[arg(long, env = "HOLLOW_SERVER")]
    pub(crate) server: Option<String>,
    /// How long to wait for the pods to go.
    #[arg(long, value_parser = hollow::duration::parse_duration, default_value = "5m")]
    pub(crate) timeout: Duration,
}

/// Whose identity the nodes use towards the API server.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub(crate) enum CredentialsArg {
    /// Every node uses the kubeconfig's identity, over a few shared HTTP/2 connections.
    Shared,
    /// Every node its own client certificate (system:node:<name>), minted in memory from --node-ca-cert and
    /// --node-ca-key, on a connection of its own.
    PerNode,
    /// Every node its own client certificate requested from the cluster by TLS bootstrap with
    /// --bootstrap-kubeconfig's identity (e.g. a bootstrap token), on a connection of its own; no CA key needed.
    Bootstrap,
}

/// How agents watch their pods.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub(crate) enum WatchArg {
    /// Every node its own watch (fieldSelector spec.nodeName), like kubelets.
    PerNode,
    /// One process-wide watch, dispatched by node name.
    Shared,
}

#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// Number of hollow nodes.
    #[arg(long, env = "HOLLOW_NODES", default_value_t = 10)]
    pub(crate) nodes: usize,
    /// kubeconfig for the API server (in-cluster config or $KUBECONFIG when absent).
    #[arg(long, env = "KUBECONFIG")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// The API server URL, replacing the kubeconfig's or the in-cluster one (identity and CA are kept): for a
    /// fleet pod that reaches the API server at another address than the cluster's Service, e.g.
    /// https://127.0.0.1:6443 from the host network of a loopback-only machine.
    #[arg(long, env = "HOLLOW_SERVER")]
    pub(crate) server: Option<String>,
    /// This process's number among fleet processes sharing one network namespace (the StatefulSet ordinal on a
    /// host network): the metrics port is --metrics-address's + N and the nodes' kubelet ports start at
    /// --kubelet-port + N × --nodes, so no two processes bind or publish the same port.
    #[arg(long, env = "HOLLOW_PROCESS_INDEX", default_value_t = 0)]
    pub(crate) process_index: u32,
    /// Node name template: {index} is the node number, {pod} the value of --pod-name.
    #[arg(long, default_value = "hollow-{index}")]
    pub(crate) name_template: String,
    /// Replaces {pod} in the name template (the fleet pod's name when deployed by the chart).
    #[arg(long, env = "POD_NAME", default_value = "hollow")]
    pub(crate) pod_name: String,
    /// The InternalIP every node publishes: this process's own address.
    #[arg(long, default_value = "127.0.0.1")]
    pub(crate) node_ip: IpAddr,
    /// The kubelet port every node publishes; with --serve-kubelet-api the first of a range: node i publishes
    /// and serves --kubelet-port + i.
    #[arg(long, default_value_t = 10250)]
    pub(crate) kubelet_port: u16,
    /// Serve the kubelet API (HTTPS: logs, /stats/summary, /metrics/resource, /pods, ...) for every node, one
    /// loopback listener per node on --node-ip:(--kubelet-port + index), with the authentication and
    /// authorization of --config (self-signed certificate unless tlsCertFile is set).
    #[arg(long)]
    pub(crate) serve_kubelet_api: bool,
    /// HTTP/2 connections for the nodes' requests (a watch's LIST among them), taken in turn. 0 (the default)
    /// sizes them from --agents-per-connection. Watches have connections of their own
    /// (--watches-per-connection).
    #[arg(long, default_value_t = 0)]
    pub(crate) clients: usize,
    /// With --clients 0: one request connection per this many nodes.
    #[arg(long, default_value_t = 200)]
    pub(crate) agents_per_connection: usize,
    /// At most this many per-node watches (every node's watch of its Node object, and its pod watch in
    /// per-node watch mode) share one connection: the fleet opens one watch connection per this many watches
    /// and sends each watch to the one with the fewest. A watch holds an HTTP/2 stream for its life and the API
    /// server allows 100 concurrent streams per connection by default (--http2-max-streams-per-connection);
    /// keep this below the server's figure.
    #[arg(long, default_value_t = 96)]
    pub(crate) watches_per_connection: usize,
    /// At most this many requests of one connection are in flight (sent, waiting for their response headers)
    /// at a time; the others wait their turn, in order. A watch counts only until its response starts. A
    /// request in flight holds more memory here than one queued, for as long as the API server takes to
    /// answer: on a saturated API server a lower figure holds less; on one that keeps up, a burst of pod
    /// starts queues behind a low figure instead (docs/density.md).
    #[arg(long, default_value_t = hollow::client_pool::REQUESTS_IN_FLIGHT,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub(crate) requests_in_flight_per_connection: usize,
    /// Pod watch mode.
    #[arg(long, value_enum, default_value_t = WatchArg::PerNode)]
    pub(crate) watch_mode: WatchArg,
    /// Node identities. shared: every node uses the kubeconfig's identity, so ~200 nodes' requests share one
    /// HTTP/2 connection and 48 nodes' watches another. per-node: every node presents its own client
    /// certificate (CN system:node:<name>, O system:nodes, minted in memory from --node-ca-cert/--node-ca-key),
    /// so the Node authorizer and NodeRestriction apply to it as to a real kubelet; a TLS identity is per
    /// connection, so this costs one TCP+TLS connection per node (its requests and its pod watch) and rules
    /// out --watch-mode shared.
    #[arg(long, env = "HOLLOW_NODE_CREDENTIALS", value_enum, default_value_t = CredentialsArg::Shared)]
    pub(crate) node_credentials: CredentialsArg,
    /// With --node-credentials per-node: the PEM certificate of the CA the API server trusts for client
    /// certificates (its --client-ca-file; the first certificate in the file).
    #[arg(
        long,
        env = "HOLLOW_NODE_CA_CERT",
        required_if_eq("node_credentials", "per-node")
    )]
    pub(crate) node_ca_cert: Option<PathBuf>,
    /// With --node-credentials per-node: that CA's private key (PEM: PKCS#8, or PKCS#1 RSA as kubeadm writes).
    #[arg(
        long,
        env = "HOLLOW_NODE_CA_KEY",
        required_if_eq("node_credentials", "per-node")
    )]
    pub(crate) node_ca_key: Option<PathBuf>,
    /// With --node-credentials bootstrap: the kubeconfig whose identity files every node's certificate signing
    /// request (it needs to create CertificateSigningRequests, and the cluster's approver must approve node
    /// client requests from it — the standard bootstrap-token RBAC bindings do both).
    #[arg(
        long,
        env = "HOLLOW_BOOTSTRAP_KUBECONFIG",
        required_if_eq("node_credentials", "bootstrap")
    )]
    pub(crate) bootstrap_kubeconfig: Option<PathBuf>,
    /// Node registrations started per second.
    #[arg(long, default_value_t = 100.0)]
    pub(crate) register_qps: f64,
    /// At most this many started nodes wait for their registration at a time; the next node starts when one
    /// of them is registered. A node's start-up writes wait in the fleet's queues with their bodies while the
    /// API server is behind, so this keeps a fleet larger than the server registers at once from holding all
    /// of them (and the memory of that peak). 0: no limit, --register-qps alone paces the start.
    #[arg(long, default_value_t = hollow::fleet::REGISTRATIONS_IN_FLIGHT)]
    pub(crate) registrations_in_flight: usize,
    /// Node profiles YAML (capacity, labels, taints, zones, shares of the fleet).
    #[arg(long)]
    pub(crate) profiles: Option<PathBuf>,
    /// Fake-runtime behaviour YAML: a map of cri-fake keys to values (e.g. pull-duration: 200ms).
    #[arg(long)]
    pub(crate) runtime_profile: Option<PathBuf>,
    /// KubeletConfiguration YAML shared by every node.
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// Address of the /healthz and /metrics endpoint (with --process-index N: its port + N).
    #[arg(long, env = "HOLLOW_METRICS_ADDRESS", default_value = "127.0.0.1:10260")]
    pub(crate) metrics_address: SocketAddr,
    /// Delete the Node objects when stopping.
    #[arg(long)]
    pub(crate) delete_nodes_on_exit: bool,
    /// API requests per second of all nodes together, on top of each node's kubeAPIQPS (0: no cap).
    #[arg(long, default_value_t = 0)]
    pub(crate) fleet_qps: u64,
    /// For clusters that allocate no node CIDRs (controller-manager --allocate-node-cidrs=false): an IPv4
    /// range (e.g. 10.64.0.0/10) from which node i's runtime gets the i-th subnet of --node-cidr-mask-size
    /// at start. Without it a node's pod network is not ready (node NotReady, NetworkReady=false) until the
    /// cluster sets its spec.podCIDR, as with a kubelet; a podCIDR the cluster sets always wins.
    #[arg(long)]
    pub(crate) node_pod_cidrs: Option<String>,
    /// With --node-pod-cidrs: the prefix length of each node's subnet.
    #[arg(long, default_value_t = 24, requires = "node_pod_cidrs")]
    pub(crate) node_cidr_mask_size: u8,
    #[command(flatten)]
    pub(crate) chaos: ChaosArgs,
}
