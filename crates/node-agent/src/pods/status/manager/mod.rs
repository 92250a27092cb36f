//! The status manager task: one per agent, writing pod statuses and final deletions. Writes for one pod are
//! in order and never overlap; up to [`IN_FLIGHT`] pods are written at once; updates of a pod that arrive
//! while its write is in flight are coalesced into the next one.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, DefaultHasher};
use std::sync::Arc;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::ApiCalls;
use crate::backoff::{Backoff, BackoffPolicy};
use crate::density::wake_timer::WakeTimer;
use crate::pods::metrics::{PodMetrics, Timeline};
use crate::pods::status::mirrors::{MirrorOf, Mirrors};
use crate::pods::status::{StatusMsg, canonical};

/// Pods written at the same time by one agent.
pub(crate) const IN_FLIGHT: usize = 4;

/// What the writer holds of one pod for the pod's life (boxed: one per running pod of every node).
struct Entry {
    /// `namespace/name` (neither can hold a `/`): one allocation, not two.
    object: Box<str>,
    /// Fingerprint of the status the API server holds (as last written or seen).
    acked: Option<u64>,
    pending: Option<Box<PodStatus>>,
    timeline: Option<Box<Timeline>>,
    /// The status last written, kept for static pods only (written again to a new mirror pod).
    last: Option<Box<PodStatus>>,
    /// Made at a pod's first failed write, dropped at its next success.
    retry: Option<Box<Retry>>,
    delete: bool,
    in_flight: bool,
}

/// The retries of a pod whose write failed.
struct Retry {
    /// When it is written again; `None` once it is queued again.
    at: Option<Instant>,
    backoff: Backoff,
}

fn object_of(namespace: &str, name: &str) -> Box<str> {
    format!("{namespace}/{name}").into_boxed_str()
}

impl Entry {
    fn new(namespace: &str, name: &str) -> Self {
        Self {
            object: object_of(namespace, name),
            acked: None,
            pending: None,
            timeline: None,
            last: None,
            retry: None,
            delete: false,
            in_flight: false,
        }
    }

    /// Names the entry's object `namespace/name` (a seeded entry learns it with the pod's first status).
    fn name_as(&mut self, namespace: &str, name: &str) {
        if self.namespace() != namespace || self.name() != name {
            self.object = object_of(namespace, name);
        }
    }

    fn namespace(&self) -> &str {
        self.object.split_once('/').map_or("", |(ns, _)| ns)
    }

    fn name(&self) -> &str {
        self.object.split_once('/').map_or("", |(_, n)| n)
    }

    fn retry_at(&self) -> Option<Instant> {
        self.retry.as_ref().and_then(|r| r.at)
    }
}

/// How one write ended.
enum Outcome {
    /// Written (or nothing needed writing); `acked` is the fingerprint now held, `running` whether that status
    /// is Running.
    Done {
        acked: Option<u64>,
        running: bool,
        written: Option<Box<PodStatus>>,
    },
    /// A static pod without a mirror pod: nothing to write to until one exists.
    NoMirror(Option<Box<PodStatus>>),
    /// The pod object is gone (or belongs to another UID now).
    Gone,
    /// Failed; the status to write again, if a PATCH failed.
    Retry(Option<Box<PodStatus>>),
}

pub(crate) struct StatusManager {
    client: crate::client::ApiClient,
    api: ApiCalls,
    rx: crate::pods::status::StatusReceiver,
    metrics: Arc<PodMetrics>,
    /// Boxed: a table's slots are a power of two, up to half of them empty, and an entry in place would make
    /// every empty slot cost a whole entry rather than a pointer.
    /// With a fixed hasher (no per-table random keys in every node's idle task; the keys are UIDs the API
    /// server assigned).
    entries: HashMap<Arc<str>, Box<Entry>, BuildHasherDefault<DefaultHasher>>,
    /// Pods with something to write, oldest first (a few per node: a `Vec` is a word smaller than a deque).
    dirty: Vec<Arc<str>>,
    mirrors: Mirrors,
    /// Callers waiting for everything queued to be written (tests and shutdown); boxed, made only then.
    #[allow(
        clippy::box_collection,
        reason = "8 bytes in the idle writer, which has no flush waiting"
    )]
    flushes: Option<Box<Vec<tokio::sync::oneshot::Sender<()>>>>,
    /// At the earliest retry, while one is due (allocated only then).
    retry_timer: WakeTimer,
}

/// Whether a write failed because the pod it was meant for no longer exists: 404; or another pod now has the
/// name — a PATCH carrying the old UID is refused as an immutable-field change (422 naming `metadata.uid`), a
/// DELETE with a UID precondition as a conflict (409).
fn gone(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(s) => {
            s.code == 404 || s.code == 409 || (s.code == 422 && s.message.contains("metadata.uid"))
        }
        _ => false,
    }
}

