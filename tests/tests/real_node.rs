//! node-agent as a real worker node: the `node-agent` binary with `--runtime remote` on a private containerd
//! (bridge CNI configured from the Node's pod CIDR), registered to a real control plane, running pods the
//! scheduler places on it. One node serves every test of this binary ([`harness`]); each area has its module
//! and its own namespace. Needs root: without it every test fails saying so, unless `NODE_AGENT_SKIP_REAL_NODE=1`
//! skips them; run alone, not beside another binary that starts containerd.

/// The containerd these tests run on: Debian's 1.6 (`real_node_v2.rs` runs those that differ by version on 2.x).
const CONTAINERD: &str = "1.6";

#[path = "real_node/cgroups.rs"]
mod cgroups;
#[path = "real_node/debugging.rs"]
mod debugging;
#[path = "real_node/harness.rs"]
mod harness;
#[path = "real_node/images.rs"]
mod images;
#[path = "real_node/persistent.rs"]
mod persistent;
#[path = "real_node/pod_fields.rs"]
mod pod_fields;
#[path = "real_node/pod_resources.rs"]
mod pod_resources;
#[path = "real_node/probes.rs"]
mod probes;
#[path = "real_node/resize.rs"]
mod resize;
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
