//! Graceful node shutdown: `shutdownGracePeriod` and `shutdownGracePeriodCriticalPods`, or the groups of
//! `shutdownGracePeriodByPodPriority` in their stead.

use std::time::Duration;

use crate::config::ShutdownGroup;
use crate::config::check::Check;
use crate::config::file::FileConfig;

/// The graceful shutdown settings, resolved.
pub(super) struct Shutdown {
    pub(super) shutdown_grace_period: Duration,
    pub(super) shutdown_grace_period_critical_pods: Duration,
    pub(super) shutdown_grace_period_by_pod_priority: Vec<ShutdownGroup>,
}

/// The graceful shutdown settings, checked as the kubelet checks them.
pub(super) fn shutdown(c: &mut Check<'_>, f: &FileConfig) -> Shutdown {
    let shutdown_grace_period = f.shutdown_grace_period.unwrap_or_default();
    let shutdown_grace_period_critical_pods = f.shutdown_grace_period_critical_pods.unwrap_or_default();
    if shutdown_grace_period_critical_pods > shutdown_grace_period {
        c.err(
            "shutdownGracePeriodCriticalPods",
            "must not be greater than shutdownGracePeriod",
        );
    }
    let mut shutdown_grace_period_by_pod_priority = Vec::new();
    for (i, g) in f
        .shutdown_grace_period_by_pod_priority
        .iter()
        .flatten()
        .enumerate()
    {
        match u64::try_from(g.shutdown_grace_period_seconds) {
            Ok(secs) => shutdown_grace_period_by_pod_priority.push(ShutdownGroup {
                priority: g.priority,
                grace: Duration::from_secs(secs),
            }),
            Err(_) => c.err(
                &format!("shutdownGracePeriodByPodPriority[{i}].shutdownGracePeriodSeconds"),
                "must not be negative",
            ),
        }
    }
    let two_groups_set = !shutdown_grace_period.is_zero() || !shutdown_grace_period_critical_pods.is_zero();
    if !shutdown_grace_period_by_pod_priority.is_empty() && two_groups_set {
        c.err(
            "shutdownGracePeriodByPodPriority",
            "cannot be set together with shutdownGracePeriod or shutdownGracePeriodCriticalPods",
        );
    }
    Shutdown {
        shutdown_grace_period,
        shutdown_grace_period_critical_pods,
        shutdown_grace_period_by_pod_priority,
    }
}
