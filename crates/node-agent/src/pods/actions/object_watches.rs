//! Per-object watches of the ConfigMaps and Secrets pods use, for `configMapAndSecretChangeDetectionStrategy:
//! Watch` (the kubelet's default).
//!
//! As the kubelet's watch-based managers do, each object a pod reads is followed by a list+watch of its own
//! (`fieldSelector=metadata.name=<name>` in its namespace, which the Node authorizer allows for objects a pod on
//! the node references), and a read answers from what that watch holds instead of asking the API server. The
//! first read of an object starts its watch and waits for the list; later reads wait for nothing. The kubelet
//! stops a watch when the last pod naming the object is gone; here a watch ends once no read has asked for it for
//! [`ObjectWatches::idle`] (pods re-read their volumes' objects at every sync, so a watch outlives its last pod by
//! about that long). Every watch ends when this set is dropped.
//!
//! A list or watch that fails is retried by the watch (with its back-off); a read that comes before the first
//! list succeeded gets the failure (the pod's sync retries), a read after it gets the last object seen.

use std::sync::{Arc, Mutex as SyncMutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde::de::DeserializeOwned;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::density::lean_watch::{Change, LeanWatch};
use crate::density::watch;
use crate::pods::actions::object_data::{ObjectData, ObjectError, ObjectKind, config_map_data, secret_data};

/// What a watch knows of its object.
#[derive(Debug, Clone)]
enum Seen {
    /// Not listed yet.
    Pending,
    /// Listed and failed before any list succeeded: the error.
    Failed(Arc<str>),
    /// It exists, with this content.
    Present(Arc<ObjectData>),
    /// It does not exist.
    Absent,
}

/// One followed object.
struct Watched {
    /// `resource/namespace/name`.
    key: Box<str>,
    seen: watch::Receiver<Seen>,
    /// When a read last asked for it (shared with its task).
    last_read: Arc<SyncMutex<Instant>>,
    task: AbortHandle,
}

/// The watches of one agent.
pub(crate) struct ObjectWatches {
    client: crate::client::ApiClient,
    idle: Duration,
    watched: SyncMutex<Vec<Watched>>,
}

impl ObjectWatches {
    /// Watches over `client`, each ended after `idle` without a read.
    pub(crate) fn new(client: crate::client::ApiClient, idle: Duration) -> Self {
        Self {
            client,
            idle,
            watched: SyncMutex::default(),
        }
    }

    /// The object as its watch holds it (`None`: it does not exist), starting the watch on the first read.
    pub(crate) async fn get(
        &self,
        kind: ObjectKind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<ObjectData>>, ObjectError> {
        let key = format!("{}/{namespace}/{name}", kind.resource());
        let mut seen = self.follow(kind, namespace, name, &key);
        loop {
            let current = seen.borrow_and_update().clone();
            match current {
                Seen::Present(data) => return Ok(Some(data)),
                Seen::Absent => return Ok(None),
                Seen::Failed(error) => return Err(ObjectError(error.to_string())),
                Seen::Pending => {}
            }
            if seen.changed().await.is_err() {
                // the watch ended (idle) between the lookup and now: follow the object again
                seen = self.follow(kind, namespace, name, &key);
            }
        }
    }

    /// The receiver of the watch of `key`, started when there is none (or the one there has ended).
    fn follow(&self, kind: ObjectKind, namespace: &str, name: &str, key: &str) -> watch::Receiver<Seen> {
        let mut watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
        watched.retain(|w| !w.task.is_finished());
        if let Some(w) = watched.iter().find(|w| *w.key == *key) {
            *w.last_read.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
            return w.seen.clone();
        }
        let (tx, rx) = watch::channel(Seen::Pending);
        let selector = format!("metadata.name={name}");
        let (client, idle) = (self.client.clone(), self.idle);
        // the entry and its task share the read time: the task ends the watch when it grows old
        let last_read = Arc::new(SyncMutex::new(Instant::now()));
        let task = match kind {
            ObjectKind::ConfigMap => tokio::spawn(run(
                LeanWatch::<ConfigMap, Box<str>>::namespaced(client, namespace, selector),
                config_map_data,
                tx,
                last_read.clone(),
                idle,
            )),
            ObjectKind::Secret => tokio::spawn(run(
                LeanWatch::<Secret, Box<str>>::namespaced(client, namespace, selector),
                secret_data,
                tx,
                last_read.clone(),
                idle,
            )),
        };
        watched.push(Watched {
            key: key.into(),
            seen: rx.clone(),
            last_read,
            task: task.abort_handle(),
        });
        rx
    }
}

impl Drop for ObjectWatches {
    fn drop(&mut self) {
        if let Ok(watched) = self.watched.get_mut() {
            watched.iter().for_each(|w| w.task.abort());
        }
    }
}

/// Follows one object until no read has asked for it for `idle`.
async fn run<K>(
    mut watch: LeanWatch<K, Box<str>>,
    data_of: fn(K) -> ObjectData,
    tx: watch::Sender<Seen>,
    last_read: Arc<SyncMutex<Instant>>,
    idle: Duration,
) where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned,
{
    // every agent of a fleet follows the same objects (each namespace's kube-root-ca.crt): one copy of equal
    // contents, not one per node
    static CONTENTS: crate::density::intern::Interner<ObjectData> = crate::density::intern::Interner::new();
    let present = |object: K| Seen::Present(CONTENTS.intern(data_of(object)));
    loop {
        let deadline = *last_read.lock().unwrap_or_else(|e| e.into_inner()) + idle;
        if deadline <= Instant::now() {
            return;
        }
        tokio::select! {
            change = watch.next() => match change {
                Ok(Change::Listed(mut objects)) => {
                    tx.send_replace(objects.pop().map_or(Seen::Absent, present));
                }
                Ok(Change::Applied(object)) => {
                    tx.send_replace(present(object));
                }
                Ok(Change::Deleted(_)) => {
                    tx.send_replace(Seen::Absent);
                }
                Err(error) => {
                    tracing::debug!(selector = watch.selector(), %error, "object watch failed, retrying");
                    // a reader still waiting for the first list gets the failure; one after it keeps the last object
                    tx.send_if_modified(|seen| match seen {
                        Seen::Pending | Seen::Failed(_) => {
                            *seen = Seen::Failed(error.to_string().into());
                            true
                        }
                        _ => false,
                    });
                }
            },
            () = tokio::time::sleep_until(deadline) => {}
        }
    }
}
