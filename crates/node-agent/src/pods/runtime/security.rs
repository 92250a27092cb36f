//! Pod and container security contexts as the kubelet hands them to the runtime: the container's own settings
//! over the pod's (run as user / group, read-only root filesystem, privileged, capabilities, privilege
//! escalation, seccomp, AppArmor, the proc mount's masked and read-only paths), supplemental groups (`fsGroup`
//! first, and the `Strict` policy),
//! namespace sharing (`hostNetwork`, `hostPID`, `hostIPC`, `shareProcessNamespace`) and sysctls for the sandbox.
//! `runAsNonRoot` with `runAsUser: 0` fails the container with the kubelet's message; without `runAsUser` the
//! image's user (from `ImageStatus`: a uid, a user name, or neither — root) is checked ([`verify_image_user`]).

use std::collections::HashMap;

use runtime_api::cri;

use crate::pods::model::security::{AppArmor, Seccomp};
use crate::pods::model::spec::DesiredPod;

/// The masked paths of a container's /proc and /sys (the kubelet's defaults).
const MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/interrupts",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// The read-only paths of a container's /proc (the kubelet's defaults).
const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Where `Localhost` seccomp profiles live, relative to the agent's root directory.
fn seccomp_profile(s: Option<&Seccomp>, root_dir: &str) -> cri::SecurityProfile {
    match s {
        Some(Seccomp::RuntimeDefault) => cri::SecurityProfile {
            profile_type: cri::security_profile::ProfileType::RuntimeDefault as i32,
            localhost_ref: String::new(),
        },
        Some(Seccomp::Localhost(path)) => cri::SecurityProfile {
            profile_type: cri::security_profile::ProfileType::Localhost as i32,
            localhost_ref: format!("{root_dir}/seccomp/{path}"),
        },
        // the kubelet's default with seccompDefault off
        Some(Seccomp::Unconfined) | None => cri::SecurityProfile {
            profile_type: cri::security_profile::ProfileType::Unconfined as i32,
            localhost_ref: String::new(),
        },
    }
}

/// The CRI profile of `a` and its deprecated string form (still set for older runtimes, as the kubelet does).
fn apparmor_profile(a: &AppArmor) -> (cri::SecurityProfile, String) {
    use cri::security_profile::ProfileType;
    let (profile_type, localhost_ref, old) = match a {
        AppArmor::RuntimeDefault => (
            ProfileType::RuntimeDefault,
            String::new(),
            "runtime/default".to_owned(),
        ),
        AppArmor::Unconfined => (ProfileType::Unconfined, String::new(), "unconfined".to_owned()),
        AppArmor::Localhost(name) => (ProfileType::Localhost, name.clone(), format!("localhost/{name}")),
    };
    (
        cri::SecurityProfile {
            profile_type: profile_type as i32,
            localhost_ref,
        },
        old,
    )
}

fn supplemental_groups_policy(pod: &DesiredPod) -> i32 {
    let strict = pod
        .security
        .as_deref()
        .is_some_and(|p| p.supplemental_groups_strict);
    if strict {
        cri::SupplementalGroupsPolicy::Strict as i32
    } else {
        cri::SupplementalGroupsPolicy::Merge as i32
    }
}

/// The namespaces of the pod's sandbox and containers.
pub fn namespaces(pod: &DesiredPod) -> cri::NamespaceOption {
    let p = pod.security.as_deref();
    let mode = |host: bool, pod_wide: bool| {
        if host {
            cri::NamespaceMode::Node
        } else if pod_wide {
            cri::NamespaceMode::Pod
        } else {
            cri::NamespaceMode::Container
        }
    };
    cri::NamespaceOption {
        network: mode(pod.host_network, true) as i32,
        pid: mode(p.is_some_and(|p| p.host_pid), p.is_some_and(|p| p.share_pid)) as i32,
        ipc: mode(p.is_some_and(|p| p.host_ipc), true) as i32,
        ..Default::default()
    }
}

fn cri_se_linux(o: &crate::pods::model::security::SeLinux) -> cri::SeLinuxOption {
    cri::SeLinuxOption {
        user: o.user.clone(),
        role: o.role.clone(),
        r#type: o.type_.clone(),
        level: o.level.clone(),
    }
}

