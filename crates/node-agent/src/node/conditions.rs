//! The node conditions the kubelet owns — MemoryPressure, DiskPressure, PIDPressure, Ready — as a small state
//! machine with the kubelet's reasons, messages, transition rules and events.
//!
//! State is compact (status, reason, message, transition time per condition) and is seeded from the Node as the
//! API server has it, so a restart after the controller-manager set `Unknown` produces the same events
//! (NodeReady, NodeHasSufficientMemory, ...) the kubelet would.

use std::hash::{Hash, Hasher};

use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// A condition's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CondStatus {
    /// `True`.
    True,
    /// `False`.
    False,
    /// `Unknown` (not yet set, or set by the controller-manager when the node went silent).
    Unknown,
}

impl CondStatus {
    fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }

    fn parse(s: &str) -> Self {
        match s {
            "True" => Self::True,
            "False" => Self::False,
            _ => Self::Unknown,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Cond {
    status: CondStatus,
    text: Text,
    transition: Transition,
}

/// A condition's reason and message: a pair the kubelet's own states use (static), or texts of their own (a
/// NotReady message, a condition seeded from the API) in a box: two words, because the node status task holds
/// four for the node's life. Compared and hashed by the texts, not by where they are kept.
#[derive(Debug, Clone)]
enum Text {
    Static(&'static (&'static str, &'static str)),
    Own(Box<(Box<str>, Box<str>)>),
}

impl Text {
    const NONE: Text = Text::Static(&("", ""));

    fn own(reason: &str, message: &str) -> Self {
        Text::Own(Box::new((reason.into(), message.into())))
    }

    fn reason(&self) -> &str {
        match self {
            Text::Static((reason, _)) => reason,
            Text::Own(texts) => &texts.0,
        }
    }

    fn message(&self) -> &str {
        match self {
            Text::Static((_, message)) => message,
            Text::Own(texts) => &texts.1,
        }
    }
}

impl PartialEq for Text {
    fn eq(&self, other: &Self) -> bool {
        self.reason() == other.reason() && self.message() == other.message()
    }
}

impl Eq for Text {}

impl Hash for Text {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.reason().hash(h);
        self.message().hash(h);
    }
}

/// A condition's last transition time at the API's one-second resolution, in one word (the node status task
/// holds four for the node's life); `NONE` until the condition has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Transition(i64);

impl Transition {
    const NONE: Transition = Transition(i64::MIN);

    fn at(t: Timestamp) -> Self {
        Transition(t.as_second())
    }

    fn get(self) -> Option<Timestamp> {
        (self != Self::NONE).then(|| Timestamp::from_second(self.0).unwrap_or(Timestamp::UNIX_EPOCH))
    }

    fn is_some(self) -> bool {
        self != Self::NONE
    }
}

impl Cond {
    fn unknown() -> Self {
        Self {
            status: CondStatus::Unknown,
            text: Text::NONE,
            transition: Transition::NONE,
        }
    }
}

/// What the conditions are computed from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConditionInputs {
    /// The eviction manager sees memory pressure.
    pub memory_pressure: bool,
    /// The eviction manager sees disk pressure.
    pub disk_pressure: bool,
    /// The eviction manager sees PID pressure.
    pub pid_pressure: bool,
    /// Why the node is not ready (runtime, network, failed health checks); empty = ready.
    pub not_ready: Vec<String>,
}

/// The kubelet-owned node conditions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConditions {
    memory: Cond,
    disk: Cond,
    pid: Cond,
    ready: Cond,
}

/// `Ready=True` reason.
pub const REASON_READY: &str = "KubeletReady";
/// `Ready=False` reason.
pub const REASON_NOT_READY: &str = "KubeletNotReady";
/// `Ready=True` message.
pub const MESSAGE_READY: &str = "kubelet is posting ready status";

struct PressureText {
    cond_type: &'static str,
    /// Reason and message without pressure.
    ok: (&'static str, &'static str),
    ok_event: &'static str,
    /// Reason and message under pressure.
    bad: (&'static str, &'static str),
    bad_event: &'static str,
}

