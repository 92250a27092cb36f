//! What the pod asks of the node: its effective requests and the limits of its cgroup (container, overhead and
//! pod-level resources), extended resources and huge pages counted as the scheduler and the kubelet count them,
//! and the resources a pod runs with while an in-place resize of it waits.

use super::container::intern_containers;
use super::{Containers, DesiredPod};
use crate::pods::model::resources::{self, ContainerResources, PodRequests};

/// Why an in-place resize waits (the `PodResizePending` condition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResizePending {
    /// `Deferred` (may fit later) or `Infeasible` (never will on this node).
    pub reason: &'static str,
    /// The kubelet's message.
    pub message: String,
    /// The pod generation the decision was made for.
    pub generation: Option<i64>,
    /// When the resize began to wait for this reason, seconds since the epoch.
    pub since: i64,
}

impl DesiredPod {
    /// Why a resize of this pod waits, if one does.
    pub fn resize_pending(&self) -> Option<&ResizePending> {
        self.extras.as_ref()?.resize_pending.as_ref()
    }

    /// This pod with each container's resources taken from `resources` by name (containers not named keep
    /// theirs).
    pub fn with_resources(
        &self,
        resources: &std::collections::BTreeMap<String, ContainerResources>,
    ) -> DesiredPod {
        let take = |list: &Containers| {
            let mut out = list.as_ref().clone();
            for c in &mut out {
                if let Some(r) = resources.get(&c.name) {
                    c.resources = *r;
                }
            }
            intern_containers(out)
        };
        let mut pod = self.clone();
        pod.init_containers = take(&self.init_containers);
        pod.containers = take(&self.containers);
        pod
    }

    /// Each container's resources, by name.
    pub fn resources_by_name(&self) -> std::collections::BTreeMap<String, ContainerResources> {
        self.init_containers
            .iter()
            .chain(self.containers.iter())
            .map(|c| (c.name.clone(), c.resources))
            .collect()
    }

    /// This pod with each container's resources taken from the same-named container of `allocated`: what the
    /// node runs while a resize of this pod waits for `pending`.
    pub fn with_allocated(&self, allocated: &DesiredPod, pending: ResizePending) -> DesiredPod {
        let take = |list: &Containers, from: &Containers| {
            let mut out = list.as_ref().clone();
            for c in &mut out {
                if let Some(a) = from.iter().find(|a| a.name == c.name) {
                    c.resources = a.resources;
                }
            }
            intern_containers(out)
        };
        let mut pod = self.clone();
        pod.init_containers = take(&self.init_containers, &allocated.init_containers);
        pod.containers = take(&self.containers, &allocated.containers);
        pod.extras.get_or_insert_default().resize_pending = Some(pending);
        pod
    }

    /// Effective requests, for admission accounting: computed from the (shared) container lists and the
    /// overhead, not kept in every pod's state.
    pub fn requests(&self) -> PodRequests {
        let overhead = self.overhead();
        let requests = resources::pod_requests(&self.init_containers, &self.containers, overhead);
        match self.pod_level() {
            Some(p) if p.requests_set() => p.over_requests(requests, overhead),
            _ => requests,
        }
    }

    /// `spec.overhead` as requests.
    pub fn overhead(&self) -> PodRequests {
        self.extras
            .as_ref()
            .map_or_else(PodRequests::default, |e| e.overhead)
    }

    /// Pod-level `spec.resources`, when the pod has them.
    pub fn pod_level(&self) -> Option<&resources::PodLevel> {
        self.extras.as_ref()?.pod_level.as_ref()
    }

    /// The limits the pod's cgroup gets: pod-level ones where set, else those every container declares.
    pub fn limits(&self) -> resources::PodLimits {
        let own = resources::pod_requests(&self.init_containers, &self.containers, self.overhead());
        let limits = resources::pod_limits(&self.init_containers, &self.containers, own);
        match self.pod_level() {
            Some(p) if p.is_set() => p.over_limits(limits, self.overhead()),
            _ => limits,
        }
    }

