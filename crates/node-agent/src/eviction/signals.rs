//! Eviction signals, thresholds and the state kept between two monitoring passes: which thresholds are met
//! (with their minimum reclaim while still unresolved, soft ones only after their grace period), which node
//! conditions hold (kept for `evictionPressureTransitionPeriod` after their last observation), and which
//! threshold to act on first.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{KubeletConfig, Threshold};
use crate::node::Pressure;
use crate::quantity::{Format, Quantity};
use crate::stats::Summary;

/// An eviction signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    /// `memory.available`: memory capacity minus the node's working set.
    MemoryAvailable,
    /// `allocatableMemory.available`: allocatable memory minus the pods' working set.
    AllocatableMemoryAvailable,
    /// `nodefs.available`.
    NodeFsAvailable,
    /// `nodefs.inodesFree`.
    NodeFsInodesFree,
    /// `imagefs.available`.
    ImageFsAvailable,
    /// `imagefs.inodesFree`.
    ImageFsInodesFree,
    /// `containerfs.available` (the writable layers' filesystem: the image filesystem here).
    ContainerFsAvailable,
    /// `containerfs.inodesFree`.
    ContainerFsInodesFree,
    /// `pid.available`: `kernel.pid_max` minus the processes running.
    PidAvailable,
}

/// What a signal's pressure is reclaimed as, in the eviction message and for ranking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// `memory`.
    Memory,
    /// `ephemeral-storage`.
    EphemeralStorage,
    /// `inodes`.
    Inodes,
    /// `pids`.
    Pids,
}

impl Resource {
    /// The resource name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::EphemeralStorage => "ephemeral-storage",
            Self::Inodes => "inodes",
            Self::Pids => "pids",
        }
    }
}

/// The node condition a signal drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Condition {
    /// `MemoryPressure`.
    Memory,
    /// `DiskPressure`.
    Disk,
    /// `PIDPressure`.
    Pid,
}

impl Signal {
    /// Every signal, in the order they are listed.
    pub const ALL: [Signal; 9] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::ContainerFsAvailable,
        Signal::ContainerFsInodesFree,
        Signal::PidAvailable,
    ];

    /// The name used in configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MemoryAvailable => "memory.available",
            Self::AllocatableMemoryAvailable => "allocatableMemory.available",
            Self::NodeFsAvailable => "nodefs.available",
            Self::NodeFsInodesFree => "nodefs.inodesFree",
            Self::ImageFsAvailable => "imagefs.available",
            Self::ImageFsInodesFree => "imagefs.inodesFree",
            Self::ContainerFsAvailable => "containerfs.available",
            Self::ContainerFsInodesFree => "containerfs.inodesFree",
            Self::PidAvailable => "pid.available",
        }
    }

    /// The signal of a configuration name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// The resource it reclaims.
    pub fn resource(self) -> Resource {
        match self {
            Self::MemoryAvailable | Self::AllocatableMemoryAvailable => Resource::Memory,
            Self::NodeFsAvailable | Self::ImageFsAvailable | Self::ContainerFsAvailable => {
                Resource::EphemeralStorage
            }
            Self::NodeFsInodesFree | Self::ImageFsInodesFree | Self::ContainerFsInodesFree => {
                Resource::Inodes
            }
            Self::PidAvailable => Resource::Pids,
        }
    }

    /// The node condition it drives.
    pub fn condition(self) -> Condition {
        match self.resource() {
            Resource::Memory => Condition::Memory,
            Resource::EphemeralStorage | Resource::Inodes => Condition::Disk,
            Resource::Pids => Condition::Pid,
        }
    }

    /// A disk signal: node-level reclaim (container and image GC) is tried before evicting a pod.
    pub fn is_disk(self) -> bool {
        self.condition() == Condition::Disk
    }
}

/// One observed signal: what is available out of what capacity (bytes, inodes or process IDs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// Available now.
    pub available: u64,
    /// Capacity.
    pub capacity: u64,
}

/// Every signal that could be observed.
pub type Observations = BTreeMap<Signal, Observation>;

/// The observations in `summary`; `allocatable_memory` is the node's allocatable memory (bytes).
pub fn observe(summary: &Summary, allocatable_memory: u64) -> Observations {
    let mut obs = Observations::new();
    let node = &summary.node;
    obs.insert(
        Signal::MemoryAvailable,
        Observation {
            available: node.memory_available(),
            capacity: node.memory_capacity,
        },
    );
    let pods_ws: u64 = summary.pods.iter().map(|p| p.working_set).sum();
    obs.insert(
        Signal::AllocatableMemoryAvailable,
        Observation {
            available: allocatable_memory.saturating_sub(pods_ws),
            capacity: allocatable_memory,
        },
    );
    let fs = |obs: &mut Observations, fs: Option<crate::stats::FsStats>, bytes: Signal, inodes: Signal| {
        let Some(fs) = fs else { return };
        obs.insert(
            bytes,
            Observation {
                available: fs.available_bytes,
                capacity: fs.capacity_bytes,
            },
        );
        if let (Some(total), Some(free)) = (fs.inodes, fs.inodes_free) {
            obs.insert(
                inodes,
                Observation {
                    available: free,
                    capacity: total,
                },
            );
        }
    };
    fs(
        &mut obs,
        node.nodefs,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
    );
    fs(
        &mut obs,
        node.imagefs,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
    );
    fs(
        &mut obs,
        node.imagefs,
        Signal::ContainerFsAvailable,
        Signal::ContainerFsInodesFree,
    );
    if let Some((max, running)) = node.pids {
        obs.insert(
            Signal::PidAvailable,
            Observation {
                available: max.saturating_sub(running),
                capacity: max,
            },
        );
    }
    obs
}

