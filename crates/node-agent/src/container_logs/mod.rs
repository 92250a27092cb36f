//! Container log rotation, the kubelet's container log manager: every `containerLogMonitorInterval` the running
//! containers are listed, and each whose log (`ContainerStatus.logPath`) has reached `containerLogMaxSize` is
//! rotated — older rotated files compressed, the oldest removed down to `containerLogMaxFiles`, the log renamed
//! to `<log>.<YYYYMMDD-hhmmss>` — and the runtime is asked to reopen the log (`ReopenContainerLog`), so the
//! container writes on into a new file. Up to `containerLogMaxWorkers` containers are rotated at once.
//!
//! Containers that do not run are left alone: they write nothing more. A log that is missing is reopened first
//! (the runtime creates it again). Should the runtime fail to reopen, the renamed file is renamed back, so the
//! next pass tries again and nothing the container wrote is lost. A negative `containerLogMaxSize` turns
//! rotation off. Only a real node runs this manager: a node on an in-memory runtime writes no log files.
//!
//! The file side of a rotation is [`files`]; this module owns the schedule and the runtime's part.

mod files;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use runtime_api::{Runtime, RuntimeError, cri};
use time::OffsetDateTime;
use tokio::time::Instant;

use crate::config::KubeletConfig;

pub use files::FileError;

/// The rotated files of the container log `log` (`<log>.<time>`, `<log>.<time>.gz`), oldest first.
pub fn rotated_files(log: &Path) -> Result<Vec<PathBuf>, FileError> {
    files::rotated(log)
}

