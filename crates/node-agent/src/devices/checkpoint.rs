//! The device manager's checkpoint, `<root-dir>/device-plugins/kubelet_internal_checkpoint`: the devices each
//! container holds with the plugin's answer to `Allocate`, and each resource's device IDs, so that an agent
//! started again gives running pods' containers the same devices without asking the plugins anew.
//!
//! The file is this project's own JSON (the kubelet's name, not its format), written atomically, with a checksum
//! over its contents: a file that does not parse or whose checksum is wrong is reported and ignored, as the
//! kubelet treats a corrupt checkpoint.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::state::Assigned;

/// The checkpoint's file name in the device-plugins directory.
pub const FILE: &str = "kubelet_internal_checkpoint";

/// What the file holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Each container's devices.
    pub assigned: Vec<Assigned>,
    /// Each resource's device IDs.
    pub devices: BTreeMap<String, Vec<String>>,
}

#[derive(Serialize, Deserialize)]
struct File {
    data: Checkpoint,
    checksum: u64,
}

fn checksum(data: &Checkpoint) -> u64 {
    use std::hash::{Hash, Hasher};
    // FNV-1a over the canonical JSON: stable across builds, unlike the standard library's hasher
    struct Fnv(u64);
    impl Hasher for Fnv {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for b in bytes {
                self.0 ^= u64::from(*b);
                self.0 = self.0.wrapping_mul(0x100_0000_01b3);
            }
        }
    }
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    serde_json::to_string(data).unwrap_or_default().hash(&mut h);
    h.finish()
}

/// Why the checkpoint could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading or writing the file failed.
    #[error("device manager checkpoint {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The file is not a checkpoint, or its checksum does not match.
    #[error("device manager checkpoint {0} is corrupt")]
    Corrupt(PathBuf),
}

/// Reads the checkpoint at `path`; `Ok(None)` when there is none.
pub fn read(path: &Path) -> Result<Option<Checkpoint>, CheckpointError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(CheckpointError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    let file: File = serde_json::from_slice(&bytes).map_err(|_| CheckpointError::Corrupt(path.to_owned()))?;
    if checksum(&file.data) != file.checksum {
        return Err(CheckpointError::Corrupt(path.to_owned()));
    }
    Ok(Some(file.data))
}

/// Writes `data` to `path` atomically (mode 0600).
pub fn write(path: &Path, data: &Checkpoint) -> Result<(), CheckpointError> {
    let file = File {
        checksum: checksum(data),
        data: data.clone(),
    };
    let bytes = serde_json::to_vec(&file).map_err(|e| CheckpointError::Io {
        path: path.to_owned(),
        source: io::Error::other(e),
    })?;
    crate::state_file::write_atomic(path, &bytes, 0o600).map_err(|source| CheckpointError::Io {
        path: path.to_owned(),
        source,
    })
}
