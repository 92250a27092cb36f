//! The pod manager's side of its workers' turns (see [`worker`](crate::pods::worker::pod_worker)): where each worker is
//! ([`Slot`]), inputs handed to it or kept for after its turn, a turn's end (the worker back in its entry, its
//! wake time in it), and the one timer at the earliest wake time (see `wake_timer`).

use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::pods::manager::{Entry, PodManager, PodWorker, WorkerMsg};

/// Where a pod's worker is.
pub(crate) enum Slot {
    /// Waiting for input, here (its wake time in it: see `wake_timer`).
    Idle(Box<PodWorker>),
    /// In a turn, in a task of its own; what arrived for it since, handed over when the turn ends.
    Busy(Vec<WorkerMsg>),
}

impl Entry {
    /// Hands `msg` to the worker: at once, starting a turn, when it waits; after its turn when one runs.
    pub(crate) fn deliver(&mut self, msg: WorkerMsg, tracker: &TaskTracker) {
        match std::mem::replace(&mut self.worker, Slot::Busy(Vec::new())) {
            Slot::Idle(mut worker) => {
                worker.handle(msg);
                start_turn(worker, tracker);
            }
            Slot::Busy(mut pending) => {
                // a runtime event or a wake-up only asks for a step: one queued input already brings one (a
                // relist's event for every pod adds nothing to a queue that holds any)
                if pending.is_empty() || !matches!(msg, WorkerMsg::Runtime | WorkerMsg::Wake) {
                    pending.push(msg);
                }
                self.worker = Slot::Busy(pending);
            }
        }
    }

    /// The worker's wake time, while it waits.
    pub(crate) fn wake_at(&self) -> Option<Instant> {
        match &self.worker {
            Slot::Idle(worker) => worker.wake_at(),
            Slot::Busy(_) => None,
        }
    }
}

/// Spawns one turn of `worker`.
pub(crate) fn start_turn(worker: Box<PodWorker>, tracker: &TaskTracker) {
    let span = tracing::debug_span!(
        "pod",
        pod = %worker.pod.name,
        namespace = %worker.pod.namespace,
        node = %worker.ctx.config.node_name
    );
    let turn = worker.turn();
    // a span only where it records: a disabled one still takes room in the turn's task
    if span.is_disabled() {
        tracker.spawn(turn);
    } else {
        tracker.spawn(turn.instrument(span));
    }
}

impl PodManager {
    /// A turn ended: the worker waits in its entry for its wake time or its next input — or, when inputs
    /// arrived during the turn, takes them and starts its next turn at once.
    pub(crate) fn turned(&mut self, mut worker: Box<PodWorker>) {
        if worker.ended() {
            // it told the manager it is gone (before this report); a worker of the same UID may run by now
            return;
        }
        let Some(e) = self.workers.get_mut(worker.uid()) else {
            return;
        };
        let Slot::Busy(pending) = &mut e.worker else {
            return;
        };
        if pending.is_empty() {
            if let Some(at) = worker.wake_at() {
                self.wakes.by(at);
            }
            e.worker = Slot::Idle(worker);
            return;
        }
        for msg in std::mem::take(pending) {
            worker.handle(msg);
        }
        start_turn(worker, &self.tracker);
    }

    /// Wakes the workers whose time has come; the timer moves to the next time.
    pub(crate) fn on_wake(&mut self) {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        for e in self.workers.values_mut() {
            match e.wake_at() {
                Some(at) if at <= now => e.deliver(WorkerMsg::Wake, &self.tracker),
                Some(at) => next = Some(next.map_or(at, |n| n.min(at))),
                None => {}
            }
        }
        self.wakes.set(next);
    }
}
