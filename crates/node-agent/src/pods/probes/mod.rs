//! Probes: liveness, readiness and startup checks with the kubelet's semantics.
//!
//! * [`ProbeTransport`] is how network probes (and HTTP lifecycle hooks) reach a container: real mode uses
//!   [`NetworkProbes`] (TCP connect, HTTP GET, gRPC health check); an agent on an in-memory runtime (hollow
//!   nodes, `node-agent --runtime fake`) a [`ScriptedProbes`] that asks that runtime's script and never touches
//!   the network. Exec probes always go through the runtime's `ExecSync`.
//! * `prober` runs one task per pod with probes: one timer per probe, startup gating the other
//!   two, thresholds, `Unhealthy` events, results to the pod worker on change.
//! * `metrics` keeps one node's per-probe series for `/metrics/probes` ([`ProbeMetrics`]).

pub(crate) mod metrics;
mod network;
mod scripted;

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::PodStatus;

use async_trait::async_trait;

pub use metrics::ProbeMetrics;
pub use network::NetworkProbes;
pub use scripted::{NetTarget, ScriptedProbes};

use crate::pods::model::spec::Action;

/// Which probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeKind {
    /// Restart the container when it fails.
    Liveness,
    /// Mark the container (and pod) not ready when it fails.
    Readiness,
    /// Hold the other probes until it succeeds; restart the container when it fails.
    Startup,
}

impl ProbeKind {
    /// `Liveness`, `Readiness` or `Startup`, as in event messages and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Liveness => "Liveness",
            Self::Readiness => "Readiness",
            Self::Startup => "Startup",
        }
    }
}

/// The result of one probe or hook call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// Passed.
    Success,
    /// Passed, with a warning shown in a `ProbeWarning` event (an HTTP probe answered with a redirect it did
    /// not follow).
    Warning(String),
    /// Failed, with the output or error shown in the `Unhealthy` event.
    Failure(String),
    /// Could not be run at all (ignored by the thresholds, like the kubelet does).
    Unknown(String),
}

/// Who a network probe or hook is aimed at.
#[derive(Debug, Clone, Copy)]
pub struct ProbeTarget<'a> {
    /// Pod namespace.
    pub namespace: &'a str,
    /// Pod name.
    pub pod: &'a str,
    /// Container name.
    pub container: &'a str,
    /// Runtime container id.
    pub container_id: &'a str,
    /// The pod IP (the default host of HTTP/TCP/gRPC actions).
    pub pod_ip: &'a str,
}

/// Carries network probes to containers.
#[async_trait]
pub trait ProbeTransport: Send + Sync + 'static {
    /// Runs an `Http`, `Tcp` or `Grpc` action against `target` within `timeout`.
    async fn check(&self, target: &ProbeTarget<'_>, action: &Action, timeout: Duration) -> ProbeOutcome;
}

/// The latest probe results of one pod's containers, by container id, as its worker keeps them.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProbeResults {
    // made at the first result: a pointer and nothing allocated for a pod without probes (the worker holds this
    // for the pod's whole life, where an empty map in place takes three words)
    #[allow(
        clippy::box_collection,
        reason = "8 bytes in the idle worker while empty, as for most pods"
    )]
    by_id: Option<Box<std::collections::BTreeMap<String, ProbeState>>>,
}

#[derive(Debug, Clone, Copy, Default)]
struct ProbeState {
    ready: Option<bool>,
    started: Option<bool>,
    failed: Option<ProbeKind>,
}

impl ProbeResults {
    fn state_mut(&mut self, id: &str) -> &mut ProbeState {
        self.by_id
            .get_or_insert_default()
            .entry(id.to_owned())
            .or_default()
    }

    fn state(&self, id: &str) -> Option<&ProbeState> {
        self.by_id.as_deref()?.get(id)
    }

    /// Records a result change from the prober.
    pub(crate) fn apply(&mut self, u: &ProbeUpdate) {
        let s = self.state_mut(&u.container_id);
        match u.kind {
            ProbeKind::Readiness => s.ready = Some(u.ok),
            ProbeKind::Startup => {
                s.started = Some(u.ok);
                if !u.ok {
                    s.failed = Some(ProbeKind::Startup);
                }
            }
            ProbeKind::Liveness if !u.ok => s.failed = Some(ProbeKind::Liveness),
            ProbeKind::Liveness => {}
        }
    }

    /// Seeds results for a container that was running before this agent started.
    pub(crate) fn seed(&mut self, id: &str, ready: bool, started: bool) {
        let s = self.state_mut(id);
        s.ready = ready.then_some(true);
        s.started = started.then_some(true);
    }

    /// What a new prober starts from: the readiness and startup successes, by container id (so a prober
    /// started again does not take a ready container back to unready until its probe runs).
    pub(crate) fn seeds(&self) -> Seeds {
        self.by_id
            .iter()
            .flat_map(|m| m.iter())
            .filter(|(_, s)| s.ready == Some(true) || s.started == Some(true))
            .map(|(id, s)| (id.clone(), (s.ready == Some(true), s.started == Some(true))))
            .collect()
    }

    /// The readiness result (`None`: no result yet).
    pub(crate) fn ready(&self, id: &str) -> Option<bool> {
        self.state(id).and_then(|s| s.ready)
    }

    /// Whether the startup probe passed.
    pub(crate) fn started(&self, id: &str) -> bool {
        self.state(id).and_then(|s| s.started) == Some(true)
    }

    /// A liveness or startup failure that requires a restart.
    pub(crate) fn failed(&self, id: &str) -> Option<ProbeKind> {
        self.state(id).and_then(|s| s.failed)
    }

    /// Drops results of containers not in `live`.
    pub(crate) fn retain(&mut self, live: impl Fn(&str) -> bool) {
        if let Some(map) = self.by_id.as_deref_mut() {
            map.retain(|id, _| live(id));
            if map.is_empty() {
                self.by_id = None;
            }
        }
    }
}

/// A probe result change for the pod worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProbeUpdate {
    pub container_id: String,
    pub container: String,
    pub kind: ProbeKind,
    pub ok: bool,
}

/// Initial results for containers that already ran before this agent started: `(ready, started)` by id.
pub(crate) type Seeds = HashMap<String, (bool, bool)>;

/// The seeds a status the API server holds gives: `ready` and `started` of every container it names by id.
pub(crate) fn seeds(status: &PodStatus) -> Seeds {
    let all = status.container_statuses.iter().flatten();
    all.chain(status.init_container_statuses.iter().flatten())
        .filter_map(|cs| {
            let id = cs.container_id.as_deref()?.split_once("://")?.1.to_owned();
            Some((id, (cs.ready, cs.started == Some(true))))
        })
        .collect()
}
