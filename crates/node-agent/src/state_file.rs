//! Files the agent keeps on the node's disk and reads back (certificates and keys, the kubeconfig TLS bootstrap
//! writes, a pod's `etc-hosts`), written so that a crash or a full disk never leaves one half-written: the new
//! content goes to a temporary file beside the target, is flushed to the disk, and then renamed over the
//! target in one step, and the directory is flushed so that the rename itself survives a power cut. A reader
//! sees the old file or the new one, whole. A write that fails removes its temporary file and leaves the old
//! file as it was.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Writes `data` to `path` atomically (see the module documentation), the file created with permission bits
/// `mode` (the final file has them whatever the process's umask kept). The error names the file that failed.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    let named =
        |what: &str, p: &Path, e: io::Error| io::Error::new(e.kind(), format!("{what} {}: {e}", p.display()));
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let tmp = temp_path(path);
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
            .map_err(|e| named("creating", &tmp, e))?;
        file.write_all(data).map_err(|e| named("writing", &tmp, e))?;
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))
            .map_err(|e| named("setting the mode of", &tmp, e))?;
        file.sync_all().map_err(|e| named("flushing", &tmp, e))?;
        fs::rename(&tmp, path).map_err(|e| named("renaming into place", path, e))
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    // the rename is durable once the directory is flushed; a directory that cannot be opened for that (rare:
    // permissions) still holds the whole new file
    if let Ok(d) = File::open(&dir) {
        d.sync_all().map_err(|e| named("flushing", &dir, e))?;
    }
    Ok(())
}

/// Whether `name` is a temporary file of [`write_atomic`] (left by a crash between its create and rename).
pub fn is_temp_file(name: &str) -> bool {
    name.starts_with('.') && name.contains(".tmp-")
}

/// `<dir>/.<name>.tmp-<pid>`: hidden, beside the target (a rename never crosses file systems), unique per
/// process.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn replaces_the_file_whole_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet-client-current.pem");
        write_atomic(&path, b"old", 0o600).unwrap();
        write_atomic(&path, b"new content", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new content");
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["kubelet-client-current.pem"]);
    }

    #[test]
    fn the_mode_is_kept_whatever_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("etc-hosts");
        write_atomic(&path, b"127.0.0.1 localhost\n", 0o644).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o644);
    }

    #[test]
    fn a_failed_write_keeps_the_old_file_and_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        // a directory where the file should go: the rename fails after the temporary file was written
        let path = dir.path().join("target");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("inside"), "kept").unwrap();
        let err = write_atomic(&path, b"new", 0o600).unwrap_err();
        assert!(err.to_string().contains(&path.display().to_string()), "{err}");
        assert_eq!(fs::read_to_string(path.join("inside")).unwrap(), "kept");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["target"], "no temporary file left");
    }

    #[test]
    fn a_missing_directory_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gone/etc-hosts");
        let err = write_atomic(&path, b"x", 0o644).unwrap_err();
        assert!(err.to_string().contains("gone"), "{err}");
    }

    #[test]
    fn temporary_files_are_recognised() {
        let dir = Path::new("/var/lib/kubelet/pki");
        let tmp = temp_path(&dir.join("kubelet-client-current.pem"));
        assert!(is_temp_file(&tmp.file_name().unwrap().to_string_lossy()));
        assert!(!is_temp_file("kubelet-client-current.pem"));
    }
}
