//! QoS and pod cgroups on a real node (`cgroupsPerQOS: true`, the kubelet's default), for cgroup v1 and for
//! cgroup v2 (the unified hierarchy), with the cgroupfs driver.
//!
//! [`QosCgroups::start`] finds the mounted v1 hierarchies (`/proc/self/mountinfo`) and creates, in each, the
//! node's pod cgroup `<cgroupRoot>/kubepods` and the QoS cgroups `kubepods/burstable` and
//! `kubepods/besteffort` (`cpu.shares` 2); Guaranteed pods live directly under `kubepods`. On a host whose only
//! cgroup mount is the unified hierarchy the same tree is made there, each level's controllers enabled in its
//! parent's `cgroup.subtree_control`, and the v1 settings are written as their v2 files ([`v2_setting`]): `cpu.weight`
//! converted from the shares as the kubelet converts them, `cpu.max`, `memory.max`, `pids.max`; containers are
//! created with `memory.oom.group` ([`QosCgroups::container_resources`]). Before a pod's
//! sandbox is created its worker calls [`QosCgroups::ensure`], which creates `…/pod<uid>` with the pod's limits:
//! `cpu.shares` from its cpu request (2 for BestEffort), and — for a Guaranteed pod, or a Burstable one whose
//! every container declares that limit — `cpu.cfs_quota_us` (100 ms period) and `memory.limit_in_bytes` from
//! its summed limits, plus `pids.max` from `podPidsLimit`. The burstable cgroup's `cpu.shares` follows the sum
//! of the Burstable pods' cpu requests. The sandbox config names the pod cgroup as its `cgroup_parent`
//! ([`QosCgroups::pod_path`]), so the runtime puts the pod's containers inside it. When the pod is removed its
//! cgroup goes ([`QosCgroups::remove`]; processes the runtime left inside are killed first, [`leftovers`]) —
//! also the one the runtime made in the v2 hierarchy of a hybrid host (`/sys/fs/cgroup/unified`), where
//! node-agent makes nothing itself. Pod cgroups of pods the node no longer has are found and removed by the orphan sweep ([`QosCgroups::pod_uids`], [`QosCgroups::remove_orphan`]).
//!
//! With the systemd driver (`cgroupDriver: systemd`, [`QosCgroups::start_systemd`]) the same tree is made of
//! slices systemd creates as transient units over D-Bus ([`systemd`]): `kubepods.slice`,
//! `kubepods-burstable.slice`, `kubepods-besteffort.slice`, `kubepods-burstable-pod<uid>.slice`, their limits
//! given as unit properties and written to their files as well; the runtime is handed the pod's slice name as
//! its `cgroup_parent`, the form a runtime using systemd for its cgroups (containerd's `SystemdCgroup = true`)
//! expects. Internally every cgroup keeps its cgroupfs name (`/kubepods/burstable/pod<uid>`); [`QosCgroups::fs_name`]
//! maps it to the path it has in the hierarchy.
//!
//! Huge pages are limited in every cgroup of the tree where the hugetlb controller is there (`hugetlb`).
//!
//! This module owns the tree's layout: [`QosCgroups`], how it is started on each kind of host and with each
//! driver, and where a cgroup of the tree is in the hierarchies. What is written is computed in `settings`, the
//! hierarchies are found in `mounts`, their directories and files made and written in `cgroupfs`, the pods'
//! cgroups kept in `pods` and the node-level limits in `node`.
//!
//! A hollow node has no `QosCgroups`: nothing of the machine's cgroups is touched.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

mod cgroupfs;
mod hugetlb;
mod leftovers;
mod mounts;
mod node;
mod pods;
mod settings;
pub mod systemd;

pub use hugetlb::{HUGETLB_UNBOUNDED, host_page_sizes, hugetlb_settings, page_size_name};
use mounts::v2_hierarchy;
pub use mounts::{Hierarchy, V2_CONTROLLERS, unified_hierarchy, v1_hierarchies, v2_only};
pub use node::NodeLimits;
use settings::MIN_SHARES;
pub use settings::{pod_settings, shares, v2_setting, weight};

