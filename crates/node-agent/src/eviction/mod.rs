//! Node-pressure eviction: the kubelet's eviction manager, for real and hollow nodes alike.
//!
//! Every [`MONITORING_INTERVAL`] the [`EvictionManager`] takes a [`Summary`](crate::stats::Summary) from the
//! agent's stats provider, turns it into signal observations ([`signals::observe`]) and checks the configured
//! thresholds (`evictionHard`, `evictionSoft` after `evictionSoftGracePeriod`, `evictionMinimumReclaim` while
//! unresolved). It then
//!
//! 1. reports MemoryPressure / DiskPressure / PIDPressure through the agent's [`Pressure`] channel (kept for
//!    `evictionPressureTransitionPeriod` after the last observation) — the node status reports them and pod
//!    admission refuses pods as the kubelet does (see [`admit_under_pressure`](crate::pods::model::admission::admit_under_pressure));
//! 2. for the first threshold to act on (memory first), records `EvictionThresholdMet` on the node; for disk
//!    signals first reclaims node-level resources (dead containers, unused images: a [`NodeReclaim`]) and stops
//!    there if that resolved the pressure;
//! 3. ranks the running pods ([`rank`]) and evicts the first one that is not critical: an `Evicted` event, its
//!    containers stopped (1 s grace for a hard threshold; for a soft one the pod's own, at most
//!    `evictionMaxPodGracePeriod`), phase Failed with reason `Evicted` and the kubelet's message. One pod per
//!    pass; the next pass waits until that pod has stopped.

pub mod rank;
pub mod signals;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::config::AgentConfig;
use crate::density::watch;
use crate::events::{EventRecorder, node_reference};
use crate::metrics::Metrics;
use crate::node::{Pressure, ResourceList};
use crate::pods::manager::control::{ActivePod, EvictOrder, ManagerControl};
use crate::stats::PodUsage;

use self::signals::{Observations, State, ThresholdSpec};

/// How often the eviction manager looks (the kubelet's `evictionMonitoringPeriod`).
pub const MONITORING_INTERVAL: Duration = Duration::from_secs(10);
/// The status reason and event reason of an evicted pod (and of a pod refused under pressure).
pub const REASON: &str = crate::pods::model::admission::EVICTED;
/// How long a pass waits for an evicted pod to stop before going on.
const CLEANUP_WAIT: Duration = Duration::from_secs(30);

/// Node-level reclaim tried before evicting pods for disk pressure (container and image garbage collection).
#[async_trait::async_trait]
pub trait NodeReclaim: Send + Sync {
    /// Removes what can go (dead containers, unused images); errors are logged by the implementation.
    async fn reclaim(&self);
}

#[async_trait::async_trait]
impl NodeReclaim for crate::gc::GarbageCollectors {
    /// The kubelet's node-level reclaim for disk: every unused container (those of terminated pods too),
    /// then every unused image.
    async fn reclaim(&self) {
        if let Err(error) = self.containers.delete_all_unused().await {
            tracing::warn!(%error, "eviction manager: removing unused containers failed");
        }
        match self.images.delete_unused_images().await {
            Ok(freed) => tracing::info!(freed, "eviction manager: unused images removed"),
            Err(error) => tracing::warn!(%error, "eviction manager: removing unused images failed"),
        }
    }
}

/// What the eviction manager uses of its agent.
#[derive(Clone)]
pub struct EvictionInputs {
    /// The agent's configuration: node name, thresholds, periods.
    pub config: Arc<AgentConfig>,
    /// Node and pod usage.
    pub stats: crate::stats::StatsProvider,
    /// The node's allocatable (memory.available is measured against it).
    pub allocatable: watch::Receiver<Arc<ResourceList>>,
    /// Where the pressure conditions go (the node status and pod admission read them).
    pub pressure: Arc<watch::Sender<Pressure>>,
    /// The node's event recorder.
    pub events: EventRecorder,
    /// Eviction counts (`kubelet_evictions`).
    pub metrics: Arc<Metrics>,
    /// The timer the manager waits between passes on (the agent's).
    pub timer: crate::density::timer::Timer,
}

impl EvictionInputs {
    fn node_name(&self) -> &str {
        &self.config.node_name
    }
}

/// The eviction manager of one agent.
pub struct EvictionManager {
    ctx: EvictionInputs,
    control: crate::density::chan::UnboundedSender<ManagerControl>,
    thresholds: Arc<[ThresholdSpec]>,
    state: State,
    reclaim: Option<Arc<dyn NodeReclaim>>,
}

/// Waits one monitoring interval (its end on the process-wide [`grid`](crate::density::grid)).
fn next_pass(timer: &crate::density::timer::Timer) -> crate::density::timer::Wait<'_> {
    timer.sleep_until(crate::density::periodic::next_tick(
        Instant::now(),
        MONITORING_INTERVAL,
        0.0,
    ))
}

fn pod_reference(p: &ActivePod) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(p.name.clone()),
        namespace: Some(p.namespace.clone()),
        uid: Some(p.uid.clone()),
        ..Default::default()
    }
}

impl EvictionManager {
    /// The eviction manager of the agent `ctx` describes; it asks the pod manager over `control`. Without
    /// [`with_reclaim`](Self::with_reclaim) disk pressure goes straight to evicting pods.
    pub fn new(ctx: EvictionInputs, control: crate::density::chan::UnboundedSender<ManagerControl>) -> Self {
        let thresholds = signals::shared_thresholds(&ctx.config.kubelet);
        Self {
            ctx,
            control,
            thresholds,
            state: State::default(),
            reclaim: None,
        }
    }

