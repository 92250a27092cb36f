//! Wiring one agent: config + client + runtime + token in, its managers running out.
//!
//! [`Agent::builder`] takes the plain [`AgentConfig`], a `kube::Client` built by the caller (with the node's
//! credentials) and an `Arc<dyn Runtime>`; [`Agent::start`] runs, on a [`TaskTracker`], the pod lifecycle as
//! one task and the node-side managers together as another, each of them supervised (`supervise`: a manager
//! that panics or ends is built again from `node_side` and started again after a back-off, the others keep
//! going):
//!
//! | manager | owns |
//! |---|---|
//! | [`EventSink`] | writing this agent's Events |
//! | [`RuntimeHealthMonitor`] | CRI `Status`/`Version` every 5 s -> [`RuntimeHealth`] |
//! | [`NodeStatusManager`] | registration, conditions, `nodes/status`, the runtime's pod CIDR |
//! | [`NodeInformer`] | a watch of this node's Node object -> [`NodeSnapshot`] |
//! | [`LeaseManager`](crate::node::LeaseManager) | `kube-node-lease/<node>` |
//! | pod lifecycle ([`crate::pods`]) | desired pods, workers, probes, PLEG, pod statuses |
//! | container and image GC ([`crate::gc`]) | dead containers, sandboxes, logs; unused images |
//! | eviction ([`crate::eviction`]) | pressure conditions, evicting pods past a threshold |
//! | container log rotation ([`crate::container_logs`]) | running containers' log files (real nodes only) |
//!
//! Everything another manager needs (node name, allocatable, runtime health, events, metrics, the API gate,
//! pressure and health-check inputs, the token) is in the cheap-to-clone [`AgentContext`]; a manager that needs
//! less takes only its part (the eviction manager its [`EvictionInputs`](crate::eviction::EvictionInputs)).
//! The pod lifecycle's side of the wiring is the `pods` submodule; the node side's is `node_side` (what its
//! managers are built from) and `supervise` (their one supervised task). Adding a node-side manager is a builder
//! in `node_side` and a branch in `supervise`; anything else runs with the agent through
//! [`RunningAgent::spawn`]. Log rotation is a task of its own beside them, on real nodes only: a node on an
//! in-memory runtime writes no log files, and a fleet of them pays nothing for it.

#[cfg(test)]
mod future_sizes;
mod node_side;
mod pods;
mod supervise;
#[cfg(test)]
mod whole_agent_tests;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use runtime_api::Runtime;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::ApiCalls;
use crate::config::{AgentConfig, ConfigError};
use crate::density::poke::Poke;
use crate::density::watch;
use crate::events::{EventQueue, EventRecorder, EventSink, node_reference};
use crate::gc::{ContainerGc, GarbageCollectors, ImageFsSource, ImageGc, ImagePolicy};
use crate::metrics::Metrics;
use crate::node::status::{StatusChannels, cordon_for_shutdown};
use crate::node::triggers::Signals;
use crate::node::{
    HealthChecks, NodeError, NodeInformer, NodeSnapshot, NodeStatusManager, Pressure, RegisteredNode,
    ResourceList,
};
use crate::runtime_health::{RuntimeHealth, RuntimeHealthMonitor};

