//! The node's client credentials at start-up, as the kubelet finds them: the `--kubeconfig` file when it exists
//! and its client certificate (if it has one) is still valid; otherwise TLS bootstrap with the
//! `--bootstrap-kubeconfig` — a request to the `kubernetes.io/kube-apiserver-client-kubelet` signer for
//! `system:node:<node>` (named by digest, with a key kept in the certificate directory until the certificate
//! comes, so a restart waits for the same request), the certificate stored as `kubelet-client-current.pem`,
//! and a kubeconfig written at the `--kubeconfig` path that names the bootstrap kubeconfig's server and CA and
//! that file as certificate and key.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use base64::Engine;
use kube::config::{
    AuthInfo, Context, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};
use secrecy::ExposeSecret;

use super::csr::{CsrName, CsrTemplate, Signer, request_certificate};
use super::store::CertStore;
use super::{CertError, CertPair};

/// How long TLS bootstrap waits for its certificate (the kubelet waits an hour).
pub const BOOTSTRAP_WAIT: Duration = Duration::from_secs(3600);

/// Where the node's credentials live.
#[derive(Debug, Clone)]
pub struct CredentialPaths {
    /// `--kubeconfig`.
    pub kubeconfig: PathBuf,
    /// `--bootstrap-kubeconfig`.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// `--cert-dir`.
    pub cert_dir: PathBuf,
}

/// The node's API configuration, and its client certificate when it authenticates with one.
#[derive(Debug, Clone)]
pub struct ClientCredentials {
    /// The API configuration (a client certificate, when there is one, carried as data).
    pub config: kube::Config,
    /// The client certificate.
    pub cert: Option<CertPair>,
    /// Whether the credentials were just obtained by TLS bootstrap.
    pub bootstrapped: bool,
}

/// The client store in `cert_dir`.
pub fn client_store(cert_dir: &Path) -> CertStore {
    CertStore::new(cert_dir, "kubelet-client")
}

/// Loads the node's credentials, bootstrapping them first when needed (see the module documentation).
pub async fn load_or_bootstrap(paths: &CredentialPaths, node: &str) -> Result<ClientCredentials, CertError> {
    let existing = if paths.kubeconfig.exists() {
        match load(&paths.kubeconfig).await {
            Ok(creds) => Some(creds),
            // a truncated or corrupt certificate or kubeconfig (a crash, a full disk): as the kubelet, bootstrap
            // again when it can, and otherwise fail naming the file
            Err(e) if paths.bootstrap_kubeconfig.is_some() => {
                tracing::warn!(error = %e, "node credentials unusable; TLS bootstrap again");
                None
            }
            Err(e) => return Err(e),
        }
    } else {
        None
    };
    let expired = match existing {
        Some(creds) => match &creds.cert {
            Some(cert) if !cert.valid_at(SystemTime::now()) => Some(cert.not_after),
            _ => return Ok(creds),
        },
        None => None,
    };
    let Some(bootstrap) = &paths.bootstrap_kubeconfig else {
        return Err(match expired {
            Some(_) => CertError::invalid(
                paths.kubeconfig.display().to_string(),
                "the client certificate is outside its validity and there is no --bootstrap-kubeconfig to get another",
            ),
            None => CertError::invalid(
                paths.kubeconfig.display().to_string(),
                "no such file, and no --bootstrap-kubeconfig to obtain credentials with",
            ),
        });
    };
    tracing::info!(
        bootstrap = %bootstrap.display(),
        kubeconfig = %paths.kubeconfig.display(),
        "no valid node credentials; TLS bootstrap"
    );
    let boot = read_kubeconfig(bootstrap)?;
    let store = client_store(&paths.cert_dir);
    let current = match store.load() {
        Ok(Some(pair)) if pair.valid_at(SystemTime::now()) => Some(pair),
        _ => None,
    };
    if current.is_none() {
        let config = to_config(boot.clone(), bootstrap).await?;
        let client = kube::Client::try_from(config)
            .map_err(|e| CertError::invalid(bootstrap.display().to_string(), e))?;
        let key = store.pending_key()?;
        let template = CsrTemplate {
            node: node.to_owned(),
            signer: Signer::KubeletClient,
            dns_names: vec![],
            ips: vec![],
        };
        let pair = request_certificate(&client, &template, &key, CsrName::Digest, BOOTSTRAP_WAIT).await?;
        store.save(&pair)?;
        store.drop_pending_key();
        tracing::info!(serial = %pair.serial, "client certificate issued");
    }
    write_kubeconfig(&boot, &paths.kubeconfig, &store.current_path())?;
    let mut creds = load(&paths.kubeconfig).await?;
    creds.bootstrapped = true;
    Ok(creds)
}

