use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, SystemTime};

use super::csr::{CsrTemplate, Signer, digest_name, new_key, request_pem};
use super::store::CertStore;
use super::*;
use rcgen::PublicKeyData;
use rustls::pki_types::pem::PemObject;
use x509_parser::prelude::FromDer;

/// A self-signed certificate valid from `from` for `days`, and its key.
fn cert(from: time::OffsetDateTime, days: i64) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["node-a".into()]).unwrap();
    params.not_before = from;
    params.not_after = from + time::Duration::days(days);
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

#[test]
fn a_combined_file_gives_the_certificate_and_key_once_each_and_the_validity() {
    let from = time::OffsetDateTime::now_utc() - time::Duration::days(1);
    let (cert_pem, key_pem) = cert(from, 10);
    let combined = format!("{cert_pem}{key_pem}");
    let pair = CertPair::parse(&combined, &combined, "kubelet-client-current.pem").unwrap();
    assert_eq!(pair.cert_pem.matches("BEGIN CERTIFICATE").count(), 1);
    assert_eq!(
        pair.key_pem.matches("PRIVATE KEY-----").count(),
        2,
        "one BEGIN, one END"
    );
    assert!(!pair.key_pem.contains("CERTIFICATE"));
    assert!(pair.valid_at(SystemTime::now()));
    assert!(!pair.valid_at(SystemTime::now() + Duration::from_secs(10 * 86400)));
    let (chain, _) = pair.rustls().unwrap();
    assert_eq!(chain.len(), 1);
}

#[test]
fn bad_input_is_named() {
    let err = CertPair::parse("not pem", "not pem", "/etc/k/x.pem").unwrap_err();
    assert!(err.to_string().starts_with("/etc/k/x.pem: "), "{err}");
    let (cert_pem, _) = cert(time::OffsetDateTime::now_utc(), 1);
    let err = CertPair::parse(&cert_pem, &cert_pem, "f.pem").unwrap_err();
    assert!(err.to_string().contains("private key"), "{err}");
}

#[test]
fn renewal_falls_between_70_and_90_percent_of_the_lifetime() {
    let from = time::OffsetDateTime::now_utc() - time::Duration::days(1);
    let (c, k) = cert(from, 100);
    let pair = CertPair::parse(&c, &k, "t").unwrap();
    let life = pair.not_after.duration_since(pair.not_before).unwrap();
    let at = |j: f64| pair.rotation_deadline(j).duration_since(pair.not_before).unwrap();
    let close = |a: Duration, share: f64| a.abs_diff(life.mul_f64(share)) < Duration::from_millis(1);
    assert!(close(at(0.0), 0.7));
    assert!(close(at(1.0), 0.9));
    assert!(close(at(0.5), 0.8));
    assert!(close(at(7.0), 0.9), "jitter clamped");
}

#[test]
fn a_request_names_the_node_and_for_serving_its_addresses() {
    let key = new_key().unwrap();
    let template = CsrTemplate {
        node: "n1".into(),
        signer: Signer::KubeletServing,
        dns_names: vec!["n1.local".into()],
        ips: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
    };
    let pem = request_pem(&template, &key).unwrap();
    let der = rustls::pki_types::CertificateSigningRequestDer::from_pem_slice(pem.as_bytes()).unwrap();
    let (_, csr) =
        x509_parser::certification_request::X509CertificationRequest::from_der(der.as_ref()).unwrap();
    let subject = &csr.certification_request_info.subject;
    assert_eq!(
        subject.iter_common_name().next().unwrap().as_str().unwrap(),
        "system:node:n1"
    );
    assert_eq!(
        subject.iter_organization().next().unwrap().as_str().unwrap(),
        "system:nodes"
    );
    let text = format!("{:?}", csr.requested_extensions().map(|e| e.collect::<Vec<_>>()));
    assert!(text.contains("n1.local"), "{text}");
    assert_eq!(
        Signer::KubeletServing.usages(),
        ["digital signature", "server auth"]
    );
    assert_eq!(
        Signer::KubeletClient.name(),
        "kubernetes.io/kube-apiserver-client-kubelet"
    );
}