    /// The extended resources the init and app containers request: (container, resource, count).
    pub fn extended_requests(&self) -> &[(String, String, u64)] {
        self.extras.as_ref().map_or(&[], |e| &e.extended)
    }

    /// The pod's effective request of each extended resource, as the scheduler and the kubelet's resource
    /// predicate count it: the app containers' and sidecars' sum, or the largest plain init container's
    /// request when that is more.
    pub fn extended_effective(&self) -> std::collections::BTreeMap<String, i64> {
        let mut sum: std::collections::BTreeMap<String, i64> = std::collections::BTreeMap::new();
        let mut init_max: std::collections::BTreeMap<String, i64> = std::collections::BTreeMap::new();
        for (container, resource, count) in self.extended_requests() {
            let count = i64::try_from(*count).unwrap_or(i64::MAX);
            let plain_init = self
                .init_containers
                .iter()
                .any(|c| &c.name == container && !c.sidecar);
            if plain_init {
                let m = init_max.entry(resource.clone()).or_default();
                *m = (*m).max(count);
            } else {
                *sum.entry(resource.clone()).or_default() += count;
            }
        }
        for (resource, m) in init_max {
            let s = sum.entry(resource).or_default();
            *s = (*s).max(m);
        }
        sum
    }

    /// The huge pages the init and app containers ask for: (container, page size, bytes).
    pub fn hugepage_requests(&self) -> &[(String, u64, u64)] {
        self.extras.as_ref().map_or(&[], |e| &e.hugepages)
    }

    /// The huge pages of pod-level `spec.resources`: (page size, bytes).
    pub fn pod_level_hugepages(&self) -> &[(u64, u64)] {
        self.extras.as_ref().map_or(&[], |e| &e.pod_hugepages)
    }

    /// The pod's huge pages by page size, as its cgroup is limited to them and admission charges them: the app
    /// containers' and sidecars' sum, or the largest plain init container's (with the sidecars started before
    /// it, counted as for other resources) when that is more; a size the pod level names is the pod's own.
    pub fn hugepages(&self) -> std::collections::BTreeMap<u64, u64> {
        use std::collections::BTreeMap;
        let mut running: BTreeMap<u64, u64> = BTreeMap::new();
        let mut sidecars: BTreeMap<u64, u64> = BTreeMap::new();
        let mut init_peak: BTreeMap<u64, u64> = BTreeMap::new();
        let requests = self.hugepage_requests();
        let of = |name: &str| -> Vec<(u64, u64)> {
            requests
                .iter()
                .filter(|(c, _, _)| c == name)
                .map(|(_, size, bytes)| (*size, *bytes))
                .collect()
        };
        for c in self.init_containers.iter() {
            for (size, bytes) in of(&c.name) {
                let peak = init_peak.entry(size).or_default();
                if c.sidecar {
                    let side = sidecars.entry(size).or_default();
                    *side += bytes;
                    *peak = (*peak).max(*side);
                } else {
                    *peak = (*peak).max(sidecars.get(&size).copied().unwrap_or(0) + bytes);
                }
            }
        }
        for c in self.containers.iter() {
            for (size, bytes) in of(&c.name) {
                *running.entry(size).or_default() += bytes;
            }
        }
        for (size, bytes) in sidecars {
            *running.entry(size).or_default() += bytes;
        }
        for (size, peak) in init_peak {
            let r = running.entry(size).or_default();
            *r = (*r).max(peak);
        }
        if self.pod_level().is_some() {
            running.extend(self.pod_level_hugepages().iter().copied());
        }
        running
    }

    /// The huge pages limits of container `name`: its own, over the pod-level ones.
    pub fn container_hugepages(&self, name: &str) -> std::collections::BTreeMap<u64, u64> {
        let mut out: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
        if self.pod_level().is_some() {
            out.extend(self.pod_level_hugepages().iter().copied());
        }
        out.extend(
            self.hugepage_requests()
                .iter()
                .filter(|(c, _, _)| c == name)
                .map(|(_, size, bytes)| (*size, *bytes)),
        );
        out
    }
}
