//! Lifecycle tests under paused tokio time: the real pod manager, workers, prober and PLEG against the
//! in-memory fake runtime, with the status manager replaced by a recorder of what it would write.

mod scenarios;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use cri_fake::{FakeConfig, FakeRuntime};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use runtime_api::{Runtime, cri};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::PodConfig;
use super::admission::NodeView;
use super::context::AgentCtx;
use super::events::{MemoryEvents, Recorder};
use super::manager::PodManager;
use super::metrics::PodMetrics;
use super::pleg::Pleg;
use super::probes::{FnProbes, ProbeOutcome};
use super::source::PodEvent;
use super::spec::Action;
use super::status::{StatusHandle, StatusMsg};

pub(super) fn fake_probes(
    fake: FakeRuntime,
) -> FnProbes<impl Fn(&super::ProbeTarget<'_>, &Action) -> ProbeOutcome> {
    FnProbes::new(move |t, action| {
        let target = match action {
            Action::Http(h) => cri_fake::ProbeTarget::Http {
                port: h.port,
                path: &h.path,
            },
            Action::Tcp { port, .. } => cri_fake::ProbeTarget::Tcp { port: *port },
            Action::Grpc { port, service } => cri_fake::ProbeTarget::Grpc { port: *port, service },
            other => return ProbeOutcome::Unknown(format!("{other:?} is not a network action")),
        };
        match fake.probe_result(t.container_id, target) {
            Ok(true) => ProbeOutcome::Success,
            Ok(false) => ProbeOutcome::Failure("scripted failure".into()),
            Err(e) => ProbeOutcome::Unknown(e.to_string()),
        }
    })
}

pub(super) fn node_view() -> NodeView {
    NodeView {
        name: "n1".into(),
        cpu_milli: 4000,
        memory: 8 << 30,
        ephemeral: 0,
        pods: 110,
        host_ips: vec!["127.0.0.1".into()],
        ..Default::default()
    }
}

/// A pod bound to n1 with `containers`, `annotations` and extra spec fields.
pub(super) fn pod(name: &str, spec: serde_json::Value, annotations: serde_json::Value) -> Pod {
    let mut spec = spec;
    spec["nodeName"] = json!("n1");
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "generation": 1,
                      "creationTimestamp": "2024-01-01T00:00:00Z", "annotations": annotations},
        "spec": spec
    }))
    .unwrap()
}

pub(super) struct Harness {
    pub runtime: FakeRuntime,
    pub feed: mpsc::Sender<PodEvent>,
    pub statuses: HashMap<String, PodStatus>,
    pub deleted: Vec<String>,
    pub events: Arc<MemoryEvents>,
    status_rx: mpsc::UnboundedReceiver<StatusMsg>,
    cancel: CancellationToken,
    tracker: TaskTracker,
    _node: watch::Sender<Option<NodeView>>,
    pub t0: Instant,
}

impl Harness {
    pub(super) fn start() -> Self {
        let runtime = FakeRuntime::new(FakeConfig {
            pod_cidr: Some("10.128.1.0/24".into()),
            images: vec!["registry.k8s.io/pause:3.10".into()],
            seed: Some(7),
            ..Default::default()
        });
        Self::start_with(runtime)
    }

    pub(super) fn start_with(runtime: FakeRuntime) -> Self {
        let events = Arc::new(MemoryEvents::default());
        let metrics = Arc::new(PodMetrics::new());
        let (status, status_rx) = StatusHandle::channel();
        let (node_tx, node_rx) = watch::channel(Some(node_view()));
        let ctx = Arc::new(AgentCtx {
            config: PodConfig::new("n1"),
            runtime: Arc::new(runtime.clone()),
            runtime_type: "cri-fake".into(),
            probes: Arc::new(fake_probes(runtime.clone())),
            events: Recorder::new(events.clone()),
            metrics: metrics.clone(),
            status,
            node: node_rx,
        });
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        let (pleg_tx, pleg_rx) = mpsc::unbounded_channel();
        tracker.spawn(Pleg::new(ctx.clone(), pleg_tx).run(cancel.clone()));
        let (feed, source) = mpsc::channel(16);
        tracker.spawn(PodManager::new(ctx, tracker.clone(), cancel.clone()).run(source, pleg_rx));
        Self {
            runtime,
            feed,
            statuses: HashMap::new(),
            deleted: Vec::new(),
            events,
            status_rx,
            cancel,
            tracker,
            _node: node_tx,
            t0: Instant::now(),
        }
    }

    /// Stops every task (containers keep running in the fake runtime).
    pub(super) async fn stop(self) -> FakeRuntime {
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
        self.runtime
    }

    pub(super) async fn send(&self, event: PodEvent) {
        self.feed.send(event).await.unwrap();
    }

    fn pump(&mut self) {
        while let Ok(msg) = self.status_rx.try_recv() {
            match msg {
                StatusMsg::Set { uid, status, .. } => {
                    self.statuses.insert(uid, *status);
                }
                StatusMsg::Delete { uid, .. } => self.deleted.push(uid),
                StatusMsg::Seed { .. } | StatusMsg::Forget { .. } => {}
            }
        }
    }

    /// Advances time in 50 ms steps until `pred` holds; returns the time since start. Panics after `max`.
    pub(super) async fn until(
        &mut self,
        what: &str,
        max: Duration,
        pred: impl Fn(&Self) -> bool,
    ) -> Duration {
        let deadline = Instant::now() + max;
        loop {
            self.pump();
            if pred(self) {
                return self.t0.elapsed();
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; statuses: {:#?}",
                self.statuses
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(super) fn status(&self, name: &str) -> Option<&PodStatus> {
        self.statuses.get(&format!("uid-{name}"))
    }

    pub(super) fn phase(&self, name: &str) -> Option<&str> {
        self.status(name)?.phase.as_deref()
    }

    pub(super) fn condition(&self, name: &str, ty: &str) -> Option<bool> {
        let c = self
            .status(name)?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == ty)?;
        Some(c.status == "True")
    }

    pub(super) fn restart_count(&self, pod: &str, container: &str) -> Option<i32> {
        let s = self.status(pod)?;
        s.container_statuses
            .iter()
            .chain(s.init_container_statuses.iter())
            .flatten()
            .find(|c| c.name == container)
            .map(|c| c.restart_count)
    }

    pub(super) fn waiting_reason(&self, pod: &str, container: &str) -> Option<String> {
        let s = self.status(pod)?;
        let c = s
            .container_statuses
            .iter()
            .flatten()
            .find(|c| c.name == container)?;
        c.state.as_ref()?.waiting.as_ref()?.reason.clone()
    }

    /// Every container the runtime holds (any state): `(name, attempt, state)`.
    pub(super) async fn containers(&self) -> Vec<(String, u32, i32, String)> {
        let list = self
            .runtime
            .list_containers(cri::ListContainersRequest::default())
            .await
            .unwrap();
        let mut v: Vec<_> = list
            .containers
            .into_iter()
            .map(|c| {
                let m = c.metadata.unwrap_or_default();
                (m.name, m.attempt, c.state, c.id)
            })
            .collect();
        v.sort();
        v
    }

    pub(super) fn event_reasons(&self) -> Vec<(&'static str, String)> {
        self.events.reasons()
    }
}
