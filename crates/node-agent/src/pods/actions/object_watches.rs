//! Per-object watches of the ConfigMaps and Secrets pods use, for `configMapAndSecretChangeDetectionStrategy:
//! Watch` (the kubelet's default).
//!
//! As the kubelet's watch-based managers do, each object a pod names is followed by a list+watch of its own
//! (`fieldSelector=metadata.name=<name>` in its namespace, which the Node authorizer allows for objects a pod on
//! the node references), and a read answers from what that watch holds instead of asking the API server:
//!
//! * a watch opens when a pod naming the object is registered ([`ObjectWatches::register`], at each sync of
//!   the pod) and ends when the last pod naming it is released ([`ObjectWatches::release`], once the pod is
//!   terminated) or stops naming it;
//! * a watch no read has asked for in [`ObjectWatches::new`]'s idle time (five sync periods, at least a
//!   minute: volumes are read at every sync, so only objects read at a container's start go idle) stops, and the
//!   next read opens it again and waits for a fresh list;
//! * an object marked `immutable` cannot change: its watch stops once it is seen, and reads keep that copy;
//! * a read of an object no registered pod names opens a watch too, ended by the idle rule alone.
//!
//! The first read of an object waits for its list; later reads wait for nothing. A list or watch that fails is
//! retried by the watch (with its back-off); a read that comes before the first list succeeded gets the failure
//! (the pod's sync retries), a read after it gets the last object seen. Every watch ends when this set is
//! dropped.

