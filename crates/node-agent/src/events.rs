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
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::{ApiCalls, RateLimiter, is_already_exists, is_not_found};
use crate::backoff::{Backoff, BackoffPolicy};
use crate::density::chan;

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

/// An event waiting to be written. Its strings (the involved object's seven fields, the reason, the message)
/// are one allocation: queued as ten strings each, the events of a burst of pod starts would be a great many
/// small allocations, freed out of order with the pods' long-lived state and leaving the allocator's pages
/// part-used after the burst.
#[derive(Debug)]
struct PendingEvent {
    texts: Box<str>,
    /// Where each field ends in `texts` (fields in the `F_*` order).
    ends: [u32; FIELDS],
    /// Bit `i`: field `i` is present (the object's fields are optional).
    present: u16,
    kind: EventType,
    at: Timestamp,
}

const FIELDS: usize = 9;
const F_API_VERSION: usize = 0;
const F_FIELD_PATH: usize = 1;
const F_KIND: usize = 2;
const F_NAME: usize = 3;
const F_NAMESPACE: usize = 4;
const F_RESOURCE_VERSION: usize = 5;
const F_UID: usize = 6;
const F_REASON: usize = 7;
const F_MESSAGE: usize = 8;

impl PendingEvent {
    fn new(object: &ObjectReference, kind: EventType, reason: &str, message: &str, at: Timestamp) -> Self {
        let o = object;
        let fields: [Option<&str>; FIELDS] = [
            o.api_version.as_deref(),
            o.field_path.as_deref(),
            o.kind.as_deref(),
            o.name.as_deref(),
            o.namespace.as_deref(),
            o.resource_version.as_deref(),
            o.uid.as_deref(),
            Some(reason),
            Some(message),
        ];
        let mut texts = String::with_capacity(fields.iter().flatten().map(|f| f.len()).sum());
        let mut ends = [0; FIELDS];
        let mut present = 0;
        for (i, field) in fields.iter().enumerate() {
            if let Some(f) = field {
                texts.push_str(f);
                present |= 1 << i;
            }
            // saturates past 4 GiB (an event's strings are short); a field cut that way reads as empty
            ends[i] = u32::try_from(texts.len()).unwrap_or(u32::MAX);
        }
        Self {
            texts: texts.into_boxed_str(),
            ends,
            present,
            kind,
            at,
        }
    }

    fn field(&self, i: usize) -> Option<&str> {
        if self.present & (1 << i) == 0 {
            return None;
        }
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        self.texts.get(start..self.ends[i] as usize)
    }

    fn reason(&self) -> &str {
        self.field(F_REASON).unwrap_or_default()
    }

    fn message(&self) -> &str {
        self.field(F_MESSAGE).unwrap_or_default()
    }

    fn name(&self) -> Option<&str> {
        self.field(F_NAME)
    }

    /// The involved object, as it was recorded.
    fn object(&self) -> ObjectReference {
        let get = |i| self.field(i).map(str::to_owned);
        ObjectReference {
            api_version: get(F_API_VERSION),
            field_path: get(F_FIELD_PATH),
            kind: get(F_KIND),
            name: get(F_NAME),
            namespace: get(F_NAMESPACE),
            resource_version: get(F_RESOURCE_VERSION),
            uid: get(F_UID),
        }
    }
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
        let message = message.into();
        let ev = Box::new(PendingEvent::new(
            object,
            kind,
            reason,
            &message,
            Timestamp::now(),
        ));
        if let Err(chan::SendError(ev)) = self.tx.try_send(ev) {
            tracing::debug!(reason = %ev.reason(), object = ?ev.name(), "event dropped: queue full or closed");
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
            out.push((
                ev.kind,
                ev.reason().to_owned(),
                ev.message().to_owned(),
                ev.name().unwrap_or_default().to_owned(),
            ));
        }
        out
    }
}

/// A remembered event, kept small: every agent keeps up to [`RECENT`] of them.
#[derive(Debug)]
struct Recent {
    key: u64,
    /// The event's first timestamp in nanoseconds: with the involved object's name (hashed into `key`), its
    /// name ([`event_name`]); kept instead of the name (a string per remembered event, per node).
    first_at: i64,
    count: i32,
    /// When it was last written, in [`grid::secs`](crate::density::grid::secs).
    seen: u32,
}

/// An event's name: its object's name and a hexadecimal timestamp, unique per object and first occurrence.
fn event_name(ev: &PendingEvent, first_at: i64) -> String {
    format!("{}.{first_at:x}", ev.name().unwrap_or("unknown"))
}

/// The queue of one agent's events, shared by the event writers made for it one after the other (a writer
/// rebuilt after a crash takes over the queue its recorders still send to). Cheap to clone.
#[derive(Debug, Clone)]
pub struct EventQueue(Arc<Mutex<chan::Receiver<Box<PendingEvent>>>>);

impl EventQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, chan::Receiver<Box<PendingEvent>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next event; `None` once every recorder is gone. The lock is held only within a poll.
    fn recv(&self) -> impl Future<Output = Option<Box<PendingEvent>>> + '_ {
        std::future::poll_fn(move |cx| self.lock().poll_recv(cx))
    }

    fn try_recv(&self) -> Option<Box<PendingEvent>> {
        self.lock().try_recv().ok()
    }
}

