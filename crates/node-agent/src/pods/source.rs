//! Where pods come from: the API server's pods bound to this node.
//!
//! The agent consumes a [`PodSource`] — a stream of [`PodEvent`]s: a full [`PodEvent::Snapshot`] after every
//! (re)list, then [`PodEvent::Apply`] / [`PodEvent::Delete`]. Two producers exist:
//!
//! * [`watch_node_pods`] — the kubelet's own watch: list+watch `pods` with `fieldSelector=spec.nodeName=<node>`
//!   through a [`LeanWatch`], which resumes from the last resourceVersion on reconnect and relists on 410 Gone
//!   (each relist arrives here as a new snapshot); errors back off.
//! * [`SharedPodFeed`] — one process-wide watch for a hollow fleet, dispatching each pod to the agent named by
//!   its `spec.nodeName`. A subscriber that keeps up gets the same event sequence as from its own watch; one
//!   that falls behind (its queue full) holds up nobody: what it has not taken is kept for it, the latest change
//!   of each pod only (a list replaces everything before it), and handed over as its queue frees — the changes
//!   in between skipped, as by a watch that reconnected.
//!
//! Pods are passed on without `managedFields` (never read, often the largest part of the object).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;

use crate::density::chan;
use crate::density::lean_watch::{Change, LeanWatch};
use crate::density::poke::Poke;

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

/// One watch of all scheduled pods, fanned out to many agents by `spec.nodeName` (see the module).
#[derive(Debug, Clone, Default)]
pub struct SharedPodFeed {
    routes: Arc<Mutex<HashMap<String, Route>>>,
    /// Poked when a subscriber falls behind (the feed's pump then waits for room in its queue too).
    lagging: Arc<Poke>,
}

/// One subscriber: its queue, and what did not fit in it yet.
#[derive(Debug)]
struct Route {
    tx: chan::Sender<PodEvent>,
    /// `None` while the subscriber keeps up (boxed: most never fall behind).
    backlog: Option<Box<Backlog>>,
}

/// What a subscriber that fell behind is still to get: the last list, then the latest change of each pod since,
/// in the order the pods first changed.
#[derive(Debug, Default)]
struct Backlog {
    snapshot: Option<Vec<Pod>>,
    changes: std::collections::VecDeque<PodEvent>,
}

/// The pod a change is about.
fn pod_key(event: &PodEvent) -> Option<(&str, &str, &str)> {
    let (PodEvent::Apply(pod) | PodEvent::Delete(pod)) = event else {
        return None;
    };
    let meta = &pod.metadata;
    Some((
        meta.uid.as_deref().unwrap_or_default(),
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    ))
}

impl Backlog {
    fn push(&mut self, event: PodEvent) {
        match event {
            PodEvent::Snapshot(pods) => {
                self.snapshot = Some(pods);
                self.changes.clear();
            }
            change => {
                let key = pod_key(&change);
                match self.changes.iter_mut().find(|held| pod_key(held) == key) {
                    Some(held) => *held = change,
                    None => self.changes.push_back(change),
                }
            }
        }
    }

    fn pop(&mut self) -> Option<PodEvent> {
        match self.snapshot.take() {
            Some(pods) => Some(PodEvent::Snapshot(pods)),
            None => self.changes.pop_front(),
        }
    }

    /// Puts back what [`pop`](Self::pop) took.
    fn unpop(&mut self, event: PodEvent) {
        match event {
            PodEvent::Snapshot(pods) => self.snapshot = Some(pods),
            change => self.changes.push_front(change),
        }
    }
}

impl Route {
    /// Queues `event` if the subscriber's queue has room and nothing is held back for it, else holds it back;
    /// whether the subscriber fell behind just now.
    fn deliver(&mut self, event: PodEvent) -> bool {
        if let Some(backlog) = self.backlog.as_mut() {
            backlog.push(event);
            self.flush();
            return false;
        }
        match self.tx.try_send(event) {
            Ok(()) => false,
            Err(chan::SendError(event)) => {
                let mut backlog = Box::<Backlog>::default();
                backlog.push(event);
                self.backlog = Some(backlog);
                true
            }
        }
    }

