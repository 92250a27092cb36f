//! Huge pages limits. Where the hugetlb controller is there (a v1 hierarchy holds it, or the unified hierarchy
//! lists it), every cgroup of the tree is given a limit for each huge page size the machine has
//! (`/sys/kernel/mm/hugepages`), as the kubelet gives them ([`hugetlb_settings`]): a pod its huge pages requests
//! and 0 for the sizes it does not ask for, the QoS cgroups unbounded, `kubepods` the node's huge pages (less the
//! reservations with `pods` enforced); in `hugetlb.<size>.limit_in_bytes` on v1 and `hugetlb.<size>.max` on v2,
//! and in the reservation's `rsvd` file beside it where the kernel has one.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{CgroupError, QosCgroups, blocking, io};

/// The huge pages limit of the QoS cgroups: no bound, as the kubelet writes it.
pub const HUGETLB_UNBOUNDED: u64 = 1 << 62;

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

impl QosCgroups {
    /// [`hugetlb_settings`] for this machine's page sizes (none when the hugetlb controller is not there).
    pub(super) fn hugetlb(&self, limits: &BTreeMap<u64, u64>, unnamed: u64) -> Vec<(String, u64)> {
        hugetlb_settings(&self.page_sizes, limits, unnamed)
    }

    /// Writes the huge pages limits of `cgroup`: `limits` for the sizes it names, `unnamed` for the others.
    pub(super) async fn apply_hugetlb(
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
    pub(super) fn write_hugetlb(&self, cgroup: &str, settings: &[(String, u64)]) -> Result<(), CgroupError> {
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
}