/// Why one container's log was not rotated (logged; the next pass tries again).
#[derive(Debug, thiserror::Error)]
pub enum RotationError {
    /// The runtime did not list the containers.
    #[error("listing containers: {0}")]
    List(#[source] RuntimeError),
    /// The runtime gave no status of the container.
    #[error("container status: {0}")]
    Status(#[source] RuntimeError),
    /// The log could not be measured.
    #[error("reading the size of {}: {source}", path.display())]
    Stat {
        /// The log.
        path: PathBuf,
        /// The file system's error.
        #[source]
        source: std::io::Error,
    },
    /// The log was missing and the runtime did not open it again.
    #[error("the log is missing and reopening it failed: {0}")]
    ReopenMissing(#[source] RuntimeError),
    /// Renaming, compressing or removing the files failed.
    #[error(transparent)]
    Files(#[from] FileError),
    /// The runtime did not reopen the log after it was renamed (it is renamed back).
    #[error("reopening the log after renaming it: {0}")]
    Reopen(#[source] RuntimeError),
    /// The file work was cut off (its thread panicked or the runtime shut down).
    #[error("the rotation's file work ended early: {0}")]
    Aborted(String),
}

/// What is rotated when, from the KubeletConfiguration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotationPolicy {
    /// A log at or above this many bytes is rotated (`containerLogMaxSize`).
    pub max_size: u64,
    /// Files kept per container log, the one being written included (`containerLogMaxFiles`, at least 2).
    pub max_files: usize,
    /// Containers rotated at once (`containerLogMaxWorkers`, at least 1).
    pub workers: usize,
    /// The time between passes (`containerLogMonitorInterval`).
    pub interval: Duration,
}

impl RotationPolicy {
    /// The policy `k` sets; `None` when its `containerLogMaxSize` is negative (rotation off).
    pub fn from_config(k: &KubeletConfig) -> Option<Self> {
        let size = k.container_log_max_size.value();
        if size < 0 {
            return None;
        }
        Some(Self {
            max_size: u64::try_from(size).unwrap_or(u64::MAX),
            max_files: usize::try_from(k.container_log_max_files).unwrap_or(usize::MAX),
            workers: usize::try_from(k.container_log_max_workers).unwrap_or(1).max(1),
            interval: k.container_log_monitor_interval,
        })
    }
}

/// A rotated file's time suffix: `YYYYMMDD-hhmmss` (the kubelet's `20060102-150405`), in UTC.
fn stamp(t: OffsetDateTime) -> String {
    format!(
        "{:04}{:02}{:02}-{:02}{:02}{:02}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// The container log manager of one real node (see the module).
pub struct LogRotationManager {
    runtime: Arc<dyn Runtime>,
    policy: RotationPolicy,
    /// Wall-clock time at `started`: rotated files are named by this clock advanced on tokio's, so names follow
    /// each other in order even when the wall clock steps back.
    wall_at_start: SystemTime,
    started: Instant,
}

impl LogRotationManager {
    /// A manager rotating the logs of `runtime`'s running containers by `policy`.
    pub fn new(runtime: Arc<dyn Runtime>, policy: RotationPolicy) -> Self {
        Self {
            runtime,
            policy,
            wall_at_start: SystemTime::now(),
            started: Instant::now(),
        }
    }

    /// Name rotated files as though the wall clock read `wall` now (tests).
    #[cfg(test)]
    pub(crate) fn with_wall_clock(mut self, wall: SystemTime) -> Self {
        self.wall_at_start = wall;
        self.started = Instant::now();
        self
    }

    /// A pass at once, then one every interval after the previous ended, until the future is dropped.
    pub async fn run(self) {
        tracing::info!(
            workers = self.policy.workers,
            interval = ?self.policy.interval,
            max_size = self.policy.max_size,
            max_files = self.policy.max_files,
            "container log rotation started"
        );
        loop {
            if let Err(error) = self.pass().await {
                tracing::warn!(%error, "container log rotation pass failed");
            }
            tokio::time::sleep(self.policy.interval).await;
        }
    }

    /// One pass over the running containers: each log at or over the size is rotated. Errors of one container
    /// are logged and leave the others to go on; the error returned is the listing's.
    pub async fn pass(&self) -> Result<(), RotationError> {
        let listed = self
            .runtime
            .list_containers(cri::ListContainersRequest::default())
            .await
            .map_err(RotationError::List)?;
        let running = listed
            .containers
            .into_iter()
            .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
            .map(|c| c.id);
        futures::stream::iter(running)
            .for_each_concurrent(self.policy.workers, |id| async move {
                if let Err(error) = self.check(&id).await {
                    tracing::warn!(container = %id, %error, "container log not rotated");
                }
            })
            .await;
        Ok(())
    }

    /// Rotates container `id`'s log if it reached the size; whether it did.
    pub async fn check(&self, id: &str) -> Result<bool, RotationError> {
        let status = self
            .runtime
            .container_status(cri::ContainerStatusRequest {
                container_id: id.to_owned(),
                verbose: false,
            })
            .await
            .map_err(RotationError::Status)?;
        let Some(path) = status
            .status
            .map(|s| s.log_path)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
        else {
            return Ok(false);
        };
        let size = match size(&path).await {
            Ok(size) => size,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // the runtime writes into a file no longer there: it opens the log again
                self.reopen(id).await.map_err(RotationError::ReopenMissing)?;
                size(&path).await.map_err(|source| RotationError::Stat {
                    path: path.clone(),
                    source,
                })?
            }
            Err(source) => return Err(RotationError::Stat { path, source }),
        };
        if size < self.policy.max_size {
            return Ok(false);
        }
        self.rotate(id, path).await?;
        Ok(true)
    }

    /// Makes room, renames the log, and has the runtime reopen it (renamed back if it does not).
    async fn rotate(&self, id: &str, log: PathBuf) -> Result<(), RotationError> {
        let stamp = stamp(self.now());
        let max_files = self.policy.max_files;
        let (rotated, log) =
            blocking(move || files::rotate(&log, max_files, &stamp).map(|r| (r, log))).await?;
        if let Err(e) = self.reopen(id).await {
            let back = rotated.clone();
            if let Err(error) = blocking(move || files::restore(&back, &log)).await {
                tracing::error!(container = %id, rotated = %rotated.display(), %error, "could not rename a rotated log back after the runtime failed to reopen it");
            }
            return Err(RotationError::Reopen(e));
        }
        tracing::debug!(container = %id, rotated = %rotated.display(), "container log rotated");
        Ok(())
    }

    async fn reopen(&self, id: &str) -> Result<(), RuntimeError> {
        self.runtime
            .reopen_container_log(cri::ReopenContainerLogRequest {
                container_id: id.to_owned(),
            })
            .await
            .map(drop)
    }

    /// Now, by the wall clock read at start advanced on tokio's clock.
    fn now(&self) -> OffsetDateTime {
        OffsetDateTime::from(self.wall_at_start + self.started.elapsed())
    }
}

async fn size(path: &Path) -> std::io::Result<u64> {
    Ok(tokio::fs::metadata(path).await?.len())
}

/// Runs file work on the blocking threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, FileError> + Send + 'static,
) -> Result<T, RotationError> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => Ok(result?),
        Err(e) => Err(RotationError::Aborted(e.to_string())),
    }
}
