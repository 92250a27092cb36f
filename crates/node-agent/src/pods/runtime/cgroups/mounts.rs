//! Where the cgroup hierarchies are mounted: the v1 hierarchies with their controllers and the unified (v2)
//! hierarchy, read from `/proc/self/mountinfo`, and the controllers the kubelet uses that a unified hierarchy has.

use std::path::{Path, PathBuf};

use super::{CgroupError, io};

/// The cgroup v2 controllers the kubelet enables for the pods' cgroups, where the kernel has them.
pub const V2_CONTROLLERS: [&str; 5] = ["cpu", "cpuset", "memory", "hugetlb", "pids"];

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

/// The unified hierarchy mounted at `mount`, with the controllers the kubelet uses ([`V2_CONTROLLERS`]) that its
/// `cgroup.controllers` lists.
pub(super) fn v2_hierarchy(mount: &Path) -> Result<Hierarchy, CgroupError> {
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
