//! The device manager's bookkeeping, without I/O: each resource's devices and their health, whether its plugin
//! is connected, the devices each container holds (with the plugin's answer to `Allocate`), and the counts pods
//! reserved at admission but whose containers have not been given devices yet.
//!
//! The arithmetic is the kubelet's: capacity counts every device of a resource, allocatable only the healthy
//! ones; a resource whose plugin went away reports all its devices unhealthy (allocatable 0) until the grace
//! period ends, then no devices at all. A pod is admitted when, for each resource, the healthy devices not held
//! by other pods cover what its containers ask for.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// What a container needs to use its devices: the plugin's answer to `Allocate`, kept as the runtime will be
/// told it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// Environment variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub envs: BTreeMap<String, String>,
    /// Host paths mounted into the container: (container path, host path, read only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<(String, String, bool)>,
    /// Device nodes: (container path, host path, cgroup permissions).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<(String, String, String)>,
    /// Annotations for the runtime.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Fully qualified CDI device names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cdi_devices: Vec<String>,
}

impl Allocation {
    /// Adds `other` after this one (a container holding devices of several resources).
    pub fn merge(&mut self, other: &Allocation) {
        self.envs
            .extend(other.envs.iter().map(|(k, v)| (k.clone(), v.clone())));
        self.mounts.extend(other.mounts.iter().cloned());
        self.devices.extend(other.devices.iter().cloned());
        self.annotations
            .extend(other.annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
        self.cdi_devices.extend(other.cdi_devices.iter().cloned());
    }
}

/// The devices one container holds of one resource, and what the plugin said about them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assigned {
    /// The pod's UID.
    pub pod_uid: String,
    /// The container's name.
    pub container: String,
    /// The resource.
    pub resource: String,
    /// The device IDs.
    pub device_ids: BTreeSet<String>,
    /// The plugin's answer to `Allocate` for these devices.
    pub allocation: Allocation,
}

/// One device as its plugin last listed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Healthy (`Healthy`), or not.
    pub healthy: bool,
    /// The NUMA nodes the device is close to.
    pub numa_nodes: Vec<i64>,
}

/// One resource's devices and its plugin's state.
#[derive(Debug, Clone, Default)]
struct Resource {
    devices: BTreeMap<String, DeviceInfo>,
    /// The plugin is gone: its devices count as unhealthy; `expired` once the grace period ended.
    gone: bool,
    expired: bool,
}

/// A resource's counts for the node's status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Counts {
    /// Every device.
    pub capacity: u64,
    /// Healthy devices.
    pub allocatable: u64,
}

/// The bookkeeping of one node's devices.
#[derive(Debug, Default)]
pub struct DeviceState {
    resources: BTreeMap<String, Resource>,
    /// Devices held, keyed by (pod UID, container, resource).
    assigned: BTreeMap<(String, String, String), Assigned>,
    /// Counts reserved at admission, keyed like `assigned`, not yet turned into devices.
    reserved: BTreeMap<(String, String, String), u64>,
}

/// Why devices could not be given; the message follows the kubelet's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    /// The resource has no plugin.
    #[error("cannot allocate unregistered device {0}")]
    Unregistered(String),
    /// No device of the resource is healthy.
    #[error("no healthy devices present; cannot allocate unhealthy devices {0}")]
    NoHealthy(String),
    /// Too few free healthy devices.
    #[error(
        "requested number of devices unavailable for {resource}. Requested: {requested}, Available: {available}"
    )]
    Unavailable {
        /// The resource.
        resource: String,
        /// How many were asked for.
        requested: u64,
        /// How many were free.
        available: u64,
    },
}

impl DeviceState {
    /// Whether devices of `resource` are handed out by a plugin (registered now, or held by a container).
    pub fn is_plugin_resource(&self, resource: &str) -> bool {
        self.resources.contains_key(resource) || self.assigned.values().any(|a| a.resource == resource)
    }

    /// The resource's plugin (re)registered: its devices are listed afresh by `ListAndWatch`.
    pub fn registered(&mut self, resource: &str) {
        let r = self.resources.entry(resource.to_owned()).or_default();
        r.gone = false;
        r.expired = false;
    }

