//! The device manager: device plugins (API `v1beta1`) and the devices they hand to containers.
//!
//! A device plugin registers on `<root-dir>/device-plugins/kubelet.sock` ([`registration`]) naming an
//! extended resource (`example.com/resource`) and its own socket; the agent connects back ([`endpoint`]) and
//! follows the plugin's `ListAndWatch` stream. The node's capacity counts every device of the resource, its
//! allocatable only the healthy ones ([`DeviceManager::counts`], read by the node status). When the plugin's
//! connection ends its devices stop being allocatable at once and leave the node after a grace period of
//! five minutes, as the kubelet's.
//!
//! A pod asking for devices is admitted only when enough free healthy devices are left
//! ([`DeviceManager::admit`], the kubelet's `UnexpectedAdmissionError`); each of its containers is given its
//! devices before it is created ([`DeviceManager::container_allocation`]): the plugin's preferred choice when it
//! offers one (`GetPreferredAllocation`), then `Allocate`, whose environment, mounts, device nodes,
//! annotations and CDI devices go into the container's CRI config, then `PreStartContainer` when the plugin
//! asks for it. What each container holds is kept in a checkpoint ([`checkpoint`]) so that an agent started
//! again gives a running pod's containers the same devices without asking the plugins anew; a pod's devices
//! are free again when its worker has stopped it.
//!
//! Plugins are [`DevicePlugin`] values: a connected gRPC plugin on a real node, or in-memory fakes on a
//! hollow node ([`fake`]), both through the same bookkeeping ([`state`]).

pub mod checkpoint;
pub mod endpoint;
pub mod fake;
pub mod registration;
pub mod state;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use state::DeviceState;
pub use state::{AllocateError, Allocation, Assigned, Counts, DeviceInfo};

/// The messages, servers and clients of the device plugin API v1beta1 (generated from
/// `proto/deviceplugin/v1beta1`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1beta1 {
    tonic::include_proto!("v1beta1");
}

/// The device plugin API version this agent speaks.
pub const VERSION: &str = "v1beta1";
/// The directory under the root directory where the agent and the plugins put their sockets.
pub const DIR: &str = "device-plugins";
/// The agent's registration socket in [`DIR`].
pub const SOCKET: &str = "kubelet.sock";
/// How long a resource whose plugin went away stays on the node (with no allocatable devices).
pub const GRACE: Duration = Duration::from_secs(5 * 60);

/// What a plugin offers besides `ListAndWatch` and `Allocate`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PluginOptions {
    /// `PreStartContainer` before each container with its devices starts.
    pub pre_start_required: bool,
    /// `GetPreferredAllocation` is answered.
    pub preferred_allocation: bool,
}

/// One plugin's calls, as the device manager makes them.
#[async_trait::async_trait]
pub trait DevicePlugin: Send + Sync {
    /// The plugin's options.
    fn options(&self) -> PluginOptions;
    /// The plugin's choice of `size` devices out of `available`, including `must_include`.
    async fn preferred(
        &self,
        available: Vec<String>,
        must_include: Vec<String>,
        size: u64,
    ) -> Result<Vec<String>, String>;
    /// What a container given `device_ids` needs.
    async fn allocate(&self, device_ids: Vec<String>) -> Result<Allocation, String>;
    /// Called before a container with `device_ids` starts, when the plugin asked for it.
    async fn pre_start(&self, device_ids: Vec<String>) -> Result<(), String>;
}

/// The device manager of one node (cheap to clone; clones share it).
#[derive(Clone)]
pub struct DeviceManager {
    inner: Arc<Inner>,
}

/// Each resource's connected plugin, with the number of its connection.
type Plugins = BTreeMap<String, (u64, Arc<dyn DevicePlugin>)>;

struct Inner {
    state: Mutex<DeviceState>,
    /// Each resource's connected plugin, with the connection's number.
    plugins: Mutex<Plugins>,
    next_connection: std::sync::atomic::AtomicU64,
    counts: watch::Sender<Arc<BTreeMap<String, Counts>>>,
    checkpoint: Option<PathBuf>,
    grace: Duration,
}

impl std::fmt::Debug for DeviceManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceManager")
            .field("checkpoint", &self.inner.checkpoint)
            .finish_non_exhaustive()
    }
}

impl Default for DeviceManager {
    fn default() -> Self {
        Self::in_memory()
    }
}

/// Where an agent whose root directory is `root_dir` keeps its device plugin sockets and checkpoint.
pub fn dir(root_dir: &Path) -> PathBuf {
    root_dir.join(DIR)
}

impl DeviceManager {
    /// A manager that keeps no checkpoint (a hollow node).
    pub fn in_memory() -> Self {
        Self::build(None, GRACE)
    }

