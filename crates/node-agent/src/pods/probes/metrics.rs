//! One node's per-probe series, served at `/metrics/probes` as the kubelet serves them:
//!
//! * `prober_probe_total{container,namespace,pod,pod_uid,probe_type,result}` — probe runs by result
//!   (`successful`, `failed`, `unknown`);
//! * `prober_probe_duration_seconds{container,namespace,pod,probe_type}` — how long a probe took, observed for
//!   successful and unknown runs (the kubelet does not time failed ones), with the Prometheus default buckets.
//!
//! A pod's series exist while its prober runs: [`ProbeMetrics::pod`] registers them and the returned
//! [`PodProbeMetrics`] removes them when dropped, as the kubelet deletes a probe worker's series when the worker
//! stops — so a hollow fleet holds series only for pods it runs. A probe's series survive its container's
//! restarts (the kubelet keeps one worker per pod, container and probe type). Each probe costs one small
//! [`ProbeSeries`] (counts and buckets, no label strings: those are read from the pod at scrape time).

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::pods::model::spec::DesiredPod;
use crate::pods::probes::{ProbeKind, ProbeOutcome};

/// Upper bounds of the duration buckets in seconds: the Prometheus client's defaults, which the kubelet uses.
const BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// The probe series of one node's pods. One per agent (node-scoped, like `/metrics/resource`).
#[derive(Debug, Default)]
pub struct ProbeMetrics {
    pods: Mutex<Vec<Arc<PodSeries>>>,
}

/// The series of one pod's probes.
#[derive(Debug)]
struct PodSeries {
    pod: Arc<DesiredPod>,
    probes: Mutex<Vec<ProbeSeries>>,
}

/// The counts of one (container, probe type).
#[derive(Debug, Clone)]
pub(crate) struct ProbeSeries {
    /// The container's position among the pod's init containers followed by its app containers.
    container: u16,
    kind: ProbeKind,
    successful: u32,
    failed: u32,
    unknown: u32,
    /// Observations per bucket (not cumulative); the last counts those above every bound.
    buckets: [u32; BUCKETS.len() + 1],
    sum: f64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn container_name(pod: &DesiredPod, index: u16) -> Option<&str> {
    let all = pod.init_containers.iter().chain(pod.containers.iter());
    all.clone().nth(usize::from(index)).map(|c| c.name.as_str())
}

fn container_index(pod: &DesiredPod, name: &str) -> Option<u16> {
    let all = pod.init_containers.iter().chain(pod.containers.iter());
    all.clone()
        .position(|c| c.name == name)
        .and_then(|i| u16::try_from(i).ok())
}

impl ProbeMetrics {
    /// Registers `pod`'s series (empty until its first probe runs); they go when the handle is dropped.
    pub(crate) fn pod(self: &Arc<Self>, pod: Arc<DesiredPod>) -> PodProbeMetrics {
        let series = Arc::new(PodSeries {
            pod,
            probes: Mutex::new(Vec::new()),
        });
        lock(&self.pods).push(series.clone());
        PodProbeMetrics {
            node: self.clone(),
            series,
        }
    }

    /// How many pods have series (running probers).
    pub fn pods(&self) -> usize {
        lock(&self.pods).len()
    }