/// Why an agent could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The per-node configuration is invalid.
    #[error("invalid agent configuration: {0}")]
    Config(#[source] ConfigError),
    /// Tasks were still running when the shutdown grace period ended.
    #[error("agent tasks did not stop within {0:?}")]
    ShutdownTimeout(Duration),
    /// Marking the node unschedulable on shutdown failed.
    #[error("marking the node unschedulable on shutdown: {0}")]
    Cordon(#[source] NodeError),
}

/// What every manager of one agent shares. Cheap to clone.
#[derive(Clone)]
pub struct AgentContext {
    /// The agent's configuration.
    pub config: Arc<AgentConfig>,
    /// The node's API client.
    pub client: crate::client::ApiClient,
    /// The container runtime.
    pub runtime: Arc<dyn Runtime>,
    /// Rate limit and accounting for API requests; wrap every request in [`ApiCalls::run`].
    pub api: ApiCalls,
    /// The event recorder.
    pub events: EventRecorder,
    /// The (process-wide) metrics.
    pub metrics: Arc<Metrics>,
    /// Runtime health, updated every 5 s.
    pub runtime_health: watch::Receiver<RuntimeHealth>,
    /// The registered Node's identity, `None` until registration succeeded.
    pub registered: watch::Receiver<Option<RegisteredNode>>,
    /// The node's allocatable resources (for pod admission).
    pub allocatable: watch::Receiver<Arc<ResourceList>>,
    /// The Node object as the node informer last saw it (labels, taints, addresses, pod CIDRs).
    pub node: watch::Receiver<Option<Arc<NodeSnapshot>>>,
    /// Resource pressure input (the eviction manager sends here).
    pub pressure: Arc<watch::Sender<Pressure>>,
    /// Readiness checks (e.g. PLEG) that make the node NotReady when failing.
    pub health_checks: HealthChecks,
    /// Node and pod usage (eviction, image GC, the kubelet API's stats).
    pub stats: crate::stats::StatsProvider,
    /// Fires when the agent stops.
    pub token: CancellationToken,
    /// Pauses the lease and node status heartbeats (chaos; never paused otherwise).
    pub heartbeats: crate::node::Heartbeats,
    /// The container and image garbage collectors (the eviction manager reclaims through them).
    pub gc: GarbageCollectors,
    /// This node's per-probe series, served at `/metrics/probes`.
    pub probe_metrics: Arc<crate::pods::ProbeMetrics>,
    /// What the node-side managers' periodic waits wait on (the agent's own, or a fleet's shared one).
    pub timer: crate::density::timer::Timer,
}

impl std::fmt::Debug for AgentContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentContext")
            .field("node", &self.config.node_name)
            .finish_non_exhaustive()
    }
}

impl AgentContext {
    /// The Node name.
    pub fn node_name(&self) -> &str {
        &self.config.node_name
    }

    /// What the eviction manager takes of the agent.
    pub fn eviction_inputs(&self) -> crate::eviction::EvictionInputs {
        crate::eviction::EvictionInputs {
            config: self.config.clone(),
            stats: self.stats.clone(),
            allocatable: self.allocatable.clone(),
            pressure: self.pressure.clone(),
            events: self.events.clone(),
            metrics: self.metrics.clone(),
            timer: self.timer.clone(),
        }
    }

    /// The container and image garbage collectors' loop.
    fn gc_loop(&self) -> impl Future<Output = ()> + Send + use<> {
        let periods = crate::gc::Periods {
            containers: self.config.gc.container_gc_period,
            images: self.config.gc.image_gc_period,
        };
        crate::gc::run(
            self.gc.clone(),
            self.events.clone(),
            self.config.node_name.clone(),
            periods,
            self.timer.clone(),
        )
    }

    /// The eviction manager's loop (it stops pods through `control`, and reclaims through the collectors).
    fn eviction_loop(
        &self,
        control: crate::density::chan::UnboundedSender<crate::pods::ManagerControl>,
    ) -> impl Future<Output = ()> + Send + use<> {
        crate::eviction::EvictionManager::new(self.eviction_inputs(), control)
            .with_reclaim(Arc::new(self.gc.clone()))
            .run()
    }

    /// The reference events about the Node use.
    pub fn node_reference(&self) -> ObjectReference {
        node_reference(&self.config.node_name)
    }
}

/// Builds an [`Agent`].
pub struct AgentBuilder {
    config: AgentConfig,
    client: crate::client::ApiClient,
    runtime: Arc<dyn Runtime>,
    token: Option<CancellationToken>,
    metrics: Option<Arc<Metrics>>,
    pods: Option<crate::pods::PodOptions>,
    shared_limit: Option<Arc<crate::api::RateLimiter>>,
    node_watch: Option<crate::client::ApiClient>,
    host_stats: Option<Arc<dyn crate::stats::HostStats>>,
    image_fs: Option<Arc<dyn ImageFsSource>>,
    timer: Option<crate::density::timer::Timer>,
}

