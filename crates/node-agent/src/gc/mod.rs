//! Garbage collection of one node: dead containers, their sandboxes and logs, and unused images.
//!
//! This module owns deciding what of the runtime's contents is no longer needed and removing it, on two timers
//! as the kubelet runs them:
//!
//! | loop | period | what | failure |
//! |---|---|---|---|
//! | [`run_container_gc`] | 1 min (`--container-gc-period`) | [`ContainerGc::collect`]: dead containers by the policy of `--minimum-container-ttl-duration`, `--maximum-dead-containers-per-container`, `--maximum-dead-containers`; everything of pods that are gone; inactive sandboxes; log files and directories (real node) | `ContainerGCFailed` event |
//! | [`run_image_gc`] | 5 min (`--image-gc-period`) | [`ImageGc::collect`]: `imageMaximumGCAge`, then `imageGCHighThresholdPercent` → `imageGCLowThresholdPercent`, least recently used first | `FreeDiskSpaceFailed`, `ImageGCFailed` (second failure in a row) events |
//!
//! The first pass of each comes at a random point within its first period, so the thousands of agents of a
//! hollow fleet do not all list their runtimes at once; an idle loop holds one timer. Which pods still exist
//! comes from the pod manager ([`PodsQuery`](crate::pods::PodsQuery)); how full the image filesystem is from an
//! [`ImageFsSource`].
//!
//! Other managers reclaim through the handles in [`AgentContext::gc`](crate::AgentContext): the eviction
//! manager calls [`ContainerGc::delete_all_unused`] and [`ImageGc::delete_unused_images`] before it evicts a
//! pod for disk pressure.
//!
//! Modules: `select` (which containers and sandboxes go: the rules as pure functions), `containers` (the
//! container collector's runtime calls), `images` (image records and the image collector), [`image_fs`] (the
//! image filesystem's size).

mod containers;
pub mod image_fs;
mod images;
mod select;

use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use containers::{ContainerGc, ContainerGcError, ContainerGcReport};
pub use image_fs::{FsStats, ImageFsKind, ImageFsSource, RuntimeImageFs};
pub use images::{FREE_DISK_SPACE_FAILED, INVALID_DISK_CAPACITY, ImageGc, ImageGcError, ImagePolicy};
pub use select::{ContainerPolicy, Scope};

use crate::backoff::JitteredInterval;
use crate::events::{EventRecorder, node_reference};

/// Event reason: a container GC pass failed.
pub const CONTAINER_GC_FAILED: &str = "ContainerGCFailed";
/// Event reason: image GC passes failed twice in a row.
pub const IMAGE_GC_FAILED: &str = "ImageGCFailed";

/// The two collectors of one node. Cheap to clone.
#[derive(Debug, Clone)]
pub struct GarbageCollectors {
    /// Dead containers, sandboxes, logs.
    pub containers: ContainerGc,
    /// Unused images.
    pub images: ImageGc,
}

/// Collects dead containers every `period` until `token` fires; a failed pass is logged and reported on the
/// Node as `ContainerGCFailed`.
pub async fn run_container_gc(
    gc: ContainerGc,
    events: EventRecorder,
    node: String,
    period: Duration,
    token: CancellationToken,
) {
    let mut timer = JitteredInterval::new(period, 0.0);
    let mut failed_before = false;
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            _ = timer.tick() => {}
        }
        // boxed: an idle loop holds its timer, not room for a pass
        let pass = tokio::select! {
            () = token.cancelled() => return,
            r = Box::pin(gc.collect()) => r,
        };
        match pass {
            Ok(_) => {
                if failed_before {
                    tracing::info!(%node, "container garbage collection succeeded");
                }
                failed_before = false;
            }
            Err(error) => {
                tracing::error!(%node, %error, "container garbage collection failed");
                events.warning(&node_reference(&node), CONTAINER_GC_FAILED, error.to_string());
                failed_before = true;
            }
        }
    }
}

/// Collects unused images every `period` until `token` fires (not at all when the policy turns image GC off).
/// A failure is logged; a second one in a row is reported on the Node as `ImageGCFailed`.
pub async fn run_image_gc(
    gc: ImageGc,
    events: EventRecorder,
    node: String,
    period: Duration,
    token: CancellationToken,
) {
    if gc.policy().disabled() {
        tracing::info!(%node, "imageGCHighThresholdPercent is 100 and imageMaximumGCAge is 0: image garbage collection is off");
        return;
    }
    let mut timer = JitteredInterval::new(period, 0.0);
    let mut failed_before = false;
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            _ = timer.tick() => {}
        }
        let pass = tokio::select! {
            () = token.cancelled() => return,
            r = Box::pin(gc.collect()) => r,
        };
        match pass {
            Ok(freed) => {
                if failed_before {
                    tracing::info!(%node, freed, "image garbage collection succeeded");
                }
                failed_before = false;
            }
            Err(error) if failed_before => {
                tracing::error!(%node, %error, "image garbage collection failed multiple times in a row");
                events.warning(&node_reference(&node), IMAGE_GC_FAILED, error.to_string());
            }
            Err(error) => {
                tracing::error!(%node, %error, "image garbage collection failed once; stats may not be ready yet");
                failed_before = true;
            }
        }
    }
}

#[cfg(test)]
mod tests;
