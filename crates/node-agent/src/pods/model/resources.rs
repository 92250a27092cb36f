//! Pod resource arithmetic: container requests and limits as integers, pod-level `spec.resources`, the pod's
//! effective request (what admission charges against the node's allocatable) and the pod's QoS class.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use crate::quantity::Quantity;

/// A container's requests and limits (cpu in millicores, the rest in bytes). `None` = not set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ContainerResources {
    /// `requests.cpu`, millicores.
    pub cpu_request: Option<i64>,
    /// `limits.cpu`, millicores.
    pub cpu_limit: Option<i64>,
    /// `requests.memory`, bytes.
    pub memory_request: Option<i64>,
    /// `limits.memory`, bytes.
    pub memory_limit: Option<i64>,
    /// `requests.ephemeral-storage`, bytes.
    pub ephemeral_request: Option<i64>,
    /// The memory request was written with a binary suffix (`Mi`, `Gi`), so the status prints it so again.
    pub memory_request_binary: bool,
    /// The memory limit was written with a binary suffix.
    pub memory_limit_binary: bool,
}

fn milli(map: Option<&BTreeMap<String, ApiQuantity>>, key: &str) -> Option<i64> {
    let q = Quantity::from_api(map?.get(key)?).ok()?;
    i64::try_from(q.milli()).ok()
}

fn binary(map: Option<&BTreeMap<String, ApiQuantity>>, key: &str) -> Option<bool> {
    let q = Quantity::from_api(map?.get(key)?).ok()?;
    Some(q.format() == crate::quantity::Format::BinarySI)
}

fn units(map: Option<&BTreeMap<String, ApiQuantity>>, key: &str) -> Option<i64> {
    let q = Quantity::from_api(map?.get(key)?).ok()?;
    i64::try_from(q.value()).ok()
}

impl ContainerResources {
    /// Reads requests and limits; a request left unset defaults to the limit, as the API server does.
    pub fn from_api(r: Option<&ResourceRequirements>) -> Self {
        let requests = r.and_then(|r| r.requests.as_ref());
        let limits = r.and_then(|r| r.limits.as_ref());
        let cpu_limit = milli(limits, "cpu");
        let memory_limit = units(limits, "memory");
        Self {
            cpu_request: milli(requests, "cpu").or(cpu_limit),
            cpu_limit,
            memory_request: units(requests, "memory").or(memory_limit),
            memory_limit,
            ephemeral_request: units(requests, "ephemeral-storage")
                .or_else(|| units(limits, "ephemeral-storage")),
            memory_request_binary: binary(requests, "memory")
                .or_else(|| binary(limits, "memory"))
                .unwrap_or(false),
            memory_limit_binary: binary(limits, "memory").unwrap_or(false),
        }
    }

    /// The requests as the API writes them (`cpu`, `memory`; what a container status reports as its
    /// `allocatedResources`).
    pub fn requests_api(&self) -> BTreeMap<String, ApiQuantity> {
        self.api(self.cpu_request, self.memory_request, self.memory_request_binary)
    }

    /// The limits as the API writes them.
    pub fn limits_api(&self) -> BTreeMap<String, ApiQuantity> {
        self.api(self.cpu_limit, self.memory_limit, self.memory_limit_binary)
    }

    fn api(&self, cpu: Option<i64>, memory: Option<i64>, binary: bool) -> BTreeMap<String, ApiQuantity> {
        use crate::quantity::Format;
        let mut out = BTreeMap::new();
        if let Some(m) = cpu {
            out.insert("cpu".to_owned(), Quantity::from_milli(m).to_api());
        }
        if let Some(b) = memory {
            let format = if binary {
                Format::BinarySI
            } else {
                Format::DecimalSI
            };
            out.insert("memory".to_owned(), Quantity::from_units(b, format).to_api());
        }
        out
    }

    /// Whether CPU or memory requests or limits differ from `other`'s (how they were written aside).
    pub fn differs(&self, other: &Self) -> (bool, bool) {
        let cpu = self.cpu_request != other.cpu_request || self.cpu_limit != other.cpu_limit;
        let memory = self.memory_request != other.memory_request || self.memory_limit != other.memory_limit;
        (cpu, memory)
    }
}

