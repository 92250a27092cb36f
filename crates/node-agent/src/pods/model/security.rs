//! Pod and container security contexts as the pod's spec states them (run as user / group, privileged,
//! capabilities, privilege escalation, seccomp, AppArmor, proc mount, SELinux options, the supplemental groups
//! policy), read once when the pod is read. How they become the runtime's settings is
//! [`crate::pods::runtime::security`].

use k8s_openapi::api::core::v1::{
    AppArmorProfile, PodSecurityContext, SELinuxOptions, SeccompProfile, SecurityContext,
};

/// A seccomp profile choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seccomp {
    /// `RuntimeDefault`.
    RuntimeDefault,
    /// `Unconfined`.
    Unconfined,
    /// `Localhost` with the profile's path relative to the kubelet's seccomp directory.
    Localhost(String),
}

fn seccomp(p: Option<&SeccompProfile>) -> Option<Seccomp> {
    let p = p?;
    Some(match p.type_.as_str() {
        "RuntimeDefault" => Seccomp::RuntimeDefault,
        "Localhost" => Seccomp::Localhost(p.localhost_profile.clone().unwrap_or_default()),
        _ => Seccomp::Unconfined,
    })
}

/// An AppArmor profile choice (`appArmorProfile`, or the deprecated per-container annotation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppArmor {
    /// `RuntimeDefault` (annotation `runtime/default`).
    RuntimeDefault,
    /// `Unconfined` (annotation `unconfined`).
    Unconfined,
    /// `Localhost` with the name of a profile loaded on the host (annotation `localhost/<name>`); empty when
    /// the name is missing, which admission refuses.
    Localhost(String),
}

/// The prefix of the deprecated per-container AppArmor annotation; the container's name follows it.
pub const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

impl AppArmor {
    fn from_api(p: Option<&AppArmorProfile>) -> Option<Self> {
        let p = p?;
        Some(match p.type_.as_str() {
            "RuntimeDefault" => Self::RuntimeDefault,
            "Localhost" => Self::Localhost(p.localhost_profile.clone().unwrap_or_default()),
            _ => Self::Unconfined,
        })
    }

    /// Reads the deprecated annotation's value; `None` for a value the kubelet does not recognise.
    pub fn from_annotation(value: &str) -> Option<Self> {
        match value {
            "runtime/default" => Some(Self::RuntimeDefault),
            "unconfined" => Some(Self::Unconfined),
            _ => value
                .strip_prefix("localhost/")
                .map(|name| Self::Localhost(name.to_owned())),
        }
    }
}

/// `seLinuxOptions` as stated: user, role, type, level (empty when unset).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeLinux {
    /// The SELinux user label.
    pub user: String,
    /// The SELinux role label.
    pub role: String,
    /// The SELinux type label.
    pub type_: String,
    /// The SELinux level label.
    pub level: String,
}

fn se_linux(o: Option<&SELinuxOptions>) -> Option<SeLinux> {
    let o = o?;
    Some(SeLinux {
        user: o.user.clone().unwrap_or_default(),
        role: o.role.clone().unwrap_or_default(),
        type_: o.type_.clone().unwrap_or_default(),
        level: o.level.clone().unwrap_or_default(),
    })
}

/// The pod-level settings (`spec.securityContext` and the namespace switches).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodSecurity {
    /// `runAsUser`.
    pub run_as_user: Option<i64>,
    /// `runAsGroup`.
    pub run_as_group: Option<i64>,
    /// `runAsNonRoot`.
    pub run_as_non_root: Option<bool>,
    /// `fsGroup` followed by `supplementalGroups`.
    pub supplemental_groups: Vec<i64>,
    /// `fsGroup`: the group of the volumes the node provides (see `volumes::ownership`).
    pub fs_group: Option<i64>,
    /// `fsGroupChangePolicy: OnRootMismatch`: volumes that honour the policy keep their ownership when their
    /// root already has the group and its permissions.
    pub fs_group_on_root_mismatch: bool,
    /// `sysctls`.
    pub sysctls: Vec<(String, String)>,
    /// `seccompProfile`.
    pub seccomp: Option<Seccomp>,
    /// `hostPID`.
    pub host_pid: bool,
    /// `hostIPC`.
    pub host_ipc: bool,
    /// `shareProcessNamespace`.
    pub share_pid: bool,
    /// `seLinuxOptions` of the pod.
    pub se_linux: Option<SeLinux>,
    /// `appArmorProfile` of the pod (a container's own, or its annotation, wins).
    pub apparmor: Option<AppArmor>,
    /// `supplementalGroupsPolicy: Strict`: the image's groups of the user are not added.
    pub supplemental_groups_strict: bool,
    /// `hostUsers: false`: the pod runs in a user namespace of its own.
    pub user_namespace: bool,
}