/// One write: the status PATCH if it changed, then the DELETE if asked for. A static pod's status goes to its
/// mirror pod (`target` is the mirror's UID); a static pod is never deleted here.
#[allow(clippy::too_many_arguments)]
async fn write(
    client: crate::client::ApiClient,
    namespace: String,
    calls: ApiCalls,
    uid: Arc<str>,
    target: MirrorOf,
    name: String,
    status: Option<(Box<PodStatus>, u64)>,
    delete: bool,
) -> (Arc<str>, Outcome) {
    let mut acked = None;
    let mut running = false;
    let mut written = None;
    let target_uid = match target {
        MirrorOf::NotStatic => uid.clone(),
        MirrorOf::Missing => return (uid, Outcome::NoMirror(status.map(|(s, _)| s))),
        MirrorOf::Mirror(m) => m.into(),
    };
    let is_static = target_uid != uid;
    if let Some((status, fingerprint)) = status {
        let patch = Patch::Strategic(canonical::PatchBody::new(&target_uid, &status));
        let request = crate::client::namespaced::<Pod>(&namespace).patch_subresource(
            "status",
            &name,
            &PatchParams::default(),
            &patch,
        );
        match calls.run("patch", "pods/status", client.write(request)).await {
            Ok(_) => {
                acked = Some(fingerprint);
                running = status.phase.as_deref() == Some("Running");
                written = is_static.then_some(status);
            }
            // a deleted mirror pod is recreated, and the status written again to the new one
            Err(err) if gone(&err) && is_static => return (uid, Outcome::NoMirror(Some(status))),
            Err(err) if gone(&err) => return (uid, Outcome::Gone),
            Err(err) => {
                tracing::warn!(pod = %name, error = %err, "status update failed, will retry");
                return (uid, Outcome::Retry(Some(status)));
            }
        }
    }
    if delete && is_static {
        // a static pod's mirror is the mirror manager's
        return (uid, Outcome::Gone);
    }
    if delete {
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
        let request = crate::client::namespaced::<Pod>(&namespace).delete(&name, &params);
        return match calls.run("delete", "pods", client.write(request)).await {
            Ok(_) => (uid, Outcome::Gone),
            Err(err) if gone(&err) => (uid, Outcome::Gone),
            Err(err) => {
                tracing::warn!(pod = %name, error = %err, "pod delete failed, will retry");
                (uid, Outcome::Retry(None))
            }
        };
    }
    (
        uid,
        Outcome::Done {
            acked,
            running,
            written,
        },
    )
}

impl StatusManager {
    pub(crate) fn new(
        client: impl Into<crate::client::ApiClient>,
        api: ApiCalls,
        rx: crate::pods::status::StatusReceiver,
        metrics: Arc<PodMetrics>,
        mirrors: Mirrors,
    ) -> Self {
        Self {
            client: client.into(),
            api,
            rx,
            metrics,
            entries: HashMap::default(),
            dirty: Vec::new(),
            mirrors,
            flushes: None,
            retry_timer: WakeTimer::default(),
        }
    }

    fn mark(&mut self, uid: &Arc<str>) {
        if !self.dirty.iter().any(|u| u == uid) {
            self.dirty.push(uid.clone());
        }
    }

    /// The pod's entry, made on first sight under the UID the message brought (the pod's own allocation).
    fn entry(&mut self, uid: &Arc<str>, namespace: &str, name: &str) -> &mut Entry {
        self.entries
            .entry(uid.clone())
            .or_insert_with(|| Box::new(Entry::new(namespace, name)))
    }

    fn apply(&mut self, msg: StatusMsg) {
        match msg {
            StatusMsg::Seed { uid, status } => {
                let e = self.entry(&uid, "", "");
                if e.acked.is_none() {
                    e.acked = Some(canonical::fingerprint(&status));
                }
            }
            StatusMsg::Set {
                uid,
                namespace,
                name,
                status,
                timeline,
            } => {
                let e = self.entry(&uid, &namespace, &name);
                e.name_as(&namespace, &name);
                e.pending = Some(status);
                if timeline.is_some() {
                    e.timeline = timeline;
                }
                if e.retry_at().is_none() {
                    self.mark(&uid);
                }
            }
            StatusMsg::Delete { uid, namespace, name } => {
                let e = self.entry(&uid, &namespace, &name);
                e.name_as(&namespace, &name);
                e.delete = true;
                if e.retry_at().is_none() {
                    self.mark(&uid);
                }
            }
            StatusMsg::Overwritten { uid } => {
                if let Some(e) = self.entries.get_mut(&uid) {
                    e.acked = None;
                }
            }
            StatusMsg::Forget { uid } => {
                self.entries.remove(&uid);
                self.dirty.retain(|u| *u != uid);
            }
            StatusMsg::Flush(done) => self.flushes.get_or_insert_default().push(done),
            StatusMsg::MirrorChanged { uid } => {
                let Some(e) = self.entries.get_mut(&uid) else {
                    return;
                };
                // the new mirror holds no status of ours yet
                e.acked = None;
                if e.pending.is_none() {
                    e.pending = e.last.take();
                }
                if e.retry_at().is_none() && e.pending.is_some() {
                    self.mark(&uid);
                }
            }
        }
    }

