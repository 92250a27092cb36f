//! The node status task: registration, then the status loop.
//!
//! [`NodeStatusManager::run`] waits briefly for the first runtime answer (so the Node is usually created
//! already Ready), registers the Node (see [`registration`](super::registration)), publishes the registered
//! identity for the lease task, then every `nodeStatusUpdateFrequency` (jittered 4 %) — and at once when the
//! runtime health, the pressure signals or the lease task say something changed — recomputes the status. It
//! PATCHes `nodes/status` only when something other than heartbeat times changed, or when
//! `nodeStatusReportFrequency` passed since the last write. The patch carries the conditions always and the
//! other parts (addresses, capacity/allocatable, nodeInfo, images, ...) only when they changed.
//!
//! The timing is in [`triggers`](super::triggers) and the write-or-skip decision in [`report`](super::report),
//! both unit-tested without an API server; this module does the computing and the API calls.
//!
//! State kept between ticks is compact: the condition state machine, the report policy (fingerprints of what
//! was last reported), the pod CIDR handed to the runtime and the last-seen `spec.unschedulable`.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ContainerImage, Node, NodeStatus};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use runtime_api::{Runtime, cri};
use serde_json::{Map, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::conditions::{ConditionInputs, NodeConditions};
use super::object::{self, ResourceList};
use super::registration::{Registered, Registrar};
use super::report::{Fingerprints, ReportPolicy};
use super::triggers::{Signals, StatusTriggers, Trigger, wait_for_first_health};
use super::{HealthChecks, NodeError, NodeSnapshot, RegisteredNode};
use crate::api::{ApiCalls, is_not_found};
use crate::config::AgentConfig;
use crate::density::poke::Poke;
use crate::density::watch;
use crate::events::{EventRecorder, node_reference};
use crate::metrics::{Metrics, StartupPhases};
use crate::runtime_health::RuntimeHealth;

/// Immediate attempts per status write before waiting for the next tick (the kubelet's).
pub const PATCH_ATTEMPTS: u32 = 5;

/// The channels the status task shares with the rest of the agent.
#[derive(Debug, Clone)]
pub struct StatusChannels {
    /// Runtime health, pressure, the lease task's pokes and the Node as the informer saw it.
    pub signals: Signals,
    /// Extra readiness checks.
    pub checks: HealthChecks,
    /// Where the registered Node identity is published.
    pub registered: watch::Sender<Option<RegisteredNode>>,
    /// Poked after the runtime got a new pod CIDR: ask the runtime for its status now, not at the next poll.
    pub recheck_runtime: Arc<Poke>,
    /// The device plugins' resources with their capacity and allocatable (`None`: no device manager).
    pub devices:
        Option<tokio::sync::watch::Receiver<Arc<std::collections::BTreeMap<String, crate::devices::Counts>>>>,
}

/// The node status task of one agent.
pub struct NodeStatusManager {
    config: Arc<AgentConfig>,
    client: crate::client::ApiClient,
    calls: ApiCalls,
    runtime: Arc<dyn Runtime>,
    events: EventRecorder,
    channels: StatusChannels,
    metrics: Arc<Metrics>,
    token: CancellationToken,

    conditions: NodeConditions,
    policy: ReportPolicy,
    /// The image list's fingerprint, and the list while it is still to be reported (boxed, as what follows:
    /// the idle node side holds this for the node's life, so what it need not keep in place it does not).
    images: Option<Box<(u64, Vec<ContainerImage>)>>,
    pod_cidr: Option<Box<str>>,
    unschedulable: bool,
    /// Until the node's start-up is observed (then dropped): when its phases began.
    startup: Option<Box<StartupClock>>,
    needs_registration: bool,
    heartbeats: super::Heartbeats,
}

/// The body of a `nodes/status` patch: `{"status": …}`.
#[derive(Debug, serde::Serialize)]
struct StatusPatch<'a> {
    status: &'a k8s_openapi::api::core::v1::NodeStatus,
}

/// When the phases of the node's start-up began (the agent, its registration, the registered Node).
struct StartupClock {
    started: Instant,
    registration_started: Option<Instant>,
    registered_at: Option<Instant>,
}

