//! The fleet: N node agents, each with its own fake runtime, node identity, lease and status loop, started at
//! a bounded registration rate (and no faster than the API server registers them, see [`crate::start_gate`])
//! and stopped together.
//!
//! Shared by every agent: the client pool, one `KubeletConfig` per profile, the runtime profile and the
//! metrics. Held per agent: its `RunningAgent` handle and its `FakeRuntime`.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use cri_fake::{FakeConfig, FakeRuntime};
use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use node_agent::api::RateLimiter;
use node_agent::density::intern::Interner;
use node_agent::pods::{PodMetrics, PodOptions, PodSource, SharedPodFeed};
use node_agent::quantity::Quantity;
use node_agent::server::{KubeletServer, NodeEndpoint, ScriptedLogs, ServingIdentity};
use node_agent::{Agent, AgentConfig, KubeletConfig, MachineInfo, Metrics, RunningAgent};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::client_pool::ClientPool;
use crate::profiles::{Assignment, Profile};
use crate::start_gate::StartGate;

/// How many started nodes may wait for their registration by default (`--registrations-in-flight`).
pub const REGISTRATIONS_IN_FLIGHT: usize = 25;

/// What listens on a node's kubelet port, and the flags that choose it.
const KUBELET_API_PORT: &str =
    "a node's kubelet API (--serve-kubelet-api on --node-ip, port --kubelet-port + the node's index)";

/// Label every hollow node carries, naming its profile.
pub const PROFILE_LABEL: &str = "hollow.node-agent.io/profile";

/// Errors building the fleet.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// A node's configuration is invalid.
    #[error("node {node}: {source}")]
    Agent {
        /// The node.
        node: String,
        /// Why.
        #[source]
        source: node_agent::AgentError,
    },
    /// The kubelet API could not start, or a node's port is out of range.
    #[error("kubelet API: {0}")]
    KubeletApi(String),
    /// The fleet-wide pod CIDR range has no subnet left for this node.
    #[error("node {node}: no pod CIDR left in the fleet-wide range")]
    PodCidrs {
        /// The node.
        node: String,
    },
    /// A profile capacity value is not a quantity.
    #[error("profile {profile}: capacity.{resource}: {message}")]
    Capacity {
        /// The profile.
        profile: String,
        /// The resource.
        resource: String,
        /// Why.
        message: String,
    },
    /// A profile's static pod manifest is unusable.
    #[error("profile {profile}: {message}")]
    StaticPod {
        /// The profile.
        profile: String,
        /// What is wrong (names the field).
        message: String,
    },
}

/// How agents receive their pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WatchMode {
    /// Every agent its own watch with `fieldSelector=spec.nodeName=<node>`, as kubelets do.
    #[default]
    PerNode,
    /// One process-wide watch of scheduled pods, dispatched to agents by `spec.nodeName`.
    Shared,
}

/// The fleet's kubelet API settings (the authentication, authorization and serving certificate settings come
/// from [`FleetSpec::kubelet`]).
#[derive(Clone, Default)]
pub struct KubeletApi {
    /// What `/metrics` serves (the fleet's registry).
    pub registry: Option<Arc<Registry>>,
}

