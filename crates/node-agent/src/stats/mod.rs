//! The stats provider: what one node and its pods use, for the eviction manager, image GC and the kubelet
//! API's `/stats/summary` and `/metrics/resource`.
//!
//! Per-pod and per-container figures come from the runtime (`ListPodSandboxStats`, with start times from
//! `ListPodSandbox` / `ListContainers`); node figures come from a [`HostStats`] source:
//!
//! * real mode — [`host::RealHost`]: the memory working set of the machine (the root memory cgroup, or
//!   `/proc/meminfo`), `statvfs` of the agent's root directory (nodefs) and of the runtime's image filesystem
//!   mountpoint (imagefs, from `ImageFsInfo`), `kernel.pid_max` and the number of processes;
//! * hollow mode — [`Synthetic`]: the node's capacity from its [`MachineInfo`](crate::MachineInfo), used by what
//!   the (fake) runtime reports — the pods' CPU and working sets, and one filesystem holding the images and the
//!   containers' writable layers — plus a [`Baseline`] for what a machine runs besides its pods, so that a node
//!   without pods reports non-zero CPU and memory as a kubelet does (metrics-server drops a node reporting 0).
//!
//! The node's CPU is its pods' plus what [`HostStats::cpu_besides_pods`] adds. A ready pod the runtime gives no
//! figures for (containerd under the systemd cgroup driver, see [`cgroup`]) gets them from its cgroup where the
//! host can read it ([`HostStats::pod_cgroup`]).

pub mod cgroup;
pub mod host;

use std::sync::Arc;

use runtime_api::{Runtime, RuntimeError, cri};

use crate::config::AgentConfig;

/// One container's usage.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerUsage {
    /// Container name.
    pub name: String,
    /// Start (creation) time, Unix nanoseconds.
    pub start_ns: i64,
    /// Sample time, Unix nanoseconds.
    pub time_ns: i64,
    /// CPU now, nanocores.
    pub nano_cores: u64,
    /// Cumulative CPU, core-nanoseconds.
    pub core_nanos: u64,
    /// Memory working set, bytes.
    pub working_set: u64,
    /// Memory usage, bytes.
    pub memory_usage: u64,
    /// Resident set, bytes.
    pub rss: u64,
    /// Writable layer, bytes.
    pub rootfs_bytes: u64,
}

/// One pod's usage.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodUsage {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// UID.
    pub uid: String,
    /// Sandbox creation time, Unix nanoseconds.
    pub start_ns: i64,
    /// Sample time, Unix nanoseconds.
    pub time_ns: i64,
    /// CPU now, nanocores.
    pub nano_cores: u64,
    /// Cumulative CPU, core-nanoseconds.
    pub core_nanos: u64,
    /// Memory working set, bytes.
    pub working_set: u64,
    /// Network received / sent bytes of the default interface.
    pub rx_bytes: u64,
    /// Sent bytes.
    pub tx_bytes: u64,
    /// Processes running in the pod.
    pub processes: u64,
    /// Its running containers.
    pub containers: Vec<ContainerUsage>,
    /// Its CSI volumes whose drivers report statistics (filled for the summary only).
    pub volumes: Arc<[crate::csi::volume_stats::VolumeUsage]>,
}

impl PodUsage {
    /// Writable layers of its containers, bytes (its ephemeral-storage use as the eviction manager counts it).
    pub fn rootfs_bytes(&self) -> u64 {
        self.containers.iter().map(|c| c.rootfs_bytes).sum()
    }
}

/// One filesystem.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsStats {
    /// Size, bytes.
    pub capacity_bytes: u64,
    /// Free for unprivileged users, bytes.
    pub available_bytes: u64,
    /// Inodes (`None`: not known).
    pub inodes: Option<u64>,
    /// Free inodes.
    pub inodes_free: Option<u64>,
}

impl FsStats {
    /// Used bytes.
    pub fn used_bytes(&self) -> u64 {
        self.capacity_bytes.saturating_sub(self.available_bytes)
    }
}

/// The node's own figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeUsage {
    /// CPU of the whole node now, nanocores.
    pub nano_cores: u64,
    /// Cumulative CPU of the whole node, core-nanoseconds.
    pub core_nanos: u64,
    /// Memory capacity, bytes.
    pub memory_capacity: u64,
    /// Memory working set, bytes.
    pub memory_working_set: u64,
    /// The filesystem of the agent's root directory (pods' volumes and logs).
    pub nodefs: Option<FsStats>,
    /// The runtime's image filesystem.
    pub imagefs: Option<FsStats>,
    /// `kernel.pid_max` and processes running, when known.
    pub pids: Option<(u64, u64)>,
    /// Sample time, Unix nanoseconds.
    pub time_ns: i64,
}

