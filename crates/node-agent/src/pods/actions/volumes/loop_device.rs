//! Loop devices over files, as the kubelet's volume path handler keeps them for block volumes: a block volume
//! whose published path is a regular file (a file-backed volume) becomes a device node through a loop device
//! attached to the node's map file of the pod (`losetup -f <file>`), found again by its backing file in
//! sysfs (`/sys/block/loop*/loop/backing_file`), also after a restart, and detached (`losetup -d`) when the pod
//! goes. Blocking calls: callers run them off the runtime.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The loop device whose backing file is `file`, if any.
pub fn find(file: &Path) -> io::Result<Option<PathBuf>> {
    find_in(Path::new("/sys/block"), file)
}

/// [`find`] over the block devices listed in `sys_block`.
fn find_in(sys_block: &Path, file: &Path) -> io::Result<Option<PathBuf>> {
    let real = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_owned());
    let entries = match std::fs::read_dir(sys_block) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with("loop") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path().join("loop/backing_file")) else {
            continue;
        };
        let backing = backing_path(&text);
        if backing == file || backing == real {
            return Ok(Some(Path::new("/dev").join(name)));
        }
    }
    Ok(None)
}

/// The path in a sysfs `backing_file` (a file removed since shows as `<path> (deleted)`).
fn backing_path(text: &str) -> PathBuf {
    let text = text.trim();
    PathBuf::from(text.strip_suffix("(deleted)").unwrap_or(text).trim_end())
}

/// The loop device over `file`: the one already attached, or a new one.
pub fn attach(file: &Path) -> io::Result<PathBuf> {
    if let Some(device) = find(file)? {
        return Ok(device);
    }
    let out = Command::new("losetup")
        .arg("-f")
        .arg(file)
        .output()
        .map_err(|e| io::Error::other(format!("running losetup: {e}")))?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "losetup -f {} failed: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    find(file)?.ok_or_else(|| {
        io::Error::other(format!(
            "losetup -f {} succeeded but no loop device has it as its backing file",
            file.display()
        ))
    })
}

/// Detaches the loop device over `file`, if there is one.
pub fn detach(file: &Path) -> io::Result<()> {
    let Some(device) = find(file)? else {
        return Ok(());
    };
    let out = Command::new("losetup")
        .arg("-d")
        .arg(&device)
        .output()
        .map_err(|e| io::Error::other(format!("running losetup: {e}")))?;
    // a device gone meanwhile is detached
    if out.status.success() || !device.exists() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "losetup -d {} failed: {}",
        device.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_device_is_found_by_its_backing_file() {
        let sys = tempfile::tempdir().unwrap();
        for (name, backing) in [
            ("loop0", "/var/lib/a\n"),
            ("loop3", "/var/lib/kubelet/plugins/x/dev/uid-1 (deleted)\n"),
        ] {
            let dir = sys.path().join(name).join("loop");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("backing_file"), backing).unwrap();
        }
        // a loop device with no file, and another block device
        std::fs::create_dir_all(sys.path().join("loop1")).unwrap();
        std::fs::create_dir_all(sys.path().join("sda/loop")).unwrap();
        std::fs::write(sys.path().join("sda/loop/backing_file"), "/var/lib/a").unwrap();
        let find = |p: &str| find_in(sys.path(), Path::new(p)).unwrap();
        assert_eq!(find("/var/lib/a"), Some(PathBuf::from("/dev/loop0")));
        assert_eq!(
            find("/var/lib/kubelet/plugins/x/dev/uid-1"),
            Some(PathBuf::from("/dev/loop3"))
        );
        assert_eq!(find("/var/lib/b"), None);
        assert_eq!(find_in(&sys.path().join("none"), Path::new("/x")).unwrap(), None);
    }
}
