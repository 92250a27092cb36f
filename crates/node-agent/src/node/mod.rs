//! The node half of the agent: the Node object, its status and its lease.
//!
//! * [`object`] builds the Node the way the kubelet fills it (pure functions).
//! * [`conditions`] is the MemoryPressure / DiskPressure / PIDPressure / Ready state machine.
//! * [`registration`] creates the Node, or reconciles the one left by a previous run, with backoff.
//! * [`status`] is the node status task: registration first, then compute every `nodeStatusUpdateFrequency`,
//!   PATCH `nodes/status` only on change or every `nodeStatusReportFrequency`, record node events.
//! * [`triggers`] is when the status task computes (its timers and wake-up signals).
//! * [`report`] is whether a computed status is written, and with which parts.
//! * [`informer`] watches this node's Node object and publishes its [`NodeSnapshot`].
//! * [`lease`] is the lease heartbeat task; `kept_lease` what it keeps of its Lease between renewals.
//! * [`heartbeat`] is the switch that freezes both heartbeats (chaos in the hollow fleet).
//!
//! Signals other managers feed in: [`Pressure`] (from the eviction manager) and [`HealthChecks`] (e.g. PLEG);
//! signals they read: the registered Node ([`RegisteredNode`]) and the allocatable resources.

pub mod conditions;
pub mod heartbeat;
pub mod informer;
mod kept_lease;
pub mod labels;
pub mod lease;
pub mod object;
pub mod registration;
pub mod report;
pub mod status;
pub mod triggers;

use std::fmt;
use std::sync::{Arc, Mutex};

pub use conditions::{ConditionInputs, NodeConditions};
pub use heartbeat::Heartbeats;
pub use informer::NodeInformer;
pub use labels::NodeLabels;
pub use lease::LeaseManager;
pub use object::ResourceList;
pub use status::NodeStatusManager;

/// Errors of the node managers. They are logged and retried, never fatal.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// An API request failed.
    #[error("{verb} {resource}: {source}")]
    Api {
        /// The verb.
        verb: &'static str,
        /// The resource.
        resource: &'static str,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// `registerNode` is false and nobody created the Node yet.
    #[error("node {0:?} does not exist and registerNode is false; waiting for it to be created")]
    NotRegistered(String),
}

/// The identity of the Node object this agent registered (or found).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredNode {
    /// The Node name.
    pub name: String,
    /// The Node's UID (owner of the lease).
    pub uid: String,
}

/// What the node side knows about its Node object, as the node informer last saw it (a watch of the Node, so
/// a label, taint or pod CIDR set by someone else arrives at once). Pod admission reads labels, taints and
/// addresses from here.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeSnapshot {
    /// The Node name.
    pub name: String,
    /// The Node's UID.
    pub uid: String,
    /// `metadata.labels` (the pod side shares them).
    pub labels: Arc<NodeLabels>,
    /// `spec.taints`.
    pub taints: Vec<k8s_openapi::api::core::v1::Taint>,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// `spec.podCIDRs` (or `spec.podCIDR`).
    pub pod_cidrs: Vec<String>,
    /// `status.addresses` as (type, address).
    pub addresses: Vec<(String, String)>,
    /// The Ready condition is `Unknown`: the node-lifecycle controller's mark of a node it has not heard from
    /// (the agent never writes it).
    pub ready_unknown: bool,
    /// `status.features.supplementalGroupsPolicy`: the runtime supports the `Strict` policy.
    pub supplemental_groups_policy: bool,
}

impl NodeSnapshot {
    /// The snapshot of `node`.
    pub fn of(node: &k8s_openapi::api::core::v1::Node) -> Self {
        let spec = node.spec.as_ref();
        let pod_cidrs = match spec.map(|s| (&s.pod_cidrs, &s.pod_cidr)) {
            Some((Some(list), _)) if !list.is_empty() => list.clone(),
            Some((_, Some(one))) if !one.is_empty() => vec![one.clone()],
            _ => Vec::new(),
        };
        Self {
            name: node.metadata.name.clone().unwrap_or_default(),
            uid: node.metadata.uid.clone().unwrap_or_default(),
            labels: Arc::new(NodeLabels::of(&node.metadata)),
            taints: spec.and_then(|s| s.taints.clone()).unwrap_or_default(),
            unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
            pod_cidrs,
            addresses: node
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .map(|a| a.iter().map(|a| (a.type_.clone(), a.address.clone())).collect())
                .unwrap_or_default(),
            ready_unknown: node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "Unknown")),
            supplemental_groups_policy: supplemental_groups_policy(node),
        }
    }
}

