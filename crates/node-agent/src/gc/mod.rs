//! Garbage collection of one node: dead containers, their sandboxes and logs, and unused images.
//!
//! This module owns deciding what of the runtime's contents is no longer needed and removing it, on two timers
//! as the kubelet runs them:
//!
//! | collector | period | what | failure |
//! |---|---|---|---|
//! | [`ContainerGc`] | 1 min (`--container-gc-period`) | [`ContainerGc::collect`]: dead containers by the policy of `--minimum-container-ttl-duration`, `--maximum-dead-containers-per-container`, `--maximum-dead-containers`; everything of pods that are gone; inactive sandboxes; log files and directories (real node) | `ContainerGCFailed` event |
//! | [`ImageGc`] | 5 min (`--image-gc-period`) | [`ImageGc::collect`]: `imageMaximumGCAge`, then `imageGCHighThresholdPercent` → `imageGCLowThresholdPercent`, least recently used first | `FreeDiskSpaceFailed`, `ImageGCFailed` (second failure in a row) events |
//!
//! [`run`] drives both in one task per node. The first pass of each comes at a random point within its first
//! period, so the thousands of agents of a hollow fleet do not all list their runtimes at once; idle, the task
//! holds two timers. Which pods still exist
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

pub use containers::{ContainerGc, ContainerGcError, ContainerGcReport};
pub use image_fs::{FsStats, ImageFsKind, ImageFsSource, RuntimeImageFs};
pub use images::{FREE_DISK_SPACE_FAILED, INVALID_DISK_CAPACITY, ImageGc, ImageGcError, ImagePolicy};
pub use select::{ContainerPolicy, Scope};

use crate::density::periodic::JitteredInterval;
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

/// How often each collector runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Periods {
    /// Dead containers (the kubelet's: 1 min).
    pub containers: Duration,
    /// Unused images (the kubelet's: 5 min).
    pub images: Duration,
}

/// Runs both collectors until dropped (the agent drops it where it waits when its token fires, see
/// `agent::supervise`; a pass in progress is dropped with it), each on its own timer (one task per node: a
/// hollow fleet runs thousands). A failed container pass is logged and reported on the Node as
/// `ContainerGCFailed`; a failed image pass is logged, and reported as `ImageGCFailed` when the one before failed
/// too. Image collection is off when its policy says so.
pub fn run(
    gc: GarbageCollectors,
    events: EventRecorder,
    node: String,
    periods: Periods,
    timer: crate::density::timer::Timer,
) -> impl Future<Output = ()> + Send + 'static {
    // made before the loop's future: the periods they are made from would be kept in it for good
    let mut containers = JitteredInterval::new(periods.containers, 0.0);
    let mut images = if gc.images.policy().disabled() {
        tracing::info!(%node, "imageGCHighThresholdPercent is 100 and imageMaximumGCAge is 0: image garbage collection is off");
        None
    } else {
        Some(JitteredInterval::new(periods.images, 0.0))
    };
    async move {
        let (mut containers_failed, mut images_failed) = (false, false);
        loop {
            // one sleep for both timers: each would otherwise keep a sleep of its own in the idle task
            let due = images
                .as_ref()
                .map_or(containers.deadline(), |i| i.deadline().min(containers.deadline()));
            timer.sleep_until(due).await;
            // the earlier of the two was due; the other, if due too, runs on the next turn
            let now = tokio::time::Instant::now();
            let images_due = match images.as_mut() {
                Some(timer) if timer.deadline() <= containers.deadline() => {
                    timer.advance(now);
                    true
                }
                _ => {
                    containers.advance(now);
                    false
                }
            };
            // boxed: an idle loop holds its timers, not room for a pass
            if images_due {
                let pass = Box::pin(gc.images.collect()).await;
                image_outcome(pass, &events, &node, &mut images_failed);
            } else {
                let pass = Box::pin(gc.containers.collect()).await;
                container_outcome(pass, &events, &node, &mut containers_failed);
            }
        }
    }
}

fn container_outcome(
    pass: Result<ContainerGcReport, ContainerGcError>,
    events: &EventRecorder,
    node: &str,
    failed_before: &mut bool,
) {
    match pass {
        Ok(_) => {
            if *failed_before {
                tracing::info!(%node, "container garbage collection succeeded");
            }
            *failed_before = false;
        }
        Err(error) => {
            tracing::error!(%node, %error, "container garbage collection failed");
            events.warning(&node_reference(node), CONTAINER_GC_FAILED, error.to_string());
            *failed_before = true;
        }
    }
}

fn image_outcome(
    pass: Result<u64, ImageGcError>,
    events: &EventRecorder,
    node: &str,
    failed_before: &mut bool,
) {
    match pass {
        Ok(freed) => {
            if *failed_before {
                tracing::info!(%node, freed, "image garbage collection succeeded");
            }
            *failed_before = false;
        }
        Err(error) if *failed_before => {
            tracing::error!(%node, %error, "image garbage collection failed multiple times in a row");
            events.warning(&node_reference(node), IMAGE_GC_FAILED, error.to_string());
        }
        Err(error) => {
            tracing::error!(%node, %error, "image garbage collection failed once; stats may not be ready yet");
            *failed_before = true;
        }
    }
}

#[cfg(test)]
mod tests;
