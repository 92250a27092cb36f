//! Lifecycle tests under paused tokio time: the real pod manager, workers, prober and PLEG against the
//! in-memory fake runtime, with the status manager replaced by a recorder of what it would write.

mod admitted;
mod evict;
mod first_pod;
mod footprint;
mod gc;
mod orphans;
mod probes;
mod scenarios;
mod security;
mod shutdown;
mod static_pods;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use cri_fake::{FakeConfig, FakeRuntime};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use runtime_api::{Runtime, cri};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::pods::PodConfig;
use crate::pods::actions::context::ActionCtx;
use crate::pods::events::{MemoryEvents, Recorder};
use crate::pods::manager::{PodManager, Statics};
use crate::pods::metrics::PodMetrics;
use crate::pods::model::node_view::NodeView;
use crate::pods::probes::{NetTarget, ScriptedProbes};
use crate::pods::source::PodEvent;
use crate::pods::static_pods::mirror::{Desired, MirrorMsg};
use crate::pods::static_pods::{Mirrors, StaticUpdate};
use crate::pods::status::{StatusHandle, StatusMsg};
use crate::pods::worker::AgentCtx;
use crate::pods::worker::pleg::Pleg;

use crate::density::watch;

/// Network probes answered by `fake`'s script.
pub(super) fn fake_probes(
    fake: FakeRuntime,
) -> ScriptedProbes<impl Fn(&str, NetTarget<'_>) -> Result<bool, String>> {
    ScriptedProbes::new(move |id, target| {
        let target = match target {
            NetTarget::Http { port, path } => cri_fake::ProbeTarget::Http { port, path },
            NetTarget::Tcp { port } => cri_fake::ProbeTarget::Tcp { port },
            NetTarget::Grpc { port, service } => cri_fake::ProbeTarget::Grpc { port, service },
        };
        fake.probe_result(id, target).map_err(|e| e.to_string())
    })
}

