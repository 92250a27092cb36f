//! The pod lifecycle event generator: tells pod workers that the runtime changed something of their pod.
//!
//! Evented when the runtime supports `GetContainerEvents` (cri-fake does; containerd 1.6 does not): every
//! event names its pod through the sandbox metadata or the container labels. When the runtime answers
//! `Unimplemented`, it falls back to relisting containers and sandboxes every `relist_period` (1 s, as the
//! kubelet) and reporting the pods whose objects changed state. If the event stream breaks, it reconnects with
//! back-off and asks every worker to resync, so nothing missed in between is lost.
//!
//! [`PlegHealth`] is when the PLEG was last seen active, read by the node's `PLEG` health check (the kubelet's
//! `PLEG is not healthy: pleg was last seen active 3m10s ago; threshold is 3m0s`). Relisting, the PLEG is
//! active at every relist that got the runtime's answer, as the kubelet's `relistTime`. Following events, an
//! open stream is healthy however long it stays quiet (a node whose pods do nothing gets no events, and this
//! PLEG does not relist beside the stream); the clock runs only while the stream is being (re)opened, so the
//! check fails when that hangs or keeps failing past the threshold. Before the PLEG starts (a node waiting for
//! its first pod runs none) there is nothing to be stuck.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use runtime_api::{Code, cri};

use tokio::time::Instant;

use crate::backoff::{Backoff, BackoffPolicy};
use crate::pods::runtime::labels;
use crate::pods::worker::AgentCtx;

/// A pod whose runtime objects changed; `None` = every pod (after events may have been missed).
pub(crate) type PlegEvent = Option<String>;

/// How long the PLEG may go unseen before the node is not ready (the kubelet's `relistThreshold`).
pub const PLEG_THRESHOLD: Duration = Duration::from_secs(180);

/// When the PLEG was last seen active (see the module). Clones share it.
#[derive(Debug, Clone)]
pub struct PlegHealth(Arc<Liveness>);

#[derive(Debug)]
struct Liveness {
    /// What `seen` counts from.
    origin: Instant,
    /// Milliseconds after `origin` the PLEG was last seen active, or [`WAITING`].
    seen: AtomicU64,
}

/// `seen` while the PLEG waits on something that may take forever with nothing wrong: an open event stream, or
/// its own start.
const WAITING: u64 = u64::MAX;

impl Default for PlegHealth {
    fn default() -> Self {
        Self::new()
    }
}

impl PlegHealth {
    /// A PLEG not started yet (healthy).
    pub fn new() -> Self {
        Self(Arc::new(Liveness {
            origin: Instant::now(),
            seen: AtomicU64::new(WAITING),
        }))
    }

    /// The PLEG is active now.
    pub(crate) fn active(&self) {
        let ms = Instant::now()
            .saturating_duration_since(self.0.origin)
            .as_millis();
        // a node would have to run for half a billion years to reach `WAITING`
        self.0
            .seen
            .store(u64::try_from(ms).unwrap_or(WAITING - 1), Ordering::Relaxed);
    }

    /// The PLEG waits on an open event stream: healthy until it leaves it.
    pub(crate) fn waiting(&self) {
        self.0.seen.store(WAITING, Ordering::Relaxed);
    }

