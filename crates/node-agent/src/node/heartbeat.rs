//! A switch that freezes a node's heartbeats.
//!
//! [`Heartbeats`] is shared by the lease task and the node status task of one agent. While it is paused
//! neither writes anything, as if the node had lost its network: the controller-manager then sees the lease
//! expire and marks the node `Unknown`. On resume both write at once. Real nodes never pause; the hollow
//! fleet's chaos (flapping nodes) does.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::watch;

/// The pause switch of one agent's heartbeats (clones share it).
#[derive(Clone, Debug)]
pub struct Heartbeats {
    paused: Arc<watch::Sender<bool>>,
}

impl Default for Heartbeats {
    fn default() -> Self {
        Self {
            paused: Arc::new(watch::Sender::new(false)),
        }
    }
}

impl Heartbeats {
    /// Stops lease renewals and status updates until [`Heartbeats::resume`].
    pub fn pause(&self) {
        self.paused.send_replace(true);
    }

    /// Lets heartbeats flow again.
    pub fn resume(&self) {
        self.paused.send_replace(false);
    }

    /// Whether heartbeats are paused.
    pub fn is_paused(&self) -> bool {
        *self.paused.borrow()
    }

    /// Returns at once when not paused, else when resumed; `false` when `token` fired first.
    pub async fn wait_running(&self, token: &CancellationToken) -> bool {
        let mut rx = self.paused.subscribe();
        loop {
            if !*rx.borrow_and_update() {
                return true;
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { return true },
                () = token.cancelled() => return false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn paused_heartbeats_wait_for_resume_or_stop() {
        let h = Heartbeats::default();
        let token = CancellationToken::new();
        assert!(h.wait_running(&token).await, "not paused: no wait");
        h.pause();
        assert!(h.is_paused());
        let waiter = tokio::spawn({
            let (h, token) = (h.clone(), token.clone());
            async move { h.wait_running(&token).await }
        });
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(!waiter.is_finished(), "waits while paused");
        h.resume();
        assert!(waiter.await.unwrap());
        h.pause();
        let stopped = tokio::spawn({
            let (h, token) = (h.clone(), token.clone());
            async move { h.wait_running(&token).await }
        });
        token.cancel();
        assert!(!stopped.await.unwrap(), "a stop ends the wait");
    }
}
