//! Pod status: what the agent reports about each pod, and the one task per agent that reports it.
//!
//! * `generate` turns the runtime's view of a pod into the API `PodStatus` (kubelet rules).
//! * `canonical` is the kubelet-owned part of a status as JSON: PATCH body and change fingerprint.
//! * `manager` PATCHes `pods/status` only when the fingerprint changed since the last acknowledged write,
//!   with the pod's UID as precondition, retries with back-off, records the start-up timeline when the API
//!   server acknowledges Running, and finally DELETEs terminated pods (grace 0, UID precondition).

pub(crate) mod canonical;
pub(crate) mod generate;
mod manager;
pub(crate) mod mirrors;

use std::sync::Arc;

use k8s_openapi::api::core::v1::PodStatus;

pub use generate::Phase;
pub(crate) use manager::StatusManager;

use crate::pods::metrics::Timeline;

/// A request to the status manager.
#[derive(Debug)]
pub(crate) enum StatusMsg {
    /// The status the API server holds now (first sight of the pod): nothing is written while ours equals it.
    Seed { uid: Arc<str>, status: Box<PodStatus> },
    /// Report this status; attach the start-up timeline to record once Running is acknowledged.
    Set {
        uid: Arc<str>,
        namespace: String,
        name: String,
        status: Box<PodStatus>,
        timeline: Option<Box<Timeline>>,
    },
    /// After the last `Set`, delete the pod object (grace 0, UID precondition).
    Delete {
        uid: Arc<str>,
        namespace: String,
        name: String,
    },
    /// The API server holds another status than the one last written (someone else wrote it): the next status
    /// is written even if it equals the last.
    Overwritten { uid: Arc<str> },
    /// Drop everything about the pod.
    Forget { uid: Arc<str> },
    /// Answer once nothing is waiting to be written (statuses failing with back-off count as waiting).
    Flush(tokio::sync::oneshot::Sender<()>),
    /// The static pod `uid` has a new mirror pod (or none): its status is written again to the new one.
    MirrorChanged { uid: Arc<str> },
}

/// The pod workers' handle on the status manager.
#[derive(Debug, Clone)]
pub(crate) struct StatusHandle {
    tx: crate::density::chan::UnboundedSender<Box<StatusMsg>>,
}

/// The status manager's end of the channel. Messages are boxed: a channel allocates a block of 32 slots when
/// it is made, and an idle node keeps this one for its whole life.
pub(crate) type StatusReceiver = crate::density::chan::UnboundedReceiver<Box<StatusMsg>>;

impl StatusHandle {
    pub(crate) fn channel() -> (Self, StatusReceiver) {
        let (tx, rx) = crate::density::chan::unbounded_channel();
        (Self { tx }, rx)
    }

    pub(crate) fn send(&self, msg: StatusMsg) {
        // the manager outlives the workers; a closed channel means shutdown
        let _ = self.tx.send(Box::new(msg));
    }
}
