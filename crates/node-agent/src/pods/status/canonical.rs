//! The kubelet-owned part of a pod status as JSON: the body of the strategic-merge PATCH, and (hashed) the
//! "did anything change" test — computed the same way for a status we generate and for the status the API
//! server holds, so an agent restart that regenerates an identical status writes nothing.
//!
//! Container states list all three of `waiting` / `running` / `terminated`, the absent ones as `null`, so the
//! strategic merge replaces the state instead of merging two of them; `podIPs` and `hostIPs` carry the
//! `$patch: replace` directive; conditions merge by type, so other writers' conditions (readiness gates,
//! DisruptionTarget) survive.

use k8s_openapi::api::core::v1::{ContainerState, ContainerStatus, PodStatus};
use serde_json::{Value, json};

/// The condition types the agent owns, in the order it writes them.
pub(crate) const OWNED_CONDITIONS: [&str; 5] = [
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodScheduled",
];

fn state(s: Option<&ContainerState>) -> Value {
    // absent and empty are the same state (the API server returns `lastState: {}`)
    let empty = ContainerState::default();
    let s = s.unwrap_or(&empty);
    json!({
        "waiting": s.waiting.as_ref().map(|w| json!({"reason": w.reason, "message": w.message})),
        "running": s.running.as_ref().map(|r| json!({"startedAt": r.started_at})),
        "terminated": s.terminated.as_ref().map(|t| json!({
            "exitCode": t.exit_code,
            "reason": t.reason,
            "message": t.message,
            "startedAt": t.started_at,
            "finishedAt": t.finished_at,
            "containerID": t.container_id,
        })),
    })
}

fn container(c: &ContainerStatus) -> Value {
    json!({
        "name": c.name,
        "state": state(c.state.as_ref()),
        "lastState": state(c.last_state.as_ref()),
        "ready": c.ready,
        "started": c.started,
        "restartCount": c.restart_count,
        "image": c.image,
        "imageID": c.image_id,
        "containerID": c.container_id,
    })
}

fn ips(list: Option<Vec<String>>) -> Value {
    match list {
        None => Value::Null,
        Some(list) => {
            let mut items: Vec<Value> = vec![json!({"$patch": "replace"})];
            items.extend(list.into_iter().map(|ip| json!({"ip": ip})));
            Value::Array(items)
        }
    }
}

/// The owned fields of `s` as a strategic-merge patch of `status`.
pub(crate) fn owned(s: &PodStatus) -> Value {
    // DisruptionTarget is ours only when the agent set it (graceful node shutdown)
    let disruption = s
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionTarget" && c.reason.as_deref() == Some("TerminationByKubelet"));
    let conditions: Vec<Value> = OWNED_CONDITIONS
        .iter()
        .filter_map(|t| s.conditions.as_ref()?.iter().find(|c| c.type_ == *t))
        .chain(disruption)
        .map(|c| {
            json!({
                "type": c.type_,
                "status": c.status,
                "reason": c.reason,
                "message": c.message,
                "lastTransitionTime": c.last_transition_time,
                "observedGeneration": c.observed_generation,
            })
        })
        .collect();
    json!({
        "phase": s.phase,
        "reason": s.reason,
        "message": s.message,
        "conditions": conditions,
        "hostIP": s.host_ip,
        "hostIPs": ips(s.host_ips.as_ref().map(|l| l.iter().map(|h| h.ip.clone()).collect())),
        "podIP": s.pod_ip,
        "podIPs": ips(s.pod_ips.as_ref().map(|l| l.iter().map(|p| p.ip.clone()).collect())),
        "startTime": s.start_time,
        "qosClass": s.qos_class,
        "observedGeneration": s.observed_generation,
        "initContainerStatuses": s.init_container_statuses.as_ref().map(|l| l.iter().map(container).collect::<Vec<_>>()),
        "containerStatuses": s.container_statuses.as_ref().map(|l| l.iter().map(container).collect::<Vec<_>>()),
    })
}

/// A stable fingerprint of the owned fields (FNV-1a over the canonical JSON).
pub(crate) fn fingerprint(s: &PodStatus) -> u64 {
    hash_of(&owned(s))
}

/// FNV-1a over the JSON form of `value`, written straight into the hash (no text is kept).
pub(crate) fn hash_of(value: &impl serde::Serialize) -> u64 {
    struct Fnv(u64);
    impl std::io::Write for Fnv {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            for b in buf {
                self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    // writing to the hash cannot fail, and these values always serialise
    let _ = serde_json::to_writer(&mut h, value);
    h.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_null_out_the_other_variants_and_ips_replace() {
        let s: PodStatus = serde_json::from_value(json!({
            "phase": "Running",
            "podIPs": [{"ip": "10.0.0.5"}],
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "example.com/gate", "status": "True"}],
            "containerStatuses": [{"name": "a", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                "state": {"running": {"startedAt": "2024-01-01T00:00:00Z"}}}]
        }))
        .unwrap();
        let v = owned(&s);
        assert_eq!(v["containerStatuses"][0]["state"]["waiting"], Value::Null);
        assert!(
            v["containerStatuses"][0]["state"]
                .as_object()
                .unwrap()
                .contains_key("waiting")
        );
        assert_eq!(v["podIPs"][0]["$patch"], "replace");
        assert_eq!(
            v["conditions"].as_array().unwrap().len(),
            1,
            "foreign conditions are not ours"
        );
        let mut other = s.clone();
        assert_eq!(fingerprint(&s), fingerprint(&other));
        other.phase = Some("Failed".into());
        assert_ne!(fingerprint(&s), fingerprint(&other));
    }
}
