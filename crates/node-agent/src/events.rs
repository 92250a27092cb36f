//! Kubernetes Events, recorded without blocking the caller.
//!
//! This module owns the agent's event path: [`EventRecorder`] is a cheap clone handed to every manager (node
//! side now, pod workers later); it queues the event and returns. One [`EventSink`] task per agent writes them:
//! rate-limited by `eventRecordQPS`/`eventBurst`, and — like the kubelet's recorder — a repeat of a recent
//! identical event (same object, type, reason, message) bumps `count` and `lastTimestamp` of the existing Event
//! with a PATCH instead of creating a new one. Events carry `source.component=kubelet`,
//! `source.host=<node>` and the same as reporting controller/instance.

use std::collections::VecDeque;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::{ApiCalls, RateLimiter, is_already_exists, is_not_found};
use crate::backoff::{Backoff, BackoffPolicy};
use crate::chan;

/// The component name events are reported under.
pub const COMPONENT: &str = "kubelet";

/// How many events may wait in one agent's queue before new ones are dropped.
const QUEUE: usize = 256;
/// How many recent events are remembered for de-duplication.
const RECENT: usize = 16;
/// How long a recent event is remembered.
const RECENT_TTL: Duration = Duration::from_secs(600);
/// How long queued events may still be written after shutdown is signalled.
const DRAIN: Duration = Duration::from_secs(2);

/// `Normal` or `Warning`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// An expected happening.
    Normal,
    /// Something a user should look at.
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

#[derive(Debug)]
struct PendingEvent {
    object: ObjectReference,
    kind: EventType,
    reason: String,
    message: String,
    at: Timestamp,
}

/// Records events for one agent; clone freely.
#[derive(Debug, Clone)]
pub struct EventRecorder {
    tx: chan::Sender<Box<PendingEvent>>,
}

/// The reference the kubelet uses for its own Node in events (UID = node name, as upstream does).
pub fn node_reference(node_name: &str) -> ObjectReference {
    ObjectReference {
        kind: Some("Node".into()),
        name: Some(node_name.to_owned()),
        uid: Some(node_name.to_owned()),
        ..Default::default()
    }
}

impl EventRecorder {
    /// Queues an event about `object`. Never blocks: when the queue is full the event is dropped and logged.
    pub fn record(
        &self,
        object: &ObjectReference,
        kind: EventType,
        reason: &str,
        message: impl Into<String>,
    ) {
        let ev = Box::new(PendingEvent {
            object: object.clone(),
            kind,
            reason: reason.to_owned(),
            message: message.into(),
            at: Timestamp::now(),
        });
        if let Err(chan::SendError(ev)) = self.tx.try_send(ev) {
            tracing::debug!(reason = %ev.reason, object = ?ev.object.name, "event dropped: queue full or closed");
        }
    }

    /// Queues a `Normal` event.
    pub fn normal(&self, object: &ObjectReference, reason: &str, message: impl Into<String>) {
        self.record(object, EventType::Normal, reason, message);
    }

    /// Queues a `Warning` event.
    pub fn warning(&self, object: &ObjectReference, reason: &str, message: impl Into<String>) {
        self.record(object, EventType::Warning, reason, message);
    }
}

/// A recorder whose events are kept for a test to read instead of being written.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct CapturedEvents {
    rx: chan::Receiver<Box<PendingEvent>>,
}

#[cfg(test)]
impl CapturedEvents {
    /// A recorder and what it records.
    pub(crate) fn new() -> (EventRecorder, Self) {
        let (tx, rx) = chan::channel(QUEUE);
        (EventRecorder { tx }, Self { rx })
    }

    /// The events recorded since the last call: (type, reason, message, involved object's name).
    pub(crate) fn drain(&mut self) -> Vec<(EventType, String, String, String)> {
        let mut out = Vec::new();
        while let Ok(ev) = self.rx.try_recv() {
            out.push((ev.kind, ev.reason, ev.message, ev.object.name.unwrap_or_default()));
        }
        out
    }
}

#[derive(Debug)]
struct Recent {
    key: u64,
    /// The event's first timestamp in nanoseconds: with the involved object's name (hashed into `key`), its
    /// name ([`event_name`]); kept instead of the name (a string per remembered event, per node).
    first_at: i64,
    count: i32,
    seen: Instant,
}

/// An event's name: its object's name and a hexadecimal timestamp, unique per object and first occurrence.
fn event_name(ev: &PendingEvent, first_at: i64) -> String {
    format!("{}.{first_at:x}", ev.object.name.as_deref().unwrap_or("unknown"))
}

/// The task that writes one agent's events to the API server.
pub struct EventSink {
    rx: chan::Receiver<Box<PendingEvent>>,
    client: crate::client::ApiClient,
    api: ApiCalls,
    host: String,
    limiter: Option<RateLimiter>,
    recent: VecDeque<Recent>,
    token: CancellationToken,
}

