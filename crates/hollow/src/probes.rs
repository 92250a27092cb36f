//! Hollow nodes' network probes: HTTP, TCP and gRPC probe actions are answered from each node's fake runtime
//! script (`cri-fake.node-agent.io/probe`), so readiness, liveness and startup behave as scripted while the
//! agent's own prober logic (periods, thresholds, restarts) runs unchanged. Exec probes already go through the
//! runtime's `ExecSync`.

use cri_fake::FakeRuntime;
use node_agent::pods::spec::Action;
use node_agent::pods::{FnProbes, ProbeOutcome, ProbeTarget};

/// A probe transport answering from `fake`'s script.
pub fn scripted(
    fake: FakeRuntime,
) -> FnProbes<impl Fn(&ProbeTarget<'_>, &Action) -> ProbeOutcome + Send + Sync> {
    FnProbes::new(move |target, action| {
        let scripted = match action {
            Action::Http(h) => cri_fake::ProbeTarget::Http {
                port: h.port,
                path: &h.path,
            },
            Action::Tcp { port, .. } => cri_fake::ProbeTarget::Tcp { port: *port },
            Action::Grpc { port, service } => cri_fake::ProbeTarget::Grpc { port: *port, service },
            other => return ProbeOutcome::Unknown(format!("{other:?} is not a network probe")),
        };
        match fake.probe_result(target.container_id, scripted) {
            Ok(true) => ProbeOutcome::Success,
            Ok(false) => ProbeOutcome::Failure("scripted probe failure".into()),
            Err(e) => ProbeOutcome::Unknown(e.to_string()),
        }
    })
}