    fn next_retry(&self) -> Option<Instant> {
        self.entries.values().filter_map(|e| e.retry_at()).min()
    }

    fn requeue_due(&mut self) {
        let now = Instant::now();
        let mut due = Vec::new();
        for (uid, e) in &mut self.entries {
            if let Some(r) = e.retry.as_mut()
                && r.at.is_some_and(|at| at <= now)
            {
                r.at = None;
                due.push(uid.clone());
            }
        }
        for uid in due {
            self.mark(&uid);
        }
    }

    /// Starts the write of the next dirty pod not already being written, if any has something to write.
    fn start_next(&mut self) -> Option<BoxFuture<'static, (Arc<str>, Outcome)>> {
        loop {
            let i = self
                .dirty
                .iter()
                .position(|u| self.entries.get(u).is_some_and(|e| !e.in_flight))?;
            let uid = self.dirty.remove(i);
            let e = self.entries.get_mut(&uid)?;
            let mut status = e.pending.take().map(|s| {
                let fingerprint = canonical::fingerprint(&s);
                (s, fingerprint)
            });
            if let Some((s, fingerprint)) = &status
                && e.acked == Some(*fingerprint)
            {
                // the API server holds it already: only a start-up timeline may be waiting for it
                if s.phase.as_deref() == Some("Running")
                    && let Some(t) = e.timeline.take()
                {
                    self.metrics.record_start(*t);
                }
                status = None;
            }
            if status.is_none() && !e.delete {
                continue;
            }
            e.in_flight = true;
            let target = self.mirrors.lookup(&uid);
            return Some(Box::pin(write(
                self.client.clone(),
                e.namespace().to_owned(),
                self.api.clone(),
                uid,
                target,
                e.name().to_owned(),
                status,
                e.delete,
            )));
        }
    }

    fn finish(&mut self, uid: Arc<str>, outcome: Outcome) {
        let Some(e) = self.entries.get_mut(&uid) else {
            return;
        };
        e.in_flight = false;
        match outcome {
            Outcome::Gone => {
                self.entries.remove(&uid);
                return;
            }
            Outcome::NoMirror(status) => {
                // written once the mirror pod exists (MirrorChanged)
                if e.pending.is_none() {
                    e.pending = status;
                }
                e.acked = None;
                return;
            }
            Outcome::Done {
                acked,
                running,
                written,
            } => {
                e.acked = acked.or(e.acked);
                e.retry = None;
                if written.is_some() {
                    e.last = written;
                }
                if running && let Some(t) = e.timeline.take() {
                    self.metrics.record_start(*t);
                }
            }
            Outcome::Retry(status) => {
                if e.pending.is_none() {
                    e.pending = status;
                }
                let retry = e.retry.get_or_insert_with(|| {
                    Box::new(Retry {
                        at: None,
                        backoff: Backoff::new(BackoffPolicy::api_retry()),
                    })
                });
                retry.at = Some(Instant::now() + retry.backoff.next_delay());
                self.dirty.retain(|u| *u != uid);
                return;
            }
        }
        if e.pending.is_some() || e.delete {
            self.mark(&uid);
        }
    }

    /// Writes until `cancel` fires or every handle is dropped.
    pub(crate) fn run(mut self, cancel: CancellationToken) -> impl Future<Output = ()> + Send + 'static {
        async move {
            let mut writes = FuturesUnordered::new();
            loop {
                while let Ok(msg) = self.rx.try_recv() {
                    self.apply(*msg);
                }
                while writes.len() < IN_FLIGHT
                    && let Some(w) = self.start_next()
                {
                    writes.push(w);
                }
                let retry = self.next_retry();
                if self.flushes.is_some() && writes.is_empty() && self.dirty.is_empty() && retry.is_none() {
                    for done in self.flushes.take().into_iter().flat_map(|f| *f) {
                        let _ = done.send(());
                    }
                }
                self.retry_timer.set(retry);
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    msg = self.rx.recv() => match msg {
                        Some(msg) => self.apply(*msg),
                        None => return,
                    },
                    Some((uid, outcome)) = writes.next(), if !writes.is_empty() => self.finish(uid, outcome),
                    () = self.retry_timer.fired() => self.requeue_due(),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
