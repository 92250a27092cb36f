//! The kubelet's documented eviction order, table by table.

use std::time::Duration;

use super::*;
use crate::config::Threshold;
use crate::eviction::signals::Signal;
use crate::stats::ContainerUsage;

const MI: i64 = 1 << 20;

fn pod(name: &str, priority: i32, memory_request: i64) -> ActivePod {
    ActivePod {
        uid: name.into(),
        name: name.into(),
        namespace: "default".into(),
        priority,
        critical: false,
        memory_request,
        ephemeral_request: 0,
        containers: vec![("app".into(), memory_request, 0)],
        grace_secs: 30,
    }
}

fn usage(name: &str, working_set: i64, rootfs: i64, processes: u64) -> PodUsage {
    PodUsage {
        uid: name.into(),
        name: name.into(),
        working_set: working_set as u64,
        processes,
        containers: vec![ContainerUsage {
            name: "app".into(),
            working_set: working_set as u64,
            rootfs_bytes: rootfs as u64,
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn order(mut pods: Vec<ActivePod>, usages: &[PodUsage], resource: Resource) -> Vec<String> {
    rank(&mut pods, resource, |uid| usages.iter().find(|u| u.uid == uid));
    pods.into_iter().map(|p| p.name).collect()
}

/// (name, priority, request MiB, usage MiB).
type Row = (&'static str, i32, i64, i64);

#[test]
fn memory_over_request_then_priority_then_usage_above_request() {
    // (pods as (name, priority, request Mi, usage Mi), expected order)
    let cases: &[(&[Row], &[&str])] = &[
        // a pod over its request goes before one within it, whatever their usage
        (
            &[("guaranteed", 0, 500, 400), ("besteffort", 0, 0, 10)],
            &["besteffort", "guaranteed"],
        ),
        // both over: lower priority first
        (&[("high", 1000, 0, 900), ("low", 0, 0, 10)], &["low", "high"]),
        // both over, same priority: the larger use above the request first
        (
            &[("a", 0, 100, 150), ("b", 0, 0, 120), ("c", 0, 50, 300)],
            &["c", "b", "a"],
        ),
        // both within: lower priority first, then use above request (negative: further below goes last)
        (
            &[("x", 0, 500, 100), ("y", 0, 500, 400), ("z", -5, 500, 1)],
            &["z", "y", "x"],
        ),
    ];
    for (pods, want) in cases {
        let active: Vec<ActivePod> = pods.iter().map(|(n, p, r, _)| pod(n, *p, r * MI)).collect();
        let usages: Vec<PodUsage> = pods.iter().map(|(n, _, _, u)| usage(n, u * MI, 0, 1)).collect();
        assert_eq!(order(active, &usages, Resource::Memory), *want, "{pods:?}");
    }
}

#[test]
fn a_pod_without_figures_goes_first() {
    let active = vec![pod("measured", 0, 0), pod("unknown", 1000, 0)];
    let usages = vec![usage("measured", 900 * MI, 0, 1)];
    assert_eq!(order(active, &usages, Resource::Memory), ["unknown", "measured"]);
}

#[test]
fn disk_ranks_by_writable_layer_against_the_ephemeral_request() {
    let mut within = pod("within", 0, 0);
    within.ephemeral_request = 10 << 30;
    let active = vec![within, pod("over", 0, 0), pod("over-big", 0, 0)];
    let usages = vec![
        usage("within", 0, 5 << 30, 1),
        usage("over", 0, 1 << 30, 1),
        usage("over-big", 0, 3 << 30, 1),
    ];
    assert_eq!(
        order(active, &usages, Resource::EphemeralStorage),
        ["over-big", "over", "within"]
    );
}

#[test]
fn pids_rank_by_priority_then_process_count() {
    let active = vec![pod("busy", 0, 0), pod("idle", 0, 0), pod("important", 10, 0)];
    let usages = vec![
        usage("busy", 0, 0, 500),
        usage("idle", 0, 0, 3),
        usage("important", 0, 0, 9000),
    ];
    assert_eq!(
        order(active, &usages, Resource::Pids),
        ["busy", "idle", "important"]
    );
}

#[test]
fn the_message_names_the_resource_threshold_and_containers_over_request() {
    let t = ThresholdSpec {
        signal: Signal::MemoryAvailable,
        value: Threshold::Quantity("100Mi".parse().unwrap()),
        grace: Duration::ZERO,
        hard: true,
        min_reclaim: None,
    };
    let obs = super::super::signals::Observation {
        available: 50 * (1 << 20),
        capacity: 4 << 30,
    };
    let p = pod("hog", 0, 64 * MI);
    let u = usage("hog", 300 * MI, 0, 1);
    assert_eq!(
        message(Resource::Memory, &t, Some(&obs), &p, Some(&u)),
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. \
         Container app was using 300Mi, request is 64Mi, has larger consumption of memory. "
    );
    let within = usage("hog", 10 * MI, 0, 1);
    assert_eq!(
        message(Resource::Memory, &t, Some(&obs), &p, Some(&within)),
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. "
    );
}
