//! The CSI node side on a real node: a real CSI driver — the Kubernetes e2e suite's mock driver from the pinned
//! `k8s.io/kubernetes` module, built by `hack/build-csi-mock-driver.sh` with a minimal registrar of its own
//! (`tests/csi-mock-driver`: node-driver-registrar is not to be had from the Go module proxy) — registers through
//! the agent's `plugins_registry`, and the agent publishes it in the node's `CSINode` object and Node labels as
//! the kubelet does. A binary of its own, with its own node, so its drivers never meet the other real-node tests.
//! Needs root (or `NODE_AGENT_SKIP_REAL_NODE=1` to skip).
//!
//! The tests, by what they show: a driver's registration ([`registration`]), a persistent volume staged and
//! published ([`persistent`]), one attached by the real external attacher ([`attach`]), an inline volume with the
//! pod's fsGroup and volume stats ([`inline`]), the secrets and tokens a driver is given ([`secrets`]), and raw
//! block volumes, local and CSI ([`block`]); the
//! driver under test and its calls in [`driver`], the API objects the tests make in [`objects`].

/// The containerd the node runs on.
const CONTAINERD: &str = "1.6";

/// The node's agent: every test holds it shared; the one that stops and restarts the agent holds it alone, so no
/// other test's volume sees the restart's re-staging.
static AGENT: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

#[allow(dead_code)]
#[path = "real_node/harness.rs"]
mod harness;

#[path = "real_node_csi/attach.rs"]
mod attach;
#[path = "real_node_csi/block.rs"]
mod block;
#[path = "real_node_csi/driver.rs"]
mod driver;
#[path = "real_node_csi/inline.rs"]
mod inline;
#[path = "real_node_csi/objects.rs"]
mod objects;
#[path = "real_node_csi/persistent.rs"]
mod persistent;
#[path = "real_node_csi/registration.rs"]
mod registration;
#[path = "real_node_csi/secrets.rs"]
mod secrets;
