//! Requests to a running pod manager from outside the pod lifecycle: graceful node shutdown, and the question
//! the garbage collector asks before it removes anything of a pod — which pods does this node still have?
//!
//! Both travel over one unbounded channel the manager reads besides its pod sources, so a question is answered
//! in order with the pod events the manager has already taken: a pod it has admitted (or parked until the node
//! view arrives) is in the answer, one whose worker has removed everything and exited is not.

use std::collections::HashMap;

use tokio::sync::{mpsc, oneshot};

use super::shutdown::ShutdownRequest;

/// A request to the pod manager.
#[derive(Debug)]
pub enum ManagerControl {
    /// Graceful node shutdown (see [`shutdown`](super::shutdown)).
    Shutdown(ShutdownRequest),
    /// Which pods the manager has; `None` until every pod source (the API server's list and each static
    /// source) has been seen once — before that an unknown pod may merely not have been read yet.
    KnownPods(oneshot::Sender<Option<KnownPods>>),
}

impl From<ShutdownRequest> for ManagerControl {
    fn from(request: ShutdownRequest) -> Self {
        Self::Shutdown(request)
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
    tx: mpsc::UnboundedSender<ManagerControl>,
}

impl PodsQuery {
    /// Asks the manager reading `tx`.
    pub fn new(tx: mpsc::UnboundedSender<ManagerControl>) -> Self {
        Self { tx }
    }

    /// The manager's pods, or `None` when its sources are not all seen yet or it is not running.
    pub async fn known_pods(&self) -> Option<KnownPods> {
        let (answer, wait) = oneshot::channel();
        self.tx.send(ManagerControl::KnownPods(answer)).ok()?;
        wait.await.ok().flatten()
    }
}
