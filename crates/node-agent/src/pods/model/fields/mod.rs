//! Every pod field a node could act on, and what this node does with it.
//!
//! The kubelet acts on most of a pod's spec; a node agent that skips a field runs the pod as though the field
//! were not there, and nobody is told. This module makes that impossible to do by accident:
//!
//! * [`table`] classifies each field of the pod spec's types (`PodSpec`, `Container`, `EphemeralContainer`,
//!   the security contexts, `Volume`, `Probe`, and every type they contain that the node acts on) as one of
//!   [`Handling`]: acted on, left to the control plane, inert on a Linux node as it is for the kubelet, a volume
//!   kind whose mount fails with an event, or refused.
//! * [`refusals`] finds the refused fields a pod carries; admission rejects such a pod naming the field and why
//!   (reason [`REASON`]), so it never runs half-honoured.
//!
//! The table's tests walk the JSON schema of the `k8s-openapi` types the node is built against and fail on any
//! field the table does not name, and on any entry naming a field that no longer exists. A new Kubernetes
//! release's new field therefore fails the build's tests until someone decides what the node does with it.

mod table;
#[cfg(test)]
mod tests;

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

pub use table::FIELDS;

/// The status reason (and event reason) of a pod refused for a field this node does not honour.
pub const REASON: &str = "UnsupportedPodField";

/// What the node does with one field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handling {
    /// Acted on as the kubelet acts on it; the value is used whole.
    Acts,
    /// Acted on; the value is an object (or a list of objects) of the named type, whose fields are classified
    /// in turn.
    Walk(&'static str),
    /// Set for the control plane (scheduler, admission plugins, controllers); the kubelet checks no more of it
    /// than is said, and neither does this node.
    Control(&'static str),
    /// Meaningless on a Linux node: the kubelet does nothing with it there either.
    Inert(&'static str),
    /// A volume kind this node cannot mount: the pod waits in `ContainerCreating` with `FailedMount` events
    /// naming the kind, as a kubelet does for a volume it cannot set up.
    FailsMount,
    /// Not honoured: a pod carrying it (with a value other than `unless`, a JSON literal of the one value the
    /// node does honour) is rejected at admission, naming the field and `why`.
    Refused {
        /// The value that is harmless (the default the node does act on), if any.
        unless: Option<&'static str>,
        /// Why the node cannot honour it yet.
        why: &'static str,
    },
}

/// One classified field: `ty` is the type's name in the `io.k8s.api.core.v1` group, `name` the JSON field name.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// The type, e.g. `Container`.
    pub ty: &'static str,
    /// The field, e.g. `livenessProbe`.
    pub name: &'static str,
    /// What the node does with it.
    pub handling: Handling,
}

/// A refused field found on a pod: where (`spec.containers[0].securityContext.seLinuxOptions`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Where the field is on the pod.
    pub path: String,
    /// Why the node does not honour it.
    pub why: &'static str,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} is not honoured by this node: {}", self.path, self.why)
    }
}

fn lookup(ty: &str, name: &str) -> Option<Handling> {
    FIELDS
        .iter()
        .find(|f| f.ty == ty && f.name == name)
        .map(|f| f.handling)
}

/// The refused fields `pod` carries, in the order of its spec. Empty for a pod the node can run as asked.
pub fn refusals(pod: &Pod) -> Vec<Refusal> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    // The pod arrives typed; the table speaks of JSON field names, so the spec is looked at as JSON once, at
    // admission.
    let Ok(value) = serde_json::to_value(spec) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    walk("PodSpec", &value, "spec", &mut out);
    out
}

fn walk(ty: &str, value: &Value, path: &str, out: &mut Vec<Refusal>) {
    let Value::Object(map) = value else {
        return;
    };
    for (name, v) in map {
        if v.is_null() {
            continue;
        }
        let here = format!("{path}.{name}");
        match lookup(ty, name) {
            Some(Handling::Walk(child)) => match v {
                Value::Array(items) => {
                    for (i, item) in items.iter().enumerate() {
                        walk(child, item, &format!("{here}[{i}]"), out);
                    }
                }
                _ => walk(child, v, &here, out),
            },
            Some(Handling::Refused { unless, why }) => {
                let harmless = unless
                    .and_then(|u| serde_json::from_str::<Value>(u).ok())
                    .is_some_and(|u| &u == v);
                let empty = matches!(v, Value::Array(a) if a.is_empty())
                    || matches!(v, Value::Object(o) if o.is_empty());
                if !harmless && !empty {
                    out.push(Refusal { path: here, why });
                }
            }
            _ => {}
        }
    }
}
