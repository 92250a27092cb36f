//! The real-node tests of `real_node.rs` whose behaviour depends on the containerd version, on containerd 2.x built
//! from the Go module proxy (`hack/build-containerd.sh`); and [`evented_pleg`], the container events shown by what
//! they do. The modules are the same files, unchanged; those left out exercise the agent's own logic over CRI calls
//! both versions answer alike (cgroups laid out by the agent, pod resources, probes over the network, service-link
//! environment, static pods, volumes prepared on the node) and run on 1.6 only. Needs root (or
//! `NODE_AGENT_SKIP_REAL_NODE=1` to skip); one node for the binary.
//!
//! Kept here, and why they differ by version:
//! * `running`: 2.x streams container events (`GetContainerEvents`) where 1.6 is relisted — the evented PLEG;
//! * `images`: pulls, pull errors and credentials go through 2.x's transfer service;
//! * `streaming`: exec, attach and port-forward are served by each version's own streaming server;
//! * `security`: the OCI spec a security context becomes is written by the runtime's CRI plugin;
//! * `termination`: exit codes, reasons and OOM kills as each version reports them.

/// The containerd these tests run on.
const CONTAINERD: &str = "2";

#[path = "real_node_v2/evented_pleg.rs"]
mod evented_pleg;
// the harness serves every real-node binary; this one uses part of it
#[allow(dead_code)]
#[path = "real_node/harness.rs"]
mod harness;
#[path = "real_node/images.rs"]
mod images;
#[path = "real_node/running.rs"]
mod running;
#[path = "real_node/security.rs"]
mod security;
#[path = "real_node/streaming.rs"]
mod streaming;
#[path = "real_node/termination.rs"]
mod termination;