    /// Queues what was held back, as far as the queue has room.
    fn flush(&mut self) {
        let Some(backlog) = self.backlog.as_mut() else {
            return;
        };
        while let Some(event) = backlog.pop() {
            if let Err(chan::SendError(event)) = self.tx.try_send(event) {
                backlog.unpop(event);
                return;
            }
        }
        self.backlog = None;
    }
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

impl SharedPodFeed {
    /// A feed with no subscribers.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Route>> {
        self.routes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The source for agent `node`, holding up to `capacity` events it has not taken; replaces an earlier
    /// subscription of the same node.
    pub fn subscribe(&self, node: &str, capacity: usize) -> PodSource {
        let (tx, source) = PodSource::channel(capacity);
        self.lock().insert(node.to_owned(), Route { tx, backlog: None });
        source
    }

    /// Stops routing to `node`.
    pub fn unsubscribe(&self, node: &str) {
        self.lock().remove(node);
    }

    /// Hands `event` to the subscribers it concerns; never waits for one.
    fn dispatch(&self, event: PodEvent) {
        let mut routes = self.lock();
        let mut fell_behind = false;
        match event {
            PodEvent::Snapshot(pods) => {
                let mut by_node: HashMap<String, Vec<Pod>> = HashMap::new();
                for p in pods {
                    if let Some(n) = node_of(&p) {
                        by_node.entry(n.to_owned()).or_default().push(p);
                    }
                }
                for (node, route) in routes.iter_mut() {
                    let pods = by_node.remove(node).unwrap_or_default();
                    fell_behind |= route.deliver(PodEvent::Snapshot(pods));
                }
            }
            change => {
                // a pod without a node, or on a node nobody subscribed for, goes nowhere
                let route = match &change {
                    PodEvent::Apply(p) | PodEvent::Delete(p) => node_of(p).and_then(|n| routes.get_mut(n)),
                    PodEvent::Snapshot(_) => None,
                };
                if let Some(route) = route {
                    fell_behind |= route.deliver(change);
                }
            }
        }
        drop(routes);
        if fell_behind {
            self.lagging.notify_one();
        }
    }

