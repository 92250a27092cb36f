//! Cluster-side pod start-up measurement, the way clusterloader2's PodStartupLatency measures it.
//!
//! A watch over the run's pods records, per pod and to the nanosecond of this machine's clock, when it was
//! first seen, first seen with `spec.nodeName` and first seen in phase `Running`; beside those it keeps the
//! pod's own `creationTimestamp`, the latest `startedAt` of its running containers and the scheduler's
//! `Scheduled` event time. A [`Definition`] turns them into the phases `create`, `schedule`, `run` and
//! `watch`:
//!
//! * [`Definition::Current`], clusterloader2's today: every phase is the watch's own first sighting (`create`
//!   when first seen, `schedule` when first seen bound, `run` and `watch` both when first seen Running);
//! * [`Definition::Legacy`], clusterloader2's before it took every phase from its watch: `create` is
//!   `creationTimestamp`, `schedule` the `Scheduled` event (the watch's first sight of the binding when the
//!   event is missing), `run` the latest container `startedAt`, `watch` the first sighting Running. The API
//!   truncates `creationTimestamp` and `startedAt` to the second, so its transitions carry up to a second of
//!   truncation.
//!
//! Transitions are differences of phases (`create_to_schedule`, `schedule_to_run`, `run_to_watch`,
//! `schedule_to_watch`, `create_to_run`, `pod_startup`); a negative one counts as 0, as clusterloader2 counts
//! it. They are summarised by nearest-rank percentiles over every pod, and again over the pods without an image
//! pull or init containers (the SLO definition's exclusions) as a view of its own.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

/// How phases are taken from what the watch saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Definition {
    /// Every phase from the measuring watch's own first sightings, at full precision.
    #[default]
    Current,
    /// `creationTimestamp`, the `Scheduled` event, the latest container `startedAt` (one-second resolution
    /// for the first and the last), and the watch's first sighting Running: for comparing with runs published
    /// before clusterloader2 changed.
    Legacy,
}

impl Definition {
    /// The flag's value.
    pub fn name(self) -> &'static str {
        match self {
            Definition::Current => "current",
            Definition::Legacy => "legacy",
        }
    }
}

/// A phase of a pod's start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The pod exists.
    Create,
    /// It is bound to a node.
    Schedule,
    /// Its containers run.
    Run,
    /// The measuring watch sees it Running.
    Watch,
}

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
    /// The latest `startedAt` of its running containers when first seen Running (one-second resolution).
    pub started: Option<Timestamp>,
    /// When the watch first saw it in phase Running.
    pub running_seen: Option<Timestamp>,
    /// It has init containers (outside the SLO definition).
    pub init_containers: bool,
    /// Its node pulled an image for it (outside the SLO definition).
    pub pulled_image: bool,
    /// The watch saw it deleted.
    pub deleted: bool,
}

impl PodRecord {
    /// Whether the SLO definition covers this pod (no init containers, no image pull).
    pub fn in_slo(&self) -> bool {
        !self.init_containers && !self.pulled_image
    }

    /// When this pod reached `phase` under `definition`, if it did.
    pub fn phase(&self, definition: Definition, phase: Phase) -> Option<Timestamp> {
        match (definition, phase) {
            (Definition::Current, Phase::Create) => Some(self.first_seen),
            (Definition::Current, Phase::Schedule) => self.bound_seen,
            (Definition::Current, Phase::Run) => self.running_seen,
            (Definition::Legacy, Phase::Create) => self.created,
            (Definition::Legacy, Phase::Schedule) => self.scheduled_event.or(self.bound_seen),
            (Definition::Legacy, Phase::Run) => self.started,
            (_, Phase::Watch) => self.running_seen,
        }
    }

    /// The latency of `t` for this pod under `definition`, in milliseconds, as it is measured (negative where
    /// a one-second timestamp is compared with a precise one), or `None` while a phase is missing.
    pub fn raw_latency_ms(&self, definition: Definition, t: Transition) -> Option<f64> {
        let (from, to) = t.phases();
        let (from, to) = (self.phase(definition, from)?, self.phase(definition, to)?);
        Some(to.duration_since(from).as_secs_f64() * 1000.0)
    }

    /// The latency of `t` as clusterloader2 counts it: a negative one is 0.
    pub fn latency_ms(&self, definition: Definition, t: Transition) -> Option<f64> {
        self.raw_latency_ms(definition, t).map(|ms| ms.max(0.0))
    }
}

