//! The per-pod prober task: one timer per (running container, probe), the kubelet's semantics.
//!
//! * A probe first runs `initialDelaySeconds` after its container started, then every `periodSeconds`.
//! * Startup gates the others: liveness and readiness do not run until the container's startup probe has
//!   passed; a passed startup probe is not run again for that container.
//! * `successThreshold` consecutive successes pass, `failureThreshold` consecutive failures fail; errors that
//!   are not the container's fault ([`ProbeOutcome::Unknown`]) change nothing.
//! * Every failure records an `Unhealthy` event; a result is sent to the pod worker (through the pod manager, as
//!   the kubelet's sync loop passes results on) only when it changes. A failed liveness or startup result is sent
//!   once and the probe holds until the container is replaced.
//! * Readiness starts as failed, startup as not passed — unless seeded from the status the API server holds for
//!   the same container id (an agent restart must not flip a ready pod to unready).

use std::sync::Arc;

use futures::future::join_all;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::density::watch;
use crate::pods::actions::action::{self, Where};
use crate::pods::events::EventType;
use crate::pods::model::spec::{DesiredPod, ProbeSpec};
use crate::pods::probes::metrics::PodProbeMetrics;
use crate::pods::probes::{ProbeKind, ProbeOutcome, ProbeUpdate, Seeds};
use crate::pods::worker::AgentCtx;
use crate::pods::worker::WorkerReport;

/// A container the prober should watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Running {
    pub name: String,
    pub id: String,
    pub started: Instant,
}

/// What the worker tells the prober: the pod IP and its running containers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Targets {
    pub pod_ip: String,
    pub running: Vec<Running>,
}

struct Entry {
    container: String,
    id: String,
    kind: ProbeKind,
    next: Instant,
    ok_streak: u32,
    fail_streak: u32,
    result: Option<bool>,
    hold: bool,
}

pub(crate) struct Prober {
    ctx: Arc<AgentCtx>,
    pod: Arc<DesiredPod>,
    targets: watch::Receiver<Targets>,
    seeds: Seeds,
    entries: Vec<Entry>,
    pod_ip: String,
    /// The pod's `/metrics/probes` series, registered on the first probe run.
    series: Option<PodProbeMetrics>,
}

fn spec_of<'a>(pod: &'a DesiredPod, container: &str, kind: ProbeKind) -> Option<&'a ProbeSpec> {
    let c = pod.container(container)?;
    match kind {
        ProbeKind::Liveness => c.liveness.as_deref(),
        ProbeKind::Readiness => c.readiness.as_deref(),
        ProbeKind::Startup => c.startup.as_deref(),
    }
}

impl Prober {
    pub(crate) fn new(
        ctx: Arc<AgentCtx>,
        pod: Arc<DesiredPod>,
        targets: watch::Receiver<Targets>,
        seeds: Seeds,
    ) -> Self {
        Self {
            ctx,
            pod,
            targets,
            seeds,
            entries: Vec::new(),
            pod_ip: String::new(),
            series: None,
        }
    }

    fn rebuild(&mut self) {
        let targets = self.targets.borrow_and_update().clone();
        self.pod_ip = targets.pod_ip;
        let now = Instant::now();
        let mut entries = Vec::new();
        for r in &targets.running {
            for kind in [ProbeKind::Startup, ProbeKind::Liveness, ProbeKind::Readiness] {
                let Some(spec) = spec_of(&self.pod, &r.name, kind) else {
                    continue;
                };
                if let Some(i) = self.entries.iter().position(|e| e.id == r.id && e.kind == kind) {
                    entries.push(self.entries.swap_remove(i));
                    continue;
                }
                let seeded = self.seeds.get(&r.id).and_then(|(ready, started)| match kind {
                    ProbeKind::Readiness => ready.then_some(true),
                    ProbeKind::Startup => started.then_some(true),
                    ProbeKind::Liveness => None,
                });
                entries.push(Entry {
                    container: r.name.clone(),
                    id: r.id.clone(),
                    kind,
                    next: (r.started + spec.initial_delay).max(now),
                    ok_streak: 0,
                    fail_streak: 0,
                    result: seeded,
                    hold: false,
                });
            }
        }
        self.entries = entries;
    }

    fn startup_passed(&self, id: &str) -> bool {
        self.entries
            .iter()
            .filter(|e| e.id == id && e.kind == ProbeKind::Startup)
            .all(|e| e.result == Some(true))
    }

