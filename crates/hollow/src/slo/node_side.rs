//! The node side of a run, fleet-wide: every fleet process's raw per-stage HDR histograms (`/histograms`)
//! and its kubelet `pod_start_sli` buckets (`/metrics`), taken before and after the run, subtracted (so only
//! this run's pods count) and merged exactly across processes.

use std::collections::BTreeMap;

use anyhow::Context;
use hdrhistogram::Histogram;
use node_agent::pods::Stage;

use super::measure::Percentiles;

/// The SLI histogram's name on a fleet's `/metrics`.
const SLI: &str = "kubelet_pod_start_sli_duration_seconds";

/// What one fleet process (or a merge of several) holds: per-stage HDR histograms (µs) and the SLI's
/// cumulative buckets (upper bound in seconds → count).
#[derive(Debug, Clone, Default)]
pub struct FleetSnapshot {
    /// Stage name (DESIGN §3 names, plus `pod_start`) → histogram of microseconds.
    pub stages: BTreeMap<String, Histogram<u64>>,
    /// `kubelet_pod_start_sli_duration_seconds` cumulative buckets, by upper bound.
    pub sli: Vec<(f64, u64)>,
}

/// GETs `path` from a fleet endpoint `base` (`http://host:port`), over plain HTTP/1.0.
pub async fn http_get(base: &str, path: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authority = base
        .strip_prefix("http://")
        .with_context(|| format!("fleet endpoint {base:?}: only http://HOST:PORT is supported"))?
        .trim_end_matches('/');
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(authority).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {authority}\r\n\r\n").as_bytes())
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        anyhow::Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    let text = tokio::time::timeout(std::time::Duration::from_secs(30), fetch)
        .await
        .with_context(|| format!("{base}{path}: no answer in 30 s"))?
        .with_context(|| format!("fetching {base}{path}"))?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("{base}{path}: not an HTTP response"))?;
    let status = head.lines().next().unwrap_or_default();
    if !status.contains(" 200") {
        anyhow::bail!("{base}{path}: {status}");
    }
    Ok(body.to_owned())
}

/// Decodes a `/histograms` body (stage → base64 V2 histogram).
pub fn decode_stages(body: &str) -> anyhow::Result<BTreeMap<String, Histogram<u64>>> {
    let map: BTreeMap<String, String> =
        serde_json::from_str(body).context("/histograms is not a JSON map of stage to histogram")?;
    map.into_iter()
        .map(|(k, v)| {
            let h = crate::server::decode_histogram(&v)
                .map_err(|e| anyhow::anyhow!("/histograms stage {k}: {e}"))?;
            Ok((k, h))
        })
        .collect()
}

/// The cumulative buckets of the unlabelled histogram `name` in a Prometheus text body.
pub fn parse_buckets(text: &str, name: &str) -> Vec<(f64, u64)> {
    let prefix = format!("{name}_bucket{{");
    let mut out: Vec<(f64, u64)> = text
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            let count = l.rsplit(' ').next()?.parse::<f64>().ok()? as u64;
            Some((le, count))
        })
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// Fetches one fleet process's snapshot.
pub async fn fetch(base: &str) -> anyhow::Result<FleetSnapshot> {
    let stages = decode_stages(&http_get(base, "/histograms").await?)
        .with_context(|| format!("fleet endpoint {base}"))?;
    let sli = parse_buckets(&http_get(base, "/metrics").await?, SLI);
    Ok(FleetSnapshot { stages, sli })
}

/// Fetches every endpoint's snapshot, in order; any failure names its endpoint.
pub async fn fetch_all(bases: &[String]) -> anyhow::Result<Vec<FleetSnapshot>> {
    futures::future::try_join_all(bases.iter().map(|b| fetch(b))).await
}

impl FleetSnapshot {
    /// What `self` (taken later) holds beyond `before` (taken earlier from the same process).
    pub fn since(&self, before: &FleetSnapshot) -> anyhow::Result<FleetSnapshot> {
        let mut stages = BTreeMap::new();
        for (name, after) in &self.stages {
            let mut h = after.clone();
            if let Some(b) = before.stages.get(name) {
                h.subtract(b)
                    .map_err(|e| anyhow::anyhow!("stage {name}: the later histogram lacks earlier samples ({e:?}): did the fleet restart?"))?;
            }
            stages.insert(name.clone(), h);
        }
        let sli = self
            .sli
            .iter()
            .map(|(le, n)| {
                let was = before.sli.iter().find(|(l, _)| l == le).map_or(0, |(_, c)| *c);
                (*le, n.saturating_sub(was))
            })
            .collect();
        Ok(FleetSnapshot { stages, sli })
    }

    /// The exact merge of several processes' snapshots.
    pub fn merge(parts: &[FleetSnapshot]) -> anyhow::Result<FleetSnapshot> {
        let mut out = FleetSnapshot::default();
        for part in parts {
            for (name, h) in &part.stages {
                match out.stages.get_mut(name) {
                    Some(m) => m
                        .add(h)
                        .map_err(|e| anyhow::anyhow!("merging stage {name}: {e:?}"))?,
                    None => {
                        out.stages.insert(name.clone(), h.clone());
                    }
                }
            }
            for (le, n) in &part.sli {
                match out.sli.iter_mut().find(|(l, _)| l == le) {
                    Some(slot) => slot.1 += n,
                    None => out.sli.push((*le, *n)),
                }
            }
        }
        out.sli.sort_by(|a, b| a.0.total_cmp(&b.0));
        Ok(out)
    }

