//! Pod lifecycle metrics: per-stage start-up timing in hdrhistograms (exact, mergeable percentiles) and the
//! kubelet's Prometheus series.
//!
//! One [`PodMetrics`] is meant to be shared by every agent of a process (it is `Sync`; a hollow fleet hands the
//! same `Arc` to all its agents): its eight hdrhistograms are large once used (nothing before their first
//! samples).
//!
//! Stages follow the project vocabulary: `watch_observed` → `admitted` → `volumes_ready` → `sandbox_ready` →
//! `images_ready` → `containers_started` → `status_reported`. For every pod's first start, each stage records
//! the time since the previous stage (`watch_observed` records the time since the pod's creationTimestamp,
//! which has one-second resolution), and `pod_start` the whole `watch_observed` → `status_reported` span.
//!
//! Prometheus names (kubelet's where one exists): `kubelet_pod_start_sli_duration_seconds`,
//! `kubelet_pod_start_duration_seconds`, `kubelet_pod_worker_duration_seconds{operation}`,
//! `kubelet_runtime_operations_duration_seconds{operation_type}`,
//! `kubelet_runtime_operations_errors_total{operation_type}`, `kubelet_started_pods_total`,
//! `kubelet_started_containers_total{container_type}`, `kubelet_image_pull_duration_seconds`,
//! `prober_probe_total{probe_type,result}`, `kubelet_running_pods`, and our own
//! `node_agent_pod_start_stage_duration_seconds{stage}`.

use std::fmt;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

/// A start-up stage of a pod, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// The agent received the pod from its source.
    WatchObserved,
    /// Admission accepted it.
    Admitted,
    /// Its volumes are ready.
    VolumesReady,
    /// Its sandbox runs and has an IP.
    SandboxReady,
    /// Every container image is present.
    ImagesReady,
    /// Every app container has started.
    ContainersStarted,
    /// The API server acknowledged a Running status.
    StatusReported,
}

impl Stage {
    /// All stages in order.
    pub const ALL: [Stage; 7] = [
        Stage::WatchObserved,
        Stage::Admitted,
        Stage::VolumesReady,
        Stage::SandboxReady,
        Stage::ImagesReady,
        Stage::ContainersStarted,
        Stage::StatusReported,
    ];

    /// The stage's name in the project vocabulary.
    pub fn name(self) -> &'static str {
        match self {
            Stage::WatchObserved => "watch_observed",
            Stage::Admitted => "admitted",
            Stage::VolumesReady => "volumes_ready",
            Stage::SandboxReady => "sandbox_ready",
            Stage::ImagesReady => "images_ready",
            Stage::ContainersStarted => "containers_started",
            Stage::StatusReported => "status_reported",
        }
    }
}

/// When one pod reached each stage of its first start. Dropped once recorded.
#[derive(Debug, Clone)]
pub struct Timeline {
    marks: [Option<Instant>; 7],
    created: Option<Timestamp>,
    observed_wall: Timestamp,
    pulling: Duration,
}

impl Timeline {
    /// A timeline whose `watch_observed` is now.
    pub fn observed(created: Option<Timestamp>) -> Self {
        let mut marks = [None; 7];
        marks[0] = Some(Instant::now());
        Self {
            marks,
            created,
            observed_wall: Timestamp::now(),
            pulling: Duration::ZERO,
        }
    }

    /// Marks `stage` reached now, unless it was reached before.
    pub fn mark(&mut self, stage: Stage) {
        let slot = &mut self.marks[stage as usize];
        if slot.is_none() {
            *slot = Some(Instant::now());
        }
    }

    /// Whether `stage` was reached.
    pub fn reached(&self, stage: Stage) -> bool {
        self.marks[stage as usize].is_some()
    }

    /// Adds time spent pulling images (excluded from the SLI).
    pub fn add_pulling(&mut self, d: Duration) {
        self.pulling += d;
    }
}

const HDR_MAX_MICROS: u64 = 3_600_000_000;

