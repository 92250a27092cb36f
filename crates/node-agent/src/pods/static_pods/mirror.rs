//! Mirror pods: for every static pod, a pod object in the API server so that users and controllers see it.
//!
//! The manager compares the static pods the pod manager runs (keyed by namespace/name) with the mirror pods
//! the pod source sees (pods bound to this node carrying `kubernetes.io/config.mirror`):
//! * a static pod without a mirror gets one — a copy with `kubernetes.io/config.mirror` = its hash and the
//!   Node as controlling owner, as the kubelet creates it (the API server's NodeRestriction requires both);
//! * a mirror of another hash (the manifest changed), or one being deleted (a user deleted it), is deleted
//!   (grace 0, UID precondition) and created again;
//! * a mirror without a static pod is deleted.
//!
//! Nothing is created or deleted before the first full list of the node's pods (what exists is unknown
//! until then) nor before the Node's UID is known. Failed requests (the API server unreachable) are retried
//! with back-off; the relist after reconnecting brings the mirrors up to date.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::ApiCalls;
use crate::backoff::{Backoff, BackoffPolicy};
use crate::density::watch;
use crate::pods::static_pods::Mirrors;
use crate::pods::static_pods::manifest::{HASH_ANNOTATION, MIRROR_ANNOTATION};
use crate::pods::status::{StatusHandle, StatusMsg};

/// namespace, name.
pub(crate) type Key = (String, String);

/// The static pods that should have mirrors, by namespace/name.
pub(crate) type Desired = Arc<HashMap<Key, Arc<Pod>>>;

/// Mirror pods as the pod source sees them.
#[derive(Debug)]
pub(crate) enum MirrorMsg {
    /// Every mirror pod bound to the node now (after a list).
    Snapshot(Vec<Pod>),
    /// A mirror pod was added or changed.
    Apply(Box<Pod>),
    /// A mirror pod was deleted.
    Delete(Box<Pod>),
}

#[derive(Debug, Clone, PartialEq)]
struct Observed {
    uid: String,
    hash: String,
    deleting: bool,
}

fn key_of(pod: &Pod) -> Key {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

fn observed(pod: &Pod) -> Observed {
    Observed {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        hash: pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(MIRROR_ANNOTATION))
            .cloned()
            .unwrap_or_default(),
        deleting: pod.metadata.deletion_timestamp.is_some(),
    }
}

fn hash_of(pod: &Pod) -> String {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(HASH_ANNOTATION))
        .cloned()
        .unwrap_or_default()
}

/// The mirror pod of `pod` owned by the Node `node` (UID `node_uid`).
pub(crate) fn mirror_of(pod: &Pod, node: &str, node_uid: &str) -> Pod {
    let mut m = pod.clone();
    m.metadata.uid = None;
    m.metadata.resource_version = None;
    m.metadata.creation_timestamp = None;
    m.metadata.managed_fields = None;
    m.status = None;
    let hash = hash_of(pod);
    m.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(MIRROR_ANNOTATION.into(), hash);
    m.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.to_owned(),
        uid: node_uid.to_owned(),
        controller: Some(true),
        ..Default::default()
    }]);
    m
}

pub(crate) struct MirrorManager {
    client: crate::client::ApiClient,
    api: ApiCalls,
    node_name: String,
    node: crate::pods::NodeViews,
    desired: watch::Receiver<Desired>,
    rx: crate::density::chan::UnboundedReceiver<MirrorMsg>,
    observed: HashMap<Key, Observed>,
    listed: bool,
    mirrors: Mirrors,
    status: StatusHandle,
    retry_at: Option<Instant>,
    backoff: Backoff,
}

fn gone(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 404 || s.code == 409)
}