fn hash_of(v: &impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

impl NodeStatusManager {
    /// A status task for the agent described by `config`; `started` is when the agent started (for the startup
    /// metrics).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: Arc<AgentConfig>,
        client: impl Into<crate::client::ApiClient>,
        calls: ApiCalls,
        runtime: Arc<dyn Runtime>,
        events: EventRecorder,
        channels: StatusChannels,
        metrics: Arc<Metrics>,
        started: Instant,
        token: CancellationToken,
    ) -> Self {
        Self {
            policy: ReportPolicy::new(config.kubelet.node_status_report_frequency),
            config,
            client: client.into(),
            calls,
            runtime,
            events,
            channels,
            metrics,
            token,
            conditions: NodeConditions::unknown(),
            images: None,
            pod_cidr: None,
            unschedulable: false,
            startup: Some(Box::new(StartupClock {
                started,
                registration_started: None,
                registered_at: None,
            })),
            needs_registration: false,
            heartbeats: super::Heartbeats::default(),
        }
    }

    /// Status updates stop while `heartbeats` is paused; the first one after a pause is a full write.
    pub fn with_heartbeats(mut self, heartbeats: super::Heartbeats) -> Self {
        self.heartbeats = heartbeats;
        self
    }

    /// Registers the Node, then keeps its status current until dropped (the agent drops it where it waits when
    /// its token fires, see `agent::supervise`; registration also gives up when the token fires).
    pub fn run(mut self) -> impl Future<Output = ()> + Send + 'static {
        async move {
            // Give the runtime monitor a moment for its first answer, so the Node is created with real readiness.
            // boxed: its timeout is not kept in the idle task
            Box::pin(wait_for_first_health(&self.channels.signals.health)).await;
            // The calls below are boxed: between them the task holds only its state, not room for their requests.
            if !Box::pin(self.register()).await {
                return;
            }
            let mut triggers = StatusTriggers::new(self.config.kubelet.node_status_update_frequency);
            loop {
                let force = match triggers.next(&mut self.channels.signals).await {
                    Trigger::Tick => {
                        if self.pod_cidr.is_none() {
                            // a hand-over to the runtime that failed is tried again
                            let seen = self.channels.signals.node.borrow().clone();
                            if let Some(snapshot) = seen {
                                Box::pin(self.learn(&snapshot)).await;
                            }
                        }
                        false
                    }
                    Trigger::InputsChanged => false,
                    Trigger::Resync => {
                        Box::pin(self.reread_node()).await;
                        true
                    }
                    Trigger::NodeChanged => {
                        let seen = self.channels.signals.node.borrow_and_update().clone();
                        if let Some(snapshot) = seen {
                            Box::pin(self.learn(&snapshot)).await;
                        }
                        continue;
                    }
                };
                let force = if self.heartbeats.is_paused() {
                    self.heartbeats.wait_running().await;
                    true
                } else {
                    force
                };
                Box::pin(self.sync(force)).await;
                if self.needs_registration {
                    self.needs_registration = false;
                    if !Box::pin(self.register()).await {
                        return;
                    }
                }
            }
        }
    }

    fn node_api(&self) -> Api<Node> {
        Api::all(self.client.kube())
    }

    fn inputs(&self, health: &RuntimeHealth, now: Instant) -> ConditionInputs {
        let pressure = *self.channels.signals.pressure.borrow();
        let mut not_ready = health.runtime_errors(now);
        not_ready.extend(self.channels.checks.failures());
        not_ready.extend(health.network_errors());
        ConditionInputs {
            memory_pressure: pressure.memory,
            disk_pressure: pressure.disk,
            pid_pressure: pressure.pid,
            not_ready,
        }
    }

    fn record_condition_events(&self, reasons: &[&'static str]) {
        let name = &self.config.node_name;
        let node = node_reference(name);
        for reason in reasons {
            self.events
                .normal(&node, reason, format!("Node {name} status is now: {reason}"));
        }
    }

    fn static_fingerprint(&self, health: &RuntimeHealth, volumes_in_use: Option<&[String]>) -> u64 {
        let devices = self.channels.devices.as_ref().map(|d| d.borrow().clone());
        hash_of(&(
            &health.version,
            &health.handlers,
            health.supplemental_groups_policy,
            volumes_in_use,
            devices.as_deref(),
        ))
    }

    /// The attachable volumes in use, sorted, marked seen (`None` on a node without CSI volumes: the field is
    /// left alone).
    fn volumes_in_use(&mut self) -> Option<Vec<String>> {
        self.channels
            .signals
            .volumes_in_use
            .as_mut()
            .map(|rx| rx.borrow_and_update().keys().cloned().collect())
    }

    async fn list_images(&mut self) -> Option<(u64, Vec<ContainerImage>)> {
        let timeout = self.config.kubelet.runtime_request_timeout;
        match tokio::time::timeout(
            timeout,
            self.runtime.list_images(cri::ListImagesRequest { filter: None }),
        )
        .await
        {
            Ok(Ok(resp)) => {
                let list = object::images(resp.images, self.config.kubelet.node_status_max_images);
                let fp = hash_of(&serde_json::to_string(&list).unwrap_or_default());
                Some((fp, list))
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "listing images failed");
                None
            }
            Err(_) => None,
        }
    }

    /// The parts of the status that only change with the runtime's version/handlers (or never).
    fn static_status(
        &self,
        health: &RuntimeHealth,
        volumes_in_use: Option<Vec<String>>,
        status: &mut NodeStatus,
    ) {
        let cfg = &self.config;
        // the kubelet's `volumesInUse`; `volumesAttached` is the attach/detach controller's and never written here
        status.volumes_in_use = volumes_in_use;
        let mut capacity = object::capacity(cfg);
        let mut allocatable = object::allocatable(cfg, &capacity);
        if let Some(devices) = &self.channels.devices {
            // as the kubelet: every device in capacity, the healthy ones in allocatable
            for (resource, counts) in devices.borrow().iter() {
                let count = |n: u64| {
                    crate::quantity::Quantity::from_units(
                        i64::try_from(n).unwrap_or(i64::MAX),
                        crate::quantity::Format::DecimalSI,
                    )
                };
                capacity.insert(resource.clone(), count(counts.capacity));
                allocatable.insert(resource.clone(), count(counts.allocatable));
            }
        }
        status.capacity = Some(object::to_api(&capacity));
        status.allocatable = Some(object::to_api(&allocatable));
        status.addresses = Some(object::addresses(cfg));
        status.node_info = Some(object::node_info(cfg, health));
        status.daemon_endpoints = Some(object::daemon_endpoints(cfg));
        status.runtime_handlers = object::runtime_handlers(health);
        status.features = object::features(health);
    }

    /// The allocatable resources of this node (published for admission).
    pub fn allocatable(config: &AgentConfig) -> ResourceList {
        object::allocatable(config, &object::capacity(config))
    }

    async fn register(&mut self) -> bool {
        let now = Instant::now();
        if let Some(clock) = self.startup.as_mut() {
            clock.registration_started = Some(now);
        }
        let health = self.channels.signals.health.borrow_and_update().clone();
        let mut fresh = NodeConditions::unknown();
        let wall = Timestamp::now();
        let events = fresh.update(&self.inputs(&health, now), wall);
        let images = self.list_images().await;
        let mut status = NodeStatus {
            conditions: Some(fresh.to_api(wall)),
            ..Default::default()
        };
        let volumes = self.volumes_in_use();
        self.static_status(&health, volumes.clone(), &mut status);
        status.images = images.as_ref().map(|(_, l)| l.clone());
        let initial = object::initial_node(&self.config, status);

        let registrar = Registrar {
            config: &self.config,
            client: self.client.clone(),
            calls: &self.calls,
            events: &self.events,
        };
        let Some(Registered { node, created }) = Box::pin(registrar.register(&initial, &self.token)).await
        else {
            return false;
        };
        let registered_at = Instant::now();
        if let Some(clock) = self.startup.as_mut() {
            clock.registered_at = Some(registered_at);
        }
        let uid = node.metadata.uid.clone().unwrap_or_default();
        self.channels.registered.send_replace(Some(RegisteredNode {
            name: self.config.node_name.clone(),
            uid,
        }));
        self.policy.images_read(registered_at);
        if created {
            self.record_condition_events(&events);
            self.conditions = fresh;
            let sent = Fingerprints {
                conditions: self.conditions.fingerprint(),
                static_part: self.static_fingerprint(&health, volumes.as_deref()),
                images: images.as_ref().map(|(fp, _)| *fp),
            };
            self.policy.written(registered_at, &sent);
            self.learn(&NodeSnapshot::of(&node)).await;
            self.observe_startup_if_ready(registered_at);
        } else {
            // Report against what the API server has: conditions seeded from it, every part re-sent.
            self.conditions = NodeConditions::from_api(
                node.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_deref())
                    .unwrap_or(&[]),
            );
            self.policy.forget();
            self.images = images.map(Box::new);
            self.learn(&NodeSnapshot::of(&node)).await;
            self.sync(true).await;
        }
        true
    }

    fn observe_startup_if_ready(&mut self, ready_at: Instant) {
        if !self.conditions.is_ready() {
            return;
        }
        let Some(clock) = self.startup.as_deref() else {
            return;
        };
        let (Some(reg_start), Some(reg_done)) = (clock.registration_started, clock.registered_at) else {
            return;
        };
        let started = clock.started;
        self.startup = None;
        let phases = StartupPhases {
            pre_registration: reg_start.saturating_duration_since(started),
            registration: reg_done.saturating_duration_since(reg_start),
            post_registration: ready_at.saturating_duration_since(reg_done),
        };
        tracing::info!(node = %self.config.node_name, total = ?phases.total(), "node is ready");
        self.metrics.observe_startup(&phases);
    }

    /// Learns from the Node (as the node informer or a response shows it): hands `spec.podCIDR(s)` to the
    /// runtime (then has the runtime's status read again, so the node turns Ready as soon as its network is),
    /// records NodeSchedulable/NodeNotSchedulable when `spec.unschedulable` flips.
    async fn learn(&mut self, snapshot: &NodeSnapshot) {
        if snapshot.ready_unknown {
            // the node-lifecycle controller marked the node Unknown while the agent could not write: what the
            // API server holds is no longer what was last written, so the next computation writes it again
            // (as the kubelet, which compares with the Node it reads)
            self.policy.forget();
        }
        let cidrs = snapshot.pod_cidrs.join(",");
        if !cidrs.is_empty() && self.pod_cidr.as_deref() != Some(cidrs.as_str()) {
            let req = cri::UpdateRuntimeConfigRequest {
                runtime_config: Some(cri::RuntimeConfig {
                    network_config: Some(cri::NetworkConfig {
                        pod_cidr: cidrs.clone(),
                    }),
                }),
            };
            match self.runtime.update_runtime_config(req).await {
                Ok(_) => {
                    tracing::info!(node = %self.config.node_name, pod_cidr = %cidrs, "pod CIDR handed to the runtime");
                    self.pod_cidr = Some(cidrs.into());
                    self.channels.recheck_runtime.notify_one();
                }
                Err(e) if e.code == runtime_api::Code::Unimplemented => self.pod_cidr = Some(cidrs.into()),
                Err(e) => tracing::warn!(error = %e, "updating the runtime's pod CIDR failed; will retry"),
            }
        }
        if snapshot.unschedulable != self.unschedulable {
            self.unschedulable = snapshot.unschedulable;
            let reason = if snapshot.unschedulable {
                "NodeNotSchedulable"
            } else {
                "NodeSchedulable"
            };
            self.record_condition_events(&[reason]);
        }
    }

    async fn reread_node(&mut self) {
        match self
            .calls
            .run("get", "nodes", self.node_api().get_opt(&self.config.node_name))
            .await
        {
            Ok(Some(node)) => {
                self.conditions = NodeConditions::from_api(
                    node.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_deref())
                        .unwrap_or(&[]),
                );
                self.policy.forget();
                self.learn(&NodeSnapshot::of(&node)).await;
            }
            Ok(None) => {
                tracing::warn!(node = %self.config.node_name, "node object is gone; registering again");
                Box::pin(self.register()).await;
            }
            Err(e) => tracing::warn!(error = %e, "re-reading the node failed"),
        }
    }

    /// One status computation; writes only when needed (or `force`).
    async fn sync(&mut self, force: bool) {
        let now = Instant::now();
        let wall = Timestamp::now();
        let health = self.channels.signals.health.borrow_and_update().clone();
        let _ = self.channels.signals.pressure.borrow_and_update();
        let inputs = self.inputs(&health, now);
        let events = self.conditions.update(&inputs, wall);
        self.record_condition_events(&events);

        if self.policy.images_due(now) {
            self.policy.images_read(now);
            if let Some((fp, list)) = self.list_images().await {
                // Hold the list only while it still has to be reported.
                let list = if self.policy.images_reported(fp) {
                    Vec::new()
                } else {
                    list
                };
                self.images = Some(Box::new((fp, list)));
            }
        }
        let volumes = self.volumes_in_use();
        let fps = Fingerprints {
            conditions: self.conditions.fingerprint(),
            static_part: self.static_fingerprint(&health, volumes.as_deref()),
            images: self.images.as_ref().map(|held| held.0),
        };
        let Some(plan) = self.policy.plan(now, &fps, force) else {
            return;
        };

        let mut status = NodeStatus {
            conditions: Some(self.conditions.to_api(wall)),
            ..Default::default()
        };
        if plan.static_part {
            let volumes = self.volumes_in_use();
            self.static_status(&health, volumes.clone(), &mut status);
        }
        if plan.images
            && let Some(held) = &self.images
        {
            status.images = Some(held.1.clone());
        }
        // serialised straight from the status when the request is made (a JSON tree of it was hundreds of
        // small allocations per node, made by every node at once when a fleet registers)
        let patch = StatusPatch { status: &status };
        match self.write(&patch).await {
            Ok(node) => {
                self.policy.written(now, &fps);
                self.learn(&NodeSnapshot::of(&node)).await;
                self.observe_startup_if_ready(Instant::now());
                if fps.images.is_some() {
                    // The list is reported; keep only its fingerprint.
                    if let Some(held) = &mut self.images {
                        held.1 = Vec::new();
                    }
                }
            }
            Err(e) => {
                if matches!(&e, NodeError::Api { source, .. } if is_not_found(source)) {
                    tracing::warn!(node = %self.config.node_name, "node object is gone; registering again");
                    self.needs_registration = true;
                } else {
                    tracing::warn!(node = %self.config.node_name, error = %e, "error updating node status, will retry");
                }
            }
        }
    }

    async fn write(&self, patch: &StatusPatch<'_>) -> Result<Node, NodeError> {
        let api = self.node_api();
        let params = PatchParams::default();
        let mut last = None;
        for _ in 0..PATCH_ATTEMPTS {
            match self
                .calls
                .run(
                    "patch",
                    "nodes/status",
                    api.patch_status(&self.config.node_name, &params, &Patch::Strategic(patch)),
                )
                .await
            {
                Ok(node) => return Ok(node),
                Err(e) if is_not_found(&e) => {
                    return Err(NodeError::Api {
                        verb: "patch",
                        resource: "nodes/status",
                        source: e,
                    });
                }
                Err(e) => last = Some(e),
            }
            if self.token.is_cancelled() {
                break;
            }
        }
        match last {
            Some(source) => Err(NodeError::Api {
                verb: "patch",
                resource: "nodes/status",
                source,
            }),
            None => Err(NodeError::NotRegistered(self.config.node_name.clone())),
        }
    }
}

/// Marks the Node unschedulable (graceful stop with `--mark-unschedulable-on-shutdown`), annotating it so the
/// next start undoes exactly this cordon.
pub async fn cordon_for_shutdown(
    client: kube::Client,
    calls: &ApiCalls,
    node_name: &str,
) -> Result<(), NodeError> {
    let api: Api<Node> = Api::all(client);
    let mut annotations = Map::new();
    annotations.insert(object::ANNOTATION_CORDONED_ON_SHUTDOWN.into(), json!("true"));
    let patch = json!({ "metadata": { "annotations": annotations }, "spec": { "unschedulable": true } });
    calls
        .run(
            "patch",
            "nodes",
            api.patch(node_name, &PatchParams::default(), &Patch::Strategic(&patch)),
        )
        .await
        .map(|_| ())
        .map_err(|source| NodeError::Api {
            verb: "patch",
            resource: "nodes",
            source,
        })
}
