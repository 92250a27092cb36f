//! The `chaos` section of a profiles file and the chaos flags that override it: which disruptions a fleet
//! suffers (runtime outages, heartbeat flapping, node churn), how often and to how many nodes. What carries
//! them out is [`crate::chaos`].

use std::time::Duration;

use serde::Deserialize;

use crate::duration::parse_duration;

/// Chaos flags; each kind overrides the `chaos` section of the profiles file.
#[derive(clap::Args, Debug, Default)]
pub struct ChaosArgs {
    /// Share of nodes (0–1) whose runtime goes down per round (RuntimeReady=false, node NotReady).
    #[arg(long, requires = "runtime_down_for")]
    pub runtime_down_fraction: Option<f64>,
    /// How long the runtime stays down (e.g. 30s, 2m).
    #[arg(long, value_parser = parse_duration)]
    pub runtime_down_for: Option<Duration>,
    /// Time between the starts of two rounds (default: one round).
    #[arg(long, value_parser = parse_duration)]
    pub runtime_down_every: Option<Duration>,
    /// Share of nodes (0–1) whose lease and status heartbeats stop per round.
    #[arg(long, requires = "flap_for")]
    pub flap_fraction: Option<f64>,
    /// How long heartbeats stay stopped (past the controller-manager's grace period the node goes Unknown).
    #[arg(long, value_parser = parse_duration)]
    pub flap_for: Option<Duration>,
    /// Time between the starts of two flapping rounds (default: one round).
    #[arg(long, value_parser = parse_duration)]
    pub flap_every: Option<Duration>,
    /// Extra nodes, beyond --nodes, that leave and join over time (Node deleted, a fresh name joins).
    #[arg(long, requires = "churn_per_minute")]
    pub churn_nodes: Option<usize>,
    /// Churn replacements per minute.
    #[arg(long)]
    pub churn_per_minute: Option<f64>,
    /// Leaving churn nodes go through graceful node shutdown (their pods stopped and reported Failed) before
    /// their Node is deleted; needs shutdownGracePeriod in --config.
    #[arg(long, requires = "churn_nodes")]
    pub churn_shutdown: bool,
}

impl ChaosArgs {
    /// The profile file's chaos with these flags applied over it.
    pub fn over(&self, mut spec: ChaosSpec) -> ChaosSpec {
        if let (Some(fraction), Some(duration)) = (self.runtime_down_fraction, self.runtime_down_for) {
            spec.runtime_down = Some(Disruption {
                fraction,
                duration,
                every: self.runtime_down_every.unwrap_or_default(),
            });
        }
        if let (Some(fraction), Some(duration)) = (self.flap_fraction, self.flap_for) {
            spec.flapping = Some(Disruption {
                fraction,
                duration,
                every: self.flap_every.unwrap_or_default(),
            });
        }
        if let (Some(nodes), Some(per_minute)) = (self.churn_nodes, self.churn_per_minute) {
            spec.churn = Some(Churn {
                nodes,
                per_minute,
                shutdown: self.churn_shutdown,
            });
        }
        spec
    }
}

/// A recurring disruption of a fraction of the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Disruption {
    /// Share of the fleet disrupted per round, 0–1.
    pub fraction: f64,
    /// How long one round lasts.
    #[serde(with = "crate::duration::text")]
    pub duration: Duration,
    /// Time from one round's start to the next; zero for a single round.
    #[serde(default, with = "crate::duration::text")]
    pub every: Duration,
}

/// Nodes leaving and joining.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Churn {
    /// Extra nodes that take part in churn (on top of the fleet).
    pub nodes: usize,
    /// Replacements per minute (one node leaves, one joins).
    pub per_minute: f64,
    /// Leaving nodes shut down gracefully (needs `shutdownGracePeriod` in the fleet's configuration).
    #[serde(default)]
    pub shutdown: bool,
}