/// A clusterloader2 PodStartupLatency transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Transition {
    /// Created → scheduled.
    CreateToSchedule,
    /// Scheduled → running.
    ScheduleToRun,
    /// Running → the watch sees it Running (0 under the current definition, where the two are one).
    RunToWatch,
    /// Scheduled → the watch sees it Running.
    ScheduleToWatch,
    /// Created → running.
    CreateToRun,
    /// Created → the watch sees it Running: the SLO's figure.
    PodStartup,
}

impl Transition {
    /// All transitions in report order.
    pub const ALL: [Transition; 6] = [
        Transition::CreateToSchedule,
        Transition::ScheduleToRun,
        Transition::RunToWatch,
        Transition::ScheduleToWatch,
        Transition::CreateToRun,
        Transition::PodStartup,
    ];

    /// clusterloader2's name.
    pub fn name(self) -> &'static str {
        match self {
            Transition::CreateToSchedule => "create_to_schedule",
            Transition::ScheduleToRun => "schedule_to_run",
            Transition::RunToWatch => "run_to_watch",
            Transition::ScheduleToWatch => "schedule_to_watch",
            Transition::CreateToRun => "create_to_run",
            Transition::PodStartup => "pod_startup",
        }
    }

    /// The transition named `name`.
    pub fn from_name(name: &str) -> Option<Transition> {
        Transition::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The phases it goes from and to.
    pub fn phases(self) -> (Phase, Phase) {
        match self {
            Transition::CreateToSchedule => (Phase::Create, Phase::Schedule),
            Transition::ScheduleToRun => (Phase::Schedule, Phase::Run),
            Transition::RunToWatch => (Phase::Run, Phase::Watch),
            Transition::ScheduleToWatch => (Phase::Schedule, Phase::Watch),
            Transition::CreateToRun => (Phase::Create, Phase::Run),
            Transition::PodStartup => (Phase::Create, Phase::Watch),
        }
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
    /// Pods seen Running.
    pub running: usize,
}

/// The watch's per-pod records, keyed by pod UID (names may repeat across churn).
#[derive(Debug, Default)]
pub struct Recorder {
    pods: HashMap<String, PodRecord>,
    counts: Counts,
}

/// The latest `startedAt` of `pod`'s running containers.
fn latest_started(pod: &Pod) -> Option<Timestamp> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses
        .iter()
        .filter_map(|s| Some(s.state.as_ref()?.running.as_ref()?.started_at.as_ref()?.0))
        .max()
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
        if rec.running_seen.is_none() && running {
            rec.running_seen = Some(now);
            rec.started = latest_started(pod);
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

/// One transition summarised over a set of pods.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TransitionSummary {
    /// The transition.
    pub transition: Transition,
    /// Its percentiles, negatives counted as 0.
    pub percentiles: Percentiles,
    /// Pods whose latency was negative as measured and counts as 0.
    pub clamped: usize,
}

/// Every transition over one set of pods.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct View {
    /// Pods in the set.
    pub pods: usize,
    /// One summary per transition, in report order.
    pub transitions: Vec<TransitionSummary>,
}

impl View {
    /// Summarises `records` under `definition`.
    pub fn of<'a>(records: impl Iterator<Item = &'a PodRecord> + Clone, definition: Definition) -> View {
        let transitions = Transition::ALL
            .into_iter()
            .map(|t| {
                let raw: Vec<f64> = records
                    .clone()
                    .filter_map(|r| r.raw_latency_ms(definition, t))
                    .collect();
                let clamped = raw.iter().filter(|ms| **ms < 0.0).count();
                TransitionSummary {
                    transition: t,
                    percentiles: Percentiles::nearest_rank(raw.into_iter().map(|ms| ms.max(0.0)).collect()),
                    clamped,
                }
            })
            .collect();
        View {
            pods: records.count(),
            transitions,
        }
    }

    /// The percentiles of `t` (all zero when absent).
    pub fn get(&self, t: Transition) -> Percentiles {
        self.transitions
            .iter()
            .find(|s| s.transition == t)
            .map(|s| s.percentiles)
            .unwrap_or_default()
    }
}

/// The cluster-side result of a run.
#[derive(Debug, Clone)]
pub struct ClusterSide {
    /// How the phases were taken.
    pub definition: Definition,
    /// Every pod the watch saw: the figures the verdicts are checked against.
    pub all: View,
    /// The pods without an image pull or init containers.
    pub without_pull_or_init: View,
    /// Pods measured (seen by the watch).
    pub pods: usize,
    /// Pods that reached Running.
    pub running: usize,
    /// Pods with init containers.
    pub init_containers: usize,
    /// Pods without init containers whose node pulled an image for them.
    pub pulled_image: usize,
    /// Pods whose legacy schedule phase came from the watch, the scheduler's event being missing.
    pub schedule_from_watch: usize,
}

