//! The pod manager: the desired pods of one agent, and one worker per pod UID.
//!
//! It consumes the pod source, admits new pods (in creation order, against allocatable minus what admitted
//! pods already hold), starts a worker for every pod — refused and already finished pods included, so their
//! status is reported and their object deleted when asked — routes updates, deletions and runtime events to
//! the right worker, and releases a pod's resources when its worker reports it stopped. After each full
//! snapshot (and on a real node every few seconds) it sweeps what pods that no longer exist left behind —
//! deleted while the agent was down: runtime sandboxes, pod directories, pod cgroups ([`orphans`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;

use crate::density::wake_timer::WakeTimer;
use crate::pods::events::EventType;
use crate::pods::manager::control::ManagerControl;
use crate::pods::manager::orphans::Orphans;
use crate::pods::manager::shutdown::ShutdownRequest;
use crate::pods::metrics::{Stage, Timeline};
use crate::pods::model::admission::{self, Committed, Rejection};
use crate::pods::model::spec::DesiredPod;
use crate::pods::source::PodEvent;
use crate::pods::static_pods::mirror::{Desired, MirrorLink, MirrorMsg};
use crate::pods::static_pods::{Mirrors, StaticUpdate, manifest};
use crate::pods::worker::AgentCtx;
use crate::pods::worker::WorkerReport;
use crate::pods::worker::pleg::PlegEvent;
use crate::pods::worker::state::{PodWorker, WorkerInit, WorkerMsg};

mod answers;
pub(crate) mod control;
pub(crate) mod first_pod;
pub(crate) mod orphans;
mod resize;
pub mod shutdown;
mod turns;
use turns::{Slot, start_turn};

struct Entry {
    worker: Slot,
    pod: Arc<DesiredPod>,
    /// Counted in `committed`.
    admitted: bool,
    /// The worker reported the pod stopped for good (terminal, or terminated awaiting deletion).
    stopped: bool,
    /// The pod as its resources were allocated (what `committed` counts): `pod`, unless a resize changed them.
    allocated: Arc<DesiredPod>,
    /// A resize that waits for room (boxed: rare).
    deferred: Option<Arc<DesiredPod>>,
}

pub(crate) struct PodManager {
    ctx: Arc<AgentCtx>,
    /// Keyed by the pod's own UID allocation (its desired state's).
    workers: HashMap<Arc<str>, Entry>,
    committed: Committed,
    /// Pods waiting for the node view before admission.
    pending: Vec<Pod>,
    /// What the workers report (they send through the agent context's sender).
    reports: crate::density::chan::UnboundedReceiver<WorkerReport>,
    /// At the earliest wake time of the workers.
    wakes: WakeTimer,
    tracker: TaskTracker,
    /// Boxed: most nodes have no static pods, and the idle manager's task holds this for the node's life.
    statics: Box<Statics>,
    /// A graceful node shutdown has begun: new pods are refused.
    shutting_down: bool,
    /// API pods whose workers finished (stopped and removed everything) while the object still exists: a
    /// late watch event for one (its final status echoed back, before the DELETE lands) must not start a
    /// worker again. Dropped when the pod leaves the API server.
    finished: HashSet<String>,
    /// What orphaned pods left behind, being removed.
    orphans: Orphans,
}

/// The static pods side of the manager.
pub(crate) struct Statics {
    /// Pods by UID, per source (`file:<path>`, `http:<url>`, `memory`).
    by_source: HashMap<String, HashMap<String, Pod>>,
    /// Sources that have not sent a first set yet.
    unseen: usize,
    pub(crate) mirrors: Mirrors,
    desired: crate::density::watch::Sender<Desired>,
    to_mirror: MirrorLink,
    /// The UIDs of the API server's pods: the last list, kept current by the watch's changes (orphan cleanup
    /// waits for every source).
    api_live: Option<HashSet<String>>,
}

impl Statics {
    pub(crate) fn new(
        sources: usize,
        mirrors: Mirrors,
        desired: crate::density::watch::Sender<Desired>,
        to_mirror: MirrorLink,
    ) -> Self {
        Self {
            by_source: HashMap::new(),
            unseen: sources,
            mirrors,
            desired,
            to_mirror,
            api_live: None,
        }
    }

