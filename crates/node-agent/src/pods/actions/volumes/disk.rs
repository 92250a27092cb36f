//! A real node's volume directories: the atomic writer of configMap / secret / downward API / projected content
//! (a timestamped data directory behind a `..data` symlink that is swapped in one rename, so a running container
//! never sees half an update), tmpfs mounts for memory-backed volumes and hugetlbfs mounts for huge pages ones, hostPath type checks, and removal of a
//! pod's directory (unmounting what it mounted). Blocking file-system calls: callers run them off the runtime.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt, lchown, symlink};
use std::path::{Component, Path, PathBuf};

use crate::pods::actions::volumes::content::File;
use crate::pods::model::spec::volumes::HostPathType;

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
        if f.owner.is_some() {
            lchown(&target, f.owner, None)?;
        }
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
    // an owned file's visible link (its top-level name) belongs to its owner too, as the kubelet's atomic
    // writer makes it
    for f in files.iter().filter(|f| f.owner.is_some()) {
        if let Some(Component::Normal(first)) = Path::new(&f.path).components().next() {
            lchown(dir.join(first), f.owner, None)?;
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

/// Creates the directories of `sub` below `base` that do not exist yet, each with `base`'s mode (setgid and
/// sticky bits included, whatever the umask), as the kubelet makes a missing `subPath` so that a container
/// with an `fsGroup` can write there. `sub` must be relative and stay below `base`.
pub fn make_sub_path(base: &Path, sub: &str) -> io::Result<()> {
    let sub = Path::new(sub);
    if !sub
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)))
    {
        return Err(invalid(format!("subPath {} leaves the volume", sub.display())));
    }
    let mode = fs::metadata(base)?.permissions().mode() & 0o7777;
    let mut path = base.to_path_buf();
    for part in sub.components() {
        path.push(part);
        match fs::symlink_metadata(&path) {
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir(&path)?;
                fs::set_permissions(&path, fs::Permissions::from_mode(mode))?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Creates `dir` (mode 0777, as the kubelet's emptyDir) and, for a memory-backed volume, mounts a tmpfs on it
/// (of `size` bytes when given), whose root keeps a tmpfs's sticky bit (1777), as under the kubelet.
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
    let mode = if tmpfs { 0o1777 } else { 0o777 };
    fs::set_permissions(dir, fs::Permissions::from_mode(mode))
}

/// The hugetlbfs mount option (`pagesize=2Mi`) of an emptyDir of `medium` (`HugePages` or `HugePages-<size>`) in
/// a pod whose containers (and pod level) request huge pages of the page sizes `requested`, as the kubelet chooses
/// it; the error is the kubelet's: no huge pages (of the medium's size) requested, or `HugePages` with several
/// sizes.
pub fn page_size_option(medium: &str, requested: impl IntoIterator<Item = u64>) -> Result<String, String> {
    use crate::pods::model::resources::{hugepage_resource, hugepage_size};
    let wanted = match medium.strip_prefix("HugePages-") {
        Some(size) => Some(
            hugepage_size(&format!("hugepages-{size}"))
                .ok_or_else(|| format!("unable to parse page size from medium {medium}"))?,
        ),
        None if medium == "HugePages" => None,
        None => return Err(format!("unknown storage medium {medium:?}")),
    };
    let mut found: Option<u64> = None;
    for size in requested {
        match wanted {
            None => {
                if found.is_some_and(|f| f != size) {
                    return Err(format!(
                        "medium: {medium} can't be used if container requests multiple huge page sizes"
                    ));
                }
                found = Some(size);
            }
            Some(w) if w == size => found = Some(size),
            Some(_) => {}
        }
    }
    let size = found.ok_or_else(|| {
        format!(
            "medium {medium}: hugePages storage requested, but there is no resource request for huge pages"
        )
    })?;
    let name = hugepage_resource(size);
    Ok(format!("pagesize={}", name.trim_start_matches("hugepages-")))
}

/// Creates `dir` and mounts a hugetlbfs on it with `option` (`pagesize=2Mi`), as the kubelet mounts a huge pages
/// emptyDir.
pub fn make_hugetlbfs_dir(dir: &Path, option: &str) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o777))?;
    if !is_mount_point(dir) {
        nix::mount::mount(
            Some("nodev"),
            dir,
            Some("hugetlbfs"),
            nix::mount::MsFlags::empty(),
            Some(option),
        )
        .map_err(|e| io::Error::other(format!("mounting a hugetlbfs on {}: {e}", dir.display())))?;
    }
    Ok(())
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

