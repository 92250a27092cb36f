//! The pod's names and resolver settings as its sandbox gets them: the hostname (`hostnameOverride`, `hostname`,
//! cut as the kernel holds it), the FQDN with `setHostnameAsFQDN`, the subdomain, `hostAliases`, and the DNS
//! policy and config.

use super::DesiredPod;

/// `spec.dnsPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DnsPolicy {
    /// `ClusterFirst` (the default): cluster DNS, except for host-network pods.
    ClusterFirst,
    /// `ClusterFirstWithHostNet`: cluster DNS, host network or not.
    ClusterFirstWithHostNet,
    /// `Default`: the node's resolver configuration.
    Default,
    /// `None`: only `dnsConfig`.
    None,
}

/// `spec.dnsConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DnsConfig {
    /// Extra name servers.
    pub nameservers: Vec<String>,
    /// Extra search domains.
    pub searches: Vec<String>,
    /// Options as `name` or `name:value`.
    pub options: Vec<(String, Option<String>)>,
}

/// `name` cut to the 63 characters of a kernel hostname, without a trailing `-` or `.` (names reaching here
/// are DNS names, ASCII; a name that cannot be cut on a character boundary is kept whole).
fn truncate_hostname(name: &str) -> &str {
    const HOSTNAME_MAX: usize = 63;
    match name.get(..HOSTNAME_MAX) {
        Some(cut) if name.len() > HOSTNAME_MAX => match cut.trim_end_matches(['-', '.']) {
            "" => name,
            trimmed => trimmed,
        },
        _ => name,
    }
}

/// A DNS-1123 subdomain: at most 253 characters, dot-separated non-empty labels of lower-case letters, digits
/// and `-`, each starting and ending with a letter or digit.
fn is_dns_subdomain(name: &str) -> bool {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    name.len() <= 253 && name.split('.').all(label_ok)
}

impl DesiredPod {
    /// The sandbox hostname: `spec.hostnameOverride`, else `spec.hostname`, else the pod's name; as the
    /// kubelet, one longer than the 63 characters a kernel hostname holds is cut to 63 and stripped of a
    /// trailing `-` or `.`.
    pub fn hostname(&self) -> &str {
        if let Some(name) = self.hostname_override() {
            return truncate_hostname(name);
        }
        let name = match self.extras.as_ref().map_or("", |e| &e.hostname) {
            "" => &self.name,
            set => set,
        };
        truncate_hostname(name)
    }

    /// `spec.hostnameOverride`.
    pub fn hostname_override(&self) -> Option<&str> {
        self.extras.as_ref().and_then(|e| e.hostname_override.as_deref())
    }

    /// `spec.activeDeadlineSeconds`.
    pub fn active_deadline_secs(&self) -> Option<i64> {
        self.extras.as_ref().and_then(|e| e.active_deadline_secs)
    }

    /// `spec.setHostnameAsFQDN`.
    pub fn hostname_as_fqdn(&self) -> bool {
        self.extras.as_ref().is_some_and(|e| e.hostname_as_fqdn)
    }

    /// The kernel hostname the sandbox gets, as the kubelet makes it: the [`hostname`](Self::hostname), or with
    /// `setHostnameAsFQDN` and a subdomain the pod's FQDN `<hostname>.<subdomain>.<namespace>.svc.<domain>`,
    /// refused when longer than the 64 characters the kernel's node name holds.
    pub fn kernel_hostname(&self, cluster_domain: &str) -> Result<String, String> {
        const FQDN_MAX: usize = 64;
        if let Some(name) = self.hostname_override()
            && !is_dns_subdomain(name)
        {
            return Err(format!(
                "pod HostnameOverride {name:?} is not a valid DNS subdomain: lower case alphanumeric \
                 characters, '-' or '.', starting and ending with an alphanumeric character, at most 253"
            ));
        }
        let hostname = self.hostname();
        if !self.hostname_as_fqdn() || self.subdomain().is_empty() {
            return Ok(hostname.to_owned());
        }
        let fqdn = format!(
            "{hostname}.{}.{}.svc.{cluster_domain}",
            self.subdomain(),
            self.namespace
        );
        if fqdn.len() > FQDN_MAX {
            return Err(format!(
                "failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is too long \
                 ({FQDN_MAX} characters is the max, {} characters requested)",
                fqdn.len()
            ));
        }
        Ok(fqdn)
    }

    /// `spec.subdomain`, the hostname's domain part; none when `spec.hostnameOverride` names the hostname
    /// whole (as the kubelet, which then gives the pod no domain).
    pub fn subdomain(&self) -> &str {
        match &self.extras {
            Some(e) if e.hostname_override.is_none() => &e.subdomain,
            _ => "",
        }
    }

    /// `spec.hostAliases` as (IP, hostnames).
    pub fn host_aliases(&self) -> &[(String, Vec<String>)] {
        self.extras.as_ref().map_or(&[], |e| &e.host_aliases)
    }
}
