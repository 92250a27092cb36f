//! A real node's volume directories: the atomic writer of configMap / secret / downward API / projected content
//! (a timestamped data directory behind a `..data` symlink that is swapped in one rename, so a running container
//! never sees half an update), tmpfs mounts for memory-backed volumes, hostPath type checks, and removal of a
//! pod's directory (unmounting what it mounted). Blocking file-system calls: callers run them off the runtime.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};

use super::content::File;
use crate::pods::spec::volumes::HostPathType;

const DATA: &str = "..data";
const DATA_TMP: &str = "..data_tmp";

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// A relative path without `..` (or an absolute path) in it.
fn checked(path: &str) -> io::Result<&Path> {
    let p = Path::new(path);
    let ok = !path.is_empty()
        && p.components().all(|c| matches!(c, Component::Normal(_)))
        && !path.starts_with("..");
    if ok {
        Ok(p)
    } else {
        Err(invalid(format!("invalid path {path:?}")))
    }
}

/// Writes `files` into `dir` as one atomic update: the new content goes into a fresh `..<time>` directory,
/// `..data` is switched to it by a rename, every top-level name is a symlink through `..data`, and the old
/// content directory and names no longer present are removed afterwards.
pub fn write_atomic(dir: &Path, files: &[File]) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let name = format!("..{}.{:09}", now.as_secs(), now.subsec_nanos());
    let data_dir = dir.join(&name);
    fs::create_dir(&data_dir)?;
    fs::set_permissions(&data_dir, fs::Permissions::from_mode(0o755))?;
    let mut top = BTreeSet::new();
    for f in files {
        let rel = checked(&f.path)?;
        let target = data_dir.join(rel);
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(&target, &f.data)?;
        fs::set_permissions(&target, fs::Permissions::from_mode(f.mode & 0o7777))?;
        if let Some(Component::Normal(first)) = rel.components().next() {
            top.insert(first.to_string_lossy().into_owned());
        }
    }
    let old = fs::read_link(dir.join(DATA)).ok();
    let tmp = dir.join(DATA_TMP);
    let _ = fs::remove_file(&tmp);
    symlink(&name, &tmp)?;
    fs::rename(&tmp, dir.join(DATA))?;
    for t in &top {
        let link = dir.join(t);
        if fs::symlink_metadata(&link).is_err() {
            symlink(Path::new(DATA).join(t), &link)?;
        }
    }
    // names of the old content that the new one lacks, and the old content itself
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let file_name = entry.file_name().to_string_lossy().into_owned();
        if file_name.starts_with("..") || top.contains(&file_name) {
            continue;
        }
        if entry.file_type()?.is_symlink() {
            fs::remove_file(entry.path())?;
        }
    }
    if let Some(old) = old.filter(|o| o.as_os_str() != name.as_str()) {
        let _ = fs::remove_dir_all(dir.join(old));
    }
    Ok(())
}

/// The current content of `path` in an atomically written directory (e.g. the token a volume holds).
pub fn read_current(dir: &Path, path: &str) -> Option<Vec<u8>> {
    fs::read(dir.join(DATA).join(checked(path).ok()?)).ok()
}

/// Whether `dir` is a mount point (its device differs from its parent's).
fn is_mount_point(dir: &Path) -> bool {
    let (Ok(me), Some(Ok(parent))) = (fs::metadata(dir), dir.parent().map(fs::metadata)) else {
        return false;
    };
    me.dev() != parent.dev()
}

/// Creates `dir` (mode 0777, as the kubelet's emptyDir) and, for a memory-backed volume, mounts a tmpfs on it
/// (of `size` bytes when given).
pub fn make_dir(dir: &Path, tmpfs: bool, size: Option<i64>) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    if tmpfs && !is_mount_point(dir) {
        let options = size.filter(|s| *s > 0).map(|s| format!("size={s}"));
        nix::mount::mount(
            Some("tmpfs"),
            dir,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            options.as_deref(),
        )
        .map_err(|e| io::Error::other(format!("mounting a tmpfs on {}: {e}", dir.display())))?;
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o777))
}

