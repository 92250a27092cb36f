//! `tlsMinVersion` and `tlsCipherSuites` of the kubelet API's TLS server: the Go names the kubelet takes, which of
//! them this agent's TLS library (rustls) implements, and the refusal, by name, of those it does not.
//!
//! As in Go, the cipher list governs TLS 1.2 only: TLS 1.3's suites are always offered, and listing one has no
//! effect beyond being accepted. rustls implements no TLS below 1.2 and no CBC, RC4, 3DES or RSA-key-exchange
//! suite, so `VersionTLS10`, `VersionTLS11` and those suites, which the kubelet accepts, are refused with a
//! message that says so rather than served as something else.

/// The lowest TLS version the kubelet API accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsMinVersion {
    /// `VersionTLS12`, the kubelet's default.
    #[default]
    Tls12,
    /// `VersionTLS13`.
    Tls13,
}

/// The Go names of the suites rustls implements, with their IANA numbers; the `_SHA256`-less ChaCha names are
/// Go's older spellings, which the kubelet still takes.
const SUPPORTED: &[(&str, u16)] = &[
    ("TLS_AES_128_GCM_SHA256", 0x1301),
    ("TLS_AES_256_GCM_SHA384", 0x1302),
    ("TLS_CHACHA20_POLY1305_SHA256", 0x1303),
    ("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", 0xc02b),
    ("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", 0xc02c),
    ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", 0xc02f),
    ("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", 0xc030),
    ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256", 0xcca8),
    ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305", 0xcca8),
    ("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256", 0xcca9),
    ("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305", 0xcca9),
];

/// Suites Go (and so the kubelet) accepts that rustls does not implement.
const GO_ONLY: &[&str] = &[
    "TLS_RSA_WITH_RC4_128_SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
];

/// `tlsMinVersion`: empty means the default, TLS 1.2.
pub fn min_version(name: &str) -> Result<TlsMinVersion, String> {
    match name {
        "" | "VersionTLS12" => Ok(TlsMinVersion::Tls12),
        "VersionTLS13" => Ok(TlsMinVersion::Tls13),
        "VersionTLS10" | "VersionTLS11" => Err(format!(
            "{name:?} is not supported: node-agent's TLS library serves TLS 1.2 and 1.3 only \
             (VersionTLS12, VersionTLS13)"
        )),
        _ => Err(format!(
            "unknown TLS version {name:?} (VersionTLS10, VersionTLS11, VersionTLS12 or VersionTLS13)"
        )),
    }
}

/// The IANA numbers of `names` (`tlsCipherSuites`), in order; every name not served is refused by name.
pub fn cipher_suites(names: &[String]) -> Result<Vec<u16>, Vec<String>> {
    let mut ids = Vec::with_capacity(names.len());
    let mut errors = Vec::new();
    for name in names {
        if let Some((_, id)) = SUPPORTED.iter().find(|(n, _)| n == name) {
            if !ids.contains(id) {
                ids.push(*id);
            }
        } else if GO_ONLY.contains(&name.as_str()) {
            errors.push(format!(
                "{name} is not supported by node-agent's TLS library (no CBC, RC4, 3DES or RSA key exchange \
                 suites; supported: {})",
                supported_names()
            ));
        } else {
            errors.push(format!(
                "unknown cipher suite {name:?} (supported: {})",
                supported_names()
            ));
        }
    }
    if errors.is_empty() { Ok(ids) } else { Err(errors) }
}

fn supported_names() -> String {
    SUPPORTED.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

/// Whether `id` is a TLS 1.3 suite (always offered, whatever `tlsCipherSuites` says).
pub fn is_tls13(id: u16) -> bool {
    (0x1301..=0x1305).contains(&id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_names_map_to_their_numbers_and_others_are_refused_by_name() {
        let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            cipher_suites(&names(&[
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
                "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
                "TLS_AES_128_GCM_SHA256",
            ])),
            Ok(vec![0xc02f, 0xcca8, 0x1301])
        );
        let errors = cipher_suites(&names(&["TLS_RSA_WITH_AES_128_CBC_SHA", "TLS_NOPE"])).unwrap_err();
        assert_eq!(errors.len(), 2);
        assert!(
            errors[0].starts_with("TLS_RSA_WITH_AES_128_CBC_SHA is not supported"),
            "{}",
            errors[0]
        );
        assert!(
            errors[1].starts_with("unknown cipher suite \"TLS_NOPE\""),
            "{}",
            errors[1]
        );
        assert_eq!(min_version(""), Ok(TlsMinVersion::Tls12));
        assert_eq!(min_version("VersionTLS13"), Ok(TlsMinVersion::Tls13));
        assert!(min_version("VersionTLS11").unwrap_err().contains("not supported"));
        assert!(min_version("TLS1.3").unwrap_err().contains("unknown TLS version"));
        assert!(is_tls13(0x1302) && !is_tls13(0xc02f));
    }
}
