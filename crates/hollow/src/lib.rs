//! The hollow fleet: thousands of node agents — the same `node-agent` code a real node runs — in one process,
//! each against its own in-memory fake CRI runtime, so an API server, scheduler and controllers face what that
//! many kubelets would do.
//!
//! * [`profiles`] — node profiles (capacity, labels, taints, zones, extended resources) and who gets which.
//! * [`client_pool`] — a few HTTP/2 API connections the agents are sharded over.
//! * [`fleet`] — building, starting (rate-limited) and stopping the agents.
//! * [`probes`] — network probes answered from each node's fake runtime script.
//! * [`server`] — the one HTTP endpoint: `/healthz`, `/metrics`, `/histograms`.

pub mod client_pool;
pub mod fleet;
pub mod probes;
pub mod profiles;
pub mod server;
