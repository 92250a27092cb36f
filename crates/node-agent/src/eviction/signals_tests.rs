use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::config::Threshold;
use crate::stats::{FsStats, NodeUsage, PodUsage, Summary};

const MI: u64 = 1 << 20;
const GI: u64 = 1 << 30;

fn q(s: &str) -> Threshold {
    Threshold::Quantity(s.parse().unwrap())
}

fn hard(signal: Signal, value: Threshold) -> ThresholdSpec {
    ThresholdSpec {
        signal,
        value,
        grace: Duration::ZERO,
        hard: true,
        min_reclaim: None,
    }
}

fn memory(available: u64) -> Observations {
    BTreeMap::from([(
        Signal::MemoryAvailable,
        Observation {
            available,
            capacity: 4 * GI,
        },
    )])
}

#[test]
fn a_threshold_is_met_below_its_quantity_or_percentage() {
    // (threshold, available of 4 GiB, met)
    let cases = [
        (q("100Mi"), 99 * MI, true),
        (q("100Mi"), 100 * MI, false),
        (q("100Mi"), GI, false),
        (Threshold::Percentage(0.1), 400 * MI, true),
        (Threshold::Percentage(0.1), 420 * MI, false),
    ];
    for (value, available, met) in cases {
        let t = hard(Signal::MemoryAvailable, value);
        let o = memory(available)[&Signal::MemoryAvailable];
        assert_eq!(t.met(&o, false), met, "{value:?} at {available}");
    }
}

#[test]
fn observations_come_from_the_summary() {
    let summary = Summary {
        node: NodeUsage {
            nano_cores: 0,
            core_nanos: 0,
            memory_capacity: 4 * GI,
            memory_working_set: 3 * GI,
            nodefs: Some(FsStats {
                capacity_bytes: 100 * GI,
                available_bytes: 40 * GI,
                inodes: Some(1000),
                inodes_free: Some(10),
            }),
            imagefs: Some(FsStats {
                capacity_bytes: 50 * GI,
                available_bytes: 5 * GI,
                inodes: None,
                inodes_free: None,
            }),
            pids: Some((4096, 4000)),
            time_ns: 0,
        },
        pods: vec![PodUsage {
            working_set: GI,
            ..Default::default()
        }],
    };
    let obs = observe(&summary, 3 * GI);
    assert_eq!(obs[&Signal::MemoryAvailable].available, GI);
    assert_eq!(obs[&Signal::AllocatableMemoryAvailable].available, 2 * GI);
    assert_eq!(obs[&Signal::NodeFsAvailable].available, 40 * GI);
    assert_eq!(obs[&Signal::NodeFsInodesFree].available, 10);
    assert_eq!(obs[&Signal::ImageFsAvailable].capacity, 50 * GI);
    assert_eq!(obs[&Signal::ContainerFsAvailable].available, 5 * GI);
    assert!(
        !obs.contains_key(&Signal::ImageFsInodesFree),
        "unknown inodes: no observation"
    );
    assert_eq!(obs[&Signal::PidAvailable].available, 96);
}

#[tokio::test(start_paused = true)]
async fn hard_thresholds_act_at_once_and_keep_acting_until_min_reclaim() {
    let mut t = hard(Signal::MemoryAvailable, q("100Mi"));
    t.min_reclaim = Some(q("200Mi"));
    let thresholds = [t];
    let mut state = State::default();
    let period = Duration::from_secs(300);
    let now = Instant::now();
    let d = state.update(&thresholds, &memory(50 * MI), period, now);
    assert!(d.pressure.memory && !d.pressure.disk && !d.pressure.pid);
    assert_eq!(d.act_on, thresholds);
    // above the threshold but below threshold + min reclaim: still acting
    let d = state.update(
        &thresholds,
        &memory(250 * MI),
        period,
        now + Duration::from_secs(10),
    );
    assert_eq!(d.act_on.len(), 1, "min reclaim not reached");
    let d = state.update(
        &thresholds,
        &memory(301 * MI),
        period,
        now + Duration::from_secs(20),
    );
    assert!(d.act_on.is_empty(), "resolved");
    assert!(d.pressure.memory, "the condition stays for the transition period");
    // once resolved, min reclaim is no longer enforced
    let d = state.update(
        &thresholds,
        &memory(250 * MI),
        period,
        now + Duration::from_secs(30),
    );
    assert!(d.act_on.is_empty());
    // last observed met at 10 s: the condition holds until 10 s + the period
    let d = state.update(&thresholds, &memory(GI), period, now + Duration::from_secs(309));
    assert!(d.pressure.memory);
    let d = state.update(&thresholds, &memory(GI), period, now + Duration::from_secs(310));
    assert!(!d.pressure.memory);
}

