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
//! node-agent makes nothing itself. Pod cgroups of pods the node no longer
//! has are found and removed by the orphan sweep ([`QosCgroups::pod_uids`], [`QosCgroups::remove_orphan`]).
//!
//! With the systemd driver (`cgroupDriver: systemd`, [`QosCgroups::start_systemd`]) the same tree is made of
//! slices systemd creates as transient units over D-Bus ([`systemd`]): `kubepods.slice`,
//! `kubepods-burstable.slice`, `kubepods-besteffort.slice`, `kubepods-burstable-pod<uid>.slice`, their limits
//! given as unit properties and written to their files as well; the runtime is handed the pod's slice name as
//! its `cgroup_parent`, the form a runtime using systemd for its cgroups (containerd's `SystemdCgroup = true`)
//! expects. Internally every cgroup keeps its cgroupfs name (`/kubepods/burstable/pod<uid>`); [`QosCgroups::fs_name`]
//! maps it to the path it has in the hierarchy.
//!
//! Where the hugetlb controller is there (a v1 hierarchy holds it, or the unified hierarchy lists it), every
//! cgroup of the tree is given a limit for each huge page size the machine has (`/sys/kernel/mm/hugepages`), as
//! the kubelet gives them ([`hugetlb_settings`]): a pod its huge pages requests and 0 for the sizes it does not
//! ask for, the QoS cgroups unbounded, `kubepods` the node's huge pages (less the reservations with
//! `pods` enforced); in `hugetlb.<size>.limit_in_bytes` on v1 and `hugetlb.<size>.max` on v2, and in the
//! reservation's `rsvd` file beside it where the kernel has one.
//!
//! A hollow node has no `QosCgroups`: nothing of the machine's cgroups is touched.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::pods::model::resources::QosClass;
use crate::pods::model::spec::DesiredPod;

mod leftovers;
pub mod systemd;

/// The kernel's smallest `cpu.shares`.
const MIN_SHARES: i64 = 2;
/// The kernel's largest `cpu.shares`.
const MAX_SHARES: i64 = 262_144;
/// The cgroup v2 controllers the kubelet enables for the pods' cgroups, where the kernel has them.
pub const V2_CONTROLLERS: [&str; 5] = ["cpu", "cpuset", "memory", "hugetlb", "pids"];
/// The huge pages limit of the QoS cgroups: no bound, as the kubelet writes it.
pub const HUGETLB_UNBOUNDED: u64 = 1 << 62;
/// The CFS period the kubelet uses, in microseconds.
const CFS_PERIOD_US: i64 = 100_000;
/// The smallest CFS quota, in microseconds.
const MIN_QUOTA_US: i64 = 1000;

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

/// `cpu.shares` for `milli` millicores.
pub fn shares(milli: i64) -> i64 {
    if milli <= 0 {
        return MIN_SHARES;
    }
    (milli * 1024 / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// `cpu.weight` (cgroup v2) for `cpu.shares`, mapping the shares' range `[2, 262144]` onto `[1, 10000]` as
/// the kubelet does.
pub fn weight(shares: i64) -> i64 {
    if shares >= MAX_SHARES {
        return 10_000;
    }
    1 + (shares.max(MIN_SHARES) - MIN_SHARES) * 9999 / (MAX_SHARES - MIN_SHARES)
}

/// The cgroup v2 file and value that stand for the v1 setting `(file, value)`: `cpu.shares` becomes
/// `cpu.weight`, `memory.limit_in_bytes` `memory.max`, `pids.max` stays; the CFS period and quota become one
/// `cpu.max` (`quota period`), written when the quota comes. `None`: nothing to write for this one.
pub fn v2_setting(file: &str, value: &str) -> Option<(&'static str, String)> {
    match file {
        "cpu.shares" => Some((
            "cpu.weight",
            weight(value.parse().unwrap_or(MIN_SHARES)).to_string(),
        )),
        "cpu.cfs_period_us" => None,
        "cpu.cfs_quota_us" => Some(("cpu.max", format!("{value} {CFS_PERIOD_US}"))),
        "memory.limit_in_bytes" => Some(("memory.max", value.to_owned())),
        "pids.max" => Some(("pids.max", value.to_owned())),
        _ => None,
    }
}

/// The huge page sizes of this machine in bytes, smallest first, from `/sys/kernel/mm/hugepages` (`hugepages-2048kB`):
/// every size the kernel has, whether pages of it are reserved or not. Read once: the kernel's sizes do not change
/// while it runs.
pub fn host_page_sizes() -> &'static [u64] {
    static SIZES: std::sync::OnceLock<Vec<u64>> = std::sync::OnceLock::new();
    SIZES.get_or_init(read_page_sizes)
}

fn read_page_sizes() -> Vec<u64> {
    let Ok(entries) = std::fs::read_dir("/sys/kernel/mm/hugepages") else {
        return Vec::new();
    };
    let mut sizes: Vec<u64> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let kb: u64 = name
                .strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()?;
            Some(kb * 1024)
        })
        .collect();
    sizes.sort_unstable();
    sizes
}