/// Whether `name` is an extended resource's: a domain-prefixed name outside `kubernetes.io/` (and not a quota
/// `requests.` name), such as a device plugin's `example.com/gpu`.
pub fn is_extended(name: &str) -> bool {
    crate::devices::registration::is_extended_resource(name)
}

/// The extended resources each container requests (the request, or the limit when no request is written, as
/// the API server defaults it), as (container, resource, count) for whole counts above zero.
pub fn extended_requests<'a>(
    containers: impl Iterator<Item = (&'a str, Option<&'a ResourceRequirements>)>,
) -> Vec<(String, String, u64)> {
    let mut out = Vec::new();
    for (name, r) in containers {
        let Some(r) = r else { continue };
        let requests = r.requests.as_ref();
        let limits = r.limits.as_ref();
        let names: std::collections::BTreeSet<&String> = requests
            .into_iter()
            .flatten()
            .chain(limits.into_iter().flatten())
            .map(|(k, _)| k)
            .filter(|k| is_extended(k))
            .collect();
        for resource in names {
            let count = units(requests, resource).or_else(|| units(limits, resource));
            if let Some(count) = count.and_then(|c| u64::try_from(c).ok()).filter(|c| *c > 0) {
                out.push((name.to_owned(), resource.clone(), count));
            }
        }
    }
    out
}

/// The page size, in bytes, of a huge pages resource (`hugepages-2Mi`: 2 MiB); `None` for any other name.
pub fn hugepage_size(name: &str) -> Option<u64> {
    let size: crate::quantity::Quantity = name.strip_prefix("hugepages-")?.parse().ok()?;
    u64::try_from(size.value()).ok().filter(|s| *s > 0)
}

/// The huge pages resource of page size `size` bytes, as the node's capacity names it (`hugepages-2Mi`).
pub fn hugepage_resource(size: u64) -> String {
    let size = i64::try_from(size).unwrap_or(i64::MAX);
    format!(
        "hugepages-{}",
        crate::quantity::Quantity::from_units(size, crate::quantity::Format::BinarySI)
    )
}

/// The huge pages of one resource list pair: (page size, bytes) for each `hugepages-<size>` the limits name, or
/// the requests where no limit is written (the API requires the two to be equal), sizes summed where two names
/// spell one size.
pub fn hugepages_of(r: Option<&ResourceRequirements>) -> Vec<(u64, u64)> {
    let mut out: BTreeMap<u64, u64> = BTreeMap::new();
    let Some(r) = r else { return Vec::new() };
    let limits = r.limits.as_ref();
    let requests = r.requests.as_ref();
    let names: std::collections::BTreeSet<&String> = limits
        .into_iter()
        .flatten()
        .chain(requests.into_iter().flatten())
        .map(|(k, _)| k)
        .collect();
    for name in names {
        let Some(size) = hugepage_size(name) else { continue };
        let bytes = units(limits, name).or_else(|| units(requests, name));
        if let Some(bytes) = bytes.and_then(|b| u64::try_from(b).ok()) {
            *out.entry(size).or_default() += bytes;
        }
    }
    out.into_iter().collect()
}

/// What a pod charges against the node: cpu millicores, memory and ephemeral-storage bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodRequests {
    /// Millicores.
    pub cpu_milli: i64,
    /// Bytes.
    pub memory: i64,
    /// Bytes.
    pub ephemeral: i64,
}

impl PodRequests {
    fn add(self, r: &ContainerResources) -> Self {
        Self {
            cpu_milli: self.cpu_milli + r.cpu_request.unwrap_or(0),
            memory: self.memory + r.memory_request.unwrap_or(0),
            ephemeral: self.ephemeral + r.ephemeral_request.unwrap_or(0),
        }
    }

    fn max(self, o: Self) -> Self {
        Self {
            cpu_milli: self.cpu_milli.max(o.cpu_milli),
            memory: self.memory.max(o.memory),
            ephemeral: self.ephemeral.max(o.ephemeral),
        }
    }

