//! The pod lifecycle: everything between "a pod is bound to this node" and "its object is deleted".
//!
//! [`PodLifecycle`] is a self-contained manager the agent (or a test, or a hollow fleet) runs next to the node
//! half. It takes plain values — a [`PodConfig`], a `kube::Client` with the node's identity, the runtime, a
//! [`ProbeTransport`], and a `watch` of the node's [`NodeView`] — and runs these tasks until cancelled:
//!
//! | task | module | owns |
//! |---|---|---|
//! | pod source | [`source`] | the per-node watch (or a [`SharedPodFeed`] subscription) |
//! | pod manager | [`manager`] | desired pods, admission, one worker per pod UID, node shutdown |
//! | pod workers | `worker` | sync / terminate / terminated per pod, in turns the manager hands out |
//! | prober | `worker::prober` | one timer per probe; results to the pod's worker |
//! | PLEG | `worker::pleg` | runtime events (or a 1 s relist) to workers |
//! | status manager | [`status`] | PATCH `pods/status` on change; final DELETE |
//!
//! The modules form layers, each naming only those below it:
//!
//! | layer | owns |
//! |---|---|
//! | [`manager`] | the pod manager and what other managers ask of it ([`ManagerControl`]) |
//! | `worker` | one pod's worker: its state, sync and plan, prober, PLEG, restart back-off |
//! | [`actions`] | what a sync does: images, volumes, environment, hooks and probe actions, kill |
//! | [`status`] | a pod's status from the desired pod and the runtime view; the task that reports it |
//! | [`probes`] | probe kinds, results and transports ([`ProbeTransport`]) |
//! | [`runtime`] | how a pod is written into the runtime and read back; cgroups |
//! | [`model`] | the desired pod, its resources and QoS, the node view, admission |
//!
//! Beside them: [`source`], [`static_pods`], [`events`] (through a [`PodEventSink`]: the agent's own recorder
//! when an agent runs the lifecycle, else an event writer of its own), [`metrics`] (per-stage hdrhistograms and
//! the kubelet's Prometheus series) and `options` (what a lifecycle takes besides its configuration). API writes
//! go through the agent's rate limit ([`ApiCalls`]).
//!
//! Shutdown (cancelling the token) stops every loop and leaves containers running: a restarted agent rebuilds
//! its state from the runtime (labels and annotations written by `labels`) and the API server, starting nothing
//! twice.

pub mod actions;
pub mod events;
pub mod manager;
pub mod metrics;
pub mod model;
mod options;
pub mod probes;
pub mod runtime;
pub mod source;
pub mod static_pods;
pub mod status;
pub(crate) mod worker;

use std::sync::Arc;
use std::time::Duration;

use runtime_api::{Runtime, RuntimeError, cri};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use events::{MemoryEvents, NoEvents, PodEvent as PodEventRecord, PodEventSink};
pub use manager::control::{KnownPods, ManagerControl, PodsQuery};
pub use metrics::{PodMetrics, Stage, StageReport};
pub use model::node_view::NodeView;
pub use model::node_view::NodeViews;
pub use options::PodOptions;
pub use probes::{
    NetTarget, NetworkProbes, ProbeMetrics, ProbeOutcome, ProbeTarget, ProbeTransport, ScriptedProbes,
};
pub use runtime::labels::RuntimeLayout;
pub use source::{PodEvent, PodSource, SharedPodFeed};
pub use static_pods::StaticPodConfig;
pub use worker::pleg::{PLEG_THRESHOLD, PlegHealth};

use crate::api::ApiCalls;
use crate::backoff::{Backoff, BackoffPolicy};
use crate::density::watch;
use crate::metrics::Metrics;

/// Makes the agent's root directory a shared mount, as the kubelet does at start-up, so its pods' volumes can
/// be mounted with `mountPropagation` (a real node only; needs root).
pub fn make_root_shared(root_dir: &std::path::Path) -> std::io::Result<()> {
    actions::volumes::disk::make_rshared(root_dir)
}

/// Which kind of node runs a pod lifecycle; where they differ, the code asks this rather than guessing from
/// what is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NodeKind {
    /// A machine's kubelet: pod directories under the root directory (`layout.pods_dir`), volumes written
    /// there, termination message files read, what deleted pods left behind swept; the whole pod side is built
    /// at start, since a restarted node has containers and directories to adopt or clean.
    Real,
    /// One node of a hollow fleet: volume contents are computed and nothing is written; the pod side is built
    /// at the node's first pod (most nodes of a fleet wait with their pod watch alone; see
    /// `manager::first_pod`).
    #[default]
    Hollow,
}

