//! The pod lifecycle: everything between "a pod is bound to this node" and "its object is deleted".
//!
//! [`PodLifecycle`] is a self-contained manager the agent (or a test, or a hollow fleet) runs next to the node
//! half. It takes plain values — a [`PodConfig`], a `kube::Client` with the node's identity, the runtime, a
//! [`ProbeTransport`], and a `watch` of the node's [`NodeView`] — and runs these tasks until cancelled:
//!
//! | task | module | owns |
//! |---|---|---|
//! | pod source | [`source`] | the per-node watch (or a [`SharedPodFeed`] subscription) |
//! | pod manager | `manager` | desired pods, admission ([`admission`]), one worker per pod UID |
//! | pod workers | `worker`, `sync`, `plan`, `kill` | sync / terminate / terminated per pod |
//! | prober | [`probes`] | one timer per probe; results to the pod's worker |
//! | PLEG | `pleg` | runtime events (or a 1 s relist) to workers |
//! | (until the first pod) | `first_pod` | the source alone; the rest is built at the node's first pod |
//! | status manager | `status` | PATCH `pods/status` on change; final DELETE |
//!
//! From outside, [`control`] carries graceful shutdown requests, the garbage collector's question which
//! pods the node still has, the eviction manager's and the pod-resources API's questions which pods run.
//!
//! Events go through a [`PodEventSink`] ([`events`]): the agent's own recorder when an agent runs the lifecycle
//! (it passes one with [`PodLifecycle::with_events`], and what else it chooses in [`PodOptions`]), else an event
//! writer of its own. API writes go through the agent's rate limit ([`ApiCalls`]).
//!
//! Supporting modules: [`spec`] (the compact desired pod), `resources` (requests, limits, QoS), `labels` (runtime
//! labels and annotations), `observed` (the runtime's view of a pod), `images`, `restart`
//! (CrashLoopBackOff), `actions` (exec/http/tcp/grpc/sleep), [`metrics`] (per-stage hdrhistograms and the
//! kubelet's Prometheus series), `gofmt` (Go-style durations in messages), `options` (what a lifecycle
//! takes besides its configuration), `service_links` (Services as environment variables), `termination` (termination
//! messages), [`cgroups`] (QoS and pod cgroups of a real node), `orphans` (what pods deleted while the agent
//! was down left behind).
//!
//! Shutdown (cancelling the token) stops every loop and leaves containers running: a restarted agent rebuilds
//! its state from the runtime (labels and annotations written by `labels`) and the API server, starting nothing
//! twice.

mod actions;
pub mod admission;
pub mod cgroups;
mod context;
pub mod control;
pub mod dns;
mod env;
pub mod events;
mod first_pod;
pub(crate) mod gofmt;
mod images;
mod kill;
pub mod labels;
mod manager;
pub mod metrics;
pub mod node_view;
pub mod objects;
mod observed;
mod options;
mod orphans;
mod plan;
pub(crate) mod pleg;
pub mod probes;
pub mod pull_gate;
mod pull_secrets;
mod read_cache;
pub mod resources;
mod restart;
pub mod security;
mod service_links;
pub mod shutdown;
pub mod source;
pub mod spec;
pub mod static_pods;
pub mod status;
mod sync;
mod termination;
mod volumes;
pub(crate) mod worker;
mod worker_state;

use std::sync::Arc;
use std::time::Duration;

use runtime_api::{Runtime, RuntimeError, cri};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use admission::NodeView;
pub use control::{KnownPods, ManagerControl, PodsQuery};
pub use events::{MemoryEvents, NoEvents, PodEvent as PodEventRecord, PodEventSink};
pub use labels::RuntimeLayout;
pub use metrics::{PodMetrics, Stage, StageReport};
pub use node_view::NodeViews;
pub use options::PodOptions;
pub use pleg::{PLEG_THRESHOLD, PlegHealth};
pub use probes::{
    NetTarget, NetworkProbes, ProbeMetrics, ProbeOutcome, ProbeTarget, ProbeTransport, ScriptedProbes,
};
pub use source::{PodEvent, PodSource, SharedPodFeed};
pub use static_pods::StaticPodConfig;

use crate::api::ApiCalls;
use crate::backoff::{Backoff, BackoffPolicy};
use crate::density::watch;
use crate::metrics::Metrics;

