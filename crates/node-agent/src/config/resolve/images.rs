//! The image settings: the garbage collector's disk thresholds and ages (`imageGCHighThresholdPercent`,
//! `imageGCLowThresholdPercent`, `imageMinimumGCAge`, `imageMaximumGCAge`) and how many pulls run at once
//! (`serializeImagePulls`, `maxParallelImagePulls`).

use std::time::Duration;

use crate::config::check::Check;
use crate::config::file::FileConfig;

/// The image settings, resolved.
pub(super) struct Images {
    pub(super) image_gc_high_threshold_percent: u8,
    pub(super) image_gc_low_threshold_percent: u8,
    pub(super) image_minimum_gc_age: Duration,
    pub(super) image_maximum_gc_age: Duration,
    pub(super) max_parallel_image_pulls: Option<u32>,
    pub(super) serialize_image_pulls: bool,
}

/// The image garbage collection and pull settings, checked as the kubelet checks them.
pub(super) fn images(c: &mut Check<'_>, f: &FileConfig) -> Images {
    let secs = Duration::from_secs;
    let image_gc_high_threshold_percent = c.percent(
        "imageGCHighThresholdPercent",
        f.image_gc_high_threshold_percent,
        85,
    );
    let image_gc_low_threshold_percent =
        c.percent("imageGCLowThresholdPercent", f.image_gc_low_threshold_percent, 80);
    if image_gc_low_threshold_percent >= image_gc_high_threshold_percent {
        c.err(
            "imageGCLowThresholdPercent",
            format!(
                "{image_gc_low_threshold_percent} must be less than imageGCHighThresholdPercent \
                 {image_gc_high_threshold_percent}"
            ),
        );
    }
    let image_minimum_gc_age = f.image_minimum_gc_age.unwrap_or(secs(120));
    let image_maximum_gc_age = f.image_maximum_gc_age.unwrap_or_default();
    if !image_maximum_gc_age.is_zero() && image_maximum_gc_age <= image_minimum_gc_age {
        c.err(
            "imageMaximumGCAge",
            format!(
                "{image_maximum_gc_age:?} must be greater than imageMinimumGCAge {image_minimum_gc_age:?}"
            ),
        );
    }

    let max_parallel_image_pulls = match f.max_parallel_image_pulls {
        None => None,
        Some(n) if n >= 1 => Some(u32::try_from(n).unwrap_or(u32::MAX)),
        Some(n) => {
            c.err("maxParallelImagePulls", format!("{n} must be at least 1"));
            None
        }
    };
    let serialize_image_pulls = f
        .serialize_image_pulls
        .unwrap_or(max_parallel_image_pulls.is_none_or(|n| n < 2));
    if serialize_image_pulls && max_parallel_image_pulls.is_some_and(|n| n > 1) {
        c.err(
            "maxParallelImagePulls",
            "must be 1 or unset when serializeImagePulls is true",
        );
    }
    Images {
        image_gc_high_threshold_percent,
        image_gc_low_threshold_percent,
        image_minimum_gc_age,
        image_maximum_gc_age,
        max_parallel_image_pulls,
        serialize_image_pulls,
    }
}
