//! The real-node tests of `real_node.rs` — the same modules, unchanged — on containerd 2.x built from the Go
//! module proxy (`hack/build-containerd.sh`), whose CRI plugin streams container events (`GetContainerEvents`)
//! where Debian's 1.6 is relisted; and [`evented_pleg`], the events shown by what they do. Needs root (or `NODE_AGENT_SKIP_REAL_NODE=1` to skip); one node for the binary.

/// The containerd these tests run on.
const CONTAINERD: &str = "2";

#[path = "real_node/cgroups.rs"]
mod cgroups;
#[path = "real_node_v2/evented_pleg.rs"]
mod evented_pleg;
#[path = "real_node/harness.rs"]
mod harness;
#[path = "real_node/images.rs"]
mod images;
#[path = "real_node/pod_resources.rs"]
mod pod_resources;
#[path = "real_node/probes.rs"]
mod probes;
#[path = "real_node/running.rs"]
mod running;
#[path = "real_node/security.rs"]
mod security;
#[path = "real_node/service_links.rs"]
mod service_links;
#[path = "real_node/static_pods.rs"]
mod static_pods;
#[path = "real_node/streaming.rs"]
mod streaming;
#[path = "real_node/termination.rs"]
mod termination;
#[path = "real_node/volumes.rs"]
mod volumes;