impl NodeUsage {
    /// Memory available: capacity minus the working set.
    pub fn memory_available(&self) -> u64 {
        self.memory_capacity.saturating_sub(self.memory_working_set)
    }
}

/// A snapshot of the node and its pods.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// The node.
    pub node: NodeUsage,
    /// Its pods, by namespace and name.
    pub pods: Vec<PodUsage>,
}

/// A runtime call that failed while gathering stats.
#[derive(Debug, thiserror::Error)]
#[error("{call}: {source}")]
pub struct StatsError {
    /// The CRI call.
    pub call: &'static str,
    /// Its error.
    #[source]
    pub source: RuntimeError,
}

/// What the runtime cannot tell about the node: memory, filesystems, processes.
pub trait HostStats: Send + Sync {
    /// Memory working set of the whole node, bytes (`None`: the sum of the pods' is used).
    fn memory_working_set(&self) -> Option<u64>;
    /// The filesystem of the agent's root directory.
    fn node_fs(&self) -> Option<FsStats>;
    /// The filesystem mounted at (or holding) `path`.
    fn fs_at(&self, path: &str) -> Option<FsStats>;
    /// `(pid_max, processes)`.
    fn pids(&self) -> Option<(u64, u64)>;
    /// Memory the node uses besides its pods, bytes, added to the pods' when
    /// [`memory_working_set`](HostStats::memory_working_set) is `None`.
    fn memory_besides_pods(&self) -> u64 {
        0
    }
    /// CPU the node uses besides its pods at `now_ns` (Unix nanoseconds): nanocores now and core-nanoseconds so
    /// far, added to the pods'.
    fn cpu_besides_pods(&self, _now_ns: i64) -> (u64, u64) {
        (0, 0)
    }
    /// The figures of pod `uid`, which the runtime gave none for, read from its cgroup at `now_ns` (Unix
    /// nanoseconds), with those of its running containers `(name, id)`; `None` where they cannot be read here.
    fn pod_cgroup(
        &self,
        _uid: &str,
        _containers: &[(String, String)],
        _now_ns: i64,
    ) -> Option<cgroup::PodCgroupUsage> {
        None
    }
}

/// What a machine uses besides its pods' containers (its system daemons, runtime and node agent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Baseline {
    /// CPU, nanocores.
    pub nano_cores: u64,
    /// Memory working set, bytes.
    pub memory_bytes: u64,
}

/// Hollow nodes: nothing is read from the host; node figures are the machine's capacity used by what the
/// runtime reports, plus a constant [`Baseline`] (none by default), whose CPU accumulates from when this value
/// was made (see the module documentation).
#[derive(Debug, Clone, Copy, Default)]
pub struct Synthetic {
    baseline: Baseline,
    since_ns: i64,
}

impl Synthetic {
    /// A source adding `baseline` to every node it serves, its cumulative CPU counted from now.
    pub fn with_baseline(baseline: Baseline) -> Self {
        Self {
            baseline,
            since_ns: now_ns(),
        }
    }
}

impl HostStats for Synthetic {
    fn memory_working_set(&self) -> Option<u64> {
        None
    }
    fn memory_besides_pods(&self) -> u64 {
        self.baseline.memory_bytes
    }
    fn cpu_besides_pods(&self, now_ns: i64) -> (u64, u64) {
        let elapsed = u128::try_from(now_ns.saturating_sub(self.since_ns)).unwrap_or(0);
        let core_nanos = u128::from(self.baseline.nano_cores) * elapsed / 1_000_000_000;
        (
            self.baseline.nano_cores,
            u64::try_from(core_nanos).unwrap_or(u64::MAX),
        )
    }
    fn node_fs(&self) -> Option<FsStats> {
        None
    }
    fn fs_at(&self, _path: &str) -> Option<FsStats> {
        None
    }
    fn pids(&self) -> Option<(u64, u64)> {
        None
    }
}

fn v(x: Option<&cri::UInt64Value>) -> u64 {
    x.map_or(0, |x| x.value)
}

fn now_ns() -> i64 {
    i64::try_from(time::OffsetDateTime::now_utc().unix_timestamp_nanos()).unwrap_or(0)
}

