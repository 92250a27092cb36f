//! Cluster-side pod start-up measurement, the way clusterloader2's PodStartupLatency measures it.
//!
//! A watch over the run's pods records, per pod: when it was first seen, first seen with `spec.nodeName`, and
//! first seen Running with every container started (the `watch` phase), plus the pod's own
//! `creationTimestamp` (the `create` phase) and the latest container `startedAt` (the `run` phase). The
//! `schedule` phase is the scheduler's `Scheduled` event time, as clusterloader2 takes it; a pod whose event
//! is missing falls back to the moment the watch first saw it bound. Transitions are the differences of
//! phases (`create_to_schedule`, `schedule_to_run`, `run_to_watch`, `schedule_to_watch`, `pod_startup`),
//! summarised by nearest-rank percentiles over the pods the SLO covers: pods with init containers or an
//! image pull are excluded, as the SLO definition excludes them.
//!
//! `creationTimestamp` and `startedAt` have one-second resolution (the API truncates them), so transitions
//! that start or end on them carry up to a second of truncation, as they do in clusterloader2.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

/// What the measurement knows about one pod.
#[derive(Debug, Clone)]
pub struct PodRecord {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The node it was bound to.
    pub node: Option<String>,
    /// `metadata.creationTimestamp` (one-second resolution).
    pub created: Option<Timestamp>,
    /// When the watch first saw the pod.
    pub first_seen: Timestamp,
    /// When the watch first saw it with `spec.nodeName`.
    pub bound_seen: Option<Timestamp>,
    /// The scheduler's `Scheduled` event time.
    pub scheduled_event: Option<Timestamp>,
    /// The latest `startedAt` of its containers once all run (one-second resolution).
    pub started: Option<Timestamp>,
    /// When the watch first saw it Running with every container started.
    pub running_seen: Option<Timestamp>,
    /// It has init containers (excluded from the SLO).
    pub init_containers: bool,
    /// Its node pulled an image for it (excluded from the SLO).
    pub pulled_image: bool,
    /// The watch saw it deleted.
    pub deleted: bool,
}

impl PodRecord {
    /// The `schedule` phase: the scheduler's event, else the watch's first sight of the binding.
    pub fn scheduled(&self) -> Option<Timestamp> {
        self.scheduled_event.or(self.bound_seen)
    }

    /// Whether the SLO covers this pod (stateless start-up without init containers or image pulls).
    pub fn in_slo(&self) -> bool {
        !self.init_containers && !self.pulled_image
    }

    /// The latency of `t` for this pod, in milliseconds (may be negative where a one-second timestamp is
    /// compared with a precise one), or `None` while a phase is missing.
    pub fn latency_ms(&self, t: Transition) -> Option<f64> {
        let (from, to) = match t {
            Transition::CreateToSchedule => (self.created?, self.scheduled()?),
            Transition::ScheduleToRun => (self.scheduled()?, self.started?),
            Transition::RunToWatch => (self.started?, self.running_seen?),
            Transition::ScheduleToWatch => (self.scheduled()?, self.running_seen?),
            Transition::PodStartup => (self.created?, self.running_seen?),
        };
        Some(to.duration_since(from).as_secs_f64() * 1000.0)
    }
}

/// A clusterloader2 PodStartupLatency transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Transition {
    /// `creationTimestamp` → scheduled.
    CreateToSchedule,
    /// Scheduled → the last container's `startedAt`.
    ScheduleToRun,
    /// `startedAt` → the watch sees it Running.
    RunToWatch,
    /// Scheduled → the watch sees it Running.
    ScheduleToWatch,
    /// `creationTimestamp` → the watch sees it Running: the SLO's figure.
    PodStartup,
}

impl Transition {
    /// All transitions in report order.
    pub const ALL: [Transition; 5] = [
        Transition::CreateToSchedule,
        Transition::ScheduleToRun,
        Transition::RunToWatch,
        Transition::ScheduleToWatch,
        Transition::PodStartup,
    ];

    /// clusterloader2's name.
    pub fn name(self) -> &'static str {
        match self {
            Transition::CreateToSchedule => "create_to_schedule",
            Transition::ScheduleToRun => "schedule_to_run",
            Transition::RunToWatch => "run_to_watch",
            Transition::ScheduleToWatch => "schedule_to_watch",
            Transition::PodStartup => "pod_startup",
        }
    }

    /// The transition named `name`.
    pub fn from_name(name: &str) -> Option<Transition> {
        Transition::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// Nearest-rank percentiles of one set of latencies, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct Percentiles {
    /// Samples.
    pub count: usize,
    /// 50th percentile.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Maximum (100th).
    pub max: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles (the value at rank ⌈n·p/100⌉ of the sorted samples, as clusterloader2 and
    /// the e2e framework compute them); all zero for no samples.
    pub fn nearest_rank(mut samples: Vec<f64>) -> Percentiles {
        if samples.is_empty() {
            return Percentiles::default();
        }
        samples.sort_by(f64::total_cmp);
        let n = samples.len();
        let at = |p: usize| samples[(n * p).div_ceil(100).max(1) - 1];
        Percentiles {
            count: n,
            p50: at(50),
            p90: at(90),
            p99: at(99),
            max: samples[n - 1],
        }
    }

    /// The value of percentile `p` (50, 90, 99 or 100).
    pub fn get(&self, p: u8) -> f64 {
        match p {
            50 => self.p50,
            90 => self.p90,
            99 => self.p99,
            _ => self.max,
        }
    }
}

/// Counts of the run's pods by phase, for progress and the report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Pods seen.
    pub seen: usize,
    /// Pods seen bound to a node.
    pub scheduled: usize,
    /// Pods seen Running with all containers started.
    pub running: usize,
}

