//! Churn and chaos on a running fleet, so an API server and scheduler also face nodes that misbehave.
//!
//! Three kinds, each optional and each configured by flags or by the `chaos` section of the profiles file:
//!
//! * **runtime down**: every `every`, a `fraction` of the nodes get a fake runtime that reports
//!   `RuntimeReady=false` for `duration`; their agents report `Ready=False` (KubeletNotReady, runtime down)
//!   and recover, as kubelets on a broken containerd do.
//! * **flapping**: every `every`, a `fraction` of the nodes stop their heartbeats (no lease renewal, no status
//!   update) for `duration`; past the controller-manager's grace period it marks them `Unknown` and taints
//!   them `unreachable`, then they come back.
//! * **churn**: `nodes` extra nodes beyond the fleet, of which one leaves every `60 / per_minute` seconds
//!   (agent stopped, Node object deleted) and a node with a fresh name joins, as under a cluster autoscaler.
//!   With `shutdown`, a leaving node goes through graceful node shutdown first (the fleet's
//!   `shutdownGracePeriod`): NotReady with the shutdown reason, new pods refused, its pods stopped by priority
//!   and reported Failed (`Terminated`) — a node drained by shutdown.
//!   Churn needs the fleet's shared credentials: a node identity cannot be minted for a name chosen later.
//!
//! A round picks its nodes at random among those not disrupted by the same kind. Everything is undone when
//! the fleet stops.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use cri_fake::FakeRuntime;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams};
use node_agent::node::Heartbeats;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use crate::duration::parse_duration;
use crate::fleet::{Fleet, FleetNode, NodeFactory};
pub use crate::profiles::chaos::{ChaosArgs, ChaosError, ChaosSpec, Churn, Disruption};

/// What chaos can act on for one node of the fleet.
#[derive(Clone)]
pub struct Target {
    /// The node.
    pub name: String,
    /// Its fake runtime.
    pub runtime: FakeRuntime,
    /// Its heartbeat switch.
    pub heartbeats: Heartbeats,
}

/// What chaos may act on in `fleet`: every node's runtime and heartbeat switch.
pub fn targets(fleet: &Fleet) -> Vec<Target> {
    fleet.nodes().iter().map(Target::of).collect()
}