/// Everything the fleet needs, as plain values.
#[derive(Clone)]
pub struct FleetSpec {
    /// How many nodes.
    pub nodes: usize,
    /// Node name template: `{index}` is the node number, `{pod}` the fleet's pod name.
    pub name_template: String,
    /// Replaces `{pod}` in the template.
    pub pod_name: String,
    /// The InternalIP every node publishes (this process's own address).
    pub node_ip: IpAddr,
    /// The kubelet port every node publishes; with [`FleetSpec::kubelet_api`] the first of a range, node `i`
    /// publishing and serving `kubelet_port + i`.
    pub kubelet_port: u16,
    /// Serve the kubelet API (opt-in): one server in this process, one listener per node on
    /// `node_ip:kubelet_port + index`, so the API server's logs requests and node-scoped scrapes reach the
    /// right node although every node publishes the same address.
    pub kubelet_api: Option<KubeletApi>,
    /// Registrations started per second.
    pub register_qps: f64,
    /// At most this many started nodes wait for their registration; the next starts when one is registered
    /// (0: no limit; see [`crate::start_gate`]).
    pub registrations_in_flight: usize,
    /// Base kubelet settings (each profile adjusts max pods and taints).
    pub kubelet: KubeletConfig,
    /// Garbage collection settings of every node (the kubelet's flags; default: the kubelet's defaults).
    pub gc: node_agent::config::GcSettings,
    /// Node profiles and which node gets which.
    pub profiles: Vec<Profile>,
    /// One entry per node.
    pub assignments: Vec<Assignment>,
    /// Fake runtime behaviour for every node.
    pub runtime_profile: Arc<cri_fake::Profile>,
    /// How agents receive their pods.
    pub watch_mode: WatchMode,
    /// API requests per second of all agents together (0: no fleet-wide cap).
    pub fleet_qps: u64,
    /// Per-node pod CIDRs from a fleet-wide range (clusters that allocate none); `None`: each node's runtime
    /// waits for the Node's `spec.podCIDR`.
    pub pod_cidrs: Option<crate::cidrs::NodeCidrs>,
}

impl FleetSpec {
    /// A fleet of `nodes` named by `name_template`, given `profiles`, with defaults for the rest: every node
    /// publishes 127.0.0.1 and kubelet port 10250 (not served), 100 registrations per second, the kubelet's default
    /// settings, the default fake runtime, per-node watches, no fleet-wide cap, pod CIDRs from the cluster.
    pub fn new(
        nodes: usize,
        name_template: impl Into<String>,
        profiles: Vec<Profile>,
    ) -> Result<Self, crate::profiles::ProfileError> {
        let assignments = crate::profiles::assign(&profiles, nodes)?;
        Ok(Self {
            nodes,
            name_template: name_template.into(),
            pod_name: "hollow".into(),
            node_ip: IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            kubelet_port: 10250,
            kubelet_api: None,
            register_qps: 100.0,
            registrations_in_flight: REGISTRATIONS_IN_FLIGHT,
            kubelet: KubeletConfig::default(),
            gc: Default::default(),
            profiles,
            assignments,
            runtime_profile: Arc::default(),
            watch_mode: WatchMode::PerNode,
            fleet_qps: 0,
            pod_cidrs: None,
        })
    }

    /// The name of node `index`.
    pub fn node_name(&self, index: usize) -> String {
        self.name_template
            .replace("{pod}", &self.pod_name)
            .replace("{index}", &index.to_string())
    }
}

/// One hollow node.
pub struct FleetNode {
    /// Node name.
    pub name: String,
    /// Its fake runtime (for chaos: runtime down, counts).
    pub runtime: FakeRuntime,
    /// The running agent.
    pub agent: RunningAgent,
}

/// A cheap, shareable view of the fleet for gauges and chaos.
#[derive(Clone)]
pub struct FleetView {
    nodes: Arc<
        Vec<(
            node_agent::density::watch::Receiver<Option<node_agent::node::RegisteredNode>>,
            FakeRuntime,
        )>,
    >,
}

impl FleetView {
    /// Refreshes the fleet gauges.
    pub fn refresh(&self, gauges: &crate::server::FleetGauges) {
        let (mut registered, mut sandboxes, mut containers) = (0i64, 0i64, 0i64);
        for (reg, runtime) in self.nodes.iter() {
            if reg.borrow().is_some() {
                registered += 1;
            }
            let c = runtime.counts();
            sandboxes += i64::try_from(c.sandboxes).unwrap_or(i64::MAX);
            containers += i64::try_from(c.containers).unwrap_or(i64::MAX);
        }
        gauges
            .nodes
            .set(i64::try_from(self.nodes.len()).unwrap_or(i64::MAX));
        gauges.registered.set(registered);
        gauges.sandboxes.set(sandboxes);
        gauges.containers.set(containers);
        gauges.rss_bytes.set(crate::server::rss_bytes() as f64);
    }

    /// Number of registered nodes.
    pub fn registered(&self) -> usize {
        self.nodes
            .iter()
            .filter(|(reg, _)| reg.borrow().is_some())
            .count()
    }
}

/// A running fleet.
pub struct Fleet {
    nodes: Vec<FleetNode>,
    token: CancellationToken,
    factory: Arc<NodeFactory>,
}

