//! The pod worker: one per pod UID, so syncs of one pod never overlap, and the tasks that wake it.
//!
//! * [`state`] — what a worker takes ([`state::WorkerMsg`]), keeps between syncs and reports.
//! * [`pod_worker`] — a worker's turn: sync while the pod should run, terminate, then report it gone.
//! * [`sync`] — one sync of a running pod (the kubelet's SyncPod), following the [`plan`] it computes.
//! * [`restart`] — CrashLoopBackOff.
//! * [`resize`], [`actuate`] — an in-place resize: what is left to apply, and applying it.
//! * [`disruption`] — why a pod is stopped on request (shutdown, eviction) and its final status.
//! * [`prober`] — each pod's probes on their timers, results to the worker.
//! * [`pleg`] — runtime events (or a relist) to the workers of the pods they concern.

pub(crate) mod actuate;
pub(crate) mod disruption;
pub(crate) mod plan;
pub(crate) mod pleg;
pub(crate) mod pod_worker;
pub(crate) mod prober;
pub(crate) mod resize;
pub(crate) mod restart;
pub(crate) mod state;
pub(crate) mod sync;

use std::ops::Deref;
use std::sync::Arc;

use tokio_util::task::TaskTracker;

use crate::density::chan::UnboundedSender;
use crate::pods::actions::context::ActionCtx;
use crate::pods::probes::ProbeUpdate;
use crate::pods::worker::state::{KillOrder, PodWorker};

/// What the pod side's tasks share: the actions' context, and where workers, probers and the shutdown sequence
/// report to the pod manager (one sender for the agent's tasks, not one each). One `Arc` per agent; it reads as
/// the actions' context it holds.
pub(crate) struct AgentCtx {
    /// What every action on a pod shares.
    pub actions: ActionCtx,
    /// The pod manager's report channel.
    pub reports: UnboundedSender<WorkerReport>,
    /// The pod side's tasks: what a worker's turn starts that outlives the turn (its pod's prober) runs here, so
    /// the lifecycle waits for it at stop as for the workers themselves.
    pub tasks: TaskTracker,
}

impl Deref for AgentCtx {
    type Target = ActionCtx;

    fn deref(&self) -> &ActionCtx {
        &self.actions
    }
}

/// What the workers (and the pod side's other tasks) tell the pod manager.
pub(crate) enum WorkerReport {
    /// The pod is terminated and its object deleted (`in_api`: the DELETE is still to land) or gone: forget it.
    Gone { uid: Arc<str>, in_api: bool },
    /// The pod no longer runs anything (terminal or terminated): release its admitted resources.
    Stopped { uid: Arc<str> },
    /// A turn ended (see [`pod_worker`]): the worker, handed back to wait in the manager's table for its next
    /// input — [`WorkerMsg::Wake`](state::WorkerMsg::Wake) at its `wake_at` (the next periodic sync, or a
    /// back-off's end), or any message before. The manager keeps one timer for every worker's time (as the kubelet's work
    /// queue does), so an idle worker holds no timer, no task and no channel. A worker that reached its end
    /// (it reported [`Gone`](Self::Gone) first) is dropped.
    Turned(Box<PodWorker>),
    /// A probe result changed (from the pod's prober): pass it to the worker as
    /// [`WorkerMsg::Probe`](state::WorkerMsg::Probe).
    Probe { uid: Arc<str>, update: Box<ProbeUpdate> },
    /// Stop the pod (from the graceful node shutdown's sequence): pass it to the worker as
    /// [`WorkerMsg::Kill`](state::WorkerMsg::Kill).
    Kill { uid: Arc<str>, order: Box<KillOrder> },
}
