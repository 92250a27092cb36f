//! Which dead containers, sandboxes and pod log directories a container GC pass removes — pure functions over
//! what the runtime listed and which pods the node still has, so the kubelet's rules are tested as tables.
//!
//! Containers (the kubelet's order): only containers that are not running and were created at least `min_age`
//! ago are candidates, grouped by pod UID and container name. Once every pod source has been seen, a pod the
//! node no longer has loses all its candidates (so does a terminated pod when everything unused goes, see
//! [`Scope::AllUnused`]); in every other group the newest `max_per_container` candidates stay; then, when more
//! than `max_containers` candidates remain on the node, each group is cut to an equal share (at least one) and,
//! if that is still too many, the oldest go first across all groups.
//!
//! One rule of this agent's on top: of a pod the node still has (or may have — before the sources are seen every
//! pod counts), the two newest instances of each container are never removed, whatever the policy says. The
//! pod's status reads them (restart count from the newest, `lastState` from the one before) and so do
//! `containerLogs` and `containerLogs?previous=true`; keeping more dead instances changes neither, as both read
//! only the two newest.
//!
//! Sandboxes: one that is ready, or still holds a container, is active and stays. Of a pod the node no longer has,
//! every inactive sandbox goes; of any other pod every inactive sandbox but the newest.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::pods::KnownPods;

/// The container GC policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerPolicy {
    /// Only containers created at least this long ago are removed.
    pub min_age: Duration,
    /// Dead instances kept per container of a pod; negative: no limit.
    pub max_per_container: i32,
    /// Dead containers kept on the node; negative: no limit.
    pub max_containers: i32,
}

/// Which pods lose all their dead containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Pods the node no longer has (the periodic collection).
    Deleted,
    /// Also pods that are terminated but not deleted yet (reclaiming disk before eviction; the kubelet's
    /// `DeleteAllUnusedContainers`).
    AllUnused,
}

/// One container as the runtime listed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// Runtime id.
    pub id: String,
    /// Its pod's UID.
    pub uid: String,
    /// Container name in the pod spec.
    pub name: String,
    /// Created, Unix nanoseconds.
    pub created_at: i64,
    /// The restart count it was created with.
    pub restart_count: u32,
    /// Running (never a candidate).
    pub running: bool,
    /// In an unknown state: stopped before it is removed.
    pub unknown: bool,
}

/// A container to remove.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Victim {
    /// Runtime id.
    pub id: String,
    /// Its pod's UID (for logs).
    pub uid: String,
    /// Container name (for logs).
    pub name: String,
    /// Stop it first (unknown state).
    pub stop_first: bool,
}

/// Whether everything of pod `uid` may go: only once the pod sources are all seen (`pods` is `Some`).
fn removable(pods: Option<&KnownPods>, uid: &str, scope: Scope) -> bool {
    pods.is_some_and(|p| !p.exists(uid) || (scope == Scope::AllUnused && p.terminated(uid)))
}

/// Newest first: restart count, then creation time (the order the pod's status reads them in).
fn newest_first(a: &Instance, b: &Instance) -> std::cmp::Ordering {
    (b.restart_count, b.created_at).cmp(&(a.restart_count, a.created_at))
}

