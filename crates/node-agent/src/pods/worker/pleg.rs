//! The pod lifecycle event generator: tells pod workers that the runtime changed something of their pod.
//!
//! Evented when the runtime supports `GetContainerEvents` (cri-fake does; containerd 1.6 does not): every
//! event names its pod through the sandbox metadata or the container labels. When the runtime answers
//! `Unimplemented`, it falls back to relisting containers and sandboxes every `relist_period` (1 s, as the
//! kubelet) and reporting the pods whose objects changed state. If the event stream breaks, it reconnects with
//! back-off and asks every worker to resync, so nothing missed in between is lost.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use runtime_api::{Code, cri};

use crate::backoff::{Backoff, BackoffPolicy};
use crate::pods::runtime::labels;
use crate::pods::worker::AgentCtx;

/// A pod whose runtime objects changed; `None` = every pod (after events may have been missed).
pub(crate) type PlegEvent = Option<String>;

pub(crate) struct Pleg {
    ctx: Arc<AgentCtx>,
    tx: crate::density::chan::UnboundedSender<PlegEvent>,
}

fn event_uid(e: &cri::ContainerEventResponse) -> Option<String> {
    if let Some(uid) = e
        .pod_sandbox_status
        .as_ref()
        .and_then(|s| s.metadata.as_ref())
        .map(|m| m.uid.clone())
    {
        return Some(uid).filter(|u| !u.is_empty());
    }
    e.containers_statuses
        .iter()
        .find_map(|c| c.labels.get(labels::POD_UID).cloned())
}

impl Pleg {
    pub(crate) fn new(ctx: Arc<AgentCtx>, tx: crate::density::chan::UnboundedSender<PlegEvent>) -> Self {
        Self { ctx, tx }
    }

    /// Follows the runtime's events (or relists) until `stop` completes. The agent's pod side passes a stop that
    /// never comes (`std::future::pending`) and drops the PLEG where it waits instead (`join::join3_stop`): no
    /// cancellation wait in the idle future.
    pub(crate) fn run<S>(self, stop: S) -> impl Future<Output = ()> + Send + 'static
    where
        S: Future<Output = ()> + Send + 'static,
    {
        async move {
            let mut stop = std::pin::pin!(stop);
            // made at the first failure, dropped once events flow (boxed: the idle task holds it for the
            // node's life, and the stream mostly stays up)
            let mut backoff: Option<Box<Backoff>> = None;
            let mut announced = false;
            loop {
                let opened = tokio::select! {
                    () = &mut stop => return,
                    r = self.ctx.runtime.get_container_events(cri::GetEventsRequest {}) => r,
                };
                match opened {
                    Ok(mut stream) => {
                        if !announced {
                            announced = true;
                            tracing::info!("following the runtime's container events (evented PLEG)");
                        }
                        loop {
                            let item = tokio::select! {
                                () = &mut stop => return,
                                item = stream.next() => item,
                            };
                            match item {
                                Some(Ok(event)) => {
                                    backoff = None;
                                    if let Some(uid) = event_uid(&event) {
                                        let _ = self.tx.send(Some(uid));
                                    }
                                }
                                Some(Err(error)) => {
                                    tracing::warn!(%error, "runtime event stream failed, reconnecting");
                                    break;
                                }
                                None => break,
                            }
                        }
                        let _ = self.tx.send(None);
                    }
                    Err(e) if e.code == Code::Unimplemented => {
                        tracing::info!(
                            "runtime has no container events, relisting every {:?}",
                            self.ctx.config.relist_period
                        );
                        // boxed: the relisting loop's state is not kept in an evented agent's task
                        return Box::pin(self.relist(stop)).await;
                    }
                    Err(error) => tracing::warn!(%error, "cannot subscribe to runtime events, retrying"),
                }
                let retry = Backoff::in_slot(&mut backoff, BackoffPolicy::api_retry());
                tokio::select! {
                    () = &mut stop => return,
                    () = Box::pin(retry.wait()) => {}
                }
            }
        }
    }

    async fn snapshot(&self) -> Option<HashMap<String, (i32, String)>> {
        let ctx = &self.ctx;
        let containers = ctx.rt(
            "list_containers",
            ctx.runtime.list_containers(cri::ListContainersRequest::default()),
        );
        let sandboxes = ctx.rt(
            "list_podsandbox",
            ctx.runtime
                .list_pod_sandbox(cri::ListPodSandboxRequest::default()),
        );
        let (containers, sandboxes) = futures::join!(containers, sandboxes);
        let (containers, sandboxes) = match (containers, sandboxes) {
            (Ok(c), Ok(s)) => (c.containers, s.items),
            (Err(error), _) | (_, Err(error)) => {
                tracing::debug!(%error, "relist failed");
                return None;
            }
        };
        let mut state = HashMap::with_capacity(containers.len() + sandboxes.len());
        for c in containers {
            if let Some(uid) = c.labels.get(labels::POD_UID) {
                state.insert(c.id, (c.state, uid.clone()));
            }
        }
        for s in sandboxes {
            if let Some(uid) = s.labels.get(labels::POD_UID) {
                // sandbox states are offset so they never collide with container states of the same id
                state.insert(s.id, (100 + s.state, uid.clone()));
            }
        }
        Some(state)
    }

    async fn relist<S: Future<Output = ()>>(self, mut stop: std::pin::Pin<&mut S>) {
        let mut previous: HashMap<String, (i32, String)> = HashMap::new();
        let mut tick = tokio::time::interval(self.ctx.config.relist_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut stop => return,
                _ = tick.tick() => {}
            }
            let Some(current) = self.snapshot().await else {
                continue;
            };
            let mut changed: Vec<&String> = Vec::new();
            for (id, (state, uid)) in &current {
                if previous.get(id).is_none_or(|(s, _)| s != state) {
                    changed.push(uid);
                }
            }
            for (id, (_, uid)) in &previous {
                if !current.contains_key(id) {
                    changed.push(uid);
                }
            }
            changed.sort();
            changed.dedup();
            for uid in changed {
                let _ = self.tx.send(Some(uid.clone()));
            }
            previous = current;
        }
    }
}
