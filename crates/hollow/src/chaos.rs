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
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::fleet::{FleetNode, NodeFactory};

/// Chaos flags; each kind overrides the `chaos` section of the profiles file.
#[derive(clap::Args, Debug, Default)]
pub struct ChaosArgs {
    /// Share of nodes (0–1) whose runtime goes down per round (RuntimeReady=false, node NotReady).
    #[arg(long, requires = "runtime_down_for")]
    pub runtime_down_fraction: Option<f64>,
    /// How long the runtime stays down (e.g. 30s, 2m).
    #[arg(long, value_parser = parse_duration)]
    pub runtime_down_for: Option<Duration>,
    /// Time between the starts of two rounds (default: one round).
    #[arg(long, value_parser = parse_duration)]
    pub runtime_down_every: Option<Duration>,
    /// Share of nodes (0–1) whose lease and status heartbeats stop per round.
    #[arg(long, requires = "flap_for")]
    pub flap_fraction: Option<f64>,
    /// How long heartbeats stay stopped (past the controller-manager's grace period the node goes Unknown).
    #[arg(long, value_parser = parse_duration)]
    pub flap_for: Option<Duration>,
    /// Time between the starts of two flapping rounds (default: one round).
    #[arg(long, value_parser = parse_duration)]
    pub flap_every: Option<Duration>,
    /// Extra nodes, beyond --nodes, that leave and join over time (Node deleted, a fresh name joins).
    #[arg(long, requires = "churn_per_minute")]
    pub churn_nodes: Option<usize>,
    /// Churn replacements per minute.
    #[arg(long)]
    pub churn_per_minute: Option<f64>,
    /// Leaving churn nodes go through graceful node shutdown (their pods stopped and reported Failed) before
    /// their Node is deleted; needs shutdownGracePeriod in --config.
    #[arg(long, requires = "churn_nodes")]
    pub churn_shutdown: bool,
}

impl ChaosArgs {
    /// The profile file's chaos with these flags applied over it.
    pub fn over(&self, mut spec: ChaosSpec) -> ChaosSpec {
        if let (Some(fraction), Some(duration)) = (self.runtime_down_fraction, self.runtime_down_for) {
            spec.runtime_down = Some(Disruption {
                fraction,
                duration,
                every: self.runtime_down_every.unwrap_or_default(),
            });
        }
        if let (Some(fraction), Some(duration)) = (self.flap_fraction, self.flap_for) {
            spec.flapping = Some(Disruption {
                fraction,
                duration,
                every: self.flap_every.unwrap_or_default(),
            });
        }
        if let (Some(nodes), Some(per_minute)) = (self.churn_nodes, self.churn_per_minute) {
            spec.churn = Some(Churn {
                nodes,
                per_minute,
                shutdown: self.churn_shutdown,
            });
        }
        spec
    }
}

/// A recurring disruption of a fraction of the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Disruption {
    /// Share of the fleet disrupted per round, 0–1.
    pub fraction: f64,
    /// How long one round lasts.
    #[serde(with = "duration_text")]
    pub duration: Duration,
    /// Time from one round's start to the next; zero for a single round.
    #[serde(default, with = "duration_text")]
    pub every: Duration,
}

/// Nodes leaving and joining.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Churn {
    /// Extra nodes that take part in churn (on top of the fleet).
    pub nodes: usize,
    /// Replacements per minute (one node leaves, one joins).
    pub per_minute: f64,
    /// Leaving nodes shut down gracefully (needs `shutdownGracePeriod` in the fleet's configuration).
    #[serde(default)]
    pub shutdown: bool,
}

/// All chaos of one fleet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ChaosSpec {
    /// Runtime down on a fraction of nodes.
    #[serde(default)]
    pub runtime_down: Option<Disruption>,
    /// Heartbeats stopped on a fraction of nodes.
    #[serde(default)]
    pub flapping: Option<Disruption>,
    /// Node churn.
    #[serde(default)]
    pub churn: Option<Churn>,
}