    /// Component-wise sum.
    pub fn plus(self, o: Self) -> Self {
        Self {
            cpu_milli: self.cpu_milli + o.cpu_milli,
            memory: self.memory + o.memory,
            ephemeral: self.ephemeral + o.ephemeral,
        }
    }

    /// Component-wise difference.
    pub fn minus(self, o: Self) -> Self {
        Self {
            cpu_milli: self.cpu_milli - o.cpu_milli,
            memory: self.memory - o.memory,
            ephemeral: self.ephemeral - o.ephemeral,
        }
    }
}

/// A container as the resource arithmetic sees it: its requests and limits, and whether it is a sidecar (a
/// restartable init container, which keeps running beside the app containers).
pub trait Container {
    /// Its requests and limits.
    fn resources(&self) -> &ContainerResources;
    /// Whether it is a sidecar.
    fn sidecar(&self) -> bool;
}

/// The pod's effective request, the scheduler's and kubelet's rule: the larger of (app containers + sidecars)
/// and, for each regular init container, itself plus the sidecars started before it; plus the pod overhead.
pub fn pod_requests<C: Container>(init: &[C], app: &[C], overhead: PodRequests) -> PodRequests {
    let mut sidecars = PodRequests::default();
    let mut init_peak = PodRequests::default();
    for c in init {
        if c.sidecar() {
            sidecars = sidecars.add(c.resources());
            init_peak = init_peak.max(sidecars);
        } else {
            init_peak = init_peak.max(sidecars.add(c.resources()));
        }
    }
    let running = app.iter().fold(sidecars, |acc, c| acc.add(c.resources()));
    running.max(init_peak).plus(overhead)
}

/// `spec.overhead` (a RuntimeClass's, set at admission) as requests.
pub fn overhead(overhead: Option<&BTreeMap<String, ApiQuantity>>) -> PodRequests {
    PodRequests {
        cpu_milli: milli(overhead, "cpu").unwrap_or(0),
        memory: units(overhead, "memory").unwrap_or(0),
        ephemeral: units(overhead, "ephemeral-storage").unwrap_or(0),
    }
}

/// Pod-level `spec.resources`: the cpu and memory the whole pod requests and is limited to, each `None` when not
/// set (or not positive). The kubelet reads only these two there, and huge pages (kept in
/// [`crate::pods::model::spec::PodExtras::pod_hugepages`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodLevel {
    /// `requests.cpu`, millicores.
    pub cpu_request: Option<i64>,
    /// `limits.cpu`, millicores.
    pub cpu_limit: Option<i64>,
    /// `requests.memory`, bytes.
    pub memory_request: Option<i64>,
    /// `limits.memory`, bytes.
    pub memory_limit: Option<i64>,
}

impl PodLevel {
    /// Reads `spec.resources`; `None` when the pod has none.
    pub fn from_api(r: Option<&ResourceRequirements>) -> Option<Self> {
        let r = r?;
        let requests = r.requests.as_ref();
        let limits = r.limits.as_ref();
        let positive = |v: Option<i64>| v.filter(|v| *v > 0);
        Some(Self {
            cpu_request: positive(milli(requests, "cpu")),
            cpu_limit: positive(milli(limits, "cpu")),
            memory_request: positive(units(requests, "memory")),
            memory_limit: positive(units(limits, "memory")),
        })
    }

    /// Whether it requests cpu or memory (the pod's request is then its own, not its containers' sum).
    pub fn requests_set(&self) -> bool {
        self.cpu_request.is_some() || self.memory_request.is_some()
    }

    /// Whether it sets anything (its limits then bound the pod's cgroup).
    pub fn is_set(&self) -> bool {
        self.requests_set() || self.cpu_limit.is_some() || self.memory_limit.is_some()
    }

