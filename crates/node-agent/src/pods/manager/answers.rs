//! The pod manager's answers to other managers (see [`control`](crate::pods::manager::control)): which pods the node
//! has (garbage collection), which run (eviction ranking), evicting one, and which hold the node's resources
//! (the pod-resources API).

use crate::pods::manager::PodManager;
use crate::pods::manager::control::{ActivePod, EvictOrder, KnownPods, ManagerControl};
use crate::pods::worker::disruption::KillCause;
use crate::pods::worker::pod_worker::{KillOrder, WorkerMsg};

impl PodManager {
    /// Takes what arrived before the pod side was built (see `first_pod`), before anything else.
    pub(in crate::pods) async fn take_first(&mut self, first: crate::pods::manager::first_pod::Taken) {
        for event in first.events {
            self.on_source(event).await;
        }
        if let Some(request) = first.control {
            self.on_control(request);
        }
    }

    pub(crate) fn on_control(&mut self, request: ManagerControl) {
        match request {
            ManagerControl::Shutdown(request) => self.on_shutdown(*request),
            ManagerControl::ShutdownCancelled => self.shutting_down = false,
            ManagerControl::ActivePods(answer) => {
                let _ = answer.send(self.active_pods());
            }
            ManagerControl::Evict(order) => self.on_evict(*order),
            ManagerControl::KnownPods(answer) => {
                let _ = answer.send(self.known_pods());
            }
            ManagerControl::AdmittedPods(answer) => {
                // `admitted` is cleared when the worker reports the pod stopped for good
                let pods = self
                    .workers
                    .values()
                    .filter(|e| e.admitted)
                    .map(|e| e.pod.clone());
                let _ = answer.send(pods.collect());
            }
        }
    }

    /// The admitted pods still running: not finished, not being deleted.
    fn active_pods(&self) -> Vec<ActivePod> {
        self.workers
            .iter()
            .filter(|(uid, e)| e.admitted && e.pod.deletion.is_none() && !self.finished.contains(&***uid))
            .map(|(uid, e)| {
                let p = &e.pod;
                let containers = p
                    .init_containers
                    .iter()
                    .chain(p.containers.iter())
                    .map(|c| {
                        (
                            c.name.clone(),
                            c.resources.memory_request.unwrap_or(0),
                            c.resources.ephemeral_request.unwrap_or(0),
                        )
                    })
                    .collect();
                ActivePod {
                    uid: uid.to_string(),
                    name: p.name.clone(),
                    namespace: p.namespace.clone(),
                    priority: p.priority,
                    critical: self.statics.mirrors.is_static(uid)
                        || p.priority >= crate::pods::model::spec::SYSTEM_CRITICAL_PRIORITY,
                    memory_request: p.requests().memory,
                    ephemeral_request: p.requests().ephemeral,
                    containers,
                    grace_secs: p.grace_secs(),
                }
            })
            .collect()
    }

    /// Evicts one pod: its worker stops it and reports it Failed with the eviction's reason and message.
    fn on_evict(&mut self, order: EvictOrder) {
        let EvictOrder {
            uid,
            grace_secs,
            reason,
            message,
            done,
        } = order;
        let Some(e) = self.workers.get_mut(uid.as_str()).filter(|e| e.admitted) else {
            let _ = done.send(false);
            return;
        };
        let (stopped, wait) = tokio::sync::oneshot::channel();
        let order = KillOrder {
            grace_secs,
            cause: KillCause::Evicted { reason, message },
            done: stopped,
        };
        e.deliver(WorkerMsg::Kill(Box::new(order)), &self.tracker);
        self.tracker.spawn(async move {
            let _ = done.send(wait.await.is_ok());
        });
    }

    /// The pods of this node: those with a worker and those waiting for the node view — once every source
    /// has been seen (as orphan cleanup waits for).
    fn known_pods(&self) -> Option<KnownPods> {
        if self.statics.unseen > 0 || self.statics.api_live.is_none() {
            return None;
        }
        let mut known = KnownPods::default();
        for (uid, e) in &self.workers {
            known.insert(uid, e.stopped);
        }
        for uid in self.pending.iter().filter_map(|p| p.metadata.uid.as_deref()) {
            known.insert(uid, false);
        }
        Some(known)
    }
}