    /// The plugin listed `devices`, replacing what it listed before.
    pub fn update(&mut self, resource: &str, devices: BTreeMap<String, DeviceInfo>) {
        let r = self.resources.entry(resource.to_owned()).or_default();
        r.devices = devices;
        r.gone = false;
        r.expired = false;
    }

    /// The plugin's connection ended: its devices stop being allocatable.
    pub fn gone(&mut self, resource: &str) {
        if let Some(r) = self.resources.get_mut(resource) {
            r.gone = true;
        }
    }

    /// The grace period after the plugin went ended without it coming back: the resource's devices are
    /// forgotten (the node reports 0). Returns whether anything changed.
    pub fn expire(&mut self, resource: &str) -> bool {
        match self.resources.get_mut(resource) {
            Some(r) if r.gone && !r.expired => {
                r.expired = true;
                r.devices.clear();
                true
            }
            _ => false,
        }
    }

    /// Every resource's capacity and allocatable.
    pub fn counts(&self) -> BTreeMap<String, Counts> {
        self.resources
            .iter()
            .map(|(name, r)| {
                let healthy = if r.gone {
                    0
                } else {
                    r.devices.values().filter(|d| d.healthy).count() as u64
                };
                (
                    name.clone(),
                    Counts {
                        capacity: r.devices.len() as u64,
                        allocatable: healthy,
                    },
                )
            })
            .collect()
    }

    /// The healthy devices of every connected plugin (the pod-resources API's allocatable devices).
    pub fn healthy_devices(&self) -> BTreeMap<String, Vec<(String, Vec<i64>)>> {
        self.resources
            .iter()
            .filter(|(_, r)| !r.gone)
            .map(|(name, r)| {
                let ids = r
                    .devices
                    .iter()
                    .filter(|(_, d)| d.healthy)
                    .map(|(id, d)| (id.clone(), d.numa_nodes.clone()))
                    .collect();
                (name.clone(), ids)
            })
            .collect()
    }