impl EventSink {
    /// A recorder and the sink that writes its events as node `host`, with `qps`/`burst` (0 qps = no limit).
    pub fn new(
        client: impl Into<crate::client::ApiClient>,
        api: ApiCalls,
        host: impl Into<String>,
        qps: u32,
        burst: u32,
        token: CancellationToken,
    ) -> (EventRecorder, EventSink) {
        let (tx, rx) = chan::channel(QUEUE);
        let sink = EventSink {
            rx,
            client: client.into(),
            api,
            host: host.into(),
            limiter: RateLimiter::new(qps, burst),
            recent: VecDeque::new(),
            token,
        };
        (EventRecorder { tx }, sink)
    }

    /// Writes events until every recorder is dropped or the token fires; queued events get a short grace.
    pub fn run(mut self) -> impl Future<Output = ()> + Send + 'static {
        async move {
            loop {
                tokio::select! {
                    ev = self.rx.recv() => match ev {
                        // boxed: the idle task keeps no room for a request in flight
                        Some(ev) => Box::pin(self.write(*ev)).await,
                        None => return,
                    },
                    () = self.token.cancelled() => break,
                }
            }
            // boxed: the drain's timer is not kept in the idle task
            Box::pin(self.drain()).await;
        }
    }

    /// At shutdown: writes what is queued, for at most [`DRAIN`].
    async fn drain(&mut self) {
        let deadline = Instant::now() + DRAIN;
        while let Ok(ev) = self.rx.try_recv() {
            if tokio::time::timeout_at(deadline, Box::pin(self.write(*ev)))
                .await
                .is_err()
            {
                break;
            }
        }
    }

    fn key(ev: &PendingEvent) -> u64 {
        let mut h = DefaultHasher::new();
        let o = &ev.object;
        (
            &o.namespace,
            &o.kind,
            &o.name,
            &o.uid,
            &o.field_path,
            ev.kind,
            &ev.reason,
            &ev.message,
        )
            .hash(&mut h);
        h.finish()
    }

    async fn write(&mut self, ev: PendingEvent) {
        if let Some(l) = &self.limiter {
            l.acquire().await;
        }
        let now = Instant::now();
        self.recent
            .retain(|r| now.saturating_duration_since(r.seen) < RECENT_TTL);
        let key = Self::key(&ev);
        let namespace = ev
            .object
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".into());

        if let Some(pos) = self.recent.iter().position(|r| r.key == key) {
            let (name, count) = (
                event_name(&ev, self.recent[pos].first_at),
                self.recent[pos].count + 1,
            );
            let api: Api<Event> = Api::namespaced(self.client.kube(), &namespace);
            let patch = serde_json::json!({ "count": count, "lastTimestamp": Time(ev.at) });
            match self
                .api
                .run(
                    "patch",
                    "events",
                    api.patch(&name, &PatchParams::default(), &Patch::Strategic(&patch)),
                )
                .await
            {
                Ok(_) => {
                    let r = &mut self.recent[pos];
                    r.count = count;
                    r.seen = now;
                    return;
                }
                Err(e) if is_not_found(&e) => {
                    self.recent.remove(pos);
                }
                Err(e) => {
                    tracing::warn!(error = %e, reason = %ev.reason, "could not update event");
                    return;
                }
            }
        }

        // (a time past the year 2262 saturates: the event is written, and its repeats written anew)
        let first_at = i64::try_from(ev.at.as_nanosecond()).unwrap_or(i64::MAX);
        let name = event_name(&ev, first_at);
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            involved_object: ev.object.clone(),
            reason: Some(ev.reason.clone()),
            message: Some(ev.message.clone()),
            type_: Some(ev.kind.as_str().into()),
            source: Some(EventSource {
                component: Some(COMPONENT.into()),
                host: Some(self.host.clone()),
            }),
            reporting_component: Some(COMPONENT.into()),
            reporting_instance: Some(self.host.clone()),
            first_timestamp: Some(Time(ev.at)),
            last_timestamp: Some(Time(ev.at)),
            count: Some(1),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.kube(), &namespace);
        let mut backoff = Backoff::new(BackoffPolicy::api_retry());
        loop {
            match self
                .api
                .run("create", "events", api.create(&PostParams::default(), &event))
                .await
            {
                Ok(_) => break,
                Err(e) if is_already_exists(&e) => break,
                Err(e) if backoff.attempts() < 3 && !self.token.is_cancelled() => {
                    tracing::debug!(error = %e, reason = %ev.reason, "event write failed, retrying");
                    backoff.wait().await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, reason = %ev.reason, "could not write event");
                    return;
                }
            }
        }
        if self.recent.len() >= RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(Recent {
            key,
            first_at,
            count: 1,
            seen: now,
        });
    }
}
