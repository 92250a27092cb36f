//! Block volumes (`volumeMode: Block`) mapped on a real node with the kubelet's layout, and handed to
//! containers as device nodes (`volumeDevices`).
//!
//! A block volume is on a node path, its *device path*: a `local` PersistentVolume's path (a block device), or a
//! CSI volume's publish path (what the driver made there: a device node, or a regular file for a file-backed
//! volume). Mapping it for a pod, as the kubelet's block volume mapper does:
//!
//! * the *global map path* of the volume gets a file named by the pod's UID, bind-mounted onto the device path
//!   (`<root-dir>/plugins/kubernetes.io~local-volume/volumeDevices/<pv>/<uid>`, or for CSI
//!   `<root-dir>/plugins/kubernetes.io/csi/volumeDevices/<pv>/dev/<uid>`);
//! * the pod's *device map path* gets a symlink to the device path
//!   (`<root-dir>/pods/<uid>/volumeDevices/<plugin>/<pv>`, the plugin `kubernetes.io~local-volume` or
//!   `kubernetes.io~csi`);
//! * when the device path is a regular file, a loop device is attached to the pod's map file
//!   ([`loop_device`](super::loop_device)), as the kubelet's volume path handler attaches one.
//!
//! A container's device is the pod's symlink (the runtime follows it to the device node), or the loop device for
//! a file; `mrw`, or `r` for a read-only claim. Unmapping undoes it in the kubelet's order: loop device detached,
//! symlink removed, map file unmounted and removed. Everything is read back from disk, so a pod that went while
//! the agent was down is unmapped the same way. Blocking calls: callers run them off the runtime.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::loop_device;

/// The directory of a pod's block volumes (`<pod dir>/volumeDevices`).
const POD_DEVICES_DIR: &str = "volumeDevices";

/// The kubelet's directory of CSI block volumes, under the root directory.
pub const CSI_BLOCK_DIR: &str = "plugins/kubernetes.io/csi/volumeDevices";

/// The directory of CSI block volume `pv` on a node whose root directory is `root_dir`: its data and its global
/// map path (`dev`).
pub fn csi_volume_dir(root_dir: &Path, pv: &str) -> PathBuf {
    root_dir.join(CSI_BLOCK_DIR).join(pv)
}

/// The plugin a block volume is mapped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockPlugin {
    /// A `local` PersistentVolume.
    Local,
    /// A `csi` PersistentVolume.
    Csi,
}

impl BlockPlugin {
    /// The plugin's directory under a pod's `volumeDevices`.
    pub fn pod_dir_name(self) -> &'static str {
        match self {
            Self::Local => "kubernetes.io~local-volume",
            // the CSI plugin's pod directory, as for its filesystem volumes
            Self::Csi => "kubernetes.io~csi",
        }
    }

    fn from_pod_dir_name(name: &str) -> Option<Self> {
        [Self::Local, Self::Csi]
            .into_iter()
            .find(|p| p.pod_dir_name() == name)
    }

    /// The global map path of PersistentVolume `pv` on a node whose root directory is `root_dir`: the
    /// directory of the pods' map files.
    pub fn global_map_path(self, root_dir: &Path, pv: &str) -> PathBuf {
        match self {
            Self::Local => root_dir
                .join("plugins/kubernetes.io~local-volume/volumeDevices")
                .join(pv),
            Self::Csi => csi_volume_dir(root_dir, pv).join("dev"),
        }
    }
}

/// The symlink of block volume `pv` in the pod's device map path.
pub fn pod_device_path(pod_dir: &Path, plugin: BlockPlugin, pv: &str) -> PathBuf {
    pod_dir.join(POD_DEVICES_DIR).join(plugin.pod_dir_name()).join(pv)
}

/// A block volume to map for one pod.
#[derive(Debug, Clone, Copy)]
pub struct Mapping<'a> {
    /// The node's root directory.
    pub root_dir: &'a Path,
    /// The pod's directory.
    pub pod_dir: &'a Path,
    /// The pod's UID.
    pub uid: &'a str,
    /// The plugin.
    pub plugin: BlockPlugin,
    /// The PersistentVolume's name.
    pub pv: &'a str,
}

