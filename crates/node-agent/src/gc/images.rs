//! The image garbage collector of one node, as the kubelet's: it keeps a record per image (when it was first
//! seen, when last seen in use, its size), and removes unused images least recently used first.
//!
//! A pass ([`ImageGc::collect`]): refresh the records (an image is in use while any container — running or
//! not — was made from it); with `imageMaximumGCAge` set and the agent up longer than that, remove images
//! unused for longer; then, when the image filesystem is at least `imageGCHighThresholdPercent` full, free
//! bytes down to `imageGCLowThresholdPercent`, skipping images first seen less than `imageMinimumGCAge` ago.
//! Never removed: an image in use, one the runtime pins, the runtime's sandbox (pause) image. When not enough
//! could be freed the node gets a `FreeDiskSpaceFailed` warning with the kubelet's message; the loop in
//! [`super`] adds `ImageGCFailed` when passes fail twice in a row.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use runtime_api::{Runtime, RuntimeError, cri};
use tokio::time::Instant;

use super::image_fs::ImageFsSource;
use crate::events::EventRecorder;
use crate::metrics::Metrics;

/// Event reason: not enough could be freed.
pub const FREE_DISK_SPACE_FAILED: &str = "FreeDiskSpaceFailed";
/// Event reason: the image filesystem reports no capacity.
pub const INVALID_DISK_CAPACITY: &str = "InvalidDiskCapacity";

/// The image GC policy (KubeletConfiguration `imageGC*`, `image*GCAge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImagePolicy {
    /// Usage percent at which collection starts.
    pub high_threshold_percent: u8,
    /// Usage percent collection frees down to.
    pub low_threshold_percent: u8,
    /// Images first seen less than this long ago are kept.
    pub min_age: Duration,
    /// Images unused longer than this are removed whatever the usage (zero: never).
    pub max_age: Duration,
}

impl ImagePolicy {
    /// The policy of a resolved KubeletConfiguration.
    pub fn from_config(k: &crate::config::KubeletConfig) -> Self {
        Self {
            high_threshold_percent: k.image_gc_high_threshold_percent,
            low_threshold_percent: k.image_gc_low_threshold_percent,
            min_age: k.image_minimum_gc_age,
            max_age: k.image_maximum_gc_age,
        }
    }

    /// Whether collection is off (the kubelet's rule: a high threshold of 100 and no maximum age).
    pub fn disabled(&self) -> bool {
        self.high_threshold_percent >= 100 && self.max_age.is_zero()
    }
}

/// Why an image GC pass failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageGcError {
    /// A runtime call failed.
    #[error("{op}: {source}")]
    Runtime {
        /// The call.
        op: &'static str,
        /// The runtime's error.
        #[source]
        source: RuntimeError,
    },
    /// The image filesystem's size could not be told.
    #[error("image filesystem stats: {0}")]
    Stats(String),
    /// The image filesystem reports a capacity of 0.
    #[error("invalid capacity 0 on image filesystem")]
    InvalidCapacity,
    /// Some removals failed.
    #[error(
        "wanted to free {wanted} bytes, but freed {freed} bytes space with errors in image deletion: {errors}"
    )]
    Removal {
        /// Bytes wanted.
        wanted: u64,
        /// Bytes freed.
        freed: u64,
        /// The errors, joined.
        errors: String,
    },
    /// Removing images older than the maximum age failed.
    #[error("wanted to free images older than {max_age:?}, encountered errors in image deletion: {errors}")]
    OldImages {
        /// The maximum age.
        max_age: Duration,
        /// The errors, joined.
        errors: String,
    },
    /// Not enough could be freed (also reported as a `FreeDiskSpaceFailed` event).
    #[error("{0}")]
    NotEnoughFreed(String),
}

/// What the collector knows of one image.
#[derive(Debug, Clone, Copy)]
struct Record {
    first_detected: Instant,
    /// `None`: never seen in use (oldest of all).
    last_used: Option<Instant>,
    size: u64,
    pinned: bool,
}

