//! SLO thresholds (`[TRANSITION:]pNN=DURATION`) and the verdicts of checking them against the cluster side.

use std::fmt;
use std::time::Duration;

use super::measure::{ClusterSide, Transition};

/// An SLO threshold: a transition's percentile must not exceed a duration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Threshold {
    /// The transition (default `pod_startup`).
    pub transition: Transition,
    /// The percentile: 50, 90, 99 or 100.
    pub percentile: u8,
    /// The limit.
    pub limit: Duration,
}

impl Default for Threshold {
    /// The Kubernetes SLO: p99 of pod start-up ≤ 5 s.
    fn default() -> Self {
        Threshold {
            transition: Transition::PodStartup,
            percentile: 99,
            limit: Duration::from_secs(5),
        }
    }
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = if self.percentile == 100 {
            "max".to_owned()
        } else {
            format!("p{}", self.percentile)
        };
        write!(
            f,
            "{} {p} <= {}ms",
            self.transition.name(),
            self.limit.as_millis()
        )
    }
}

impl std::str::FromStr for Threshold {
    type Err = String;

    /// `[TRANSITION:]PERCENTILE=DURATION`, e.g. `p99=5s`, `schedule_to_run:p90=1500ms`, `max=10s`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let usage = "expected [TRANSITION:]pNN=DURATION, e.g. p99=5s or schedule_to_run:p90=2s";
        let (left, limit) = s.split_once('=').ok_or_else(|| format!("{s:?}: {usage}"))?;
        let (transition, p) = match left.split_once(':') {
            Some((t, p)) => (
                Transition::from_name(t.trim()).ok_or_else(|| {
                    let names: Vec<&str> = Transition::ALL.iter().map(|t| t.name()).collect();
                    format!("{s:?}: unknown transition {t:?} (one of {})", names.join(", "))
                })?,
                p,
            ),
            None => (Transition::PodStartup, left),
        };
        let percentile = match p.trim() {
            "p50" => 50,
            "p90" => 90,
            "p99" => 99,
            "max" | "p100" => 100,
            other => return Err(format!("{s:?}: percentile {other:?} is not p50, p90, p99 or max")),
        };
        let limit = crate::duration::parse_duration(limit)?;
        if limit.is_zero() {
            return Err(format!("{s:?}: the limit must be above zero"));
        }
        Ok(Threshold {
            transition,
            percentile,
            limit,
        })
    }
}

/// One threshold checked against the data.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    /// The threshold.
    pub threshold: Threshold,
    /// The measured value, ms.
    pub value_ms: f64,
    /// Samples behind it.
    pub samples: usize,
    /// Met: there were samples and the value is within the limit.
    pub pass: bool,
}

/// Checks every threshold against `side` (no samples fails: nothing was shown to meet it).
pub fn verdicts(side: &ClusterSide, thresholds: &[Threshold]) -> Vec<Verdict> {
    thresholds
        .iter()
        .map(|t| {
            let p = side.get(t.transition);
            let value_ms = p.get(t.percentile);
            Verdict {
                threshold: *t,
                value_ms,
                samples: p.count,
                pass: p.count > 0 && value_ms <= t.limit.as_secs_f64() * 1000.0,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slo::measure::{Definition, side_with_pod_startup};

    #[test]
    fn thresholds_parse_and_verdicts_follow_the_data() {
        let t: Threshold = "p99=5s".parse().unwrap();
        assert_eq!(t, Threshold::default());
        let t: Threshold = "schedule_to_run:p90=1500ms".parse().unwrap();
        assert_eq!((t.transition, t.percentile), (Transition::ScheduleToRun, 90));
        assert!("p95=1s".parse::<Threshold>().unwrap_err().contains("p95"));
        assert!(
            "nope:p99=1s"
                .parse::<Threshold>()
                .unwrap_err()
                .contains("unknown transition")
        );
        assert!("p99".parse::<Threshold>().is_err());
        assert!("p99=0s".parse::<Threshold>().is_err());
        let side = side_with_pod_startup(vec![900.0, 1200.0, 2500.0]);
        let v = verdicts(
            &side,
            &[
                "p99=1s".parse().unwrap(),
                "p99=5s".parse().unwrap(),
                "p50=1s".parse().unwrap(),
            ],
        );
        assert_eq!(v.iter().map(|v| v.pass).collect::<Vec<_>>(), [false, true, false]);
        assert_eq!(v[0].value_ms, 2500.0);
        let empty = ClusterSide::from_records(&[], Definition::Current);
        assert!(
            !verdicts(&empty, &[Threshold::default()])[0].pass,
            "no data is no pass"
        );
    }
}