#[tokio::test(start_paused = true)]
async fn the_condition_clears_after_the_transition_period() {
    let thresholds = [hard(Signal::MemoryAvailable, q("100Mi"))];
    let mut state = State::default();
    let period = Duration::from_secs(30);
    let t0 = Instant::now();
    assert!(state.update(&thresholds, &memory(MI), period, t0).pressure.memory);
    let at = |s: u64| t0 + Duration::from_secs(s);
    assert!(
        state
            .update(&thresholds, &memory(GI), period, at(10))
            .pressure
            .memory
    );
    assert!(
        state
            .update(&thresholds, &memory(GI), period, at(29))
            .pressure
            .memory
    );
    assert!(
        !state
            .update(&thresholds, &memory(GI), period, at(30))
            .pressure
            .memory
    );
}

#[tokio::test(start_paused = true)]
async fn soft_thresholds_report_pressure_at_once_but_evict_after_their_grace_period() {
    let soft = ThresholdSpec {
        signal: Signal::MemoryAvailable,
        value: q("1Gi"),
        grace: Duration::from_secs(90),
        hard: false,
        min_reclaim: None,
    };
    let thresholds = [soft];
    let mut state = State::default();
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let period = Duration::from_secs(300);
    let d = state.update(&thresholds, &memory(512 * MI), period, t0);
    assert!(d.pressure.memory && d.act_on.is_empty());
    assert!(
        state
            .update(&thresholds, &memory(512 * MI), period, at(89))
            .act_on
            .is_empty()
    );
    assert_eq!(
        state
            .update(&thresholds, &memory(512 * MI), period, at(90))
            .act_on,
        thresholds
    );
    // a pass without the threshold met restarts the grace period
    assert!(
        state
            .update(&thresholds, &memory(2 * GI), period, at(100))
            .act_on
            .is_empty()
    );
    assert!(
        state
            .update(&thresholds, &memory(512 * MI), period, at(110))
            .act_on
            .is_empty()
    );
    assert_eq!(
        state
            .update(&thresholds, &memory(512 * MI), period, at(200))
            .act_on,
        thresholds
    );
}

#[tokio::test(start_paused = true)]
async fn memory_is_acted_on_before_disk() {
    let thresholds = [
        hard(Signal::NodeFsAvailable, Threshold::Percentage(0.1)),
        hard(Signal::MemoryAvailable, q("100Mi")),
    ];
    let mut obs = memory(MI);
    obs.insert(
        Signal::NodeFsAvailable,
        Observation {
            available: GI,
            capacity: 100 * GI,
        },
    );
    let d = State::default().update(&thresholds, &obs, Duration::from_secs(300), Instant::now());
    let signals: Vec<Signal> = d.act_on.iter().map(|t| t.signal).collect();
    assert_eq!(signals, [Signal::MemoryAvailable, Signal::NodeFsAvailable]);
    assert!(d.pressure.memory && d.pressure.disk && !d.pressure.pid);
}

#[test]
fn thresholds_come_from_the_configuration_with_grace_and_min_reclaim() {
    let mut k = crate::config::KubeletConfig::default();
    k.eviction_soft.insert("memory.available".into(), q("1Gi"));
    k.eviction_soft_grace_period
        .insert("memory.available".into(), Duration::from_secs(90));
    k.eviction_minimum_reclaim
        .insert("nodefs.available".into(), q("500Mi"));
    let list = thresholds(&k);
    let hard_signals: Vec<&str> = list
        .iter()
        .filter(|t| t.hard)
        .map(|t| t.signal.as_str())
        .collect();
    assert_eq!(
        hard_signals,
        [
            "imagefs.available",
            "imagefs.inodesFree",
            "memory.available",
            "nodefs.available",
            "nodefs.inodesFree"
        ],
        "the kubelet's default hard thresholds"
    );
    let soft = list.iter().find(|t| !t.hard).unwrap();
    assert_eq!(soft.grace, Duration::from_secs(90));
    let nodefs = list.iter().find(|t| t.signal == Signal::NodeFsAvailable).unwrap();
    assert_eq!(nodefs.min_reclaim, Some(q("500Mi")));
}
