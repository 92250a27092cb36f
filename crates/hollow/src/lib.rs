//! The hollow fleet: thousands of node agents — the same `node-agent` code a real node runs — in one process,
//! each against its own in-memory fake CRI runtime, so an API server, scheduler and controllers face what that
//! many kubelets would do.
//!
//! * [`profiles`] — node profiles (capacity, labels, taints, zones, extended resources) and who gets which;
//!   the profile file's chaos section.
//! * [`dra`] — hollow DRA drivers: each node's ResourceSlice, claims prepared and released in process.
//! * [`csi`] — hollow CSI drivers: each node's `CSINode` entry; PVC pods wait for their attachment through the agent.
//! * [`duration`] — durations as written in flags and profile files.
//! * [`client_pool`] — the agents' API client over a few HTTP/2 connections (or one per node, with per-node
//!   credentials); [`connections`] picks a connection per request, [`h2_connection`] is one connection.
//! * [`credentials`] — per-node client certificates (`system:node:<name>`) minted from the cluster's client CA.
//! * [`bootstrap`] — per-node client certificates requested from the cluster (TLS bootstrap).
//! * [`fleet`] — building, starting (rate-limited) and stopping the agents.
//! * [`start_gate`] — the start paced by registrations: at most so many nodes waiting for theirs.
//! * [`chaos`] — runtime outages, flapping heartbeats and node churn on a running fleet.
//! * [`cidrs`] — per-node pod CIDRs from a fleet-wide range, for clusters that allocate none.
//! * [`probes`] — network probes answered from each node's fake runtime script.
//! * [`progress`] — the start-up progress bar (or log lines off a terminal).
//! * [`server`] — the one HTTP endpoint: `/healthz`, `/metrics`, `/histograms`.
//! * [`slo`] — `hollow slo`: load, pod start-up measurement, the fleet's merged stages, the SLO report.
//! * [`statefulset`] — running as a StatefulSet's pods (the Helm chart): client configuration with an explicit
//!   server URL, per-process ports on a shared host network, the in-container health check, stopping the fleet.

pub mod bootstrap;
pub mod chaos;
pub mod cidrs;
pub mod client_pool;
pub mod connections;
pub mod credentials;
pub mod csi;
pub mod dra;
pub mod duration;
pub mod fleet;
pub mod h2_connection;
pub mod probes;
pub mod profiles;
pub mod progress;
pub mod server;
pub mod slo;
pub mod start_gate;
pub mod statefulset;
