//! Node-pressure eviction on a real node of its own (its threshold would put the shared node of `real_node.rs`
//! under pressure while other tests run): `allocatableMemory.available<96%` — pressure once the pods' working
//! sets pass 4 % of allocatable memory — and a 30 s transition period. Needs root (or
//! `NODE_AGENT_SKIP_REAL_NODE=1` to skip).

/// The containerd the node runs on (Debian's 1.6).
const CONTAINERD: &str = "1.6";

#[path = "real_node/eviction.rs"]
mod eviction;
#[allow(dead_code)]
#[path = "real_node/harness.rs"]
mod harness;
