//! The pod worker: one per pod UID, so syncs of one pod never overlap.
//!
//! A worker moves through the kubelet's three states:
//! * **syncing** — make the runtime match the spec ([`sync`](crate::pods::worker::sync)): sandbox, init containers,
//!   sidecars, app containers, restarts with back-off, probes; report status;
//! * **terminating** — the pod is being deleted, was removed, or finished for good: stop every container
//!   (preStop, grace period) and the sandbox ([`kill`](crate::pods::actions::kill)); report the final status;
//! * **terminated** — nothing runs. Once the object is being deleted (or is gone): remove containers and
//!   sandbox, ask the status manager to delete the object, tell the manager, and end.
//!
//! A worker runs in turns: the pod manager holds it (boxed, in its table) while it waits, hands it its input and
//! spawns a task for one turn — a step, and more at once while a step changed the state — and the turn hands
//! the worker back ([`WorkerReport::Turned`]) with when to wake it. Inputs are coalesced: any number of
//! updates, runtime events and probe results that arrive while a turn runs cause one more step, after it.
//! Besides inputs, a worker wakes for a back-off expiring, after an error (with back-off) and every
//! `syncFrequency` (jittered) while syncing: the manager's one timer for all of the agent's workers hands it
//! [`WorkerMsg::Wake`] then. So a waiting pod costs its worker's state and its entry in the manager's table —
//! no task, channel or timer. What a worker holds between turns, and the messages it takes, are in
//! `worker_state`.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use crate::backoff::{Backoff, BackoffPolicy};
use crate::density::periodic::next_tick;
use crate::pods::actions::images::Images;
use crate::pods::actions::kill;
use crate::pods::actions::volumes;
use crate::pods::probes::ProbeResults;
use crate::pods::runtime::observed::{Reread, RuntimeView};
use crate::pods::status::{Phase, StatusMsg};
use crate::pods::worker::AgentCtx;
use crate::pods::worker::WorkerReport;
use crate::pods::worker::disruption::KillCause;
pub(crate) use crate::pods::worker::state::{KillOrder, PodWorker, WorkerInit, WorkerMsg};
use crate::pods::worker::state::{LastReport, State};

impl PodWorker {
    pub(crate) fn new(ctx: Arc<AgentCtx>, init: WorkerInit) -> Self {
        let api_phase = init
            .api_status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .and_then(Phase::parse);
        let start_second = init
            .api_status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map_or_else(Timestamp::now, |t| t.0)
            .as_second();
        let mut probes = ProbeResults::default();
        if let Some(status) = &init.api_status {
            for (id, (ready, started)) in crate::pods::probes::seeds(status) {
                probes.seed(&id, ready, started);
            }
            ctx.status.send(StatusMsg::Seed {
                uid: init.pod.uid.clone(),
                status: Box::new(status.clone()),
            });
        }
        let terminal = api_phase.filter(|p| p.is_terminal());
        let state = if init.rejected.is_some() {
            State::Syncing
        } else if terminal.is_some() {
            // the pod already finished (before an agent restart): make sure nothing runs, never restart it
            State::Terminating
        } else {
            State::Syncing
        };
        Self {
            ctx,
            pod: init.pod,
            state,
            removed: false,
            rejected: init.rejected.map(Box::new),
            view: RuntimeView::default(),
            probes,
            waiting: None,
            restarts: None,
            images: Images::default(),
            start_second,
            last: init.api_status.as_ref().map(LastReport::of),
            last_terminal: init
                .api_status
                .as_ref()
                .is_some_and(crate::pods::worker::state::is_terminal),
            terminal,
            timeline: init.timeline.map(Box::new),
            prober: None,
            wake_at: None,
            errors: None,
            stopped_reported: false,
            counted_running: false,
            stepped: false,
            stop: None,
            volumes: None,
            resize: None,
        }
    }

