//! Pod events (`Scheduled` is the scheduler's; `Pulling`, `Pulled`, `Created`, `Started`, `Killing`,
//! `Unhealthy`, `BackOff`, `Failed`, `OutOfcpu`, … are ours).
//!
//! Workers call [`PodEventSink::record`], which never blocks. The agent's [`EventRecorder`] implements it:
//! its sink writes `core/v1` Events as the kubelet does (source component `kubelet`, the node as host,
//! rate-limited, repeats folded into a `count` bump); pod events add `fieldPath` naming the container.

use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;

use crate::events::EventRecorder;
pub use crate::events::EventType;

/// One event about a pod (or one of its containers).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodEvent {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
    /// `spec.containers{name}` or `spec.initContainers{name}` for container events.
    pub field_path: Option<String>,
    /// Normal or Warning.
    pub type_: EventType,
    /// The kubelet's reason string.
    pub reason: &'static str,
    /// The message.
    pub message: String,
}

/// Where pod events go. Implementations must not block.
pub trait PodEventSink: Send + Sync + 'static {
    /// Records one event.
    fn record(&self, event: PodEvent);

    /// Records one event about the Node `node` (e.g. an unusable static pod manifest). Default: dropped.
    fn node_event(&self, _node: &str, _type_: EventType, _reason: &'static str, _message: String) {}
}

/// Discards events.
#[derive(Debug, Default)]
pub struct NoEvents;

impl PodEventSink for NoEvents {
    fn record(&self, _event: PodEvent) {}
}

/// Keeps events in memory (tests, debugging).
#[derive(Debug, Default)]
pub struct MemoryEvents(Mutex<Vec<PodEvent>>);

impl MemoryEvents {
    /// Everything recorded so far.
    pub fn all(&self) -> Vec<PodEvent> {
        self.0.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Recorded `(reason, message)` pairs.
    pub fn reasons(&self) -> Vec<(&'static str, String)> {
        self.all().into_iter().map(|e| (e.reason, e.message)).collect()
    }
}

impl PodEventSink for MemoryEvents {
    fn record(&self, event: PodEvent) {
        if let Ok(mut v) = self.0.lock() {
            v.push(event);
        }
    }

    /// Kept as an event with an empty namespace and the node as name.
    fn node_event(&self, node: &str, type_: EventType, reason: &'static str, message: String) {
        self.record(PodEvent {
            namespace: String::new(),
            name: node.to_owned(),
            uid: String::new(),
            field_path: None,
            type_,
            reason,
            message,
        });
    }
}

/// The agent's own event recorder (rate-limited, de-duplicating, written by the node half's event sink)
/// carries pod events too.
impl PodEventSink for EventRecorder {
    fn record(&self, event: PodEvent) {
        let object = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(event.name),
            namespace: Some(event.namespace),
            uid: Some(event.uid),
            field_path: event.field_path,
            ..Default::default()
        };
        EventRecorder::record(self, &object, event.type_, event.reason, event.message);
    }

    fn node_event(&self, node: &str, type_: EventType, reason: &'static str, message: String) {
        EventRecorder::record(self, &crate::events::node_reference(node), type_, reason, message);
    }
}

/// The context workers record events with: the sink plus the pod's identity.
#[derive(Clone)]
pub(crate) struct Recorder {
    sink: Arc<dyn PodEventSink>,
}

impl Recorder {
    pub(crate) fn new(sink: Arc<dyn PodEventSink>) -> Self {
        Self { sink }
    }

    /// An event about the pod itself.
    pub(crate) fn pod(
        &self,
        pod: &crate::pods::model::spec::DesiredPod,
        type_: EventType,
        reason: &'static str,
        message: impl Into<String>,
    ) {
        self.emit(pod, None, type_, reason, message.into());
    }

    /// An event about one of the pod's containers.
    pub(crate) fn container(
        &self,
        pod: &crate::pods::model::spec::DesiredPod,
        container: &str,
        type_: EventType,
        reason: &'static str,
        message: impl Into<String>,
    ) {
        self.emit(
            pod,
            Some(pod.field_path(container)),
            type_,
            reason,
            message.into(),
        );
    }

    fn emit(
        &self,
        pod: &crate::pods::model::spec::DesiredPod,
        field_path: Option<String>,
        type_: EventType,
        reason: &'static str,
        message: String,
    ) {
        self.sink.record(PodEvent {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.to_string(),
            field_path,
            type_,
            reason,
            message,
        });
    }
}