/// Settings of the pod lifecycle. `PodConfig::new(node)` gives the kubelet's defaults, for a hollow node.
#[derive(Debug, Clone)]
pub struct PodConfig {
    /// This node's name (pods are those with `spec.nodeName` equal to it).
    pub node_name: String,
    /// A real node or a hollow one (a real node also sets `layout.pods_dir`).
    pub kind: NodeKind,
    /// How often a running pod is re-synced without any trigger (`syncFrequency`, default 1 min, jittered).
    pub sync_frequency: Duration,
    /// Pod capacity used when the node view reports no allocatable pods (`maxPods`, default 110).
    pub max_pods: u32,
    /// The sysctls pods may set: `None` for the safe set alone, else with `allowedUnsafeSysctls`.
    pub sysctls: Option<Arc<crate::sysctl::Allowlist>>,
    /// Relist period when the runtime has no event stream (1 s).
    pub relist_period: Duration,
    /// How long shutdown waits for tasks to finish.
    pub shutdown_grace: Duration,
    /// Paths for sandbox logs.
    pub layout: RuntimeLayout,
    /// Static pod sources (default: none; boxed, and taken when the pod side is built: most nodes of a fleet
    /// have none, and no pod worker reads it).
    pub static_pods: Option<Box<StaticPodConfig>>,
    /// How pods' ConfigMaps and Secrets are read; see [`objects`](actions::objects).
    pub change_detection: actions::objects::ChangeDetection,
    /// How image pulls are paced (default: no limit); the gate is made with the pod side.
    pub pulls: actions::pull_gate::PullSettings,
    /// Where the PLEG records when it was last active, for the node's `PLEG` health check (default: nowhere).
    pub pleg_health: Option<PlegHealth>,
    /// The CSI drivers registered on this node, which publish its CSI volumes (a real node; `None`: no CSI).
    pub csi_drivers: Option<crate::csi::CsiDrivers>,
    /// The node's device manager: device plugin resources are admitted against it and its containers given
    /// their devices (`None`: no device plugins; extended resources are checked against allocatable alone).
    pub devices: Option<crate::devices::DeviceManager>,
    /// The node's DRA manager, which prepares pods' resource claims (`None`: a pod with claims cannot start,
    /// told so by a `FailedPrepareDynamicResources` event).
    pub dra: Option<Arc<crate::dra::DraManager>>,
    /// Whether the host enforces AppArmor profiles (default: no; a real node reads it from the kernel, see
    /// [`apparmor_enabled`]). Pods asking for a confining profile are refused where it does not.
    pub apparmor_enabled: bool,
}

impl PodConfig {
    /// Defaults for node `node_name`.
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            kind: NodeKind::Hollow,
            sync_frequency: Duration::from_secs(60),
            max_pods: 110,
            sysctls: None,
            relist_period: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(5),
            layout: RuntimeLayout::default(),
            static_pods: None,
            change_detection: actions::objects::ChangeDetection::Watch,
            pulls: actions::pull_gate::PullSettings::default(),
            pleg_health: None,
            csi_drivers: None,
            devices: None,
            dra: None,
            apparmor_enabled: false,
        }
    }
}

/// Whether this host's kernel enforces AppArmor, as the kubelet checks it: the security filesystem has an
/// `apparmor` directory and the module's `enabled` parameter reads `Y`.
pub fn apparmor_enabled() -> bool {
    std::path::Path::new("/sys/kernel/security/apparmor").exists()
        && std::fs::read("/sys/module/apparmor/parameters/enabled").is_ok_and(|b| b.len() > 1 && b[0] == b'Y')
}

/// Why the pod lifecycle stopped on its own.
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    /// The runtime never answered `Version` before shutdown.
    #[error("container runtime unavailable")]
    Runtime(#[source] RuntimeError),
}

/// The pod lifecycle of one node agent.
pub struct PodLifecycle {
    config: PodConfig,
    client: crate::client::ApiClient,
    runtime: Arc<dyn Runtime>,
    probes: Arc<dyn ProbeTransport>,
    node: NodeViewFeed,
    metrics: Arc<PodMetrics>,
    probe_metrics: Arc<ProbeMetrics>,
    events: Option<Arc<dyn PodEventSink>>,
    api: ApiCalls,
    source: PodSource,
    /// Graceful node shutdown requests, questions about the node's pods, evictions.
    control: Option<crate::density::chan::UnboundedReceiver<ManagerControl>>,
    /// Informers shared with other nodes (`None`: its own, started with the pod side).
    informers: Option<Arc<crate::informers::ClusterInformers>>,
}

