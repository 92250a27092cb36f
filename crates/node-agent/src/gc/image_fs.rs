//! How full the image filesystem is: what the image garbage collector compares with its thresholds.
//!
//! [`ImageFsSource`] is all the collector asks. An agent answers it with its
//! [`StatsProvider`](crate::stats::StatsProvider) (the figures the eviction manager sees); [`RuntimeImageFs`]
//! is a standalone answer from the runtime's `ImageFsInfo`:
//! on a real node with a `statvfs` of the filesystem the runtime names (capacity and available bytes as the
//! kernel counts them, inodes too); on a hollow node, whose fake runtime has no filesystem, with the node's
//! ephemeral-storage capacity less the bytes the runtime reports its images use.

use std::sync::Arc;

use async_trait::async_trait;
use runtime_api::{Runtime, cri};

pub use crate::stats::FsStats;

/// Where the image garbage collector learns how full the image filesystem is.
#[async_trait]
pub trait ImageFsSource: Send + Sync {
    /// The image filesystem now; an error says why it cannot be told.
    async fn image_fs(&self) -> Result<FsStats, String>;
}

#[async_trait]
impl ImageFsSource for crate::stats::StatsProvider {
    async fn image_fs(&self) -> Result<FsStats, String> {
        crate::stats::StatsProvider::image_fs(self)
            .await
            .map_err(|e| e.to_string())
    }
}

/// How [`RuntimeImageFs`] turns the runtime's `ImageFsInfo` into sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFsKind {
    /// A real node: `statvfs` of the mountpoint the runtime reports.
    Statvfs,
    /// A hollow node with this much ephemeral storage: available is that less the images' bytes.
    Capacity(u64),
}

/// The image filesystem as the runtime describes it.
#[derive(Clone)]
pub struct RuntimeImageFs {
    runtime: Arc<dyn Runtime>,
    kind: ImageFsKind,
}

impl std::fmt::Debug for RuntimeImageFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeImageFs")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl RuntimeImageFs {
    /// The image filesystem of `runtime`, measured as `kind` says.
    pub fn new(runtime: Arc<dyn Runtime>, kind: ImageFsKind) -> Self {
        Self { runtime, kind }
    }
}

#[async_trait]
impl ImageFsSource for RuntimeImageFs {
    async fn image_fs(&self) -> Result<FsStats, String> {
        let info = self
            .runtime
            .image_fs_info(cri::ImageFsInfoRequest::default())
            .await
            .map_err(|e| format!("ImageFsInfo: {e}"))?;
        let fs = info
            .image_filesystems
            .into_iter()
            .next()
            .ok_or("the runtime reports no image filesystem")?;
        match self.kind {
            ImageFsKind::Capacity(capacity) => {
                let used = fs.used_bytes.map_or(0, |u| u.value);
                Ok(FsStats {
                    capacity_bytes: capacity,
                    available_bytes: capacity.saturating_sub(used),
                    inodes: None,
                    inodes_free: None,
                })
            }
            ImageFsKind::Statvfs => {
                let mountpoint = fs
                    .fs_id
                    .map(|id| id.mountpoint)
                    .filter(|m| !m.is_empty())
                    .ok_or("the runtime names no image filesystem mountpoint")?;
                let st = nix::sys::statvfs::statvfs(mountpoint.as_str())
                    .map_err(|e| format!("statvfs {mountpoint}: {e}"))?;
                let block = st.fragment_size();
                Ok(FsStats {
                    capacity_bytes: st.blocks().saturating_mul(block),
                    available_bytes: st.blocks_available().saturating_mul(block),
                    inodes: Some(st.files()),
                    inodes_free: Some(st.files_available()),
                })
            }
        }
    }
}
