//! Requests to a node's kubelet API from the host, as a monitoring agent with full rights makes them: over TLS
//! checked against the cluster CA, presenting a client certificate of the cluster CA in `system:masters`.

use std::sync::Arc;

use http_body_util::BodyExt;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// GET `path` from the kubelet API served on `127.0.0.1:port`; answers the status and body.
pub async fn get(cp: &testenv::ControlPlane, port: i32, path: &str) -> anyhow::Result<(u16, String)> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(cp.client_ca_file())? {
        roots.add(cert?)?;
    }
    let identity = cp.client_certificate("rn-kubelet-api-reader", &["system:masters"])?;
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(identity.cert.as_bytes()).collect::<Result<Vec<_>, _>>()?,
                PrivateKeyDer::from_pem_slice(identity.key.as_bytes())?,
            )?;
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only()
        .enable_http1()
        .build();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, String>(connector);
    let req = http::Request::get(format!("https://127.0.0.1:{port}{path}")).body(String::new())?;
    let resp = client.request(req).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}