/// The mount points at or below `dir` (from `/proc/self/mountinfo`), with their filesystem type, deepest
/// first. `dir` is resolved first (mountinfo names canonical paths); a missing `dir` has none.
pub fn mounts_below(dir: &Path) -> io::Result<Vec<(PathBuf, String)>> {
    let dir = match fs::canonicalize(dir) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let text = fs::read_to_string("/proc/self/mountinfo")?;
    let mut found: Vec<(PathBuf, String)> = parse_mountinfo(&text)
        .into_iter()
        .filter(|(point, _)| point.starts_with(&dir))
        .collect();
    found.sort_by_key(|(point, _)| std::cmp::Reverse(point.components().count()));
    Ok(found)
}

/// `(mount point, filesystem type)` of every line of a mountinfo text (octal escapes such as `\040` decoded).
fn parse_mountinfo(text: &str) -> Vec<(PathBuf, String)> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let point = left.split(' ').nth(4)?;
            let fstype = right.split(' ').next()?;
            Some((PathBuf::from(unescape(point)), fstype.to_owned()))
        })
        .collect()
}

fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)))
            .and_then(|d| u8::try_from(d.iter().fold(0u32, |n, b| n * 8 + u32::from(b - b'0'))).ok());
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn still_mounted(what: &Path, mounts: &[(PathBuf, String)]) -> io::Error {
    let points: Vec<String> = mounts.iter().map(|(p, _)| p.display().to_string()).collect();
    io::Error::other(format!(
        "{} not removed: still mounted below it: {}",
        what.display(),
        points.join(", ")
    ))
}