    /// The Prometheus text exposition of every series.
    pub fn encode(&self) -> String {
        let pods = lock(&self.pods).clone();
        let mut out = String::with_capacity(256 + pods.len() * 512);
        out.push_str(
            "# HELP prober_probe_total [BETA] Cumulative number of a liveness, readiness or startup probe for a \
             container by result.\n# TYPE prober_probe_total counter\n",
        );
        for p in &pods {
            let probes = lock(&p.probes);
            for s in probes.iter() {
                let Some(container) = container_name(&p.pod, s.container) else {
                    continue;
                };
                for (result, n) in [
                    ("successful", s.successful),
                    ("failed", s.failed),
                    ("unknown", s.unknown),
                ] {
                    if n > 0 {
                        let _ = writeln!(
                            out,
                            "prober_probe_total{{container=\"{}\",namespace=\"{}\",pod=\"{}\",pod_uid=\"{}\",\
                             probe_type=\"{}\",result=\"{result}\"}} {n}",
                            escape(container),
                            escape(&p.pod.namespace),
                            escape(&p.pod.name),
                            escape(&p.pod.uid),
                            s.kind.as_str(),
                        );
                    }
                }
            }
        }
        out.push_str(
            "# HELP prober_probe_duration_seconds [ALPHA] Duration in seconds for a probe response.\n\
             # TYPE prober_probe_duration_seconds histogram\n",
        );
        for p in &pods {
            let probes = lock(&p.probes);
            for s in probes.iter() {
                let count: u64 = s.buckets.iter().map(|&b| u64::from(b)).sum();
                let Some(container) = container_name(&p.pod, s.container).filter(|_| count > 0) else {
                    continue;
                };
                let labels = format!(
                    "container=\"{}\",namespace=\"{}\",pod=\"{}\",probe_type=\"{}\"",
                    escape(container),
                    escape(&p.pod.namespace),
                    escape(&p.pod.name),
                    s.kind.as_str(),
                );
                let mut cumulative = 0u64;
                for (bound, n) in BUCKETS.iter().zip(&s.buckets) {
                    cumulative += u64::from(*n);
                    let _ = writeln!(
                        out,
                        "prober_probe_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {cumulative}"
                    );
                }
                let _ = writeln!(
                    out,
                    "prober_probe_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {count}\n\
                     prober_probe_duration_seconds_sum{{{labels}}} {}\n\
                     prober_probe_duration_seconds_count{{{labels}}} {count}",
                    s.sum
                );
            }
        }
        out
    }
}

/// A prober's handle on its pod's series; dropping it removes them from the node's exposition.
#[derive(Debug)]
pub(crate) struct PodProbeMetrics {
    node: Arc<ProbeMetrics>,
    series: Arc<PodSeries>,
}

impl PodProbeMetrics {
    /// Records one run of `container`'s `kind` probe that gave `outcome` after `took`.
    pub(crate) fn record(&self, container: &str, kind: ProbeKind, outcome: &ProbeOutcome, took: Duration) {
        let Some(index) = container_index(&self.series.pod, container) else {
            return;
        };
        let mut probes = lock(&self.series.probes);
        let at = match probes.iter().position(|s| s.container == index && s.kind == kind) {
            Some(at) => at,
            None => {
                probes.push(ProbeSeries {
                    container: index,
                    kind,
                    successful: 0,
                    failed: 0,
                    unknown: 0,
                    buckets: [0; BUCKETS.len() + 1],
                    sum: 0.0,
                });
                probes.len() - 1
            }
        };
        let s = &mut probes[at];
        let counter = match outcome {
            ProbeOutcome::Success | ProbeOutcome::Warning(_) => &mut s.successful,
            ProbeOutcome::Failure(_) => &mut s.failed,
            ProbeOutcome::Unknown(_) => &mut s.unknown,
        };
        *counter = counter.saturating_add(1);
        // the kubelet times successful and unknown probes only
        if !matches!(outcome, ProbeOutcome::Failure(_)) {
            let secs = took.as_secs_f64();
            let bucket = BUCKETS.iter().position(|&b| secs <= b).unwrap_or(BUCKETS.len());
            s.buckets[bucket] = s.buckets[bucket].saturating_add(1);
            s.sum += secs;
        }
    }
}

impl Drop for PodProbeMetrics {
    fn drop(&mut self) {
        lock(&self.node.pods).retain(|p| !Arc::ptr_eq(p, &self.series));
    }
}

fn escape(value: &str) -> std::borrow::Cow<'_, str> {
    if value.contains(['\\', '"', '\n']) {
        value
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
            .into()
    } else {
        value.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::model::spec::DesiredPod;

    fn pod(name: &str) -> Arc<DesiredPod> {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
            "spec": {
                "initContainers": [{"name": "init", "image": "busybox"}],
                "containers": [{"name": "web", "image": "busybox"}, {"name": "side\"car", "image": "busybox"}],
            },
        }))
        .unwrap();
        DesiredPod::from_pod(&pod).unwrap()
    }

    #[test]
    fn exposition_has_the_kubelets_names_labels_and_buckets() {
        let node = Arc::new(ProbeMetrics::default());
        let p = node.pod(pod("a"));
        let ms = Duration::from_millis;
        p.record("web", ProbeKind::Readiness, &ProbeOutcome::Success, ms(3));
        p.record("web", ProbeKind::Readiness, &ProbeOutcome::Success, ms(30));
        p.record(
            "web",
            ProbeKind::Readiness,
            &ProbeOutcome::Failure("no".into()),
            ms(7),
        );
        p.record(
            "side\"car",
            ProbeKind::Liveness,
            &ProbeOutcome::Failure("x".into()),
            ms(1),
        );
        p.record(
            "side\"car",
            ProbeKind::Liveness,
            &ProbeOutcome::Unknown("x".into()),
            ms(20_000),
        );
        let text = node.encode();
        let has = |line: &str| assert!(text.lines().any(|l| l == line), "{line}\nnot in\n{text}");
        has("# TYPE prober_probe_total counter");
        has("# TYPE prober_probe_duration_seconds histogram");
        has(
            r#"prober_probe_total{container="web",namespace="default",pod="a",pod_uid="uid-a",probe_type="Readiness",result="successful"} 2"#,
        );
        has(
            r#"prober_probe_total{container="web",namespace="default",pod="a",pod_uid="uid-a",probe_type="Readiness",result="failed"} 1"#,
        );
        has(
            r#"prober_probe_total{container="side\"car",namespace="default",pod="a",pod_uid="uid-a",probe_type="Liveness",result="unknown"} 1"#,
        );
        // a result that never happened has no series, as in the kubelet
        assert!(
            !text.contains(r#"probe_type="Readiness",result="unknown""#),
            "{text}"
        );
        // failed runs are not timed: two observations (3 ms, 30 ms)
        has(
            r#"prober_probe_duration_seconds_bucket{container="web",namespace="default",pod="a",probe_type="Readiness",le="0.005"} 1"#,
        );
        has(
            r#"prober_probe_duration_seconds_bucket{container="web",namespace="default",pod="a",probe_type="Readiness",le="0.025"} 1"#,
        );
        has(
            r#"prober_probe_duration_seconds_bucket{container="web",namespace="default",pod="a",probe_type="Readiness",le="0.05"} 2"#,
        );
        has(
            r#"prober_probe_duration_seconds_bucket{container="web",namespace="default",pod="a",probe_type="Readiness",le="+Inf"} 2"#,
        );
        has(
            r#"prober_probe_duration_seconds_count{container="web",namespace="default",pod="a",probe_type="Readiness"} 2"#,
        );
        has(
            r#"prober_probe_duration_seconds_sum{container="web",namespace="default",pod="a",probe_type="Readiness"} 0.033"#,
        );
        // above the last bound: only in +Inf
        has(
            r#"prober_probe_duration_seconds_bucket{container="side\"car",namespace="default",pod="a",probe_type="Liveness",le="10"} 0"#,
        );
        has(
            r#"prober_probe_duration_seconds_bucket{container="side\"car",namespace="default",pod="a",probe_type="Liveness",le="+Inf"} 1"#,
        );
    }

    #[test]
    fn a_pods_series_go_with_its_prober() {
        let node = Arc::new(ProbeMetrics::default());
        let a = node.pod(pod("a"));
        let b = node.pod(pod("b"));
        a.record("init", ProbeKind::Startup, &ProbeOutcome::Success, Duration::ZERO);
        b.record("web", ProbeKind::Liveness, &ProbeOutcome::Success, Duration::ZERO);
        // a container the pod does not have records nothing
        b.record(
            "nope",
            ProbeKind::Liveness,
            &ProbeOutcome::Success,
            Duration::ZERO,
        );
        assert_eq!(node.pods(), 2);
        assert!(node.encode().contains(r#"pod="a""#));
        drop(a);
        let text = node.encode();
        assert_eq!(node.pods(), 1);
        assert!(!text.contains(r#"pod="a""#), "{text}");
        assert!(text.contains(r#"pod="b""#), "{text}");
        assert!(!text.contains("nope"), "{text}");
        drop(b);
        assert_eq!(node.pods(), 0);
        assert!(!node.encode().contains("prober_probe_total{"));
    }

    #[test]
    fn a_probes_series_are_small() {
        assert!(size_of::<ProbeSeries>() <= 80, "{}", size_of::<ProbeSeries>());
    }
}
