//! Pod and container figures read from their cgroup v2 directories, for the pods the runtime gives no figures
//! for: containerd looks for a sandbox's cgroup at the path it was handed as `cgroup_parent`, which under the
//! systemd cgroup driver is a slice name (`kubepods-burstable-pod<uid>.slice`), not a path, so its
//! `PodSandboxStats` fails there.
//!
//! The figures are reckoned as the kubelet's cAdvisor reckons them on cgroup v2: the working set is
//! `memory.current` less `memory.stat`'s `inactive_file`, the resident set its `anon`, cumulative CPU
//! `cpu.stat`'s `usage_usec`, processes `pids.current`; the CPU rate comes from the previous sample of the same
//! cgroup ([`CgroupReader`] keeps them).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// What one cgroup uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    /// Sample time, Unix nanoseconds.
    pub time_ns: i64,
    /// CPU now, nanocores (0 at a cgroup's first sample).
    pub nano_cores: u64,
    /// Cumulative CPU, core-nanoseconds.
    pub core_nanos: u64,
    /// Memory working set, bytes.
    pub working_set: u64,
    /// Memory usage, bytes.
    pub memory_usage: u64,
    /// Resident set (anonymous memory), bytes.
    pub rss: u64,
    /// Processes (`pids.current`).
    pub processes: u64,
}

/// A pod's figures from its cgroup, and its containers' by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodCgroupUsage {
    /// The pod's cgroup.
    pub pod: CgroupUsage,
    /// Its containers' cgroups, by container name.
    pub containers: Vec<(String, CgroupUsage)>,
}

/// How long a cgroup's last sample is kept for its CPU rate: samples of cgroups not read for this long go.
const SAMPLE_TTL_NS: i64 = 600 * 1_000_000_000;

/// Reads cgroup v2 figures, remembering each cgroup's last CPU sample for its rate.
#[derive(Debug, Default)]
pub struct CgroupReader {
    last: Mutex<HashMap<PathBuf, (i64, u64)>>,
}

/// The value of `key` in a flat-keyed cgroup file (`key value` lines).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

fn single(dir: &Path, file: &str) -> Option<u64> {
    std::fs::read_to_string(dir.join(file)).ok()?.trim().parse().ok()
}

/// The figures of the files' texts, sampled at `time_ns`, without the CPU rate.
pub fn usage_of(
    memory_current: u64,
    memory_stat: &str,
    cpu_stat: &str,
    pids: u64,
    time_ns: i64,
) -> CgroupUsage {
    let inactive = keyed(memory_stat, "inactive_file").unwrap_or(0);
    CgroupUsage {
        time_ns,
        nano_cores: 0,
        core_nanos: keyed(cpu_stat, "usage_usec").unwrap_or(0).saturating_mul(1000),
        working_set: memory_current.saturating_sub(inactive),
        memory_usage: memory_current,
        rss: keyed(memory_stat, "anon").unwrap_or(0),
        processes: pids,
    }
}

/// CPU nanocores between two samples `(time_ns, core_nanos)` (0 when time did not advance or the counter went back).
pub fn rate(before: (i64, u64), now: (i64, u64)) -> u64 {
    let elapsed = u128::try_from(now.0.saturating_sub(before.0)).unwrap_or(0);
    if elapsed == 0 || now.1 < before.1 {
        return 0;
    }
    let used = u128::from(now.1 - before.1);
    u64::try_from(used * 1_000_000_000 / elapsed).unwrap_or(u64::MAX)
}

impl CgroupReader {
    /// The figures of the cgroup at `dir` now; `None` where it is not a cgroup v2 directory with the memory
    /// controller.
    pub fn read(&self, dir: &Path, time_ns: i64) -> Option<CgroupUsage> {
        let memory_current = single(dir, "memory.current")?;
        let memory_stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
        let cpu_stat = std::fs::read_to_string(dir.join("cpu.stat")).unwrap_or_default();
        let pids = single(dir, "pids.current").unwrap_or(0);
        let mut usage = usage_of(memory_current, &memory_stat, &cpu_stat, pids, time_ns);
        if let Ok(mut last) = self.last.lock() {
            let now = (time_ns, usage.core_nanos);
            if let Some(before) = last.insert(dir.to_path_buf(), now) {
                usage.nano_cores = rate(before, now);
            }
            last.retain(|_, (t, _)| time_ns.saturating_sub(*t) < SAMPLE_TTL_NS);
        }
        Some(usage)
    }

    /// The pod whose cgroup is `pod_dir` and its containers `(name, id)`: each container's cgroup is the child
    /// of the pod's named by its ID (`<id>` with the cgroupfs driver, `cri-containerd-<id>.scope` and the like
    /// with the systemd driver). A container without a cgroup there is left out.
    pub fn pod(
        &self,
        pod_dir: &Path,
        containers: &[(String, String)],
        time_ns: i64,
    ) -> Option<PodCgroupUsage> {
        let pod = self.read(pod_dir, time_ns)?;
        let children: Vec<(String, PathBuf)> = std::fs::read_dir(pod_dir)
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                    .collect()
            })
            .unwrap_or_default();
        let containers = containers
            .iter()
            .filter_map(|(name, id)| {
                let (_, dir) = children.iter().find(|(child, _)| names_container(child, id))?;
                Some((name.clone(), self.read(dir, time_ns)?))
            })
            .collect();
        Some(PodCgroupUsage { pod, containers })
    }
}

