//! The claims prepared on this node: per ResourceClaim, its drivers, the devices they prepared, whether
//! preparing finished and which pods use it. Kept in memory and, on a real node, checkpointed to a JSON file
//! under the root directory after every change that matters across a restart (a pod added to a claim before
//! its driver is called, the devices once prepared, a claim released), written atomically.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{ClaimRef, PreparedDevice};

/// The checkpoint's file name under the root directory.
pub const CHECKPOINT: &str = "dra_manager_state";

/// One claim as this node knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimInfo {
    /// The claim.
    pub claim: ClaimRef,
    /// Per driver whose devices the claim holds, the devices it prepared.
    pub drivers: BTreeMap<String, Vec<PreparedDevice>>,
    /// Whether every driver prepared the claim.
    pub prepared: bool,
    /// The pods on this node that use the claim.
    pub pods: BTreeSet<String>,
}

impl ClaimInfo {
    /// The CDI device IDs for the claim's request `request` (empty: every request).
    pub fn cdi_ids(&self, request: &str) -> impl Iterator<Item = &str> {
        self.drivers
            .values()
            .flatten()
            .filter(move |d| {
                request.is_empty()
                    || d.request_names.is_empty()
                    || d.request_names.iter().any(|r| r == request)
            })
            .flat_map(|d| d.cdi_ids.iter().map(String::as_str))
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Checkpoint {
    claims: Vec<ClaimInfo>,
}

/// The claims by namespace and name, with the file they are checkpointed to.
#[derive(Debug, Default)]
pub struct ClaimCache {
    claims: BTreeMap<(String, String), ClaimInfo>,
    file: Option<PathBuf>,
}

impl ClaimCache {
    /// A cache kept in memory only (a hollow node).
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// A cache checkpointed to `root_dir/dra_manager_state`, with what the file holds (nothing when it does not
    /// exist yet). A file that cannot be read is an error: claims prepared before would never be released.
    pub fn load(root_dir: &Path) -> io::Result<Self> {
        let file = root_dir.join(CHECKPOINT);
        let checkpoint: Checkpoint = match std::fs::read(&file) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("reading the DRA checkpoint {}: {e}", file.display()),
                )
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Checkpoint::default(),
            Err(e) => return Err(e),
        };
        let claims = checkpoint
            .claims
            .into_iter()
            .map(|c| ((c.claim.namespace.clone(), c.claim.name.clone()), c))
            .collect();
        Ok(Self {
            claims,
            file: Some(file),
        })
    }

    /// The claim `namespace/name`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<&ClaimInfo> {
        self.claims.get(&(namespace.to_owned(), name.to_owned()))
    }

    /// The claim `namespace/name`, to change.
    pub fn get_mut(&mut self, namespace: &str, name: &str) -> Option<&mut ClaimInfo> {
        self.claims.get_mut(&(namespace.to_owned(), name.to_owned()))
    }

    /// Adds a claim (replacing one of the same name).
    pub fn insert(&mut self, info: ClaimInfo) {
        let key = (info.claim.namespace.clone(), info.claim.name.clone());
        self.claims.insert(key, info);
    }

    /// Forgets the claim `namespace/name`.
    pub fn remove(&mut self, namespace: &str, name: &str) -> Option<ClaimInfo> {
        self.claims.remove(&(namespace.to_owned(), name.to_owned()))
    }

    /// Every claim.
    pub fn iter(&self) -> impl Iterator<Item = &ClaimInfo> {
        self.claims.values()
    }

    /// Whether any claim is used by the pod `uid`.
    pub fn used_by(&self, uid: &str) -> bool {
        self.claims.values().any(|c| c.pods.contains(uid))
    }

    /// Writes the checkpoint (nothing for an in-memory cache).
    pub fn save(&self) -> io::Result<()> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        let checkpoint = Checkpoint {
            claims: self.claims.values().cloned().collect(),
        };
        let bytes = serde_json::to_vec(&checkpoint).map_err(io::Error::other)?;
        crate::state_file::write_atomic(file, &bytes, 0o600)
    }
}
