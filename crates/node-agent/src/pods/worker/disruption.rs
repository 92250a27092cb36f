//! Why a worker stops its pod before its containers end — a graceful node shutdown or an eviction asked for, or
//! the pod's `activeDeadlineSeconds` passed — and how the pod's final status shows it, as the kubelet reports it.

use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// `status.reason` of a pod stopped by a node shutdown.
pub const SHUTDOWN_REASON: &str = "Terminated";
/// `status.message` of a pod stopped by a node shutdown.
pub const SHUTDOWN_MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";

/// `status.reason` (and the event's reason) of a pod stopped at its `activeDeadlineSeconds`.
pub const DEADLINE_REASON: &str = "DeadlineExceeded";
/// `status.message` (and the event's message) of a pod stopped at its `activeDeadlineSeconds`.
pub const DEADLINE_MESSAGE: &str = "Pod was active on the node longer than the specified deadline";

/// Why a worker stops its pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KillCause {
    /// Graceful node shutdown.
    Shutdown,
    /// Evicted: the status reason and message.
    Evicted { reason: String, message: String },
    /// `activeDeadlineSeconds` passed since the pod's start.
    Deadline,
}

/// Marks a final status with the cause: phase Failed (a shutdown leaves a Succeeded pod Succeeded), the reason
/// and message, and for a disruption (not a passed deadline) a `DisruptionTarget` condition (reason
/// `TerminationByKubelet`).
pub(crate) fn mark_status(status: &mut PodStatus, cause: &KillCause, generation: Option<i64>) {
    let (reason, message) = match cause {
        KillCause::Shutdown => (SHUTDOWN_REASON, SHUTDOWN_MESSAGE),
        KillCause::Evicted { reason, message } => (reason.as_str(), message.as_str()),
        KillCause::Deadline => (DEADLINE_REASON, DEADLINE_MESSAGE),
    };
    if *cause != KillCause::Shutdown || status.phase.as_deref() != Some("Succeeded") {
        status.phase = Some("Failed".into());
    }
    status.reason = Some(reason.into());
    status.message = Some(message.into());
    if *cause == KillCause::Deadline {
        return;
    }
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let existing = conditions.iter().position(|c| c.type_ == "DisruptionTarget");
    let condition = PodCondition {
        type_: "DisruptionTarget".into(),
        status: "True".into(),
        reason: Some("TerminationByKubelet".into()),
        message: Some(message.into()),
        last_transition_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        observed_generation: generation,
        ..Default::default()
    };
    match existing {
        Some(i) if conditions[i].status == "True" => {}
        Some(i) => conditions[i] = condition,
        None => conditions.push(condition),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_evicted_pod_fails_even_if_it_had_succeeded() {
        let mut s = PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        };
        let cause = KillCause::Evicted {
            reason: "Evicted".into(),
            message: "The node was low on resource: memory. ".into(),
        };
        mark_status(&mut s, &cause, Some(2));
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert_eq!(s.reason.as_deref(), Some("Evicted"));
        let c = &s.conditions.as_ref().unwrap()[0];
        assert_eq!(c.reason.as_deref(), Some("TerminationByKubelet"));
        assert_eq!(
            c.message.as_deref(),
            Some("The node was low on resource: memory. ")
        );
        assert_eq!(c.observed_generation, Some(2));
    }
}