/// A huge page size as the hugetlb controller's files and the runtime name it (`2MB`, `1GB`, `64KB`).
pub fn page_size_name(size: u64) -> String {
    let kb = size / 1024;
    if kb >= 1 << 20 {
        format!("{}GB", kb >> 20)
    } else if kb >= 1 << 10 {
        format!("{}MB", kb >> 10)
    } else {
        format!("{kb}KB")
    }
}

/// The hugetlb limits a cgroup gets, as the kubelet sets them: for every size in `page_sizes`, the bytes `limits`
/// names for it, else `unnamed`; as (size name, bytes).
pub fn hugetlb_settings(page_sizes: &[u64], limits: &BTreeMap<u64, u64>, unnamed: u64) -> Vec<(String, u64)> {
    page_sizes
        .iter()
        .map(|size| {
            (
                page_size_name(*size),
                limits.get(size).copied().unwrap_or(unnamed),
            )
        })
        .collect()
}

/// `cpu.cfs_quota_us` for a limit of `milli` millicores over the 100 ms period.
fn quota(milli: i64) -> i64 {
    (milli * CFS_PERIOD_US / 1000).max(MIN_QUOTA_US)
}

/// What a pod cgroup is given: `(file, value)` pairs, written in order.
pub fn pod_settings(pod: &DesiredPod, pids_limit: i64) -> Vec<(&'static str, String)> {
    let limits = pod.limits();
    let mut out = Vec::new();
    match pod.qos {
        QosClass::BestEffort => out.push(("cpu.shares", MIN_SHARES.to_string())),
        QosClass::Guaranteed | QosClass::Burstable => {
            out.push(("cpu.shares", shares(pod.requests().cpu_milli).to_string()));
            if let Some(cpu) = limits.cpu_milli.filter(|m| *m > 0) {
                out.push(("cpu.cfs_period_us", CFS_PERIOD_US.to_string()));
                out.push(("cpu.cfs_quota_us", quota(cpu).to_string()));
            }
            if let Some(memory) = limits.memory.filter(|m| *m > 0) {
                out.push(("memory.limit_in_bytes", memory.to_string()));
            }
        }
    }
    if pids_limit > 0 {
        out.push(("pids.max", pids_limit.to_string()));
    }
    out
}

/// What a node-level cgroup is limited to (node allocatable enforcement): `None` leaves that limit as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeLimits {
    /// Millicores, given as `cpu.shares` (a weight, as the kubelet gives it, never a quota).
    pub cpu_milli: Option<i64>,
    /// Bytes of memory.
    pub memory: Option<i64>,
    /// Processes.
    pub pids: Option<i64>,
}

impl NodeLimits {
    /// The settings written for these limits: all of them, or with `compressible_only` the cpu weight alone.
    pub fn settings(&self, compressible_only: bool) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(cpu) = self.cpu_milli {
            out.push(("cpu.shares", shares(cpu).to_string()));
        }
        if compressible_only {
            return out;
        }
        if let Some(memory) = self.memory {
            out.push(("memory.limit_in_bytes", memory.to_string()));
        }
        if let Some(pids) = self.pids {
            out.push(("pids.max", pids.to_string()));
        }
        out
    }
}

