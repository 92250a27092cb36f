//! In-place pod resize, the node's decision: whether a pod's containers now ask for other CPU or memory than
//! the node allocated them, and whether the new requests fit in the node's allocatable beside what the other
//! pods hold — as the kubelet's allocation manager decides. A resize that does not fit waits `Deferred` (the
//! kubelet judges a resize by the same resource predicate as an admission, so one beyond the node's whole
//! allocatable is deferred too); the pod then runs with its allocated resources
//! ([`DesiredPod::with_allocated`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use serde::Serialize;

use crate::pods::model::admission::{Committed, fit_resources};
use crate::pods::model::node_view::NodeView;
use crate::pods::model::resources::ContainerResources;
use crate::pods::model::spec::{ContainerSpec, DesiredPod, ResizePending};

/// The condition of a resize that waits.
pub const PENDING: &str = "PodResizePending";
/// The condition of a resize accepted and not yet applied to every container.
pub const IN_PROGRESS: &str = "PodResizeInProgress";
/// The reason of a resize that may fit later.
pub const DEFERRED: &str = "Deferred";
/// The reason of a resize that never will on this node.
pub const INFEASIBLE: &str = "Infeasible";

/// Whether any container of `desired` asks for other CPU or memory than the same container in `allocated`.
pub fn resized(desired: &DesiredPod, allocated: &DesiredPod) -> bool {
    let pairs = |d: &[ContainerSpec], a: &[ContainerSpec]| {
        d.iter().any(|c| {
            a.iter()
                .find(|o| o.name == c.name)
                .is_some_and(|o| c.resources.differs(&o.resources) != (false, false))
        })
    };
    pairs(&desired.containers, &allocated.containers)
        || pairs(&desired.init_containers, &allocated.init_containers)
}

/// Whether the node can allocate `desired`'s requests in place of `allocated`'s, next to the rest of
/// `committed` (which counts `allocated`).
pub fn decide(
    desired: &DesiredPod,
    allocated: &DesiredPod,
    node: &NodeView,
    committed: &Committed,
) -> Result<(), ResizePending> {
    let others = committed.requests.minus(allocated.requests());
    fit_resources(desired.requests(), others, node).map_err(|r| ResizePending {
        reason: DEFERRED,
        message: r.message,
        generation: desired.generation,
        since: k8s_openapi::jiff::Timestamp::now().as_second(),
    })
}

/// The `PodResizePending` condition `pod`'s status reports, as the node's decision (its reason one the node
/// gives).
pub fn reported_pending(pod: &k8s_openapi::api::core::v1::Pod) -> Option<ResizePending> {
    let c = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == PENDING && c.status == "True")?;
    let reason = match c.reason.as_deref()? {
        DEFERRED => DEFERRED,
        INFEASIBLE => INFEASIBLE,
        _ => return None,
    };
    Some(ResizePending {
        reason,
        message: c.message.clone().unwrap_or_default(),
        generation: c.observed_generation,
        since: c.last_transition_time.as_ref().map_or_else(
            || k8s_openapi::jiff::Timestamp::now().as_second(),
            |t| t.0.as_second(),
        ),
    })
}

#[derive(Serialize)]
struct Allocation<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "is_empty")]
    resources: ResourceRequirements,
}

fn is_empty(r: &ResourceRequirements) -> bool {
    r.limits.is_none() && r.requests.is_none()
}

#[derive(Serialize)]
struct Summary<'a> {
    #[serde(rename = "initContainers", skip_serializing_if = "Vec::is_empty")]
    init_containers: Vec<Allocation<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    containers: Vec<Allocation<'a>>,
    generation: i64,
    #[serde(skip_serializing_if = "str::is_empty")]
    error: &'a str,
}

/// A container's CPU and memory as the API writes them.
pub fn requirements(r: &ContainerResources) -> ResourceRequirements {
    let (limits, requests) = (r.limits_api(), r.requests_api());
    ResourceRequirements {
        claims: None,
        limits: (!limits.is_empty()).then_some(limits),
        requests: (!requests.is_empty()).then_some(requests),
    }
}

/// The pod's own `status.allocatedResources` and `status.resources`, which the kubelet of this release reports
/// for every pod: the pod's effective requests (pod-level ones where set, else its containers' by the
/// scheduler's rule, plus the overhead) as allocated, and as its resources those requests with the limits its
/// cgroup is bound by. Empty maps are left out, as the API server stores them.
pub fn pod_status_resources(
    pod: &DesiredPod,
) -> (
    Option<BTreeMap<String, ApiQuantity>>,
    Option<ResourceRequirements>,
) {
    use crate::quantity::{Format, Quantity};
    // a sum takes the format of its parts: binary when the pod's memory was written so
    let binary = pod
        .init_containers
        .iter()
        .chain(pod.containers.iter())
        .any(|c| c.resources.memory_request_binary || c.resources.memory_limit_binary);
    let memory = |bytes: i64| {
        let format = if binary {
            Format::BinarySI
        } else {
            Format::DecimalSI
        };
        Quantity::from_units(bytes, format).to_api()
    };
    let requests = pod.requests();
    let mut allocated = BTreeMap::new();
    if requests.cpu_milli > 0 {
        allocated.insert(
            "cpu".to_owned(),
            Quantity::from_milli(requests.cpu_milli).to_api(),
        );
    }
    if requests.memory > 0 {
        allocated.insert("memory".to_owned(), memory(requests.memory));
    }
    let wanted = allocated.clone();
    if requests.ephemeral > 0 {
        allocated.insert(
            "ephemeral-storage".to_owned(),
            Quantity::from_units(requests.ephemeral, Format::BinarySI).to_api(),
        );
    }
    let bound = pod.limits();
    let mut limits = BTreeMap::new();
    if let Some(m) = bound.cpu_milli.filter(|m| *m > 0) {
        limits.insert("cpu".to_owned(), Quantity::from_milli(m).to_api());
    }
    if let Some(b) = bound.memory.filter(|b| *b > 0) {
        limits.insert("memory".to_owned(), memory(b));
    }
    let resources = ResourceRequirements {
        claims: None,
        limits: (!limits.is_empty()).then_some(limits),
        requests: (!wanted.is_empty()).then_some(wanted),
    };
    (
        (!allocated.is_empty()).then_some(allocated),
        (!is_empty(&resources)).then_some(resources),
    )
}