impl PodSecurity {
    /// Reads the pod's settings; `None` when there is nothing but defaults.
    pub fn from_api(spec: &k8s_openapi::api::core::v1::PodSpec) -> Option<Box<Self>> {
        let sc: Option<&PodSecurityContext> = spec.security_context.as_ref();
        let out = Self {
            run_as_user: sc.and_then(|s| s.run_as_user),
            run_as_group: sc.and_then(|s| s.run_as_group),
            run_as_non_root: sc.and_then(|s| s.run_as_non_root),
            supplemental_groups: sc
                .into_iter()
                .flat_map(|s| {
                    s.fs_group
                        .into_iter()
                        .chain(s.supplemental_groups.iter().flatten().copied())
                })
                .collect(),
            fs_group: sc.and_then(|s| s.fs_group),
            fs_group_on_root_mismatch: sc.and_then(|s| s.fs_group_change_policy.as_deref())
                == Some("OnRootMismatch"),
            sysctls: sc
                .into_iter()
                .flat_map(|s| s.sysctls.iter().flatten())
                .map(|s| (s.name.clone(), s.value.clone()))
                .collect(),
            seccomp: seccomp(sc.and_then(|s| s.seccomp_profile.as_ref())),
            host_pid: spec.host_pid.unwrap_or(false),
            host_ipc: spec.host_ipc.unwrap_or(false),
            share_pid: spec.share_process_namespace.unwrap_or(false),
            se_linux: se_linux(sc.and_then(|s| s.se_linux_options.as_ref())),
            apparmor: AppArmor::from_api(sc.and_then(|s| s.app_armor_profile.as_ref())),
            supplemental_groups_strict: sc.and_then(|s| s.supplemental_groups_policy.as_deref())
                == Some("Strict"),
            user_namespace: spec.host_users == Some(false),
        };
        (out != Self::default()).then(|| Box::new(out))
    }
}

/// A container's own `securityContext`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerSecurity {
    /// `runAsUser`.
    pub run_as_user: Option<i64>,
    /// `runAsGroup`.
    pub run_as_group: Option<i64>,
    /// `runAsNonRoot`.
    pub run_as_non_root: Option<bool>,
    /// `readOnlyRootFilesystem`.
    pub read_only_root_fs: bool,
    /// `privileged`.
    pub privileged: bool,
    /// `capabilities.add`.
    pub add_caps: Vec<String>,
    /// `capabilities.drop`.
    pub drop_caps: Vec<String>,
    /// `allowPrivilegeEscalation`.
    pub allow_privilege_escalation: Option<bool>,
    /// `seccompProfile`.
    pub seccomp: Option<Seccomp>,
    /// `procMount: Unmasked`.
    pub unmasked_proc: bool,
    /// `seLinuxOptions` of the container (over the pod's).
    pub se_linux: Option<SeLinux>,
    /// `appArmorProfile` of the container (over its annotation and the pod's).
    pub apparmor: Option<AppArmor>,
}

impl ContainerSecurity {
    /// Reads a container's settings; `None` when it has none.
    pub fn from_api(sc: Option<&SecurityContext>) -> Option<Box<Self>> {
        let sc = sc?;
        let caps = sc.capabilities.as_ref();
        Some(Box::new(Self {
            run_as_user: sc.run_as_user,
            run_as_group: sc.run_as_group,
            run_as_non_root: sc.run_as_non_root,
            read_only_root_fs: sc.read_only_root_filesystem.unwrap_or(false),
            privileged: sc.privileged.unwrap_or(false),
            add_caps: caps.and_then(|c| c.add.clone()).unwrap_or_default(),
            drop_caps: caps.and_then(|c| c.drop.clone()).unwrap_or_default(),
            allow_privilege_escalation: sc.allow_privilege_escalation,
            seccomp: seccomp(sc.seccomp_profile.as_ref()),
            unmasked_proc: sc.proc_mount.as_deref() == Some("Unmasked"),
            se_linux: se_linux(sc.se_linux_options.as_ref()),
            apparmor: AppArmor::from_api(sc.app_armor_profile.as_ref()),
        }))
    }
}