/// Makes `dir` a shared mount, as the kubelet makes its root directory at start-up: volumes below it can then
/// be mounted into containers with `HostToContainer` or `Bidirectional` propagation (the runtime refuses a
/// source whose mount is private). When `dir` is not a mount point of its own it is first bind-mounted onto
/// itself; nothing is done when it already is a shared one.
pub fn make_rshared(dir: &Path) -> io::Result<()> {
    use nix::mount::{MsFlags, mount};
    fs::create_dir_all(dir)?;
    let dir = fs::canonicalize(dir)?;
    let text = fs::read_to_string("/proc/self/mountinfo")?;
    let own = text.lines().find_map(|line| {
        let (left, _) = line.split_once(" - ")?;
        let fields: Vec<&str> = left.split(' ').collect();
        (Path::new(&unescape(fields.get(4)?)) == dir)
            .then(|| fields[6..].iter().any(|f| f.starts_with("shared:")))
    });
    match own {
        Some(true) => return Ok(()),
        Some(false) => {}
        None => mount(
            Some(&dir),
            &dir,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(|e| io::Error::other(format!("bind-mounting {} onto itself: {e}", dir.display())))?,
    }
    mount(
        None::<&str>,
        &dir,
        None::<&str>,
        MsFlags::MS_SHARED | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| io::Error::other(format!("making {} a shared mount: {e}", dir.display())))
}

/// Removes a pod's directory: its volumes first ([`remove_volumes`]), then the rest (termination-message
/// files, `etc-hosts`) — never while anything is still mounted below it. hostPath volumes live outside it and
/// are never touched.
pub fn remove_pod_dir(pod_dir: &Path) -> io::Result<()> {
    remove_volumes(pod_dir)?;
    let mounts = mounts_below(pod_dir)?;
    if !mounts.is_empty() {
        return Err(still_mounted(pod_dir, &mounts));
    }
    match fs::remove_dir_all(pod_dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Unmounts and removes the pod's volumes (`<pod dir>/volumes`), leaving the rest of its directory. Only the
/// mounts this node makes are unmounted — a tmpfs on a volume's own directory,
/// `volumes/<plugin>/<name>` — and only when nothing else is mounted below `volumes`: then nothing is
/// unmounted or removed, and the error names what is mounted (as the kubelet, which never deletes a pod
/// directory with a volume still mounted in it).
pub fn remove_volumes(pod_dir: &Path) -> io::Result<()> {
    let volumes = pod_dir.join("volumes");
    let mounts = mounts_below(&volumes)?;
    let base = fs::canonicalize(&volumes).unwrap_or_else(|_| volumes.clone());
    let ours = |(point, fstype): &(PathBuf, String)| {
        (fstype == "tmpfs" || fstype == "hugetlbfs")
            && point
                .strip_prefix(&base)
                .is_ok_and(|rel| rel.components().count() == 2)
    };
    let foreign: Vec<(PathBuf, String)> = mounts.iter().filter(|m| !ours(m)).cloned().collect();
    if !foreign.is_empty() {
        return Err(still_mounted(&volumes, &foreign));
    }
    for (point, _) in &mounts {
        nix::mount::umount2(point, nix::mount::MntFlags::MNT_DETACH)
            .map_err(|e| io::Error::other(format!("unmounting {}: {e}", point.display())))?;
    }
    let left = mounts_below(&volumes)?;
    if !left.is_empty() {
        return Err(still_mounted(&volumes, &left));
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
            owner: None,
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

    /// A file with an owner (a service account token of a pod with one `runAsUser`) belongs to that user, and
    /// so does its visible link; the rest stays root's. Giving files away needs root (CI runs as root).
    #[test]
    fn an_owned_file_and_its_link_belong_to_the_owner() {
        if !is_root() {
            println!("skipped: chown to another user needs root");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("vol");
        let token = File {
            owner: Some(1000),
            mode: 0o600,
            ..file("token", "t")
        };
        write_atomic(&dir, &[token, file("ca.crt", "c")]).unwrap();
        let owner = |p: &str| fs::symlink_metadata(dir.join(p)).unwrap().uid();
        assert_eq!(owner("token"), 1000, "the visible link");
        assert_eq!(owner("..data/token"), 1000, "the file");
        assert_eq!(
            fs::metadata(dir.join("token")).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(owner("ca.crt"), 0);
        assert_eq!(owner("..data/ca.crt"), 0);
    }

    #[test]
    fn paths_leaving_the_volume_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        for bad in ["../x", "/etc/passwd", "a/../../x", "..data"] {
            assert!(write_atomic(tmp.path(), &[file(bad, "x")]).is_err(), "{bad}");
        }
    }

    #[test]
    fn mountinfo_lines_give_mount_points_and_types() {
        let text = "36 35 98:0 / /mnt/a\\040b rw,noatime master:1 - tmpfs tmpfs rw\n\
                    37 35 98:0 / /var/lib/x rw shared:2 - ext4 /dev/vda rw\n";
        assert_eq!(
            parse_mountinfo(text),
            vec![
                (PathBuf::from("/mnt/a b"), "tmpfs".to_owned()),
                (PathBuf::from("/var/lib/x"), "ext4".to_owned())
            ]
        );
    }

    fn is_root() -> bool {
        fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
    }

    /// A pod directory with a memory-backed volume (a tmpfs this node mounts) and a termination-message file:
    /// the tmpfs is unmounted and everything goes. Mounting needs root (CI runs as root).
    #[test]
    fn a_pod_directory_goes_with_its_tmpfs_volumes_unmounted() {
        if !is_root() {
            println!("skipped: mounting a tmpfs needs root");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let pod = tmp.path().join("uid-1");
        let vol = pod.join("volumes/kubernetes.io~secret/creds");
        make_dir(&vol, true, None).unwrap();
        write_atomic(&vol, &[file("token", "s3cret")]).unwrap();
        fs::create_dir_all(pod.join("containers/main")).unwrap();
        fs::write(pod.join("containers/main/abc"), "bye").unwrap();
        assert_eq!(mounts_below(&pod).unwrap().len(), 1);
        remove_pod_dir(&pod).unwrap();
        assert!(!pod.exists());
        assert!(mounts_below(tmp.path()).unwrap().is_empty());
    }

    #[test]
    fn the_page_size_of_a_huge_pages_volume_comes_from_the_pods_requests() {
        const M2: u64 = 2 << 20;
        const G1: u64 = 1 << 30;
        assert_eq!(page_size_option("HugePages", [M2, M2]).unwrap(), "pagesize=2Mi");
        assert_eq!(
            page_size_option("HugePages-1Gi", [M2, G1]).unwrap(),
            "pagesize=1Gi"
        );
        assert_eq!(
            page_size_option("HugePages-2048Ki", [M2]).unwrap(),
            "pagesize=2Mi"
        );
        assert_eq!(
            page_size_option("HugePages", [M2, G1]).unwrap_err(),
            "medium: HugePages can't be used if container requests multiple huge page sizes"
        );
        assert_eq!(
            page_size_option("HugePages", []).unwrap_err(),
            "medium HugePages: hugePages storage requested, but there is no resource request for huge pages"
        );
        assert_eq!(
            page_size_option("HugePages-1Gi", [M2]).unwrap_err(),
            "medium HugePages-1Gi: hugePages storage requested, but there is no resource request for huge pages"
        );
    }

    /// A huge pages volume is a hugetlbfs of the page size, unmounted with the pod's directory.
    #[test]
    fn a_huge_pages_volume_is_a_hugetlbfs_that_goes_with_the_pod() {
        if !is_root() {
            println!("skipped: mounting a hugetlbfs needs root");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let pod = tmp.path().join("uid-3");
        let vol = pod.join("volumes/kubernetes.io~empty-dir/huge");
        make_hugetlbfs_dir(&vol, "pagesize=2Mi").unwrap();
        let mounted = mounts_below(&pod).unwrap();
        assert_eq!(mounted.len(), 1, "{mounted:?}");
        assert_eq!(mounted[0].1, "hugetlbfs");
        let options = fs::read_to_string("/proc/self/mountinfo").unwrap();
        let line = options
            .lines()
            .find(|l| l.contains(&*vol.to_string_lossy()))
            .unwrap()
            .to_owned();
        assert!(line.contains("pagesize=2M"), "{line}");
        make_hugetlbfs_dir(&vol, "pagesize=2Mi").unwrap();
        assert_eq!(mounts_below(&pod).unwrap().len(), 1, "mounted once");
        remove_pod_dir(&pod).unwrap();
        assert!(!pod.exists());
    }

    /// Something mounted in a pod directory that this node did not mount there (here a tmpfs in the
    /// termination-message directory): nothing is removed — removing it would delete the mounted content —
    /// until it is unmounted.
    #[test]
    fn a_pod_directory_with_a_foreign_mount_stays() {
        if !is_root() {
            println!("skipped: mounting a tmpfs needs root");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let pod = tmp.path().join("uid-2");
        let foreign = pod.join("containers/main");
        make_dir(&foreign, true, None).unwrap();
        fs::write(foreign.join("keep"), "data").unwrap();
        let nested = pod.join("volumes/kubernetes.io~empty-dir/scratch/deeper");
        make_dir(&nested, true, None).unwrap();
        let err = remove_pod_dir(&pod).unwrap_err().to_string();
        assert!(err.contains("still mounted below it"), "{err}");
        assert_eq!(fs::read_to_string(foreign.join("keep")).unwrap(), "data");
        assert!(
            nested.exists(),
            "a mount deeper than a volume's own directory is not ours: kept"
        );
        nix::mount::umount2(&nested, nix::mount::MntFlags::MNT_DETACH).unwrap();
        let err = remove_pod_dir(&pod).unwrap_err().to_string();
        assert!(err.contains("containers/main"), "{err}");
        assert!(
            !pod.join("volumes").exists(),
            "the volumes went once nothing foreign was left in them"
        );
        nix::mount::umount2(&foreign, nix::mount::MntFlags::MNT_DETACH).unwrap();
        remove_pod_dir(&pod).unwrap();
        assert!(!pod.exists());
    }

    #[test]
    fn a_missing_sub_path_gets_the_volumes_mode() {
        let base = tempfile::tempdir().unwrap();
        fs::set_permissions(base.path(), fs::Permissions::from_mode(0o3777)).unwrap();
        make_sub_path(base.path(), "a/b").unwrap();
        for dir in ["a", "a/b"] {
            let mode = fs::metadata(base.path().join(dir)).unwrap().permissions().mode() & 0o7777;
            assert_eq!(mode, 0o3777, "{dir}");
        }
        // an existing one is left as it is
        fs::set_permissions(base.path().join("a"), fs::Permissions::from_mode(0o700)).unwrap();
        make_sub_path(base.path(), "a/c").unwrap();
        let mode = fs::metadata(base.path().join("a")).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700);
        assert!(make_sub_path(base.path(), "../x").is_err());
        assert!(make_sub_path(base.path(), "/x").is_err());
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