/// The receiving end of a node view channel.
type NodeViewRx = watch::Receiver<Option<NodeView>>;

/// Where the lifecycle's view of its node (allocatable, labels, taints, addresses) comes from.
pub enum NodeViewFeed {
    /// A channel kept current by someone else.
    Channel(NodeViewRx),
    /// Made when the pod side is built (see `first_pod`): an agent's views, composed from its own channels.
    Make(Box<dyn FnOnce() -> NodeViews + Send + Sync>),
}

impl From<NodeViewRx> for NodeViewFeed {
    fn from(rx: NodeViewRx) -> Self {
        NodeViewFeed::Channel(rx)
    }
}

impl std::fmt::Debug for PodLifecycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodLifecycle")
            .field("node", &self.config.node_name)
            .finish_non_exhaustive()
    }
}

impl PodLifecycle {
    /// A lifecycle for `config.node_name`, watching its own pods, writing events to the API server and keeping
    /// its own metrics; see the `with_*` methods to share metrics or feed pods from elsewhere.
    ///
    /// `node` carries the node's allocatable, labels, taints and addresses (or makes the channel that does);
    /// pods wait for admission until it holds a value.
    pub fn new(
        config: PodConfig,
        client: impl Into<crate::client::ApiClient>,
        runtime: Arc<dyn Runtime>,
        probes: Arc<dyn ProbeTransport>,
        node: impl Into<NodeViewFeed>,
    ) -> Self {
        Self {
            config,
            client: client.into(),
            runtime,
            probes,
            node: node.into(),
            metrics: Arc::new(PodMetrics::new()),
            probe_metrics: Arc::default(),
            events: None,
            api: ApiCalls::new(Arc::new(Metrics::unregistered()), 0, 0),
            source: PodSource::Watch,
            control: None,
            informers: None,
        }
    }

    /// Reads Services, RuntimeClasses and CSIDrivers from `informers` (a fleet's, shared by its nodes) instead
    /// of starting informers of its own.
    pub fn with_informers(mut self, informers: Option<Arc<crate::informers::ClusterInformers>>) -> Self {
        self.informers = informers;
        self
    }

    /// Takes graceful node shutdown requests (see [`shutdown`](manager::shutdown)), questions about the node's pods
    /// and evictions (see [`control`](manager::control)) from `control`.
    pub fn with_control(mut self, control: crate::density::chan::UnboundedReceiver<ManagerControl>) -> Self {
        self.control = Some(control);
        self
    }