/// The sandbox's security context and sysctls.
pub fn sandbox(
    pod: &DesiredPod,
    root_dir: &str,
) -> (cri::LinuxSandboxSecurityContext, HashMap<String, String>) {
    let p = pod.security.as_deref();
    let privileged = pod
        .init_containers
        .iter()
        .chain(pod.containers.iter())
        .any(|c| c.security.as_ref().is_some_and(|s| s.privileged));
    let sc = cri::LinuxSandboxSecurityContext {
        namespace_options: Some(namespaces(pod)),
        run_as_user: p
            .and_then(|p| p.run_as_user)
            .map(|value| cri::Int64Value { value }),
        run_as_group: p
            .and_then(|p| p.run_as_group)
            .map(|value| cri::Int64Value { value }),
        supplemental_groups: p.map(|p| p.supplemental_groups.clone()).unwrap_or_default(),
        privileged,
        seccomp: Some(seccomp_profile(p.and_then(|p| p.seccomp.as_ref()), root_dir)),
        selinux_options: p.and_then(|p| p.se_linux.as_ref()).map(cri_se_linux),
        supplemental_groups_policy: supplemental_groups_policy(pod),
        ..Default::default()
    };
    let sysctls = p.map(|p| p.sysctls.iter().cloned().collect()).unwrap_or_default();
    (sc, sysctls)
}

/// The container's effective security context: its own settings over the pod's.
pub fn container(
    pod: &DesiredPod,
    c: &crate::pods::model::spec::ContainerSpec,
    root_dir: &str,
) -> Result<cri::LinuxContainerSecurityContext, String> {
    let p = pod.security.as_deref();
    let own = c.security.as_deref();
    let run_as_user = own.and_then(|s| s.run_as_user).or(p.and_then(|p| p.run_as_user));
    let run_as_group = own
        .and_then(|s| s.run_as_group)
        .or(p.and_then(|p| p.run_as_group));
    let non_root = own
        .and_then(|s| s.run_as_non_root)
        .or(p.and_then(|p| p.run_as_non_root))
        .unwrap_or(false);
    if non_root && run_as_user == Some(0) {
        return Err(format!(
            "container's runAsUser breaks non-root policy (pod: {:?}, container: {})",
            pod.display(),
            c.name
        ));
    }
    let unmasked = own.is_some_and(|s| s.unmasked_proc);
    let paths = |list: &[&str]| -> Vec<String> {
        if unmasked {
            Vec::new()
        } else {
            list.iter().map(|s| (*s).to_owned()).collect()
        }
    };
    let (apparmor, apparmor_profile) = match pod.apparmor(c) {
        Some(a) => {
            let (profile, old) = apparmor_profile(&a);
            (Some(profile), old)
        }
        None => (None, String::new()),
    };
    // the deprecated string form is still set for runtimes that read only it, as the kubelet does
    #[allow(deprecated)]
    let sc = cri::LinuxContainerSecurityContext {
        apparmor,
        apparmor_profile,
        supplemental_groups_policy: supplemental_groups_policy(pod),
        capabilities: own
            .filter(|s| !s.add_caps.is_empty() || !s.drop_caps.is_empty())
            .map(|s| cri::Capability {
                add_capabilities: s.add_caps.clone(),
                drop_capabilities: s.drop_caps.clone(),
                ..Default::default()
            }),
        privileged: own.is_some_and(|s| s.privileged),
        namespace_options: Some(namespaces(pod)),
        run_as_user: run_as_user.map(|value| cri::Int64Value { value }),
        run_as_group: run_as_group.map(|value| cri::Int64Value { value }),
        readonly_rootfs: own.is_some_and(|s| s.read_only_root_fs),
        supplemental_groups: p.map(|p| p.supplemental_groups.clone()).unwrap_or_default(),
        no_new_privs: own.and_then(|s| s.allow_privilege_escalation) == Some(false),
        masked_paths: paths(MASKED_PATHS),
        readonly_paths: paths(READONLY_PATHS),
        seccomp: Some(seccomp_profile(
            own.and_then(|s| s.seccomp.as_ref())
                .or(p.and_then(|p| p.seccomp.as_ref())),
            root_dir,
        )),
        // as the kubelet: the container's options, else the pod's; a runtime on a host without SELinux
        // ignores them
        selinux_options: own
            .and_then(|s| s.se_linux.as_ref())
            .or(p.and_then(|p| p.se_linux.as_ref()))
            .map(cri_se_linux),
        ..Default::default()
    };
    Ok(sc)
}

/// Whether `c` runs with `runAsNonRoot` and no `runAsUser`, so its image's user must be checked.
pub fn needs_image_user(pod: &DesiredPod, c: &crate::pods::model::spec::ContainerSpec) -> bool {
    let p = pod.security.as_deref();
    let own = c.security.as_deref();
    let non_root = own
        .and_then(|s| s.run_as_non_root)
        .or(p.and_then(|p| p.run_as_non_root));
    let user = own.and_then(|s| s.run_as_user).or(p.and_then(|p| p.run_as_user));
    non_root == Some(true) && user.is_none()
}