/// The text of the kubelet's resize events: `<prefix>: <the pod's container resources as JSON>` (with the
/// generation, and the error when there is one).
pub fn event_message(pod: &DesiredPod, prefix: &str, error: &str) -> String {
    fn list(cs: &[ContainerSpec]) -> Vec<Allocation<'_>> {
        cs.iter()
            .map(|c| Allocation {
                name: &c.name,
                resources: requirements(&c.resources),
            })
            .collect()
    }
    let summary = Summary {
        init_containers: list(&pod.init_containers),
        containers: list(&pod.containers),
        generation: pod.generation.unwrap_or(0),
        error,
    };
    match serde_json::to_string(&summary) {
        Ok(json) => format!("{prefix}: {json}"),
        Err(_) => prefix.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    fn pod(cpu: &str, generation: i64) -> (Pod, std::sync::Arc<DesiredPod>) {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u1", "generation": generation},
            "spec": {"nodeName": "n", "containers": [
                {"name": "c", "image": "i", "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}
            ]}
        }))
        .unwrap();
        let d = DesiredPod::from_pod(&p).unwrap();
        (p, d)
    }

    fn node() -> NodeView {
        NodeView {
            cpu_milli: 2000,
            memory: 1 << 30,
            pods: 10,
            ..Default::default()
        }
    }

    #[test]
    fn the_pod_reports_its_effective_requests_and_the_limits_its_cgroup_is_bound_by() {
        let status = |spec: serde_json::Value| {
            let p: Pod = serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
                "spec": spec,
            }))
            .unwrap();
            let (allocated, resources) = pod_status_resources(&DesiredPod::from_pod(&p).unwrap());
            serde_json::json!({"allocated": allocated, "resources": resources})
        };
        // two containers and a sidecar: the sum; a limit only where every container has one
        assert_eq!(
            status(json!({"initContainers": [
                    {"name": "s", "image": "i", "restartPolicy": "Always",
                     "resources": {"requests": {"cpu": "50m", "memory": "16Mi"}, "limits": {"cpu": "50m"}}}],
                "containers": [
                    {"name": "a", "image": "i", "resources": {"requests": {"cpu": "100m", "memory": "32Mi",
                        "ephemeral-storage": "1Gi"}, "limits": {"cpu": "200m", "memory": "64Mi"}}},
                    {"name": "b", "image": "i", "resources": {"requests": {"cpu": "250m"},
                        "limits": {"cpu": "250m"}}}]})),
            json!({"allocated": {"cpu": "400m", "memory": "48Mi", "ephemeral-storage": "1Gi"},
                   "resources": {"requests": {"cpu": "400m", "memory": "48Mi"}, "limits": {"cpu": "500m"}}})
        );
        // pod-level resources in place of the containers'
        assert_eq!(
            status(json!({"resources": {"requests": {"cpu": "1", "memory": "128Mi"},
                                         "limits": {"cpu": "2", "memory": "256Mi"}},
                "containers": [{"name": "a", "image": "i", "resources": {"requests": {"memory": "32Mi"}}}]})),
            json!({"allocated": {"cpu": "1", "memory": "128Mi"},
                   "resources": {"requests": {"cpu": "1", "memory": "128Mi"},
                                 "limits": {"cpu": "2", "memory": "256Mi"}}})
        );
        // nothing asked: nothing written
        assert_eq!(
            status(json!({"containers": [{"name": "a", "image": "i"}]})),
            json!({"allocated": null, "resources": null})
        );
    }

    #[test]
    fn a_resize_that_fits_is_allocated_and_one_that_does_not_is_deferred_with_the_kubelet_message() {
        let (_, old) = pod("500m", 1);
        let (_, same) = pod("500m", 2);
        assert!(!resized(&same, &old));
        let mut committed = Committed::default();
        committed.add(&old);
        let (other_pod, other) = pod("1", 1);
        let _ = other_pod;
        committed.add(&other);
        let (_, up) = pod("1", 2);
        assert!(resized(&up, &old));
        assert_eq!(decide(&up, &old, &node(), &committed), Ok(()));
        let (_, huge) = pod("3", 3);
        let pending = decide(&huge, &old, &node(), &committed).unwrap_err();
        assert_eq!(pending.reason, "Deferred");
        assert_eq!(
            pending.message,
            "Node didn't have enough resource: cpu, requested: 3000, used: 1000, capacity: 2000"
        );
        assert_eq!(pending.generation, Some(3));
        let held = huge.with_allocated(&old, pending);
        assert_eq!(held.containers[0].resources.cpu_request, Some(500));
        assert_eq!(
            event_message(
                &huge,
                "Pod resize Deferred",
                "Node didn't have enough resource: cpu"
            ),
            r#"Pod resize Deferred: {"containers":[{"name":"c","resources":{"requests":{"cpu":"3","memory":"64Mi"}}}],"generation":3,"error":"Node didn't have enough resource: cpu"}"#
        );
    }
}
