//! When the node status is written, decided at every status computation.
//!
//! This module owns [`ReportPolicy`]: it remembers fingerprints of what the API server last received and when,
//! and decides for each computed status whether to PATCH `nodes/status` and with which parts. A write happens
//! when the conditions changed (heartbeat times are not part of their fingerprint), when the static part
//! (addresses, capacity, nodeInfo, ...) or the image list changed, when `nodeStatusReportFrequency` passed since
//! the last write, or when forced; the conditions are always in the patch, the other parts only when they
//! changed. It also says when the image list is due to be read from the runtime again. No I/O: the caller passes
//! the time and reports back what it wrote.

use std::time::Duration;

use tokio::time::Instant;

/// How often the image list is re-read from the runtime.
pub const IMAGE_REFRESH: Duration = Duration::from_secs(30);

/// Fingerprints of one computed status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprints {
    /// Of the conditions, heartbeat times excluded ([`NodeConditions::fingerprint`](super::NodeConditions::fingerprint)).
    pub conditions: u64,
    /// Of the parts that only change with the runtime's version and handlers (or never).
    pub static_part: u64,
    /// Of the image list; `None` when it could not be read.
    pub images: Option<u64>,
}

/// What one status write carries besides the conditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WritePlan {
    /// Addresses, capacity/allocatable, nodeInfo, daemon endpoints, runtime handlers, features.
    pub static_part: bool,
    /// The image list.
    pub images: bool,
}

/// Fingerprints of what the API server last received.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Reported {
    conditions: Option<u64>,
    static_part: Option<u64>,
    images: Option<u64>,
}

/// The write-or-skip decision of the node status loop.
#[derive(Debug, Clone)]
pub struct ReportPolicy {
    report_frequency: Duration,
    reported: Reported,
    last_report: Option<Instant>,
    images_read: Option<Instant>,
}

impl ReportPolicy {
    /// A policy that has reported nothing yet and writes unchanged status every `report_frequency`.
    pub fn new(report_frequency: Duration) -> Self {
        Self {
            report_frequency,
            reported: Reported::default(),
            last_report: None,
            images_read: None,
        }
    }

    /// Whether the status computed at `now` (fingerprinted `fps`) is to be written, and with which parts.
    /// `force` writes even when nothing changed. Nothing is remembered until [`written`](Self::written).
    pub fn plan(&self, now: Instant, fps: &Fingerprints, force: bool) -> Option<WritePlan> {
        let report_due = self
            .last_report
            .is_none_or(|t| now.saturating_duration_since(t) >= self.report_frequency);
        let static_part = self.reported.static_part != Some(fps.static_part);
        let images = fps.images.is_some() && self.reported.images != fps.images;
        let changed = self.reported.conditions != Some(fps.conditions) || static_part || images;
        (changed || report_due || force).then_some(WritePlan { static_part, images })
    }

    /// The API server received the status fingerprinted `fps` at `at` (a write, or the Node's creation).
    pub fn written(&mut self, at: Instant, fps: &Fingerprints) {
        self.reported = Reported {
            conditions: Some(fps.conditions),
            static_part: Some(fps.static_part),
            images: fps.images,
        };
        self.last_report = Some(at);
    }

    /// What the API server has is unknown (a Node found or re-read): the next write sends every part.
    pub fn forget(&mut self) {
        self.reported = Reported::default();
    }

    /// Whether to read the image list at `now`: every [`IMAGE_REFRESH`], and at every computation while no
    /// list has been reported.
    pub fn images_due(&self, now: Instant) -> bool {
        self.reported.images.is_none()
            || self
                .images_read
                .is_none_or(|t| now.saturating_duration_since(t) >= IMAGE_REFRESH)
    }

    /// The image list was read at `at`.
    pub fn images_read(&mut self, at: Instant) {
        self.images_read = Some(at);
    }