impl Mapping<'_> {
    fn map_file(&self) -> PathBuf {
        self.plugin.global_map_path(self.root_dir, self.pv).join(self.uid)
    }

    fn symlink(&self) -> PathBuf {
        pod_device_path(self.pod_dir, self.plugin, self.pv)
    }

    /// Maps the volume on `device` (its device path) for the pod; again over a mapping already made, it keeps
    /// what is there.
    pub fn map(&self, device: &Path) -> io::Result<()> {
        let device = std::fs::canonicalize(device)
            .map_err(|e| io::Error::other(format!("evaluating {}: {e}", device.display())))?;
        let meta = std::fs::metadata(&device)?;
        let file = meta.file_type().is_file();
        if !meta.file_type().is_block_device() && !file {
            return Err(io::Error::other(format!(
                "{} is neither a block device nor a file",
                device.display()
            )));
        }
        let map_file = self.map_file();
        let global = map_file.parent().unwrap_or(self.root_dir);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(global)?;
        if !same_file(&map_file, &meta) {
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o750)
                .open(&map_file)?;
            nix::mount::mount(
                Some(&device),
                &map_file,
                None::<&str>,
                nix::mount::MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|e| {
                io::Error::other(format!(
                    "failed to bind mount devicePath: {} to linkPath {}: {e}",
                    device.display(),
                    map_file.display()
                ))
            })?;
        }
        let link = self.symlink();
        if let Some(dir) = link.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o750)
                .create(dir)?;
        }
        match std::fs::remove_file(&link) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        std::os::unix::fs::symlink(&device, &link)?;
        if file {
            loop_device::attach(&map_file)?;
        }
        Ok(())
    }

    /// The node path a container's device names: the pod's symlink to a device node, or the loop device over
    /// the pod's map file when the volume is a regular file.
    pub fn host_device(&self) -> io::Result<PathBuf> {
        let link = self.symlink();
        let meta = std::fs::metadata(&link)?;
        if meta.file_type().is_block_device() {
            return Ok(link);
        }
        let map_file = self.map_file();
        loop_device::find(&map_file)?.ok_or_else(|| {
            io::Error::other(format!(
                "no loop device over {} (the volume is a file)",
                map_file.display()
            ))
        })
    }

    /// Unmaps the volume for the pod: [`release_device`](Self::release_device), then
    /// [`remove_link`](Self::remove_link).
    pub fn unmap(&self) -> io::Result<()> {
        self.release_device()?;
        self.remove_link()
    }

    /// Removes the pod's symlink: the last trace of the mapping on disk (a volume still to be unpublished keeps
    /// it until it is).
    pub fn remove_link(&self) -> io::Result<()> {
        let link = self.symlink();
        match std::fs::remove_file(&link) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        if let Some(dir) = link.parent() {
            let _ = std::fs::remove_dir(dir);
            let _ = dir.parent().map(std::fs::remove_dir);
        }
        Ok(())
    }

    /// Lets go of the device for the pod: the loop device over its map file detached, the map file unmounted
    /// and removed (and the global map path with it once no pod is left in it).
    pub fn release_device(&self) -> io::Result<()> {
        let map_file = self.map_file();
        loop_device::detach(&map_file)?;
        if is_mount_point(&map_file)? {
            nix::mount::umount2(&map_file, nix::mount::MntFlags::empty()).map_err(|e| {
                io::Error::other(format!("failed to unmount linkPath {}: {e}", map_file.display()))
            })?;
        }
        match std::fs::remove_file(&map_file) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        if let Some(global) = map_file.parent() {
            // left when another pod still maps the volume
            let _ = std::fs::remove_dir(global);
        }
        Ok(())
    }
}

/// Whether `path` is the file `meta` describes (a map file already bind-mounted onto it).
fn same_file(path: &Path, meta: &std::fs::Metadata) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.dev() == meta.dev() && m.ino() == meta.ino())
}