    /// Records into `metrics` (share one across a fleet).
    pub fn with_metrics(mut self, metrics: Arc<PodMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Keeps this node's per-probe series (`/metrics/probes`) in `probe_metrics`.
    pub fn with_probe_metrics(mut self, probe_metrics: Arc<ProbeMetrics>) -> Self {
        self.probe_metrics = probe_metrics;
        self
    }

    /// Sends events to `sink` (default: an event writer of its own for this node).
    pub fn with_events(mut self, sink: Arc<dyn PodEventSink>) -> Self {
        self.events = Some(sink);
        self
    }

    /// Sends API requests through `api` (the agent's rate limit and request accounting).
    pub fn with_api(mut self, api: ApiCalls) -> Self {
        self.api = api;
        self
    }

    /// Takes pods from `source` instead of a per-node watch.
    pub fn with_source(mut self, source: PodSource) -> Self {
        self.source = source;
        self
    }

    /// The metrics this lifecycle records into.
    pub fn metrics(&self) -> Arc<PodMetrics> {
        self.metrics.clone()
    }

    async fn runtime_type(&self, cancel: &CancellationToken) -> Result<String, PodError> {
        let mut backoff = Backoff::new(BackoffPolicy::registration());
        loop {
            let attempt = self.runtime.version(cri::VersionRequest { version: "v1".into() });
            let result = tokio::select! {
                _ = cancel.cancelled() => return Err(PodError::Runtime(RuntimeError::unavailable("shut down before the runtime answered"))),
                r = attempt => r,
            };
            match result {
                Ok(v) => return Ok(v.runtime_name),
                Err(error) => {
                    tracing::warn!(%error, "container runtime not answering Version, retrying");
                    tokio::select! {
                        _ = cancel.cancelled() => return Err(PodError::Runtime(error)),
                        () = backoff.wait() => {}
                    }
                }
            }
        }
    }

    /// Runs until `cancel` fires. Containers keep running after it returns.
    ///
    /// The lifecycle's own fields are moved into the tasks and the pod manager while starting; the future keeps
    /// no room for them while the manager runs (the lifecycle is boxed until then).
    pub fn run(
        self,
        cancel: CancellationToken,
    ) -> impl Future<Output = Result<(), PodError>> + Send + 'static {
        let this = Box::new(self);
        async move {
            // the manager's future is made in a block of its own: the parts moved into it would otherwise stay in
            // scope, and be kept a second time, while it runs
            let (run, grace, tracker, tasks) = {
                let Some(started) = Box::pin(this.start(&cancel)).await? else {
                    return Ok(());
                };
                let Started {
                    manager,
                    first,
                    source,
                    statics,
                    pleg,
                    control,
                    grace,
                    tracker,
                    tasks,
                } = started;
                (
                    manager.run(first, source, statics, pleg, control),
                    grace,
                    tracker,
                    tasks,
                )
            };
            run.await;
            tasks.cancel();
            tracker.close();
            if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
                tracing::warn!("pod lifecycle tasks did not stop within {grace:?}");
            }
            Ok(())
        }
    }

    /// Starts every task of the lifecycle (on a tracker of its own, cancelled by a child of `cancel`) once the
    /// runtime answers and, for a node with nothing to find, its first pod has arrived; `None`: `cancel` fired
    /// first.
    async fn start(mut self: Box<Self>, cancel: &CancellationToken) -> Result<Option<Started>, PodError> {
        let runtime_type = match Box::pin(self.runtime_type(cancel)).await {
            Ok(t) => t,
            Err(_) if cancel.is_cancelled() => return Ok(None),
            Err(e) => return Err(e),
        };
        // the runtime's name in its final form before the wait below (which holds it)
        let runtime_type = runtime_type.into_boxed_str();
        let (mut source, mut watch) = match std::mem::replace(&mut self.source, PodSource::Watch) {
            PodSource::Feed(rx) => (rx, None),
            source => {
                let client = match source {
                    PodSource::WatchVia(client) => client,
                    _ => self.client.clone(),
                };
                let (tx, rx) = crate::density::chan::channel(256);
                let watch =
                    source::watch_node_pods(client, &self.config.node_name, tx, std::future::pending());
                (rx, Some(Box::pin(watch)))
            }
        };
        // without a control channel, one already closed (the manager stops listening to it)
        let mut control = self
            .control
            .take()
            .unwrap_or_else(|| crate::density::chan::unbounded_channel().1);
        // a hollow node with nothing to find waits for its first pod with its source alone (see `first_pod`)
        let mut first = None;
        if self.config.kind == NodeKind::Hollow
            && self.config.static_pods.as_ref().is_none_or(|c| c.sources() == 0)
            && manager::first_pod::runtime_is_empty(&*self.runtime).await
        {
            match manager::first_pod::wait(cancel, &mut source, &mut control, &mut watch).await {
                Some(taken) => first = Some(Box::new(taken)),
                None => return Ok(None),
            }
        }
        // made only now: a node waiting for its first pod holds neither
        let (tracker, tasks) = (&TaskTracker::new(), &cancel.child_token());
        let statics_config = self.config.static_pods.take().map(|c| *c).unwrap_or_default();
        let node = match self.node {
            NodeViewFeed::Channel(rx) => NodeViews::from(rx),
            NodeViewFeed::Make(make) => make(),
        };
        let events: Arc<dyn PodEventSink> = match self.events {
            Some(sink) => sink,
            None => {
                // the kubelet's default eventRecordQPS / eventBurst
                let (recorder, writer) = crate::events::EventSink::new(
                    self.client.clone(),
                    self.api.without_own_limit(),
                    self.config.node_name.clone(),
                    50,
                    100,
                    tasks.clone(),
                );
                tracker.spawn(writer.run());
                Arc::new(recorder)
            }
        };
        let (status, status_rx) = status::StatusHandle::channel();
        let mirrors = static_pods::Mirrors::default();
        let problems = static_pods::Problems::new(self.config.node_name.clone(), events.clone());
        let statics_rx =
            static_pods::spawn_sources(&statics_config, &self.config.node_name, &problems, tracker, tasks);
        let (desired_tx, desired_rx) = watch::channel(Default::default());
        let start_mirrors: static_pods::mirror::StartMirrors = {
            let (client, api, node_name, node) = (
                self.client.clone(),
                self.api.clone(),
                self.config.node_name.clone(),
                node.clone(),
            );
            let (mirrors, status, tracker, tasks) =
                (mirrors.clone(), status.clone(), tracker.clone(), tasks.clone());
            Box::new(move || {
                let (mirror_tx, mirror_rx) = crate::density::chan::unbounded_channel();
                let manager = static_pods::mirror::MirrorManager::new(
                    client, api, node_name, node, desired_rx, mirror_rx, mirrors, status,
                );
                tracker.spawn(manager.run(tasks));
                mirror_tx
            })
        };
        let statics = manager::Statics::new(
            statics_config.sources(),
            mirrors.clone(),
            desired_tx,
            static_pods::mirror::MirrorLink::new(start_mirrors, statics_config.sources() > 0),
        );
        let informers = match self.informers.take() {
            Some(shared) => shared,
            None => crate::informers::ClusterInformers::start(self.client.clone()),
        };
        let objects = Arc::new(actions::objects::ApiObjects::new(
            self.client.clone(),
            self.api.clone(),
            self.config.change_detection,
            self.config.sync_frequency,
            informers,
        ));
        let (reports, reports_rx) = crate::density::chan::unbounded_channel();
        let ctx = Arc::new(worker::AgentCtx {
            actions: actions::context::ActionCtx {
                objects,
                pulls: Arc::new(actions::pull_gate::PullGate::new(self.config.pulls)),
                config: self.config,
                runtime: self.runtime,
                runtime_type,
                probes: self.probes,
                events: events::Recorder::new(events),
                metrics: self.metrics.clone(),
                probe_metrics: self.probe_metrics,
                status,
                node,
            },
            reports,
            tasks: tracker.clone(),
        });
        let status_manager = status::StatusManager::new(
            self.client.clone(),
            self.api.clone(),
            status_rx,
            self.metrics,
            mirrors,
        );
        let (pleg_tx, pleg_rx) = crate::density::chan::unbounded_channel();
        // The status writer, the PLEG and the pod watch run joined in one task, each polled when woken (each
        // waits on its input most of the time, and a task each would cost a task header and its rounding per
        // node). A join combinator, not an `async` block, which would hold each future twice. The writer stops
        // on the agent's token; the join then drops the PLEG and the watch where they wait, so neither holds a
        // cancellation wait of its own.
        tracker.spawn(crate::density::join::join3_stop(
            tasks.clone(),
            status_manager.run(tasks.clone()),
            worker::pleg::Pleg::new(ctx.clone(), pleg_tx).run(std::future::pending()),
            futures::FutureExt::map(futures::future::OptionFuture::from(watch), |_| ()),
        ));
        let grace = ctx.config.shutdown_grace;
        Ok(Some(Started {
            manager: manager::PodManager::new(ctx, reports_rx, tracker.clone(), statics),
            first,
            source,
            statics: statics_rx,
            pleg: pleg_rx,
            control,
            grace,
            tracker: tracker.clone(),
            tasks: tasks.clone(),
        }))
    }
}