/// Checks `runAsNonRoot` (see [`needs_image_user`]) against the image's user as `ImageStatus` reports it: its
/// `uid`, else its `username`; an image naming neither runs as root. The kubelet's messages.
pub fn verify_image_user(
    pod: &DesiredPod,
    c: &crate::pods::model::spec::ContainerSpec,
    uid: Option<i64>,
    username: &str,
) -> Result<(), String> {
    let whose = format!("(pod: {:?}, container: {})", pod.display(), c.name);
    match uid {
        None if !username.is_empty() => Err(format!(
            "container has runAsNonRoot and image has non-numeric user ({username}), cannot verify user is \
             non-root {whose}"
        )),
        None | Some(0) => Err(format!(
            "container has runAsNonRoot and image will run as root {whose}"
        )),
        Some(uid) if !(0..=i64::from(i32::MAX)).contains(&uid) => Err(format!(
            "container has runAsNonRoot and image has an invalid user id ({uid}). (Must be 1-({})): must be \
             between 0 and {}, inclusive {whose}",
            i32::MAX,
            i32::MAX
        )),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> std::sync::Arc<DesiredPod> {
        let p = serde_json::from_value(
            json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": spec}),
        )
        .unwrap();
        DesiredPod::from_pod(&p).unwrap()
    }

    #[test]
    fn container_settings_override_the_pods() {
        let p = pod(json!({
            "securityContext": {"runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000, "supplementalGroups": [4000],
                                "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}],
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "hostIPC": true,
            "containers": [
                {"name": "a", "image": "i", "securityContext": {"runAsUser": 1001, "readOnlyRootFilesystem": true,
                    "allowPrivilegeEscalation": false, "capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}}},
                {"name": "b", "image": "i", "securityContext": {"privileged": true,
                                                                 "seccompProfile": {"type": "Unconfined"}}}
            ]
        }));
        let a = container(&p, &p.containers[0], "/var/lib/kubelet").unwrap();
        assert_eq!(a.run_as_user.map(|v| v.value), Some(1001));
        assert_eq!(a.run_as_group.map(|v| v.value), Some(3000));
        assert_eq!(a.supplemental_groups, [2000, 4000]);
        assert!(a.readonly_rootfs && a.no_new_privs && !a.privileged);
        let caps = a.capabilities.unwrap();
        assert_eq!(
            (caps.add_capabilities, caps.drop_capabilities),
            (vec!["NET_ADMIN".to_owned()], vec!["ALL".to_owned()])
        );
        assert_eq!(
            a.seccomp.unwrap().profile_type,
            cri::security_profile::ProfileType::RuntimeDefault as i32
        );
        assert!(a.masked_paths.contains(&"/proc/kcore".to_owned()));
        let ns = a.namespace_options.unwrap();
        assert_eq!(ns.ipc, cri::NamespaceMode::Node as i32);
        assert_eq!(ns.pid, cri::NamespaceMode::Container as i32);
        let b = container(&p, &p.containers[1], "/var/lib/kubelet").unwrap();
        assert!(b.privileged);
        assert_eq!(
            b.seccomp.unwrap().profile_type,
            cri::security_profile::ProfileType::Unconfined as i32
        );
        let (sb, sysctls) = sandbox(&p, "/var/lib/kubelet");
        assert!(
            sb.privileged,
            "a privileged container makes the sandbox privileged"
        );
        assert_eq!(sysctls["net.ipv4.ip_unprivileged_port_start"], "0");
    }

    #[test]
    fn defaults_are_unconfined_with_masked_proc_and_non_root_is_enforced() {
        let p = pod(json!({"containers": [{"name": "a", "image": "i"}]}));
        assert!(p.security.is_none());
        let a = container(&p, &p.containers[0], "/r").unwrap();
        assert_eq!(
            a.seccomp.unwrap().profile_type,
            cri::security_profile::ProfileType::Unconfined as i32
        );
        assert_eq!(a.readonly_paths.len(), READONLY_PATHS.len());
        assert_eq!(a.run_as_user, None);
        let root = pod(json!({"securityContext": {"runAsNonRoot": true, "runAsUser": 0},
                              "containers": [{"name": "a", "image": "i"}]}));
        let err = container(&root, &root.containers[0], "/r").unwrap_err();
        assert!(err.contains("runAsUser breaks non-root policy"), "{err}");
        let shared = pod(json!({"shareProcessNamespace": true, "containers": [{"name": "a", "image": "i"}]}));
        assert!(!needs_image_user(&shared, &shared.containers[0]));
        assert_eq!(namespaces(&shared).pid, cri::NamespaceMode::Pod as i32);
    }

    #[test]
    fn non_root_without_a_user_checks_the_images_user() {
        let p = pod(json!({"securityContext": {"runAsNonRoot": true}, "containers": [
            {"name": "a", "image": "i"},
            {"name": "b", "image": "i", "securityContext": {"runAsUser": 1000}},
            {"name": "c", "image": "i", "securityContext": {"runAsNonRoot": false}},
        ]}));
        assert!(needs_image_user(&p, &p.containers[0]));
        assert!(!needs_image_user(&p, &p.containers[1]), "runAsUser decides");
        assert!(
            !needs_image_user(&p, &p.containers[2]),
            "the container's own setting wins"
        );
        let a = &p.containers[0];
        assert_eq!(verify_image_user(&p, a, Some(1000), ""), Ok(()));
        assert_eq!(
            verify_image_user(&p, a, Some(0), "").unwrap_err(),
            "container has runAsNonRoot and image will run as root (pod: \"p_ns(u)\", container: a)"
        );
        assert_eq!(
            verify_image_user(&p, a, None, "").unwrap_err(),
            "container has runAsNonRoot and image will run as root (pod: \"p_ns(u)\", container: a)",
            "an image without a user runs as root"
        );
        assert_eq!(
            verify_image_user(&p, a, None, "nginx").unwrap_err(),
            "container has runAsNonRoot and image has non-numeric user (nginx), cannot verify user is non-root \
             (pod: \"p_ns(u)\", container: a)"
        );
        let err = verify_image_user(&p, a, Some(-5), "").unwrap_err();
        assert!(
            err.starts_with("container has runAsNonRoot and image has an invalid user id (-5)"),
            "{err}"
        );
    }

    #[test]
    fn apparmor_profiles_reach_the_runtime_container_first() {
        use cri::security_profile::ProfileType;
        let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": {
                "container.apparmor.security.beta.kubernetes.io/b": "localhost/k8s-b",
                "container.apparmor.security.beta.kubernetes.io/a": "unconfined"}},
            "spec": {"securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}}, "containers": [
                {"name": "a", "image": "i", "securityContext": {
                    "appArmorProfile": {"type": "Localhost", "localhostProfile": "k8s-a"}}},
                {"name": "b", "image": "i"},
                {"name": "c", "image": "i"}]}}))
        .unwrap();
        let p = DesiredPod::from_pod(&p).unwrap();
        let profile = |i: usize| {
            let sc = container(&p, &p.containers[i], "/r").unwrap();
            let a = sc.apparmor.unwrap();
            #[allow(deprecated)]
            (a.profile_type, a.localhost_ref, sc.apparmor_profile)
        };
        assert_eq!(
            profile(0),
            (
                ProfileType::Localhost as i32,
                "k8s-a".into(),
                "localhost/k8s-a".into()
            ),
            "the container's own field wins over its annotation"
        );
        assert_eq!(
            profile(1),
            (
                ProfileType::Localhost as i32,
                "k8s-b".into(),
                "localhost/k8s-b".into()
            ),
            "the annotation wins over the pod's field"
        );
        assert_eq!(
            profile(2),
            (
                ProfileType::RuntimeDefault as i32,
                String::new(),
                "runtime/default".into()
            )
        );
        let none = pod(json!({"containers": [{"name": "a", "image": "i"}]}));
        let sc = container(&none, &none.containers[0], "/r").unwrap();
        assert_eq!(sc.apparmor, None, "no profile asked: the runtime's choice");
    }

    #[test]
    fn the_strict_supplemental_groups_policy_reaches_the_runtime() {
        let strict = pod(
            json!({"securityContext": {"supplementalGroupsPolicy": "Strict", "supplementalGroups": [5]},
                                "containers": [{"name": "a", "image": "i"}]}),
        );
        let sc = container(&strict, &strict.containers[0], "/r").unwrap();
        assert_eq!(
            sc.supplemental_groups_policy,
            cri::SupplementalGroupsPolicy::Strict as i32
        );
        assert_eq!(sc.supplemental_groups, [5]);
        assert_eq!(
            sandbox(&strict, "/r").0.supplemental_groups_policy,
            cri::SupplementalGroupsPolicy::Strict as i32
        );
        let merge = pod(json!({"securityContext": {"supplementalGroupsPolicy": "Merge"},
                               "containers": [{"name": "a", "image": "i"}]}));
        let sc = container(&merge, &merge.containers[0], "/r").unwrap();
        assert_eq!(
            sc.supplemental_groups_policy,
            cri::SupplementalGroupsPolicy::Merge as i32
        );
    }
}
