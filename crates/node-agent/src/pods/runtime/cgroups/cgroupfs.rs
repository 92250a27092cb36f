//! The tree's directories and files in the hierarchies (cgroupfs): making a cgroup (in the unified hierarchy each
//! level with its controllers enabled in its parent's `cgroup.subtree_control`; in a v1 cpuset hierarchy with
//! the parent's cpus and memory nodes copied down), writing a setting to the file of the hierarchy that holds its
//! controller (as its v2 file on a cgroup v2 host), and removing a cgroup with the cgroups below it wherever it
//! is, the v2 hierarchy of a hybrid host included.

use std::path::{Path, PathBuf};

use super::settings::v2_setting;
use super::{CgroupError, QosCgroups, io, leftovers};

impl QosCgroups {
    /// Creates `cgroup` in every hierarchy (a new cpuset cgroup gets its parent's cpus and memory nodes). In the
    /// unified hierarchy each level down to it is made with the controllers enabled in its parent.
    pub(super) fn create(&self, cgroup: &str) -> Result<(), CgroupError> {
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
    pub(super) fn write(&self, cgroup: &str, file: &str, value: &str) -> Result<(), CgroupError> {
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

    /// `cgroup`'s directory in every hierarchy: the v1 ones, and the v2 one of a hybrid host.
    pub(super) fn everywhere(&self, cgroup: &str) -> Vec<PathBuf> {
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
    pub(super) fn remove_everywhere(&self, cgroup: &str) -> Result<(), CgroupError> {
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
}

/// The cgroups from the one just below `mount` down to `dir`, parents first.
fn levels<'a>(mount: &Path, dir: &'a Path) -> Vec<&'a Path> {
    let mut chain: Vec<&Path> = dir
        .ancestors()
        .take_while(|p| p.starts_with(mount) && *p != mount)
        .collect();
    chain.reverse();
    chain
}

/// Creates `dir` and the cgroups between `mount` and it in the unified hierarchy mounted at `mount`, enabling
/// `controllers` (those the hierarchy has) in `cgroup.subtree_control` of each parent first, so that each level
/// gets the controllers' files and its children can have them too.
fn create_v2(mount: &Path, dir: &Path, controllers: &[String]) -> Result<(), CgroupError> {
    for d in levels(mount, dir) {
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
    for d in levels(mount, dir) {
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
