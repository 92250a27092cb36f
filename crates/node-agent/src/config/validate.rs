//! Syntax checks shared by the file, the flags and the per-node config: node names, label keys and values,
//! taints, CIDRs, eviction signals.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::FieldError;

/// Labels a kubelet may set on its own Node inside the `kubernetes.io` / `k8s.io` namespaces.
const ALLOWED_KUBELET_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
];

/// Label namespaces (and their subdomains) a kubelet may set freely.
const ALLOWED_KUBELET_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];

/// Eviction signals the kubelet knows.
pub(crate) const EVICTION_SIGNALS: &[&str] = &[
    "memory.available",
    "allocatableMemory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "containerfs.available",
    "containerfs.inodesFree",
    "pid.available",
];

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Whether `s` is a lowercase RFC 1123 subdomain (what a Node name must be).
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Checks a Node name: a lowercase RFC 1123 subdomain.
pub fn validate_node_name(name: &str) -> Result<(), String> {
    if is_dns_subdomain(name) {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid node name: a lowercase RFC 1123 subdomain (a-z, 0-9, '-', '.', at most 253 \
             characters) is required"
        ))
    }
}

fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Checks a label (or taint) key: `[prefix/]name`.
pub fn validate_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && !is_dns_subdomain(p)
    {
        return Err(format!(
            "key {key:?}: prefix {p:?} must be a lowercase DNS subdomain"
        ));
    }
    if !is_label_name(name) {
        return Err(format!(
            "key {key:?}: name part must be 1-63 alphanumeric characters, '-', '_' or '.', starting and ending \
             alphanumeric"
        ));
    }
    Ok(())
}

/// Checks a label value.
pub(crate) fn validate_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_label_name(value) {
        Ok(())
    } else {
        Err(format!(
            "value {value:?} must be empty or 1-63 alphanumeric characters, '-', '_' or '.'"
        ))
    }
}

/// Checks `--node-labels`: syntax, plus the kubelet's rule that labels in the `kubernetes.io` / `k8s.io`
/// namespaces are limited to the well-known node labels and the `kubelet.kubernetes.io` /
/// `node.kubernetes.io` namespaces (anything else NodeRestriction would refuse anyway).
pub fn validate_node_labels(labels: &BTreeMap<String, String>) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for (k, v) in labels {
        let field = format!("nodeLabels[{k}] (--node-labels)");
        if let Err(message) = validate_label_key(k).and_then(|()| validate_label_value(v)) {
            errors.push(FieldError { field, message });
            continue;
        }
        if let Some((prefix, _)) = k.split_once('/') {
            let restricted = ["kubernetes.io", "k8s.io"]
                .iter()
                .any(|ns| prefix == *ns || prefix.ends_with(&format!(".{ns}")));
            let allowed = ALLOWED_KUBELET_LABELS.contains(&k.as_str())
                || ALLOWED_KUBELET_NAMESPACES
                    .iter()
                    .any(|ns| prefix == *ns || prefix.ends_with(&format!(".{ns}")));
            if restricted && !allowed {
                errors.push(FieldError {
                    field,
                    message: format!(
                        "a kubelet may not set labels in the {prefix:?} namespace; allowed are {} and the \
                         kubelet.kubernetes.io / node.kubernetes.io namespaces",
                        ALLOWED_KUBELET_LABELS.join(", ")
                    ),
                });
            }
        }
    }
    errors
}

/// Checks one CIDR (`10.0.0.0/24`, `fd00::/64`).
pub(crate) fn validate_cidr(s: &str) -> Result<(), String> {
    let (ip, bits) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?} is not a CIDR (address/prefix)"))?;
    let ip: IpAddr = ip
        .parse()
        .map_err(|_| format!("{s:?}: {ip:?} is not an IP address"))?;
    let bits: u8 = bits
        .parse()
        .map_err(|_| format!("{s:?}: prefix length {bits:?} is not a number"))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    if bits > max {
        return Err(format!("{s:?}: prefix length {bits} exceeds {max}"));
    }
    Ok(())
}

/// Checks a taint effect.
pub(crate) fn validate_taint_effect(effect: &str) -> Result<(), String> {
    match effect {
        "NoSchedule" | "PreferNoSchedule" | "NoExecute" => Ok(()),
        other => Err(format!(
            "effect {other:?} must be one of NoSchedule, PreferNoSchedule, NoExecute"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names() {
        assert!(validate_node_name("n1").is_ok());
        assert!(validate_node_name("node-1.example.com").is_ok());
        assert!(validate_node_name("Node1").is_err());
        assert!(validate_node_name("").is_err());
        assert!(validate_node_name("-a").is_err());
        assert!(validate_node_name("a_b").is_err());
    }

    #[test]
    fn node_labels_follow_kubelet_rules() {
        let ok: BTreeMap<String, String> = [
            ("team", "a"),
            ("example.com/x", "y"),
            ("node.kubernetes.io/pool", "p"),
            ("x.kubelet.kubernetes.io/y", ""),
            ("topology.kubernetes.io/zone", "z1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert!(validate_node_labels(&ok).is_empty());

        let bad: BTreeMap<String, String> = [
            ("node-role.kubernetes.io/master", ""),
            ("foo.k8s.io/x", "y"),
            ("bad key", "v"),
            ("k", "bad value!"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let errs = validate_node_labels(&bad);
        assert_eq!(errs.len(), 4, "{errs:?}");
        assert!(
            errs.iter()
                .any(|e| e.field.contains("node-role.kubernetes.io/master"))
        );
    }

    #[test]
    fn cidrs_and_effects() {
        assert!(validate_cidr("10.0.0.0/24").is_ok());
        assert!(validate_cidr("fd00::/64").is_ok());
        assert!(validate_cidr("10.0.0.0").is_err());
        assert!(validate_cidr("10.0.0.0/33").is_err());
        assert!(validate_taint_effect("NoExecute").is_ok());
        assert!(validate_taint_effect("Never").is_err());
    }
}