    /// Whether the image list fingerprinted `fingerprint` is what the API server has.
    pub fn images_reported(&self, fingerprint: u64) -> bool {
        self.reported.images == Some(fingerprint)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::config::KubeletConfig;
    use crate::node::{ConditionInputs, NodeConditions};

    const STATIC: u64 = 7;
    const IMAGES: u64 = 11;

    /// Recomputes the conditions at wall time `secs` (a new heartbeat) and fingerprints the status.
    fn compute(c: &mut NodeConditions, inputs: &ConditionInputs, secs: i64) -> Fingerprints {
        c.update(inputs, Timestamp::from_second(secs).unwrap());
        Fingerprints {
            conditions: c.fingerprint(),
            static_part: STATIC,
            images: Some(IMAGES),
        }
    }

    fn ready() -> ConditionInputs {
        ConditionInputs::default()
    }

    fn not_ready() -> ConditionInputs {
        ConditionInputs {
            not_ready: vec!["container runtime is down".into()],
            ..Default::default()
        }
    }

    const ONLY_CONDITIONS: WritePlan = WritePlan {
        static_part: false,
        images: false,
    };
    const EVERYTHING: WritePlan = WritePlan {
        static_part: true,
        images: true,
    };

    #[tokio::test(start_paused = true)]
    async fn unchanged_status_is_written_only_when_the_report_frequency_passed() {
        let kubelet = KubeletConfig::default();
        assert_eq!(kubelet.node_status_update_frequency, Duration::from_secs(10));
        assert_eq!(kubelet.node_status_report_frequency, Duration::from_secs(300));
        let mut policy = ReportPolicy::new(kubelet.node_status_report_frequency);
        let mut c = NodeConditions::unknown();
        let fps = compute(&mut c, &ready(), 0);
        assert_eq!(
            policy.plan(Instant::now(), &fps, false),
            Some(EVERYTHING),
            "nothing reported yet: the first computation is written at once, whole"
        );
        policy.written(Instant::now(), &fps);

        // A computation every 10 s; only the heartbeat moves.
        let mut writes = Vec::new();
        for step in 1..=35 {
            tokio::time::advance(kubelet.node_status_update_frequency).await;
            let fps = compute(&mut c, &ready(), step * 10);
            if let Some(plan) = policy.plan(Instant::now(), &fps, false) {
                assert_eq!(plan, ONLY_CONDITIONS, "a heartbeat-only report");
                policy.written(Instant::now(), &fps);
                writes.push(step * 10);
            }
        }
        assert_eq!(writes, vec![300], "one report in 350 s, at the 5 minute mark");
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_is_written_at_the_next_computation_with_only_the_changed_parts() {
        let mut policy = ReportPolicy::new(Duration::from_secs(300));
        let mut c = NodeConditions::unknown();
        let fps = compute(&mut c, &ready(), 0);
        policy.written(Instant::now(), &fps);

        tokio::time::advance(Duration::from_secs(10)).await;
        let down = compute(&mut c, &not_ready(), 10);
        assert_eq!(policy.plan(Instant::now(), &down, false), Some(ONLY_CONDITIONS));
        // the write failed: the change is still pending at the next computation
        tokio::time::advance(Duration::from_secs(10)).await;
        let down = compute(&mut c, &not_ready(), 20);
        assert_eq!(policy.plan(Instant::now(), &down, false), Some(ONLY_CONDITIONS));
        policy.written(Instant::now(), &down);
        assert_eq!(policy.plan(Instant::now(), &down, false), None);

        let new_runtime = Fingerprints {
            static_part: STATIC + 1,
            ..down
        };
        assert_eq!(
            policy.plan(Instant::now(), &new_runtime, false),
            Some(WritePlan {
                static_part: true,
                images: false
            })
        );
        let new_images = Fingerprints {
            images: Some(IMAGES + 1),
            ..down
        };
        assert_eq!(
            policy.plan(Instant::now(), &new_images, false),
            Some(WritePlan {
                static_part: false,
                images: true
            })
        );
        let unreadable_images = Fingerprints { images: None, ..down };
        assert_eq!(
            policy.plan(Instant::now(), &unreadable_images, false),
            None,
            "a failed image listing is not a change"
        );
        assert_eq!(policy.plan(Instant::now(), &down, true), Some(ONLY_CONDITIONS));
    }

    #[tokio::test(start_paused = true)]
    async fn forgetting_resends_every_part_and_a_short_report_frequency_is_honoured() {
        let mut policy = ReportPolicy::new(Duration::from_secs(10));
        let mut c = NodeConditions::unknown();
        let fps = compute(&mut c, &ready(), 0);
        policy.written(Instant::now(), &fps);
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert_eq!(policy.plan(Instant::now(), &fps, false), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(policy.plan(Instant::now(), &fps, false), Some(ONLY_CONDITIONS));
        policy.written(Instant::now(), &fps);

        policy.forget();
        assert_eq!(policy.plan(Instant::now(), &fps, false), Some(EVERYTHING));
    }

    #[tokio::test(start_paused = true)]
    async fn the_image_list_is_read_every_thirty_seconds_once_reported() {
        let mut policy = ReportPolicy::new(Duration::from_secs(300));
        let t0 = Instant::now();
        assert!(policy.images_due(t0), "never read");
        policy.images_read(t0);
        assert!(policy.images_due(t0), "read but never reported: read again");
        let mut c = NodeConditions::unknown();
        let fps = compute(&mut c, &ready(), 0);
        policy.written(t0, &fps);
        assert!(policy.images_reported(IMAGES));
        assert!(!policy.images_reported(IMAGES + 1));
        tokio::time::advance(Duration::from_secs(29)).await;
        assert!(!policy.images_due(Instant::now()));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(policy.images_due(Instant::now()));
    }
}