impl AgentBuilder {
    /// Wait for the node-side managers' periodic deadlines on `timer`, shared with other agents (default: a
    /// timer of the agent's own). A shared timer's wait is a fifth of a tokio timer's in each idle manager;
    /// deadlines are served on the process-wide 50 ms grid either way (see [`crate::density::timer`]).
    pub fn timer(mut self, timer: crate::density::timer::Timer) -> Self {
        self.timer = Some(timer);
        self
    }

    /// Read node figures (memory, filesystems, processes) from `host` — a real node passes
    /// [`RealHost`](crate::stats::host::RealHost); default: [`Synthetic`](crate::stats::Synthetic), the
    /// machine facts' capacities used by what the runtime reports.
    pub fn host_stats(mut self, host: Arc<dyn crate::stats::HostStats>) -> Self {
        self.host_stats = Some(host);
        self
    }

    /// Measure the image filesystem (for image GC) with `source` (default: the agent's stats provider, see [`AgentBuilder::host_stats`]).
    pub fn image_fs(mut self, source: Arc<dyn ImageFsSource>) -> Self {
        self.image_fs = Some(source);
        self
    }

    /// Hold the watch of this node's Node object over `client` instead of the request client (a process
    /// multiplexing many agents keeps long-lived watches on connections of their own, see
    /// [`PodSource::WatchVia`](crate::pods::PodSource::WatchVia)).
    pub fn node_watch_via(mut self, client: impl Into<crate::client::ApiClient>) -> Self {
        self.node_watch = Some(client.into());
        self
    }

    /// Stop the agent when `token` fires (default: a fresh token, cancelled by [`RunningAgent::stop`]).
    pub fn token(mut self, token: CancellationToken) -> Self {
        self.token = Some(token);
        self
    }

    /// Count into these (shared) metrics (default: unregistered metrics).
    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Every API request also takes a token of `limiter`, a bucket shared with other agents (a fleet-wide cap
    /// on top of this agent's own kubeAPIQPS/kubeAPIBurst).
    pub fn shared_limit(mut self, limiter: Arc<crate::api::RateLimiter>) -> Self {
        self.shared_limit = Some(limiter);
        self
    }

    /// Pod lifecycle options: probe transport, (shared) start-up metrics, pod source (default:
    /// [`PodOptions::default`](crate::pods::PodOptions), probes over the real network — an agent on an in-memory
    /// runtime must pass scripted probes here).
    pub fn pods(mut self, options: crate::pods::PodOptions) -> Self {
        self.pods = Some(options);
        self
    }

    /// Validates the per-node configuration and prepares the agent (nothing runs yet).
    pub fn build(self) -> Result<Agent, AgentError> {
        self.config.validate().map_err(AgentError::Config)?;
        // once per process: a hollow fleet builds thousands of agents on the same loopback address
        static LOOPBACK_WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if self.config.node_ip.is_loopback()
            && !LOOPBACK_WARNED.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(node = %self.config.node_name, ip = %self.config.node_ip, "node IP is a loopback address; only clients on this machine can reach the node");
        }
        let token = self.token.unwrap_or_default();
        let metrics = self.metrics.unwrap_or_else(|| Arc::new(Metrics::unregistered()));
        let config = Arc::new(self.config);
        let k = &config.kubelet;
        let mut api = ApiCalls::new(metrics.clone(), k.kube_api_qps, k.kube_api_burst);
        if let Some(shared) = self.shared_limit {
            api = api.with_shared_limit(shared);
        }
        // events have their own limit (eventRecordQPS / eventBurst), as the kubelet's event client does
        let (events, event_sink) = EventSink::new(
            self.client.clone(),
            api.without_own_limit(),
            config.node_name.clone(),
            k.event_record_qps,
            k.event_burst,
            token.clone(),
        );
        let timer = self.timer.unwrap_or_default();
        let (health_monitor, runtime_health) =
            RuntimeHealthMonitor::new(self.runtime.clone(), k.runtime_request_timeout);
        let health_monitor = health_monitor.with_timer(timer.clone());
        let (registered_tx, registered) = watch::channel(None);
        // the same in every agent of a fleet built from one configuration: one copy
        static ALLOCATABLE: crate::density::intern::Interner<ResourceList> =
            crate::density::intern::Interner::new();
        let (_allocatable_tx, allocatable) =
            watch::channel(ALLOCATABLE.intern(NodeStatusManager::allocatable(&config)));
        let (pressure_tx, pressure_rx) = watch::channel(Pressure::default());
        let (node_tx, node) = watch::channel(None);
        let stats = crate::stats::StatsProvider::new(
            self.runtime.clone(),
            config.clone(),
            self.host_stats
                .unwrap_or_else(|| Arc::new(crate::stats::Synthetic::default())),
        );
        let pods = self.pods.unwrap_or_default();
        let stats = match &pods.csi_drivers {
            Some(drivers) => stats.with_csi(drivers.clone()),
            None => stats,
        };
        // a real node keeps pod files under its root directory; an in-memory one writes nothing
        let real = pods.root_dir.is_some();
        let (control_tx, control_rx) = crate::density::chan::unbounded_channel();
        let image_fs = self
            .image_fs
            .unwrap_or_else(|| Arc::new(stats.clone()) as Arc<dyn ImageFsSource>);
        let gc = GarbageCollectors {
            containers: ContainerGc::new(
                self.runtime.clone(),
                &config.gc,
                crate::pods::PodsQuery::new(control_tx.clone()),
                real.then(|| k.pod_logs_dir.clone()),
            ),
            images: ImageGc::new(
                self.runtime.clone(),
                ImagePolicy::from_config(k),
                image_fs,
                events.clone(),
                config.node_name.clone(),
                metrics.clone(),
            ),
        };
        let log_rotation = real
            .then(|| crate::container_logs::RotationPolicy::from_config(k))
            .flatten()
            .map(|policy| crate::container_logs::LogRotationManager::new(self.runtime.clone(), policy));
        let ctx = AgentContext {
            config,
            client: self.client,
            runtime: self.runtime,
            api,
            events,
            metrics,
            runtime_health,
            registered,
            allocatable,
            node,
            pressure: Arc::new(pressure_tx),
            health_checks: HealthChecks::default(),
            stats,
            token,
            heartbeats: crate::node::Heartbeats::default(),
            gc,
            probe_metrics: Arc::default(),
            timer,
        };
        Ok(Agent {
            ctx,
            events: event_sink.queue(),
            health_monitor,
            registered_tx,
            node_tx,
            pressure_rx,
            started: Instant::now(),
            pods,
            node_watch: self.node_watch,
            control: (control_tx, control_rx),
            log_rotation,
        })
    }
}