    /// Percentiles (ms) of one stage: HDR's value at each quantile (3 significant digits).
    pub fn stage(&self, name: &str) -> Percentiles {
        match self.stages.get(name) {
            Some(h) if !h.is_empty() => {
                let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
                Percentiles {
                    count: usize::try_from(h.len()).unwrap_or(usize::MAX),
                    p50: ms(0.5),
                    p90: ms(0.9),
                    p99: ms(0.99),
                    max: h.max() as f64 / 1000.0,
                }
            }
            _ => Percentiles::default(),
        }
    }

    /// Rows in DESIGN §3 order: every stage, then `pod_start` (watch_observed → status_reported).
    pub fn rows(&self) -> Vec<(&'static str, Percentiles)> {
        Stage::ALL
            .iter()
            .map(|s| s.name())
            .chain(std::iter::once("pod_start"))
            .map(|n| (n, self.stage(n)))
            .collect()
    }

    /// The kubelet's `pod_start_sli` percentiles (ms), interpolated within buckets as Prometheus's
    /// `histogram_quantile` does; `max` is the upper bound of the highest non-empty bucket.
    pub fn sli(&self) -> Percentiles {
        let total = super::apiserver::total(&self.sli);
        if total == 0 {
            return Percentiles::default();
        }
        let quantile = |q: f64| super::apiserver::quantile_ms(&self.sli, q);
        let mut prev = 0;
        let mut max = 0.0;
        for (le, count) in &self.sli {
            if *count > prev {
                max = *le;
            }
            prev = *count;
        }
        Percentiles {
            count: usize::try_from(total).unwrap_or(usize::MAX),
            p50: quantile(0.5),
            p90: quantile(0.9),
            p99: quantile(0.99),
            max: max * 1000.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::encode_histogram;

    fn hist(values: impl IntoIterator<Item = u64>) -> Histogram<u64> {
        let mut h = Histogram::new_with_bounds(1, 3_600_000_000, 3).unwrap();
        for v in values {
            h.record(v).unwrap();
        }
        h
    }

    /// Serialised as a fleet's `/histograms` serves it.
    fn body(stages: &[(&str, &Histogram<u64>)]) -> String {
        let map: BTreeMap<&str, String> = stages
            .iter()
            .map(|(n, h)| (*n, encode_histogram(h).unwrap()))
            .collect();
        serde_json::to_string(&map).unwrap()
    }

    #[test]
    fn two_processes_merge_to_the_percentiles_of_one_holding_both() {
        // two fleets with different shapes: fast nodes and a slow tail
        let a: Vec<u64> = (0..5000).map(|i| 1_000 + (i * 7919) % 40_000).collect();
        let b: Vec<u64> = (0..3000).map(|i| 30_000 + (i * 104_729) % 2_500_000).collect();
        let one = decode_stages(&body(&[(
            "containers_started",
            &hist(a.iter().chain(&b).copied()),
        )]))
        .unwrap();
        let pa = FleetSnapshot {
            stages: decode_stages(&body(&[("containers_started", &hist(a))])).unwrap(),
            sli: vec![(1.0, 10), (5.0, 40), (f64::INFINITY, 40)],
        };
        let pb = FleetSnapshot {
            stages: decode_stages(&body(&[("containers_started", &hist(b))])).unwrap(),
            sli: vec![(1.0, 0), (5.0, 10), (f64::INFINITY, 12)],
        };
        let merged = FleetSnapshot::merge(&[pa, pb]).unwrap();
        let whole = FleetSnapshot {
            stages: one,
            sli: Vec::new(),
        };
        let (m, w) = (
            &merged.stages["containers_started"],
            &whole.stages["containers_started"],
        );
        assert_eq!(m.len(), 8000);
        for q in [0.0, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0] {
            assert_eq!(m.value_at_quantile(q), w.value_at_quantile(q), "quantile {q}");
        }
        assert_eq!(
            merged.stage("containers_started"),
            whole.stage("containers_started")
        );
        assert_eq!(merged.sli, vec![(1.0, 10), (5.0, 50), (f64::INFINITY, 52)]);
    }

    #[test]
    fn a_later_snapshot_minus_an_earlier_one_is_the_run_alone() {
        let before = FleetSnapshot {
            stages: [("pod_start".to_owned(), hist([5_000, 6_000]))].into(),
            sli: vec![(1.0, 2), (f64::INFINITY, 2)],
        };
        let after = FleetSnapshot {
            stages: [("pod_start".to_owned(), hist([5_000, 6_000, 2_000_000, 2_100_000]))].into(),
            sli: vec![(1.0, 2), (f64::INFINITY, 4)],
        };
        let run = after.since(&before).unwrap();
        let p = run.stage("pod_start");
        assert_eq!(p.count, 2);
        assert!((p.p50 - 2000.0).abs() < 2.0, "{p:?}");
        assert_eq!(run.sli, vec![(1.0, 0), (f64::INFINITY, 2)]);
        assert!(before.since(&after).is_err(), "a restarted fleet is reported");
    }

    #[test]
    fn sli_percentiles_interpolate_within_buckets() {
        let text = "kubelet_pod_start_sli_duration_seconds_bucket{le=\"0.5\"} 0\n\
                    kubelet_pod_start_sli_duration_seconds_bucket{le=\"1.0\"} 50\n\
                    kubelet_pod_start_sli_duration_seconds_bucket{le=\"2.0\"} 100\n\
                    kubelet_pod_start_sli_duration_seconds_bucket{le=\"+Inf\"} 100\n\
                    kubelet_pod_start_sli_duration_seconds_sum 90\n";
        let snap = FleetSnapshot {
            stages: BTreeMap::new(),
            sli: parse_buckets(text, SLI),
        };
        let p = snap.sli();
        assert_eq!(p.count, 100);
        assert!((p.p50 - 1000.0).abs() < 1e-6, "{p:?}");
        assert!((p.p90 - 1800.0).abs() < 1e-6, "{p:?}");
        assert_eq!(p.max, 2000.0);
    }
}
