//! Hollow nodes' network probes: HTTP, TCP and gRPC probe actions are answered from each node's fake runtime
//! script (`cri-fake.node-agent.io/probe`), so readiness, liveness and startup behave as scripted while the
//! agent's own prober logic (periods, thresholds, restarts) runs unchanged. Exec probes already go through the
//! runtime's `ExecSync`.

use cri_fake::FakeRuntime;
use node_agent::pods::{NetTarget, ScriptedProbes};

/// A probe transport answering from `fake`'s script.
pub fn scripted(
    fake: FakeRuntime,
) -> ScriptedProbes<impl Fn(&str, NetTarget<'_>) -> Result<bool, String> + Send + Sync + 'static> {
    ScriptedProbes::new(move |container_id, target| {
        let target = match target {
            NetTarget::Http { port, path } => cri_fake::ProbeTarget::Http { port, path },
            NetTarget::Tcp { port } => cri_fake::ProbeTarget::Tcp { port },
            NetTarget::Grpc { port, service } => cri_fake::ProbeTarget::Grpc { port, service },
        };
        fake.probe_result(container_id, target).map_err(|e| e.to_string())
    })
}