    /// Reclaim node-level resources with `reclaim` before evicting pods for disk pressure.
    pub fn with_reclaim(mut self, reclaim: Arc<dyn NodeReclaim>) -> Self {
        self.reclaim = Some(reclaim);
        self
    }

    /// Runs until dropped (the agent drops it where it waits when its token fires, see
    /// `agent::supervise`). Without thresholds there is nothing to do.
    pub fn run(mut self) -> impl Future<Output = ()> + Send + 'static {
        async move {
            if self.thresholds.is_empty() {
                return;
            }
            // agents of a fleet start together: spread their passes over the interval
            let offset = MONITORING_INTERVAL.mul_f64(rand::random::<f64>());
            self.ctx.timer.sleep_until(Instant::now() + offset).await;
            loop {
                // boxed: a pass's state lives on the heap only while it runs (thousands of idle agents per fleet)
                let evicted = Box::pin(self.synchronize(Instant::now())).await;
                // whether a pod was evicted and has stopped: then the next pass comes at once (one that could not
                // be evicted, gone meanwhile, does not make it come early); the pass's answer is gone before
                // the wait
                let stopped = match evicted {
                    // boxed: its timer is held only while a pod stops
                    Some(done) => matches!(
                        Box::pin(tokio::time::timeout(CLEANUP_WAIT, done)).await,
                        Ok(Ok(true))
                    ),
                    None => false,
                };
                if !stopped {
                    next_pass(&self.ctx.timer).await;
                }
            }
        }
    }

    fn observe(&self, summary: &crate::stats::Summary) -> Observations {
        let allocatable = self
            .ctx
            .allocatable
            .borrow()
            .get("memory")
            .and_then(|q| u64::try_from(q.value()).ok())
            .unwrap_or(summary.node.memory_capacity);
        signals::observe(summary, allocatable)
    }

    /// One pass; returns a receiver that fires when the evicted pod (if any) has stopped.
    pub(crate) async fn synchronize(&mut self, now: Instant) -> Option<oneshot::Receiver<bool>> {
        let summary = match self.ctx.stats.summary().await {
            Ok(s) => s,
            Err(error) => {
                // debug: an unreachable runtime is reported by the node's Ready condition already
                tracing::debug!(node = %self.ctx.node_name(), %error, "eviction manager: no stats");
                return None;
            }
        };
        let obs = self.observe(&summary);
        let transition = self.ctx.config.kubelet.eviction_pressure_transition_period;
        let decision = self.state.update(&self.thresholds, &obs, transition, now);
        self.ctx.pressure.send_if_modified(|p| {
            let changed = *p != decision.pressure;
            *p = decision.pressure;
            changed
        });
        let threshold = *decision.act_on.first()?;
        let resource = threshold.signal.resource();
        let seen = obs.get(&threshold.signal).copied();
        tracing::info!(
            node = %self.ctx.node_name(),
            signal = threshold.signal.as_str(),
            available = seen.map(|o| o.available),
            threshold = seen.map(|o| threshold.quantity(o.capacity)),
            "eviction manager: attempting to reclaim {}",
            resource.as_str()
        );
        self.ctx.events.warning(
            &node_reference(self.ctx.node_name()),
            "EvictionThresholdMet",
            format!("Attempting to reclaim {}", resource.as_str()),
        );
        let mut obs = obs;
        let mut summary = summary;
        if threshold.signal.is_disk()
            && let Some(reclaim) = &self.reclaim
        {
            reclaim.reclaim().await;
            match self.ctx.stats.summary().await {
                Ok(after) => {
                    obs = self.observe(&after);
                    summary = after;
                    if !State::still_met(&self.thresholds, &obs) {
                        tracing::info!(node = %self.ctx.node_name(), "eviction manager: node-level reclaim relieved the pressure; no pod evicted");
                        return None;
                    }
                }
                Err(error) => {
                    tracing::warn!(node = %self.ctx.node_name(), %error, "eviction manager: no stats after reclaim");
                    return None;
                }
            }
        }
        let (answer, active) = oneshot::channel();
        self.control.send(ManagerControl::ActivePods(answer)).ok()?;
        let mut pods = active.await.ok()?;
        if pods.is_empty() {
            tracing::warn!(node = %self.ctx.node_name(), "eviction manager: thresholds met but no pod is running");
            return None;
        }
        let usage_of = |uid: &str| summary.pods.iter().find(|p| p.uid == uid);
        rank::rank(&mut pods, resource, usage_of);
        let max_grace = self.ctx.config.kubelet.eviction_max_pod_grace_period;
        for pod in &pods {
            if pod.critical {
                tracing::warn!(pod = %pod.name, namespace = %pod.namespace, "eviction manager: cannot evict a critical pod");
                continue;
            }
            let grace_secs = if threshold.hard {
                1
            } else {
                max_grace.min(pod.grace_secs)
            };
            let usage: Option<&PodUsage> = usage_of(&pod.uid);
            let message = rank::message(resource, &threshold, obs.get(&threshold.signal), pod, usage);
            self.ctx
                .events
                .warning(&pod_reference(pod), REASON, message.clone());
            self.ctx.metrics.eviction(threshold.signal.as_str());
            tracing::info!(pod = %pod.name, namespace = %pod.namespace, %message, "eviction manager: evicting pod");
            let (done, stopped) = oneshot::channel();
            let order = EvictOrder {
                uid: pod.uid.clone(),
                grace_secs,
                reason: REASON.into(),
                message,
                done,
            };
            self.control.send(ManagerControl::Evict(Box::new(order))).ok()?;
            return Some(stopped);
        }
        tracing::warn!(node = %self.ctx.node_name(), "eviction manager: unable to evict any pod");
        None
    }
}