/// One configured threshold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThresholdSpec {
    /// The signal.
    pub signal: Signal,
    /// Met when the signal's available amount is below this.
    pub value: Threshold,
    /// Soft thresholds: how long it must be met before pods are evicted (zero for hard thresholds).
    pub grace: Duration,
    /// Hard threshold (pods evicted at once, 1 s grace).
    pub hard: bool,
    /// While unresolved, the threshold stays met until this much more is available.
    pub min_reclaim: Option<Threshold>,
}

fn amount(t: &Threshold, capacity: u64) -> u64 {
    let cap = Quantity::from_units(i64::try_from(capacity).unwrap_or(i64::MAX), Format::BinarySI);
    u64::try_from(t.amount_of(&cap).value()).unwrap_or(0)
}

impl ThresholdSpec {
    /// The amount this threshold stands for against `capacity`.
    pub fn quantity(&self, capacity: u64) -> u64 {
        amount(&self.value, capacity)
    }

    /// Is it met by `obs` (with its minimum reclaim added when `enforce_min_reclaim`)?
    pub fn met(&self, obs: &Observation, enforce_min_reclaim: bool) -> bool {
        let mut q = self.quantity(obs.capacity);
        if enforce_min_reclaim && let Some(min) = &self.min_reclaim {
            q = q.saturating_add(amount(min, obs.capacity));
        }
        q > obs.available
    }
}

/// The thresholds of a configuration: hard ones, then soft ones; unknown signal names were refused when the
/// configuration was read.
pub fn thresholds(k: &KubeletConfig) -> Vec<ThresholdSpec> {
    let mut out = Vec::new();
    for (hard, map) in [(true, &k.eviction_hard), (false, &k.eviction_soft)] {
        for (name, value) in map {
            let Some(signal) = Signal::parse(name) else {
                continue;
            };
            out.push(ThresholdSpec {
                signal,
                value: *value,
                grace: if hard {
                    Duration::ZERO
                } else {
                    k.eviction_soft_grace_period
                        .get(name)
                        .copied()
                        .unwrap_or_default()
                },
                hard,
                min_reclaim: k.eviction_minimum_reclaim.get(name).copied(),
            });
        }
    }
    out
}

/// [`thresholds`] of `k`, shared: the agents of a fleet hold one configuration, so they hold one list rather
/// than a copy per node — computed again only for a configuration other than the last one asked for.
pub fn shared_thresholds(k: &Arc<KubeletConfig>) -> Arc<[ThresholdSpec]> {
    type Memo = Option<(Weak<KubeletConfig>, Arc<[ThresholdSpec]>)>;
    static LAST: Mutex<Memo> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((config, list)) = last.as_ref()
        && config.upgrade().is_some_and(|c| Arc::ptr_eq(&c, k))
    {
        return list.clone();
    }
    let list: Arc<[ThresholdSpec]> = thresholds(k).into();
    *last = Some((Arc::downgrade(k), list.clone()));
    list
}

/// What one monitoring pass decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The node conditions to report (transition period applied).
    pub pressure: Pressure,
    /// Thresholds met with their grace periods over, the first to act on first.
    pub act_on: Vec<ThresholdSpec>,
}

/// The state the eviction manager keeps between passes.
#[derive(Debug, Default)]
pub struct State {
    /// Thresholds met (ignoring grace periods) and when first seen met, by position in the threshold list.
    first_observed: BTreeMap<usize, Instant>,
    /// When each condition was last observed.
    condition_seen: BTreeMap<Condition, Instant>,
    /// Thresholds acted on last pass (their minimum reclaim is enforced until resolved).
    met: Vec<usize>,
}

impl State {
    /// One pass: `thresholds` against `obs` at `now`.
    pub fn update(
        &mut self,
        thresholds: &[ThresholdSpec],
        obs: &Observations,
        transition: Duration,
        now: Instant,
    ) -> Decision {
        let met: Vec<usize> = thresholds
            .iter()
            .enumerate()
            .filter(|(i, t)| obs.get(&t.signal).is_some_and(|o| t.met(o, self.met.contains(i))))
            .map(|(i, _)| i)
            .collect();
        self.first_observed.retain(|i, _| met.contains(i));
        for &i in &met {
            self.first_observed.entry(i).or_insert(now);
            self.condition_seen.insert(thresholds[i].signal.condition(), now);
        }
        self.condition_seen
            .retain(|_, seen| now.saturating_duration_since(*seen) < transition);
        let pressure = Pressure {
            memory: self.condition_seen.contains_key(&Condition::Memory),
            disk: self.condition_seen.contains_key(&Condition::Disk),
            pid: self.condition_seen.contains_key(&Condition::Pid),
        };
        let ready: Vec<usize> = met
            .into_iter()
            .filter(|i| now.saturating_duration_since(self.first_observed[i]) >= thresholds[*i].grace)
            .collect();
        self.met = ready.clone();
        let mut act_on: Vec<ThresholdSpec> = ready.iter().map(|&i| thresholds[i]).collect();
        // memory first, as the kubelet ranks thresholds
        act_on.sort_by_key(|t| t.signal.resource() != Resource::Memory);
        Decision { pressure, act_on }
    }

    /// Would any threshold still be met (minimum reclaim enforced) with `obs`? Used after node-level reclaim.
    pub fn still_met(thresholds: &[ThresholdSpec], obs: &Observations) -> bool {
        thresholds
            .iter()
            .any(|t| obs.get(&t.signal).is_some_and(|o| t.met(o, true)))
    }
}

#[cfg(test)]
#[path = "signals_tests.rs"]
mod tests;