    /// The health check: the kubelet's message once the PLEG was last seen active longer than
    /// [`PLEG_THRESHOLD`] ago.
    pub fn check(&self) -> Result<(), String> {
        let seen = self.0.seen.load(Ordering::Relaxed);
        if seen == WAITING {
            return Ok(());
        }
        let at = self.0.origin + Duration::from_millis(seen);
        let elapsed = Instant::now().saturating_duration_since(at);
        if elapsed > PLEG_THRESHOLD {
            return Err(format!(
                "pleg was last seen active {} ago; threshold is {}",
                crate::pods::model::gofmt::duration(elapsed),
                crate::pods::model::gofmt::duration(PLEG_THRESHOLD)
            ));
        }
        Ok(())
    }
}

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

    /// Records `seen` in the node's PLEG health, when the agent keeps one.
    fn mark(&self, seen: fn(&PlegHealth)) {
        if let Some(health) = &self.ctx.config.pleg_health {
            seen(health);
        }
    }

    /// Follows the runtime's events (or relists) until `stop` completes. The agent's pod side passes a stop that
    /// never comes (`std::future::pending`) and drops the PLEG where it waits instead (`join::join3_stop`): no
    /// cancellation wait in the idle future.
    pub(crate) fn run<S>(self, stop: S) -> impl Future<Output = ()> + Send + 'static
    where
        S: Future<Output = ()> + Send + 'static,
    {
        async move {
            self.mark(PlegHealth::active);
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
                        self.mark(PlegHealth::waiting);
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
                        // the clock runs again until the stream is open again
                        self.mark(PlegHealth::active);
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
            self.mark(PlegHealth::active);
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::pods::PodConfig;
    use crate::pods::events::{MemoryEvents, Recorder};
    use crate::testing::{TestRuntime, pass};

    /// What the PLEG reads of the pod side, on `runtime`, with `health` kept.
    fn ctx(runtime: Arc<TestRuntime>, health: &PlegHealth) -> Arc<AgentCtx> {
        let mut config = PodConfig::new("n1");
        config.pleg_health = Some(health.clone());
        let (_node_tx, node_rx) = crate::density::watch::channel(None);
        Arc::new(AgentCtx {
            actions: crate::pods::actions::context::ActionCtx {
                config,
                runtime,
                runtime_type: "test".into(),
                probes: Arc::new(crate::pods::ScriptedProbes::new(
                    |_: &str, _: crate::pods::NetTarget<'_>| Ok::<bool, String>(true),
                )),
                events: Recorder::new(Arc::new(MemoryEvents::default())),
                metrics: Arc::new(crate::pods::PodMetrics::new()),
                probe_metrics: Arc::default(),
                status: crate::pods::status::StatusHandle::channel().0,
                node: node_rx.into(),
                objects: Arc::new(crate::pods::actions::objects::NoObjects),
                pulls: Arc::default(),
            },
            reports: crate::density::chan::unbounded_channel().0,
            tasks: tokio_util::task::TaskTracker::new(),
        })
    }

    /// Runs a PLEG on `runtime` until the returned token fires (started before this returns).
    async fn start(runtime: Arc<TestRuntime>, health: &PlegHealth) -> tokio_util::sync::CancellationToken {
        let (tx, rx) = crate::density::chan::unbounded_channel();
        let stop = tokio_util::sync::CancellationToken::new();
        let pleg = Pleg::new(ctx(runtime, health), tx).run(stop.clone().cancelled_owned());
        tokio::spawn(async move {
            let _events = rx;
            pleg.await;
        });
        tokio::task::yield_now().await;
        stop
    }

    #[tokio::test(start_paused = true)]
    async fn a_relist_that_never_answers_fails_the_check_past_three_minutes_until_it_answers() {
        let health = PlegHealth::new();
        assert_eq!(health.check(), Ok(()), "healthy before it starts");
        let runtime = Arc::new(TestRuntime::new());
        runtime.answer_lists();
        let stop = start(runtime.clone(), &health).await;
        pass(Duration::from_secs(10)).await;
        assert_eq!(health.check(), Ok(()));
        runtime.stall_lists(true);
        // the last relist answered within a second before the stall
        pass(Duration::from_secs(179)).await;
        assert_eq!(health.check(), Ok(()), "within the threshold");
        pass(Duration::from_secs(2)).await;
        let message = health.check().expect_err("stuck past the threshold");
        assert!(
            message.starts_with("pleg was last seen active 3m")
                && message.ends_with("s ago; threshold is 3m0s"),
            "{message}"
        );
        runtime.stall_lists(false);
        pass(Duration::from_millis(100)).await;
        assert_eq!(health.check(), Ok(()), "active again once the runtime answers");
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_event_stream_is_healthy_and_one_that_cannot_be_opened_is_not() {
        let quiet = Arc::new(TestRuntime::new());
        quiet.events(true);
        let health = PlegHealth::new();
        let stop = start(quiet, &health).await;
        pass(Duration::from_secs(3600)).await;
        assert_eq!(
            health.check(),
            Ok(()),
            "an hour without events is not a stuck PLEG"
        );
        stop.cancel();

        let stuck = Arc::new(TestRuntime::new());
        stuck.events(false);
        let health = PlegHealth::new();
        let stop = start(stuck, &health).await;
        pass(Duration::from_secs(170)).await;
        assert_eq!(health.check(), Ok(()));
        pass(Duration::from_secs(11)).await;
        let message = health.check().expect_err("the stream never opened");
        assert!(message.starts_with("pleg was last seen active 3m1"), "{message}");
        stop.cancel();
    }
}
