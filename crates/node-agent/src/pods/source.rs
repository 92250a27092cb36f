//! Where pods come from: the API server's pods bound to this node.
//!
//! The agent consumes a [`PodSource`] — a stream of [`PodEvent`]s: a full [`PodEvent::Snapshot`] after every
//! (re)list, then [`PodEvent::Apply`] / [`PodEvent::Delete`]. Two producers exist:
//!
//! * [`watch_node_pods`] — the kubelet's own watch: list+watch `pods` with `fieldSelector=spec.nodeName=<node>`
//!   through a [`LeanWatch`], which resumes from the last resourceVersion on reconnect and relists on 410 Gone
//!   (each relist arrives here as a new snapshot); errors back off.
//! * [`SharedPodFeed`] — one process-wide watch for a hollow fleet, dispatching each pod to the agent named by
//!   its `spec.nodeName`; subscribers get the same event sequence as from their own watch.
//!
//! Pods are passed on without `managedFields` (never read, often the largest part of the object).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;

use crate::density::chan;
use crate::density::lean_watch::{Change, LeanWatch};

/// One change of the pods bound to a node.
#[derive(Debug, Clone)]
pub enum PodEvent {
    /// Every pod bound to the node right now (after a list or relist); pods not in it are gone.
    Snapshot(Vec<Pod>),
    /// A pod was added or changed (boxed: channels of events stay small).
    Apply(Box<Pod>),
    /// A pod object was deleted.
    Delete(Box<Pod>),
}

/// The stream of pod events an agent consumes.
pub enum PodSource {
    /// The agent opens its own per-node watch ([`watch_node_pods`]).
    Watch,
    /// The agent opens its own per-node watch over this client instead of its request client. An HTTP/2
    /// connection carries a bounded number of concurrent streams (the API server advertises 100) and a watch
    /// holds one for its lifetime, so a process multiplexing many agents keeps watches on connections of their
    /// own: short requests then never queue behind streams that do not end.
    WatchVia(crate::client::ApiClient),
    /// Events arrive on this channel (a [`SharedPodFeed`] subscription, or a test).
    Feed(chan::Receiver<PodEvent>),
}

impl std::fmt::Debug for PodSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Watch => "Watch",
            Self::WatchVia(_) => "WatchVia(..)",
            Self::Feed(_) => "Feed(..)",
        })
    }
}

impl PodSource {
    /// A channel-fed source and its sending half.
    pub fn channel(capacity: usize) -> (chan::Sender<PodEvent>, Self) {
        let (tx, rx) = chan::channel(capacity);
        (tx, Self::Feed(rx))
    }
}

fn slim(mut pod: Pod) -> Pod {
    pod.metadata.managed_fields = None;
    pod
}

/// Follows a list+watch of pods matching `field_selector`, handing every resulting event to `deliver` until
/// `stop` completes, the watch ends, or `deliver` returns false.
async fn follow<S, F, Fut>(client: crate::client::ApiClient, field_selector: String, stop: S, mut deliver: F)
where
    S: Future<Output = ()>,
    F: FnMut(PodEvent) -> Fut,
    Fut: Future<Output = bool>,
{
    let mut stop = std::pin::pin!(stop);
    let mut watch: LeanWatch<Pod> = LeanWatch::new(client, field_selector);
    loop {
        // in a block of its own: the decoded pod (kilobytes) is not kept across the delivery's await
        let event = {
            let next = tokio::select! {
                () = &mut stop => return,
                next = watch.next() => next,
            };
            match next {
                Err(error) => {
                    tracing::warn!(field_selector = watch.selector(), %error, "pod watch failed, retrying");
                    continue;
                }
                Ok(Change::Listed(pods)) => PodEvent::Snapshot(pods.into_iter().map(slim).collect()),
                Ok(Change::Applied(p)) => PodEvent::Apply(Box::new(slim(p))),
                Ok(Change::Deleted(p)) => PodEvent::Delete(Box::new(slim(p))),
            }
        };
        if !deliver(event).await {
            return;
        }
    }
}