/// What a started lifecycle runs: the pod manager and its inputs.
struct Started {
    manager: manager::PodManager,
    /// What arrived before the pod side was built (boxed: the idle manager keeps a pointer for it).
    first: Option<Box<manager::first_pod::Taken>>,
    source: crate::density::chan::Receiver<PodEvent>,
    statics: Option<tokio::sync::mpsc::Receiver<static_pods::StaticUpdate>>,
    pleg: crate::density::chan::UnboundedReceiver<worker::pleg::PlegEvent>,
    control: crate::density::chan::UnboundedReceiver<ManagerControl>,
    grace: std::time::Duration,
    /// The lifecycle's tasks, and what stops them.
    tracker: TaskTracker,
    tasks: CancellationToken,
}

/// The in-memory size of each per-pod structure (printed by the size tests).
#[cfg(test)]
pub(crate) fn per_pod_sizes() -> Vec<(&'static str, usize)> {
    vec![
        ("PodWorker", size_of::<worker::state::PodWorker>()),
        ("DesiredPod", size_of::<model::spec::DesiredPod>()),
        // its probes and hooks boxed (most containers have none)
        ("ContainerSpec", size_of::<model::spec::ContainerSpec>()),
        ("RuntimeView", size_of::<runtime::observed::RuntimeView>()),
        // one per container instance the runtime holds, kept between syncs
        ("ContainerRecord", size_of::<runtime::observed::ContainerRecord>()),
        ("Timeline", size_of::<metrics::Timeline>()),
        ("Prober", size_of::<worker::prober::Prober>()),
        (
            "k8s Pod (for comparison)",
            size_of::<k8s_openapi::api::core::v1::Pod>(),
        ),
        (
            "k8s PodStatus",
            size_of::<k8s_openapi::api::core::v1::PodStatus>(),
        ),
    ]
}

#[cfg(test)]
mod tests;
