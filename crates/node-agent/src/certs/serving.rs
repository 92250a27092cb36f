//! The kubelet API's serving certificate from the cluster (`serverTLSBootstrap`): the stored
//! `kubelet-server-current.pem` when it is still valid, otherwise a request to the `kubernetes.io/kubelet-serving`
//! signer for the node's names and addresses; renewed like any certificate ([`super::rotation`]). Until the
//! first certificate is issued (an administrator or an approver must approve it) the server has none and TLS
//! handshakes fail, as the kubelet's do.

use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;

use super::rotation::Renewal;
use super::{CertError, CertPair};

/// The serving certificate the TLS server presents, replaced as it is renewed.
#[derive(Debug, Default)]
pub struct ServingCert {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl ServingCert {
    /// Whether a certificate is being served.
    pub fn ready(&self) -> bool {
        self.current.read().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// Serve `pair` from now on.
    pub fn install(&self, pair: &CertPair) -> Result<(), CertError> {
        let (chain, key) = pair.rustls()?;
        let provider = rustls::crypto::ring::default_provider();
        let signing = provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| CertError::invalid(format!("serving certificate {}", pair.serial), e))?;
        let certified = Arc::new(CertifiedKey::new(chain, signing));
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(certified);
        Ok(())
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Starts serving-certificate management: installs a valid stored certificate at once; the task that comes
/// back with it requests one if there was none and renews it before it expires, until `token` fires — the
/// caller runs it with its agent's tasks (e.g. [`RunningAgent::spawn`](crate::RunningAgent::spawn)), which
/// wait for it at shutdown.
pub fn start(
    renewal: Renewal,
    token: CancellationToken,
) -> (Arc<ServingCert>, impl Future<Output = ()> + Send + 'static) {
    let serving = Arc::new(ServingCert::default());
    let stored = match renewal.store.load() {
        Ok(Some(pair)) if pair.valid_at(SystemTime::now()) => Some(pair),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(error = %e, "stored serving certificate unusable; requesting a new one");
            None
        }
    };
    if let Some(pair) = &stored
        && let Err(e) = serving.install(pair)
    {
        tracing::warn!(error = %e, "stored serving certificate unusable");
    }
    let handle = serving.clone();
    let renew = async move {
        let current = match stored {
            Some(pair) if handle.ready() => pair,
            _ => {
                tracing::info!("requesting a serving certificate (serverTLSBootstrap)");
                let Some(pair) = renewal.obtain(&token).await else {
                    return;
                };
                if let Err(e) = handle.install(&pair) {
                    tracing::error!(error = %e, "issued serving certificate unusable");
                    return;
                }
                tracing::info!(serial = %pair.serial, "serving certificate issued");
                pair
            }
        };
        let installed = handle.clone();
        renewal
            .run(
                current,
                move |pair| {
                    if let Err(e) = installed.install(pair) {
                        tracing::error!(error = %e, "renewed serving certificate unusable");
                    }
                },
                token,
            )
            .await;
    };
    (serving, renew)
}