/// All chaos of one fleet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ChaosSpec {
    /// Runtime down on a fraction of nodes.
    #[serde(default)]
    pub runtime_down: Option<Disruption>,
    /// Heartbeats stopped on a fraction of nodes.
    #[serde(default)]
    pub flapping: Option<Disruption>,
    /// Node churn.
    #[serde(default)]
    pub churn: Option<Churn>,
}

/// Invalid chaos settings.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ChaosError {
    /// A fraction outside 0–1.
    #[error("{kind}: fraction must be between 0 and 1, got {value}")]
    Fraction {
        /// Which disruption.
        kind: &'static str,
        /// The value.
        value: f64,
    },
    /// A disruption of zero length.
    #[error("{kind}: duration must be more than zero")]
    Duration {
        /// Which disruption.
        kind: &'static str,
    },
    /// Rounds overlapping themselves.
    #[error("{kind}: every ({every:?}) must be zero or longer than duration ({duration:?})")]
    Every {
        /// Which disruption.
        kind: &'static str,
        /// The period.
        every: Duration,
        /// The duration.
        duration: Duration,
    },
    /// Churn without a rate, or a rate without nodes.
    #[error("churn: per-minute must be above zero and nodes at least 1")]
    Churn,
}

impl ChaosSpec {
    /// Checks every setting; the error names the one that is wrong.
    pub fn validate(&self) -> Result<(), ChaosError> {
        for (kind, d) in [("runtimeDown", &self.runtime_down), ("flapping", &self.flapping)] {
            let Some(d) = d else { continue };
            if !(0.0..=1.0).contains(&d.fraction) {
                return Err(ChaosError::Fraction {
                    kind,
                    value: d.fraction,
                });
            }
            if d.duration.is_zero() {
                return Err(ChaosError::Duration { kind });
            }
            if !d.every.is_zero() && d.every <= d.duration {
                return Err(ChaosError::Every {
                    kind,
                    every: d.every,
                    duration: d.duration,
                });
            }
        }
        if let Some(c) = &self.churn
            && (c.nodes == 0 || c.per_minute.is_nan() || c.per_minute <= 0.0)
        {
            return Err(ChaosError::Churn);
        }
        Ok(())
    }

    /// Whether anything is configured.
    pub fn is_empty(&self) -> bool {
        self.runtime_down.is_none() && self.flapping.is_none() && self.churn.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chaos_section_reads_and_validates() {
        let spec: ChaosSpec = serde_yaml::from_str(
            "runtimeDown: {fraction: 0.1, duration: 30s, every: 5m}\n\
             flapping: {fraction: 0.05, duration: 60s}\n\
             churn: {nodes: 10, perMinute: 2}\n",
        )
        .unwrap();
        assert_eq!(
            spec.runtime_down,
            Some(Disruption {
                fraction: 0.1,
                duration: Duration::from_secs(30),
                every: Duration::from_secs(300)
            })
        );
        assert_eq!(spec.flapping.unwrap().every, Duration::ZERO, "one round");
        assert_eq!(spec.validate(), Ok(()));
        let bad = ChaosSpec {
            flapping: Some(Disruption {
                fraction: 1.5,
                duration: Duration::from_secs(1),
                every: Duration::ZERO,
            }),
            ..ChaosSpec::default()
        };
        assert_eq!(
            bad.validate().unwrap_err().to_string(),
            "flapping: fraction must be between 0 and 1, got 1.5"
        );
        let overlapping = ChaosSpec {
            runtime_down: Some(Disruption {
                fraction: 0.5,
                duration: Duration::from_secs(60),
                every: Duration::from_secs(30),
            }),
            ..ChaosSpec::default()
        };
        assert!(matches!(overlapping.validate(), Err(ChaosError::Every { .. })));
        let typo = serde_yaml::from_str::<ChaosSpec>("flaping: {fraction: 0.1, duration: 1s}");
        assert!(typo.unwrap_err().to_string().contains("flaping"));
    }
}
