//! The selection rules as tables: which dead containers and sandboxes a pass removes.

use super::*;

const S: i64 = 1_000_000_000;
const NOW: i64 = 10_000 * S;

/// `uid`/`name` instance number `restart`, created `ago` seconds before NOW.
fn inst(uid: &str, name: &str, restart: u32, ago: i64, running: bool) -> Instance {
    Instance {
        id: format!("{uid}/{name}/{restart}"),
        uid: uid.into(),
        name: name.into(),
        created_at: NOW - ago * S,
        restart_count: restart,
        running,
        unknown: false,
    }
}

/// A container that ran `dead` times before (instances 0..dead, each created 100 s apart, the oldest first)
/// and now runs instance `dead`.
fn crash_looped(uid: &str, dead: u32) -> Vec<Instance> {
    let mut v: Vec<Instance> = (0..dead)
        .map(|r| inst(uid, "app", r, i64::from(1000 - r * 100), false))
        .collect();
    v.push(inst(uid, "app", dead, 1, true));
    v
}

fn policy(max_per_container: i32, max_containers: i32, min_age_secs: u64) -> ContainerPolicy {
    ContainerPolicy {
        min_age: Duration::from_secs(min_age_secs),
        max_per_container,
        max_containers,
    }
}

fn ids(v: &[Victim]) -> Vec<&str> {
    v.iter().map(|v| v.id.as_str()).collect()
}

#[test]
fn dead_containers_of_living_pods_follow_the_policy() {
    let living = KnownPods::running(["p"]);
    let all = crash_looped("p", 4);
    // (policy, removed): instance 4 runs, 3 is the newest dead one; removal goes oldest first
    let table: [(ContainerPolicy, Vec<&str>); 5] = [
        (policy(1, -1, 0), vec!["p/app/0", "p/app/1", "p/app/2"]),
        (policy(2, -1, 0), vec!["p/app/0", "p/app/1"]),
        (policy(-1, -1, 0), vec![]),
        // 0 per container: the newest dead instance stays all the same (lastState, logs --previous)
        (policy(0, -1, 0), vec!["p/app/0", "p/app/1", "p/app/2"]),
        // min age: instance 0 was created 1000 s ago, 1 900 s, 2 800 s
        (policy(0, -1, 850), vec!["p/app/0", "p/app/1"]),
    ];
    for (p, want) in table {
        let got = containers(&all, NOW, &p, Some(&living), Scope::Deleted);
        assert_eq!(ids(&got), want, "{p:?}");
    }
}

#[test]
fn a_container_waiting_to_restart_keeps_its_last_two_instances() {
    // in back-off: the newest instance is dead too; the status shows it and the previous one
    let living = KnownPods::running(["p"]);
    let all: Vec<Instance> = (0..4)
        .map(|r| inst("p", "app", r, i64::from(1000 - r * 100), false))
        .collect();
    let got = containers(&all, NOW, &policy(0, -1, 0), Some(&living), Scope::Deleted);
    assert_eq!(ids(&got), ["p/app/0", "p/app/1"]);
    let got = containers(&all, NOW, &policy(1, 0, 0), Some(&living), Scope::Deleted);
    assert_eq!(
        ids(&got),
        ["p/app/0", "p/app/1"],
        "a cap of 0 cannot take them either"
    );
}

#[test]
fn a_deleted_pod_loses_every_dead_container_but_running_ones_stay() {
    let known = KnownPods::running(["other"]);
    let mut all = crash_looped("gone", 3);
    all.push(inst("gone", "side", 0, 50, false));
    let got = containers(&all, NOW, &policy(1, -1, 0), Some(&known), Scope::Deleted);
    let mut got = ids(&got);
    got.sort_unstable();
    assert_eq!(got, ["gone/app/0", "gone/app/1", "gone/app/2", "gone/side/0"]);
    // min age still holds for them
    let got = containers(&all, NOW, &policy(1, -1, 60), Some(&known), Scope::Deleted);
    assert!(!ids(&got).contains(&"gone/side/0"), "{got:?}");
}

#[test]
fn before_the_pod_sources_are_seen_every_pod_counts_as_living() {
    let all = crash_looped("unknown", 3);
    let got = containers(&all, NOW, &policy(0, -1, 0), None, Scope::Deleted);
    assert_eq!(ids(&got), ["unknown/app/0", "unknown/app/1"]);
}

