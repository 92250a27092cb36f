//! What one pod's worker takes ([`WorkerMsg`]) and holds between syncs ([`PodWorker`]), its [`State`] and what
//! it keeps of its last report ([`LastReport`]); and the link to the pod's prober. [`worker`](crate::pods::worker::pod_worker)
//! drives this state from inputs and timers, [`sync`](crate::pods::worker::sync) makes the runtime match the spec with it;
//! neither calls the other back.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::PodStatus;
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::density::watch;
use crate::pods::actions::images::Images;
use crate::pods::actions::volumes::PodVolumes;
use crate::pods::metrics::Timeline;
use crate::pods::model::admission::Rejection;
use crate::pods::model::spec::DesiredPod;
use crate::pods::probes::ProbeResults;
use crate::pods::probes::{ProbeUpdate, Seeds};
use crate::pods::runtime::observed::RuntimeView;
use crate::pods::status::Phase;
use crate::pods::status::generate::Previous;
use crate::pods::worker::AgentCtx;
use crate::pods::worker::disruption::KillCause;
use crate::pods::worker::prober::{Prober, Targets};
use crate::pods::worker::restart::RestartBackoff;

/// Input to a pod worker.
#[derive(Debug)]
pub(crate) enum WorkerMsg {
    /// A newer version of the pod object.
    Update(Arc<DesiredPod>),
    /// The pod object is gone from the API server.
    Removed,
    /// The runtime reported a change for this pod.
    Runtime,
    /// A probe result changed.
    Probe(Box<ProbeUpdate>),
    /// The time the worker asked to be woken at (its `wake_at` when its last turn ended) has come.
    Wake,
    /// The API server holds the pod not ready since this second (seconds since the epoch) while its containers
    /// are ready: someone else wrote it (the node-lifecycle controller marks a lost node's pods so). If the
    /// worker last reported it ready before then, it reports its status again.
    ApiNotReady(i64),
    /// Stop the pod on request (graceful node shutdown, eviction) and report why, then fire the order's
    /// sender (boxed: messages stay small).
    Kill(Box<KillOrder>),
}

/// A request to stop the pod.
#[derive(Debug)]
pub(crate) struct KillOrder {
    /// Grace period: for a shutdown the pod's own when shorter; for an eviction this one.
    pub grace_secs: i64,
    /// Why.
    pub cause: KillCause,
    /// Fired once the pod is stopped and its final status reported.
    pub done: tokio::sync::oneshot::Sender<()>,
}

/// How a worker starts.
pub(crate) struct WorkerInit {
    pub pod: Arc<DesiredPod>,
    /// The status the API server holds (seeds change detection, start time, conditions, probe results).
    pub api_status: Option<PodStatus>,
    /// Admission refused the pod.
    pub rejected: Option<Rejection>,
    /// The start-up timeline, for a pod admitted just now.
    pub timeline: Option<Timeline>,
}

/// Where a worker is in the pod's life (see [`worker`](crate::pods::worker::pod_worker)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Syncing,
    Terminating,
    Terminated,
    Exit,
}

/// A reported status, reduced to what the worker needs of it later: whether the next one differs, whether
/// the pod was reported finished, and what the next status carries over (transition times, pod IPs).
#[derive(Debug)]
pub(crate) struct LastReport {
    /// [`hash_of`](crate::pods::status::canonical::hash_of) the whole status.
    pub fingerprint: u64,
    pub previous: Previous,
}

/// Whether `status`'s phase is Succeeded or Failed.
pub(crate) fn is_terminal(status: &PodStatus) -> bool {
    status
        .phase
        .as_deref()
        .and_then(Phase::parse)
        .is_some_and(Phase::is_terminal)
}

impl LastReport {
    /// `status`, fingerprinted `fingerprint` (see [`hash_of`](crate::pods::status::canonical::hash_of)).
    pub(crate) fn new(status: &PodStatus, fingerprint: u64) -> Self {
        Self {
            fingerprint,
            previous: Previous::of(status),
        }
    }

    pub(crate) fn of(status: &PodStatus) -> Self {
        Self::new(status, crate::pods::status::canonical::hash_of(status))
    }
}