/// Checks (and for the `...OrCreate` types, creates) a hostPath volume's path; the error is the kubelet's.
pub fn check_host_path(path: &str, kind: HostPathType) -> Result<(), String> {
    let p = Path::new(path);
    let meta = fs::metadata(p);
    let fail = |what: &str| Err(format!("hostPath type check failed: {path} is not a {what}"));
    match kind {
        HostPathType::Unset => Ok(()),
        HostPathType::DirectoryOrCreate => {
            if meta.is_err() {
                fs::create_dir_all(p).map_err(|e| format!("creating {path}: {e}"))?;
                let _ = fs::set_permissions(p, fs::Permissions::from_mode(0o755));
                return Ok(());
            }
            if meta.is_ok_and(|m| m.is_dir()) {
                Ok(())
            } else {
                fail("directory")
            }
        }
        HostPathType::Directory => {
            if meta.is_ok_and(|m| m.is_dir()) {
                Ok(())
            } else {
                fail("directory")
            }
        }
        HostPathType::FileOrCreate => {
            if meta.is_err() {
                if let Some(parent) = p.parent() {
                    fs::create_dir_all(parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
                }
                fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| format!("creating {path}: {e}"))?;
                let _ = fs::set_permissions(p, fs::Permissions::from_mode(0o644));
                return Ok(());
            }
            if meta.is_ok_and(|m| m.is_file()) {
                Ok(())
            } else {
                fail("file")
            }
        }
        HostPathType::File => {
            if meta.is_ok_and(|m| m.is_file()) {
                Ok(())
            } else {
                fail("file")
            }
        }
        HostPathType::Socket => {
            if meta.is_ok_and(|m| m.file_type().is_socket()) {
                Ok(())
            } else {
                fail("socket file")
            }
        }
        HostPathType::CharDevice => {
            if meta.is_ok_and(|m| m.file_type().is_char_device()) {
                Ok(())
            } else {
                fail("character device")
            }
        }
        HostPathType::BlockDevice => {
            if meta.is_ok_and(|m| m.file_type().is_block_device()) {
                Ok(())
            } else {
                fail("block device")
            }
        }
    }
}

/// Removes a pod's directory: every volume directory under `volumes/<plugin>/` is unmounted first if it is a
/// mount point. hostPath volumes live outside it and are never touched.
pub fn remove_pod_dir(pod_dir: &Path) -> io::Result<()> {
    remove_volumes(pod_dir)?;
    match fs::remove_dir_all(pod_dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Unmounts (tmpfs) and removes the pod's volumes (`<pod dir>/volumes`), leaving the rest of its directory.
pub fn remove_volumes(pod_dir: &Path) -> io::Result<()> {
    let volumes = pod_dir.join("volumes");
    if let Ok(plugins) = fs::read_dir(&volumes) {
        for plugin in plugins.flatten() {
            let Ok(dirs) = fs::read_dir(plugin.path()) else {
                continue;
            };
            for dir in dirs.flatten() {
                let path: PathBuf = dir.path();
                if is_mount_point(&path) {
                    nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH)
                        .map_err(|e| io::Error::other(format!("unmounting {}: {e}", path.display())))?;
                }
            }
        }
    }
    match fs::remove_dir_all(&volumes) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, data: &str) -> File {
        File {
            path: path.into(),
            data: data.as_bytes().to_vec(),
            mode: 0o644,
        }
    }

    #[test]
    fn updates_swap_the_data_link_and_drop_old_names() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("vol");
        write_atomic(&dir, &[file("a", "1"), file("sub/b", "2")]).unwrap();
        assert_eq!(fs::read_to_string(dir.join("a")).unwrap(), "1");
        assert_eq!(fs::read_to_string(dir.join("sub/b")).unwrap(), "2");
        assert!(
            fs::symlink_metadata(dir.join("a"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        let first = fs::read_link(dir.join(DATA)).unwrap();

        write_atomic(&dir, &[file("a", "changed"), file("c", "3")]).unwrap();
        assert_eq!(fs::read_to_string(dir.join("a")).unwrap(), "changed");
        assert_eq!(fs::read_to_string(dir.join("c")).unwrap(), "3");
        assert!(
            fs::symlink_metadata(dir.join("sub")).is_err(),
            "a name the update lacks is gone"
        );
        assert!(!dir.join(&first).exists(), "the old content directory is removed");
        assert_eq!(read_current(&dir, "a").unwrap(), b"changed");
        let entries: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            entries.len(),
            4,
            "a, c, ..data and one content directory: {entries:?}"
        );
    }

    #[test]
    fn paths_leaving_the_volume_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        for bad in ["../x", "/etc/passwd", "a/../../x", "..data"] {
            assert!(write_atomic(tmp.path(), &[file(bad, "x")]).is_err(), "{bad}");
        }
    }

    #[test]
    fn host_path_types_are_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("made");
        let f = tmp.path().join("f");
        check_host_path(d.to_str().unwrap(), HostPathType::DirectoryOrCreate).unwrap();
        assert!(d.is_dir());
        check_host_path(f.to_str().unwrap(), HostPathType::FileOrCreate).unwrap();
        assert!(f.is_file());
        assert_eq!(
            check_host_path(f.to_str().unwrap(), HostPathType::Directory).unwrap_err(),
            format!("hostPath type check failed: {} is not a directory", f.display())
        );
        assert!(check_host_path("/nonexistent/x", HostPathType::File).is_err());
        check_host_path("/nonexistent/x", HostPathType::Unset).unwrap();
    }
}
