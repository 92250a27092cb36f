//! Which pod goes first, and what it is told: the kubelet's ranking per resource and its eviction message.
//!
//! * memory: pods using more than they request first, then lower priority first, then the larger use above
//!   the request first;
//! * ephemeral-storage and inodes: the same, with the pod's disk use (its containers' writable layers);
//! * pids: lower priority first, then more processes first.
//!
//! A pod without usage figures goes before every pod with them (it may be the one using the resource).

use std::cmp::Ordering;

use crate::pods::manager::control::ActivePod;
use crate::quantity::{Format, Quantity};
use crate::stats::PodUsage;

use super::signals::{Observation, Resource, ThresholdSpec};

fn usage(resource: Resource, u: &PodUsage) -> i128 {
    i128::from(match resource {
        Resource::Memory => u.working_set,
        Resource::EphemeralStorage => u.rootfs_bytes(),
        Resource::Pids => u.processes,
        Resource::Inodes => 0,
    })
}

fn request(resource: Resource, c: &ActivePod) -> i128 {
    i128::from(match resource {
        Resource::Memory => c.memory_request,
        Resource::EphemeralStorage => c.ephemeral_request,
        Resource::Inodes | Resource::Pids => 0,
    })
}

/// Orders `pods` for eviction of `resource` (first = evicted first). `usage_of` finds a pod's usage by UID.
pub fn rank<'a>(pods: &mut [ActivePod], resource: Resource, usage_of: impl Fn(&str) -> Option<&'a PodUsage>) {
    pods.sort_by(|a, b| {
        let (ua, ub) = (usage_of(&a.uid), usage_of(&b.uid));
        // no figures first
        let (ua, ub) = match (ua, ub) {
            (Some(ua), Some(ub)) => (ua, ub),
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (None, None) => return a.priority.cmp(&b.priority),
        };
        let priority = a.priority.cmp(&b.priority);
        if resource == Resource::Pids {
            return priority.then_with(|| usage(resource, ub).cmp(&usage(resource, ua)));
        }
        let above = |c: &ActivePod, u: &PodUsage| usage(resource, u) - request(resource, c);
        let exceeds_a = above(a, ua) > 0;
        let exceeds_b = above(b, ub) > 0;
        exceeds_b
            .cmp(&exceeds_a)
            .then(priority)
            .then_with(|| above(b, ub).cmp(&above(a, ua)))
    });
}

fn bytes(v: i128) -> String {
    Quantity::from_units(i64::try_from(v).unwrap_or(i64::MAX), Format::BinarySI).to_string()
}

/// The eviction message (status message, event and `DisruptionTarget` condition) for `pod`, evicted to reclaim
/// `resource` because `threshold` is met at `obs`.
pub fn message(
    resource: Resource,
    threshold: &ThresholdSpec,
    obs: Option<&Observation>,
    pod: &ActivePod,
    usage: Option<&PodUsage>,
) -> String {
    let mut m = format!("The node was low on resource: {}. ", resource.as_str());
    if let Some(o) = obs {
        let quantity = match &threshold.value {
            crate::config::Threshold::Quantity(q) => q.to_string(),
            crate::config::Threshold::Percentage(_) => bytes(i128::from(threshold.quantity(o.capacity))),
        };
        m += &format!(
            "Threshold quantity: {quantity}, available: {}. ",
            bytes(i128::from(o.available))
        );
    }
    let Some(usage) = usage else { return m };
    for c in usage.containers.iter() {
        let Some((_, mem_req, eph_req)) = pod.containers.iter().find(|(n, ..)| *n == c.name) else {
            continue;
        };
        let (used, req) = match resource {
            Resource::Memory => (i128::from(c.working_set), i128::from(*mem_req)),
            Resource::EphemeralStorage => (i128::from(c.rootfs_bytes), i128::from(*eph_req)),
            _ => continue,
        };
        if used > req {
            m += &format!(
                "Container {} was using {}, request is {}, has larger consumption of {}. ",
                c.name,
                bytes(used),
                bytes(req),
                resource.as_str()
            );
        }
    }
    m
}

#[cfg(test)]
#[path = "rank_tests.rs"]
mod tests;
