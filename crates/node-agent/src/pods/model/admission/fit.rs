//! Whether the pod fits beside what the node already runs: the admitted pods' requests, count, host ports and
//! extended resources ([`Committed`]); cpu, memory and ephemeral storage (`OutOfcpu`, `OutOfmemory`,
//! `OutOfephemeral-storage`), the pod count (`OutOfpods`), extended resources and huge pages
//! (`OutOf<resource>`); and the device manager's reservation of device plugin resources
//! (`UnexpectedAdmissionError`).

use std::collections::{BTreeMap, HashSet};

use super::Rejection;
use crate::pods::model::node_view::NodeView;
use crate::pods::model::resources::PodRequests;
use crate::pods::model::spec::DesiredPod;

/// What is already committed on the node: the sum of admitted, not yet terminated pods.
#[derive(Debug, Clone, Default)]
pub struct Committed {
    /// Summed requests.
    pub requests: PodRequests,
    /// Number of pods.
    pub pods: i64,
    /// Host ports in use, as `(protocol, port)`.
    pub host_ports: HashSet<(String, i32)>,
    /// Summed effective requests of extended resources.
    pub extended: BTreeMap<String, i64>,
}

impl Committed {
    /// Adds a pod.
    pub fn add(&mut self, pod: &DesiredPod) {
        self.requests = self.requests.plus(pod.requests());
        self.pods += 1;
        self.host_ports.extend(host_ports(pod));
        for (resource, n) in scalar_requests(pod) {
            *self.extended.entry(resource).or_default() += n;
        }
    }

    /// Removes a pod added before.
    pub fn remove(&mut self, pod: &DesiredPod) {
        self.requests = self.requests.minus(pod.requests());
        self.pods -= 1;
        for p in host_ports(pod) {
            self.host_ports.remove(&p);
        }
        for (resource, n) in scalar_requests(pod) {
            if let Some(used) = self.extended.get_mut(&resource) {
                *used -= n;
                if *used <= 0 {
                    self.extended.remove(&resource);
                }
            }
        }
    }
}

pub(super) fn host_ports(pod: &DesiredPod) -> impl Iterator<Item = (String, i32)> + '_ {
    pod.init_containers
        .iter()
        .chain(pod.containers.iter())
        .flat_map(|c| &c.ports)
        .filter(|(_, host, _)| *host > 0)
        .map(|(_, host, proto)| (proto.clone(), *host))
}

pub(super) fn short(name: &str, requested: i64, used: i64, capacity: i64) -> Rejection {
    Rejection {
        reason: format!("OutOf{name}"),
        message: format!(
            "Node didn't have enough resource: {name}, requested: {requested}, used: {used}, capacity: {capacity}"
        ),
    }
}

/// The pod's effective requests of extended resources and of huge pages (by the node's name for the size), as
/// admission counts them.
pub fn scalar_requests(pod: &DesiredPod) -> BTreeMap<String, i64> {
    let mut out = pod.extended_effective();
    for (size, bytes) in pod.hugepages() {
        out.insert(
            crate::pods::model::resources::hugepage_resource(size),
            i64::try_from(bytes).unwrap_or(i64::MAX),
        );
    }
    out
}

/// Whether the pod's extended resources and huge pages fit beside what is committed, as the kubelet's resource
/// predicate judges them (`OutOf<resource>`): only extended resources the node's allocatable names are checked,
/// as the kubelet leaves out those it does not know (cluster-level resources); huge pages of a size the node
/// does not have do not fit.
pub(super) fn fit_extended(
    desired: &DesiredPod,
    committed: &Committed,
    node: &NodeView,
) -> Result<(), Rejection> {
    for (resource, want) in scalar_requests(desired) {
        let capacity = match node.extended.get(&resource) {
            Some(capacity) => *capacity,
            None if resource.starts_with("hugepages-") => 0,
            None => continue,
        };
        let used = committed.extended.get(&resource).copied().unwrap_or(0);
        if want > 0 && used + want > capacity {
            return Err(short(&resource, want, used, capacity));
        }
    }
    Ok(())
}

/// Admission by the device manager, as the kubelet's resource allocation admit handler: the devices of the
/// pod's device plugin resources are reserved, or the pod is refused (`UnexpectedAdmissionError`).
pub fn admit_devices(devices: &crate::devices::DeviceManager, desired: &DesiredPod) -> Result<(), Rejection> {
    if desired.extended_requests().is_empty() {
        return Ok(());
    }
    devices
        .admit(&desired.uid, desired.extended_requests())
        .map_err(|message| Rejection {
            reason: UNEXPECTED_ADMISSION_ERROR.into(),
            message,
        })
}

/// The kubelet's reason for a pod refused by a resource manager (here: the device manager).
pub const UNEXPECTED_ADMISSION_ERROR: &str = "UnexpectedAdmissionError";

/// Whether requests `want` fit beside `used` in the node's allocatable, as the kubelet's resource predicate
/// judges them (cpu, then memory, then ephemeral storage; a resource not requested always fits).
pub fn fit_resources(want: PodRequests, used: PodRequests, node: &NodeView) -> Result<(), Rejection> {
    if want.cpu_milli > 0 && used.cpu_milli + want.cpu_milli > node.cpu_milli {
        return Err(short("cpu", want.cpu_milli, used.cpu_milli, node.cpu_milli));
    }
    if want.memory > 0 && used.memory + want.memory > node.memory {
        return Err(short("memory", want.memory, used.memory, node.memory));
    }
    if node.ephemeral > 0 && want.ephemeral > 0 && used.ephemeral + want.ephemeral > node.ephemeral {
        return Err(short(
            "ephemeral-storage",
            want.ephemeral,
            used.ephemeral,
            node.ephemeral,
        ));
    }
    Ok(())
}
