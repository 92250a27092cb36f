//! Paces the fleet's start by the API server's answers: at most a set number of started nodes may still be
//! waiting for their registration; the next node starts when one of them is registered (or stops).
//!
//! Every node's start-up writes (the Node, its first status, its events, its Lease, its watches' lists) queue in
//! the fleet with their bodies while the API server is behind. Started at `--register-qps` alone, a fleet larger
//! than the server can register at once holds all of them, and the allocator keeps that peak's pages long
//! after (docs/density.md, "The start gate"). A node's registration
//! waits in the same queues as those writes, so capping the nodes not yet registered slows the start to
//! what the server answers, and leaves a fleet the server keeps up with as fast as `--register-qps` lets it.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use node_agent::density::watch;
use node_agent::node::RegisteredNode;

/// How long the gate waits without any registration before it says so (once per stall).
const STALL_WARNING: Duration = Duration::from_secs(60);

type Pending = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The nodes started and not yet registered, and how many of them may be.
pub struct StartGate {
    limit: usize,
    pending: FuturesUnordered<Pending>,
}

impl StartGate {
    /// At most `limit` nodes waiting for their registration (0: no limit).
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            pending: FuturesUnordered::new(),
        }
    }

    /// Nodes started and not yet registered (stopped ones are not counted).
    pub fn waiting(&self) -> usize {
        self.pending.len()
    }

    /// Returns once one more node may start: at once while fewer than the limit wait for their registration,
    /// else when one of them is registered or stopped. Logs a warning when no registration comes for a minute.
    pub async fn admit(&mut self) {
        if self.limit == 0 {
            return;
        }
        let mut warned = false;
        while self.pending.len() >= self.limit {
            match tokio::time::timeout(STALL_WARNING, self.pending.next()).await {
                Ok(_) => {}
                Err(_) if !warned => {
                    warned = true;
                    tracing::warn!(
                        waiting = self.pending.len(),
                        "no node registered in {STALL_WARNING:?}; further nodes start when one does \
                         (--registrations-in-flight)"
                    );
                }
                Err(_) => {}
            }
        }
        if warned {
            tracing::info!("nodes register again; the fleet's start goes on");
        }
    }

    /// Counts a started node until `registered` (its agent's registration) says it is registered, or closes
    /// because the agent stopped.
    pub fn started(&mut self, mut registered: watch::Receiver<Option<RegisteredNode>>) {
        if self.limit == 0 || registered.borrow_and_update().is_some() {
            return;
        }
        self.pending.push(Box::pin(async move {
            while registered.borrow_and_update().is_none() {
                if registered.changed().await.is_err() {
                    return;
                }
            }
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> RegisteredNode {
        RegisteredNode {
            name: "n".into(),
            uid: "u".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_starts_when_one_before_it_is_registered() {
        let mut gate = StartGate::new(2);
        let (a_tx, a_rx) = watch::channel(None);
        let (b_tx, b_rx) = watch::channel(None);
        gate.admit().await;
        gate.started(a_rx);
        gate.admit().await;
        gate.started(b_rx);
        assert_eq!(gate.waiting(), 2);
        let mut third = Box::pin(gate.admit());
        assert!(
            futures::poll!(third.as_mut()).is_pending(),
            "two nodes wait for their registration: the third waits"
        );
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(futures::poll!(third.as_mut()).is_pending());
        b_tx.send_replace(Some(node()));
        third.await;
        assert_eq!(gate.waiting(), 1, "the registered node is no longer counted");
        // a stopped agent (its registration's sender dropped) frees its place too
        let (_c_tx, c_rx) = watch::channel(None);
        gate.started(c_rx);
        let mut fourth = Box::pin(gate.admit());
        assert!(futures::poll!(fourth.as_mut()).is_pending());
        drop(a_tx);
        fourth.await;
        assert_eq!(gate.waiting(), 1, "only the third node still waits");
    }

    #[tokio::test(start_paused = true)]
    async fn a_registered_node_and_no_limit_count_nothing() {
        let mut gate = StartGate::new(1);
        let (_tx, rx) = watch::channel(Some(node()));
        gate.started(rx);
        assert_eq!(gate.waiting(), 0);
        let mut open = StartGate::new(0);
        let mut senders = Vec::new();
        for _ in 0..10 {
            let (tx, rx) = watch::channel(None::<RegisteredNode>);
            open.admit().await;
            open.started(rx);
            senders.push(tx);
        }
        assert_eq!(open.waiting(), 0, "without a limit nothing is counted");
    }
}