#[test]
fn the_digest_name_follows_the_key() {
    let template = CsrTemplate {
        node: "n1".into(),
        signer: Signer::KubeletClient,
        dns_names: vec![],
        ips: vec![],
    };
    let a = new_key().unwrap();
    let b = new_key().unwrap();
    let name = digest_name(&template, &a);
    assert!(name.starts_with("node-csr-"), "{name}");
    assert_eq!(
        name.len(),
        "node-csr-".len() + 43,
        "SHA-512/256 in unpadded base64"
    );
    assert_eq!(name, digest_name(&template, &a));
    assert_ne!(name, digest_name(&template, &b));
}

#[test]
fn the_store_keeps_dated_files_and_points_current_at_the_newest() {
    let dir = tempfile::tempdir().unwrap();
    let store = CertStore::new(dir.path().join("pki"), "kubelet-client");
    assert!(store.load().unwrap().is_none());
    let (c, k) = cert(time::OffsetDateTime::now_utc(), 3);
    let pair = CertPair::parse(&c, &k, "t").unwrap();
    let current = store.save(&pair).unwrap();
    assert_eq!(current, dir.path().join("pki/kubelet-client-current.pem"));
    let target = std::fs::read_link(&current).unwrap();
    let name = target.to_str().unwrap();
    assert!(
        name.starts_with("kubelet-client-20") && name.ends_with(".pem"),
        "{name}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&current).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(store.load().unwrap().unwrap().serial, pair.serial);

    // a pending key survives until dropped
    let key = store.pending_key().unwrap();
    assert_eq!(
        store.pending_key().unwrap().subject_public_key_info(),
        key.subject_public_key_info()
    );
    store.drop_pending_key();
    assert_ne!(
        store.pending_key().unwrap().subject_public_key_info(),
        key.subject_public_key_info()
    );
}

#[tokio::test]
async fn a_truncated_certificate_is_refused_naming_the_kubeconfig_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = CertStore::new(dir.path().join("pki"), "kubelet-client");
    let (c, k) = cert(time::OffsetDateTime::now_utc(), 3);
    let current = store.save(&CertPair::parse(&c, &k, "t").unwrap()).unwrap();
    // what a crash in the middle of an in-place write would have left
    let text = std::fs::read_to_string(&current).unwrap();
    let target = current.with_file_name(std::fs::read_link(&current).unwrap());
    std::fs::write(&target, &text[..text.len() / 2]).unwrap();
    let err = store.load().unwrap_err().to_string();
    assert!(err.contains("kubelet-client-current.pem"), "{err}");
    assert!(
        err.contains("a PEM block is cut off: no \"-----END CERTIFICATE-----\" line"),
        "{err}"
    );

    let kubeconfig = dir.path().join("kubelet.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n\
             users:\n- name: u\n  user:\n    client-certificate: {0}\n    client-key: {0}\n\
             contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
            current.display()
        ),
    )
    .unwrap();
    let paths = bootstrap::CredentialPaths {
        kubeconfig: kubeconfig.clone(),
        bootstrap_kubeconfig: None,
        cert_dir: dir.path().join("pki"),
    };
    let err = bootstrap::load_or_bootstrap(&paths, "node-a")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(&kubeconfig.display().to_string()), "{err}");
    assert!(
        err.contains(&format!("client-certificate {}", current.display())),
        "{err}"
    );
}

#[test]
fn a_corrupt_pending_key_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let store = CertStore::new(dir.path(), "kubelet-client");
    std::fs::write(
        dir.path().join("kubelet-client.key.tmp"),
        "-----BEGIN PRIVATE KEY-----\nAAAA",
    )
    .unwrap();
    let key = store.pending_key().unwrap();
    assert_eq!(
        store.pending_key().unwrap().subject_public_key_info(),
        key.subject_public_key_info(),
        "the new key is kept for the next start"
    );
}