    /// Takes one input (the manager hands them over between turns; the next turn acts on them).
    pub(crate) fn handle(&mut self, msg: WorkerMsg) {
        match msg {
            WorkerMsg::Update(pod) => {
                self.note_resize(&pod);
                self.pod = pod;
            }
            WorkerMsg::Removed => self.removed = true,
            WorkerMsg::Runtime | WorkerMsg::Wake => {}
            WorkerMsg::ApiNotReady(since) => {
                if let Some(last) = self.last.as_mut()
                    && last
                        .previous
                        .ready()
                        .is_some_and(|(ready, at)| ready && since > at)
                {
                    // what the API holds is not what was last written: the next report is written again
                    last.fingerprint = 0;
                    self.ctx.status.send(StatusMsg::Overwritten {
                        uid: self.pod.uid.clone(),
                    });
                }
            }
            WorkerMsg::Probe(update) => self.probes.apply(&update),
            WorkerMsg::Kill(order) => {
                let KillOrder {
                    grace_secs,
                    cause,
                    done,
                } = *order;
                let stop = self.stop.get_or_insert_default();
                stop.done.push(done);
                if self.state == State::Syncing {
                    stop.order = Some((grace_secs, cause));
                    self.state = State::Terminating;
                }
            }
        }
        if (self.removed || self.pod.deletion.is_some()) && self.state == State::Syncing {
            self.state = State::Terminating;
        }
    }

    /// The pod's UID (the manager's key for the worker).
    pub(crate) fn uid(&self) -> &Arc<str> {
        &self.pod.uid
    }

    /// The worker ended (the pod is gone; it told the manager so): nothing more for it to do.
    pub(crate) fn ended(&self) -> bool {
        self.state == State::Exit
    }

    /// When the manager is to wake the worker, if nothing else does first.
    pub(crate) fn wake_at(&self) -> Option<Instant> {
        self.wake_at
    }

    /// One turn: a step, and another at once while a step changed the state (e.g. syncing → terminating);
    /// then the worker goes back to the manager ([`WorkerReport::Turned`]) with, in `wake_at`, the next
    /// periodic sync (while syncing) or a back-off's end, whichever comes first.
    pub(crate) fn turn(mut self: Box<Self>) -> impl Future<Output = ()> + Send + 'static {
        async move {
            loop {
                self.wake_at = None;
                let created = !self.stepped && self.timeline.is_some();
                // boxed: the turn's task stays small while its step waits
                let (result, before, took) = Box::pin(self.timed_step()).await;
                let op = if !self.stepped {
                    if created { "create" } else { "sync" }
                } else if self.state == State::Syncing {
                    "sync"
                } else {
                    "update"
                };
                self.stepped = true;
                self.ctx.metrics.worker_sync(op, took);
                let period = self.ctx.config.sync_frequency;
                let resync_at = next_tick(Instant::now(), period, 0.5);
                match result {
                    Ok(()) => {
                        self.errors = None;
                        // a state change (e.g. syncing -> terminating) is acted on at once
                        if self.state != before && self.state != State::Exit {
                            continue;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(pod = %self.pod.name, namespace = %self.pod.namespace, %error, "pod sync failed, will retry");
                        let retry = Instant::now()
                            + Backoff::in_slot(&mut self.errors, BackoffPolicy::api_retry()).next_delay();
                        self.wake_at = Some(self.wake_at.map_or(retry, |w| w.min(retry)));
                    }
                }
                let resync = (self.state == State::Syncing).then_some(resync_at);
                self.wake_at = [self.wake_at, resync].into_iter().flatten().min();
                break;
            }
            // the manager gone (the agent stopping) drops the report, and the worker with it
            let reports = self.ctx.reports.clone();
            let _ = reports.send(WorkerReport::Turned(self));
        }
    }

    /// One step, with the state it began in and how long it took.
    async fn timed_step(&mut self) -> (Result<(), runtime_api::RuntimeError>, State, Duration) {
        let began = Instant::now();
        let before = self.state;
        let result = self.step().await;
        (result, before, began.elapsed())
    }

    async fn step(&mut self) -> Result<(), runtime_api::RuntimeError> {
        match self.state {
            State::Syncing => self.sync_running().await,
            State::Terminating => self.terminate().await,
            State::Terminated => self.finish().await,
            State::Exit => Ok(()),
        }
    }