    /// A manager checkpointing into `dir` (`<root-dir>/device-plugins`), restoring what the checkpoint there
    /// holds: the devices containers were given, and each resource's devices (unhealthy until their plugin
    /// registers again; gone after the grace period if it does not). A corrupt checkpoint is reported and
    /// ignored. Must be called inside a tokio runtime.
    pub fn with_checkpoint(dir: &Path) -> Self {
        let path = dir.join(checkpoint::FILE);
        let manager = Self::build(Some(path.clone()), GRACE);
        match checkpoint::read(&path) {
            Ok(Some(saved)) => {
                let resources: Vec<String> = saved.devices.keys().cloned().collect();
                manager.lock().restore(saved.assigned, saved.devices);
                for resource in resources {
                    manager.expire_later(resource);
                }
                manager.publish();
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "ignoring the device manager checkpoint"),
        }
        manager
    }

    fn build(checkpoint: Option<PathBuf>, grace: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(DeviceState::default()),
                plugins: Mutex::new(BTreeMap::new()),
                next_connection: std::sync::atomic::AtomicU64::new(1),
                counts: watch::Sender::new(Arc::new(BTreeMap::new())),
                checkpoint,
                grace,
            }),
        }
    }

    /// The same manager with another grace period (tests).
    pub fn with_grace(checkpoint_dir: Option<&Path>, grace: Duration) -> Self {
        Self::build(checkpoint_dir.map(|d| d.join(checkpoint::FILE)), grace)
    }

    fn lock(&self) -> MutexGuard<'_, DeviceState> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn plugins(&self) -> MutexGuard<'_, Plugins> {
        self.inner.plugins.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Each resource's capacity and allocatable, current and as they change.
    pub fn counts(&self) -> watch::Receiver<Arc<BTreeMap<String, Counts>>> {
        self.inner.counts.subscribe()
    }

    fn publish(&self) {
        let counts = self.lock().counts();
        self.inner.counts.send_if_modified(|c| {
            if **c == counts {
                return false;
            }
            *c = Arc::new(counts);
            true
        });
    }

    fn save(&self) {
        let Some(path) = &self.inner.checkpoint else {
            return;
        };
        let data = {
            let state = self.lock();
            checkpoint::Checkpoint {
                assigned: state.all_assigned().cloned().collect(),
                devices: state.device_ids(),
            }
        };
        if let Err(error) = checkpoint::write(path, &data) {
            tracing::warn!(%error, "could not write the device manager checkpoint");
        }
    }

    /// Whether a plugin serves `resource` now.
    pub fn is_connected(&self, resource: &str) -> bool {
        self.plugins().contains_key(resource)
    }

    /// A plugin for `resource` connected (replacing any earlier one). Returns the connection's number, which
    /// its later calls name.
    pub fn connected(&self, resource: &str, plugin: Arc<dyn DevicePlugin>) -> u64 {
        let id = self
            .inner
            .next_connection
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.plugins().insert(resource.to_owned(), (id, plugin));
        self.lock().registered(resource);
        self.publish();
        id
    }

    /// The plugin of connection `connection` listed `devices` (every device of its resource).
    pub fn listed(&self, resource: &str, connection: u64, devices: BTreeMap<String, DeviceInfo>) {
        if !self.is_current(resource, connection) {
            return;
        }
        self.lock().update(resource, devices);
        self.publish();
        self.save();
    }

    fn is_current(&self, resource: &str, connection: u64) -> bool {
        self.plugins()
            .get(resource)
            .is_some_and(|(id, _)| *id == connection)
    }

    /// The connection `connection` to the plugin of `resource` ended: its devices are no longer allocatable,
    /// and leave the node after the grace period unless a plugin registers again.
    pub fn disconnected(&self, resource: &str, connection: u64) {
        {
            let mut plugins = self.plugins();
            if plugins.get(resource).is_none_or(|(id, _)| *id != connection) {
                return;
            }
            plugins.remove(resource);
        }
        self.lock().gone(resource);
        self.publish();
        self.expire_later(resource.to_owned());
    }

    fn expire_later(&self, resource: String) {
        let this = Arc::downgrade(&self.inner);
        let grace = self.inner.grace;
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            let Some(inner) = this.upgrade() else {
                return;
            };
            let manager = DeviceManager { inner };
            // a plugin that registered again in the meantime keeps the resource
            if manager.plugins().contains_key(&resource) {
                return;
            }
            if manager.lock().expire(&resource) {
                tracing::info!(%resource, "device plugin did not come back within the grace period; its devices are removed");
                manager.publish();
                manager.save();
            }
        });
    }

    /// Admission of a pod asking `wants` (container, resource, count): the counts of device plugin resources
    /// are reserved when enough free healthy devices are left; other resources are not this manager's. The
    /// error is the kubelet's message for its `UnexpectedAdmissionError`.
    pub fn admit(&self, pod_uid: &str, wants: &[(String, String, u64)]) -> Result<(), String> {
        let mut state = self.lock();
        let ours: Vec<(String, String, u64)> = wants
            .iter()
            .filter(|(_, resource, count)| *count > 0 && state.is_plugin_resource(resource))
            .cloned()
            .collect();
        if ours.is_empty() {
            return Ok(());
        }
        state
            .reserve(pod_uid, &ours)
            .map_err(|e| format!("Allocate failed due to {e}, which is unexpected"))
    }

    /// Whether `resource` is handed out by a device plugin on this node.
    pub fn is_plugin_resource(&self, resource: &str) -> bool {
        self.lock().is_plugin_resource(resource)
    }

    /// The devices container `container` of pod `pod_uid` needs for `wants` (resource, count), given now if
    /// they were not before: what the plugins answered (merged over the resources), or `None` when it asks
    /// for no device plugin resource.
    pub async fn container_allocation(
        &self,
        pod_uid: &str,
        container: &str,
        wants: &[(String, u64)],
    ) -> Result<Option<Allocation>, String> {
        let mut out: Option<Allocation> = None;
        for (resource, _) in wants {
            if !self.is_plugin_resource(resource) {
                continue;
            }
            let allocation = self.give(pod_uid, container, resource).await?;
            out.get_or_insert_default().merge(&allocation);
        }
        Ok(out)
    }

    async fn give(&self, pod_uid: &str, container: &str, resource: &str) -> Result<Allocation, String> {
        let plugin = self.plugins().get(resource).map(|(_, p)| p.clone());
        let held = self.lock().assigned(pod_uid, container, resource).cloned();
        if let Some(held) = held {
            if let Some(plugin) = &plugin
                && plugin.options().pre_start_required
            {
                plugin
                    .pre_start(held.device_ids.iter().cloned().collect())
                    .await
                    .map_err(|e| format!("PreStartContainer of {resource} failed: {e}"))?;
            }
            return Ok(held.allocation);
        }
        let Some(plugin) = plugin else {
            return Err(format!("cannot allocate unregistered device {resource}"));
        };
        let candidates = self.lock().candidates(pod_uid, container, resource);
        let (free, needed) = match candidates {
            Some(Ok(c)) => c,
            Some(Err(e)) => return Err(e.to_string()),
            // admitted before this node knew the resource as a plugin's
            None => {
                return Err(format!(
                    "no devices of {resource} were reserved for container {container}"
                ));
            }
        };
        let mut chosen: Vec<String> = Vec::new();
        if plugin.options().preferred_allocation && (free.len() as u64) > needed {
            match plugin.preferred(free.clone(), Vec::new(), needed).await {
                Ok(preferred) => chosen.extend(
                    preferred
                        .into_iter()
                        .filter(|id| free.contains(id))
                        .take(usize::try_from(needed).unwrap_or(usize::MAX)),
                ),
                Err(e) => return Err(format!("GetPreferredAllocation of {resource} failed: {e}")),
            }
        }
        for id in &free {
            if chosen.len() as u64 >= needed {
                break;
            }
            if !chosen.contains(id) {
                chosen.push(id.clone());
            }
        }
        // held from now, so that a container being given devices beside this one does not take them
        self.lock().assign(Assigned {
            pod_uid: pod_uid.to_owned(),
            container: container.to_owned(),
            resource: resource.to_owned(),
            device_ids: chosen.iter().cloned().collect(),
            allocation: Allocation::default(),
        });
        let allocation = match plugin.allocate(chosen.clone()).await {
            Ok(a) => a,
            Err(e) => {
                self.lock()
                    .release_container(pod_uid, container, resource, needed);
                return Err(format!("Allocate of {resource} failed: {e}"));
            }
        };
        self.lock().assign(Assigned {
            pod_uid: pod_uid.to_owned(),
            container: container.to_owned(),
            resource: resource.to_owned(),
            device_ids: chosen.iter().cloned().collect(),
            allocation: allocation.clone(),
        });
        self.save();
        if plugin.options().pre_start_required {
            plugin
                .pre_start(chosen)
                .await
                .map_err(|e| format!("PreStartContainer of {resource} failed: {e}"))?;
        }
        Ok(allocation)
    }

    /// The pod ended: its devices are free again.
    pub fn release(&self, pod_uid: &str) {
        let held = self.lock().release(pod_uid);
        if held {
            self.save();
        }
    }

    /// Frees what pods for which `active` says no hold — pods that ended while the agent was down, whose
    /// devices the checkpoint kept — as the kubelet's device manager drops the assignments of pods no longer
    /// active once it has seen every pod source. Returns whether anything was freed.
    pub fn retain_pods(&self, active: impl Fn(&str) -> bool) -> bool {
        let freed = self.lock().retain_pods(&active);
        if freed {
            self.save();
        }
        freed
    }

    /// The devices each container of pod `pod_uid` holds: (container, resource, device IDs).
    pub fn pod_devices(&self, pod_uid: &str) -> Vec<(String, String, Vec<String>)> {
        self.lock()
            .pod_assigned(pod_uid)
            .map(|a| {
                (
                    a.container.clone(),
                    a.resource.clone(),
                    a.device_ids.iter().cloned().collect(),
                )
            })
            .collect()
    }

    /// The healthy devices of each connected plugin, with their NUMA nodes.
    pub fn allocatable_devices(&self) -> BTreeMap<String, Vec<(String, Vec<i64>)>> {
        self.lock().healthy_devices()
    }
}
