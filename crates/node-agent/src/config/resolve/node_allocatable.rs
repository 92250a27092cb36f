//! What the node keeps from its pods through cgroups: `enforceNodeAllocatable` (which reservations are enforced
//! on which cgroups) and `qosReserved` (memory held back from the lower QoS classes).

use std::collections::BTreeMap;

use crate::config::check::Check;

/// `enforceNodeAllocatable` checked as the kubelet checks it: known values, no duplicates, `none` alone, a
/// `kube-reserved*` / `system-reserved*` value only with its cgroup named, and none of them without
/// `cgroupsPerQOS`. Not given: `[pods]`, or nothing with `cgroupsPerQOS: false` (where the kubelet would refuse
/// its own default, node-agent enforces nothing). `[none]` resolves to nothing.
pub(super) fn enforce_node_allocatable(
    c: &mut Check<'_>,
    given: Option<&[String]>,
    cgroups_per_qos: bool,
    kube_cgroup: &str,
    system_cgroup: &str,
) -> Vec<String> {
    const FIELD: &str = "enforceNodeAllocatable";
    let Some(given) = given else {
        return if cgroups_per_qos {
            vec!["pods".to_owned()]
        } else {
            Vec::new()
        };
    };
    let mut out: Vec<String> = Vec::new();
    for value in given {
        if out.contains(value) {
            c.err(FIELD, format!("{value:?} is given twice"));
            continue;
        }
        match value.as_str() {
            "pods" => {}
            "kube-reserved" | "kube-reserved-compressible" if kube_cgroup.is_empty() => {
                c.err(FIELD, format!("{value:?} needs kubeReservedCgroup"))
            }
            "system-reserved" | "system-reserved-compressible" if system_cgroup.is_empty() => {
                c.err(FIELD, format!("{value:?} needs systemReservedCgroup"))
            }
            "kube-reserved"
            | "kube-reserved-compressible"
            | "system-reserved"
            | "system-reserved-compressible" => {}
            "none" => {
                if given.len() > 1 {
                    c.err(FIELD, "\"none\" may not be given with other values".to_owned());
                }
                continue;
            }
            other => {
                c.err(
                    FIELD,
                    format!(
                        "{other:?} must be pods, system-reserved, system-reserved-compressible, kube-reserved, \
                         kube-reserved-compressible or none"
                    ),
                );
                continue;
            }
        }
        if !cgroups_per_qos {
            c.err(FIELD, format!("{value:?} needs cgroupsPerQOS: true"));
        }
        out.push(value.clone());
    }
    for name in ["kube-reserved", "system-reserved"] {
        let compressible = format!("{name}-compressible");
        if out.iter().any(|v| v == name) && out.contains(&compressible) {
            c.err(
                FIELD,
                format!("{name:?} and {compressible:?} may not be given together"),
            );
        }
    }
    out
}

/// `qosReserved` as the kubelet parses it at start (whatever its feature gate): only `memory`, as a whole
/// percentage from 0% to 100%.
pub(super) fn qos_reserved(c: &mut Check<'_>, given: Option<&BTreeMap<String, String>>) -> Option<i64> {
    let mut memory = None;
    for (resource, value) in given.into_iter().flatten() {
        if resource != "memory" {
            c.err("qosReserved", format!("cannot reserve {resource:?} resource"));
            continue;
        }
        match value
            .strip_suffix('%')
            .and_then(|n| n.parse::<i64>().ok())
            .filter(|p| (0..=100).contains(p))
        {
            Some(p) => memory = Some(p),
            None => c.err(
                "qosReserved",
                format!("{value:?} for \"memory\" must be a percentage between 0% and 100%"),
            ),
        }
    }
    memory
}