    /// Hands what was held back to the subscribers that fell behind as their queues free, until dropped; forgets
    /// subscribers that are gone.
    fn pump(&self) -> impl Future<Output = ()> + Send + '_ {
        async move {
            loop {
                let waits: futures::stream::FuturesUnordered<_> = {
                    let mut routes = self.lock();
                    routes.retain(|_, route| !route.tx.is_closed());
                    routes
                        .values_mut()
                        .filter_map(|route| {
                            route.flush();
                            route.backlog.is_some().then(|| route.tx.clone())
                        })
                        .map(|tx| async move {
                            let _ = tx.ready().await;
                        })
                        .collect()
                };
                let mut waits = waits;
                if waits.is_empty() {
                    self.lagging.notified().await;
                    continue;
                }
                tokio::select! {
                    _ = futures::StreamExt::next(&mut waits) => {}
                    () = self.lagging.notified() => {}
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
            let follow = follow(
                client,
                "spec.nodeName!=".to_owned(),
                cancel.cancelled_owned(),
                |e| {
                    feed.dispatch(e);
                    std::future::ready(true)
                },
            );
            // the pump never ends: the watch does, when `cancel` fires
            futures::future::select(std::pin::pin!(follow), std::pin::pin!(feed.pump())).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, node: &str) -> Pod {
        versioned(name, node, 0)
    }

    /// Pod `name` on `node` as of update `version` (a label).
    fn versioned(name: &str, node: &str, version: usize) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": name, "labels": {"version": version.to_string()}},
            "spec": {"nodeName": node, "containers": []}
        }))
        .unwrap()
    }

    /// What a received event says: `list <names>`, `apply <name>@<version>` or `delete <name>`.
    fn said(event: &PodEvent) -> String {
        let version = |p: &Pod| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("version").cloned())
                .unwrap_or_default()
        };
        let name = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
        match event {
            PodEvent::Snapshot(pods) => {
                format!("list {}", pods.iter().map(name).collect::<Vec<_>>().join(","))
            }
            PodEvent::Apply(p) => format!("apply {}@{}", name(p), version(p)),
            PodEvent::Delete(p) => format!("delete {}", name(p)),
        }
    }

    /// Everything `rx` gets until it has waited a second (of paused time) for more.
    async fn take_all(rx: &mut chan::Receiver<PodEvent>) -> Vec<String> {
        let mut got = Vec::new();
        while let Ok(Some(event)) = tokio::time::timeout(std::time::Duration::from_secs(1), rx.recv()).await {
            got.push(said(&event));
        }
        got
    }

    /// A feed whose pump runs, with subscribers `fast` and `slow`, each holding up to two events.
    fn two_subscribers() -> (SharedPodFeed, chan::Receiver<PodEvent>, chan::Receiver<PodEvent>) {
        let feed = SharedPodFeed::new();
        let PodSource::Feed(fast) = feed.subscribe("fast", 2) else {
            panic!("a feed subscription")
        };
        let PodSource::Feed(slow) = feed.subscribe("slow", 2) else {
            panic!("a feed subscription")
        };
        let pumping = feed.clone();
        tokio::spawn(async move { pumping.pump().await });
        (feed, fast, slow)
    }

    #[tokio::test(start_paused = true)]
    async fn a_subscriber_that_stops_reading_holds_up_nobody_and_later_gets_the_latest_of_each_pod() {
        let (feed, mut fast, mut slow) = two_subscribers();
        feed.dispatch(PodEvent::Snapshot(vec![]));
        let mut got = Vec::new();
        for i in 0..50 {
            feed.dispatch(PodEvent::Apply(Box::new(versioned(&format!("f{i}"), "fast", i))));
            // five pods on the slow node, ten updates each; it reads none of them now
            feed.dispatch(PodEvent::Apply(Box::new(versioned(
                &format!("s{}", i % 5),
                "slow",
                i,
            ))));
            while let Ok(event) = fast.try_recv() {
                got.push(said(&event));
            }
        }
        let every: Vec<String> = std::iter::once("list ".to_owned())
            .chain((0..50).map(|i| format!("apply f{i}@{i}")))
            .collect();
        assert_eq!(got, every, "the reading subscriber got every event, in order");

        // the slow one: what fit in its queue, then the latest update of each of its pods, in the order they
        // first waited
        assert_eq!(
            take_all(&mut slow).await,
            [
                "list ",
                "apply s0@0",
                "apply s1@46",
                "apply s2@47",
                "apply s3@48",
                "apply s4@49",
                "apply s0@45"
            ]
        );
        // caught up: events flow through its queue again
        feed.dispatch(PodEvent::Delete(Box::new(pod("s1", "slow"))));
        assert_eq!(take_all(&mut slow).await, ["delete s1"]);
        assert!(take_all(&mut fast).await.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_replaces_what_a_subscriber_that_fell_behind_was_still_to_get() {
        let (feed, _fast, mut slow) = two_subscribers();
        for i in 0..6 {
            feed.dispatch(PodEvent::Apply(Box::new(versioned(&format!("s{i}"), "slow", i))));
        }
        feed.dispatch(PodEvent::Snapshot(vec![pod("s9", "slow"), pod("f1", "fast")]));
        feed.dispatch(PodEvent::Apply(Box::new(versioned("s9", "slow", 7))));
        assert_eq!(
            take_all(&mut slow).await,
            ["apply s0@0", "apply s1@1", "list s9", "apply s9@7"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_subscriber_gone_is_forgotten() {
        let (feed, fast, slow) = two_subscribers();
        drop(slow);
        for i in 0..4 {
            feed.dispatch(PodEvent::Apply(Box::new(versioned("s0", "slow", i))));
        }
        crate::testing::pass(std::time::Duration::from_millis(100)).await;
        assert!(
            !feed.lock().contains_key("slow"),
            "the pump forgets a subscriber that is gone"
        );
        assert!(feed.lock().contains_key("fast"));
        drop(fast);
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
        feed.dispatch(PodEvent::Snapshot(vec![pod("a", "n1"), pod("b", "n3")]));
        feed.dispatch(PodEvent::Apply(Box::new(pod("c", "n2"))));
        assert!(matches!(n1.recv().await, Some(PodEvent::Snapshot(p)) if p.len() == 1));
        assert!(matches!(n2.recv().await, Some(PodEvent::Snapshot(p)) if p.is_empty()));
        assert!(
            matches!(n2.recv().await, Some(PodEvent::Apply(p)) if p.metadata.name.as_deref() == Some("c"))
        );
        assert!(n1.try_recv().is_err());
    }
}
