//! `fsGroup` ownership of the volumes a node provides itself, as the kubelet sets it: every file and directory
//! of the volume (walked without following symlinks) gets group `fsGroup`; files gain group read and write
//! (read only for the volumes the kubelet mounts read-only: configMap, secret, downwardAPI, projected), and
//! directories also gain group search and the setgid bit, so what a container creates there belongs to the
//! group too. The owner is left as it is. For the volumes the node writes itself the kubelet ignores
//! `fsGroupChangePolicy` and always changes the whole tree, and so does this; for `local` persistent volumes
//! `OnRootMismatch` skips the walk when the root already has the group and its permissions
//! ([`root_matches`]). Blocking: run it off the runtime.

use std::fs;
use std::io;
use std::os::unix::fs::{PermissionsExt, lchown};
use std::path::Path;

const READ_WRITE: u32 = 0o660;
const READ_ONLY: u32 = 0o440;
const SEARCH: u32 = 0o110;
const SETGID: u32 = 0o2000;

/// Gives everything under (and including) `dir` group `gid` and the group permissions above.
pub fn set(dir: &Path, gid: u32, read_only: bool) -> io::Result<()> {
    let meta = fs::symlink_metadata(dir)?;
    walk(dir, &meta, gid, if read_only { READ_ONLY } else { READ_WRITE })
}

/// Whether `dir` itself already has group `gid` and the group permissions [`set`] gives a directory (the
/// kubelet's `OnRootMismatch` test).
pub fn root_matches(dir: &Path, gid: u32, read_only: bool) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(dir)?;
    let want = if read_only { READ_ONLY } else { READ_WRITE } | SEARCH | SETGID;
    Ok(meta.gid() == gid && meta.permissions().mode() & want == want)
}

fn walk(path: &Path, meta: &fs::Metadata, gid: u32, mask: u32) -> io::Result<()> {
    if meta.is_dir() {
        for entry in fs::read_dir(path)? {
            let entry = entry?;
            let child = entry.path();
            walk(&child, &fs::symlink_metadata(&child)?, gid, mask)?;
        }
    }
    lchown(path, None, Some(gid))?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let extra = if meta.is_dir() {
        mask | SEARCH | SETGID
    } else {
        mask
    };
    let mode = meta.permissions().mode() & 0o7777;
    fs::set_permissions(path, fs::Permissions::from_mode(mode | extra))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, symlink};

    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn files_and_directories_get_the_group_and_its_permissions() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("vol");
        fs::create_dir_all(dir.join("sub")).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(dir.join("sub"), fs::Permissions::from_mode(0o700)).unwrap();
        fs::write(dir.join("sub/key"), "v").unwrap();
        fs::set_permissions(dir.join("sub/key"), fs::Permissions::from_mode(0o400)).unwrap();
        fs::write(dir.join("open"), "v").unwrap();
        fs::set_permissions(dir.join("open"), fs::Permissions::from_mode(0o644)).unwrap();
        symlink("sub/key", dir.join("link")).unwrap();
        // a group the test's user is in (the owner may always give a file its own primary group)
        let gid = fs::metadata(tmp.path()).unwrap().gid();
        set(&dir, gid, true).unwrap();
        assert_eq!(
            mode(&dir.join("sub/key")),
            0o440,
            "a secret's 0400 key becomes group readable"
        );
        assert_eq!(mode(&dir.join("open")), 0o644);
        assert_eq!(mode(&dir.join("sub")), 0o2750);
        assert_eq!(mode(&dir), 0o2755);
        assert_eq!(fs::symlink_metadata(dir.join("link")).unwrap().gid(), gid);
        assert!(!root_matches(&dir, gid, false).unwrap(), "read-only bits only");
        set(&dir, gid, false).unwrap();
        assert!(root_matches(&dir, gid, false).unwrap());
        assert_eq!(mode(&dir.join("sub/key")), 0o660);
        assert_eq!(mode(&dir.join("sub")), 0o2770);
        assert!(set(&tmp.path().join("missing"), gid, false).is_err());
    }
}