/// Watches the pods bound to `node` and sends them to `tx` until `stop` completes (e.g. a token's
/// `cancelled_owned()`; the agent passes `std::future::pending()` and drops the watch instead, see
/// `join::join3_stop`) or the receiver is dropped.
pub fn watch_node_pods<S>(
    client: impl Into<crate::client::ApiClient>,
    node: &str,
    tx: chan::Sender<PodEvent>,
    stop: S,
) -> impl Future<Output = ()> + Send + 'static
where
    S: Future<Output = ()> + Send + 'static,
{
    let client = client.into();
    // moved into the watch, which keeps it (not a second copy in this future)
    let selector = format!("spec.nodeName={node}");
    async move {
        follow(client, selector, stop, |e| {
            let tx = tx.clone();
            async move { tx.send(e).await.is_ok() }
        })
        .await;
    }
}

/// One watch of all scheduled pods, fanned out to many agents by `spec.nodeName`.
#[derive(Debug, Clone, Default)]
pub struct SharedPodFeed {
    routes: Arc<Mutex<HashMap<String, chan::Sender<PodEvent>>>>,
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

impl SharedPodFeed {
    /// A feed with no subscribers.
    pub fn new() -> Self {
        Self::default()
    }

    /// The source for agent `node`; replaces an earlier subscription of the same node.
    pub fn subscribe(&self, node: &str, capacity: usize) -> PodSource {
        let (tx, source) = PodSource::channel(capacity);
        if let Ok(mut routes) = self.routes.lock() {
            routes.insert(node.to_owned(), tx);
        }
        source
    }

    /// Stops routing to `node`.
    pub fn unsubscribe(&self, node: &str) {
        if let Ok(mut routes) = self.routes.lock() {
            routes.remove(node);
        }
    }

    fn route(&self, node: &str) -> Option<chan::Sender<PodEvent>> {
        self.routes.lock().ok()?.get(node).cloned()
    }

    async fn dispatch(&self, event: PodEvent) {
        match event {
            PodEvent::Snapshot(pods) => {
                let mut by_node: HashMap<String, Vec<Pod>> = HashMap::new();
                for p in pods {
                    if let Some(n) = node_of(&p) {
                        by_node.entry(n.to_owned()).or_default().push(p);
                    }
                }
                let routes: Vec<(String, chan::Sender<PodEvent>)> = match self.routes.lock() {
                    Ok(r) => r.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                    Err(_) => return,
                };
                for (node, tx) in routes {
                    let pods = by_node.remove(&node).unwrap_or_default();
                    let _ = tx.send(PodEvent::Snapshot(pods)).await;
                }
            }
            PodEvent::Apply(p) | PodEvent::Delete(p) if node_of(&p).is_none() => drop(p),
            PodEvent::Apply(p) => {
                if let Some(tx) = node_of(&p).and_then(|n| self.route(n)) {
                    let _ = tx.send(PodEvent::Apply(p)).await;
                }
            }
            PodEvent::Delete(p) => {
                if let Some(tx) = node_of(&p).and_then(|n| self.route(n)) {
                    let _ = tx.send(PodEvent::Delete(p)).await;
                }
            }
        }
    }

    /// Watches every pod with a node (`spec.nodeName!=`) and dispatches until `cancel` fires.
    pub fn run(
        self,
        client: impl Into<crate::client::ApiClient>,
        cancel: CancellationToken,
    ) -> impl Future<Output = ()> + Send + 'static {
        let client = client.into();
        async move {
            let feed = &self;
            follow(
                client,
                "spec.nodeName!=".to_owned(),
                cancel.cancelled_owned(),
                |e| async move {
                    feed.dispatch(e).await;
                    true
                },
            )
            .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, node: &str) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": name, "uid": name}, "spec": {"nodeName": node, "containers": []}}),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn shared_feed_routes_by_node_and_snapshots_everyone() {
        let feed = SharedPodFeed::new();
        let PodSource::Feed(mut n1) = feed.subscribe("n1", 8) else {
            panic!()
        };
        let PodSource::Feed(mut n2) = feed.subscribe("n2", 8) else {
            panic!()
        };
        feed.dispatch(PodEvent::Snapshot(vec![pod("a", "n1"), pod("b", "n3")]))
            .await;
        feed.dispatch(PodEvent::Apply(Box::new(pod("c", "n2")))).await;
        assert!(matches!(n1.recv().await, Some(PodEvent::Snapshot(p)) if p.len() == 1));
        assert!(matches!(n2.recv().await, Some(PodEvent::Snapshot(p)) if p.is_empty()));
        assert!(
            matches!(n2.recv().await, Some(PodEvent::Apply(p)) if p.metadata.name.as_deref() == Some("c"))
        );
        assert!(n1.try_recv().is_err());
    }
}