/// One node agent, ready to start.
pub struct Agent {
    ctx: AgentContext,
    events: EventQueue,
    health_monitor: RuntimeHealthMonitor,
    registered_tx: watch::Sender<Option<RegisteredNode>>,
    node_tx: watch::Sender<Option<Arc<NodeSnapshot>>>,
    pressure_rx: watch::Receiver<Pressure>,
    started: Instant,
    pods: crate::pods::PodOptions,
    node_watch: Option<crate::client::ApiClient>,
    control: PodControl,
    /// The container log manager (real nodes, rotation on).
    log_rotation: Option<crate::container_logs::LogRotationManager>,
}

/// The pod manager's control channel: shutdown requests and the garbage collector's questions.
type PodControl = (
    crate::density::chan::UnboundedSender<crate::pods::ManagerControl>,
    crate::density::chan::UnboundedReceiver<crate::pods::ManagerControl>,
);

impl Agent {
    /// An agent for `config`, talking to the API server through `client` and to the container runtime through
    /// `runtime`.
    pub fn builder(
        config: AgentConfig,
        client: impl Into<crate::client::ApiClient>,
        runtime: Arc<dyn Runtime>,
    ) -> AgentBuilder {
        AgentBuilder {
            config,
            client: client.into(),
            runtime,
            token: None,
            metrics: None,
            pods: None,
            shared_limit: None,
            node_watch: None,
            host_stats: None,
            image_fs: None,
            timer: None,
        }
    }

    /// The shared context (to build further managers before starting).
    pub fn context(&self) -> &AgentContext {
        &self.ctx
    }

