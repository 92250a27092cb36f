//! Renewal: a certificate is replaced once 70–90 % of its lifetime has passed (the point picked at random in
//! that window, afresh for each certificate, as the kubelet's certificate manager picks it), with a new key
//! and a new request to the same signer; a failed renewal is tried again with growing pauses (2 s doubling to
//! 5 min) while the current certificate lasts and after.

use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use super::csr::{CsrName, CsrTemplate, new_key, request_certificate};
use super::store::CertStore;
use super::{CertError, CertPair};

/// How long one renewal request is waited for before it is filed anew.
pub const REQUEST_WAIT: Duration = Duration::from_secs(15 * 60);
const FIRST_RETRY: Duration = Duration::from_secs(2);
const MAX_RETRY: Duration = Duration::from_secs(5 * 60);

/// What to renew and where the new certificates go.
pub struct Renewal {
    /// The client the requests are filed with (its own identity is what is being renewed, for a client
    /// certificate).
    pub client: kube::Client,
    /// What each request asks for (re-read before each request, for serving names that change).
    pub template: Box<dyn Fn() -> CsrTemplate + Send + Sync>,
    /// Where each certificate is kept.
    pub store: CertStore,
}

/// The time from `now` until `deadline` (zero when it has passed).
pub fn until(deadline: SystemTime, now: SystemTime) -> Duration {
    deadline.duration_since(now).unwrap_or(Duration::ZERO)
}

impl Renewal {
    /// One certificate: a new key, a request, and the certificate stored; retried until it succeeds or
    /// `token` fires (then `None`).
    pub async fn obtain(&self, token: &CancellationToken) -> Option<CertPair> {
        let mut pause = FIRST_RETRY;
        loop {
            match self.try_once().await {
                Ok(pair) => return Some(pair),
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?pause, "certificate request failed");
                }
            }
            tokio::select! {
                () = token.cancelled() => return None,
                () = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(MAX_RETRY);
        }
    }

    async fn try_once(&self) -> Result<CertPair, CertError> {
        let template = (self.template)();
        let key = new_key()?;
        let pair =
            request_certificate(&self.client, &template, &key, CsrName::Generated, REQUEST_WAIT).await?;
        self.store.save(&pair)?;
        Ok(pair)
    }

    /// Renews `current` whenever its rotation deadline passes, handing each new certificate to `install`,
    /// until `token` fires.
    pub async fn run(self, mut current: CertPair, install: impl Fn(&CertPair), token: CancellationToken) {
        loop {
            let deadline = current.rotation_deadline(rand::random::<f64>());
            let wait = until(deadline, SystemTime::now());
            tracing::info!(serial = %current.serial, renew_in = ?wait, "certificate rotation scheduled");
            tokio::select! {
                () = token.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            let Some(next) = self.obtain(&token).await else {
                return;
            };
            tracing::info!(old = %current.serial, new = %next.serial, "certificate rotated");
            install(&next);
            current = next;
        }
    }
}