/// Gathers [`Summary`]s for one node. Cheap to clone.
#[derive(Clone)]
pub struct StatsProvider {
    runtime: Arc<dyn Runtime>,
    config: Arc<AgentConfig>,
    host: Arc<dyn HostStats>,
    csi: Option<crate::csi::CsiDrivers>,
}

impl std::fmt::Debug for StatsProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsProvider").finish_non_exhaustive()
    }
}

impl StatsProvider {
    /// A provider over `runtime` for the node of `config` (its machine facts give capacities), with node
    /// figures from `host`.
    pub fn new(runtime: Arc<dyn Runtime>, config: Arc<AgentConfig>, host: Arc<dyn HostStats>) -> Self {
        Self {
            runtime,
            config,
            host,
            csi: None,
        }
    }

    /// The pods' CSI volumes are reported too, with their drivers' figures.
    pub fn with_csi(mut self, drivers: crate::csi::CsiDrivers) -> Self {
        self.csi = Some(drivers);
        self
    }

    /// The figures of pod `uid`'s CSI volumes (at most `volumeStatsAggPeriod` old).
    pub async fn volumes(&self, uid: &str) -> Arc<[crate::csi::volume_stats::VolumeUsage]> {
        match &self.csi {
            Some(drivers) => {
                let max_age = self.config.kubelet.volume_stats_agg_period;
                drivers.published().stats(drivers, uid, max_age).await
            }
            None => Arc::new([]),
        }
    }

    /// The `kubelet_volume_stats_*` metrics of the pods' claims (Prometheus text; empty without any).
    pub async fn volume_metrics(&self) -> String {
        let Some(drivers) = &self.csi else {
            return String::new();
        };
        let mut all = Vec::new();
        for uid in drivers.published().pods() {
            all.extend(self.volumes(&uid).await.iter().cloned());
        }
        crate::csi::volume_stats::metrics_text(&all)
    }