/// The watch's per-pod records, keyed by pod UID (names may repeat across churn).
#[derive(Debug, Default)]
pub struct Recorder {
    pods: HashMap<String, PodRecord>,
    counts: Counts,
}

/// Every app container of `pod` has a running state with a start time; the latest of them.
fn all_started(pod: &Pod) -> Option<Timestamp> {
    let spec = pod.spec.as_ref()?;
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    if statuses.len() < spec.containers.len() {
        return None;
    }
    let mut latest: Option<Timestamp> = None;
    for s in statuses {
        let at = s.state.as_ref()?.running.as_ref()?.started_at.as_ref()?.0;
        latest = Some(latest.map_or(at, |l| l.max(at)));
    }
    latest
}

impl Recorder {
    /// Records what `pod` shows at `now` (the time the watch delivered it).
    pub fn observe(&mut self, pod: &Pod, now: Timestamp) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let counts = &mut self.counts;
        let rec = self.pods.entry(uid).or_insert_with(|| {
            counts.seen += 1;
            PodRecord {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                name: pod.metadata.name.clone().unwrap_or_default(),
                node: None,
                created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
                first_seen: now,
                bound_seen: None,
                scheduled_event: None,
                started: None,
                running_seen: None,
                init_containers: pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.init_containers.as_ref())
                    .is_some_and(|c| !c.is_empty()),
                pulled_image: false,
                deleted: false,
            }
        });
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        if rec.bound_seen.is_none() && node.is_some() {
            rec.bound_seen = Some(now);
            rec.node = node;
            counts.scheduled += 1;
        }
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        if rec.running_seen.is_none()
            && running
            && let Some(started) = all_started(pod)
        {
            rec.running_seen = Some(now);
            rec.started = Some(started);
            counts.running += 1;
        }
    }

    /// Sets the scheduler's `Scheduled` event time of the pod with UID `uid` (events name their pod's UID).
    pub fn scheduled_event(&mut self, uid: &str, at: Timestamp) {
        if let Some(rec) = self.pods.get_mut(uid) {
            rec.scheduled_event = Some(at);
        }
    }

    /// Marks the pod with UID `uid` as having pulled an image.
    pub fn pulled(&mut self, uid: &str) {
        if let Some(rec) = self.pods.get_mut(uid) {
            rec.pulled_image = true;
        }
    }

    /// Marks `pod` deleted (churn, or someone else's doing).
    pub fn deleted(&mut self, pod: &Pod) {
        if let Some(rec) = pod.metadata.uid.as_deref().and_then(|u| self.pods.get_mut(u)) {
            rec.deleted = true;
        }
    }

    /// Pods neither Running yet nor deleted.
    pub fn pending(&self) -> usize {
        self.pods
            .values()
            .filter(|r| r.running_seen.is_none() && !r.deleted)
            .count()
    }

    /// Pod counts by phase.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Every record.
    pub fn records(&self) -> Vec<PodRecord> {
        let mut v: Vec<PodRecord> = self.pods.values().cloned().collect();
        v.sort_by_key(|r| r.first_seen);
        v
    }
}

/// The cluster-side result of a run.
#[derive(Debug, Clone)]
pub struct ClusterSide {
    /// Per transition, over the pods the SLO covers.
    pub transitions: Vec<(Transition, Percentiles)>,
    /// Pods measured (seen by the watch).
    pub pods: usize,
    /// Pods that reached Running.
    pub running: usize,
    /// Excluded for init containers.
    pub excluded_init: usize,
    /// Excluded for an image pull.
    pub excluded_pull: usize,
    /// Pods whose schedule phase came from the watch, the scheduler's event being missing.
    pub schedule_from_watch: usize,
}

impl ClusterSide {
    /// Summarises `records`.
    pub fn from_records(records: &[PodRecord]) -> ClusterSide {
        let covered: Vec<&PodRecord> = records.iter().filter(|r| r.in_slo()).collect();
        let transitions = Transition::ALL
            .into_iter()
            .map(|t| {
                let samples = covered.iter().filter_map(|r| r.latency_ms(t)).collect();
                (t, Percentiles::nearest_rank(samples))
            })
            .collect();
        ClusterSide {
            transitions,
            pods: records.len(),
            running: records.iter().filter(|r| r.running_seen.is_some()).count(),
            excluded_init: records.iter().filter(|r| r.init_containers).count(),
            excluded_pull: records
                .iter()
                .filter(|r| r.pulled_image && !r.init_containers)
                .count(),
            schedule_from_watch: records
                .iter()
                .filter(|r| r.scheduled_event.is_none() && r.bound_seen.is_some())
                .count(),
        }
    }

