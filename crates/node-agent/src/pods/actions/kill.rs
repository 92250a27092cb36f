//! Stopping containers and pods, the kubelet's way.
//!
//! One container: a `Killing` event, the preStop hook within the grace period, then `StopContainer` with what
//! is left of it (never less than 2 s). A pod: app containers in parallel with the pod's grace period, then
//! sidecars one by one in reverse order with the remainder, then anything else still running, then
//! `StopPodSandbox`. Removal (`RemoveContainer`, `RemovePodSandbox`) is separate: it happens only once the pod
//! object is going away. Dead instances of a running pod's containers are left to the container garbage
//! collector ([`crate::gc`]), which follows the node's policy.

use std::time::Duration;

use futures::future::join_all;
use runtime_api::{RuntimeError, cri};
use tokio::time::Instant;

use crate::pods::actions::action::{self, Where};
use crate::pods::actions::context::ActionCtx;
use crate::pods::events::EventType;
use crate::pods::model::spec::DesiredPod;
use crate::pods::probes::ProbeOutcome;
use crate::pods::runtime::observed::{CState, ContainerRecord, RuntimeView};

/// The kubelet's floor for `StopContainer`'s timeout.
const MIN_GRACE: Duration = Duration::from_secs(2);

fn ok_if_gone<T>(r: Result<T, RuntimeError>) -> Result<(), RuntimeError> {
    match r {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

/// `StopContainer` with `timeout` seconds; an unknown container counts as stopped.
pub(crate) async fn stop_container(ctx: &ActionCtx, id: &str, timeout: u64) -> Result<(), RuntimeError> {
    let timeout = i64::try_from(timeout).unwrap_or(i64::MAX);
    let req = cri::StopContainerRequest {
        container_id: id.to_owned(),
        timeout,
    };
    ok_if_gone(ctx.rt("stop_container", ctx.runtime.stop_container(req)).await)
}

/// `RemoveContainer`; an unknown container counts as removed.
async fn remove_container(ctx: &ActionCtx, id: &str) -> Result<(), RuntimeError> {
    let req = cri::RemoveContainerRequest {
        container_id: id.to_owned(),
    };
    ok_if_gone(
        ctx.rt("remove_container", ctx.runtime.remove_container(req))
            .await,
    )
}

/// `StopPodSandbox`; an unknown sandbox counts as stopped.
pub(crate) async fn stop_sandbox(ctx: &ActionCtx, id: &str) -> Result<(), RuntimeError> {
    let req = cri::StopPodSandboxRequest {
        pod_sandbox_id: id.to_owned(),
    };
    ok_if_gone(ctx.rt("stop_podsandbox", ctx.runtime.stop_pod_sandbox(req)).await)
}

/// A container to stop: its id, its name in the spec, and whether it runs (only then is preStop run).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Victim<'a> {
    pub id: &'a str,
    pub name: &'a str,
    pub running: bool,
}

impl<'a> From<&'a ContainerRecord> for Victim<'a> {
    fn from(r: &'a ContainerRecord) -> Self {
        Self {
            id: &r.id,
            name: &r.name,
            running: r.state == CState::Running,
        }
    }
}

/// Stops one container within `grace`.
pub(crate) async fn kill_container(
    ctx: &ActionCtx,
    pod: &DesiredPod,
    victim: Victim<'_>,
    pod_ip: &str,
    grace: Duration,
    message: Option<&str>,
) -> Result<(), RuntimeError> {
    let message = message.map_or_else(|| format!("Stopping container {}", victim.name), str::to_owned);
    ctx.events
        .container(pod, victim.name, EventType::Normal, "Killing", message);
    let started = Instant::now();
    let pre_stop = pod.container(victim.name).and_then(|c| c.pre_stop.as_ref());
    if let (Some(hook), true) = (pre_stop, victim.running) {
        let at = Where {
            pod,
            container: victim.name,
            container_id: victim.id,
            pod_ip,
        };
        match tokio::time::timeout(grace, action::run(ctx, at, hook, grace)).await {
            Ok(ProbeOutcome::Success | ProbeOutcome::Warning(_)) => {}
            Ok(ProbeOutcome::Failure(out) | ProbeOutcome::Unknown(out)) => {
                let msg = format!("PreStopHook failed: {out}");
                ctx.events
                    .container(pod, victim.name, EventType::Warning, "FailedPreStopHook", msg);
            }
            Err(_) => {
                let msg = format!(
                    "PreStopHook did not finish within the grace period of {}s",
                    grace.as_secs()
                );
                ctx.events
                    .container(pod, victim.name, EventType::Warning, "FailedPreStopHook", msg);
            }
        }
    }
    // whole seconds, the hook's time rounded down (as the kubelet counts it), never below the floor
    let remaining = grace
        .as_secs()
        .saturating_sub(started.elapsed().as_secs())
        .max(MIN_GRACE.as_secs());
    stop_container(ctx, victim.id, remaining).await
}

fn alive(r: &&ContainerRecord) -> bool {
    matches!(r.state, CState::Running | CState::Created | CState::Unknown)
}

/// Stops every container of the pod, then its sandboxes, within `grace`.
pub(crate) async fn kill_pod(
    ctx: &ActionCtx,
    pod: &DesiredPod,
    view: &RuntimeView,
    grace: Duration,
) -> Result<(), RuntimeError> {
    let deadline = Instant::now() + grace;
    let pod_ip = ctx.pod_ip(pod, view.sandbox());
    let is_sidecar = |name: &str| pod.init_containers.iter().any(|c| c.sidecar && c.name == name);
    let first: Vec<&ContainerRecord> = view
        .containers
        .iter()
        .filter(alive)
        .filter(|r| !is_sidecar(&r.name))
        .collect();
    let results = join_all(
        first
            .iter()
            .map(|r| kill_container(ctx, pod, Victim::from(*r), &pod_ip, grace, None)),
    )
    .await;
    let mut outcome: Result<(), RuntimeError> = results.into_iter().collect();
    for c in pod.init_containers.iter().rev().filter(|c| c.sidecar) {
        for r in view.containers.iter().filter(alive).filter(|r| r.name == c.name) {
            let left = deadline.saturating_duration_since(Instant::now());
            if let Err(e) = kill_container(ctx, pod, r.into(), &pod_ip, left, None).await {
                outcome = Err(e);
            }
        }
    }
    for sb in view.sandboxes.iter().filter(|s| s.ready) {
        if let Err(e) = stop_sandbox(ctx, &sb.id).await {
            outcome = Err(e);
        }
    }
    outcome
}

/// Removes every container and sandbox of the pod from the runtime.
pub(crate) async fn remove_pod(ctx: &ActionCtx, view: &RuntimeView) -> Result<(), RuntimeError> {
    for c in view.containers.iter() {
        remove_container(ctx, &c.id).await?;
    }
    for sb in &view.sandboxes {
        stop_sandbox(ctx, &sb.id).await?;
        let req = cri::RemovePodSandboxRequest {
            pod_sandbox_id: sb.id.to_string(),
        };
        ok_if_gone(
            ctx.rt("remove_podsandbox", ctx.runtime.remove_pod_sandbox(req))
                .await,
        )?;
    }
    Ok(())
}