/// One mounted v1 hierarchy: its mount point and the controllers it holds (`cpu`, `memory`, `name=systemd`...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    /// Where it is mounted.
    pub dir: PathBuf,
    /// Its controllers.
    pub controllers: Vec<String>,
}

/// The cgroup v2 hierarchy mounted beside the v1 ones on a hybrid host (`/sys/fs/cgroup/unified`), in a
/// `/proc/self/mountinfo` text. The runtime (runc) makes every container's cgroup path there too.
pub fn unified_hierarchy(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        (right.split(' ').next() == Some("cgroup2"))
            .then(|| PathBuf::from(left.split(' ').nth(4).unwrap_or("/")))
    })
}

/// The unified hierarchy of a cgroup v2 host: `/sys/fs/cgroup` mounted as `cgroup2` and no v1 hierarchy beside it,
/// in a `/proc/self/mountinfo` text.
pub fn v2_only(mountinfo: &str) -> Option<PathBuf> {
    if !v1_hierarchies(mountinfo).is_empty() {
        return None;
    }
    unified_hierarchy(mountinfo).filter(|dir| dir == Path::new("/sys/fs/cgroup"))
}

/// The v1 hierarchies in a `/proc/self/mountinfo` text.
pub fn v1_hierarchies(mountinfo: &str) -> Vec<Hierarchy> {
    let mut out: Vec<Hierarchy> = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mut right = right.split(' ');
        if right.next() != Some("cgroup") {
            continue;
        }
        let options = right.nth(1).unwrap_or_default();
        let Some(dir) = left.split(' ').nth(4) else {
            continue;
        };
        let controllers: Vec<String> = options
            .split(',')
            .filter(|o| {
                !matches!(
                    *o,
                    "rw" | "ro" | "xattr" | "noprefix" | "clone_children" | "cpuset_v2_mode"
                ) && !o.starts_with("release_agent=")
            })
            .map(str::to_owned)
            .collect();
        if controllers.is_empty() || out.iter().any(|h| h.controllers == controllers) {
            continue;
        }
        out.push(Hierarchy {
            dir: PathBuf::from(dir),
            controllers,
        });
    }
    out
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

    /// The pod's cgroup as the runtime is handed it (its `cgroup_parent`): `…/kubepods[/burstable|/besteffort]/pod<uid>`
    /// with cgroupfs, the slice `kubepods[-burstable|-besteffort]-pod<uid>.slice` with systemd.
    pub fn pod_path(&self, qos: QosClass, uid: &str) -> String {
        let name = self.pod_name(qos, uid);
        if self.systemd.is_some() {
            systemd::unit_and_parent(&systemd::expand(&name)).0
        } else {
            name
        }
    }

    /// The directory of pod `uid`'s cgroup in the unified hierarchy of a cgroup v2 host, whatever its QoS class,
    /// where it exists (the pod's figures are read there when the runtime gives none). Blocking (a stat or
    /// three).
    pub fn pod_dir_v2(&self, uid: &str) -> Option<PathBuf> {
        if !self.v2 {
            return None;
        }
        let h = self.hierarchies.first()?;
        [QosClass::Guaranteed, QosClass::Burstable, QosClass::BestEffort]
            .into_iter()
            .map(|qos| self.dir(h, &self.pod_name(qos, uid)))
            .find(|dir| dir.is_dir())
    }

    /// The pod's cgroup name: `…/kubepods[/burstable|/besteffort]/pod<uid>`.
    fn pod_name(&self, qos: QosClass, uid: &str) -> String {
        match qos {
            QosClass::Guaranteed => format!("{}/pod{uid}", self.kubepods),
            QosClass::Burstable => format!("{}/burstable/pod{uid}", self.kubepods),
            QosClass::BestEffort => format!("{}/besteffort/pod{uid}", self.kubepods),
        }
    }

    fn dir(&self, h: &Hierarchy, cgroup: &str) -> PathBuf {
        h.dir.join(self.fs_name(cgroup).trim_start_matches('/'))
    }

    fn has(h: &Hierarchy, controller: &str) -> bool {
        h.controllers.iter().any(|c| c == controller)
    }

    /// Creates `cgroup` in every hierarchy (a new cpuset cgroup gets its parent's cpus and memory nodes). In the
    /// unified hierarchy each level down to it is made with the controllers enabled in its parent.
    fn create(&self, cgroup: &str) -> Result<(), CgroupError> {
        if self.v2 {
            let h = &self.hierarchies[0];
            return create_v2(&h.dir, &self.dir(h, cgroup), &h.controllers);
        }
        for h in &self.hierarchies {
            let dir = self.dir(h, cgroup);
            if dir.is_dir() {
                continue;
            }
            std::fs::create_dir_all(&dir).map_err(io(&dir))?;
            if Self::has(h, "cpuset") {
                copy_cpuset_down(&h.dir, &dir)?;
            }
        }
        Ok(())
    }

    /// Writes `value` to `file` of `cgroup` in the hierarchy holding the file's controller (if mounted).
    /// In the unified hierarchy the setting is written as its v2 file ([`v2_setting`]).
    fn write(&self, cgroup: &str, file: &str, value: &str) -> Result<(), CgroupError> {
        let v2;
        let (file, value) = if self.v2 {
            let Some(setting) = v2_setting(file, value) else {
                return Ok(());
            };
            v2 = setting;
            (v2.0, v2.1.as_str())
        } else {
            (file, value)
        };
        let controller = file.split('.').next().unwrap_or_default();
        for h in self.hierarchies.iter().filter(|h| Self::has(h, controller)) {
            let path = self.dir(h, cgroup).join(file);
            std::fs::write(&path, value).map_err(io(&path))?;
        }
        Ok(())
    }

    /// Limits `kubepods` (node allocatable enforcement; the node's capacity when only the weight is to be
    /// right), its huge pages to `hugepages` (bytes by page size; 0 for a size not named).
    pub async fn limit_kubepods(
        self: &Arc<Self>,
        limits: &NodeLimits,
        hugepages: &BTreeMap<u64, u64>,
    ) -> Result<(), CgroupError> {
        self.apply(&self.kubepods.clone(), limits.settings(false), false)
            .await?;
        self.apply_hugetlb(self.kubepods.clone(), hugepages, 0).await
    }

    /// [`hugetlb_settings`] for this machine's page sizes (none when the hugetlb controller is not there).
    fn hugetlb(&self, limits: &BTreeMap<u64, u64>, unnamed: u64) -> Vec<(String, u64)> {
        hugetlb_settings(&self.page_sizes, limits, unnamed)
    }

    /// Writes the huge pages limits of `cgroup`: `limits` for the sizes it names, `unnamed` for the others.
    async fn apply_hugetlb(
        self: &Arc<Self>,
        cgroup: String,
        limits: &BTreeMap<u64, u64>,
        unnamed: u64,
    ) -> Result<(), CgroupError> {
        let settings = self.hugetlb(limits, unnamed);
        if settings.is_empty() {
            return Ok(());
        }
        let this = self.clone();
        blocking(move || this.write_hugetlb(&cgroup, &settings)).await
    }

    /// Writes `settings` (size name, bytes) to the hugetlb files of `cgroup`: `hugetlb.<size>.limit_in_bytes` on
    /// v1, `hugetlb.<size>.max` on v2, and the same value to the `rsvd` file beside it where the kernel has one.
    fn write_hugetlb(&self, cgroup: &str, settings: &[(String, u64)]) -> Result<(), CgroupError> {
        let suffix = if self.v2 { "max" } else { "limit_in_bytes" };
        for h in self.hierarchies.iter().filter(|h| Self::has(h, "hugetlb")) {
            let dir = self.dir(h, cgroup);
            for (size, bytes) in settings {
                let path = dir.join(format!("hugetlb.{size}.{suffix}"));
                std::fs::write(&path, bytes.to_string()).map_err(io(&path))?;
                let rsvd = dir.join(format!("hugetlb.{size}.rsvd.{suffix}"));
                if rsvd.exists() {
                    std::fs::write(&rsvd, bytes.to_string()).map_err(io(&rsvd))?;
                }
            }
        }
        Ok(())
    }

    /// Limits the existing cgroup at `path` (as in the hierarchy, e.g. `/system.slice` with the systemd driver)
    /// to `limits`, or with `compressible_only` its cpu weight alone, and its huge pages to `hugepages` (0 for the
    /// sizes not named, whatever `compressible_only` says, as the kubelet writes them): the enforcement of
    /// `kube-reserved` / `system-reserved` on their cgroups. A cgroup that does not exist is an error, as with the kubelet.
    pub async fn limit_existing(
        self: &Arc<Self>,
        path: &str,
        limits: &NodeLimits,
        compressible_only: bool,
        hugepages: &BTreeMap<u64, u64>,
    ) -> Result<(), CgroupError> {
        let name = if self.systemd.is_some() {
            systemd::cgroup_name(path)
        } else {
            path.to_owned()
        };
        if !self.hierarchies.iter().all(|h| self.dir(h, &name).is_dir()) {
            let dir = self.dir(&self.hierarchies[0], &name);
            return Err(CgroupError::Io {
                path: dir,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "the cgroup does not exist"),
            });
        }
        self.apply(&name, limits.settings(compressible_only), false)
            .await?;
        self.apply_hugetlb(name, hugepages, 0).await
    }

    /// The burstable cgroup's `cpu.shares`: from the sum of its pods' cpu requests.
    fn burstable_settings(&self) -> Vec<(&'static str, String)> {
        let sum: i64 = self
            .burstable
            .lock()
            .map(|m| m.values().sum())
            .unwrap_or_default();
        vec![("cpu.shares", shares(sum).to_string())]
    }

    fn write_burstable(&self) -> Result<(), CgroupError> {
        for (file, value) in self.burstable_settings() {
            self.write(&format!("{}/burstable", self.kubepods), file, &value)?;
        }
        Ok(())
    }

    async fn update_burstable(self: &Arc<Self>) -> Result<(), CgroupError> {
        let settings = self.burstable_settings();
        self.apply(&format!("{}/burstable", self.kubepods), settings, false)
            .await
    }

    /// Makes sure `pod`'s cgroup exists with its limits (created once; an existing one is left as it is).
    pub async fn ensure(self: &Arc<Self>, pod: &DesiredPod) -> Result<(), CgroupError> {
        let changed = match self.burstable.lock() {
            Ok(mut m) if pod.qos == QosClass::Burstable => {
                m.insert(pod.uid.to_string(), pod.requests().cpu_milli) != Some(pod.requests().cpu_milli)
            }
            _ => false,
        };
        if changed {
            self.update_burstable().await?;
        }
        let name = self.pod_name(pod.qos, &pod.uid);
        // a stat per hierarchy: cheap enough not to leave the async thread
        if self.hierarchies.iter().all(|h| self.dir(h, &name).is_dir()) {
            return Ok(());
        }
        self.apply(&name, pod_settings(pod, self.pids_limit), true)
            .await?;
        self.apply_hugetlb(name, &pod.hugepages(), 0).await
    }

    /// Writes `pod`'s limits again into its existing cgroup (an in-place resize changed them), and the
    /// burstable cgroup's shares.
    pub async fn resize(self: &Arc<Self>, pod: &DesiredPod) -> Result<(), CgroupError> {
        let changed = match self.burstable.lock() {
            Ok(mut m) if pod.qos == QosClass::Burstable => {
                m.insert(pod.uid.to_string(), pod.requests().cpu_milli) != Some(pod.requests().cpu_milli)
            }
            _ => false,
        };
        if changed {
            self.update_burstable().await?;
        }
        let name = self.pod_name(pod.qos, &pod.uid);
        self.apply(&name, pod_settings(pod, self.pids_limit), false)
            .await?;
        self.apply_hugetlb(name, &pod.hugepages(), 0).await
    }

    /// Removes `pod`'s cgroup (and whatever the runtime left inside, processes killed: see [`leftovers`]) from
    /// every hierarchy — with systemd, stops its slice first; a cgroup whose processes do not go stays (logged).
    pub async fn remove(self: &Arc<Self>, pod: &DesiredPod) {
        let changed = self
            .burstable
            .lock()
            .map(|mut m| m.remove(&*pod.uid).is_some())
            .unwrap_or(false);
        let name = self.pod_name(pod.qos, &pod.uid);
        let mut result = self.remove_cgroup(name).await;
        if changed && result.is_ok() {
            result = self.update_burstable().await;
        }
        if let Err(error) = result {
            tracing::warn!(pod = %pod.display(), %error, "cannot remove the pod's cgroup");
        }
    }

    /// Stops the slice of `cgroup` (systemd driver) and removes its directories wherever they are.
    async fn remove_cgroup(self: &Arc<Self>, cgroup: String) -> Result<(), CgroupError> {
        if let Some(sd) = &self.systemd {
            let (unit, _) = systemd::unit_and_parent(&self.fs_name(&cgroup));
            sd.stop(&unit).await?;
        }
        let this = self.clone();
        blocking(move || this.remove_everywhere(&cgroup)).await
    }
}

