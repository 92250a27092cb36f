//! What the host allows or supports, as the kubelet's admit handlers judge a pod against it: its sysctls against
//! the node's allowlist (`SysctlForbidden`), its OS (`PodOSSelectorNodeLabelDoesNotMatch`, `PodOSNotSupported`),
//! `supplementalGroupsPolicy: Strict` (`SupplementalGroupsPolicyNotSupported`) and its AppArmor profiles
//! (`AppArmor`).

use k8s_openapi::api::core::v1::Pod;

use super::Rejection;
use crate::pods::model::node_view::NodeView;
use crate::pods::model::spec::DesiredPod;
use crate::sysctl::Allowlist;

/// The OS this agent runs pods of.
const NODE_OS: &str = "linux";

/// The pod's sysctls, judged against the node's allowlist (`SysctlForbidden`), as the kubelet's sysctl
/// admission handler.
pub(super) fn admit_sysctls(pod: &Pod, sysctls: &Allowlist) -> Result<(), Rejection> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(());
    };
    let asked = spec
        .security_context
        .as_ref()
        .and_then(|sc| sc.sysctls.as_deref())
        .unwrap_or_default();
    for s in asked {
        let host_network = spec.host_network.unwrap_or(false);
        let host_ipc = spec.host_ipc.unwrap_or(false);
        if let Err(why) = sysctls.check(&s.name, host_network, host_ipc) {
            return Err(Rejection {
                reason: "SysctlForbidden".into(),
                message: format!("forbidden sysctl: {why}"),
            });
        }
    }
    Ok(())
}

/// The pod's OS, as the kubelet judges it before its other predicates: a `kubernetes.io/os` label on the pod
/// naming another OS than the node's (`PodOSSelectorNodeLabelDoesNotMatch`), or `spec.os.name` naming another
/// (`PodOSNotSupported`).
pub(super) fn admit_os(pod: &Pod) -> Result<(), Rejection> {
    // as the kubelet: the node's label counts as this OS even when it says otherwise (the node status loop
    // puts it right)
    let label = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("kubernetes.io/os"));
    if label.is_some_and(|os| os != NODE_OS) {
        return Err(Rejection {
            reason: "PodOSSelectorNodeLabelDoesNotMatch".into(),
            message: "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label".into(),
        });
    }
    let os = pod
        .spec
        .as_ref()
        .and_then(|s| s.os.as_ref())
        .map(|os| os.name.as_str());
    if os.is_some_and(|os| os != NODE_OS) {
        return Err(Rejection {
            reason: "PodOSNotSupported".into(),
            message: "Failed to admit pod as the OS field doesn't match node OS".into(),
        });
    }
    Ok(())
}

/// `supplementalGroupsPolicy: Strict` on a node whose runtime does not support it, as the kubelet refuses it.
pub(super) fn admit_supplemental_groups(desired: &DesiredPod, node: &NodeView) -> Result<(), Rejection> {
    let strict = desired
        .security
        .as_deref()
        .is_some_and(|p| p.supplemental_groups_strict);
    if strict && !node.supplemental_groups_policy {
        return Err(Rejection {
            reason: "SupplementalGroupsPolicyNotSupported".into(),
            message: "SupplementalGroupsPolicy=Strict is not supported in this node".into(),
        });
    }
    Ok(())
}

/// AppArmor as the kubelet's admit handler judges it: a pod asking for any profile but `Unconfined` (by field or
/// the deprecated annotation) needs a host with AppArmor enabled, and a `Localhost` profile needs a name.
pub(super) fn admit_apparmor(desired: &DesiredPod, apparmor_enabled: bool) -> Result<(), Rejection> {
    use crate::pods::model::security::{APPARMOR_ANNOTATION_PREFIX, AppArmor};
    let confined = |a: Option<&AppArmor>| a.is_some_and(|a| *a != AppArmor::Unconfined);
    let pod_level = confined(desired.security.as_deref().and_then(|p| p.apparmor.as_ref()));
    let containers = || desired.init_containers.iter().chain(desired.containers.iter());
    let own = containers().any(|c| confined(c.security.as_deref().and_then(|s| s.apparmor.as_ref())));
    let annotated = desired
        .annotations
        .iter()
        .find(|(k, _)| k.starts_with(APPARMOR_ANNOTATION_PREFIX))
        .is_some_and(|(_, v)| v != "unconfined");
    if !(pod_level || own || annotated) {
        return Ok(());
    }
    let refuse = |why: String| Rejection {
        reason: "AppArmor".into(),
        message: format!("Cannot enforce AppArmor: {why}"),
    };
    if !apparmor_enabled {
        return Err(refuse("AppArmor is not enabled on the host".into()));
    }
    for c in containers() {
        let profile = desired.apparmor(c);
        if let Some(AppArmor::Localhost(name)) = profile.as_deref()
            && name.trim().is_empty()
        {
            return Err(refuse(format!(
                "invalid empty AppArmor profile name (container {:?})",
                c.name
            )));
        }
    }
    Ok(())
}
