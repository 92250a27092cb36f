//! A real Kubernetes control plane on loopback, for tests, benchmarks and the demo.
//!
//! This crate owns starting and stopping etcd, kube-apiserver, kube-scheduler and kube-controller-manager as
//! child processes, with a fresh certificate authority, client-certificate authentication and
//! `--authorization-mode=Node,RBAC` plus the `NodeRestriction` admission plugin — the same security a real
//! cluster gives a kubelet. Everything binds 127.0.0.1 on free ports.
//!
//! * [`assets`] finds the binaries (`KUBEBUILDER_ASSETS`, or the version-keyed build cache filled by
//!   `hack/build-kubernetes.sh` from the official `k8s.io/kubernetes` Go module; etcd from `etcd-bin-vendored`).
//! * [`bootstrap`] sets up TLS bootstrap for test nodes (a bootstrap token, its bindings, a bootstrap kubeconfig).
//! * [`pki`] makes the CA and the certificates (admin, components, `system:node:<name>`).
//! * [`process`] spawns children so that they die with the process that started them, and stops them by PID.
//! * [`ControlPlane`] wires it together and hands out `kube::Client`s for the admin and for node identities.
//! * [`server_metrics`] reads the API server's own request counts.
//! * [`shared`] gives one control plane per test binary, or attaches to a running one named by
//!   `NODE_AGENT_CONTROL_PLANE` (a directory made by `testenv up`).
//!
//! This is test and demo tooling; it uses `anyhow` for errors.

pub mod access;
pub mod assets;
pub mod bootstrap;
mod control_plane;
mod kubeconfig;
pub mod pki;
mod ports;
pub mod process;
pub mod server_metrics;
mod shared;

pub use control_plane::{ControlPlane, Options};
pub use shared::{shared, shared_with};