    /// The percentiles of `t`.
    pub fn get(&self, t: Transition) -> Percentiles {
        self.transitions
            .iter()
            .find(|(x, _)| *x == t)
            .map(|(_, p)| *p)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_takes_the_sample_at_the_ceiling_rank() {
        let p = Percentiles::nearest_rank((1..=100).map(f64::from).rev().collect());
        assert_eq!(
            (p.count, p.p50, p.p90, p.p99, p.max),
            (100, 50.0, 90.0, 99.0, 100.0)
        );
        // 10 samples: rank ⌈9.9⌉ = 10 for p99, ⌈5⌉ = 5 for p50
        let p = Percentiles::nearest_rank((1..=10).map(f64::from).collect());
        assert_eq!((p.p50, p.p90, p.p99), (5.0, 9.0, 10.0));
        let p = Percentiles::nearest_rank(vec![7.0]);
        assert_eq!((p.p50, p.p99, p.max), (7.0, 7.0, 7.0));
        assert_eq!(Percentiles::nearest_rank(vec![]).count, 0);
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn pod(phase: &str, node: Option<&str>, started: Option<&str>, init: bool) -> Pod {
        let mut v = serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1",
                "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": phase},
        });
        if let Some(n) = node {
            v["spec"]["nodeName"] = n.into();
        }
        if init {
            v["spec"]["initContainers"] = serde_json::json!([{"name": "i", "image": "i"}]);
        }
        if let Some(s) = started {
            v["status"]["containerStatuses"] = serde_json::json!([{"name": "c", "image": "i", "imageID": "",
                "ready": true, "restartCount": 0, "state": {"running": {"startedAt": s}}}]);
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn phases_come_from_first_sightings_and_the_pods_own_timestamps() {
        let mut r = Recorder::default();
        r.observe(&pod("Pending", None, None, false), ts("2026-01-01T00:00:00.100Z"));
        r.observe(
            &pod("Pending", Some("n1"), None, false),
            ts("2026-01-01T00:00:00.300Z"),
        );
        r.observe(
            &pod("Pending", Some("n1"), None, false),
            ts("2026-01-01T00:00:00.900Z"),
        );
        // Running but the container not started yet: not the run phase
        r.observe(
            &pod("Running", Some("n1"), None, false),
            ts("2026-01-01T00:00:01.000Z"),
        );
        r.observe(
            &pod("Running", Some("n1"), Some("2026-01-01T00:00:01Z"), false),
            ts("2026-01-01T00:00:01.500Z"),
        );
        r.observe(
            &pod("Running", Some("n1"), Some("2026-01-01T00:00:01Z"), false),
            ts("2026-01-01T00:00:09Z"),
        );
        assert_eq!(
            r.counts(),
            Counts {
                seen: 1,
                scheduled: 1,
                running: 1
            }
        );
        let rec = &r.records()[0];
        let ms = |t| rec.latency_ms(t).unwrap();
        assert_eq!(
            ms(Transition::CreateToSchedule),
            300.0,
            "from the watch without an event"
        );
        r.scheduled_event("u1", ts("2026-01-01T00:00:00.250Z"));
        let rec = &r.records()[0];
        let ms = |t| rec.latency_ms(t).unwrap();
        assert_eq!(
            ms(Transition::CreateToSchedule),
            250.0,
            "the scheduler's event wins"
        );
        assert_eq!(ms(Transition::ScheduleToRun), 750.0);
        assert_eq!(ms(Transition::RunToWatch), 500.0);
        assert_eq!(ms(Transition::ScheduleToWatch), 1250.0);
        assert_eq!(ms(Transition::PodStartup), 1500.0);
        let side = ClusterSide::from_records(&r.records());
        assert_eq!(side.get(Transition::PodStartup).p99, 1500.0);
        assert_eq!(side.schedule_from_watch, 0);
    }

    #[test]
    fn init_containers_and_pulls_are_outside_the_slo() {
        let mut r = Recorder::default();
        let mut a = pod("Running", Some("n"), Some("2026-01-01T00:00:01Z"), true);
        a.metadata.uid = Some("a".into());
        a.metadata.name = Some("a".into());
        let mut b = pod("Running", Some("n"), Some("2026-01-01T00:00:01Z"), false);
        b.metadata.uid = Some("b".into());
        b.metadata.name = Some("b".into());
        let mut c = b.clone();
        c.metadata.uid = Some("c".into());
        c.metadata.name = Some("c".into());
        for p in [&a, &b, &c] {
            r.observe(p, ts("2026-01-01T00:00:02Z"));
        }
        r.pulled("b");
        let side = ClusterSide::from_records(&r.records());
        assert_eq!(
            (side.pods, side.running, side.excluded_init, side.excluded_pull),
            (3, 3, 1, 1)
        );
        assert_eq!(side.get(Transition::PodStartup).count, 1);
    }
}