    fn active(&self, e: &Entry) -> bool {
        !e.hold
            && match e.kind {
                ProbeKind::Startup => e.result != Some(true),
                _ => self.startup_passed(&e.id),
            }
    }

    fn next_due(&self) -> Option<Instant> {
        self.entries
            .iter()
            .filter(|e| self.active(e))
            .map(|e| e.next)
            .min()
    }

    /// Runs until `cancel` fires or the worker goes away.
    pub(crate) fn run(mut self, cancel: CancellationToken) -> impl Future<Output = ()> + Send + 'static {
        async move {
            self.rebuild();
            loop {
                let due = self.next_due();
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    changed = self.targets.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        self.rebuild();
                    }
                    _ = sleep_until(due) => self.probe_due().await,
                }
            }
        }
    }

    async fn probe_due(&mut self) {
        let now = Instant::now();
        let due: Vec<usize> = (0..self.entries.len())
            .filter(|&i| self.active(&self.entries[i]) && self.entries[i].next <= now)
            .collect();
        let runs = due.iter().filter_map(|&i| {
            let e = &self.entries[i];
            let spec = spec_of(&self.pod, &e.container, e.kind)?;
            let at = Where {
                pod: &self.pod,
                container: &e.container,
                container_id: &e.id,
                pod_ip: &self.pod_ip,
            };
            let ctx = &self.ctx;
            Some(async move {
                let began = Instant::now();
                let outcome = action::run(ctx, at, &spec.action, spec.timeout).await;
                (i, outcome, began.elapsed())
            })
        });
        let outcomes = join_all(runs).await;
        for (i, outcome, took) in outcomes {
            self.record(i, &outcome, took);
            self.apply(i, outcome, now);
        }
    }

    fn record(&mut self, i: usize, outcome: &ProbeOutcome, took: std::time::Duration) {
        let e = &self.entries[i];
        let series = self
            .series
            .get_or_insert_with(|| self.ctx.probe_metrics.pod(self.pod.clone()));
        series.record(&e.container, e.kind, outcome, took);
    }

    fn apply(&mut self, i: usize, outcome: ProbeOutcome, started: Instant) {
        let Some(spec) = spec_of(&self.pod, &self.entries[i].container, self.entries[i].kind).cloned() else {
            return;
        };
        let e = &mut self.entries[i];
        e.next = (e.next + spec.period).max(started);
        let kind = e.kind;
        let label = match &outcome {
            ProbeOutcome::Success | ProbeOutcome::Warning(_) => "successful",
            ProbeOutcome::Failure(_) => "failed",
            ProbeOutcome::Unknown(_) => "unknown",
        };
        self.ctx.metrics.probe(kind.as_str(), label);
        if let ProbeOutcome::Warning(output) = &outcome {
            let message = format!("{} probe warning: {output}", kind.as_str());
            self.ctx.events.container(
                &self.pod,
                &e.container,
                EventType::Warning,
                "ProbeWarning",
                message,
            );
        }
        let new = match outcome {
            ProbeOutcome::Success | ProbeOutcome::Warning(_) => {
                e.ok_streak += 1;
                e.fail_streak = 0;
                (e.ok_streak >= spec.success_threshold).then_some(true)
            }
            ProbeOutcome::Failure(output) => {
                e.fail_streak += 1;
                e.ok_streak = 0;
                let message = format!("{} probe failed: {output}", kind.as_str());
                self.ctx
                    .events
                    .container(&self.pod, &e.container, EventType::Warning, "Unhealthy", message);
                (e.fail_streak >= spec.failure_threshold).then_some(false)
            }
            ProbeOutcome::Unknown(error) => {
                tracing::debug!(pod = %self.pod.name, container = %e.container, %error, "probe could not run");
                None
            }
        };
        let Some(ok) = new else { return };
        if e.result == Some(ok) {
            return;
        }
        e.result = Some(ok);
        if !ok && kind != ProbeKind::Readiness {
            e.hold = true;
        }
        let update = ProbeUpdate {
            container_id: e.id.clone(),
            container: e.container.clone(),
            kind,
            ok,
        };
        if kind == ProbeKind::Startup && ok {
            let id = update.container_id.clone();
            for other in self
                .entries
                .iter_mut()
                .filter(|o| o.id == id && o.kind != ProbeKind::Startup)
            {
                other.next = other.next.max(started);
            }
        }
        // to the pod's worker through the pod manager, as the kubelet's sync loop passes probe results on
        let _ = self.ctx.reports.send(WorkerReport::Probe {
            uid: self.pod.uid.clone(),
            update: Box::new(update),
        });
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