    fn uids(&self) -> impl Iterator<Item = &String> {
        self.by_source.values().flat_map(HashMap::keys)
    }

    fn publish(&self) {
        let desired: HashMap<_, _> = self
            .by_source
            .values()
            .flat_map(HashMap::values)
            .map(|p| {
                let key = (
                    p.metadata.namespace.clone().unwrap_or_default(),
                    p.metadata.name.clone().unwrap_or_default(),
                );
                (key, Arc::new(p.clone()))
            })
            .collect();
        self.desired.send_replace(Arc::new(desired));
    }
}

fn terminal_phase(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn started_before(pod: &Pod) -> bool {
    pod.status.as_ref().is_some_and(|s| s.start_time.is_some())
}

impl PodManager {
    pub(crate) fn new(
        ctx: Arc<AgentCtx>,
        reports: crate::density::chan::UnboundedReceiver<WorkerReport>,
        tracker: TaskTracker,
        statics: Statics,
    ) -> Self {
        Self {
            ctx,
            workers: HashMap::new(),
            committed: Committed::default(),
            pending: Vec::new(),
            reports,
            wakes: WakeTimer::default(),
            tracker,
            statics: Box::new(statics),
            shutting_down: false,
            finished: HashSet::new(),
            orphans: Orphans::default(),
        }
    }

    /// Runs until the PLEG stops (it stops when the agent's token fires, and its channel closes then: the idle
    /// manager so holds no wait on the token of its own) or the source ends, taking `first` (what
    /// arrived before the pod side was built) before anything else.
    pub(crate) fn run(
        mut self,
        first: Option<Box<crate::pods::manager::first_pod::Taken>>,
        mut source: crate::density::chan::Receiver<PodEvent>,
        mut statics: Option<mpsc::Receiver<StaticUpdate>>,
        mut pleg: crate::density::chan::UnboundedReceiver<PlegEvent>,
        mut control: crate::density::chan::UnboundedReceiver<ManagerControl>,
    ) -> impl Future<Output = ()> + Send + 'static {
        async move {
            if let Some(first) = first {
                Box::pin(self.take_first(*first)).await;
            }
            let mut node = self.ctx.node.clone();
            let mut statics_open = statics.is_some();
            let mut control_open = true;
            // boxed: a hollow node has none, and the idle manager holds this for the node's life
            let mut housekeeping = Orphans::periodic(&self.ctx).then(|| {
                let mut every =
                    tokio::time::interval_at(tokio::time::Instant::now() + orphans::PERIOD, orphans::PERIOD);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                Box::new(every)
            });
            loop {
                tokio::select! {
                    request = control.recv(), if control_open => match request {
                        Some(request) => self.on_control(request),
                        None => control_open = false,
                    },
                    event = source.recv() => match event {
                        Some(event) => {
                            self.shutdown_first(&mut control, &mut control_open);
                            // boxed: the idle manager keeps no room for an orphan clean-up in flight
                            Box::pin(self.on_source(event)).await
                        }
                        None => break,
                    },
                    // a poll, not an `async` block: the idle manager keeps a pointer for it
                    update = std::future::poll_fn(|cx| match statics.as_mut() {
                        Some(rx) => rx.poll_recv(cx),
                        None => std::task::Poll::Ready(None),
                    }), if statics_open => match update {
                        Some(update) => {
                            self.shutdown_first(&mut control, &mut control_open);
                            Box::pin(self.on_static(update)).await
                        }
                        None => statics_open = false,
                    },
                    uid = pleg.recv() => match uid {
                        Some(uid) => self.on_runtime(uid),
                        None => break,
                    },
                    Some(report) = self.reports.recv() => self.on_report(report),
                    () = self.wakes.fired(), if self.wakes.is_set() => self.on_wake(),
                    () = tick(&mut housekeeping), if housekeeping.is_some() => Box::pin(self.housekeeping()).await,
                    changed = node.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        let pending = std::mem::take(&mut self.pending);
                        self.apply_all(pending);
                    }
                }
            }
            // the workers stop with the manager (their containers keep running): those waiting here now, those in
            // a turn when it ends (their report unread)
            self.workers.clear();
        }
    }

    async fn on_source(&mut self, event: PodEvent) {
        match event {
            PodEvent::Apply(pod) if manifest::is_mirror(&pod) => {
                self.statics.to_mirror.send(MirrorMsg::Apply(pod));
            }
            PodEvent::Delete(pod) if manifest::is_mirror(&pod) => {
                self.statics.to_mirror.send(MirrorMsg::Delete(pod));
            }
            PodEvent::Apply(pod) => {
                // the API's pods as the periodic sweep sees them: the last list, kept current by the watch
                if let (Some(live), Some(uid)) = (self.statics.api_live.as_mut(), pod.metadata.uid.as_ref()) {
                    live.insert(uid.clone());
                }
                self.apply_all([*pod]);
            }
            PodEvent::Delete(pod) => {
                if let Some(uid) = pod.metadata.uid.as_deref() {
                    self.finished.remove(uid);
                    if let Some(live) = self.statics.api_live.as_mut() {
                        live.remove(uid);
                    }
                }
                if let Some(uid) = pod.metadata.uid.as_deref()
                    && !self.statics.mirrors.is_static(uid)
                    && let Some(e) = self.workers.get_mut(uid)
                {
                    e.deliver(WorkerMsg::Removed, &self.tracker);
                }
            }
            PodEvent::Snapshot(pods) => {
                let (mirrors, mut pods): (Vec<Pod>, Vec<Pod>) =
                    pods.into_iter().partition(manifest::is_mirror);
                self.statics.to_mirror.send(MirrorMsg::Snapshot(mirrors));
                let api_live: HashSet<String> = pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
                let mut live = api_live.clone();
                live.extend(self.statics.uids().cloned());
                self.finished.retain(|uid| api_live.contains(uid));
                self.statics.api_live = Some(api_live);
                for (uid, e) in &mut self.workers {
                    if !live.contains(&**uid) {
                        e.deliver(WorkerMsg::Removed, &self.tracker);
                    }
                }
                self.pending
                    .retain(|p| p.metadata.uid.as_ref().is_some_and(|u| live.contains(u)));
                if self.statics.unseen == 0 {
                    // every source seen: what pods that are gone held is free for those admitted now
                    let mut keep = live.clone();
                    keep.extend(self.workers.keys().map(|uid| uid.to_string()));
                    orphans::free_devices(&self.ctx, &keep);
                }
                // admission in creation order, like the kubelet
                pods.sort_by(|a, b| a.metadata.creation_timestamp.cmp(&b.metadata.creation_timestamp));
                self.apply_all(pods);
                if self.statics.unseen == 0 {
                    self.cleanup_orphans(&live).await;
                }
            }
        }
    }

    /// Takes a shutdown request queued beside a pod event before that event, so that a pod arriving with
    /// (or after) the request is refused, whichever channel the select happened to poll first.
    fn shutdown_first(
        &mut self,
        control: &mut crate::density::chan::UnboundedReceiver<ManagerControl>,
        open: &mut bool,
    ) {
        if !*open {
            return;
        }
        match control.try_recv() {
            Ok(request) => self.on_control(request),
            Err(crate::density::chan::TryRecvError::Disconnected) => *open = false,
            Err(crate::density::chan::TryRecvError::Empty) => {}
        }
    }

    /// Graceful node shutdown: refuse new pods, stop the running ones group by group, then let the status
    /// manager write what is pending (bounded) and answer.
    fn on_shutdown(&mut self, request: ShutdownRequest) {
        self.shutting_down = true;
        let pods: Vec<_> = self
            .workers
            .iter()
            .map(|(uid, e)| (uid.clone(), e.pod.priority))
            .collect();
        let status = self.ctx.status.clone();
        let orders = self.ctx.reports.clone();
        self.tracker.spawn(async move {
            shutdown::run(request.groups, pods, orders).await;
            let (flushed, wait) = tokio::sync::oneshot::channel();
            status.send(crate::pods::status::StatusMsg::Flush(flushed));
            if tokio::time::timeout(std::time::Duration::from_secs(5), wait)
                .await
                .is_err()
            {
                tracing::warn!("pod statuses not all written after the shutdown");
            }
            let _ = request.done.send(());
        });
    }

    /// A static source's pods now: new ones start, those no longer listed stop; an unchanged pod (same UID,
    /// hence the same manifest) keeps running untouched.
    async fn on_static(&mut self, update: StaticUpdate) {
        let first = !self.statics.by_source.contains_key(&update.source);
        if first {
            self.statics
                .by_source
                .insert(update.source.clone(), HashMap::new());
            self.statics.unseen = self.statics.unseen.saturating_sub(1);
        }
        if let Some(pods) = update.pods {
            let mut now: HashMap<String, Pod> = pods
                .into_iter()
                .filter_map(|p| Some((p.metadata.uid.clone()?, p)))
                .collect();
            let old = self
                .statics
                .by_source
                .get_mut(&update.source)
                .map(std::mem::take)
                .unwrap_or_default();
            let mut start = Vec::new();
            for (uid, pod) in old {
                if let Some(slot) = now.get_mut(&uid) {
                    // keep the first-seen copy (its config.seen)
                    *slot = pod;
                } else if let Some(e) = self.workers.get_mut(uid.as_str()) {
                    tracing::info!(pod = %e.pod.name, source = %update.source, "static pod removed");
                    e.deliver(WorkerMsg::Removed, &self.tracker);
                } else {
                    self.statics.mirrors.remove_static(&uid);
                }
            }
            for (uid, pod) in &now {
                if !self.workers.contains_key(uid.as_str()) {
                    self.statics.mirrors.add_static(uid);
                    start.push(pod.clone());
                }
            }
            self.statics.by_source.insert(update.source.clone(), now);
            for pod in &start {
                tracing::info!(pod = ?pod.metadata.name, source = %update.source, "static pod added");
            }
            self.apply_all(start);
            self.statics.publish();
        }
        if first
            && self.statics.unseen == 0
            && let Some(api_live) = &self.statics.api_live
        {
            let mut live = api_live.clone();
            live.extend(self.statics.uids().cloned());
            self.cleanup_orphans(&live).await;
        }
    }

    fn on_runtime(&mut self, uid: PlegEvent) {
        match uid {
            Some(uid) => {
                if let Some(e) = self.workers.get_mut(uid.as_str()) {
                    e.deliver(WorkerMsg::Runtime, &self.tracker);
                }
            }
            None => {
                for e in self.workers.values_mut() {
                    e.deliver(WorkerMsg::Runtime, &self.tracker);
                }
            }
        }
    }

    fn on_report(&mut self, report: WorkerReport) {
        let (uid, gone, in_api) = match report {
            WorkerReport::Stopped { uid } => (uid, false, false),
            WorkerReport::Gone { uid, in_api } => (uid, true, in_api),
            WorkerReport::Turned(worker) => return self.turned(worker),
            WorkerReport::Probe { uid, update } => {
                if let Some(e) = self.workers.get_mut(&uid) {
                    e.deliver(WorkerMsg::Probe(update), &self.tracker);
                }
                return;
            }
            WorkerReport::Kill { uid, order } => {
                // a worker already gone drops the order, and its waiter sees it as done
                if let Some(e) = self.workers.get_mut(&uid) {
                    e.deliver(WorkerMsg::Kill(order), &self.tracker);
                }
                return;
            }
        };
        let mut released = false;
        if let Some(e) = self.workers.get_mut(&uid) {
            e.stopped = true;
            e.deferred = None;
            if e.admitted {
                e.admitted = false;
                self.committed.remove(&e.allocated);
                if let Some(devices) = &self.ctx.config.devices {
                    devices.release(&uid);
                }
                released = true;
            }
        }
        if released {
            self.retry_deferred();
        }
        if gone {
            self.workers.remove(&uid);
            if in_api && !self.statics.mirrors.is_static(&uid) {
                self.finished.insert(uid.to_string());
            }
            let again = self
                .statics
                .by_source
                .values()
                .find_map(|pods| pods.get(&*uid))
                .cloned();
            match again {
                // the manifest came back while its old pod was stopping: run it again
                Some(pod) => self.apply_all([pod]),
                None => self.statics.mirrors.remove_static(&uid),
            }
        }
    }

    /// Applies `pods` in order; then, when one of them brought back a resize kept from before a restart,
    /// judges the waiting resizes with every pod of the batch counted.
    fn apply_all(&mut self, pods: impl IntoIterator<Item = Pod>) {
        let mut restored = false;
        for pod in pods {
            restored |= self.apply(pod);
        }
        if restored {
            self.retry_deferred();
        }
    }

    /// Applies one pod: an update to its worker, or admission and a new worker. True when the pod was resized
    /// before a restart of node-agent and its resize waits to be judged ([`Self::apply_all`]).
    fn apply(&mut self, pod: Pod) -> bool {
        let node = &self.ctx.config.node_name;
        if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node.as_str()) {
            return false;
        }
        let Some(mut desired) = DesiredPod::from_pod(&pod) else {
            tracing::warn!(pod = ?pod.metadata.name, "pod without uid or spec ignored");
            return false;
        };
        if self.finished.contains(&*desired.uid) {
            return false;
        }
        if let Some(e) = self.workers.get(&*desired.uid) {
            // one allocation of the UID for the pod's life (the table's key): the update's own goes
            if let Some(fresh) = Arc::get_mut(&mut desired) {
                fresh.uid = e.pod.uid.clone();
            }
            let uid = e.pod.uid.clone();
            let desired = self.allocate(&uid, desired);
            if let Some(e) = self.workers.get_mut(&uid) {
                e.pod = desired.clone();
                if let Some(since) = marked_not_ready(&pod) {
                    e.deliver(WorkerMsg::ApiNotReady(since), &self.tracker);
                }
                e.deliver(WorkerMsg::Update(desired), &self.tracker);
            }
            return false;
        }
        let observed = Timeline::observed(desired.created);
        let api_status = pod.status.clone();
        if terminal_phase(&pod) {
            self.spawn(
                desired.clone(),
                WorkerInit {
                    pod: desired,
                    api_status,
                    rejected: None,
                    timeline: None,
                },
                false,
            );
            return false;
        }
        let view = self.ctx.node.get();
        let is_static = self.statics.mirrors.is_static(&desired.uid);
        let verdict: Result<(), Rejection> = match view {
            _ if self.shutting_down && !started_before(&pod) => Err(Rejection {
                reason: shutdown::NOT_ADMITTED_REASON.into(),
                message: shutdown::NOT_ADMITTED_MESSAGE.into(),
            }),
            // static pods run before the node is registered (and while the API server is unreachable)
            None if is_static => Ok(()),
            None => {
                self.pending.push(pod);
                return false;
            }
            Some(_) if started_before(&pod) || desired.deletion.is_some() => Ok(()),
            Some(mut view) => {
                if view.pods <= 0 {
                    view.pods = i64::from(self.ctx.config.max_pods);
                }
                let critical =
                    is_static || desired.priority >= crate::pods::model::spec::SYSTEM_CRITICAL_PRIORITY;
                let sysctls = self
                    .ctx
                    .config
                    .sysctls
                    .as_deref()
                    .unwrap_or_else(|| crate::sysctl::Allowlist::safe());
                admission::admit(
                    &pod,
                    &desired,
                    &view,
                    &self.committed,
                    critical,
                    sysctls,
                    self.ctx.config.apparmor_enabled,
                )
                .and_then(|()| match &self.ctx.config.devices {
                    Some(devices) => admission::admit_devices(devices, &desired),
                    None => Ok(()),
                })
            }
        };
        match verdict {
            Ok(()) => {
                let timeline = (!started_before(&pod)).then(|| {
                    let mut t = observed;
                    t.mark(Stage::Admitted);
                    t
                });
                // a pod resized before a restart of node-agent starts from what was allocated to it
                let restored = self.restored(&pod, &desired);
                let first = restored.clone().unwrap_or_else(|| desired.clone());
                self.committed.add(&first);
                self.spawn(
                    first.clone(),
                    WorkerInit {
                        pod: first,
                        api_status,
                        rejected: None,
                        timeline,
                    },
                    true,
                );
                if restored.is_some() {
                    self.defer_restored(desired);
                    return true;
                }
            }
            Err(rejection) => {
                tracing::info!(pod = %desired.name, namespace = %desired.namespace, reason = %rejection.reason, "pod rejected");
                let msg = rejection.message.clone();
                let ctx = self.ctx.clone();
                ctx.events
                    .pod(&desired, EventType::Warning, event_reason(&rejection.reason), msg);
                let init = WorkerInit {
                    pod: desired.clone(),
                    api_status,
                    rejected: Some(rejection),
                    timeline: None,
                };
                self.spawn(desired, init, false);
            }
        }
        false
    }

    fn spawn(&mut self, desired: Arc<DesiredPod>, init: WorkerInit, admitted: bool) {
        let worker = Box::new(PodWorker::new(self.ctx.clone(), init));
        start_turn(worker, &self.tracker);
        self.workers.insert(
            desired.uid.clone(),
            Entry {
                worker: Slot::Busy(Vec::new()),
                allocated: desired.clone(),
                pod: desired,
                admitted,
                stopped: false,
                deferred: None,
            },
        );
    }

    /// Sweeps what pods that are not in `live` — nor run by a worker, finished, or waiting — left behind
    /// ([`orphans`]).
    async fn cleanup_orphans(&mut self, live: &HashSet<String>) {
        let mut keep = live.clone();
        keep.extend(self.workers.keys().map(|uid| uid.to_string()));
        keep.extend(self.finished.iter().cloned());
        keep.extend(self.pending.iter().filter_map(|p| p.metadata.uid.clone()));
        orphans::free_devices(&self.ctx, &keep);
        self.orphans.sweep(&self.ctx, &keep, &self.tracker).await;
    }

    /// The periodic sweep of a real node: once the API's pods were listed and every static source read.
    async fn housekeeping(&mut self) {
        if self.statics.unseen > 0 {
            return;
        }
        let Some(api_live) = &self.statics.api_live else {
            return;
        };
        let mut live = api_live.clone();
        live.extend(self.statics.uids().cloned());
        self.cleanup_orphans(&live).await;
    }
}