const MEMORY: PressureText = PressureText {
    cond_type: "MemoryPressure",
    ok: (
        "KubeletHasSufficientMemory",
        "kubelet has sufficient memory available",
    ),
    ok_event: "NodeHasSufficientMemory",
    bad: (
        "KubeletHasInsufficientMemory",
        "kubelet has insufficient memory available",
    ),
    bad_event: "NodeHasInsufficientMemory",
};
const DISK: PressureText = PressureText {
    cond_type: "DiskPressure",
    ok: ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ok_event: "NodeHasNoDiskPressure",
    bad: ("KubeletHasDiskPressure", "kubelet has disk pressure"),
    bad_event: "NodeHasDiskPressure",
};
const PID: PressureText = PressureText {
    cond_type: "PIDPressure",
    ok: ("KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ok_event: "NodeHasSufficientPID",
    bad: (
        "KubeletHasInsufficientPID",
        "kubelet has insufficient PID available",
    ),
    bad_event: "NodeHasInsufficientPID",
};

fn update_pressure(
    c: &mut Cond,
    text: &'static PressureText,
    pressure: bool,
    now: Timestamp,
    events: &mut Vec<&'static str>,
) {
    let (want, texts, event) = if pressure {
        (CondStatus::True, &text.bad, text.bad_event)
    } else {
        (CondStatus::False, &text.ok, text.ok_event)
    };
    if c.status != want {
        *c = Cond {
            status: want,
            text: Text::Static(texts),
            transition: Transition::at(now),
        };
        events.push(event);
    }
}

/// The kubelet's way of joining several errors into one message: the error itself when alone, `[a, b]` otherwise.
pub fn aggregate(errors: &[String]) -> String {
    match errors {
        [] => String::new(),
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

impl Default for NodeConditions {
    fn default() -> Self {
        Self::unknown()
    }
}

impl NodeConditions {
    /// All four conditions `Unknown`, as for a node never reported.
    pub fn unknown() -> Self {
        Self {
            memory: Cond::unknown(),
            disk: Cond::unknown(),
            pid: Cond::unknown(),
            ready: Cond::unknown(),
        }
    }

    /// Seeds the state from the conditions on the Node as the API server has it (other condition types are
    /// left to their owners).
    pub fn from_api(conditions: &[NodeCondition]) -> Self {
        let mut s = Self::unknown();
        for c in conditions {
            let slot = match c.type_.as_str() {
                "MemoryPressure" => &mut s.memory,
                "DiskPressure" => &mut s.disk,
                "PIDPressure" => &mut s.pid,
                "Ready" => &mut s.ready,
                _ => continue,
            };
            *slot = Cond {
                status: CondStatus::parse(&c.status),
                text: Text::own(
                    c.reason.as_deref().unwrap_or_default(),
                    c.message.as_deref().unwrap_or_default(),
                ),
                transition: c
                    .last_transition_time
                    .as_ref()
                    .map_or(Transition::NONE, |t| Transition::at(t.0)),
            };
        }
        s
    }

    /// Recomputes the conditions from `inputs` at wall time `now`; returns the reasons of the events the
    /// kubelet records for the transitions (`NodeHasSufficientMemory`, `NodeReady`, `NodeNotReady`, ...).
    pub fn update(&mut self, inputs: &ConditionInputs, now: Timestamp) -> Vec<&'static str> {
        let mut events = Vec::new();
        update_pressure(
            &mut self.memory,
            &MEMORY,
            inputs.memory_pressure,
            now,
            &mut events,
        );
        update_pressure(&mut self.disk, &DISK, inputs.disk_pressure, now, &mut events);
        update_pressure(&mut self.pid, &PID, inputs.pid_pressure, now, &mut events);

        let (status, text) = if inputs.not_ready.is_empty() {
            (CondStatus::True, Text::Static(&(REASON_READY, MESSAGE_READY)))
        } else {
            (
                CondStatus::False,
                Text::own(REASON_NOT_READY, &aggregate(&inputs.not_ready)),
            )
        };
        let had_ready = self.ready.transition.is_some() || self.ready.status != CondStatus::Unknown;
        if self.ready.status != status {
            // A status change is a transition; the kubelet records an event only when a Ready condition existed.
            if had_ready {
                events.push(if status == CondStatus::True {
                    "NodeReady"
                } else {
                    "NodeNotReady"
                });
            }
            self.ready = Cond {
                status,
                text,
                transition: Transition::at(now),
            };
        } else {
            // Same status: reason/message refresh, transition time kept.
            self.ready.text = text;
            if !self.ready.transition.is_some() {
                self.ready.transition = Transition::at(now);
            }
        }
        events
    }

    /// Whether Ready is True.
    pub fn is_ready(&self) -> bool {
        self.ready.status == CondStatus::True
    }

    /// The Ready condition's status, reason and message.
    pub fn ready(&self) -> (CondStatus, &str, &str) {
        (
            self.ready.status,
            self.ready.text.reason(),
            self.ready.text.message(),
        )
    }

    /// A fingerprint of everything but heartbeat times: equal fingerprints mean nothing to report.
    pub fn fingerprint(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.hash_into(&mut h);
        h.finish()
    }

    fn hash_into(&self, h: &mut impl Hasher) {
        for c in [&self.memory, &self.disk, &self.pid, &self.ready] {
            c.hash(h);
        }
    }

    /// The API form, in the kubelet's order (pressures, then Ready last), with heartbeat `heartbeat`.
    pub fn to_api(&self, heartbeat: Timestamp) -> Vec<NodeCondition> {
        [
            (MEMORY.cond_type, &self.memory),
            (DISK.cond_type, &self.disk),
            (PID.cond_type, &self.pid),
            ("Ready", &self.ready),
        ]
        .into_iter()
        .map(|(t, c)| NodeCondition {
            type_: t.into(),
            status: c.status.as_str().into(),
            reason: Some(c.text.reason().to_owned()),
            message: Some(c.text.message().to_owned()),
            last_heartbeat_time: Some(Time(heartbeat)),
            last_transition_time: Some(Time(c.transition.get().unwrap_or(heartbeat))),
        })
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn ready_inputs() -> ConditionInputs {
        ConditionInputs::default()
    }

    #[test]
    fn first_update_sets_everything_and_records_pressure_events_only() {
        let mut c = NodeConditions::unknown();
        let ev = c.update(&ready_inputs(), t(0));
        assert_eq!(
            ev,
            vec![
                "NodeHasSufficientMemory",
                "NodeHasNoDiskPressure",
                "NodeHasSufficientPID"
            ]
        );
        assert!(c.is_ready());
        let api = c.to_api(t(1));
        let types: Vec<&str> = api.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]);
        assert_eq!(api[3].reason.as_deref(), Some("KubeletReady"));
        assert_eq!(api[3].message.as_deref(), Some("kubelet is posting ready status"));
        assert_eq!(api[0].reason.as_deref(), Some("KubeletHasSufficientMemory"));
        assert_eq!(api[0].status, "False");
        assert_eq!(api[3].last_transition_time, Some(Time(t(0))));
        assert_eq!(api[3].last_heartbeat_time, Some(Time(t(1))));
    }

    #[test]
    fn heartbeat_alone_does_not_change_the_fingerprint() {
        let mut c = NodeConditions::unknown();
        c.update(&ready_inputs(), t(0));
        let fp = c.fingerprint();
        assert!(c.update(&ready_inputs(), t(10)).is_empty());
        assert_eq!(c.fingerprint(), fp);
    }

    #[test]
    fn not_ready_carries_the_reason_and_records_events() {
        let mut c = NodeConditions::unknown();
        c.update(&ready_inputs(), t(0));
        let down = ConditionInputs {
            not_ready: vec!["container runtime is down".into()],
            ..Default::default()
        };
        assert_eq!(c.update(&down, t(5)), vec!["NodeNotReady"]);
        assert_eq!(
            c.ready(),
            (CondStatus::False, "KubeletNotReady", "container runtime is down")
        );
        let both = ConditionInputs {
            not_ready: vec!["container runtime is down".into(), "network state unknown".into()],
            ..Default::default()
        };
        let fp = c.fingerprint();
        assert!(
            c.update(&both, t(6)).is_empty(),
            "message change is not a transition"
        );
        assert_ne!(c.fingerprint(), fp, "but it is a change to report");
        assert_eq!(c.ready().2, "[container runtime is down, network state unknown]");
        assert_eq!(c.to_api(t(7))[3].last_transition_time, Some(Time(t(5))));
        assert_eq!(c.update(&ready_inputs(), t(8)), vec!["NodeReady"]);
    }

    #[test]
    fn seeded_from_unknown_conditions_records_what_the_kubelet_records() {
        let unknown = |ty: &str| NodeCondition {
            type_: ty.into(),
            status: "Unknown".into(),
            reason: Some("NodeStatusUnknown".into()),
            message: Some("Kubelet stopped posting node status.".into()),
            last_transition_time: Some(Time(t(0))),
            last_heartbeat_time: Some(Time(t(0))),
        };
        let existing: Vec<NodeCondition> = [
            "MemoryPressure",
            "DiskPressure",
            "PIDPressure",
            "Ready",
            "NetworkUnavailable",
        ]
        .map(unknown)
        .to_vec();
        let mut c = NodeConditions::from_api(&existing);
        let ev = c.update(&ready_inputs(), t(100));
        assert_eq!(
            ev,
            vec![
                "NodeHasSufficientMemory",
                "NodeHasNoDiskPressure",
                "NodeHasSufficientPID",
                "NodeReady"
            ]
        );
        assert_eq!(c.to_api(t(100))[3].last_transition_time, Some(Time(t(100))));
    }

    #[test]
    fn pressure_transitions() {
        let mut c = NodeConditions::unknown();
        c.update(&ready_inputs(), t(0));
        let p = ConditionInputs {
            memory_pressure: true,
            disk_pressure: true,
            pid_pressure: true,
            not_ready: vec![],
        };
        assert_eq!(
            c.update(&p, t(1)),
            vec![
                "NodeHasInsufficientMemory",
                "NodeHasDiskPressure",
                "NodeHasInsufficientPID"
            ]
        );
        let api = c.to_api(t(1));
        assert_eq!(api[1].reason.as_deref(), Some("KubeletHasDiskPressure"));
        assert_eq!(api[1].message.as_deref(), Some("kubelet has disk pressure"));
    }
}