/// Whether `path` is a mount point of its own (a bind-mounted map file).
fn is_mount_point(path: &Path) -> io::Result<bool> {
    let real = match std::fs::canonicalize(path) {
        Ok(real) => real,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    Ok(super::disk::mounts_below(&real)?
        .iter()
        .any(|(point, _)| *point == real))
}

/// The block volumes mapped for the pod whose directory is `pod_dir`, as (plugin, PersistentVolume name).
pub fn mapped(pod_dir: &Path) -> Vec<(BlockPlugin, String)> {
    let Ok(plugins) = std::fs::read_dir(pod_dir.join(POD_DEVICES_DIR)) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for plugin in plugins.flatten() {
        let Some(kind) = BlockPlugin::from_pod_dir_name(&plugin.file_name().to_string_lossy()) else {
            continue;
        };
        let Ok(volumes) = std::fs::read_dir(plugin.path()) else {
            continue;
        };
        found.extend(
            volumes
                .flatten()
                .map(|v| (kind, v.file_name().to_string_lossy().into_owned())),
        );
    }
    found
}

/// Unmaps the pod's `local` block volumes (its CSI ones are unmapped with their unpublishing, see
/// `csi::tear_down`). Every volume is tried; the first error is returned.
pub fn unmap_local(root_dir: &Path, pod_dir: &Path) -> io::Result<()> {
    let uid = pod_dir
        .file_name()
        .map(|u| u.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut first = None;
    for (plugin, pv) in mapped(pod_dir) {
        if plugin != BlockPlugin::Local {
            continue;
        }
        let mapping = Mapping {
            root_dir,
            pod_dir,
            uid: &uid,
            plugin,
            pv: &pv,
        };
        if let Err(e) = mapping.unmap() {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_the_kubelets() {
        let root = Path::new("/var/lib/kubelet");
        assert_eq!(
            BlockPlugin::Local.global_map_path(root, "pv-1"),
            Path::new("/var/lib/kubelet/plugins/kubernetes.io~local-volume/volumeDevices/pv-1")
        );
        assert_eq!(
            BlockPlugin::Csi.global_map_path(root, "pv-1"),
            Path::new("/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/pv-1/dev")
        );
        let pod = Path::new("/var/lib/kubelet/pods/uid-1");
        assert_eq!(
            pod_device_path(pod, BlockPlugin::Local, "pv-1"),
            Path::new("/var/lib/kubelet/pods/uid-1/volumeDevices/kubernetes.io~local-volume/pv-1")
        );
        assert_eq!(
            pod_device_path(pod, BlockPlugin::Csi, "pv-1"),
            Path::new("/var/lib/kubelet/pods/uid-1/volumeDevices/kubernetes.io~csi/pv-1")
        );
    }

    #[test]
    fn mapped_volumes_are_read_back_from_the_pods_directory() {
        let pod = tempfile::tempdir().unwrap();
        for (plugin, pv) in [
            ("kubernetes.io~local-volume", "a"),
            ("kubernetes.io~csi", "b"),
            ("other", "c"),
        ] {
            let dir = pod.path().join("volumeDevices").join(plugin);
            std::fs::create_dir_all(&dir).unwrap();
            std::os::unix::fs::symlink("/dev/null", dir.join(pv)).unwrap();
        }
        let mut found = mapped(pod.path());
        found.sort_by(|a, b| a.1.cmp(&b.1));
        assert_eq!(
            found,
            vec![
                (BlockPlugin::Local, "a".to_owned()),
                (BlockPlugin::Csi, "b".to_owned())
            ]
        );
        assert!(mapped(&pod.path().join("none")).is_empty());
    }

    #[test]
    fn a_path_that_is_neither_a_device_nor_a_file_is_not_mapped() {
        let root = tempfile::tempdir().unwrap();
        let pod_dir = root.path().join("pods/uid-1");
        let mapping = Mapping {
            root_dir: root.path(),
            pod_dir: &pod_dir,
            uid: "uid-1",
            plugin: BlockPlugin::Local,
            pv: "pv-1",
        };
        let err = mapping.map(root.path()).unwrap_err().to_string();
        assert!(err.ends_with("is neither a block device nor a file"), "{err}");
        assert!(!pod_dir.exists());
    }
}