impl MirrorManager {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        client: impl Into<crate::client::ApiClient>,
        api: ApiCalls,
        node_name: String,
        node: crate::pods::NodeViews,
        desired: watch::Receiver<Desired>,
        rx: crate::density::chan::UnboundedReceiver<MirrorMsg>,
        mirrors: Mirrors,
        status: StatusHandle,
    ) -> Self {
        Self {
            client: client.into(),
            api,
            node_name,
            node,
            desired,
            rx,
            observed: HashMap::new(),
            listed: false,
            mirrors,
            status,
            retry_at: None,
            backoff: Backoff::new(BackoffPolicy::api_retry()),
        }
    }

    fn on_msg(&mut self, msg: MirrorMsg) {
        match msg {
            MirrorMsg::Snapshot(pods) => {
                self.listed = true;
                self.observed = pods.iter().map(|p| (key_of(p), observed(p))).collect();
            }
            MirrorMsg::Apply(pod) => {
                self.observed.insert(key_of(&pod), observed(&pod));
            }
            MirrorMsg::Delete(pod) => {
                let key = key_of(&pod);
                if self.observed.get(&key).map(|o| &o.uid) == pod.metadata.uid.as_ref() {
                    self.observed.remove(&key);
                }
            }
        }
    }

    async fn delete(&self, key: &Key, uid: &str) -> Result<(), kube::Error> {
        let api: Api<Pod> = Api::namespaced(self.client.kube(), &key.0);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.api.run("delete", "pods", api.delete(&key.1, &params)).await {
            Ok(_) => Ok(()),
            Err(e) if gone(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn create(&self, pod: &Pod, node_uid: &str) -> Result<Option<Pod>, kube::Error> {
        let mirror = mirror_of(pod, &self.node_name, node_uid);
        let api: Api<Pod> = Api::namespaced(self.client.kube(), &key_of(pod).0);
        match self
            .api
            .run("create", "pods", api.create(&PostParams::default(), &mirror))
            .await
        {
            Ok(created) => Ok(Some(created)),
            // the watch brings the existing one; a wrong one is replaced on the next pass
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One pass; `false` when something failed and a retry is due.
    async fn reconcile(&mut self) -> bool {
        if !self.listed {
            return true;
        }
        let node_uid = self.node.get().map(|n| n.uid).unwrap_or_default();
        let desired = self.desired.borrow().clone();
        let mut ok = true;
        for (key, pod) in desired.iter() {
            let hash = hash_of(pod);
            let current = self.observed.get(key).cloned();
            if let Some(o) = &current {
                if o.hash == hash && !o.deleting {
                    continue;
                }
                if let Err(error) = self.delete(key, &o.uid).await {
                    tracing::warn!(pod = %key.1, namespace = %key.0, %error, "deleting an outdated mirror pod failed, will retry");
                    ok = false;
                    continue;
                }
                tracing::info!(pod = %key.1, namespace = %key.0, "deleted an outdated mirror pod");
                self.observed.remove(key);
            }
            if node_uid.is_empty() {
                // the Node is not registered (or not seen) yet
                ok = false;
                continue;
            }
            match self.create(pod, &node_uid).await {
                Ok(Some(created)) => {
                    tracing::info!(pod = %key.1, namespace = %key.0, "created the mirror pod");
                    self.observed.insert(key.clone(), observed(&created));
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(pod = %key.1, namespace = %key.0, %error, "creating the mirror pod failed, will retry");
                    ok = false;
                }
            }
        }
        let orphans: Vec<(Key, String)> = self
            .observed
            .iter()
            .filter(|(k, _)| !desired.contains_key(*k))
            .map(|(k, o)| (k.clone(), o.uid.clone()))
            .collect();
        for (key, uid) in orphans {
            match self.delete(&key, &uid).await {
                Ok(()) => {
                    tracing::info!(pod = %key.1, namespace = %key.0, "deleted the mirror pod of a static pod that is gone");
                    self.observed.remove(&key);
                }
                Err(error) => {
                    tracing::warn!(pod = %key.1, namespace = %key.0, %error, "deleting an orphaned mirror pod failed, will retry");
                    ok = false;
                }
            }
        }
        self.publish(&desired);
        ok
    }

    /// Tells the status manager which mirror each static pod has now.
    fn publish(&self, desired: &Desired) {
        for (key, pod) in desired.iter() {
            let Some(uid) = pod.metadata.uid.as_deref() else {
                continue;
            };
            let mirror = self
                .observed
                .get(key)
                .filter(|o| o.hash == hash_of(pod) && !o.deleting)
                .map(|o| o.uid.clone());
            if self.mirrors.set_mirror(uid, mirror) {
                self.status.send(StatusMsg::MirrorChanged { uid: uid.into() });
            }
        }
    }

    pub(crate) fn run(mut self, cancel: CancellationToken) -> impl Future<Output = ()> + Send + 'static {
        async move {
            let mut node = self.node.clone();
            loop {
                let retry = self.retry_at;
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    msg = self.rx.recv() => match msg {
                        Some(msg) => {
                            self.on_msg(msg);
                            while let Ok(more) = self.rx.try_recv() {
                                self.on_msg(more);
                            }
                        }
                        None => return,
                    },
                    changed = self.desired.changed() => if changed.is_err() { return },
                    changed = node.changed() => if changed.is_err() { return },
                    () = async { match retry { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {
                        self.retry_at = None;
                    }
                }
                if self.retry_at.is_some() {
                    // a retry is scheduled: do not hammer an API server that is down on every event
                    continue;
                }
                if self.reconcile().await {
                    self.backoff.reset();
                } else {
                    self.retry_at = Some(Instant::now() + self.backoff.next_delay());
                }
            }
        }
    }
}

/// Starts the mirror manager and returns its input.
pub(crate) type StartMirrors =
    Box<dyn FnOnce() -> crate::density::chan::UnboundedSender<MirrorMsg> + Send + Sync>;

/// The pod manager's way to the mirror manager, which runs only where there is work for it: a node with static
/// pod sources starts it at once; any other node starts it when the first mirror pod bound to it shows up (a
/// mirror left by an earlier configuration, to be deleted). A hollow fleet's nodes without static pods thus
/// keep no mirror task, whose state would be among the largest an idle node holds.
pub(crate) enum MirrorLink {
    /// The manager runs; its input.
    Running(crate::density::chan::UnboundedSender<MirrorMsg>),
    /// Not started; how to start it, and whether a (mirror-free) snapshot went by unsent.
    Idle {
        start: Option<StartMirrors>,
        listed: bool,
    },
}

impl MirrorLink {
    /// Starts the manager now when `eager`, else on the first mirror pod.
    pub(crate) fn new(start: StartMirrors, eager: bool) -> Self {
        let mut link = Self::Idle {
            start: Some(start),
            listed: false,
        };
        if eager {
            link.start();
        }
        link
    }

    fn start(&mut self) -> Option<&crate::density::chan::UnboundedSender<MirrorMsg>> {
        if let Self::Idle { start, listed } = self {
            let listed = *listed;
            let tx = start.take()?();
            if listed {
                // the manager acts only after a full list; the one that went by had no mirror pods
                let _ = tx.send(MirrorMsg::Snapshot(Vec::new()));
            }
            *self = Self::Running(tx);
        }
        match self {
            Self::Running(tx) => Some(tx),
            Self::Idle { .. } => None,
        }
    }

    /// Passes `msg` on, starting the manager if the message names a mirror pod.
    pub(crate) fn send(&mut self, msg: MirrorMsg) {
        if let Self::Idle { listed, .. } = self
            && matches!(&msg, MirrorMsg::Snapshot(pods) if pods.is_empty())
        {
            *listed = true;
            return;
        }
        if let Some(tx) = self.start() {
            let _ = tx.send(msg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::static_pods::manifest::{self, Origin};

    #[test]
    fn a_mirror_is_owned_by_the_node_and_names_the_hash() {
        let pod = manifest::decode(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: i\n",
            false,
        )
        .unwrap()
        .remove(0);
        let pod = manifest::prepare(pod, Origin::File("/m/web.yaml"), "n1").unwrap();
        let m = mirror_of(&pod, "n1", "node-uid");
        assert!(m.metadata.uid.is_none());
        let ann = m.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[MIRROR_ANNOTATION], ann[HASH_ANNOTATION]);
        assert_eq!(ann[MIRROR_ANNOTATION], pod.metadata.uid.clone().unwrap());
        let owner = &m.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Node", "n1", "node-uid")
        );
        assert_eq!(owner.controller, Some(true));
        assert!(manifest::is_mirror(&m));
    }
}