/// An empty stage histogram: microseconds, 3 significant digits. Kept with `u32` counts (a stage would need 4
/// billion samples in one bucket to saturate it): half the memory of `u64` counts, and a fleet's histograms are
/// divided over its pods.
fn new_hdr<T: hdrhistogram::Counter>() -> Option<hdrhistogram::Histogram<T>> {
    // the bounds are constants hdrhistogram accepts, so this never yields None in practice
    hdrhistogram::Histogram::new_with_bounds(1, HDR_MAX_MICROS, 3).ok()
}

/// `h` with `u64` counts (what [`PodMetrics::stage_histogram`] hands out for merging).
fn widened(h: &hdrhistogram::Histogram<u32>) -> Option<hdrhistogram::Histogram<u64>> {
    let mut wide = new_hdr()?;
    for v in h.iter_recorded() {
        wide.saturating_record_n(v.value_iterated_to(), u64::from(v.count_at_value()));
    }
    Some(wide)
}

/// Percentiles of one stage, in milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct StageSummary {
    /// Stage name, or `pod_start` for the whole span.
    pub stage: &'static str,
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Maximum.
    pub max_ms: f64,
}

/// A printable table of [`StageSummary`] rows.
#[derive(Debug, Clone)]
pub struct StageReport(pub Vec<StageSummary>);

impl fmt::Display for StageReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<20} {:>6} {:>10} {:>10} {:>10} {:>10}",
            "stage", "count", "p50 ms", "p90 ms", "p99 ms", "max ms"
        )?;
        for s in &self.0 {
            writeln!(
                f,
                "{:<20} {:>6} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                s.stage, s.count, s.p50_ms, s.p90_ms, s.p99_ms, s.max_ms
            )?;
        }
        Ok(())
    }
}

type Labels = [(&'static str, &'static str); 1];
type HistFamily = Family<Labels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    ])
}

fn start_histogram() -> Histogram {
    Histogram::new([
        0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 300.0,
    ])
}

/// The lifecycle's metrics; share one per process.
#[derive(Debug)]
pub struct PodMetrics {
    /// One per stage plus the whole span, allocated on first use (large: see `new_hdr`).
    stages: Mutex<Vec<Option<hdrhistogram::Histogram<u32>>>>,
    pod_start_sli: Histogram,
    pod_start: Histogram,
    stage_seconds: HistFamily,
    worker: HistFamily,
    runtime_ops: HistFamily,
    runtime_errors: Family<Labels, Counter>,
    started_pods: Counter,
    started_containers: Family<Labels, Counter>,
    image_pull: Histogram,
    probes: Family<[(&'static str, &'static str); 2], Counter>,
    running_pods: Gauge,
}

impl Default for PodMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl PodMetrics {
    /// Empty metrics.
    pub fn new() -> Self {
        Self {
            // one per stage plus the whole span
            stages: Mutex::new(vec![None; Stage::ALL.len() + 1]),
            pod_start_sli: start_histogram(),
            pod_start: start_histogram(),
            stage_seconds: Family::new_with_constructor(latency_histogram),
            worker: Family::new_with_constructor(latency_histogram),
            runtime_ops: Family::new_with_constructor(latency_histogram),
            runtime_errors: Family::default(),
            started_pods: Counter::default(),
            started_containers: Family::default(),
            image_pull: Histogram::new([0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0]),
            probes: Family::default(),
            running_pods: Gauge::default(),
        }
    }