/// One pod's worker: everything it keeps between syncs.
pub(crate) struct PodWorker {
    pub(crate) ctx: Arc<AgentCtx>,
    pub(crate) pod: Arc<DesiredPod>,
    pub(crate) state: State,
    pub(crate) removed: bool,
    /// Admission refused the pod (boxed: rare).
    pub(crate) rejected: Option<Box<Rejection>>,
    pub(crate) view: RuntimeView,
    pub(crate) probes: ProbeResults,
    /// Per container, why it waits; made when the first waits and dropped when none does (a pointer while no
    /// container waits, as for a running pod).
    pub(crate) waiting: Option<Box<Waiting>>,
    /// Crash-loop back-off, made at the first restart (most pods never restart).
    pub(crate) restarts: Option<Box<RestartBackoff>>,
    pub(crate) images: Images,
    /// The pod's start time, in seconds since the epoch (the API's resolution).
    pub(crate) start_second: i64,
    /// What was last reported (or what the API server held when the worker started).
    pub(crate) last: Option<LastReport>,
    /// The status last reported was Succeeded or Failed.
    pub(crate) last_terminal: bool,
    pub(crate) terminal: Option<Phase>,
    pub(crate) timeline: Option<Box<Timeline>>,
    /// The link to the pod's prober, made when the first probed container runs (boxed: most pods have none).
    pub(crate) prober: Option<Box<(watch::Sender<Targets>, CancellationToken)>>,
    /// During a turn, the earliest back-off's end a step asked for; between turns, when the manager wakes the
    /// worker (that or the next periodic sync).
    pub(crate) wake_at: Option<Instant>,
    /// Back-off between failed syncs, made at the first failure.
    pub(crate) errors: Option<Box<Backoff>>,
    pub(crate) stopped_reported: bool,
    pub(crate) counted_running: bool,
    /// A step has run (the first is named `create` for a pod admitted just now, else `sync`).
    pub(crate) stepped: bool,
    /// Stops on request (graceful node shutdown, eviction), made at the first (most pods never get one).
    pub(crate) stop: Option<Box<StopRequests>>,
    /// The pod's volumes, once it has any.
    pub(crate) volumes: Option<Box<PodVolumes>>,
    /// An in-place resize not yet applied to every container.
    pub(crate) resize: Option<Box<crate::pods::worker::resize::Resizing>>,
}

/// Per container, why it waits: the reason and the message.
pub(crate) type Waiting = BTreeMap<String, (&'static str, String)>;

/// What the status sees when no container waits.
pub(crate) static NO_WAITING: Waiting = BTreeMap::new();

/// Stops on request a worker received.
#[derive(Default)]
pub(crate) struct StopRequests {
    /// The grace period and the cause, when the request arrived while the pod was syncing.
    pub order: Option<(i64, KillCause)>,
    /// Fired once the pod is stopped and its final status reported.
    pub done: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl PodWorker {
    /// Container `name` waits, for `reason`.
    pub(crate) fn wait_as(&mut self, name: &str, reason: &'static str, message: String) {
        self.waiting
            .get_or_insert_default()
            .insert(name.to_owned(), (reason, message));
    }

    /// Container `name` no longer waits.
    pub(crate) fn not_waiting(&mut self, name: &str) {
        if let Some(waiting) = self.waiting.as_deref_mut() {
            waiting.remove(name);
            if waiting.is_empty() {
                self.waiting = None;
            }
        }
    }

    /// The pod's start time.
    pub(crate) fn start_time(&self) -> Timestamp {
        Timestamp::from_second(self.start_second).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    /// The stop order being carried out, if the pod was stopped on request.
    pub(crate) fn killed(&self) -> Option<&(i64, KillCause)> {
        self.stop.as_ref()?.order.as_ref()
    }

    /// Stops the pod's prober, if it has one.
    pub(crate) fn stop_prober(&mut self) {
        if let Some(link) = self.prober.take() {
            link.1.cancel();
        }
    }

    /// Publishes the running containers to the prober, starting it on first need.
    pub(crate) fn update_prober(&mut self) {
        if !self.pod.has_probes() {
            return;
        }
        let targets = Targets {
            pod_ip: self.ctx.pod_ip(&self.pod, self.view.sandbox()),
            running: self
                .view
                .containers
                .iter()
                .filter(|r| r.running())
                .map(|r| crate::pods::worker::prober::Running {
                    name: r.name.clone(),
                    id: r.id.to_string(),
                    started: r.started_seen.unwrap_or_else(Instant::now),
                })
                .collect(),
        };
        if let Some(link) = &self.prober {
            link.0.send_if_modified(|cur| {
                if *cur == targets {
                    false
                } else {
                    *cur = targets;
                    true
                }
            });
            return;
        }
        if targets.running.is_empty() {
            return;
        }
        let seeds: Seeds = self.probes.seeds();
        let (tx, rx) = watch::channel(targets);
        let cancel = CancellationToken::new();
        let prober = Prober::new(self.ctx.clone(), self.pod.clone(), rx, seeds);
        self.ctx.tasks.spawn(prober.run(cancel.clone()));
        self.prober = Some(Box::new((tx, cancel)));
    }
}

/// However a worker ends — its pod gone, the pod manager stopped (the containers keep running), its turn's report
/// left unread — its prober stops and the running pods' count no longer holds it.
impl Drop for PodWorker {
    fn drop(&mut self) {
        self.stop_prober();
        if self.counted_running {
            self.ctx.metrics.running_pods(-1);
        }
    }
}