/// The image garbage collector of one node. Cheap to clone; passes never overlap.
#[derive(Clone)]
pub struct ImageGc {
    inner: Arc<Inner>,
}

struct Inner {
    runtime: Arc<dyn Runtime>,
    policy: ImagePolicy,
    fs: Arc<dyn ImageFsSource>,
    events: EventRecorder,
    node: String,
    metrics: Arc<Metrics>,
    /// When the collector started (maximum-age removals wait until it has run that long).
    began: Instant,
    records: tokio::sync::Mutex<HashMap<Box<str>, Record>>,
}

impl std::fmt::Debug for ImageGc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageGc")
            .field("policy", &self.inner.policy)
            .finish_non_exhaustive()
    }
}

/// An unused image that may be removed.
#[derive(Debug, Clone)]
struct Candidate {
    id: Box<str>,
    record: Record,
}

impl ImageGc {
    /// A collector for `runtime` with `policy`, measuring the image filesystem with `fs`, reporting events
    /// about node `node` through `events`.
    pub fn new(
        runtime: Arc<dyn Runtime>,
        policy: ImagePolicy,
        fs: Arc<dyn ImageFsSource>,
        events: EventRecorder,
        node: impl Into<String>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                runtime,
                policy,
                fs,
                events,
                node: node.into(),
                metrics,
                began: Instant::now(),
                records: tokio::sync::Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The policy.
    pub fn policy(&self) -> ImagePolicy {
        self.inner.policy
    }

    /// One periodic pass (the kubelet's `GarbageCollect`); answers the bytes freed.
    pub async fn collect(&self) -> Result<u64, ImageGcError> {
        let mut records = self.inner.records.lock().await;
        let now = Instant::now();
        let candidates = self.candidates(&mut records, now).await?;
        let (candidates, mut freed) = self.free_old(&mut records, candidates, now).await?;
        let fs = self.inner.fs.image_fs().await.map_err(ImageGcError::Stats)?;
        let capacity = fs.capacity_bytes;
        let available = fs.available_bytes.min(capacity);
        if capacity == 0 {
            let error = ImageGcError::InvalidCapacity;
            self.warn(INVALID_DISK_CAPACITY, error.to_string());
            return Err(error);
        }
        let usage = 100 - u128::from(available) * 100 / u128::from(capacity);
        let policy = &self.inner.policy;
        if usage >= u128::from(policy.high_threshold_percent) {
            let target = u128::from(capacity) * u128::from(100 - policy.low_threshold_percent) / 100;
            let wanted = u64::try_from(target.saturating_sub(u128::from(available))).unwrap_or(u64::MAX);
            tracing::info!(
                usage = %format!("{usage}%"),
                high = policy.high_threshold_percent,
                low = policy.low_threshold_percent,
                wanted,
                "disk usage on the image filesystem is over the high threshold, freeing bytes down to the low threshold"
            );
            let got = self
                .free_space(&mut records, &candidates, wanted, now, "space")
                .await?;
            freed += got;
            if got < wanted {
                let message = format!(
                    "Insufficient free disk space on the node's image filesystem ({usage}% of {} used). \
                     Failed to free sufficient space by deleting unused images (freed {got} bytes). \
                     Investigate disk usage, as it could be used by active images, logs, volumes, or other data.",
                    format_size(capacity)
                );
                self.warn(FREE_DISK_SPACE_FAILED, message.clone());
                return Err(ImageGcError::NotEnoughFreed(message));
            }
        }
        if freed > 0 {
            tracing::info!(node = %self.inner.node, freed, "image garbage collection freed bytes");
        }
        Ok(freed)
    }

    /// Removes every unused image old enough (`imageMinimumGCAge`), whatever the disk usage (the kubelet's
    /// `DeleteUnusedImages`, run before evicting pods for disk pressure); answers the bytes freed.
    pub async fn delete_unused_images(&self) -> Result<u64, ImageGcError> {
        tracing::info!("attempting to delete unused images");
        let mut records = self.inner.records.lock().await;
        let now = Instant::now();
        let candidates = self.candidates(&mut records, now).await?;
        self.free_space(&mut records, &candidates, u64::MAX, now, "space")
            .await
    }

    fn warn(&self, reason: &str, message: String) {
        let node = crate::events::node_reference(&self.inner.node);
        self.inner.events.warning(&node, reason, message);
    }

    /// Refreshes the records from the runtime and answers the unused, unpinned images that are not the
    /// sandbox image, least recently used first (ties: first detected first).
    async fn candidates(
        &self,
        records: &mut HashMap<Box<str>, Record>,
        now: Instant,
    ) -> Result<Vec<Candidate>, ImageGcError> {
        let rt = &self.inner.runtime;
        let images = rt
            .list_images(cri::ListImagesRequest::default())
            .await
            .map_err(|source| ImageGcError::Runtime {
                op: "ListImages",
                source,
            })?
            .images;
        let containers = rt
            .list_containers(cri::ListContainersRequest::default())
            .await
            .map_err(|source| ImageGcError::Runtime {
                op: "ListContainers",
                source,
            })?
            .containers;
        let mut in_use: HashSet<&str> = HashSet::new();
        for c in &containers {
            in_use.extend([c.image_ref.as_str(), c.image_id.as_str()]);
            if let Some(spec) = &c.image {
                in_use.insert(spec.image.as_str());
            }
        }
        in_use.remove("");
        let sandbox = self.sandbox_images().await;
        let names = |i: &cri::Image| -> Vec<String> {
            std::iter::once(i.id.clone())
                .chain(i.repo_tags.iter().cloned())
                .chain(i.repo_digests.iter().cloned())
                .collect()
        };
        let mut current: HashSet<&str> = HashSet::new();
        let mut out = Vec::new();
        for image in &images {
            current.insert(&image.id);
            let all = names(image);
            let used = all.iter().any(|n| in_use.contains(n.as_str()));
            let is_sandbox = all.iter().any(|n| sandbox.contains(n));
            let record = records.entry(image.id.as_str().into()).or_insert_with(|| Record {
                first_detected: now,
                last_used: None,
                size: 0,
                pinned: false,
            });
            if used {
                record.last_used = Some(now);
            }
            record.size = image.size;
            record.pinned = image.pinned;
            if !used && !image.pinned && !is_sandbox {
                out.push(Candidate {
                    id: image.id.as_str().into(),
                    record: *record,
                });
            }
        }
        records.retain(|id, _| current.contains(&**id));
        out.sort_by_key(|c| (c.record.last_used, c.record.first_detected));
        Ok(out)
    }

    /// The runtime's sandbox image, from its verbose status: containerd reports its configuration there
    /// (`sandboxImage`; containerd 2 also pins it). Empty when the runtime does not tell.
    async fn sandbox_images(&self) -> Vec<String> {
        let status = self
            .inner
            .runtime
            .status(cri::StatusRequest { verbose: true })
            .await;
        let mut out = Vec::new();
        if let Ok(status) = status {
            for text in status.info.values() {
                if let Ok(value) = serde_json::from_str::<serde_json::Value>(text) {
                    find_sandbox_images(&value, &mut out);
                }
            }
        }
        out
    }

    /// With a maximum age, once the collector has run that long: removes candidates unused for longer.
    async fn free_old(
        &self,
        records: &mut HashMap<Box<str>, Record>,
        candidates: Vec<Candidate>,
        now: Instant,
    ) -> Result<(Vec<Candidate>, u64), ImageGcError> {
        let max_age = self.inner.policy.max_age;
        if max_age.is_zero() || now.duration_since(self.inner.began) <= max_age {
            return Ok((candidates, 0));
        }
        let mut left = Vec::with_capacity(candidates.len());
        let mut errors = Vec::new();
        let mut freed = 0;
        for c in candidates {
            let unused_for = c.record.last_used.map(|t| now.duration_since(t));
            if unused_for.is_none_or(|d| d > max_age) {
                match self.remove(records, &c, "age").await {
                    Ok(()) => freed += c.record.size,
                    Err(e) => {
                        errors.push(e.to_string());
                        left.push(c);
                    }
                }
            } else {
                left.push(c);
            }
        }
        if errors.is_empty() {
            Ok((left, freed))
        } else {
            Err(ImageGcError::OldImages {
                max_age,
                errors: errors.join("; "),
            })
        }
    }

    /// Removes candidates (least recently used first) until `wanted` bytes are freed; images first seen less
    /// than the minimum age ago are kept.
    async fn free_space(
        &self,
        records: &mut HashMap<Box<str>, Record>,
        candidates: &[Candidate],
        wanted: u64,
        now: Instant,
        reason: &'static str,
    ) -> Result<u64, ImageGcError> {
        let mut freed: u64 = 0;
        let mut errors = Vec::new();
        for c in candidates {
            if now.duration_since(c.record.first_detected) < self.inner.policy.min_age {
                continue;
            }
            match self.remove(records, c, reason).await {
                Ok(()) => freed = freed.saturating_add(c.record.size),
                Err(e) => {
                    errors.push(e.to_string());
                    continue;
                }
            }
            if freed >= wanted {
                break;
            }
        }
        if errors.is_empty() {
            Ok(freed)
        } else {
            Err(ImageGcError::Removal {
                wanted,
                freed,
                errors: errors.join("; "),
            })
        }
    }

    async fn remove(
        &self,
        records: &mut HashMap<Box<str>, Record>,
        c: &Candidate,
        reason: &'static str,
    ) -> Result<(), RuntimeError> {
        tracing::info!(image = %c.id, size = c.record.size, reason, "removing image to free bytes");
        let req = cri::RemoveImageRequest {
            image: Some(cri::ImageSpec {
                image: c.id.to_string(),
                ..Default::default()
            }),
        };
        match self.inner.runtime.remove_image(req).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
        records.remove(&c.id);
        self.inner.metrics.image_collected(reason);
        Ok(())
    }
}

/// Collects `sandboxImage` strings and `pinnedImages.sandbox` from a runtime's verbose status.
fn find_sandbox_images(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("sandboxImage", serde_json::Value::String(s)) if !s.is_empty() => out.push(s.clone()),
                    ("pinnedImages", serde_json::Value::Object(pinned)) => {
                        if let Some(serde_json::Value::String(s)) = pinned.get("sandbox") {
                            out.push(s.clone());
                        }
                    }
                    _ => find_sandbox_images(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| find_sandbox_images(v, out)),
        _ => {}
    }
}