    /// Stops everything, reports the final status.
    async fn terminate(&mut self) -> Result<(), runtime_api::RuntimeError> {
        self.stop_prober();
        self.view
            .refresh(self.ctx.view_source(), &self.pod.uid, Reread::Kept)
            .await?;
        let grace_secs = match self.killed() {
            // the pod's own grace period when shorter, as the kubelet's shutdown manager does
            Some((limit, KillCause::Shutdown)) => self.pod.grace_secs().min(*limit),
            // the eviction manager's override
            Some((grace, KillCause::Evicted { .. })) => *grace,
            Some((_, KillCause::Deadline)) | None => self.pod.grace_secs(),
        };
        let grace = Duration::from_secs(u64::try_from(grace_secs).unwrap_or(0));
        kill::kill_pod(&self.ctx, &self.pod, &self.view, grace).await?;
        // the claims are released once the containers have stopped and before the final status is reported,
        // so the claim's deallocation never races a container still using its devices
        if let Some(dra) = &self.ctx.config.dra
            && let Err(e) = dra.unprepare(&self.pod.uid).await
        {
            tracing::warn!(error = %e, "releasing the pod's resource claims");
            return Err(runtime_api::RuntimeError::unavailable(e.0));
        }
        // the final view: every exited container's status read again, as the kubelet reads the runtime afresh
        // for a terminating pod's last status
        self.view
            .refresh(self.ctx.view_source(), &self.pod.uid, Reread::Exited)
            .await?;
        if self.killed().is_some() && self.terminal.is_none() {
            self.terminal = Some(Phase::Failed);
        }
        if self.terminal.is_none() {
            // stopped on request: the phase follows how the app containers ended
            let ok = self
                .pod
                .containers
                .iter()
                .all(|c| self.view.latest(&c.name).is_none_or(|r| r.succeeded()));
            self.terminal = Some(if ok { Phase::Succeeded } else { Phase::Failed });
        }
        self.waiting = None;
        self.state = State::Terminated;
        self.finish().await
    }

    /// Terminated: report the final status; remove everything once the object is going away.
    async fn finish(&mut self) -> Result<(), runtime_api::RuntimeError> {
        let first = !self.stopped_reported;
        if first {
            self.stopped_reported = true;
            let _ = self.ctx.reports.send(WorkerReport::Stopped {
                uid: self.pod.uid.clone(),
            });
        }
        if self.counted_running {
            self.counted_running = false;
            self.ctx.metrics.running_pods(-1);
        }
        // The final status comes from the view taken right after the containers stopped (every exited
        // container read again there, so an exit's reason the runtime settled late, e.g. `OOMKilled`, is in
        // it), once: a terminal status does not change, and later views lose the containers as they are
        // removed (a retry after a failed removal would otherwise report them as never started).
        // A pod whose terminal status is already written (by this worker, or before an agent restart) keeps it:
        // its containers may be gone from the runtime by now.
        let reported_terminal = self.last.is_some() && self.last_terminal;
        if first && self.rejected.is_none() && !self.removed && !reported_terminal {
            self.report_status();
        }
        if first {
            volumes::release(&self.ctx, &self.pod.uid).await;
            // its volumes are let go: so are the objects only it named
            self.ctx.objects.release_pod(&self.pod.uid);
        }
        for done in self.stop.iter_mut().flat_map(|s| s.done.drain(..)) {
            let _ = done.send(());
        }
        if !(self.removed || self.pod.deletion.is_some()) {
            return Ok(());
        }
        self.view
            .refresh(self.ctx.view_source(), &self.pod.uid, Reread::Kept)
            .await?;
        kill::remove_pod(&self.ctx, &self.view).await?;
        let uid = self.pod.uid.clone();
        volumes::cleanup(&self.ctx, &uid).await;
        if let Some(cgroups) = &self.ctx.config.layout.cgroups {
            cgroups.remove(&self.pod).await;
        }
        if self.removed {
            self.ctx.status.send(StatusMsg::Forget { uid: uid.clone() });
        } else {
            self.ctx.status.send(StatusMsg::Delete {
                uid: uid.clone(),
                namespace: self.pod.namespace.clone(),
                name: self.pod.name.clone(),
            });
        }
        let _ = self.ctx.reports.send(WorkerReport::Gone {
            uid,
            in_api: !self.removed,
        });
        self.state = State::Exit;
        Ok(())
    }
}