fn read_kubeconfig(path: &Path) -> Result<Kubeconfig, CertError> {
    Kubeconfig::read_from(path).map_err(|e| CertError::invalid(path.display().to_string(), e))
}

async fn to_config(kubeconfig: Kubeconfig, path: &Path) -> Result<kube::Config, CertError> {
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| CertError::invalid(path.display().to_string(), e))
}

/// The API configuration of the kubeconfig at `path`, its client certificate (if any) read and carried as
/// data.
pub async fn load(path: &Path) -> Result<ClientCredentials, CertError> {
    let mut config = to_config(read_kubeconfig(path)?, path).await?;
    let cert = identity(&config.auth_info, path)?;
    if let Some(pair) = &cert {
        let b64 = base64::engine::general_purpose::STANDARD;
        config.auth_info.client_certificate = None;
        config.auth_info.client_key = None;
        config.auth_info.client_certificate_data = Some(b64.encode(&pair.cert_pem));
        config.auth_info.client_key_data = Some(b64.encode(&pair.key_pem).into());
    }
    Ok(ClientCredentials {
        config,
        cert,
        bootstrapped: false,
    })
}

fn identity(auth: &AuthInfo, origin: &Path) -> Result<Option<CertPair>, CertError> {
    // a certificate kept in a file of its own is named with it: that file is the one to look at
    let origin = match &auth.client_certificate {
        Some(file) if auth.client_certificate_data.is_none() => {
            format!("{} (client-certificate {file})", origin.display())
        }
        _ => origin.display().to_string(),
    };
    let read = |data: Option<&str>, file: Option<&String>, what: &str| -> Result<Option<String>, CertError> {
        if let Some(data) = data {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|e| CertError::invalid(&origin, format!("{what} data: {e}")))?;
            return String::from_utf8(bytes)
                .map(Some)
                .map_err(|_| CertError::invalid(&origin, format!("{what} data is not PEM")));
        }
        match file {
            Some(file) => std::fs::read_to_string(file)
                .map(Some)
                .map_err(|e| CertError::io(Path::new(file), e)),
            None => Ok(None),
        }
    };
    let cert = read(
        auth.client_certificate_data.as_deref(),
        auth.client_certificate.as_ref(),
        "client-certificate",
    )?;
    let key = read(
        auth.client_key_data.as_ref().map(|k| k.expose_secret()),
        auth.client_key.as_ref(),
        "client-key",
    )?;
    match (cert, key) {
        (Some(cert), Some(key)) => CertPair::parse(&cert, &key, &origin).map(Some),
        (None, None) => Ok(None),
        _ => Err(CertError::invalid(
            origin,
            "a client certificate needs both certificate and key",
        )),
    }
}

/// Writes the node's kubeconfig: the bootstrap kubeconfig's cluster (server, CA), and `pem` as client
/// certificate and key.
fn write_kubeconfig(bootstrap: &Kubeconfig, path: &Path, pem: &Path) -> Result<(), CertError> {
    let context = bootstrap
        .current_context
        .as_ref()
        .and_then(|name| bootstrap.contexts.iter().find(|c| &c.name == name))
        .and_then(|c| c.context.as_ref());
    let cluster_name = context.map(|c| c.cluster.clone());
    let cluster = bootstrap
        .clusters
        .iter()
        .find(|c| Some(&c.name) == cluster_name.as_ref())
        .or_else(|| bootstrap.clusters.first())
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| CertError::invalid("the bootstrap kubeconfig", "names no cluster"))?;
    let pem = pem.display().to_string();
    let kubeconfig = Kubeconfig {
        clusters: vec![NamedCluster {
            name: "default-cluster".into(),
            cluster: Some(cluster),
            other: Default::default(),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "default-auth".into(),
            auth_info: Some(AuthInfo {
                client_certificate: Some(pem.clone()),
                client_key: Some(pem),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: "default-context".into(),
            context: Some(Context {
                cluster: "default-cluster".into(),
                user: Some("default-auth".into()),
                namespace: Some("default".into()),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        current_context: Some("default-context".into()),
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        ..Default::default()
    };
    let text =
        serde_yaml::to_string(&kubeconfig).map_err(|e| CertError::invalid(path.display().to_string(), e))?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| CertError::io(dir, e))?;
    }
    // it names the node's key: private, and never left half-written
    crate::state_file::write_atomic(path, text.as_bytes(), 0o600).map_err(|e| CertError::io(path, e))
}
