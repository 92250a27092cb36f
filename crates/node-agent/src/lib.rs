//! The node agent core: a Kubernetes kubelet as a library.
//!
//! One [`Agent`] is one node. It is built from plain values — an [`AgentConfig`], a `kube::Client` carrying the
//! node's credentials and an `Arc<dyn runtime_api::Runtime>` — and runs one task per manager until its
//! cancellation token fires. The `node-agent` binary runs one against a real CRI runtime (or the fake one); the
//! hollow fleet runs thousands in one process. The core never reads environment variables, never builds its own
//! client and never names a concrete runtime.
//!
//! ```no_run
//! # async fn demo(client: kube::Client, runtime: std::sync::Arc<dyn runtime_api::Runtime>) -> anyhow::Result<()> {
//! use std::sync::Arc;
//! use node_agent::{Agent, AgentConfig, KubeletConfig, MachineInfo};
//!
//! let config = AgentConfig::new("n1", "127.0.0.1".parse()?, Arc::new(KubeletConfig::default()), MachineInfo::synthetic("n1"));
//! let agent = Agent::builder(config, client, runtime).build()?.start();
//! // ... later
//! agent.stop(std::time::Duration::from_secs(10)).await?;
//! # Ok(()) }
//! ```
//!
//! Modules, one concern each, depending one way at every level (the `layering` crate's test fails on a cycle):
//! * [`config`] — KubeletConfiguration file + flags -> [`KubeletConfig`] / [`AgentConfig`].
//! * [`agent`] — wiring: [`Agent`], [`AgentContext`], [`RunningAgent`].
//! * [`node`] — registration, status loop and conditions, lease.
//! * [`node_cgroups`] — node allocatable enforcement on the node's cgroups, the agent's own OOM score.
//! * [`runtime_health`] — CRI `Status` polling.
//! * [`events`] — the event recorder and its sink.
//! * [`api`] — rate limit and request accounting for API calls.
//! * [`metrics`] — Prometheus metrics registered into a caller's registry.
//! * [`density`] — the seam below the kubelet logic: the small channels, latest-value watches, joins, shared
//!   timers, interning and lean watches that let thousands of agents share one process (docs/density.md).
//! * [`backoff`] — jittered exponential backoff (registration, lease, CrashLoopBackOff) and jittered intervals.
//! * [`quantity`] — exact resource quantity arithmetic.
//! * [`machine`] — machine facts (host or synthetic).
//! * `cri_log` — the CRI container log format.
//! * [`container_logs`] — rotation of running containers' logs (real nodes).
//! * [`server`] — the kubelet HTTPS API (authenticated, authorized), the healthz and read-only ports.
//! * [`state_file`] — state files written atomically (temporary file, flush, rename).
//! * [`stats`] — node and pod usage (CRI stats, the machine or the synthetic node's capacity).
//! * [`sysctl`] — sysctl names, namespaces and the allowlist pods are admitted against.
//! * [`eviction`] — node-pressure eviction: thresholds, pressure conditions, ranking, one eviction per pass.
//! * [`gc`] — container and image garbage collection.
//! * [`informers`] — the cluster-wide informers a node keeps: Services, RuntimeClasses, CSIDrivers.
//! * [`grpc_unix`] — gRPC on the unix sockets node-local programs call, for clients in any language.
//! * [`pod_resources`] — the pod-resources gRPC API on `<root-dir>/pod-resources/kubelet.sock`.
//! * [`plugins`] — kubelet plugin registration: the watcher of `<root-dir>/plugins_registry`.
//! * [`csi`] — the CSI node side: registered drivers, `CSINode` and the node's topology labels.
//! * [`devices`] — device plugins (`v1beta1`): registration, devices into capacity, admission, `Allocate`, the
//!   checkpoint; in-memory fake plugins for hollow nodes.
//! * [`dra`] — dynamic resource allocation: DRA drivers, claims prepared for pods, their CDI devices.

// Long-lived tasks are written as functions returning `async move` blocks, not as `async fn`s: an `async fn`
// keeps its arguments twice in its future (as arguments, and as the bindings its body moves them into), for
// as long as the task lives; the size tests (agent/future_sizes.rs) show the difference. Likewise an `async`
// block that awaits a future it captured holds that future twice (captured, and in its await): map it instead.
#![allow(clippy::manual_async_fn)]

pub mod agent;
pub mod api;
pub mod backoff;
pub mod certs;
pub mod client;
pub mod config;
pub mod container_logs;
mod cri_log;
pub mod csi;
pub mod density;
pub mod devices;
pub mod dra;
pub mod events;
pub mod eviction;
pub mod gc;
pub mod grpc_unix;
pub mod informers;
pub mod machine;
pub mod metrics;
pub mod node;
pub mod node_cgroups;
pub mod plugins;
pub mod pod_resources;
pub mod pods;
pub mod quantity;
pub mod runtime_health;
pub mod server;
pub mod state_file;
pub mod stats;
pub mod sysctl;

#[cfg(test)]
mod testing;

pub use agent::{Agent, AgentBuilder, AgentContext, AgentError, RunningAgent};
pub use config::{AgentConfig, ConfigError, Flags, KubeletConfig};
pub use machine::MachineInfo;
pub use metrics::Metrics;
