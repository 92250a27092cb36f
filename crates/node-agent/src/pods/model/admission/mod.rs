//! Pod admission: the kubelet's last check before it runs a pod the scheduler (or someone setting
//! `spec.nodeName` directly) sent here.
//!
//! This module judges a pod against [`NodeView`] — the few facts about the node that pods are judged against (allocatable,
//! labels, `NoExecute` taints, host IPs) — and [`admit`], which first refuses pod fields this node does not
//! honour ([`crate::pods::model::fields`], `UnsupportedPodField`), then applies the kubelet's rules in its order:
//! node pressure (`Evicted`), sysctls (`SysctlForbidden`), the pod's OS (`PodOSSelectorNodeLabelDoesNotMatch`,
//! `PodOSNotSupported`), the supplemental groups policy (`SupplementalGroupsPolicyNotSupported`), node selector and
//! required node affinity (`NodeAffinity`), host ports (`NodePorts`), resources (`OutOfcpu`, `OutOfmemory`,
//! `OutOfephemeral-storage`, `OutOfpods`, `OutOf<extended resource>`, `OutOfhugepages-<size>`), untolerated `NoExecute` taints
//! (`TaintToleration`), and AppArmor profiles the host cannot enforce (`AppArmor`). [`admit_devices`] is the device
//! manager's check of device plugin resources (`UnexpectedAdmissionError`). A rejection carries the reason and
//! message the pod's status and event show.
//!
//! [`admit`], which runs the predicates in that order, and [`Rejection`] are here; the predicates are grouped by
//! what they judge: node pressure in `pressure`, what the host allows in `host`, the node's labels
//! and taints in `placement`, and requests against what is committed in `fit`.

use k8s_openapi::api::core::v1::{Pod, Toleration};

use crate::pods::model::node_view::NodeView;
use crate::pods::model::spec::DesiredPod;
use crate::sysctl::Allowlist;

mod fit;
mod host;
mod placement;
mod pressure;

pub use fit::{Committed, UNEXPECTED_ADMISSION_ERROR, admit_devices, fit_resources, scalar_requests};
pub use pressure::{EVICTED, admit_under_pressure};

use fit::{fit_extended, host_ports, short};
use host::{admit_apparmor, admit_os, admit_supplemental_groups, admit_sysctls};
use placement::{matches_node, required_terms, tolerates, tolerates_effect};

/// Why a pod was refused. Its status becomes `Failed` with this reason and `Pod was rejected: <message>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The kubelet's reason: `OutOfcpu`, `OutOfmemory`, `OutOfpods`, `NodeAffinity`, `NodePorts`,
    /// `TaintToleration`, …
    pub reason: String,
    /// The human-readable explanation.
    pub message: String,
}

fn predicate(name: &str, why: &str) -> Rejection {
    Rejection {
        reason: name.to_owned(),
        message: format!("Predicate {name} failed: {why}"),
    }
}

/// Decides whether `pod` may run on the node next to what is `committed`, allowing the sysctls of `sysctls`;
/// `apparmor_enabled` says whether the host enforces AppArmor profiles.
pub fn admit(
    pod: &Pod,
    desired: &DesiredPod,
    node: &NodeView,
    committed: &Committed,
    critical: bool,
    sysctls: &Allowlist,
    apparmor_enabled: bool,
) -> Result<(), Rejection> {
    let refused = crate::pods::model::fields::refusals(pod);
    if !refused.is_empty() {
        let message: Vec<String> = refused.iter().map(ToString::to_string).collect();
        return Err(Rejection {
            reason: crate::pods::model::fields::REASON.into(),
            message: message.join("; "),
        });
    }
    let spec = pod.spec.as_ref();
    let tolerates_memory_pressure = spec
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default()
        .iter()
        .any(|t| tolerates_effect(t, "node.kubernetes.io/memory-pressure", "", "NoSchedule"));
    admit_under_pressure(
        node.pressure,
        critical,
        desired.qos == crate::pods::model::resources::QosClass::BestEffort,
        tolerates_memory_pressure,
    )
    .map_err(|message| Rejection {
        reason: EVICTED.into(),
        message,
    })?;
    admit_sysctls(pod, sysctls)?;
    admit_os(pod)?;
    admit_supplemental_groups(desired, node)?;
    if !matches_node(
        spec.and_then(|s| s.node_selector.as_ref()),
        spec.and_then(required_terms),
        node,
    ) {
        return Err(predicate(
            "NodeAffinity",
            "node(s) didn't match Pod's node affinity/selector",
        ));
    }
    if host_ports(desired).any(|p| committed.host_ports.contains(&p)) {
        return Err(predicate(
            "NodePorts",
            "node(s) didn't have free ports for the requested pod ports",
        ));
    }
    if committed.pods + 1 > node.pods {
        return Err(short("pods", 1, committed.pods, node.pods));
    }
    fit_resources(desired.requests(), committed.requests, node)?;
    fit_extended(desired, committed, node)?;
    let tolerations: &[Toleration] = spec.and_then(|s| s.tolerations.as_deref()).unwrap_or_default();
    let untolerated = node
        .no_execute_taints
        .iter()
        .any(|(key, value)| !tolerations.iter().any(|t| tolerates(t, key, value)));
    if untolerated {
        return Err(predicate("TaintToleration", "node(s) had untolerated taint(s)"));
    }
    admit_apparmor(desired, apparmor_enabled)
}

#[cfg(test)]
mod pressure_tests;

#[cfg(test)]
mod tests;