    /// Spawns the agent's tasks. Must be called inside a tokio runtime.
    pub fn start(mut self) -> RunningAgent {
        let log_rotation = self.log_rotation.take();
        let (ctx, m) = self.managers();
        let tracker = TaskTracker::new();
        if let Some(manager) = log_rotation {
            let token = ctx.token.clone();
            tracker.spawn(async move {
                tokio::select! {
                    () = manager.run() => {}
                    () = token.cancelled() => {}
                }
            });
        }
        ctx.events
            .normal(&ctx.node_reference(), "Starting", "Starting kubelet.");
        let (control_tx, control_rx) = m.control;
        let side = Arc::new(m.node);
        // The node-side managers are one task: each mostly sleeps, and a task of its own would cost each a task
        // header per node of a fleet (docs/density.md, "join"). Each is supervised within its branch, and
        // polled only when woken.
        tracker.spawn(supervise::node_side(side.clone()));
        tracker.spawn(pods::run_for_agent(ctx, m.pods, control_rx));
        tracker.close();
        RunningAgent {
            side,
            tracker,
            shutdown_tx: control_tx,
            resync: m.resync,
        }
    }

    /// Every manager of the agent, built and wired, not yet running.
    pub(crate) fn managers(self) -> (AgentContext, Managers) {
        let Agent {
            ctx,
            events,
            health_monitor,
            registered_tx,
            node_tx,
            pressure_rx,
            started,
            pods,
            node_watch,
            control,
            log_rotation: _,
        } = self;
        let resync = Arc::new(Poke::new());
        let channels = StatusChannels {
            signals: Signals {
                health: ctx.runtime_health.clone(),
                pressure: pressure_rx,
                resync: resync.clone(),
                node: ctx.node.clone(),
                timer: ctx.timer.clone(),
                volumes_in_use: pods.csi_drivers.as_ref().map(|d| d.in_use().subscribe()),
            },
            checks: ctx.health_checks.clone(),
            registered: registered_tx,
            recheck_runtime: health_monitor.recheck_handle(),
            devices: pods.devices.as_ref().map(crate::devices::DeviceManager::counts),
        };
        let informer = NodeInformer::new(
            node_watch.unwrap_or_else(|| ctx.client.clone()),
            ctx.config.node_name.clone(),
            node_tx,
        );
        let node = node_side::NodeSide {
            ctx: ctx.clone(),
            channels,
            started,
            events,
            monitor: health_monitor,
            informer,
            control: control.0.clone(),
        };
        let managers = Managers {
            node,
            pods,
            resync,
            control,
        };
        (ctx, managers)
    }
}

/// The long-lived tasks of one agent, before they run.
pub(crate) struct Managers {
    /// What the node-side managers are built from.
    pub(crate) node: node_side::NodeSide,
    pub(crate) pods: crate::pods::PodOptions,
    /// Wakes the node status loop (a shutdown reports NotReady at once).
    pub(crate) resync: Arc<Poke>,
    /// The pod manager's control channel.
    pub(crate) control: PodControl,
}

/// A started agent.
pub struct RunningAgent {
    /// The node side's inputs, the agent's context among them.
    side: Arc<node_side::NodeSide>,
    tracker: TaskTracker,
    shutdown_tx: crate::density::chan::UnboundedSender<crate::pods::ManagerControl>,
    resync: Arc<Poke>,
}

impl RunningAgent {
    /// The shared context.
    pub fn context(&self) -> &AgentContext {
        &self.side.ctx
    }

    /// Asks this agent's pod manager which pods it has (e.g. for the
    /// [`pod_resources`](crate::pod_resources) API).
    pub fn pods_query(&self) -> crate::pods::PodsQuery {
        crate::pods::PodsQuery::new(self.shutdown_tx.clone())
    }