/// Why the cgroups could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// No cgroup hierarchy is mounted: neither v1 hierarchies nor the unified one at its usual place.
    #[error(
        "no cgroup hierarchy is mounted (neither cgroup v1 hierarchies nor cgroup v2 at /sys/fs/cgroup); set \
         cgroupsPerQOS: false on this host"
    )]
    NoHierarchy,
    /// `cgroupRoot` is not an absolute path.
    #[error("cgroupRoot {0:?} must be an absolute path")]
    BadRoot(String),
    /// `cgroupDriver: systemd` on a machine whose init is not systemd.
    #[error(
        "cgroupDriver: systemd needs systemd as the machine's init (/run/systemd/system is missing); use \
         cgroupDriver: cgroupfs here"
    )]
    NoSystemd,
    /// systemd refused or failed a request.
    #[error(transparent)]
    Systemd(#[from] systemd::SystemdError),
    /// A cgroup file or directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CgroupError + '_ {
    move |source| CgroupError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The node's QoS cgroups and the pods it has given cgroups. One per real node, shared by its workers.
#[derive(Debug)]
pub struct QosCgroups {
    /// The v1 hierarchies, or the one unified hierarchy of a v2 host (`v2`).
    hierarchies: Vec<Hierarchy>,
    /// Whether `hierarchies` is the unified hierarchy of a cgroup v2 host.
    v2: bool,
    /// The v2 hierarchy of a hybrid host: nothing is made there, but a pod's cgroup the runtime made there goes
    /// with the pod.
    unified: Option<PathBuf>,
    /// `<cgroupRoot>/kubepods`, as the runtime names cgroups (absolute, `/`-separated).
    kubepods: String,
    pids_limit: i64,
    /// Burstable pods' cpu requests by UID: the burstable cgroup's `cpu.shares` is their sum.
    burstable: Mutex<HashMap<String, i64>>,
    /// The systemd driver's connection to systemd: every cgroup of the tree is a slice it makes. `None`: the
    /// cgroupfs driver.
    systemd: Option<systemd::Systemd>,
    /// The machine's huge page sizes, bytes, when the hugetlb controller is there to limit them; else empty.
    page_sizes: Vec<u64>,
}

impl QosCgroups {
    /// Finds the host's v1 hierarchies, or its unified hierarchy on a cgroup v2 host, and creates the QoS
    /// cgroups under `cgroup_root` (`cgroupRoot`).
    pub fn start(cgroup_root: &str, pods_pids_limit: i64) -> Result<Arc<Self>, CgroupError> {
        let mountinfo = "/proc/self/mountinfo";
        let text = std::fs::read_to_string(mountinfo).map_err(io(Path::new(mountinfo)))?;
        if let Some(dir) = v2_only(&text) {
            return Self::start_on_v2(&dir, cgroup_root, pods_pids_limit, host_page_sizes());
        }
        Self::build_on(
            v1_hierarchies(&text),
            false,
            unified_hierarchy(&text),
            cgroup_root,
            pods_pids_limit,
            host_page_sizes(),
        )
        .map(Arc::new)
    }

    /// [`QosCgroups::start`] on the given hierarchies, on a machine with huge pages of `page_sizes` bytes.
    pub fn start_on(
        hierarchies: Vec<Hierarchy>,
        cgroup_root: &str,
        pods_pids_limit: i64,
        page_sizes: &[u64],
    ) -> Result<Arc<Self>, CgroupError> {
        Self::build_on(hierarchies, false, None, cgroup_root, pods_pids_limit, page_sizes).map(Arc::new)
    }

    /// [`QosCgroups::start`] on the unified hierarchy mounted at `mount`: the controllers the kubelet uses
    /// ([`V2_CONTROLLERS`]) that `cgroup.controllers` there lists, on a machine with huge pages of `page_sizes`
    /// bytes.
    pub fn start_on_v2(
        mount: &Path,
        cgroup_root: &str,
        pods_pids_limit: i64,
        page_sizes: &[u64],
    ) -> Result<Arc<Self>, CgroupError> {
        let hierarchy = v2_hierarchy(mount)?;
        Self::build_on(
            vec![hierarchy],
            true,
            None,
            cgroup_root,
            pods_pids_limit,
            page_sizes,
        )
        .map(Arc::new)
    }

    /// The systemd driver's [`QosCgroups::start`]: the tree made of slices systemd creates, in the unified
    /// hierarchy of a cgroup v2 host or in the v1 hierarchies. Refused where systemd is not the init.
    pub async fn start_systemd(cgroup_root: &str, pods_pids_limit: i64) -> Result<Arc<Self>, CgroupError> {
        if !systemd::booted() {
            return Err(CgroupError::NoSystemd);
        }
        let mountinfo = "/proc/self/mountinfo";
        let text = std::fs::read_to_string(mountinfo).map_err(io(Path::new(mountinfo)))?;
        let (hierarchies, v2, unified) = match v2_only(&text) {
            Some(dir) => (vec![v2_hierarchy(&dir)?], true, None),
            None => (v1_hierarchies(&text), false, unified_hierarchy(&text)),
        };
        let sd = systemd::Systemd::connect().await?;
        let cg = Arc::new(Self::new(
            hierarchies,
            v2,
            unified,
            cgroup_root,
            pods_pids_limit,
            Some(sd),
            host_page_sizes(),
        )?);
        cg.create_tree().await?;
        Ok(cg)
    }

    /// Whether the pods' cgroups are in the unified hierarchy of a cgroup v2 host.
    pub fn is_v2(&self) -> bool {
        self.v2
    }

    /// Adds what the node's cgroups ask of every container's resources: on cgroup v2, `memory.oom.group` 1, so
    /// that the kernel kills all of a container's processes when one of them runs it out of memory, as the
    /// kubelet asks on v2 by default (`singleProcessOOMKill` is not read). Nothing on v1.
    pub fn container_resources(&self, resources: &mut runtime_api::cri::LinuxContainerResources) {
        if self.v2 {
            resources
                .unified
                .insert("memory.oom.group".to_owned(), "1".to_owned());
        }
    }

    fn build_on(
        hierarchies: Vec<Hierarchy>,
        v2: bool,
        unified: Option<PathBuf>,
        cgroup_root: &str,
        pods_pids_limit: i64,
        page_sizes: &[u64],
    ) -> Result<Self, CgroupError> {
        let cg = Self::new(
            hierarchies,
            v2,
            unified,
            cgroup_root,
            pods_pids_limit,
            None,
            page_sizes,
        )?;
        for name in ["", "/burstable", "/besteffort"] {
            cg.create(&format!("{}{name}", cg.kubepods))?;
        }
        cg.write(
            &format!("{}/besteffort", cg.kubepods),
            "cpu.shares",
            &MIN_SHARES.to_string(),
        )?;
        cg.write_burstable()?;
        for class in ["/burstable", "/besteffort"] {
            cg.write_hugetlb(
                &format!("{}{class}", cg.kubepods),
                &cg.hugetlb(&BTreeMap::new(), HUGETLB_UNBOUNDED),
            )?;
        }
        Ok(cg)
    }

    fn new(
        hierarchies: Vec<Hierarchy>,
        v2: bool,
        unified: Option<PathBuf>,
        cgroup_root: &str,
        pods_pids_limit: i64,
        systemd: Option<systemd::Systemd>,
        page_sizes: &[u64],
    ) -> Result<Self, CgroupError> {
        if hierarchies.is_empty() {
            return Err(CgroupError::NoHierarchy);
        }
        if !cgroup_root.starts_with('/') {
            return Err(CgroupError::BadRoot(cgroup_root.to_owned()));
        }
        let kubepods = format!("{}/kubepods", cgroup_root.trim_end_matches('/'));
        let hugetlb = hierarchies.iter().any(|h| Self::has(h, "hugetlb"));
        Ok(Self {
            page_sizes: if hugetlb { page_sizes.to_vec() } else { Vec::new() },
            hierarchies,
            v2,
            unified,
            kubepods,
            pids_limit: pods_pids_limit,
            burstable: Mutex::new(HashMap::new()),
            systemd,
        })
    }

    /// The systemd driver's tree: `kubepods.slice` and the QoS slices, started in order (each one's parent
    /// first).
    async fn create_tree(self: &Arc<Self>) -> Result<(), CgroupError> {
        self.apply(&self.kubepods.clone(), Vec::new(), true).await?;
        self.apply(&format!("{}/burstable", self.kubepods), Vec::new(), true)
            .await?;
        let besteffort = vec![("cpu.shares", MIN_SHARES.to_string())];
        self.apply(&format!("{}/besteffort", self.kubepods), besteffort, true)
            .await?;
        for class in ["/burstable", "/besteffort"] {
            let name = format!("{}{class}", self.kubepods);
            self.apply_hugetlb(name, &BTreeMap::new(), HUGETLB_UNBOUNDED)
                .await?;
        }
        self.update_burstable().await
    }

    /// Makes `cgroup` (when `create`: with the systemd driver, starts its slice with the settings as its
    /// properties first; then makes its directories where they are missing, with their controllers) or updates
    /// its slice's properties, then writes the settings to its files.
    async fn apply(
        self: &Arc<Self>,
        cgroup: &str,
        settings: Vec<(&'static str, String)>,
        create: bool,
    ) -> Result<(), CgroupError> {
        if let Some(sd) = &self.systemd {
            let expanded = self.fs_name(cgroup);
            let (unit, parent) = systemd::unit_and_parent(&expanded);
            let limits = systemd::limit_properties(&settings, self.v2);
            if create {
                let dir = self.dir(&self.hierarchies[0], cgroup);
                sd.start_slice(&unit, &parent, &limits, &dir).await?;
            } else {
                sd.set_limits(&unit, &limits).await?;
            }
        }
        let this = self.clone();
        let cgroup = cgroup.to_owned();
        blocking(move || {
            if create {
                this.create(&cgroup)?;
            }
            for (file, value) in &settings {
                this.write(&cgroup, file, value)?;
            }
            Ok(())
        })
        .await
    }

    /// `<cgroupRoot>/kubepods` as it is in the hierarchy (`/kubepods.slice` with the systemd driver).
    pub fn kubepods(&self) -> String {
        self.fs_name(&self.kubepods)
    }

    /// Where the cgroup named `cgroup` (its cgroupfs name) is in the hierarchy: the name itself with cgroupfs,
    /// the path of its slice with systemd.
    pub fn fs_name(&self, cgroup: &str) -> String {
        if self.systemd.is_some() {
            systemd::expand(cgroup)
        } else {
            cgroup.to_owned()
        }
    }

    fn dir(&self, h: &Hierarchy, cgroup: &str) -> PathBuf {
        h.dir.join(self.fs_name(cgroup).trim_start_matches('/'))
    }

    fn has(h: &Hierarchy, controller: &str) -> bool {
        h.controllers.iter().any(|c| c == controller)
    }
}

async fn blocking(f: impl FnOnce() -> Result<(), CgroupError> + Send + 'static) -> Result<(), CgroupError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(CgroupError::Io {
            path: PathBuf::new(),
            source: std::io::Error::other(e.to_string()),
        })
    })
}

#[cfg(test)]
mod tests;