/// Settings of the pod lifecycle. `PodConfig::new(node)` gives the kubelet's defaults.
#[derive(Debug, Clone)]
pub struct PodConfig {
    /// This node's name (pods are those with `spec.nodeName` equal to it).
    pub node_name: String,
    /// How often a running pod is re-synced without any trigger (`syncFrequency`, default 1 min, jittered).
    pub sync_frequency: Duration,
    /// Pod capacity used when the node view reports no allocatable pods (`maxPods`, default 110).
    pub max_pods: u32,
    /// Relist period when the runtime has no event stream (1 s).
    pub relist_period: Duration,
    /// How long shutdown waits for tasks to finish.
    pub shutdown_grace: Duration,
    /// Paths for sandbox logs.
    pub layout: RuntimeLayout,
    /// Static pod sources (default: none; boxed, and taken when the pod side is built: most nodes of a fleet
    /// have none, and no pod worker reads it).
    pub static_pods: Option<Box<StaticPodConfig>>,
    /// How long a read ConfigMap or Secret is reused (0: read at every use); see [`objects`].
    pub object_ttl: Duration,
    /// How image pulls are paced (default: no limit); the gate is made with the pod side.
    pub pulls: pull_gate::PullSettings,
    /// Where the PLEG records when it was last active, for the node's `PLEG` health check (default: nowhere).
    pub pleg_health: Option<PlegHealth>,
}

impl PodConfig {
    /// Defaults for node `node_name`.
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            sync_frequency: Duration::from_secs(60),
            max_pods: 110,
            relist_period: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(5),
            layout: RuntimeLayout::default(),
            static_pods: None,
            object_ttl: Duration::from_secs(60),
            pulls: pull_gate::PullSettings::default(),
            pleg_health: None,
        }
    }
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
        }
    }

    /// Takes graceful node shutdown requests (see [`shutdown`]) questions about the node's pods and evictions (see
    /// [`control`]) from `control`.
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
        // a node with nothing to find waits for its first pod with its source alone (see `first_pod`)
        let layout = &self.config.layout;
        let sweeps = layout.pods_dir.is_some() || layout.cgroups.is_some();
        let mut first = None;
        if self.config.static_pods.as_ref().is_none_or(|c| c.sources() == 0)
            && !sweeps
            && first_pod::runtime_is_empty(&*self.runtime).await
        {
            match first_pod::wait(cancel, &mut source, &mut control, &mut watch).await {
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
        let objects = Arc::new(objects::ApiObjects::new(
            self.client.clone(),
            self.api.clone(),
            self.config.object_ttl,
            self.config.sync_frequency,
        ));
        let (reports, reports_rx) = crate::density::chan::unbounded_channel();
        let ctx = Arc::new(context::AgentCtx {
            objects,
            pulls: Arc::new(pull_gate::PullGate::new(self.config.pulls)),
            config: self.config,
            runtime: self.runtime,
            runtime_type,
            probes: self.probes,
            events: events::Recorder::new(events),
            metrics: self.metrics.clone(),
            probe_metrics: self.probe_metrics,
            status,
            node,
            reports,
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
        // waits on its input most of the time; a task each cost tokio's ~112 bytes and the rounding to 128 per
        // node). A join combinator, not an `async` block, which would hold each future twice. The writer stops
        // on the agent's token; the join then drops the PLEG and the watch where they wait, so neither holds a
        // cancellation wait of its own.
        tracker.spawn(crate::density::join::join3_stop(
            tasks.clone(),
            status_manager.run(tasks.clone()),
            pleg::Pleg::new(ctx.clone(), pleg_tx).run(std::future::pending()),
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
    first: Option<Box<first_pod::Taken>>,
    source: crate::density::chan::Receiver<PodEvent>,
    statics: Option<tokio::sync::mpsc::Receiver<static_pods::StaticUpdate>>,
    pleg: crate::density::chan::UnboundedReceiver<pleg::PlegEvent>,
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
        ("PodWorker", size_of::<worker::PodWorker>()),
        ("DesiredPod", size_of::<spec::DesiredPod>()),
        // 960 bytes while its probes and hooks were held in place (most containers have none)
        ("ContainerSpec", size_of::<spec::ContainerSpec>()),
        ("RuntimeView", size_of::<observed::RuntimeView>()),
        // one per container instance the runtime holds, kept between syncs
        ("ContainerRecord", size_of::<observed::ContainerRecord>()),
        ("Timeline", size_of::<metrics::Timeline>()),
        ("Prober", size_of::<probes::prober::Prober>()),
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
