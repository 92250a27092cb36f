//! Sysctl names as the kubelet judges them: which kernel namespace a sysctl lives in (only namespaced ones can
//! be set per pod), the kubelet's safe set, the patterns `allowedUnsafeSysctls` may hold (`net.core.*`), and
//! the allowlist a pod's `securityContext.sysctls` is admitted against.

/// The kernel namespace a sysctl belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Namespace {
    /// The IPC namespace (`kernel.shm*`, `kernel.msg*`, `kernel.sem`, `fs.mqueue.*`).
    Ipc,
    /// The network namespace (`net.*`).
    Net,
}

impl Namespace {
    /// The name the kubelet's messages use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ipc => "IPC",
            Self::Net => "Net",
        }
    }
}

/// The sysctls the kubelet allows every pod (those namespaced on the kernels this agent supports, 4.15 and
/// later, where each of them is).
pub const SAFE: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

/// `name` with `.` as its separator: a name written with `/` (`net/ipv4/conf/eno2.100/rp_filter`) has its
/// `/` and `.` swapped (`net.ipv4.conf.eno2/100.rp_filter`).
pub fn normalize(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'/' => name
            .chars()
            .map(|c| match c {
                '.' => '/',
                '/' => '.',
                c => c,
            })
            .collect(),
        _ => name.to_owned(),
    }
}

/// The namespace of a (normalized) sysctl or prefix, `None` when it is not known to be namespaced.
fn namespace_of(name: &str) -> Option<Namespace> {
    const IPC_NAMES: &[&str] = &[
        "kernel.sem",
        "kernel.shmall",
        "kernel.shmmax",
        "kernel.shmmni",
        "kernel.shm_rmid_forced",
        "kernel.shm",
        "kernel.msgmax",
        "kernel.msgmnb",
        "kernel.msgmni",
        "kernel.msg",
    ];
    if IPC_NAMES.contains(&name) || name.starts_with("fs.mqueue.") {
        Some(Namespace::Ipc)
    } else if name.starts_with("net.") {
        Some(Namespace::Net)
    } else {
        None
    }
}

/// Whether `pattern` is a sysctl name or a prefix pattern ending in `*`, as the kubelet accepts them: at most
/// 253 characters, segments of lower-case letters, digits, `-` and `_` separated by `.` or `/`.
pub fn valid_pattern(pattern: &str) -> bool {
    fn segment(s: &str, last: bool) -> bool {
        let b = s.as_bytes();
        let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'_';
        let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        match b {
            [] => false,
            [one] => edge(one) || (last && *one == b'*'),
            [first, mid @ .., end] => {
                edge(first) && mid.iter().all(inner) && (edge(end) || (last && *end == b'*'))
            }
        }
    }
    if pattern.len() > 253 {
        return false;
    }
    let parts: Vec<&str> = pattern.split(['.', '/']).collect();
    parts
        .iter()
        .enumerate()
        .all(|(i, s)| segment(s, i + 1 == parts.len()))
}

/// The sysctls a node admits in pods: the safe set and `allowedUnsafeSysctls`, names and prefixes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    names: Vec<(String, Namespace)>,
    prefixes: Vec<(String, Namespace)>,
}

impl Allowlist {
    /// The safe set and `unsafe_allowed`; `Err` names the first pattern the kubelet would refuse.
    pub fn new<'a>(unsafe_allowed: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let mut list = Self::default();
        for pattern in SAFE.iter().copied().chain(unsafe_allowed) {
            if !valid_pattern(pattern) {
                return Err(format!(
                    "sysctl {pattern:?} must have at most 253 characters and match the sysctl pattern \
                     (lower-case segments separated by '.' or '/', optionally ending in '*')"
                ));
            }
            let name = normalize(pattern);
            let (name, prefixed) = match name.find('*') {
                Some(i) => (name[..i].to_owned(), true),
                None => (name, false),
            };
            let Some(ns) = namespace_of(&name) else {
                return Err(format!("the sysctls {name:?} are not known to be namespaced"));
            };
            if prefixed {
                list.prefixes.push((name, ns));
            } else {
                list.names.push((name, ns));
            }
        }
        Ok(list)
    }

    /// The safe set alone (one copy for every node that allows no more).
    pub fn safe() -> &'static Allowlist {
        static SAFE_ONLY: std::sync::OnceLock<Allowlist> = std::sync::OnceLock::new();
        SAFE_ONLY.get_or_init(|| Self::new([]).unwrap_or_default())
    }

    /// `Err` with the kubelet's explanation when a pod (on the host's network or IPC namespace as given) may
    /// not set `sysctl`.
    pub fn check(&self, sysctl: &str, host_network: bool, host_ipc: bool) -> Result<(), String> {
        let sysctl = normalize(sysctl);
        let found = self
            .names
            .iter()
            .find(|(n, _)| *n == sysctl)
            .or_else(|| self.prefixes.iter().find(|(p, _)| sysctl.starts_with(p.as_str())));
        match found {
            None => Err(format!("{sysctl:?} not allowlisted")),
            Some((_, ns))
                if (*ns == Namespace::Ipc && host_ipc) || (*ns == Namespace::Net && host_network) =>
            {
                Err(format!(
                    "{sysctl:?} not allowed with host {} enabled",
                    ns.as_str()
                ))
            }
            Some(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_normalized_and_patterns_checked() {
        assert_eq!(
            normalize("net/ipv4/conf/eno2.100/rp_filter"),
            "net.ipv4.conf.eno2/100.rp_filter"
        );
        assert_eq!(normalize("net.ipv4.ip_forward"), "net.ipv4.ip_forward");
        for ok in [
            "net.core.somaxconn",
            "net.core.*",
            "kernel.msg*",
            "net/ipv4/tcp_rmem",
            "a",
        ] {
            assert!(valid_pattern(ok), "{ok}");
        }
        for bad in ["", "Net.core", "net..core", "net.*.x", "-net.core", "net.core-"] {
            assert!(!valid_pattern(bad), "{bad}");
        }
    }

    #[test]
    fn the_safe_set_and_unsafe_allowed_ones_pass_the_rest_is_refused() {
        let list = Allowlist::new(["net.core.somaxconn", "kernel.msg*"]).unwrap();
        assert!(list.check("net.ipv4.ip_local_port_range", false, false).is_ok());
        assert!(list.check("net/ipv4/tcp_syncookies", false, false).is_ok());
        assert!(list.check("net.core.somaxconn", false, false).is_ok());
        assert!(list.check("kernel.msgmax", false, false).is_ok());
        assert_eq!(
            list.check("kernel.sem", false, false).unwrap_err(),
            "\"kernel.sem\" not allowlisted"
        );
        assert_eq!(
            list.check("net.core.somaxconn", true, false).unwrap_err(),
            "\"net.core.somaxconn\" not allowed with host Net enabled"
        );
        assert_eq!(
            list.check("kernel.shm_rmid_forced", false, true).unwrap_err(),
            "\"kernel.shm_rmid_forced\" not allowed with host IPC enabled"
        );
        assert!(
            Allowlist::new(["vm.swappiness"])
                .unwrap_err()
                .contains("not known to be namespaced")
        );
        assert!(Allowlist::new(["Net.core"]).is_err());
    }
}
