//! Requests to a running pod manager from outside the pod lifecycle: graceful node shutdown; the question
//! the garbage collector asks before it removes anything of a pod — which pods does this node still have?; the
//! eviction manager's list of running pods and its order to evict one (the kubelet's `killPod`); the
//! pod-resources API's list of the pods that hold the node's resources.
//!
//! All travel over one unbounded channel the manager reads besides its pod sources, so a question is answered
//! in order with the pod events the manager has already taken: a pod it has admitted (or parked until the node
//! view arrives) is in the answer, one whose worker has removed everything and exited is not.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::pods::manager::shutdown::ShutdownRequest;
use crate::pods::model::spec::DesiredPod;

/// A request to the pod manager.
#[derive(Debug)]
pub enum ManagerControl {
    /// Graceful node shutdown (see [`shutdown`](crate::pods::manager::shutdown); boxed: an idle node keeps this channel's first
    /// block of 32 messages for its whole life).
    Shutdown(Box<ShutdownRequest>),
    /// The shutdown called off: pods are admitted again.
    ShutdownCancelled,
    /// Which pods the manager has; `None` until every pod source (the API server's list and each static
    /// source) has been seen once — before that an unknown pod may merely not have been read yet.
    KnownPods(oneshot::Sender<Option<KnownPods>>),
    /// Answer the pods that run (admitted, not terminal, not being deleted).
    ActivePods(oneshot::Sender<Vec<ActivePod>>),
    /// Evict one pod.
    Evict(Box<EvictOrder>),
    /// Answer the pods that hold the node's resources: admitted and not yet stopped for good — a pod being
    /// deleted stays in until its worker has stopped it (the kubelet's "active pods"); refused pods, pods
    /// that finished and pods still waiting for admission are not in.
    AdmittedPods(oneshot::Sender<Vec<Arc<DesiredPod>>>),
}

impl From<ShutdownRequest> for ManagerControl {
    fn from(request: ShutdownRequest) -> Self {
        Self::Shutdown(Box::new(request))
    }
}

/// The pods a pod manager has at one moment: every pod with a worker, and pods waiting for admission.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KnownPods {
    /// By UID: whether the pod is terminated (its worker stopped everything and will start nothing again,
    /// though the object is not deleted yet — a finished Job's pod, a pod that failed for good).
    pods: HashMap<String, bool>,
}

impl KnownPods {
    /// A set of running (not terminated) pods.
    pub fn running<'a>(uids: impl IntoIterator<Item = &'a str>) -> Self {
        Self {
            pods: uids.into_iter().map(|u| (u.to_owned(), false)).collect(),
        }
    }

    /// Adds pod `uid`, terminated or not.
    pub fn insert(&mut self, uid: &str, terminated: bool) {
        self.pods.insert(uid.to_owned(), terminated);
    }

    /// Whether the node still has pod `uid` (its content must not be removed).
    pub fn exists(&self, uid: &str) -> bool {
        self.pods.contains_key(uid)
    }

    /// Whether pod `uid` exists and is terminated.
    pub fn terminated(&self, uid: &str) -> bool {
        self.pods.get(uid).copied().unwrap_or(false)
    }

    /// How many pods.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

/// Asks a pod manager which pods it has. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PodsQuery {
    tx: crate::density::chan::UnboundedSender<ManagerControl>,
}

impl PodsQuery {
    /// Asks the manager reading `tx`.
    pub fn new(tx: crate::density::chan::UnboundedSender<ManagerControl>) -> Self {
        Self { tx }
    }

    /// The manager's pods, or `None` when its sources are not all seen yet or it is not running.
    pub async fn known_pods(&self) -> Option<KnownPods> {
        let (answer, wait) = oneshot::channel();
        self.tx.send(ManagerControl::KnownPods(answer)).ok()?;
        wait.await.ok().flatten()
    }

    /// The pods holding the node's resources (see [`ManagerControl::AdmittedPods`]), or `None` when the
    /// manager is not running.
    pub async fn admitted_pods(&self) -> Option<Vec<Arc<DesiredPod>>> {
        let (answer, wait) = oneshot::channel();
        self.tx.send(ManagerControl::AdmittedPods(answer)).ok()?;
        wait.await.ok()
    }
}

/// A running pod as other managers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivePod {
    /// UID.
    pub uid: String,
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// `spec.priority`.
    pub priority: i32,
    /// Static, mirror or system-critical priority (never evicted; admitted under pressure).
    pub critical: bool,
    /// Effective memory request, bytes.
    pub memory_request: i64,
    /// Effective ephemeral-storage request, bytes.
    pub ephemeral_request: i64,
    /// Per container: (name, memory request, ephemeral-storage request).
    pub containers: Vec<(String, i64, i64)>,
    /// `spec.terminationGracePeriodSeconds`.
    pub grace_secs: i64,
}

/// Stop one pod and report it evicted.
#[derive(Debug)]
pub struct EvictOrder {
    /// The pod.
    pub uid: String,
    /// Its grace period (the pod's own is not consulted).
    pub grace_secs: i64,
    /// The status reason (`Evicted`).
    pub reason: String,
    /// The status message (also the `DisruptionTarget` condition's).
    pub message: String,
    /// Answered `true` once the pod is stopped and its status reported, `false` when there is no such
    /// running pod.
    pub done: oneshot::Sender<bool>,
}