/// `status.features.supplementalGroupsPolicy` of `node` (unset: not supported).
pub fn supplemental_groups_policy(node: &k8s_openapi::api::core::v1::Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.features.as_ref())
        .and_then(|f| f.supplemental_groups_policy)
        .unwrap_or(false)
}

/// Resource pressure as the eviction manager sees it; drives the pressure conditions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pressure {
    /// Memory pressure.
    pub memory: bool,
    /// Disk pressure.
    pub disk: bool,
    /// PID pressure.
    pub pid: bool,
}

type Check = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Named health checks evaluated at every status computation; a failing one makes the node NotReady with
/// `"<name> is not healthy: <error>"` (the kubelet's wording, e.g. for PLEG). Clones share the list.
///
/// Graceful node shutdown's `node is shutting down` is a flag of its own ([`HealthChecks::set_shutting_down`]),
/// not a check in the list: every agent has it, and a list holding one closure would cost every node of a fleet
/// an allocation.
#[derive(Clone, Default)]
pub struct HealthChecks {
    inner: Arc<ChecksInner>,
}

#[derive(Default)]
struct ChecksInner {
    shutting_down: std::sync::atomic::AtomicBool,
    checks: Mutex<Vec<(String, Check)>>,
}

impl fmt::Debug for HealthChecks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self.lock().iter().map(|(n, _)| n.clone()).collect();
        f.debug_struct("HealthChecks").field("checks", &names).finish()
    }
}

impl HealthChecks {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(String, Check)>> {
        match self.inner.checks.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Adds a check; it must be quick and must not call the runtime or the API.
    pub fn add(
        &self,
        name: impl Into<String>,
        check: impl Fn() -> Result<(), String> + Send + Sync + 'static,
    ) {
        self.lock().push((name.into(), Arc::new(check)));
    }

    /// Marks the node as shutting down (graceful node shutdown: Ready fails with `node is shutting down`), or
    /// no longer (the shutdown cancelled).
    pub fn set_shutting_down(&self, shutting_down: bool) {
        self.inner
            .shutting_down
            .store(shutting_down, std::sync::atomic::Ordering::Relaxed);
    }

    /// The failures, worded for the Ready message.
    pub fn failures(&self) -> Vec<String> {
        let shutting_down = self
            .inner
            .shutting_down
            .load(std::sync::atomic::Ordering::Relaxed);
        let checks: Vec<(String, Check)> = self.lock().clone();
        shutting_down
            .then(|| "node is shutting down".to_owned())
            .into_iter()
            .chain(
                checks
                    .into_iter()
                    .filter_map(|(name, check)| check().err().map(|e| format!("{name} is not healthy: {e}"))),
            )
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_checks_word_failures_like_the_kubelet() {
        let checks = HealthChecks::default();
        assert!(checks.failures().is_empty());
        checks.add("PLEG", || {
            Err("pleg was last seen active 3m0s ago; threshold is 3m0s".into())
        });
        checks.add("other", || Ok(()));
        assert_eq!(
            checks.failures(),
            vec!["PLEG is not healthy: pleg was last seen active 3m0s ago; threshold is 3m0s".to_string()]
        );
        // a clone shares the flag; the shutdown's message stands as it is, first
        checks.clone().set_shutting_down(true);
        assert_eq!(
            checks.failures(),
            vec![
                "node is shutting down".to_string(),
                "PLEG is not healthy: pleg was last seen active 3m0s ago; threshold is 3m0s".to_string()
            ]
        );
        // a cancelled shutdown takes it back
        checks.set_shutting_down(false);
        assert_eq!(checks.failures().len(), 1);
    }
}