    /// Registers the Prometheus series into `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kubelet_pod_start_sli_duration_seconds",
            "Duration to start a pod, excluding image pulls, from creation to the agent reporting it running",
            self.pod_start_sli.clone(),
        );
        registry.register(
            "kubelet_pod_start_duration_seconds",
            "Duration from the agent seeing a pod for the first time to the pod running",
            self.pod_start.clone(),
        );
        registry.register(
            "node_agent_pod_start_stage_duration_seconds",
            "Time each pod start-up stage took, from the previous stage",
            self.stage_seconds.clone(),
        );
        registry.register(
            "kubelet_pod_worker_duration_seconds",
            "Duration of one pod sync, by operation (create, update, sync)",
            self.worker.clone(),
        );
        registry.register(
            "kubelet_runtime_operations_duration_seconds",
            "Duration of runtime operations, by operation type",
            self.runtime_ops.clone(),
        );
        registry.register(
            "kubelet_runtime_operations_errors",
            "Runtime operation errors, by operation type",
            self.runtime_errors.clone(),
        );
        registry.register("kubelet_started_pods", "Pods started", self.started_pods.clone());
        registry.register(
            "kubelet_started_containers",
            "Containers started, by container type",
            self.started_containers.clone(),
        );
        registry.register(
            "kubelet_image_pull_duration_seconds",
            "Duration of image pulls",
            self.image_pull.clone(),
        );
        registry.register(
            "prober_probe",
            "Probe results, by probe type and result",
            self.probes.clone(),
        );
        registry.register(
            "kubelet_running_pods",
            "Pods with a running sandbox",
            self.running_pods.clone(),
        );
    }

    /// Times one runtime call as `operation_type` and counts its failure.
    pub async fn runtime_op<T, E>(
        &self,
        op: &'static str,
        fut: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let start = Instant::now();
        let result = fut.await;
        self.runtime_ops
            .get_or_create(&[("operation_type", op)])
            .observe(start.elapsed().as_secs_f64());
        if result.is_err() {
            self.runtime_errors.get_or_create(&[("operation_type", op)]).inc();
        }
        result
    }

    pub(crate) fn worker_sync(&self, operation: &'static str, took: Duration) {
        self.worker
            .get_or_create(&[("operation", operation)])
            .observe(took.as_secs_f64());
    }

    pub(crate) fn container_started(&self, container_type: &'static str) {
        self.started_containers
            .get_or_create(&[("container_type", container_type)])
            .inc();
    }

    pub(crate) fn image_pulled(&self, took: Duration) {
        self.image_pull.observe(took.as_secs_f64());
    }

    pub(crate) fn probe(&self, probe_type: &'static str, result: &'static str) {
        self.probes
            .get_or_create(&[("probe_type", probe_type), ("result", result)])
            .inc();
    }

    pub(crate) fn running_pods(&self, delta: i64) {
        self.running_pods.inc_by(delta);
    }

    /// Records a finished start-up timeline (its `status_reported` is now).
    pub(crate) fn record_start(&self, mut timeline: Timeline) {
        timeline.mark(Stage::StatusReported);
        self.started_pods.inc();
        let mut samples: Vec<(usize, Duration)> = Vec::with_capacity(8);
        if let Some(created) = timeline.created {
            let d = timeline.observed_wall.duration_since(created);
            samples.push((0, Duration::try_from(d).unwrap_or_default()));
        }
        let mut prev = timeline.marks[0];
        for (i, mark) in timeline.marks.iter().enumerate().skip(1) {
            if let (Some(at), Some(p)) = (mark, prev) {
                samples.push((i, at.saturating_duration_since(p)));
                prev = Some(*at);
            }
        }
        let total = match (timeline.marks[0], timeline.marks[Stage::StatusReported as usize]) {
            (Some(a), Some(b)) => b.saturating_duration_since(a),
            _ => Duration::ZERO,
        };
        samples.push((Stage::ALL.len(), total));
        self.pod_start.observe(total.as_secs_f64());
        if let Some(created) = timeline.created {
            let since = Duration::try_from(Timestamp::now().duration_since(created)).unwrap_or_default();
            self.pod_start_sli
                .observe(since.saturating_sub(timeline.pulling).as_secs_f64());
        }
        for (i, d) in &samples {
            if let Some(stage) = Stage::ALL.get(*i) {
                self.stage_seconds
                    .get_or_create(&[("stage", stage.name())])
                    .observe(d.as_secs_f64());
            }
        }
        if let Ok(mut hdr) = self.stages.lock() {
            for (i, d) in samples {
                let micros = u64::try_from(d.as_micros())
                    .unwrap_or(u64::MAX)
                    .clamp(1, HDR_MAX_MICROS);
                if let Some(slot) = hdr.get_mut(i) {
                    if slot.is_none() {
                        *slot = new_hdr();
                    }
                    if let Some(h) = slot {
                        // saturating: the value is clamped into the histogram's range
                        h.saturating_record(micros);
                    }
                }
            }
        }
    }

    /// A copy of one stage's hdrhistogram (microseconds), for merging across agents or processes;
    /// `None` selects the whole `pod_start` span.
    pub fn stage_histogram(&self, stage: Option<Stage>) -> Option<hdrhistogram::Histogram<u64>> {
        let index = stage.map_or(Stage::ALL.len(), |s| s as usize);
        match self.stages.lock().ok()?.get(index)? {
            Some(h) => widened(h),
            None => new_hdr(),
        }
    }

    /// Per-stage percentiles so far.
    pub fn stage_report(&self) -> StageReport {
        let Ok(hdr) = self.stages.lock() else {
            return StageReport(Vec::new());
        };
        let names = Stage::ALL
            .iter()
            .map(|s| s.name())
            .chain(std::iter::once("pod_start"));
        let rows = names
            .zip(hdr.iter())
            .map(|(stage, h)| match h {
                None => StageSummary {
                    stage,
                    count: 0,
                    p50_ms: 0.0,
                    p90_ms: 0.0,
                    p99_ms: 0.0,
                    max_ms: 0.0,
                },
                Some(h) => {
                    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
                    StageSummary {
                        stage,
                        count: h.len(),
                        p50_ms: ms(0.5),
                        p90_ms: ms(0.9),
                        p99_ms: ms(0.99),
                        max_ms: h.max() as f64 / 1000.0,
                    }
                }
            })
            .collect();
        StageReport(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn stages_record_time_since_the_previous_stage() {
        let m = PodMetrics::new();
        let mut t = Timeline::observed(None);
        tokio::time::advance(Duration::from_millis(5)).await;
        t.mark(Stage::Admitted);
        t.mark(Stage::VolumesReady);
        tokio::time::advance(Duration::from_millis(100)).await;
        t.mark(Stage::SandboxReady);
        t.mark(Stage::SandboxReady); // second mark ignored
        tokio::time::advance(Duration::from_millis(200)).await;
        t.mark(Stage::ImagesReady);
        t.mark(Stage::ContainersStarted);
        tokio::time::advance(Duration::from_millis(50)).await;
        m.record_start(t);
        let report = m.stage_report();
        let row = |name: &str| report.0.iter().find(|r| r.stage == name).unwrap().clone();
        assert_eq!(row("admitted").count, 1);
        assert!((row("admitted").p50_ms - 5.0).abs() < 0.1);
        assert!((row("sandbox_ready").p50_ms - 100.0).abs() < 0.5);
        assert!((row("images_ready").p50_ms - 200.0).abs() < 0.5);
        assert!((row("status_reported").p50_ms - 50.0).abs() < 0.5);
        assert!((row("pod_start").p50_ms - 355.0).abs() < 1.0);
        assert_eq!(row("watch_observed").count, 0, "no creation time, no sample");
        let mut reg = Registry::default();
        m.register(&mut reg);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        assert!(
            text.contains("kubelet_pod_start_duration_seconds_count 1"),
            "{text}"
        );
        assert!(text.contains("kubelet_started_pods_total 1"), "{text}");
        assert!(
            text.contains("node_agent_pod_start_stage_duration_seconds_bucket{"),
            "{text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stage_histogram_hands_out_every_sample() {
        let m = PodMetrics::new();
        for ms in [3_u64, 40, 40, 900] {
            let mut t = Timeline::observed(None);
            tokio::time::advance(Duration::from_millis(ms)).await;
            t.mark(Stage::Admitted);
            m.record_start(t);
        }
        let h = m.stage_histogram(Some(Stage::Admitted)).expect("a histogram");
        assert_eq!(h.len(), 4);
        assert_eq!(h.count_between(39_000, 41_000), 2);
        assert!((h.max() as f64 / 1000.0 - 900.0).abs() < 1.0, "{}", h.max());
        let report = m.stage_report();
        let row = report.0.iter().find(|r| r.stage == "admitted").unwrap();
        assert_eq!(row.count, 4);
        assert!((h.value_at_quantile(0.5) as f64 / 1000.0 - row.p50_ms).abs() < 0.05);
        let none = m
            .stage_histogram(Some(Stage::SandboxReady))
            .expect("an empty histogram");
        assert_eq!(none.len(), 0);
    }
}
