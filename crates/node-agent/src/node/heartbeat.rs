//! A switch that freezes a node's heartbeats.
//!
//! [`Heartbeats`] is shared by the lease task and the node status task of one agent. While it is paused
//! neither writes anything, as if the node had lost its network: the controller-manager then sees the lease
//! expire and marks the node `Unknown`. On resume both write at once. Real nodes never pause; the hollow
//! fleet's chaos (flapping nodes) does.

use std::sync::Arc;

use crate::density::watch;

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

    /// Returns at once when not paused, else when resumed.
    pub async fn wait_running(&self) {
        let mut rx = self.paused.subscribe();
        while *rx.borrow_and_update() {
            if rx.changed().await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn paused_heartbeats_wait_for_resume() {
        let h = Heartbeats::default();
        tokio::time::timeout(Duration::from_millis(1), h.wait_running())
            .await
            .expect("not paused: no wait");
        h.pause();
        assert!(h.is_paused());
        let waiter = tokio::spawn({
            let h = h.clone();
            async move { h.wait_running().await }
        });
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(!waiter.is_finished(), "waits while paused");
        h.resume();
        tokio::time::timeout(Duration::from_millis(1), waiter)
            .await
            .expect("a resume ends the wait")
            .unwrap();
    }
}