    fn healthy(&self, resource: &str) -> BTreeSet<&str> {
        self.resources
            .get(resource)
            .filter(|r| !r.gone)
            .map(|r| {
                r.devices
                    .iter()
                    .filter(|(_, d)| d.healthy)
                    .map(|(id, _)| id.as_str())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn in_use(&self, resource: &str) -> BTreeSet<&str> {
        self.assigned
            .values()
            .filter(|a| a.resource == resource)
            .flat_map(|a| a.device_ids.iter().map(String::as_str))
            .collect()
    }

    fn reserved_elsewhere(&self, resource: &str, except: &(String, String, String)) -> u64 {
        self.reserved
            .iter()
            .filter(|(k, _)| k.2 == resource && *k != except)
            .map(|(_, n)| *n)
            .sum()
    }

    /// Reserves, for the pod `pod_uid`, `wants` (container, resource, count) of device plugin resources; all or
    /// nothing. Containers already holding their devices (a pod admitted before a restart) keep them.
    pub fn reserve(&mut self, pod_uid: &str, wants: &[(String, String, u64)]) -> Result<(), AllocateError> {
        let mut per_resource: BTreeMap<&str, u64> = BTreeMap::new();
        for (container, resource, count) in wants {
            let key = (pod_uid.to_owned(), container.clone(), resource.clone());
            if self.assigned.contains_key(&key) {
                continue;
            }
            *per_resource.entry(resource).or_default() += count;
        }
        for (resource, requested) in &per_resource {
            let Some(r) = self.resources.get(*resource) else {
                return Err(AllocateError::Unregistered((*resource).to_owned()));
            };
            let healthy = self.healthy(resource);
            if healthy.is_empty() || r.gone {
                return Err(AllocateError::NoHealthy((*resource).to_owned()));
            }
            let in_use = self.in_use(resource);
            let free = healthy.difference(&in_use).count() as u64;
            let others: u64 = self
                .reserved
                .iter()
                .filter(|(k, _)| k.2 == *resource && k.0 != pod_uid)
                .map(|(_, n)| *n)
                .sum();
            let available = free.saturating_sub(others);
            if available < *requested {
                return Err(AllocateError::Unavailable {
                    resource: (*resource).to_owned(),
                    requested: *requested,
                    available,
                });
            }
        }
        for (container, resource, count) in wants {
            let key = (pod_uid.to_owned(), container.clone(), resource.clone());
            if !self.assigned.contains_key(&key) {
                self.reserved.insert(key, *count);
            }
        }
        Ok(())
    }

    /// What the container holds of `resource`, if it was given devices already.
    pub fn assigned(&self, pod_uid: &str, container: &str, resource: &str) -> Option<&Assigned> {
        self.assigned
            .get(&(pod_uid.to_owned(), container.to_owned(), resource.to_owned()))
    }

    /// The free healthy devices the container may be given of `resource` (those no container holds; the
    /// counts other pods reserved are left to them), and how many it needs; `None` when nothing is reserved.
    pub fn candidates(
        &self,
        pod_uid: &str,
        container: &str,
        resource: &str,
    ) -> Option<Result<(Vec<String>, u64), AllocateError>> {
        let key = (pod_uid.to_owned(), container.to_owned(), resource.to_owned());
        let needed = *self.reserved.get(&key)?;
        let healthy = self.healthy(resource);
        let in_use = self.in_use(resource);
        let free: Vec<String> = healthy.difference(&in_use).map(|s| (*s).to_owned()).collect();
        let spare = (free.len() as u64).saturating_sub(self.reserved_elsewhere(resource, &key));
        if spare < needed {
            return Some(Err(AllocateError::Unavailable {
                resource: resource.to_owned(),
                requested: needed,
                available: spare,
            }));
        }
        Some(Ok((free, needed)))
    }

    /// Records that the container was given `device_ids` of `resource` with `allocation`; its reservation ends.
    pub fn assign(&mut self, assigned: Assigned) {
        let key = (
            assigned.pod_uid.clone(),
            assigned.container.clone(),
            assigned.resource.clone(),
        );
        self.reserved.remove(&key);
        self.assigned.insert(key, assigned);
    }

    /// The container's devices of `resource` were not given after all (the plugin refused): `count` is
    /// reserved again.
    pub fn release_container(&mut self, pod_uid: &str, container: &str, resource: &str, count: u64) {
        let key = (pod_uid.to_owned(), container.to_owned(), resource.to_owned());
        self.assigned.remove(&key);
        self.reserved.insert(key, count);
    }

    /// The pod ended: its devices and reservations are free again. Returns whether it held any devices.
    pub fn release(&mut self, pod_uid: &str) -> bool {
        self.reserved.retain(|k, _| k.0 != pod_uid);
        let before = self.assigned.len();
        self.assigned.retain(|k, _| k.0 != pod_uid);
        before != self.assigned.len()
    }

    /// Frees whatever pods not in `active` hold (pods that ended while the agent was down). Returns whether
    /// anything was freed.
    pub fn retain_pods(&mut self, active: &dyn Fn(&str) -> bool) -> bool {
        self.reserved.retain(|k, _| active(&k.0));
        let before = self.assigned.len();
        self.assigned.retain(|k, _| active(&k.0));
        before != self.assigned.len()
    }

    /// Every container's devices.
    pub fn all_assigned(&self) -> impl Iterator<Item = &Assigned> {
        self.assigned.values()
    }

    /// The pod's containers' devices.
    pub fn pod_assigned<'a>(&'a self, pod_uid: &'a str) -> impl Iterator<Item = &'a Assigned> + 'a {
        self.assigned.values().filter(move |a| a.pod_uid == pod_uid)
    }

    /// Restores what a checkpoint holds: each container's devices, and the devices each resource had (as
    /// unhealthy until the plugin registers again and lists them).
    pub fn restore(&mut self, assigned: Vec<Assigned>, devices: BTreeMap<String, Vec<String>>) {
        for (resource, ids) in devices {
            let r = self.resources.entry(resource).or_default();
            r.gone = true;
            for id in ids {
                r.devices.insert(
                    id,
                    DeviceInfo {
                        healthy: false,
                        numa_nodes: Vec::new(),
                    },
                );
            }
        }
        for a in assigned {
            self.assign(a);
        }
    }

    /// Each resource's device IDs (for the checkpoint).
    pub fn device_ids(&self) -> BTreeMap<String, Vec<String>> {
        self.resources
            .iter()
            .map(|(name, r)| (name.clone(), r.devices.keys().cloned().collect()))
            .collect()
    }
}
