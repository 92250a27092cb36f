//! The pod model: what the node is asked to run, read from the `Pod` object, and the arithmetic over it —
//! nothing here talks to the runtime or the API server.
//!
//! * [`spec`] — the desired pod: a compact, immutable extract of a `Pod` (containers, probes, volumes, hooks).
//! * [`resources`] — requests, limits and the QoS class.
//! * [`security`] — pod and container security contexts as the spec states them.
//! * [`node_view`] — what the pod side knows of its node (allocatable, labels, taints, host IPs).
//! * [`fields`] — every pod field the node could act on, classified; the refused ones found on a pod.
//! * [`admission`] — whether a pod fits the node, as the kubelet's admit handlers decide.
//! * [`resize`] — whether an in-place resize of a running pod fits the node.
//! * [`gofmt`] — durations printed as Go prints them, for messages users search for.

pub mod admission;
pub mod fields;
pub(crate) mod gofmt;
pub mod node_view;
pub mod resize;
pub mod resources;
pub mod security;
pub mod spec;