fn quantity(profile: &str, resource: &str, value: &str) -> Result<Quantity, FleetError> {
    Quantity::from_api(&ApiQuantity(value.to_owned())).map_err(|e| FleetError::Capacity {
        profile: profile.into(),
        resource: resource.into(),
        message: e.to_string(),
    })
}

fn whole<T: TryFrom<i128> + Default>(q: &Quantity) -> T {
    T::try_from(q.value()).unwrap_or_default()
}

/// The per-profile kubelet settings and machine template.
struct ProfileTemplate {
    kubelet: Arc<KubeletConfig>,
    cpu_millis: u64,
    memory_bytes: u64,
    ephemeral_storage_bytes: u64,
    extended_resources: BTreeMap<String, u64>,
    labels: BTreeMap<String, String>,
    /// Static pod manifests, shared by every node of the profile.
    static_pods: Vec<(String, Arc<k8s_openapi::api::core::v1::Pod>)>,
    /// Node figures besides the pods', shared by every node of the profile.
    host: Arc<node_agent::stats::Synthetic>,
    /// Fake device plugins every node of the profile has.
    device_plugins: Vec<node_agent::devices::fake::FakeDevices>,
    /// The profile's DRA driver, if it has one.
    dra: Option<crate::dra::DraSpec>,
    csi: Option<crate::csi::CsiSpec>,
}

fn template(spec: &FleetSpec, p: &Profile) -> Result<ProfileTemplate, FleetError> {
    let mut kubelet = spec.kubelet.clone();
    kubelet.port = spec.kubelet_port;
    let defaults = MachineInfo::synthetic("template");
    let mut t = ProfileTemplate {
        kubelet: Arc::default(),
        cpu_millis: defaults.cpu_millis,
        memory_bytes: defaults.memory_bytes,
        ephemeral_storage_bytes: defaults.ephemeral_storage_bytes,
        extended_resources: BTreeMap::new(),
        labels: p.labels.clone(),
        static_pods: p
            .static_manifests()
            .map_err(|e| FleetError::StaticPod {
                profile: p.name.clone(),
                message: e.to_string(),
            })?
            .into_iter()
            .map(|(name, pod)| (name, Arc::new(pod)))
            .collect(),
        host: Arc::default(),
        device_plugins: p
            .device_plugins
            .iter()
            .map(|d| node_agent::devices::fake::FakeDevices {
                resource: d.resource.clone(),
                count: d.count,
                flap_every: d.flap_every,
            })
            .collect(),
        dra: p.dra.clone(),
        csi: p.csi.clone(),
    };
    for (resource, value) in &p.capacity {
        let q = quantity(&p.name, resource, value)?;
        match resource.as_str() {
            "cpu" => t.cpu_millis = u64::try_from(q.milli()).unwrap_or(0),
            "memory" => t.memory_bytes = whole(&q),
            "ephemeral-storage" => t.ephemeral_storage_bytes = whole(&q),
            "pods" => kubelet.max_pods = whole(&q),
            _ => {
                t.extended_resources.insert(resource.clone(), whole(&q));
            }
        }
    }
    kubelet
        .register_with_taints
        .extend(p.taints.iter().map(|taint| Taint {
            key: taint.key.clone(),
            value: taint.value.clone(),
            effect: taint.effect.clone(),
            time_added: None,
        }));
    t.kubelet = Arc::new(kubelet);
    t.labels.insert(PROFILE_LABEL.into(), p.name.clone());
    let baseline = |resource: &str, value: &Option<String>| -> Result<Option<Quantity>, FleetError> {
        value
            .as_deref()
            .map(|v| quantity(&p.name, resource, v))
            .transpose()
    };
    let cpu = baseline("baseline.cpu", &p.baseline.cpu)?;
    let memory = baseline("baseline.memory", &p.baseline.memory)?;
    t.host = Arc::new(node_agent::stats::Synthetic::with_baseline(
        node_agent::stats::Baseline {
            // a machine's own use is never 0: metrics-server drops a node reporting 0
            nano_cores: cpu
                .map_or(t.cpu_millis * 10_000, |q| {
                    u64::try_from(q.milli() * 1_000_000).unwrap_or(0)
                })
                .max(1),
            memory_bytes: memory.map_or(t.memory_bytes / 50, |q| whole(&q)).max(1),
        },
    ));
    Ok(t)
}