    /// Every ready pod's usage, from the runtime, by namespace and name.
    pub async fn pods(&self) -> Result<Vec<PodUsage>, StatsError> {
        let err = |call| move |source| StatsError { call, source };
        let sandboxes = self
            .runtime
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
            .await
            .map_err(err("ListPodSandbox"))?
            .items;
        let stats = match self
            .runtime
            .list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest { filter: None })
            .await
        {
            Ok(r) => r.stats,
            // containerd 1.6 fails the whole list when one sandbox is stopped: ask per ready sandbox
            Err(error) => {
                tracing::debug!(%error, "ListPodSandboxStats failed; asking per ready sandbox");
                let mut stats = Vec::new();
                for sb in sandboxes
                    .iter()
                    .filter(|sb| sb.state == cri::PodSandboxState::SandboxReady as i32)
                {
                    let req = cri::PodSandboxStatsRequest {
                        pod_sandbox_id: sb.id.clone(),
                    };
                    match self.runtime.pod_sandbox_stats(req).await {
                        Ok(r) => stats.extend(r.stats),
                        Err(error) => tracing::debug!(sandbox = %sb.id, %error, "PodSandboxStats failed"),
                    }
                }
                stats
            }
        };
        let containers = self
            .runtime
            .list_containers(cri::ListContainersRequest { filter: None })
            .await
            .map_err(err("ListContainers"))?
            .containers;
        let mut pods = Vec::with_capacity(stats.len());
        for s in stats {
            let Some(attrs) = &s.attributes else { continue };
            let Some(meta) = &attrs.metadata else { continue };
            let Some(linux) = &s.linux else { continue };
            let cpu = linux.cpu.unwrap_or_default();
            let memory = linux.memory.unwrap_or_default();
            let iface = linux
                .network
                .as_ref()
                .and_then(|n| n.default_interface.clone())
                .unwrap_or_default();
            let start_ns = sandboxes
                .iter()
                .find(|sb| sb.id == attrs.id)
                .map_or(0, |sb| sb.created_at);
            let usage = linux
                .containers
                .iter()
                .filter_map(|c| {
                    let a = c.attributes.as_ref()?;
                    let cpu = c.cpu.unwrap_or_default();
                    let mem = c.memory.unwrap_or_default();
                    Some(ContainerUsage {
                        name: a.metadata.as_ref()?.name.clone(),
                        start_ns: containers
                            .iter()
                            .find(|x| x.id == a.id)
                            .map_or(0, |x| x.created_at),
                        time_ns: cpu.timestamp,
                        nano_cores: v(cpu.usage_nano_cores.as_ref()),
                        core_nanos: v(cpu.usage_core_nano_seconds.as_ref()),
                        working_set: v(mem.working_set_bytes.as_ref()),
                        memory_usage: v(mem.usage_bytes.as_ref()),
                        rss: v(mem.rss_bytes.as_ref()),
                        rootfs_bytes: v(c.writable_layer.as_ref().and_then(|w| w.used_bytes.as_ref())),
                    })
                })
                .collect();
            pods.push(PodUsage {
                name: meta.name.clone(),
                namespace: meta.namespace.clone(),
                uid: meta.uid.clone(),
                start_ns,
                time_ns: cpu.timestamp,
                nano_cores: v(cpu.usage_nano_cores.as_ref()),
                core_nanos: v(cpu.usage_core_nano_seconds.as_ref()),
                working_set: v(memory.working_set_bytes.as_ref()),
                rx_bytes: v(iface.rx_bytes.as_ref()),
                tx_bytes: v(iface.tx_bytes.as_ref()),
                processes: v(linux.process.as_ref().and_then(|p| p.process_count.as_ref())),
                containers: usage,
                volumes: Arc::new([]),
            });
        }
        self.pods_from_cgroups(&sandboxes, &containers, &mut pods).await;
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        Ok(pods)
    }

    /// Adds the ready pods the runtime gave no figures for, with figures from their cgroups where the host reads
    /// them (their containers' writable layers from `ListContainerStats`; no network figures).
    async fn pods_from_cgroups(
        &self,
        sandboxes: &[cri::PodSandbox],
        containers: &[cri::Container],
        pods: &mut Vec<PodUsage>,
    ) {
        let now = now_ns();
        let mut added = Vec::new();
        for sb in sandboxes
            .iter()
            .filter(|sb| sb.state == cri::PodSandboxState::SandboxReady as i32)
        {
            let Some(meta) = &sb.metadata else { continue };
            if pods.iter().any(|p| p.uid == meta.uid) {
                continue;
            }
            let running: Vec<&cri::Container> = containers
                .iter()
                .filter(|c| {
                    c.pod_sandbox_id == sb.id && c.state == cri::ContainerState::ContainerRunning as i32
                })
                .collect();
            let ids: Vec<(String, String)> = running
                .iter()
                .filter_map(|c| Some((c.metadata.as_ref()?.name.clone(), c.id.clone())))
                .collect();
            let Some(usage) = self.host.pod_cgroup(&meta.uid, &ids, now) else {
                continue;
            };
            let containers = usage
                .containers
                .iter()
                .map(|(name, u)| {
                    let c = running
                        .iter()
                        .find(|c| c.metadata.as_ref().is_some_and(|m| &m.name == name));
                    ContainerUsage {
                        name: name.clone(),
                        start_ns: c.map_or(0, |c| c.created_at),
                        time_ns: u.time_ns,
                        nano_cores: u.nano_cores,
                        core_nanos: u.core_nanos,
                        working_set: u.working_set,
                        memory_usage: u.memory_usage,
                        rss: u.rss,
                        rootfs_bytes: 0,
                    }
                })
                .collect();
            added.push((
                ids,
                PodUsage {
                    name: meta.name.clone(),
                    namespace: meta.namespace.clone(),
                    uid: meta.uid.clone(),
                    start_ns: sb.created_at,
                    time_ns: usage.pod.time_ns,
                    nano_cores: usage.pod.nano_cores,
                    core_nanos: usage.pod.core_nanos,
                    working_set: usage.pod.working_set,
                    rx_bytes: 0,
                    tx_bytes: 0,
                    processes: usage.pod.processes,
                    containers,
                    volumes: Arc::new([]),
                },
            ));
        }
        if added.is_empty() {
            return;
        }
        let layers = match self
            .runtime
            .list_container_stats(cri::ListContainerStatsRequest { filter: None })
            .await
        {
            Ok(r) => r.stats,
            Err(error) => {
                tracing::debug!(%error, "ListContainerStats failed; writable layers not known");
                Vec::new()
            }
        };
        for (ids, mut pod) in added {
            for c in &mut pod.containers {
                let Some((_, id)) = ids.iter().find(|(name, _)| *name == c.name) else {
                    continue;
                };
                c.rootfs_bytes = layers
                    .iter()
                    .find(|s| s.attributes.as_ref().is_some_and(|a| &a.id == id))
                    .map_or(0, |s| {
                        v(s.writable_layer.as_ref().and_then(|w| w.used_bytes.as_ref()))
                    });
            }
            pods.push(pod);
        }
    }

    /// What the runtime's images use (`ImageFsInfo`) and where they are.
    async fn image_fs_info(&self) -> Result<(u64, String), StatsError> {
        let info = self
            .runtime
            .image_fs_info(cri::ImageFsInfoRequest {})
            .await
            .map_err(|source| StatsError {
                call: "ImageFsInfo",
                source,
            })?;
        let fs = info.image_filesystems.first();
        let used = fs.map_or(0, |f| v(f.used_bytes.as_ref()));
        let mountpoint = fs
            .and_then(|f| f.fs_id.as_ref())
            .map(|id| id.mountpoint.clone())
            .unwrap_or_default();
        Ok((used, mountpoint))
    }

    /// The node filesystem and the image filesystem: the host's (the image filesystem is the node's when the
    /// runtime's mountpoint cannot be measured), or one synthetic filesystem of the node's ephemeral-storage
    /// capacity holding the images and the writable layers (`layers` asks for their size only then).
    async fn filesystems<F>(&self, images_used: u64, mountpoint: &str, layers: F) -> (FsStats, FsStats)
    where
        F: std::future::Future<Output = u64>,
    {
        match self.host.node_fs() {
            Some(nodefs) => {
                let imagefs = (!mountpoint.is_empty())
                    .then(|| self.host.fs_at(mountpoint))
                    .flatten()
                    .unwrap_or(nodefs);
                (nodefs, imagefs)
            }
            None => {
                let capacity = self.config.machine.ephemeral_storage_bytes;
                let fs = FsStats {
                    capacity_bytes: capacity,
                    available_bytes: capacity.saturating_sub(images_used + layers.await),
                    inodes: None,
                    inodes_free: None,
                };
                (fs, fs)
            }
        }
    }

    /// The runtime's image filesystem now.
    pub async fn image_fs(&self) -> Result<FsStats, StatsError> {
        let (used, mountpoint) = self.image_fs_info().await?;
        let layers = async {
            match self.pods().await {
                Ok(pods) => pods.iter().map(PodUsage::rootfs_bytes).sum(),
                Err(_) => 0,
            }
        };
        Ok(self.filesystems(used, &mountpoint, layers).await.1)
    }

    /// The node and its pods now.
    pub async fn summary(&self) -> Result<Summary, StatsError> {
        let mut pods = self.pods().await?;
        if self.csi.is_some() {
            for p in &mut pods {
                p.volumes = self.volumes(&p.uid).await;
            }
        }
        let pods_ws: u64 = pods.iter().map(|p| p.working_set).sum();
        let layers: u64 = pods.iter().map(PodUsage::rootfs_bytes).sum();
        let (images_used, mountpoint) = self.image_fs_info().await?;
        let (nodefs, imagefs) = self
            .filesystems(images_used, &mountpoint, std::future::ready(layers))
            .await;
        let time_ns = pods.iter().map(|p| p.time_ns).max().unwrap_or_else(now_ns);
        let (besides_now, besides_total) = self.host.cpu_besides_pods(time_ns);
        Ok(Summary {
            node: NodeUsage {
                nano_cores: besides_now + pods.iter().map(|p| p.nano_cores).sum::<u64>(),
                core_nanos: besides_total + pods.iter().map(|p| p.core_nanos).sum::<u64>(),
                memory_capacity: self.config.machine.memory_bytes,
                memory_working_set: self
                    .host
                    .memory_working_set()
                    .unwrap_or_else(|| pods_ws + self.host.memory_besides_pods()),
                nodefs: Some(nodefs),
                imagefs: Some(imagefs),
                pids: self.host.pids(),
                time_ns,
            },
            pods,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_synthetic_baseline_is_constant_memory_and_cpu_accumulating_at_its_rate() {
        let host = Synthetic {
            baseline: Baseline {
                nano_cores: 80_000_000,
                memory_bytes: 512 << 20,
            },
            since_ns: 1_000_000_000,
        };
        assert_eq!(host.memory_working_set(), None, "the pods' are added to it");
        assert_eq!(host.memory_besides_pods(), 512 << 20);
        // 80 millicores for 2.5 s: 0.2 core-seconds
        assert_eq!(host.cpu_besides_pods(3_500_000_000), (80_000_000, 200_000_000));
        assert_eq!(
            host.cpu_besides_pods(0),
            (80_000_000, 0),
            "no time before it began"
        );
        let none = Synthetic::default();
        assert_eq!(
            (none.memory_besides_pods(), none.cpu_besides_pods(3_500_000_000)),
            (0, (0, 0))
        );
    }
}
