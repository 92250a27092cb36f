//! The `oom_score_adj` each container is created with, from its pod's QoS class, as the kubelet computes it:
//! the kernel then picks BestEffort containers first under memory pressure, Burstable ones by how small a share
//! of the node's memory they request, Guaranteed and node-critical ones last.

use crate::pods::model::resources::QosClass;
use crate::pods::model::spec::{ContainerSpec, DesiredPod, SYSTEM_CRITICAL_PRIORITY};

/// The score of Guaranteed and node-critical containers.
pub const GUARANTEED: i64 = -997;
/// The score of BestEffort containers.
pub const BEST_EFFORT: i64 = 1000;
/// The priority `system-node-critical` gives.
const NODE_CRITICAL_PRIORITY: i32 = SYSTEM_CRITICAL_PRIORITY + 1000;

/// `oom_score_adj` for container `c` of `pod` on a node with `memory_capacity` bytes: -997 for a Guaranteed or
/// node-critical pod, 1000 for a BestEffort one; for a Burstable one `1000 - 1000 * request / capacity`, a
/// sidecar's no higher than the score of the regular container requesting least, kept within `[3, 999]` so
/// that it stays between the other two classes. A pod-level memory request beyond what its containers request
/// is shared equally among its containers, each counting its share as part of its request.
pub fn container(pod: &DesiredPod, c: &ContainerSpec, memory_capacity: u64) -> i64 {
    if pod.priority >= NODE_CRITICAL_PRIORITY {
        return GUARANTEED;
    }
    match pod.qos {
        QosClass::Guaranteed => return GUARANTEED,
        QosClass::BestEffort => return BEST_EFFORT,
        QosClass::Burstable => {}
    }
    let capacity = i64::try_from(memory_capacity).unwrap_or(i64::MAX).max(1);
    let score = |request: i64| 1000 - (1000 * i128::from(request) / i128::from(capacity)) as i64;
    let share = pod
        .pod_level()
        .and_then(|p| p.memory_request)
        .map_or(0, |pod_request| {
            let own = crate::pods::model::resources::pod_requests(
                &pod.init_containers,
                &pod.containers,
                Default::default(),
            );
            let n = (pod.containers.len() + pod.init_containers.len()).max(1);
            (pod_request - own.memory) / i64::try_from(n).unwrap_or(1)
        });
    let mut adj = score(c.resources.memory_request.unwrap_or(0) + share);
    let is_sidecar = c.sidecar && pod.init_containers.iter().any(|i| i.name == c.name);
    if is_sidecar {
        let least = pod
            .containers
            .iter()
            .map(|r| r.resources.memory_request.unwrap_or(0))
            .min()
            .unwrap_or(0);
        adj = adj.min(score(least + share));
    }
    if adj < 1000 + GUARANTEED {
        return 1000 + GUARANTEED;
    }
    if adj == BEST_EFFORT {
        return adj - 1;
    }
    adj
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    fn desired(spec: serde_json::Value) -> Arc<DesiredPod> {
        let pod =
            serde_json::from_value(json!({"metadata": {"name": "p", "uid": "u"}, "spec": spec})).unwrap();
        DesiredPod::from_pod(&pod).unwrap()
    }

    const GI: u64 = 1 << 30;

    fn burstable(containers: serde_json::Value) -> Arc<DesiredPod> {
        desired(json!({ "containers": containers }))
    }

    #[test]
    fn guaranteed_and_best_effort_pods_get_the_fixed_scores() {
        let g = desired(json!({"containers": [{"name": "a", "image": "i",
            "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}));
        assert_eq!(container(&g, &g.containers[0], 4 * GI), -997);
        let be = desired(json!({"containers": [{"name": "a", "image": "i"}]}));
        assert_eq!(container(&be, &be.containers[0], 4 * GI), 1000);
    }

    #[test]
    fn a_burstable_container_scores_by_its_share_of_the_nodes_memory() {
        let p = burstable(json!([
            {"name": "quarter", "image": "i", "resources": {"requests": {"memory": "1Gi"}}},
            {"name": "none", "image": "i", "resources": {"requests": {"cpu": "100m"}}},
            {"name": "all", "image": "i", "resources": {"requests": {"memory": "4Gi"}}},
        ]));
        // 1000 - 1000 * 1Gi / 4Gi
        assert_eq!(container(&p, &p.containers[0], 4 * GI), 750);
        // no memory request: 1000, kept just below BestEffort
        assert_eq!(container(&p, &p.containers[1], 4 * GI), 999);
        // the whole node: kept above Guaranteed
        assert_eq!(container(&p, &p.containers[2], 4 * GI), 3);
    }

    #[test]
    fn a_sidecar_scores_no_higher_than_the_least_requesting_regular_container() {
        let p = desired(json!({
            "initContainers": [{"name": "side", "image": "i", "restartPolicy": "Always",
                "resources": {"requests": {"memory": "256Mi"}}}],
            "containers": [{"name": "app", "image": "i", "resources": {"requests": {"memory": "2Gi"}}}],
        }));
        assert_eq!(container(&p, &p.init_containers[0], 4 * GI), 500);
        assert_eq!(container(&p, &p.containers[0], 4 * GI), 500);
    }

    #[test]
    fn a_node_critical_pod_scores_as_guaranteed() {
        let p = desired(json!({"priority": 2_000_001_000, "containers": [{"name": "a", "image": "i"}]}));
        assert_eq!(container(&p, &p.containers[0], 4 * GI), -997);
    }
}