impl QosCgroups {
    /// `cgroup`'s directory in every hierarchy: the v1 ones, and the v2 one of a hybrid host.
    fn everywhere(&self, cgroup: &str) -> Vec<PathBuf> {
        let name = self.fs_name(cgroup);
        let rel = name.trim_start_matches('/');
        self.hierarchies
            .iter()
            .map(|h| h.dir.as_path())
            .chain(self.unified.as_deref())
            .map(|mount| mount.join(rel))
            .collect()
    }

    /// Removes `cgroup` (and the cgroups below it) wherever it exists.
    fn remove_everywhere(&self, cgroup: &str) -> Result<(), CgroupError> {
        for dir in self.everywhere(cgroup) {
            if dir.is_dir() {
                leftovers::remove_killing_leftovers(
                    &dir,
                    remove_tree,
                    |e| matches!(e, CgroupError::Io { source, .. } if source.raw_os_error() == Some(nix::libc::EBUSY)),
                )?;
            }
        }
        Ok(())
    }

    /// The UIDs of the pods that have a cgroup under `kubepods` (in any QoS class, in any hierarchy), as the
    /// kubelet finds them for its orphan cleanup. Blocking.
    pub fn pod_uids(&self) -> Vec<String> {
        let mut uids = std::collections::BTreeSet::new();
        for class in ["", "/burstable", "/besteffort"] {
            for dir in self.everywhere(&format!("{}{class}", self.kubepods)) {
                let Ok(entries) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for entry in entries.flatten() {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let uid = if self.systemd.is_some() {
                        systemd::pod_uid(&name)
                    } else {
                        name.strip_prefix("pod").map(str::to_owned)
                    };
                    if let Some(uid) = uid
                        && entry.file_type().is_ok_and(|t| t.is_dir())
                    {
                        uids.insert(uid);
                    }
                }
            }
        }
        uids.into_iter().collect()
    }