impl ClusterSide {
    /// Summarises `records` under `definition`.
    pub fn from_records(records: &[PodRecord], definition: Definition) -> ClusterSide {
        ClusterSide {
            definition,
            all: View::of(records.iter(), definition),
            without_pull_or_init: View::of(records.iter().filter(|r| r.in_slo()), definition),
            pods: records.len(),
            running: records.iter().filter(|r| r.running_seen.is_some()).count(),
            init_containers: records.iter().filter(|r| r.init_containers).count(),
            pulled_image: records
                .iter()
                .filter(|r| r.pulled_image && !r.init_containers)
                .count(),
            schedule_from_watch: match definition {
                Definition::Current => 0,
                Definition::Legacy => records
                    .iter()
                    .filter(|r| r.scheduled_event.is_none() && r.bound_seen.is_some())
                    .count(),
            },
        }
    }

    /// The percentiles of `t` over every pod.
    pub fn get(&self, t: Transition) -> Percentiles {
        self.all.get(t)
    }
}

/// A cluster side whose every-pod view holds only pod_startup with `samples`, for the report's tests.
#[cfg(test)]
pub(crate) fn side_with_pod_startup(samples: Vec<f64>) -> ClusterSide {
    let pods = samples.len();
    let all = View {
        pods,
        transitions: vec![TransitionSummary {
            transition: Transition::PodStartup,
            percentiles: Percentiles::nearest_rank(samples),
            clamped: 0,
        }],
    };
    ClusterSide {
        definition: Definition::Current,
        without_pull_or_init: all.clone(),
        all,
        pods,
        running: pods,
        init_containers: 0,
        pulled_image: 0,
        schedule_from_watch: 0,
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

    fn pod(uid: &str, phase: &str, node: Option<&str>, started: Option<&str>, init: bool) -> Pod {
        let mut v = serde_json::json!({
            "metadata": {"name": uid, "namespace": "ns", "uid": uid,
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

    /// A pod created at 00:00:00.7 (its `creationTimestamp` says 00:00:00), seen bound 12.5 ms later, its
    /// container started at 00:00:00.731 (`startedAt` says 00:00:00), seen Running at 00:00:00.7461.
    fn fast_pod() -> Recorder {
        let mut r = Recorder::default();
        r.observe(
            &pod("u1", "Pending", None, None, false),
            ts("2026-01-01T00:00:00.7001Z"),
        );
        r.observe(
            &pod("u1", "Pending", Some("n1"), None, false),
            ts("2026-01-01T00:00:00.7126Z"),
        );
        // a later bound update moves nothing
        r.observe(
            &pod("u1", "Pending", Some("n1"), None, false),
            ts("2026-01-01T00:00:00.7200Z"),
        );
        r.observe(
            &pod("u1", "Running", Some("n1"), Some("2026-01-01T00:00:00Z"), false),
            ts("2026-01-01T00:00:00.7461Z"),
        );
        r.observe(
            &pod("u1", "Running", Some("n1"), Some("2026-01-01T00:00:00Z"), false),
            ts("2026-01-01T00:00:09Z"),
        );
        r.scheduled_event("u1", ts("2026-01-01T00:00:00.7110Z"));
        r
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn the_current_definition_takes_every_phase_from_the_watch_at_full_precision() {
        let r = fast_pod();
        assert_eq!(
            r.counts(),
            Counts {
                seen: 1,
                scheduled: 1,
                running: 1
            }
        );
        let rec = &r.records()[0];
        let ms = |t| rec.latency_ms(Definition::Current, t).unwrap();
        assert!(close(ms(Transition::CreateToSchedule), 12.5));
        assert!(close(ms(Transition::ScheduleToRun), 33.5));
        assert_eq!(ms(Transition::RunToWatch), 0.0, "run and watch are one phase");
        assert!(close(ms(Transition::ScheduleToWatch), 33.5));
        assert!(close(ms(Transition::CreateToRun), 46.0));
        assert!(close(ms(Transition::PodStartup), 46.0));
        let side = ClusterSide::from_records(&r.records(), Definition::Current);
        assert!(close(side.get(Transition::PodStartup).p99, 46.0));
        assert!(side.all.transitions.iter().all(|s| s.clamped == 0));
    }

    #[test]
    fn the_legacy_definition_takes_one_second_timestamps_and_clamps_what_goes_negative() {
        let r = fast_pod();
        let rec = &r.records()[0];
        let raw = |t| rec.raw_latency_ms(Definition::Legacy, t).unwrap();
        // creationTimestamp and startedAt both say 00:00:00: 0.7 s of truncation on each
        assert!(
            close(raw(Transition::CreateToSchedule), 711.0),
            "to the scheduler's event"
        );
        assert!(close(raw(Transition::ScheduleToRun), -711.0));
        assert!(close(raw(Transition::RunToWatch), 746.1));
        assert!(close(raw(Transition::ScheduleToWatch), 35.1));
        assert_eq!(raw(Transition::CreateToRun), 0.0);
        assert!(close(raw(Transition::PodStartup), 746.1));
        assert_eq!(
            rec.latency_ms(Definition::Legacy, Transition::ScheduleToRun),
            Some(0.0),
            "a negative latency counts as 0"
        );
        let side = ClusterSide::from_records(&r.records(), Definition::Legacy);
        let s2r = side.all.transitions[1];
        assert_eq!(s2r.transition, Transition::ScheduleToRun);
        assert_eq!(
            (s2r.percentiles.p50, s2r.percentiles.max, s2r.clamped),
            (0.0, 0.0, 1)
        );
        assert_eq!(side.schedule_from_watch, 0);

        // without the scheduler's event the legacy schedule phase is the watch's first sight of the binding
        let mut r = Recorder::default();
        r.observe(
            &pod("u2", "Pending", Some("n1"), None, false),
            ts("2026-01-01T00:00:00.300Z"),
        );
        let side = ClusterSide::from_records(&r.records(), Definition::Legacy);
        assert!(close(side.get(Transition::CreateToSchedule).p50, 300.0));
        assert_eq!(side.schedule_from_watch, 1);
        assert_eq!(
            side.get(Transition::PodStartup).count,
            0,
            "never Running: no sample"
        );
    }

    #[test]
    fn percentiles_count_negatives_as_zero_and_say_how_many() {
        let mut r = Recorder::default();
        // ten pods bound 100 ms after creation whose startedAt lies 100·i ms before the binding
        for i in 0..10u32 {
            let uid = format!("u{i}");
            r.observe(
                &pod(&uid, "Pending", None, None, false),
                ts("2026-01-01T00:00:01Z"),
            );
            r.scheduled_event(&uid, ts("2026-01-01T00:00:01.100Z"));
            let started = Timestamp::from_millisecond(
                ts("2026-01-01T00:00:01.100Z").as_millisecond() - 100 * i64::from(i) + 50,
            )
            .unwrap();
            r.observe(
                &pod(&uid, "Running", Some("n"), Some(&started.to_string()), false),
                ts("2026-01-01T00:00:02Z"),
            );
        }
        let side = ClusterSide::from_records(&r.records(), Definition::Legacy);
        let s2r = side.all.transitions[1];
        // raw: 50, -50, -150, …, -850: nine clamped to 0, one 50
        assert_eq!(s2r.clamped, 9);
        assert_eq!(
            (
                s2r.percentiles.count,
                s2r.percentiles.p50,
                s2r.percentiles.p90,
                s2r.percentiles.max
            ),
            (10, 0.0, 0.0, 50.0)
        );
    }

    #[test]
    fn every_pod_counts_and_pulls_and_init_containers_are_a_view_of_their_own() {
        let mut r = Recorder::default();
        let a = pod("a", "Running", Some("n"), Some("2026-01-01T00:00:01Z"), true);
        let b = pod("b", "Running", Some("n"), Some("2026-01-01T00:00:01Z"), false);
        let c = pod("c", "Running", Some("n"), Some("2026-01-01T00:00:01Z"), false);
        for p in [&a, &b, &c] {
            r.observe(p, ts("2026-01-01T00:00:02Z"));
        }
        r.pulled("b");
        let side = ClusterSide::from_records(&r.records(), Definition::Current);
        assert_eq!(
            (side.pods, side.running, side.init_containers, side.pulled_image),
            (3, 3, 1, 1)
        );
        assert_eq!(side.all.pods, 3);
        assert_eq!(side.get(Transition::PodStartup).count, 3, "every pod");
        assert_eq!(side.without_pull_or_init.pods, 1);
        assert_eq!(side.without_pull_or_init.get(Transition::PodStartup).count, 1);
    }
}
