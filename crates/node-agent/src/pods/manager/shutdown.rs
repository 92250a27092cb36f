//! Graceful node shutdown, the pod side: pods are stopped in groups of rising priority, each group given its
//! share of `shutdownGracePeriod` (by default: regular pods `shutdownGracePeriod −
//! shutdownGracePeriodCriticalPods`, then critical pods — priority ≥ 2,000,000,000 — the rest; or the
//! `shutdownGracePeriodByPodPriority` table). A group's pods are stopped together, each within the group's
//! period or its own shorter grace period; the next group starts when they have all stopped or the period
//! is over. Stopped pods are reported as the kubelet reports them: phase Failed, reason `Terminated`, the
//! shutdown message, and a `DisruptionTarget` condition (reason `TerminationByKubelet`). New pods are refused
//! (`NodeShutdown`) from the start of the shutdown.

use std::time::Duration;

use tokio::sync::oneshot;

use crate::pods::model::spec::SYSTEM_CRITICAL_PRIORITY;
use crate::pods::worker::WorkerReport;
use crate::pods::worker::disruption::KillCause;
use crate::pods::worker::state::KillOrder;

pub use crate::pods::worker::disruption::{SHUTDOWN_MESSAGE as MESSAGE, SHUTDOWN_REASON as REASON};
/// Admission reason for pods arriving during a shutdown.
pub const NOT_ADMITTED_REASON: &str = "NodeShutdown";
/// Admission message for pods arriving during a shutdown.
pub const NOT_ADMITTED_MESSAGE: &str = "Pod was rejected as the node is shutting down.";

/// How long after the last group's period the pods still stopping are waited for (a runtime's stop returns a
/// little after the grace period it was given: the kill and the reaping), so their Failed status is reported
/// before the agent exits.
pub const STOP_SLACK: Duration = Duration::from_secs(2);

pub use crate::config::ShutdownGroup;

/// The groups, lowest priority first: `by_priority` when given, else the two groups of `period` and
/// `critical` (none when `period` is zero).
pub fn groups(period: Duration, critical: Duration, by_priority: &[ShutdownGroup]) -> Vec<ShutdownGroup> {
    let mut groups: Vec<ShutdownGroup> = if by_priority.is_empty() {
        if period.is_zero() || critical > period {
            return Vec::new();
        }
        vec![
            ShutdownGroup {
                priority: 0,
                grace: period - critical,
            },
            ShutdownGroup {
                priority: SYSTEM_CRITICAL_PRIORITY,
                grace: critical,
            },
        ]
    } else {
        by_priority.to_vec()
    };
    groups.sort_by_key(|g| g.priority);
    groups
}

/// The index of the group a pod of `priority` is in: the highest group whose priority it reaches, or the
/// lowest one.
pub fn group_of(groups: &[ShutdownGroup], priority: i32) -> usize {
    groups.iter().rposition(|g| priority >= g.priority).unwrap_or(0)
}

/// A request to the pod manager to shut the node's pods down.
#[derive(Debug)]
pub struct ShutdownRequest {
    /// The groups (see [`groups`]).
    pub groups: Vec<ShutdownGroup>,
    /// Answered when every group is done (pods stopped or periods over).
    pub done: oneshot::Sender<()>,
}

/// Stops `pods` (UID, priority) group by group, through the pod manager (`orders`); returns when the last group
/// is done and the pods still stopping then have stopped (or [`STOP_SLACK`] has passed).
pub(crate) async fn run(
    groups: Vec<ShutdownGroup>,
    pods: Vec<(std::sync::Arc<str>, i32)>,
    orders: crate::density::chan::UnboundedSender<WorkerReport>,
) {
    let mut by_group: Vec<Vec<std::sync::Arc<str>>> = vec![Vec::new(); groups.len()];
    for (uid, priority) in pods {
        by_group[group_of(&groups, priority)].push(uid);
    }
    let mut late = Vec::new();
    for (group, workers) in groups.iter().zip(by_group) {
        if workers.is_empty() {
            continue;
        }
        let grace_secs = i64::try_from(group.grace.as_secs()).unwrap_or(i64::MAX);
        let mut waits = Vec::new();
        for uid in workers {
            let (done, wait) = oneshot::channel();
            let order = Box::new(KillOrder {
                grace_secs,
                cause: KillCause::Shutdown,
                done,
            });
            // a pod whose worker is gone by then drops its order: its wait ends at once
            if orders.send(WorkerReport::Kill { uid, order }).is_ok() {
                waits.push(wait);
            }
        }
        tracing::info!(priority = group.priority, pods = waits.len(), grace = ?group.grace, "shutting down pods");
        let mut all = futures::future::join_all(waits);
        if tokio::time::timeout(group.grace, &mut all).await.is_err() {
            tracing::warn!(
                priority = group.priority,
                "pods still stopping when their shutdown period ended"
            );
            late.push(all);
        }
    }
    if !late.is_empty()
        && tokio::time::timeout(STOP_SLACK, futures::future::join_all(late))
            .await
            .is_err()
    {
        tracing::warn!(
            "pods still stopping after the shutdown period; their final status may not be written"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::worker::disruption::mark_status;
    use k8s_openapi::api::core::v1::PodStatus;

    #[test]
    fn default_groups_split_the_period() {
        let g = groups(Duration::from_secs(10), Duration::from_secs(4), &[]);
        assert_eq!(
            g,
            vec![
                ShutdownGroup {
                    priority: 0,
                    grace: Duration::from_secs(6)
                },
                ShutdownGroup {
                    priority: SYSTEM_CRITICAL_PRIORITY,
                    grace: Duration::from_secs(4)
                },
            ]
        );
        assert_eq!(group_of(&g, 0), 0);
        assert_eq!(group_of(&g, -5), 0);
        assert_eq!(group_of(&g, 1_000_000), 0);
        assert_eq!(group_of(&g, SYSTEM_CRITICAL_PRIORITY), 1);
        assert_eq!(group_of(&g, SYSTEM_CRITICAL_PRIORITY + 1000), 1);
        assert!(groups(Duration::ZERO, Duration::ZERO, &[]).is_empty());
    }

    #[test]
    fn shutdown_status_is_the_kubelets() {
        let mut s = PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        };
        mark_status(&mut s, &KillCause::Shutdown, Some(1));
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert_eq!(s.reason.as_deref(), Some("Terminated"));
        assert_eq!(s.message.as_deref(), Some(MESSAGE));
        let c = &s.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (c.type_.as_str(), c.status.as_str()),
            ("DisruptionTarget", "True")
        );
        assert_eq!(c.reason.as_deref(), Some("TerminationByKubelet"));
        let mut done = PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        };
        mark_status(&mut done, &KillCause::Shutdown, None);
        assert_eq!(done.phase.as_deref(), Some("Succeeded"));
    }
}
