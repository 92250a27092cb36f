//! Running one probe or lifecycle-hook [`Action`] against a container: `Exec` through the runtime's
//! `ExecSync`, `Http`/`Tcp`/`Grpc` through the [`ProbeTransport`](crate::pods::probes::ProbeTransport), `Sleep` on
//! the tokio clock.

use std::time::Duration;

use runtime_api::{Code, cri};

use crate::pods::actions::context::ActionCtx;
use crate::pods::model::spec::{Action, DesiredPod};
use crate::pods::probes::{ProbeOutcome, ProbeTarget};

/// Where an action runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Where<'a> {
    pub pod: &'a DesiredPod,
    pub container: &'a str,
    pub container_id: &'a str,
    pub pod_ip: &'a str,
}

fn output(resp: &cri::ExecSyncResponse) -> String {
    let mut out = String::from_utf8_lossy(&resp.stdout).into_owned();
    out.push_str(&String::from_utf8_lossy(&resp.stderr));
    out.trim_end().to_owned()
}

/// Runs `action` within `timeout`.
pub(crate) async fn run(ctx: &ActionCtx, at: Where<'_>, action: &Action, timeout: Duration) -> ProbeOutcome {
    match action {
        Action::Exec(cmd) => {
            let req = cri::ExecSyncRequest {
                container_id: at.container_id.to_owned(),
                cmd: cmd.clone(),
                timeout: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX).max(1),
            };
            match ctx.rt("exec_sync", ctx.runtime.exec_sync(req)).await {
                Ok(resp) if resp.exit_code == 0 => ProbeOutcome::Success,
                Ok(resp) => {
                    let out = output(&resp);
                    if out.is_empty() {
                        ProbeOutcome::Failure(format!("command {cmd:?} exited with {}", resp.exit_code))
                    } else {
                        ProbeOutcome::Failure(out)
                    }
                }
                Err(e) if e.code == Code::DeadlineExceeded => {
                    ProbeOutcome::Failure(format!("command {cmd:?} timed out"))
                }
                Err(e) => ProbeOutcome::Unknown(e.to_string()),
            }
        }
        Action::Sleep(d) => {
            tokio::time::sleep((*d).min(timeout)).await;
            ProbeOutcome::Success
        }
        network => {
            let target = ProbeTarget {
                namespace: &at.pod.namespace,
                pod: &at.pod.name,
                container: at.container,
                container_id: at.container_id,
                pod_ip: at.pod_ip,
            };
            match tokio::time::timeout(timeout, ctx.probes.check(&target, network, timeout)).await {
                Ok(outcome) => outcome,
                Err(_) => ProbeOutcome::Failure(format!("probe timed out after {timeout:?}")),
            }
        }
    }
}