pub(super) fn node_view() -> NodeView {
    NodeView {
        name: "n1".into(),
        cpu_milli: 4000,
        memory: 8 << 30,
        ephemeral: 0,
        pods: 10_000,
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

/// A sandbox `runtime` runs for pod `name` (UID `uid-<name>`) that no pod event made: what an agent's
/// previous run left behind.
pub(super) async fn leftover_sandbox(runtime: &FakeRuntime, name: &str) {
    crate::testing::run_sandbox(runtime, name, &format!("uid-{name}")).await;
}

pub(super) struct Harness {
    pub runtime: FakeRuntime,
    pub feed: crate::density::chan::Sender<PodEvent>,
    /// Static pod sets (no source is waited for before orphan cleanup).
    pub statics: mpsc::Sender<StaticUpdate>,
    /// The static pods that should have mirror pods.
    pub desired: watch::Receiver<Desired>,
    /// Mirror pods the manager passed on instead of running them.
    pub mirror_rx: crate::density::chan::UnboundedReceiver<MirrorMsg>,
    /// Graceful node shutdown requests and pod queries.
    pub control: crate::density::chan::UnboundedSender<crate::pods::ManagerControl>,
    pub statuses: HashMap<String, PodStatus>,
    /// How many statuses were reported (any pod).
    pub sets: usize,
    pub deleted: Vec<String>,
    /// The UID of every status and deletion sent to the status writer, in order (as sent: shared or not).
    pub uids: Vec<Arc<str>>,
    pub events: Arc<MemoryEvents>,
    /// The pod series of the node's `/metrics`.
    pub metrics: Arc<PodMetrics>,
    /// The node's `/metrics/probes` series.
    pub probe_metrics: Arc<crate::pods::ProbeMetrics>,
    status_rx: crate::pods::status::StatusReceiver,
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
        Self::start_on(runtime.clone(), Arc::new(runtime))
    }

    /// Starts on `cri` (the fake runtime itself, or a wrapper around it).
    pub(super) fn start_on(runtime: FakeRuntime, cri: Arc<dyn Runtime>) -> Self {
        Self::start_configured(runtime, cri, PodConfig::new("n1"))
    }

    /// [`Harness::start_on`] with `config` (for node n1).
    pub(super) fn start_configured(runtime: FakeRuntime, cri: Arc<dyn Runtime>, config: PodConfig) -> Self {
        let events = Arc::new(MemoryEvents::default());
        let metrics = Arc::new(PodMetrics::new());
        let probe_metrics = Arc::new(crate::pods::ProbeMetrics::default());
        let pulls = config.pulls;
        let (status, status_rx) = StatusHandle::channel();
        let (node_tx, node_rx) = watch::channel(Some(node_view()));
        let (reports, reports_rx) = crate::density::chan::unbounded_channel();
        let tracker = TaskTracker::new();
        let ctx = Arc::new(AgentCtx {
            actions: ActionCtx {
                config,
                runtime: cri,
                runtime_type: "cri-fake".into(),
                probes: Arc::new(fake_probes(runtime.clone())),
                events: Recorder::new(events.clone()),
                metrics: metrics.clone(),
                probe_metrics: probe_metrics.clone(),
                status,
                node: node_rx.into(),
                objects: Arc::new(crate::pods::actions::objects::NoObjects),
                pulls: Arc::new(crate::pods::actions::pull_gate::PullGate::new(pulls)),
            },
            reports,
            tasks: tracker.clone(),
        });
        let cancel = CancellationToken::new();
        let (pleg_tx, pleg_rx) = crate::density::chan::unbounded_channel();
        tracker.spawn(Pleg::new(ctx.clone(), pleg_tx).run(cancel.clone().cancelled_owned()));
        let (feed, source) = crate::density::chan::channel(16);
        let (statics, statics_rx) = mpsc::channel(4);
        let (desired_tx, desired) = watch::channel(Default::default());
        let (mirror_tx, mirror_rx) = crate::density::chan::unbounded_channel();
        let manager_statics = Statics::new(
            0,
            Mirrors::default(),
            desired_tx,
            crate::pods::static_pods::mirror::MirrorLink::Running(mirror_tx),
        );
        let (control, control_rx) = crate::density::chan::unbounded_channel();
        tracker.spawn(
            PodManager::new(ctx, reports_rx, tracker.clone(), manager_statics).run(
                None,
                source,
                Some(statics_rx),
                pleg_rx,
                control_rx,
            ),
        );
        Self {
            runtime,
            feed,
            statics,
            desired,
            mirror_rx,
            control,
            statuses: HashMap::new(),
            sets: 0,
            deleted: Vec::new(),
            uids: Vec::new(),
            events,
            metrics,
            probe_metrics,
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

    pub(super) fn pump(&mut self) {
        while let Ok(msg) = self.status_rx.try_recv() {
            match *msg {
                StatusMsg::Set { uid, status, .. } => {
                    self.sets += 1;
                    self.statuses.insert(uid.to_string(), *status);
                    self.uids.push(uid);
                }
                StatusMsg::Delete { uid, .. } => {
                    self.deleted.push(uid.to_string());
                    self.uids.push(uid);
                }
                StatusMsg::Flush(done) => {
                    let _ = done.send(());
                }
                StatusMsg::Seed { .. }
                | StatusMsg::Forget { .. }
                | StatusMsg::Overwritten { .. }
                | StatusMsg::MirrorChanged { .. } => {}
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

/// The fake runtime without an event stream (like containerd 1.6): the agent must fall back to relisting.
/// Given an [`OomSeenLate`], it reports an OOM-killed container as `Error` (exit 137) the first time its
/// status is asked for after its exit, and as `OOMKilled` after that: containerd 1.6 when it handles a
/// container's exit before the kernel's OOM event.
#[derive(Clone)]
pub(super) struct NoEventStream(pub FakeRuntime, pub Option<Arc<OomSeenLate>>);

/// The containers whose late OOM reason was held back once (see [`NoEventStream`]).
#[derive(Default)]
pub(super) struct OomSeenLate(std::sync::Mutex<std::collections::HashSet<String>>);

impl OomSeenLate {
    /// How many containers were first reported as `Error`.
    pub(super) fn held_back(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

#[async_trait::async_trait]
impl Runtime for NoEventStream {
    async fn version(&self, req: cri::VersionRequest) -> runtime_api::Result<cri::VersionResponse> {
        self.0.version(req).await
    }
    async fn status(&self, req: cri::StatusRequest) -> runtime_api::Result<cri::StatusResponse> {
        self.0.status(req).await
    }
    async fn run_pod_sandbox(
        &self,
        req: cri::RunPodSandboxRequest,
    ) -> runtime_api::Result<cri::RunPodSandboxResponse> {
        self.0.run_pod_sandbox(req).await
    }
    async fn stop_pod_sandbox(
        &self,
        req: cri::StopPodSandboxRequest,
    ) -> runtime_api::Result<cri::StopPodSandboxResponse> {
        self.0.stop_pod_sandbox(req).await
    }
    async fn remove_pod_sandbox(
        &self,
        req: cri::RemovePodSandboxRequest,
    ) -> runtime_api::Result<cri::RemovePodSandboxResponse> {
        self.0.remove_pod_sandbox(req).await
    }
    async fn pod_sandbox_status(
        &self,
        req: cri::PodSandboxStatusRequest,
    ) -> runtime_api::Result<cri::PodSandboxStatusResponse> {
        self.0.pod_sandbox_status(req).await
    }
    async fn list_pod_sandbox(
        &self,
        req: cri::ListPodSandboxRequest,
    ) -> runtime_api::Result<cri::ListPodSandboxResponse> {
        self.0.list_pod_sandbox(req).await
    }
    async fn create_container(
        &self,
        req: cri::CreateContainerRequest,
    ) -> runtime_api::Result<cri::CreateContainerResponse> {
        self.0.create_container(req).await
    }
    async fn start_container(
        &self,
        req: cri::StartContainerRequest,
    ) -> runtime_api::Result<cri::StartContainerResponse> {
        self.0.start_container(req).await
    }
    async fn stop_container(
        &self,
        req: cri::StopContainerRequest,
    ) -> runtime_api::Result<cri::StopContainerResponse> {
        self.0.stop_container(req).await
    }
    async fn remove_container(
        &self,
        req: cri::RemoveContainerRequest,
    ) -> runtime_api::Result<cri::RemoveContainerResponse> {
        self.0.remove_container(req).await
    }
    async fn list_containers(
        &self,
        req: cri::ListContainersRequest,
    ) -> runtime_api::Result<cri::ListContainersResponse> {
        self.0.list_containers(req).await
    }
    async fn container_status(
        &self,
        req: cri::ContainerStatusRequest,
    ) -> runtime_api::Result<cri::ContainerStatusResponse> {
        let id = req.container_id.clone();
        let mut resp = self.0.container_status(req).await?;
        if let (Some(late), Some(status)) = (&self.1, resp.status.as_mut())
            && status.reason == "OOMKilled"
            && late.0.lock().unwrap().insert(id)
        {
            status.reason = "Error".into();
        }
        Ok(resp)
    }
    async fn exec_sync(&self, req: cri::ExecSyncRequest) -> runtime_api::Result<cri::ExecSyncResponse> {
        self.0.exec_sync(req).await
    }
    async fn container_stats(
        &self,
        req: cri::ContainerStatsRequest,
    ) -> runtime_api::Result<cri::ContainerStatsResponse> {
        self.0.container_stats(req).await
    }
    async fn list_container_stats(
        &self,
        req: cri::ListContainerStatsRequest,
    ) -> runtime_api::Result<cri::ListContainerStatsResponse> {
        self.0.list_container_stats(req).await
    }
    async fn pod_sandbox_stats(
        &self,
        req: cri::PodSandboxStatsRequest,
    ) -> runtime_api::Result<cri::PodSandboxStatsResponse> {
        self.0.pod_sandbox_stats(req).await
    }
    async fn list_pod_sandbox_stats(
        &self,
        req: cri::ListPodSandboxStatsRequest,
    ) -> runtime_api::Result<cri::ListPodSandboxStatsResponse> {
        self.0.list_pod_sandbox_stats(req).await
    }
    async fn update_runtime_config(
        &self,
        req: cri::UpdateRuntimeConfigRequest,
    ) -> runtime_api::Result<cri::UpdateRuntimeConfigResponse> {
        self.0.update_runtime_config(req).await
    }
    async fn list_images(&self, req: cri::ListImagesRequest) -> runtime_api::Result<cri::ListImagesResponse> {
        self.0.list_images(req).await
    }
    async fn image_status(
        &self,
        req: cri::ImageStatusRequest,
    ) -> runtime_api::Result<cri::ImageStatusResponse> {
        self.0.image_status(req).await
    }
    async fn pull_image(&self, req: cri::PullImageRequest) -> runtime_api::Result<cri::PullImageResponse> {
        self.0.pull_image(req).await
    }
    async fn remove_image(
        &self,
        req: cri::RemoveImageRequest,
    ) -> runtime_api::Result<cri::RemoveImageResponse> {
        self.0.remove_image(req).await
    }
    async fn image_fs_info(
        &self,
        req: cri::ImageFsInfoRequest,
    ) -> runtime_api::Result<cri::ImageFsInfoResponse> {
        self.0.image_fs_info(req).await
    }
    async fn get_container_events(
        &self,
        _req: cri::GetEventsRequest,
    ) -> runtime_api::Result<runtime_api::EventStream> {
        Err(runtime_api::RuntimeError::unimplemented("GetContainerEvents"))
    }
}