/// The dead containers to remove, in removal order.
pub fn containers(
    all: &[Instance],
    now_ns: i64,
    policy: &ContainerPolicy,
    pods: Option<&KnownPods>,
    scope: Scope,
) -> Vec<Victim> {
    // the two newest instances of every container of a pod that stays
    let mut by_container: HashMap<(&str, &str), Vec<&Instance>> = HashMap::new();
    for c in all {
        by_container.entry((&c.uid, &c.name)).or_default().push(c);
    }
    let mut protected: HashSet<&str> = HashSet::new();
    for ((uid, _), group) in &mut by_container {
        if removable(pods, uid, scope) {
            continue;
        }
        group.sort_by(|a, b| newest_first(a, b));
        protected.extend(group.iter().take(2).map(|c| c.id.as_str()));
    }

    let min_age_ns = i64::try_from(policy.min_age.as_nanos()).unwrap_or(i64::MAX);
    let newest_allowed = now_ns.saturating_sub(min_age_ns);
    let mut units: HashMap<(&str, &str), Vec<&Instance>> = HashMap::new();
    for c in all
        .iter()
        .filter(|c| !c.running && c.created_at <= newest_allowed)
    {
        units.entry((&c.uid, &c.name)).or_default().push(c);
    }
    let mut victims = Vec::new();
    let mut take = |c: &Instance| {
        victims.push(Victim {
            id: c.id.clone(),
            uid: c.uid.clone(),
            name: c.name.clone(),
            stop_first: c.unknown,
        });
    };
    // pods that are gone lose everything
    let mut units: Vec<Vec<&Instance>> = units
        .into_iter()
        .filter_map(|((uid, _), mut unit)| {
            unit.sort_by(|a, b| newest_first(a, b));
            if removable(pods, uid, scope) {
                unit.iter().rev().for_each(|c| take(c));
                None
            } else {
                Some(unit)
            }
        })
        .collect();
    // deterministic order between units (oldest newest instance first)
    units.sort_by_key(|u| u.first().map(|c| (c.created_at, c.id.clone())));
    let is_protected = |c: &Instance| protected.contains(c.id.as_str());
    if let Ok(keep) = usize::try_from(policy.max_per_container) {
        for unit in &mut units {
            keep_newest(unit, keep, &is_protected, &mut take);
        }
    }
    if let Ok(max) = usize::try_from(policy.max_containers) {
        let total: usize = units.iter().map(Vec::len).sum();
        let groups = units.iter().filter(|u| !u.is_empty()).count();
        if total > max && groups > 0 {
            let share = (max / groups).max(1);
            for unit in &mut units {
                keep_newest(unit, share, &is_protected, &mut take);
            }
            let mut left: Vec<&Instance> = units.iter().flatten().copied().collect();
            if left.len() > max {
                left.sort_by(|a, b| b.created_at.cmp(&a.created_at).then_with(|| b.id.cmp(&a.id)));
                let mut excess = left.len() - max;
                for c in left.iter().rev() {
                    if excess == 0 {
                        break;
                    }
                    if !is_protected(c) {
                        take(c);
                        excess -= 1;
                    }
                }
            }
        }
    }
    victims
}

/// Keeps the newest `keep` of `unit` (sorted newest first) and the protected ones; the rest go, oldest first.
fn keep_newest(
    unit: &mut Vec<&Instance>,
    keep: usize,
    protected: &impl Fn(&Instance) -> bool,
    take: &mut impl FnMut(&Instance),
) {
    if unit.len() <= keep {
        return;
    }
    let tail = unit.split_off(keep);
    for c in tail.iter().rev() {
        if !protected(c) {
            take(c);
        }
    }
    unit.extend(tail.into_iter().filter(|c| protected(c)));
}

/// One sandbox as the runtime listed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxInstance {
    /// Runtime id.
    pub id: String,
    /// Its pod's UID.
    pub uid: String,
    /// Created, Unix nanoseconds.
    pub created_at: i64,
    /// Ready.
    pub ready: bool,
}

/// The sandboxes to remove: inactive ones (not ready, holding no container of `with_containers`) of pods that
/// are gone, and of other pods all but the newest.
pub fn sandboxes(
    all: &[SandboxInstance],
    with_containers: &HashSet<&str>,
    pods: Option<&KnownPods>,
    scope: Scope,
) -> Vec<String> {
    let mut by_pod: HashMap<&str, Vec<&SandboxInstance>> = HashMap::new();
    for s in all {
        by_pod.entry(&s.uid).or_default().push(s);
    }
    let mut out = Vec::new();
    let mut pods_sorted: Vec<_> = by_pod.into_iter().collect();
    pods_sorted.sort_by_key(|(uid, _)| *uid);
    for (uid, mut group) in pods_sorted {
        group.sort_by(|a, b| b.created_at.cmp(&a.created_at).then_with(|| b.id.cmp(&a.id)));
        let skip = usize::from(!removable(pods, uid, scope));
        out.extend(
            group
                .iter()
                .skip(skip)
                .rev()
                .filter(|s| !s.ready && !with_containers.contains(s.id.as_str()))
                .map(|s| s.id.clone()),
        );
    }
    out
}

/// The pod log directories (`<namespace>_<name>_<uid>`) of pods the node no longer has; none before the pod
/// sources are all seen.
pub fn log_dirs<'a>(names: &'a [String], pods: Option<&KnownPods>) -> Vec<&'a str> {
    let Some(pods) = pods else {
        return Vec::new();
    };
    names
        .iter()
        .filter(|n| {
            n.rsplit_once('_')
                .is_some_and(|(_, uid)| !uid.is_empty() && !pods.exists(uid))
        })
        .map(String::as_str)
        .collect()
}

#[cfg(test)]
#[path = "select_tests.rs"]
mod tests;
