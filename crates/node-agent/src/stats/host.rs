//! Node figures read from this machine (real mode): memory from the root memory cgroup (cgroup v1), the root
//! cgroup's `memory.stat` (cgroup v2) or `/proc/meminfo`, filesystems by `statvfs`, processes from `/proc`; and,
//! on a cgroup v2 host with the pods' cgroups, the figures of a pod the runtime gives none for from its cgroup
//! ([`super::cgroup`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::cgroup::{CgroupReader, PodCgroupUsage};
use super::{FsStats, HostStats};
use crate::pods::runtime::cgroups::QosCgroups;

/// This machine, for an agent whose root directory is `root_dir`.
#[derive(Debug, Clone)]
pub struct RealHost {
    root_dir: PathBuf,
    /// The pods' cgroups (`cgroupsPerQOS`), where pod figures can be read from.
    pod_cgroups: Option<Arc<QosCgroups>>,
    reader: Arc<CgroupReader>,
}

impl RealHost {
    /// Reads figures of this machine; the node filesystem is the one holding `root_dir`.
    pub fn new(root_dir: impl Into<PathBuf>) -> Self {
        Self {
            root_dir: root_dir.into(),
            pod_cgroups: None,
            reader: Arc::default(),
        }
    }

    /// Reads the figures of pods the runtime gives none for from their cgroups in `cgroups` (cgroup v2 only).
    pub fn with_pod_cgroups(mut self, cgroups: Option<Arc<QosCgroups>>) -> Self {
        self.pod_cgroups = cgroups;
        self
    }
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The value of `key` (first field after it) in a `key value` / `key: value kB` file.
fn field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut parts = l.split_whitespace();
        let k = parts.next()?.trim_end_matches(':');
        (k == key).then(|| parts.next()?.parse().ok()).flatten()
    })
}

/// Working set of the root memory cgroup (usage minus inactive file pages), as the kubelet observes
/// `memory.available`; `None` where there is no such cgroup (cgroup v2: see [`cgroup_v2_working_set`]).
fn cgroup_v1_working_set() -> Option<u64> {
    let usage: u64 = read("/sys/fs/cgroup/memory/memory.usage_in_bytes")?
        .trim()
        .parse()
        .ok()?;
    let stat = read("/sys/fs/cgroup/memory/memory.stat")?;
    let inactive = field(&stat, "total_inactive_file").unwrap_or(0);
    Some(usage.saturating_sub(inactive))
}

/// Working set of the whole machine on a cgroup v2 host, from the root cgroup's `memory.stat` (the root has no
/// `memory.current`): its usage taken as anonymous plus file pages, less the inactive file pages, as the
/// kubelet's stats provider reckons the root cgroup. `None` where `/sys/fs/cgroup` is not the unified hierarchy.
fn cgroup_v2_working_set() -> Option<u64> {
    read("/sys/fs/cgroup/cgroup.controllers")?;
    v2_root_working_set(&read("/sys/fs/cgroup/memory.stat")?)
}

/// [`cgroup_v2_working_set`] of a root `memory.stat` text.
fn v2_root_working_set(stat: &str) -> Option<u64> {
    let usage = field(stat, "anon")? + field(stat, "file")?;
    Some(usage.saturating_sub(field(stat, "inactive_file").unwrap_or(0)))
}

/// `MemTotal - MemAvailable`, bytes.
fn meminfo_working_set() -> Option<u64> {
    let text = read("/proc/meminfo")?;
    let total = field(&text, "MemTotal")?;
    let available = field(&text, "MemAvailable")?;
    Some(total.saturating_sub(available) * 1024)
}

/// `statvfs` of `path`, or of its nearest existing ancestor.
pub fn statvfs(path: &Path) -> Option<FsStats> {
    let mut probe = Some(path);
    while let Some(p) = probe {
        if p.exists() {
            let st = nix::sys::statvfs::statvfs(p).ok()?;
            let frag = st.fragment_size();
            return Some(FsStats {
                capacity_bytes: st.blocks().saturating_mul(frag),
                available_bytes: st.blocks_available().saturating_mul(frag),
                inodes: Some(st.files()),
                inodes_free: Some(st.files_free()),
            });
        }
        probe = p.parent();
    }
    None
}

impl HostStats for RealHost {
    fn memory_working_set(&self) -> Option<u64> {
        cgroup_v1_working_set()
            .or_else(cgroup_v2_working_set)
            .or_else(meminfo_working_set)
    }

    fn node_fs(&self) -> Option<FsStats> {
        statvfs(&self.root_dir)
    }

    fn fs_at(&self, path: &str) -> Option<FsStats> {
        statvfs(Path::new(path))
    }

    fn pids(&self) -> Option<(u64, u64)> {
        let max: u64 = read("/proc/sys/kernel/pid_max")?.trim().parse().ok()?;
        // the fourth field of loadavg is running/total scheduling entities
        let loadavg = read("/proc/loadavg")?;
        let total = loadavg
            .split_whitespace()
            .nth(3)?
            .split('/')
            .nth(1)?
            .parse()
            .ok()?;
        Some((max, total))
    }

    fn pod_cgroup(&self, uid: &str, containers: &[(String, String)], now_ns: i64) -> Option<PodCgroupUsage> {
        let dir = self.pod_cgroups.as_ref()?.pod_dir_v2(uid)?;
        self.reader.pod(&dir, containers, now_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_of_proc_files() {
        let meminfo = "MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:    4000000 kB\n";
        assert_eq!(field(meminfo, "MemTotal"), Some(16_000_000));
        assert_eq!(field(meminfo, "MemAvailable"), Some(4_000_000));
        assert_eq!(field(meminfo, "Cached"), None);
        let stat = "cache 5\ntotal_inactive_file 4096\n";
        assert_eq!(field(stat, "total_inactive_file"), Some(4096));
    }

    #[test]
    fn the_v2_root_working_set_leaves_out_inactive_file_pages() {
        let stat = "anon 1000\nfile 500\nkernel 7\nactive_file 300\ninactive_file 200\n";
        assert_eq!(v2_root_working_set(stat), Some(1300));
        assert_eq!(
            v2_root_working_set("file 5\n"),
            None,
            "no anon: not a memory.stat"
        );
    }

    #[test]
    fn this_machine_is_readable() {
        let host = RealHost::new("/nonexistent/agent/root");
        let fs = host.node_fs().expect("statvfs of an ancestor");
        assert!(fs.capacity_bytes >= fs.available_bytes && fs.capacity_bytes > 0);
        let ws = host.memory_working_set().expect("memory working set");
        assert!(ws > 0);
        let (max, running) = host.pids().expect("pids");
        assert!(max >= running && running > 0);
    }
}
