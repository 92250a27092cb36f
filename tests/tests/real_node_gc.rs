//! Container and image garbage collection on a real node (`real_node/gc.rs`), and container log rotation
//! (`real_node/log_rotation.rs`): a binary of its own, with its own node, because its image GC settings
//! (thresholds below the disk's usage, a minimum age of 1 s) remove every unused image, the imported ones the
//! other real-node binaries' pods use included. Needs root (or `NODE_AGENT_SKIP_REAL_NODE=1` to skip).

/// The containerd the node runs on (Debian's 1.6, which does not pin its sandbox image: the agent learns it from
/// the runtime's status).
const CONTAINERD: &str = "1.6";

#[path = "real_node/gc.rs"]
mod gc;
#[allow(dead_code)]
#[path = "real_node/harness.rs"]
mod harness;
#[path = "real_node/log_rotation.rs"]
mod log_rotation;