/// A size as the kubelet writes it in the `FreeDiskSpaceFailed` message (`12.5 GiB`).
fn format_size(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let size = bytes as f64;
    if size < KIB {
        format!("{bytes} B")
    } else if size < KIB * KIB {
        format!("{:.1} KiB", size / KIB)
    } else if size < KIB * KIB * KIB {
        format!("{:.1} MiB", size / (KIB * KIB))
    } else if size < KIB * KIB * KIB * KIB {
        format!("{:.1} GiB", size / (KIB * KIB * KIB))
    } else {
        format!("{:.1} TiB", size / (KIB * KIB * KIB * KIB))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_the_kubelets() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(10 << 20), "10.0 MiB");
        assert_eq!(format_size(100 << 30), "100.0 GiB");
    }

    #[test]
    fn the_sandbox_image_is_found_in_containerds_status() {
        let mut out = Vec::new();
        let v16: serde_json::Value = serde_json::from_str(
            r#"{"containerd": {"snapshotter": "overlayfs"}, "sandboxImage": "localhost/pause:local"}"#,
        )
        .unwrap();
        find_sandbox_images(&v16, &mut out);
        let v2: serde_json::Value = serde_json::from_str(
            r#"{"images": {"pinnedImages": {"sandbox": "registry.k8s.io/pause:3.10"}}}"#,
        )
        .unwrap();
        find_sandbox_images(&v2, &mut out);
        assert_eq!(out, ["localhost/pause:local", "registry.k8s.io/pause:3.10"]);
    }
}