impl Target {
    /// The target of a running fleet node.
    pub fn of(node: &FleetNode) -> Self {
        Self {
            name: node.name.clone(),
            runtime: node.runtime.clone(),
            heartbeats: node.agent.context().heartbeats.clone(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

/// Chaos figures on /metrics.
#[derive(Clone, Default)]
pub struct ChaosMetrics {
    disrupted: Family<KindLabel, Gauge>,
    rounds: Family<KindLabel, Counter>,
    churn: Family<KindLabel, Counter>,
}

impl ChaosMetrics {
    /// Registers `hollow_chaos_disrupted_nodes{kind}`, `hollow_chaos_rounds_total{kind}` and
    /// `hollow_churn_nodes_total{kind=joined|left}`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "hollow_chaos_disrupted_nodes",
            "Nodes currently disrupted, by kind (runtime_down, flapping).",
            self.disrupted.clone(),
        );
        registry.register(
            "hollow_chaos_rounds",
            "Disruption rounds started, by kind.",
            self.rounds.clone(),
        );
        registry.register(
            "hollow_churn_nodes",
            "Churn nodes that joined or left.",
            self.churn.clone(),
        );
    }

    fn label(kind: &str) -> KindLabel {
        KindLabel { kind: kind.into() }
    }

    /// Nodes currently disrupted by `kind`.
    pub fn disrupted(&self, kind: &str) -> i64 {
        self.disrupted.get_or_create(&Self::label(kind)).get()
    }

    /// Churn events of `kind` (`joined`, `left`).
    pub fn churned(&self, kind: &str) -> u64 {
        self.churn.get_or_create(&Self::label(kind)).get()
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    RuntimeDown,
    Flapping,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::RuntimeDown => "runtime_down",
            Kind::Flapping => "flapping",
        }
    }

    fn apply(self, t: &Target, on: bool) {
        match (self, on) {
            (Kind::RuntimeDown, on) => t.runtime.set_runtime_ready(!on),
            (Kind::Flapping, true) => t.heartbeats.pause(),
            (Kind::Flapping, false) => t.heartbeats.resume(),
        }
    }
}

/// Runs the configured chaos until `token` fires, then undoes it and stops the churn nodes (deleting their
/// Node objects).
pub async fn run(
    spec: ChaosSpec,
    targets: Vec<Target>,
    factory: Arc<NodeFactory>,
    metrics: ChaosMetrics,
    token: CancellationToken,
) {
    let targets = Arc::new(targets);
    let tasks = TaskTracker::new();
    for (kind, d) in [
        (Kind::RuntimeDown, spec.runtime_down),
        (Kind::Flapping, spec.flapping),
    ] {
        if let Some(d) = d {
            tasks.spawn(disrupt(kind, d, targets.clone(), metrics.clone(), token.clone()));
        }
    }
    if let Some(c) = spec.churn {
        tasks.spawn(churn(c, factory, metrics.clone(), token.clone()));
    }
    tasks.close();
    tasks.wait().await;
}

async fn disrupt(
    kind: Kind,
    d: Disruption,
    targets: Arc<Vec<Target>>,
    metrics: ChaosMetrics,
    token: CancellationToken,
) {
    let gauge = metrics
        .disrupted
        .get_or_create(&ChaosMetrics::label(kind.name()))
        .clone();
    let rounds = metrics
        .rounds
        .get_or_create(&ChaosMetrics::label(kind.name()))
        .clone();
    loop {
        let count = ((targets.len() as f64) * d.fraction).round() as usize;
        let picked: Vec<&Target> = rand::seq::index::sample(&mut rand::rng(), targets.len(), count)
            .iter()
            .map(|i| &targets[i])
            .collect();
        for t in &picked {
            kind.apply(t, true);
        }
        gauge.set(i64::try_from(picked.len()).unwrap_or(i64::MAX));
        rounds.inc();
        tracing::info!(kind = kind.name(), nodes = picked.len(), duration = ?d.duration, "chaos round");
        let stopped = tokio::select! {
            () = tokio::time::sleep(d.duration) => false,
            () = token.cancelled() => true,
        };
        for t in &picked {
            kind.apply(t, false);
        }
        gauge.set(0);
        if stopped || d.every.is_zero() {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(d.every - d.duration) => {}
            () = token.cancelled() => return,
        }
    }
}

async fn churn(c: Churn, factory: Arc<NodeFactory>, metrics: ChaosMetrics, token: CancellationToken) {
    let joined = metrics
        .churn
        .get_or_create(&ChaosMetrics::label("joined"))
        .clone();
    let left = metrics.churn.get_or_create(&ChaosMetrics::label("left")).clone();
    let nodes_api: Api<Node> = Api::all(factory.client());
    let grace = Duration::from_secs(10);
    let mut next = factory.spec().nodes;
    let mut live: VecDeque<FleetNode> = VecDeque::with_capacity(c.nodes);
    let start = |next: &mut usize, live: &mut VecDeque<FleetNode>| {
        match factory.start_node(*next) {
            Ok(node) => {
                tracing::info!(node = %node.name, "churn: node joins");
                live.push_back(node);
                joined.inc();
            }
            Err(e) => tracing::warn!(error = %e, "churn: starting a node failed"),
        }
        *next += 1;
    };
    for _ in 0..c.nodes {
        start(&mut next, &mut live);
    }
    let period = Duration::from_secs_f64(60.0 / c.per_minute);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = token.cancelled() => break,
        }
        if let Some(node) = live.pop_front() {
            let name = node.name.clone();
            tracing::info!(node = %name, graceful = c.shutdown, "churn: node leaves");
            if c.shutdown {
                factory.shut_down_node(node, grace).await;
            } else {
                factory.stop_node(node, grace).await;
            }
            delete_node(&nodes_api, &name).await;
            left.inc();
        }
        start(&mut next, &mut live);
    }
    for node in live {
        let name = node.name.clone();
        factory.stop_node(node, grace).await;
        delete_node(&nodes_api, &name).await;
    }
}

async fn delete_node(api: &Api<Node>, name: &str) {
    if let Err(e) = api.delete(name, &DeleteParams::default()).await
        && !node_agent::api::is_not_found(&e)
    {
        tracing::warn!(node = %name, error = %e, "churn: deleting the Node failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_round_disrupts_the_fraction_then_restores_it() {
        let targets: Vec<Target> = (0..10)
            .map(|i| Target {
                name: format!("n{i}"),
                runtime: FakeRuntime::new(cri_fake::FakeConfig::default()),
                heartbeats: Heartbeats::default(),
            })
            .collect();
        let metrics = ChaosMetrics::default();
        let token = CancellationToken::new();
        let d = Disruption {
            fraction: 0.3,
            duration: Duration::from_secs(20),
            every: Duration::from_secs(60),
        };
        let task = tokio::spawn(disrupt(
            Kind::Flapping,
            d,
            Arc::new(targets.clone()),
            metrics.clone(),
            token.clone(),
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let paused = || targets.iter().filter(|t| t.heartbeats.is_paused()).count();
        assert_eq!(paused(), 3);
        assert_eq!(metrics.disrupted("flapping"), 3);
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(paused(), 0, "restored after the round");
        tokio::time::sleep(Duration::from_secs(40)).await;
        assert_eq!(paused(), 3, "the next round 60 s after the first");
        token.cancel();
        task.await.unwrap();
        assert_eq!(paused(), 0, "a stop undoes the round");
    }
}