    /// The QoS class a pod with these pod-level resources has, whatever its containers say (the kubelet's
    /// rule): none requested or limited is BestEffort; cpu and memory limited, with every request equal to its
    /// limit, Guaranteed; anything else Burstable.
    pub fn qos(&self) -> QosClass {
        let requests = [self.cpu_request, self.memory_request];
        let limits = [self.cpu_limit, self.memory_limit];
        if requests.iter().chain(&limits).all(Option::is_none) {
            return QosClass::BestEffort;
        }
        // only a pod that sets limits can be Guaranteed, and then only with both of them
        let limited = limits.iter().any(Option::is_some);
        let both = limits.iter().all(Option::is_some);
        let equal = requests.iter().zip(&limits).all(|(r, l)| r.is_none() || r == l);
        let same_count =
            requests.iter().filter(|r| r.is_some()).count() == limits.iter().filter(|l| l.is_some()).count();
        if (!limited || both) && equal && same_count {
            QosClass::Guaranteed
        } else {
            QosClass::Burstable
        }
    }

    /// `requests`, with the pod-level cpu and memory requests in place of the containers' where set.
    pub fn over_requests(&self, requests: PodRequests, overhead: PodRequests) -> PodRequests {
        PodRequests {
            cpu_milli: self
                .cpu_request
                .map_or(requests.cpu_milli, |v| v + overhead.cpu_milli),
            memory: self
                .memory_request
                .map_or(requests.memory, |v| v + overhead.memory),
            ephemeral: requests.ephemeral,
        }
    }

    /// `limits`, with the pod-level limits (plus the overhead) in place of the containers' where set.
    pub fn over_limits(&self, limits: PodLimits, overhead: PodRequests) -> PodLimits {
        PodLimits {
            cpu_milli: self
                .cpu_limit
                .map(|v| v + overhead.cpu_milli)
                .or(limits.cpu_milli),
            memory: self.memory_limit.map(|v| v + overhead.memory).or(limits.memory),
        }
    }
}

/// The pod's quality-of-service class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QosClass {
    /// Every container has cpu and memory limits equal to its requests.
    Guaranteed,
    /// Anything in between.
    Burstable,
    /// No container requests or limits cpu or memory.
    BestEffort,
}

impl QosClass {
    /// The API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Guaranteed => "Guaranteed",
            Self::Burstable => "Burstable",
            Self::BestEffort => "BestEffort",
        }
    }
}

/// The QoS class of a pod with these containers (init containers included).
pub fn qos_class<'a, C: Container + 'a>(containers: impl Iterator<Item = &'a C>) -> QosClass {
    let mut any = false;
    let mut guaranteed = true;
    for c in containers {
        let r = c.resources();
        if r.cpu_request.is_some()
            || r.cpu_limit.is_some()
            || r.memory_request.is_some()
            || r.memory_limit.is_some()
        {
            any = true;
        }
        let cpu_ok = r.cpu_limit.is_some() && r.cpu_request == r.cpu_limit;
        let mem_ok = r.memory_limit.is_some() && r.memory_request == r.memory_limit;
        guaranteed &= cpu_ok && mem_ok;
    }
    match (any, guaranteed) {
        (false, _) => QosClass::BestEffort,
        (true, true) => QosClass::Guaranteed,
        (true, false) => QosClass::Burstable,
    }
}

/// The pod's limits as its cgroup gets them: cpu millicores and memory bytes, each `None` unless every container
/// declares that limit (the larger of the app containers plus sidecars and each init container's peak, as for
/// requests, plus the pod overhead).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodLimits {
    /// Millicores.
    pub cpu_milli: Option<i64>,
    /// Bytes.
    pub memory: Option<i64>,
}

