//! The runtime side of a pod: how a desired pod is written into the container runtime, and what the runtime
//! holds for it.
//!
//! * [`labels`] — sandbox and container configs with the kubelet's labels and annotations (what a restarted
//!   agent reads back).
//! * [`observed`] — the runtime's view of one pod: its sandboxes and containers.
//! * [`security`] — security contexts as CRI settings (namespaces, seccomp, users).
//! * [`userns`] — the user namespace ranges of pods with `hostUsers: false`.
//! * [`dns`] — the pod's resolver configuration.
//! * [`cgroups`] — QoS and pod cgroups of a real node.
//! * [`devices`] — the devices a container was given, in its CRI config.
//! * [`termination`] — a container's termination message.
//! * [`oom_score`] — each container's `oom_score_adj` by QoS class.

pub mod cgroups;
pub mod devices;
pub mod dns;
pub mod labels;
pub(crate) mod observed;
pub mod oom_score;
pub mod security;
pub(crate) mod termination;
pub mod userns;