/// The task that writes one agent's events to the API server.
pub struct EventSink {
    rx: EventQueue,
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
        let queue = EventQueue(Arc::new(Mutex::new(rx)));
        let sink = EventSink::resume(queue, client, api, host, qps, burst, token);
        (EventRecorder { tx }, sink)
    }

    /// A writer of the events queued in `queue` (the queue of an earlier writer, see [`EventSink::queue`]); the
    /// rest as in [`EventSink::new`]. It starts with no memory of recent events.
    pub fn resume(
        queue: EventQueue,
        client: impl Into<crate::client::ApiClient>,
        api: ApiCalls,
        host: impl Into<String>,
        qps: u32,
        burst: u32,
        token: CancellationToken,
    ) -> EventSink {
        EventSink {
            rx: queue,
            client: client.into(),
            api,
            host: host.into(),
            limiter: RateLimiter::new(qps, burst),
            recent: VecDeque::new(),
            token,
        }
    }

    /// The queue this writer reads.
    pub fn queue(&self) -> EventQueue {
        self.rx.clone()
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
        while let Some(ev) = self.rx.try_recv() {
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
        (
            ev.field(F_NAMESPACE),
            ev.field(F_KIND),
            ev.name(),
            ev.field(F_UID),
            ev.field(F_FIELD_PATH),
            ev.kind,
            ev.reason(),
            ev.message(),
        )
            .hash(&mut h);
        h.finish()
    }

    async fn write(&mut self, ev: PendingEvent) {
        if let Some(l) = &self.limiter {
            l.acquire().await;
        }
        let now = crate::density::grid::secs(Instant::now());
        let ttl = RECENT_TTL.as_secs() as u32;
        self.recent.retain(|r| now.saturating_sub(r.seen) < ttl);
        let key = Self::key(&ev);
        let namespace = ev
            .field(F_NAMESPACE)
            .filter(|n| !n.is_empty())
            .unwrap_or("default")
            .to_owned();

        if let Some(pos) = self.recent.iter().position(|r| r.key == key) {
            let (name, count) = (
                event_name(&ev, self.recent[pos].first_at),
                self.recent[pos].count + 1,
            );
            let patch = serde_json::json!({ "count": count, "lastTimestamp": Time(ev.at) });
            let request = crate::client::namespaced::<Event>(&namespace).patch(
                &name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            );
            match self.api.run("patch", "events", self.client.write(request)).await {
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
                    tracing::warn!(error = %e, reason = %ev.reason(), "could not update event");
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
            involved_object: ev.object(),
            reason: Some(ev.reason().to_owned()),
            message: Some(ev.message().to_owned()),
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
        // the body is made once; the Event is not kept across the write (nor the object the server returns)
        let body = match serde_json::to_vec(&event) {
            Ok(body) => body,
            Err(e) => {
                tracing::warn!(error = %e, reason = %ev.reason(), "could not encode event");
                return;
            }
        };
        drop(event);
        let mut backoff = Backoff::new(BackoffPolicy::api_retry());
        loop {
            let request =
                crate::client::namespaced::<Event>(&namespace).create(&PostParams::default(), body.clone());
            match self.api.run("create", "events", self.client.write(request)).await {
                Ok(_) => break,
                Err(e) if is_already_exists(&e) => break,
                Err(e) if backoff.attempts() < 3 && !self.token.is_cancelled() => {
                    tracing::debug!(error = %e, reason = %ev.reason(), "event write failed, retrying");
                    backoff.wait().await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, reason = %ev.reason(), "could not write event");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_event_gives_back_the_object_reason_and_message_it_was_recorded_with() {
        let object = ObjectReference {
            api_version: Some("v1".into()),
            field_path: Some("spec.containers{app}".into()),
            kind: Some("Pod".into()),
            name: Some("web-0".into()),
            namespace: Some(String::new()),
            resource_version: None,
            uid: Some("8f0c".into()),
        };
        let at = Timestamp::now();
        let ev = PendingEvent::new(
            &object,
            EventType::Warning,
            "BackOff",
            "Back-off restarting — ünïcode",
            at,
        );
        assert_eq!(ev.object(), object, "absent stays absent, empty stays empty");
        assert_eq!(ev.reason(), "BackOff");
        assert_eq!(ev.message(), "Back-off restarting — ünïcode");
        assert_eq!(ev.name(), Some("web-0"));
        assert_eq!((ev.kind, ev.at), (EventType::Warning, at));
        let node = PendingEvent::new(&node_reference("n1"), EventType::Normal, "NodeReady", "", at);
        assert_eq!(node.object(), node_reference("n1"));
        assert_eq!(node.message(), "");
    }

    #[test]
    fn a_remembered_event_stays_24_bytes() {
        // up to `RECENT` per agent, thousands of agents per fleet: `seen` is in grid seconds, not an `Instant`
        assert_eq!(size_of::<Recent>(), 24);
    }
}