use std::sync::{Arc, Mutex as SyncMutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde::de::DeserializeOwned;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::density::lean_watch::{Change, LeanWatch, OneObject};
use crate::density::watch;
use crate::pods::actions::object_data::{ObjectData, ObjectError, ObjectKind, config_map_data, secret_data};

/// The kubelet's shortest idle time for a watch.
const MIN_IDLE: Duration = Duration::from_secs(60);

/// What a watch knows of its object.
#[derive(Debug, Clone)]
enum Seen {
    /// Not listed yet.
    Pending,
    /// Listed and failed before any list succeeded: the error.
    Failed(Arc<str>),
    /// It exists, with this content.
    Present(Arc<ObjectData>),
    /// It exists, is immutable, with this content: the watch has stopped for good.
    Fixed(Arc<ObjectData>),
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
    /// The UIDs of the registered pods naming it.
    users: Vec<Arc<str>>,
}

impl Watched {
    /// Takes `uid` off the users; `true` when it was the last one (the watch is then ended).
    fn let_go(&mut self, uid: &str) -> bool {
        let before = self.users.len();
        self.users.retain(|u| **u != *uid);
        let last = before > 0 && self.users.is_empty();
        if last {
            self.task.abort();
        }
        last
    }

    /// Whether its task has ended for a reason a read undoes (idle, not immutable).
    fn stopped(&self) -> bool {
        self.task.is_finished() && !matches!(*self.seen.borrow(), Seen::Fixed(_))
    }
}

/// The watches of one agent.
pub(crate) struct ObjectWatches {
    client: crate::client::ApiClient,
    idle: Duration,
    watched: SyncMutex<Vec<Watched>>,
}

/// `resource/namespace/name`, the key of one object.
fn key_of(kind: ObjectKind, namespace: &str, name: &str) -> String {
    format!("{}/{namespace}/{name}", kind.resource())
}

impl ObjectWatches {
    /// Watches over `client`, each stopped after `idle` (at least a minute) without a read.
    pub(crate) fn new(client: crate::client::ApiClient, idle: Duration) -> Self {
        Self {
            client,
            idle: idle.max(MIN_IDLE),
            watched: SyncMutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Watched>> {
        self.watched.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pod `uid` of `namespace` names `refs` now: each is followed (opened where no watch is), and an object it
    /// named before and names no longer is let go (its watch ends when no other pod names it).
    pub(crate) fn register(&self, uid: &Arc<str>, namespace: &str, refs: &[(ObjectKind, &str)]) {
        let keys: Vec<String> = refs
            .iter()
            .map(|(kind, name)| key_of(*kind, namespace, name))
            .collect();
        let mut watched = self.lock();
        watched.retain_mut(|w| keys.iter().any(|k| **k == *w.key) || !w.let_go(uid));
        for ((kind, name), key) in refs.iter().zip(&keys) {
            match watched.iter_mut().find(|w| *w.key == **key) {
                Some(w) => {
                    if !w.users.iter().any(|u| **u == **uid) {
                        w.users.push(uid.clone());
                    }
                }
                None => {
                    let mut w = self.start(*kind, namespace, name, key);
                    w.users.push(uid.clone());
                    watched.push(w);
                }
            }
        }
    }

    /// Pod `uid` is done: every object only it named is let go.
    pub(crate) fn release(&self, uid: &str) {
        self.lock().retain_mut(|w| !w.let_go(uid));
    }

    /// The object as its watch holds it (`None`: it does not exist), starting the watch when none runs.
    pub(crate) async fn get(
        &self,
        kind: ObjectKind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<ObjectData>>, ObjectError> {
        let key = key_of(kind, namespace, name);
        let mut seen = self.follow(kind, namespace, name, &key);
        loop {
            let current = seen.borrow_and_update().clone();
            match current {
                Seen::Present(data) | Seen::Fixed(data) => return Ok(Some(data)),
                Seen::Absent => return Ok(None),
                Seen::Failed(error) => return Err(ObjectError(error.to_string())),
                Seen::Pending => {}
            }
            if seen.changed().await.is_err() {
                // the watch ended between the lookup and now: follow the object again
                seen = self.follow(kind, namespace, name, &key);
            }
        }
    }

    /// The receiver of the watch of `key`: started when there is none, started again when it stopped idle.
    fn follow(&self, kind: ObjectKind, namespace: &str, name: &str, key: &str) -> watch::Receiver<Seen> {
        let mut watched = self.lock();
        // a watch no pod names is forgotten once it has stopped
        watched.retain(|w| !(w.users.is_empty() && w.task.is_finished()));
        if let Some(w) = watched.iter_mut().find(|w| *w.key == *key) {
            *w.last_read.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
            if w.stopped() {
                let again = self.start(kind, namespace, name, key);
                (w.seen, w.task, w.last_read) = (again.seen, again.task, again.last_read);
            }
            return w.seen.clone();
        }
        let w = self.start(kind, namespace, name, key);
        let rx = w.seen.clone();
        watched.push(w);
        rx
    }

    /// A new watch of one object, read just now, named by no pod yet.
    fn start(&self, kind: ObjectKind, namespace: &str, name: &str, key: &str) -> Watched {
        let (tx, rx) = watch::channel(Seen::Pending);
        let (client, idle) = (self.client.clone(), self.idle);
        // the entry and its task share the read time: the task stops the watch when it grows old
        let last_read = Arc::new(SyncMutex::new(Instant::now()));
        let task = match kind {
            ObjectKind::ConfigMap => tokio::spawn(run(
                LeanWatch::<ConfigMap, OneObject>::one_object(client, namespace, name),
                |cm: ConfigMap| (cm.immutable == Some(true), config_map_data(cm)),
                tx,
                last_read.clone(),
                idle,
            )),
            ObjectKind::Secret => tokio::spawn(run(
                LeanWatch::<Secret, OneObject>::one_object(client, namespace, name),
                |s: Secret| (s.immutable == Some(true), secret_data(s)),
                tx,
                last_read.clone(),
                idle,
            )),
        };
        Watched {
            key: key.into(),
            seen: rx,
            last_read,
            task: task.abort_handle(),
            users: Vec::new(),
        }
    }
}

impl Drop for ObjectWatches {
    fn drop(&mut self) {
        if let Ok(watched) = self.watched.get_mut() {
            watched.iter().for_each(|w| w.task.abort());
        }
    }
}

/// Follows one object until no read has asked for it for `idle` (counted once it is listed) or it is seen
/// immutable. `data_of` says whether an object is immutable, and what it holds.
async fn run<K>(
    mut watch: LeanWatch<K, OneObject>,
    data_of: fn(K) -> (bool, ObjectData),
    tx: watch::Sender<Seen>,
    last_read: Arc<SyncMutex<Instant>>,
    idle: Duration,
) where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned,
{
    // every agent of a fleet follows the same objects (each namespace's kube-root-ca.crt): one copy of equal
    // contents, not one per node
    static CONTENTS: crate::density::intern::Interner<ObjectData> = crate::density::intern::Interner::new();
    let seen = |object: K| {
        let (immutable, data) = data_of(object);
        let data = CONTENTS.intern(data);
        if immutable {
            Seen::Fixed(data)
        } else {
            Seen::Present(data)
        }
    };
    let mut listed = false;
    loop {
        let deadline = *last_read.lock().unwrap_or_else(|e| e.into_inner()) + idle;
        // a watch not yet listed is not stopped: the list under way would be lost
        if listed && deadline <= Instant::now() {
            return;
        }
        let changed = tokio::select! {
            change = watch.next() => change,
            () = tokio::time::sleep_until(deadline), if listed => continue,
        };
        let now = match changed {
            Ok(Change::Listed(mut objects)) => {
                listed = true;
                objects.pop().map_or(Seen::Absent, seen)
            }
            Ok(Change::Applied(object)) => seen(object),
            Ok(Change::Deleted(_)) => Seen::Absent,
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
                continue;
            }
        };
        let fixed = matches!(now, Seen::Fixed(_));
        tx.send_replace(now);
        if fixed {
            // an immutable object cannot change: nothing more to watch
            return;
        }
    }
}