#[test]
fn reclaiming_everything_unused_also_takes_terminated_pods() {
    let mut known = KnownPods::running(["live"]);
    known.insert("done", true);
    let all: Vec<Instance> = [("done", 0), ("done", 1), ("live", 0), ("live", 1), ("live", 2)]
        .into_iter()
        .map(|(uid, r)| inst(uid, "app", r, i64::from(500 - r * 100), false))
        .collect();
    let periodic = containers(&all, NOW, &policy(1, -1, 0), Some(&known), Scope::Deleted);
    assert_eq!(ids(&periodic), ["live/app/0"]);
    let mut reclaim = ids(&containers(
        &all,
        NOW,
        &policy(1, -1, 0),
        Some(&known),
        Scope::AllUnused,
    ))
    .join(" ");
    reclaim += " ";
    for id in ["done/app/0", "done/app/1", "live/app/0"] {
        assert!(reclaim.contains(&format!("{id} ")), "{reclaim}");
    }
    assert!(
        !reclaim.contains("live/app/1") && !reclaim.contains("live/app/2"),
        "{reclaim}"
    );
}

#[test]
fn the_node_wide_cap_is_shared_between_pods_then_taken_oldest_first() {
    let living = KnownPods::running(["a", "b"]);
    let mut all = crash_looped("a", 6);
    all.extend(crash_looped("b", 6));
    // 6 dead each, 12 > 4: an equal share of 2 each stays (instances 5 and 4), the older ones go
    let got = containers(&all, NOW, &policy(-1, 4, 0), Some(&living), Scope::Deleted);
    let mut got = ids(&got);
    got.sort_unstable();
    assert_eq!(
        got,
        [
            "a/app/0", "a/app/1", "a/app/2", "a/app/3", "b/app/0", "b/app/1", "b/app/2", "b/app/3"
        ]
    );

    // three pods whose newest dead instance is too young to count: one each is left after the share,
    // then the oldest of those goes
    let living = KnownPods::running(["x", "y", "z"]);
    let mut all = Vec::new();
    for (uid, offset) in [("x", 0), ("y", 10), ("z", 20)] {
        all.push(inst(uid, "app", 0, 1000 - offset, false));
        all.push(inst(uid, "app", 1, 900 - offset, false));
        all.push(inst(uid, "app", 2, 5, false));
        all.push(inst(uid, "app", 3, 1, true));
    }
    let got = containers(&all, NOW, &policy(-1, 2, 60), Some(&living), Scope::Deleted);
    let got = ids(&got);
    assert_eq!(got.len(), 4, "{got:?}");
    for id in ["x/app/0", "y/app/0", "z/app/0"] {
        assert!(got.contains(&id), "{got:?}");
    }
    assert_eq!(got[3], "x/app/1", "the oldest remaining goes last: {got:?}");
}

#[test]
fn unknown_state_containers_are_stopped_first() {
    let known = KnownPods::default();
    let mut c = inst("gone", "app", 0, 100, false);
    c.unknown = true;
    let got = containers(&[c], NOW, &policy(1, -1, 0), Some(&known), Scope::Deleted);
    assert_eq!(got.len(), 1);
    assert!(got[0].stop_first);
}

fn sb(uid: &str, id: &str, ago: i64, ready: bool) -> SandboxInstance {
    SandboxInstance {
        id: id.into(),
        uid: uid.into(),
        created_at: NOW - ago * S,
        ready,
    }
}

#[test]
fn sandboxes_go_when_inactive_and_not_the_newest_of_a_living_pod() {
    let all = [
        sb("p", "p-old", 300, false),
        sb("p", "p-with-containers", 200, false),
        sb("p", "p-newest", 100, false),
        sb("q", "q-old", 300, false),
        sb("q", "q-ready", 100, true),
        sb("gone", "g-old", 300, false),
        sb("gone", "g-busy", 200, false),
        sb("gone", "g-newest", 100, false),
    ];
    let busy: HashSet<&str> = ["p-with-containers", "g-busy"].into();
    let known = KnownPods::running(["p", "q"]);
    let got = sandboxes(&all, &busy, Some(&known), Scope::Deleted);
    assert_eq!(got, ["g-old", "g-newest", "p-old", "q-old"]);
    // before the sources are seen: every pod keeps its newest
    let got = sandboxes(&all, &busy, None, Scope::Deleted);
    assert_eq!(got, ["g-old", "p-old", "q-old"]);
}

#[test]
fn log_directories_of_pods_that_are_gone() {
    let names: Vec<String> = ["default_web_uid-a", "default_job_uid-b", "stray"]
        .map(String::from)
        .into();
    let known = KnownPods::running(["uid-a"]);
    assert_eq!(log_dirs(&names, Some(&known)), ["default_job_uid-b"]);
    assert!(log_dirs(&names, None).is_empty());
}