/// Whether the cgroup directory `child` is the one of container `id`: named by the ID alone, or by the ID
/// between a runtime's prefix and a unit suffix (`cri-containerd-<id>.scope`, `crio-<id>.scope`).
pub fn names_container(child: &str, id: &str) -> bool {
    if id.is_empty() {
        return false;
    }
    let stem = child.strip_suffix(".scope").unwrap_or(child);
    stem == id || stem.strip_suffix(id).is_some_and(|prefix| prefix.ends_with('-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMORY_STAT: &str = "anon 4194304\nfile 12582912\nkernel 1048576\nshmem 8388608\nactive_file 1048576\n\
                               inactive_file 3145728\nslab 524288\n";
    const CPU_STAT: &str = "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\nnr_periods 0\n";

    #[test]
    fn the_working_set_is_usage_less_inactive_file_pages() {
        let u = usage_of(20 << 20, MEMORY_STAT, CPU_STAT, 3, 7);
        assert_eq!(
            u,
            CgroupUsage {
                time_ns: 7,
                nano_cores: 0,
                core_nanos: 2_500_000_000,
                working_set: (20 << 20) - 3_145_728,
                memory_usage: 20 << 20,
                rss: 4_194_304,
                processes: 3,
            }
        );
        // inactive file pages above the usage (the two files are not read at one instant): none left
        assert_eq!(usage_of(1 << 20, MEMORY_STAT, "", 0, 0).working_set, 0);
    }

    #[test]
    fn the_cpu_rate_is_the_counter_over_the_time_between_samples() {
        // half a core-second over two seconds: a quarter of a core
        assert_eq!(
            rate((1_000_000_000, 0), (3_000_000_000, 500_000_000)),
            250_000_000
        );
        assert_eq!(rate((5, 10), (5, 20)), 0, "no time passed");
        assert_eq!(
            rate((1, 20), (2, 10)),
            0,
            "a counter that went back (a new cgroup of the same name)"
        );
    }

    #[test]
    fn a_containers_cgroup_is_found_by_its_id_with_either_driver() {
        let id = "4f1c0ad1e2";
        assert!(names_container(id, id), "cgroupfs: the ID alone");
        assert!(
            names_container(&format!("cri-containerd-{id}.scope"), id),
            "containerd under systemd"
        );
        assert!(
            names_container(&format!("crio-{id}.scope"), id),
            "CRI-O under systemd"
        );
        assert!(
            !names_container(&format!("cri-containerd-x{id}.scope"), id),
            "another ID ending alike"
        );
        assert!(!names_container("cri-containerd-.scope", ""));
    }

    #[test]
    fn a_pod_and_its_containers_are_read_from_their_directories_and_rated_on_the_next_read() {
        let root = tempfile::tempdir().expect("tempdir");
        let pod = root.path().join("kubepods-besteffort-pod1234.slice");
        let id = "abc123";
        let container = pod.join(format!("cri-containerd-{id}.scope"));
        std::fs::create_dir_all(&container).expect("dirs");
        std::fs::create_dir_all(pod.join("cri-containerd-other.scope")).expect("dirs");
        let write = |dir: &Path, current: u64, usec: u64| {
            std::fs::write(dir.join("memory.current"), format!("{current}\n")).expect("write");
            std::fs::write(dir.join("memory.stat"), MEMORY_STAT).expect("write");
            std::fs::write(dir.join("cpu.stat"), format!("usage_usec {usec}\n")).expect("write");
            std::fs::write(dir.join("pids.current"), "2\n").expect("write");
        };
        write(&pod, 30 << 20, 1_000_000);
        write(&container, 25 << 20, 900_000);
        let reader = CgroupReader::default();
        let containers = vec![
            ("hog".to_owned(), id.to_owned()),
            ("gone".to_owned(), "def456".to_owned()),
        ];
        let first = reader
            .pod(&pod, &containers, 1_000_000_000)
            .expect("the pod's cgroup");
        assert_eq!(first.pod.working_set, (30 << 20) - 3_145_728);
        assert_eq!(first.pod.nano_cores, 0, "no rate at the first sample");
        assert_eq!(
            first.containers.len(),
            1,
            "a container without a cgroup is left out: {first:?}"
        );
        assert_eq!(first.containers[0].0, "hog");
        assert_eq!(first.containers[0].1.core_nanos, 900_000_000);
        // a second later the pod used another half core-second
        write(&pod, 30 << 20, 1_500_000);
        let second = reader
            .pod(&pod, &containers, 2_000_000_000)
            .expect("the pod's cgroup");
        assert_eq!(second.pod.nano_cores, 500_000_000);
        assert_eq!(second.containers[0].1.nano_cores, 0, "the container used nothing");
        assert!(reader.pod(&root.path().join("missing"), &containers, 0).is_none());
    }
}