/// Invalid chaos settings.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ChaosError {
    /// A fraction outside 0–1.
    #[error("{kind}: fraction must be between 0 and 1, got {value}")]
    Fraction {
        /// Which disruption.
        kind: &'static str,
        /// The value.
        value: f64,
    },
    /// A disruption of zero length.
    #[error("{kind}: duration must be more than zero")]
    Duration {
        /// Which disruption.
        kind: &'static str,
    },
    /// Rounds overlapping themselves.
    #[error("{kind}: every ({every:?}) must be zero or longer than duration ({duration:?})")]
    Every {
        /// Which disruption.
        kind: &'static str,
        /// The period.
        every: Duration,
        /// The duration.
        duration: Duration,
    },
    /// Churn without a rate, or a rate without nodes.
    #[error("churn: per-minute must be above zero and nodes at least 1")]
    Churn,
}

impl ChaosSpec {
    /// Checks every setting; the error names the one that is wrong.
    pub fn validate(&self) -> Result<(), ChaosError> {
        for (kind, d) in [("runtimeDown", &self.runtime_down), ("flapping", &self.flapping)] {
            let Some(d) = d else { continue };
            if !(0.0..=1.0).contains(&d.fraction) {
                return Err(ChaosError::Fraction {
                    kind,
                    value: d.fraction,
                });
            }
            if d.duration.is_zero() {
                return Err(ChaosError::Duration { kind });
            }
            if !d.every.is_zero() && d.every <= d.duration {
                return Err(ChaosError::Every {
                    kind,
                    every: d.every,
                    duration: d.duration,
                });
            }
        }
        if let Some(c) = &self.churn
            && (c.nodes == 0 || c.per_minute.is_nan() || c.per_minute <= 0.0)
        {
            return Err(ChaosError::Churn);
        }
        Ok(())
    }

    /// Whether anything is configured.
    pub fn is_empty(&self) -> bool {
        self.runtime_down.is_none() && self.flapping.is_none() && self.churn.is_none()
    }
}

/// Durations written as `500ms`, `30s`, `5m`, `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (number, unit) = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .map_or((t, ""), |i| t.split_at(i));
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 500ms, 30s, 5m)"))?;
    let secs = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("{text:?}: the unit must be ms, s, m or h")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{text:?}: {e}"))
}

mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

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

    #[test]
    fn durations_take_the_usual_units_and_reject_others() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_duration("30").unwrap_err().contains("unit"));
        assert!(parse_duration("fast").unwrap_err().contains("not a duration"));
    }

    #[test]
    fn the_chaos_section_reads_and_validates() {
        let spec: ChaosSpec = serde_yaml::from_str(
            "runtimeDown: {fraction: 0.1, duration: 30s, every: 5m}\n\
             flapping: {fraction: 0.05, duration: 60s}\n\
             churn: {nodes: 10, perMinute: 2}\n",
        )
        .unwrap();
        assert_eq!(
            spec.runtime_down,
            Some(Disruption {
                fraction: 0.1,
                duration: Duration::from_secs(30),
                every: Duration::from_secs(300)
            })
        );
        assert_eq!(spec.flapping.unwrap().every, Duration::ZERO, "one round");
        assert_eq!(spec.validate(), Ok(()));
        let bad = ChaosSpec {
            flapping: Some(Disruption {
                fraction: 1.5,
                duration: Duration::from_secs(1),
                every: Duration::ZERO,
            }),
            ..ChaosSpec::default()
        };
        assert_eq!(
            bad.validate().unwrap_err().to_string(),
            "flapping: fraction must be between 0 and 1, got 1.5"
        );
        let overlapping = ChaosSpec {
            runtime_down: Some(Disruption {
                fraction: 0.5,
                duration: Duration::from_secs(60),
                every: Duration::from_secs(30),
            }),
            ..ChaosSpec::default()
        };
        assert!(matches!(overlapping.validate(), Err(ChaosError::Every { .. })));
        let typo = serde_yaml::from_str::<ChaosSpec>("flaping: {fraction: 0.1, duration: 1s}");
        assert!(typo.unwrap_err().to_string().contains("flaping"));
    }

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