    /// Runs one more manager as part of this agent (stopped and awaited with the others).
    pub fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.tracker.reopen();
        self.tracker.spawn(task);
        self.tracker.close();
    }

    /// Waits until every task has ended (after the token fired).
    pub async fn wait(&self) {
        self.tracker.wait().await;
    }

    /// Graceful node shutdown, as the kubelet does when the machine shuts down, when `shutdownGracePeriod` (or
    /// `shutdownGracePeriodByPodPriority`) is set, followed by [`RunningAgent::stop`] (`grace` as there); without
    /// those fields the same as [`RunningAgent::stop`].
    pub async fn shutdown(self, grace: Duration) -> Result<(), AgentError> {
        self.shut_down_pods().await;
        self.stop(grace).await
    }

    /// Whether graceful node shutdown is configured (`shutdownGracePeriod` or
    /// `shutdownGracePeriodByPodPriority` set), and the total of its periods.
    pub fn shutdown_period(&self) -> Option<Duration> {
        let k = &self.side.ctx.config.kubelet;
        let groups = crate::pods::manager::shutdown::groups(
            k.shutdown_grace_period,
            k.shutdown_grace_period_critical_pods,
            &k.shutdown_grace_period_by_pod_priority,
        );
        (!groups.is_empty()).then(|| groups.iter().map(|g| g.grace).sum())
    }

    /// The pod side of graceful node shutdown, the agent left running: the Node turns NotReady (`node is
    /// shutting down`) with a `NodeShutdown` event, new pods are refused, running pods are stopped by priority
    /// group within their periods (see [`crate::pods::manager::shutdown`]) and reported Failed. Returns when
    /// they are (or the periods are over); does nothing without a configured shutdown period.
    pub async fn shut_down_pods(&self) {
        let k = &self.side.ctx.config.kubelet;
        let groups = crate::pods::manager::shutdown::groups(
            k.shutdown_grace_period,
            k.shutdown_grace_period_critical_pods,
            &k.shutdown_grace_period_by_pod_priority,
        );
        if groups.is_empty() {
            return;
        }
        let total: Duration = groups.iter().map(|g| g.grace).sum();
        tracing::info!(node = %self.side.ctx.config.node_name, period = ?total, "graceful node shutdown");
        self.side.ctx.events.normal(
            &self.side.ctx.node_reference(),
            "NodeShutdown",
            "Shutdown manager detected shutdown event",
        );
        self.side.ctx.health_checks.set_shutting_down(true);
        self.resync.notify_one();
        let (done, wait) = tokio::sync::oneshot::channel();
        let request = crate::pods::manager::shutdown::ShutdownRequest { groups, done };
        if self.shutdown_tx.send(request.into()).is_ok() {
            // the groups' periods, the slack for pods still stopping, then at most 5 s for the statuses
            let bound = total + crate::pods::manager::shutdown::STOP_SLACK + Duration::from_secs(6);
            if tokio::time::timeout(bound, wait).await.is_err() {
                tracing::warn!(node = %self.side.ctx.config.node_name, "pods not all stopped within the shutdown period");
            }
        }
    }

    /// A shutdown called off (the machine's shutdown cancelled), as the kubelet takes it: a `NodeShutdown`
    /// event, the Node Ready again and new pods admitted again. Pods already stopped stay stopped.
    pub fn cancel_shutdown(&self) {
        self.side.ctx.events.normal(
            &self.side.ctx.node_reference(),
            "NodeShutdown",
            "Shutdown manager detected shutdown cancellation",
        );
        self.side.ctx.health_checks.set_shutting_down(false);
        let _ = self
            .shutdown_tx
            .send(crate::pods::ManagerControl::ShutdownCancelled);
        self.resync.notify_one();
    }

    /// Graceful stop: fire the token, wait up to `grace` for the tasks, then (if configured) mark the Node
    /// unschedulable. The Node and its lease are left in place, like the kubelet does.
    pub async fn stop(self, grace: Duration) -> Result<(), AgentError> {
        self.side.ctx.token.cancel();
        let drained = tokio::time::timeout(grace, self.tracker.wait()).await.is_ok();
        if self.side.ctx.config.mark_unschedulable_on_shutdown {
            cordon_for_shutdown(
                self.side.ctx.client.kube(),
                &self.side.ctx.api,
                &self.side.ctx.config.node_name,
            )
            .await
            .map_err(AgentError::Cordon)?;
            tracing::info!(node = %self.side.ctx.config.node_name, "marked the node unschedulable for shutdown");
        }
        if drained {
            Ok(())
        } else {
            Err(AgentError::ShutdownTimeout(grace))
        }
    }
}