/// The limits of a pod with these containers whose effective request is `requests` (the overhead is what
/// `requests` holds beyond the containers' own).
pub fn pod_limits<C: Container>(init: &[C], app: &[C], requests: PodRequests) -> PodLimits {
    let lim = |r: &ContainerResources| (r.cpu_limit.unwrap_or(0), r.memory_limit.unwrap_or(0));
    let (mut cpu_declared, mut memory_declared) = (true, true);
    let mut declared = |(cpu, memory): (i64, i64)| {
        cpu_declared &= cpu != 0;
        memory_declared &= memory != 0;
    };
    let (mut cpu, mut memory) = (0, 0);
    for c in app {
        let (c_cpu, c_mem) = lim(c.resources());
        declared((c_cpu, c_mem));
        cpu += c_cpu;
        memory += c_mem;
    }
    let (mut side_cpu, mut side_mem, mut peak_cpu, mut peak_mem) = (0, 0, 0, 0);
    for c in init {
        let (c_cpu, c_mem) = lim(c.resources());
        let effective = if c.sidecar() {
            cpu += c_cpu;
            memory += c_mem;
            side_cpu += c_cpu;
            side_mem += c_mem;
            (side_cpu, side_mem)
        } else {
            (c_cpu + side_cpu, c_mem + side_mem)
        };
        declared(effective);
        peak_cpu = peak_cpu.max(effective.0);
        peak_mem = peak_mem.max(effective.1);
    }
    let overhead = requests.minus(pod_requests(init, app, PodRequests::default()));
    let with_overhead = |v: i64, extra: i64| if v == 0 { v } else { v + extra };
    PodLimits {
        cpu_milli: cpu_declared.then(|| with_overhead(cpu.max(peak_cpu), overhead.cpu_milli)),
        memory: memory_declared.then(|| with_overhead(memory.max(peak_mem), overhead.memory)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::model::spec::DesiredPod;
    use serde_json::json;

    fn desired(spec: serde_json::Value) -> std::sync::Arc<DesiredPod> {
        let pod =
            serde_json::from_value(json!({"metadata": {"name": "p", "uid": "u"}, "spec": spec})).unwrap();
        DesiredPod::from_pod(&pod).unwrap()
    }

    #[test]
    fn requests_take_the_init_peak_or_the_running_sum() {
        let d = desired(json!({
            "initContainers": [
                {"name": "big-init", "image": "i", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}},
                {"name": "side", "image": "i", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}}
            ],
            "containers": [
                {"name": "a", "image": "i", "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}}},
                {"name": "b", "image": "i", "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}}
            ]
        }));
        assert_eq!(d.requests().cpu_milli, 2000, "init peak wins for cpu");
        assert_eq!(d.requests().memory, 1 << 30, "init peak wins for memory");
        assert_eq!(d.qos, QosClass::Burstable);
    }

    #[test]
    fn huge_pages_count_as_other_requests_do() {
        assert_eq!(hugepage_size("hugepages-2Mi"), Some(2 << 20));
        assert_eq!(hugepage_size("hugepages-2048Ki"), Some(2 << 20));
        assert_eq!(hugepage_size("memory"), None);
        assert_eq!(hugepage_resource(1 << 30), "hugepages-1Gi");
        let d = desired(json!({
            "initContainers": [
                {"name": "init", "image": "i", "resources": {"limits": {"memory": "8Mi", "hugepages-2Mi": "10Mi"}}},
                {"name": "side", "image": "i", "restartPolicy": "Always",
                 "resources": {"limits": {"memory": "8Mi", "hugepages-2Mi": "2Mi"}}}
            ],
            "containers": [
                {"name": "a", "image": "i", "resources": {
                    "requests": {"memory": "8Mi", "hugepages-2Mi": "4Mi"},
                    "limits": {"memory": "8Mi", "hugepages-2Mi": "4Mi", "hugepages-1Gi": "1Gi"}}},
                {"name": "b", "image": "i", "resources": {"limits": {"memory": "8Mi", "hugepages-2048Ki": "2Mi"}}}
            ]
        }));
        assert_eq!(
            d.hugepages(),
            BTreeMap::from([(2 << 20, 10 << 20), (1 << 30, 1 << 30)]),
            "the plain init container's 10Mi over the running 8Mi; 1Gi from a alone"
        );
        assert_eq!(
            d.container_hugepages("a"),
            BTreeMap::from([(2 << 20, 4 << 20), (1 << 30, 1 << 30)])
        );
        assert!(d.container_hugepages("nobody").is_empty());
        let pod_level = desired(json!({
            "resources": {"limits": {"memory": "64Mi", "hugepages-2Mi": "8Mi"}},
            "containers": [
                {"name": "a", "image": "i"},
                {"name": "b", "image": "i", "resources": {"limits": {"hugepages-2Mi": "2Mi"}}}
            ]
        }));
        assert_eq!(
            pod_level.hugepages(),
            BTreeMap::from([(2 << 20, 8 << 20)]),
            "the pod level's own"
        );
        assert_eq!(
            pod_level.container_hugepages("a"),
            BTreeMap::from([(2 << 20, 8 << 20)]),
            "a container without its own takes the pod's"
        );
        assert_eq!(
            pod_level.container_hugepages("b"),
            BTreeMap::from([(2 << 20, 2 << 20)]),
            "a container's own wins"
        );
    }

    #[test]
    fn qos_classes() {
        let be = desired(json!({"containers": [{"name": "a", "image": "i"}]}));
        assert_eq!(be.qos, QosClass::BestEffort);
        let g = desired(json!({"containers": [
            {"name": "a", "image": "i", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}
        ]}));
        assert_eq!(g.qos, QosClass::Guaranteed);
        assert_eq!(g.requests().cpu_milli, 1000, "request defaults to the limit");
    }

    #[test]
    fn limits_count_only_when_every_container_declares_them() {
        let limits = |d: &DesiredPod| pod_limits(&d.init_containers, &d.containers, d.requests());
        let d = desired(json!({
            "initContainers": [
                {"name": "init", "image": "i", "resources": {"limits": {"cpu": "2", "memory": "64Mi"}}}
            ],
            "containers": [
                {"name": "a", "image": "i", "resources": {"limits": {"cpu": "250m", "memory": "64Mi"}}},
                {"name": "b", "image": "i", "resources": {"limits": {"cpu": "500m"}, "requests": {"memory": "1Mi"}}}
            ],
            "overhead": {"cpu": "100m", "memory": "1Mi"}
        }));
        assert_eq!(
            limits(&d),
            PodLimits {
                cpu_milli: Some(2100),
                memory: None
            },
            "the init peak plus overhead; b has no memory limit"
        );
        let d = desired(json!({
            "initContainers": [
                {"name": "side", "image": "i", "restartPolicy": "Always",
                 "resources": {"limits": {"cpu": "100m", "memory": "16Mi"}}}
            ],
            "containers": [
                {"name": "a", "image": "i", "resources": {"limits": {"cpu": "250m", "memory": "64Mi"}}}
            ]
        }));
        assert_eq!(
            limits(&d),
            PodLimits {
                cpu_milli: Some(350),
                memory: Some(80 << 20)
            },
            "sidecars add to the app containers"
        );
        let be = desired(json!({"containers": [{"name": "a", "image": "i"}]}));
        assert_eq!(limits(&be), PodLimits::default());
    }

    #[test]
    fn pod_level_resources_decide_the_qos_class_and_the_request() {
        let guaranteed = desired(json!({
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
            "containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "i",
                            "resources": {"requests": {"cpu": "100m"}}}]}));
        assert_eq!(
            guaranteed.qos,
            QosClass::Guaranteed,
            "containers without limits, bounded by the pod"
        );
        assert_eq!(
            guaranteed.requests(),
            PodRequests {
                cpu_milli: 1000,
                memory: 1 << 30,
                ephemeral: 0
            }
        );
        let burstable = desired(json!({
            "resources": {"requests": {"memory": "256Mi"}},
            "containers": [{"name": "a", "image": "i", "resources": {
                "requests": {"cpu": "2", "memory": "2Gi", "ephemeral-storage": "1Gi"},
                "limits": {"cpu": "2", "memory": "2Gi"}}}]}));
        assert_eq!(
            burstable.qos,
            QosClass::Burstable,
            "the pod's own resources decide, not its containers'"
        );
        assert_eq!(
            burstable.requests(),
            PodRequests {
                cpu_milli: 2000,
                memory: 256 << 20,
                ephemeral: 1 << 30
            },
            "a request the pod does not set is its containers'"
        );
        let cpu_only = desired(json!({
            "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}},
            "containers": [{"name": "a", "image": "i"}]}));
        assert_eq!(
            cpu_only.qos,
            QosClass::Burstable,
            "Guaranteed needs both cpu and memory limits"
        );
        let none = desired(json!({"resources": {},
            "containers": [{"name": "a", "image": "i", "resources": {"requests": {"cpu": "1"}}}]}));
        assert_eq!(
            none.qos,
            QosClass::BestEffort,
            "empty pod-level resources, as the kubelet reads them"
        );
    }
}