/// Starts single hollow nodes: everything one node needs that the whole fleet shares. The fleet's start and
/// the churn of [`crate::chaos`] both go through it.
pub struct NodeFactory {
    spec: FleetSpec,
    templates: Vec<ProfileTemplate>,
    pool: ClientPool,
    feed: Option<SharedPodFeed>,
    metrics: Arc<Metrics>,
    pod_metrics: Arc<PodMetrics>,
    shared_limit: Option<Arc<RateLimiter>>,
    kubelet_server: Option<KubeletServer>,
    token: CancellationToken,
    /// One timer for every node's periodic waits (leases, status, runtime polls, collection and eviction).
    timer: node_agent::density::timer::Timer,
    /// One copy of the collection settings for every node.
    gc: Arc<node_agent::config::GcSettings>,
    /// The Services, RuntimeClasses and CSIDrivers informers every node reads (one list+watch of each for the
    /// fleet, where as many kubelets would hold one each).
    informers: Arc<node_agent::informers::ClusterInformers>,
}

impl NodeFactory {
    /// The fleet's spec.
    pub fn spec(&self) -> &FleetSpec {
        &self.spec
    }

    /// Starts node number `index` (named from the template; profile from its assignment, cycling for
    /// indexes past the fleet size).
    pub fn start_node(&self, index: usize) -> Result<FleetNode, FleetError> {
        let spec = &self.spec;
        let name = spec.node_name(index);
        let assignment = &spec.assignments[index % spec.assignments.len().max(1)];
        let t = &self.templates[assignment.profile];
        // Machine and system IDs are derived from the name, so a restarted fleet is the same machines; the boot
        // ID is fresh, because the node's runtime starts empty — every container of a previous run is gone, as
        // after a reboot — and the agent then reports the reboot (a Rebooted event) like a kubelet.
        let mut machine = MachineInfo::synthetic(&name);
        machine.cpu_millis = t.cpu_millis;
        machine.memory_bytes = t.memory_bytes;
        machine.ephemeral_storage_bytes = t.ephemeral_storage_bytes;
        machine.extended_resources = t.extended_resources.clone();
        let mut config = AgentConfig::new(name.clone(), spec.node_ip, t.kubelet.clone(), machine);
        config.gc = self.gc.clone();
        if self.kubelet_server.is_some() {
            config.kubelet_port = u16::try_from(index)
                .ok()
                .and_then(|i| spec.kubelet_port.checked_add(i))
                .ok_or_else(|| {
                    FleetError::KubeletApi(format!(
                        "node {name}: kubelet port {} + {index} is past 65535",
                        spec.kubelet_port
                    ))
                })?;
        }
        let port = config.kubelet_port;
        // one copy for every node of a profile and zone
        static LABELS: Interner<BTreeMap<String, String>> = Interner::new();
        let mut labels = t.labels.clone();
        if let Some(zone) = &assignment.zone {
            labels.insert("topology.kubernetes.io/zone".into(), zone.clone());
        }
        config.node_labels = LABELS.intern(labels);
        let pod_cidr = match &spec.pod_cidrs {
            None => None,
            Some(cidrs) => Some(
                cidrs
                    .nth(index)
                    .ok_or_else(|| FleetError::PodCidrs { node: name.clone() })?,
            ),
        };
        let runtime = FakeRuntime::new(FakeConfig {
            profile: spec.runtime_profile.clone(),
            pod_cidr,
            ..FakeConfig::default()
        });
        let source = match &self.feed {
            Some(feed) => feed.subscribe(&name, 64),
            None => PodSource::WatchVia(self.pool.watch_for_agent(index)),
        };
        let dra = t.dra.as_ref().map(|spec| {
            let drivers = node_agent::dra::Drivers::default();
            let driver = crate::dra::HollowDriver::new(self.pool.fleet_client(), spec.clone());
            drivers.insert(&spec.driver, Arc::new(driver));
            let claims = node_agent::dra::claims::ClaimCache::in_memory();
            Arc::new(node_agent::dra::DraManager::new(
                self.pool.for_agent(index).kube(),
                drivers,
                claims,
            ))
        });
        let pods = PodOptions {
            probes: Arc::new(crate::probes::scripted(runtime.clone())),
            metrics: self.pod_metrics.clone(),
            source,
            static_manifests: t.static_pods.clone(),
            // a hollow node: its pod side is built at its first pod, volume contents are computed, not written
            kind: node_agent::pods::NodeKind::Hollow,
            root_dir: None,
            // nor cgroups: the machine's are never touched by a hollow node
            cgroups: None,
            // no plugin registers on a hollow node: the profile's CSI driver, if any, is registered directly
            csi_drivers: t.csi.as_ref().map(|spec| spec.drivers(&name)),
            devices: None,
            // the profile's DRA driver, in process
            dra,
            informers: Some(self.informers.clone()),
        };
        let token = self.token.child_token();
        let mut pods = pods;
        if !t.device_plugins.is_empty() {
            // the profile's fake device plugins, through the same device manager a real node has
            let devices = node_agent::devices::DeviceManager::in_memory();
            for plugin in &t.device_plugins {
                if let Some(flapping) = node_agent::devices::fake::start(&devices, plugin, token.clone()) {
                    tokio::spawn(flapping);
                }
            }
            pods = pods.with_devices(devices);
        }
        let mut builder = Agent::builder(config, self.pool.for_agent(index), Arc::new(runtime.clone()))
            .pods(pods)
            .node_watch_via(self.pool.watch_for_agent(index))
            .token(token)
            .metrics(self.metrics.clone())
            .timer(self.timer.clone())
            .host_stats(t.host.clone());
        if let Some(limit) = &self.shared_limit {
            builder = builder.shared_limit(limit.clone());
        }
        let agent = builder
            .build()
            .map_err(|source| FleetError::Agent {
                node: name.clone(),
                source,
            })?
            .start();
        if let Some(spec) = t.dra.clone() {
            let (client, node) = (self.pool.fleet_client(), name.clone());
            agent.spawn(async move { crate::dra::publish(client, &spec, &node).await });
        }
        if let Some(spec) = &t.csi {
            crate::csi::publish(&agent, spec);
        }
        if let Some(server) = &self.kubelet_server {
            let script = runtime.clone();
            let logs = ScriptedLogs::new(move |id| script.container_logs(id).map_err(|e| e.to_string()));
            let endpoint = NodeEndpoint::new(agent.context().clone()).with_logs(Arc::new(logs));
            server
                .serve_node_for(SocketAddr::new(spec.node_ip, port), endpoint, KUBELET_API_PORT)
                .map_err(|e| FleetError::KubeletApi(format!("node {name}: {e}")))?;
        }
        Ok(FleetNode { name, runtime, agent })
    }