/// The next tick of an interval the node may not have (a poll, not an `async fn`: the idle manager holds this
/// wait, and it is one reference).
fn tick(every: &mut Option<Box<tokio::time::Interval>>) -> impl Future<Output = ()> + '_ {
    std::future::poll_fn(move |cx| match every {
        Some(every) => every.poll_tick(cx).map(|_| ()),
        None => std::task::Poll::Pending,
    })
}

/// The event reason of a rejection (event reasons are `&'static str`; admission's come from a fixed set, and
/// `OutOf<resource>` for the extended resources and huge pages this node has, kept once per name).
fn event_reason(reason: &str) -> &'static str {
    const KNOWN: [&str; 16] = [
        admission::UNEXPECTED_ADMISSION_ERROR,
        "AppArmor",
        "SupplementalGroupsPolicyNotSupported",
        crate::pods::model::fields::REASON,
        "Evicted",
        "SysctlForbidden",
        "PodOSSelectorNodeLabelDoesNotMatch",
        "PodOSNotSupported",
        "NodeShutdown",
        "OutOfcpu",
        "OutOfmemory",
        "OutOfpods",
        "OutOfephemeral-storage",
        "NodeAffinity",
        "NodePorts",
        "TaintToleration",
    ];
    if let Some(known) = KNOWN.into_iter().find(|k| *k == reason) {
        return known;
    }
    if reason
        .strip_prefix("OutOf")
        .and_then(crate::pods::model::node_view::scalar_name)
        .is_some()
    {
        static EXTENDED: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
        let mut seen = EXTENDED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(known) = seen.iter().find(|k| **k == reason) {
            return known;
        }
        // a node has few extended resources: each name is kept for the process's life
        if seen.len() < 64 {
            let kept: &'static str = Box::leak(reason.to_owned().into_boxed_str());
            seen.push(kept);
            return kept;
        }
    }
    admission::UNEXPECTED_ADMISSION_ERROR
}

/// The second since which `pod`'s Ready condition is False while its ContainersReady is True: a status the
/// agent does not write for a pod without readiness gates, written by the node-lifecycle controller when the
/// node was lost.
fn marked_not_ready(pod: &Pod) -> Option<i64> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    let status_of = |type_: &str| conditions.iter().find(|c| c.type_ == type_);
    let ready = status_of("Ready").filter(|c| c.status == "False")?;
    status_of("ContainersReady").filter(|c| c.status == "True")?;
    Some(ready.last_transition_time.as_ref()?.0.as_second())
}