    /// Removes the cgroup of pod `uid`, whatever its QoS class, from every hierarchy: for a pod the node no
    /// longer knows (deleted while the agent was down). Processes left inside are killed ([`leftovers`]); a
    /// cgroup whose processes do not go stays (the error says so; the next housekeeping tries again).
    pub async fn remove_orphan(self: &Arc<Self>, uid: &str) -> Result<(), CgroupError> {
        let known = self
            .burstable
            .lock()
            .map(|mut m| m.remove(uid).is_some())
            .unwrap_or(false);
        if known {
            self.update_burstable().await?;
        }
        for qos in [QosClass::Guaranteed, QosClass::Burstable, QosClass::BestEffort] {
            self.remove_cgroup(self.pod_name(qos, uid)).await?;
        }
        Ok(())
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

/// The unified hierarchy mounted at `mount`, with the controllers the kubelet uses ([`V2_CONTROLLERS`]) that its
/// `cgroup.controllers` lists.
fn v2_hierarchy(mount: &Path) -> Result<Hierarchy, CgroupError> {
    let file = mount.join("cgroup.controllers");
    let controllers = std::fs::read_to_string(&file).map_err(io(&file))?;
    Ok(Hierarchy {
        dir: mount.to_owned(),
        controllers: controllers
            .split_whitespace()
            .filter(|c| V2_CONTROLLERS.contains(c))
            .map(str::to_owned)
            .collect(),
    })
}

/// Creates `dir` and the cgroups between `mount` and it in the unified hierarchy mounted at `mount`, enabling
/// `controllers` (those the hierarchy has) in `cgroup.subtree_control` of each parent first, so that each level
/// gets the controllers' files and its children can have them too.
fn create_v2(mount: &Path, dir: &Path, controllers: &[String]) -> Result<(), CgroupError> {
    let mut chain: Vec<&Path> = dir
        .ancestors()
        .take_while(|p| p.starts_with(mount) && *p != mount)
        .collect();
    chain.reverse();
    for d in chain {
        let Some(parent) = d.parent() else { continue };
        enable_controllers(parent, controllers)?;
        if !d.is_dir() {
            std::fs::create_dir(d).map_err(io(d))?;
        }
    }
    Ok(())
}

/// Adds `controllers` to `dir`'s `cgroup.subtree_control` where they are not there yet.
fn enable_controllers(dir: &Path, controllers: &[String]) -> Result<(), CgroupError> {
    let file = dir.join("cgroup.subtree_control");
    let enabled = std::fs::read_to_string(&file).unwrap_or_default();
    let missing: Vec<String> = controllers
        .iter()
        .filter(|c| {
            !enabled
                .split_whitespace()
                .any(|e| e.trim_start_matches('+') == c.as_str())
        })
        .map(|c| format!("+{c}"))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    std::fs::write(&file, missing.join(" ")).map_err(io(&file))
}

/// Fills empty `cpuset.cpus` / `cpuset.mems` of `dir` and its parents below `mount` from the nearest ancestor
/// that has them (a cpuset cgroup without them takes no task).
fn copy_cpuset_down(mount: &Path, dir: &Path) -> Result<(), CgroupError> {
    let mut chain: Vec<&Path> = dir
        .ancestors()
        .take_while(|p| p.starts_with(mount) && *p != mount)
        .collect();
    chain.reverse();
    for d in chain {
        let Some(parent) = d.parent() else { continue };
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let own = d.join(file);
            let current = std::fs::read_to_string(&own).unwrap_or_default();
            if !current.trim().is_empty() {
                continue;
            }
            let Ok(inherited) = std::fs::read_to_string(parent.join(file)) else {
                continue;
            };
            std::fs::write(&own, inherited.trim()).map_err(io(&own))?;
        }
    }
    Ok(())
}

/// Removes the cgroup directory `dir` and the cgroups below it, deepest first (cgroupfs removes a directory with
/// `rmdir` only, its control files going with it).
fn remove_tree(dir: &Path) -> Result<(), CgroupError> {
    let entries = std::fs::read_dir(dir).map_err(io(dir))?;
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&entry.path())?;
        }
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        // a plain directory (tests, or a filesystem that is not cgroupfs): empty it first
        Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => {
            for entry in std::fs::read_dir(dir).map_err(io(dir))?.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_file()) {
                    std::fs::remove_file(entry.path()).map_err(io(&entry.path()))?;
                }
            }
            std::fs::remove_dir(dir).map_err(io(dir))
        }
        Err(e) => Err(io(dir)(e)),
    }
}

#[cfg(test)]
mod tests;