    /// Stops a node started here; `forget` also stops routing the shared watch to it.
    pub async fn stop_node(&self, node: FleetNode, grace: Duration) {
        if let Some(feed) = &self.feed {
            feed.unsubscribe(&node.name);
        }
        if let Err(e) = node.agent.stop(grace).await {
            tracing::warn!(node = %node.name, error = %e, "agent did not stop cleanly");
        }
    }

    /// Shuts `node` down gracefully (the kubelet's graceful node shutdown with the fleet's
    /// `shutdownGracePeriod` settings), then stops it (`grace` as in [`NodeFactory::stop_node`]).
    pub async fn shut_down_node(&self, node: FleetNode, grace: Duration) {
        if let Some(feed) = &self.feed {
            feed.unsubscribe(&node.name);
        }
        if let Err(e) = node.agent.shutdown(grace).await {
            tracing::warn!(node = %node.name, error = %e, "agent did not shut down cleanly");
        }
    }

    /// A client for fleet-level requests (not a node's).
    pub fn client(&self) -> kube::Client {
        self.pool.fleet_client()
    }
}

impl Fleet {
    /// Starts every node, at most `register_qps` per second and with at most `registrations_in_flight` of them
    /// waiting for their registration at a time, logging progress; returns once all are started (the last
    /// registrations complete in the background). `fleet_qps` > 0 caps the API requests of all agents
    /// together (on top of each agent's own kubeAPIQPS), with bursts of the same size.
    pub async fn start(
        spec: &FleetSpec,
        pool: &ClientPool,
        metrics: Arc<Metrics>,
        pod_metrics: Arc<PodMetrics>,
        token: CancellationToken,
    ) -> Result<Fleet, FleetError> {
        let templates = spec
            .profiles
            .iter()
            .map(|p| template(spec, p))
            .collect::<Result<Vec<_>, _>>()?;
        let qps = u32::try_from(spec.fleet_qps).unwrap_or(u32::MAX);
        let kubelet_server = match &spec.kubelet_api {
            None => None,
            Some(api) => {
                if spec.kubelet.read_only_port != 0 {
                    tracing::warn!(
                        port = spec.kubelet.read_only_port,
                        "readOnlyPort is not served by a hollow fleet (nodes share one address; only the secure port is given per node)"
                    );
                }
                let identity = ServingIdentity {
                    hostnames: vec!["localhost".into()],
                    ips: vec![spec.node_ip],
                };
                let server = KubeletServer::new(
                    Arc::new(spec.kubelet.clone()),
                    &identity,
                    api.registry.clone(),
                    token.clone(),
                )
                .map_err(|e| FleetError::KubeletApi(e.to_string()))?;
                Some(server)
            }
        };
        let factory = Arc::new(NodeFactory {
            spec: spec.clone(),
            templates,
            pool: pool.clone(),
            feed: (spec.watch_mode == WatchMode::Shared).then(SharedPodFeed::new),
            metrics,
            pod_metrics,
            shared_limit: RateLimiter::new(qps, qps).map(Arc::new),
            kubelet_server,
            token: token.clone(),
            timer: node_agent::density::timer::Timer::new(),
            gc: Arc::new(spec.gc),
            // with the first node's identity: the Node authorizer lets a node list and watch all three
            informers: node_agent::informers::ClusterInformers::start(pool.for_agent(0)),
        });
        let mut nodes = Vec::with_capacity(spec.nodes);
        let period = Duration::from_secs_f64(1.0 / spec.register_qps.max(0.001));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let step = (spec.nodes / 20).max(1);
        let mut gate = StartGate::new(spec.registrations_in_flight);
        for index in 0..spec.nodes.min(spec.assignments.len()) {
            tokio::select! {
                () = token.cancelled() => break,
                () = async { tick.tick().await; gate.admit().await } => {}
            }
            let node = factory.start_node(index)?;
            gate.started(node.agent.context().registered.clone());
            nodes.push(node);
            if (index + 1) % step == 0 || index + 1 == spec.nodes {
                tracing::info!(started = index + 1, of = spec.nodes, "starting hollow nodes");
            }
        }
        if let Some(feed) = &factory.feed {
            // subscriptions are in place: start the one watch
            tokio::spawn(feed.clone().run(pool.watch_for_agent(0), token.child_token()));
        }
        Ok(Fleet {
            nodes,
            token,
            factory,
        })
    }

    /// What starts further nodes like these (churn).
    pub fn factory(&self) -> Arc<NodeFactory> {
        self.factory.clone()
    }

    /// The nodes.
    pub fn nodes(&self) -> &[FleetNode] {
        &self.nodes
    }

    /// A shareable view for gauges.
    pub fn view(&self) -> FleetView {
        FleetView {
            nodes: Arc::new(
                self.nodes
                    .iter()
                    .map(|n| (n.agent.context().registered.clone(), n.runtime.clone()))
                    .collect(),
            ),
        }
    }

    /// Stops every agent (each gets `grace` to finish), then waits as long again for the kubelet API's listeners
    /// and connections.
    pub async fn stop(self, grace: Duration) {
        self.token.cancel();
        let factory = self.factory;
        let stops = self.nodes.into_iter().map(|n| factory.stop_node(n, grace));
        futures::future::join_all(stops).await;
        if let Some(server) = &factory.kubelet_server
            && tokio::time::timeout(grace, server.stopped()).await.is_err()
        {
            tracing::warn!("the kubelet API's connections did not end within {grace:?}");
        }
    }
}
