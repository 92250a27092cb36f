//! The pod manager's side of its workers' wake times: each worker's time kept in its entry, the one timer at the
//! earliest (see `wake_timer`).

use std::sync::Arc;

use tokio::time::Instant;

use super::{PodManager, WorkerMsg};

impl PodManager {
    /// Records when the worker of `uid` asked to be woken; the timer fires by then.
    pub(super) fn wake_at(&mut self, uid: &Arc<str>, at: Option<Instant>) {
        if let Some(e) = self.workers.get_mut(uid) {
            e.wake = at;
            if let Some(at) = at {
                self.wakes.by(at);
            }
        }
    }

    /// Wakes the workers whose time has come; the timer moves to the next time.
    pub(super) fn on_wake(&mut self) {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        for e in self.workers.values_mut() {
            match e.wake {
                Some(at) if at <= now => {
                    e.wake = None;
                    let _ = e.tx.send(WorkerMsg::Wake);
                }
                Some(at) => next = Some(next.map_or(at, |n| n.min(at))),
                None => {}
            }
        }
        self.wakes.set(next);
    }
}
