//! The state of one fake runtime and its state machines: sandboxes (READY → NOTREADY → removed), containers
//! (CREATED → RUNNING → EXITED → removed), the images, the address allocator and the event subscribers.
//!
//! Time-driven transitions (a scripted exit, an OOM kill, the end of a stop grace period) are planned as
//! deadlines and applied lazily: every reader first calls [`State::settle`], and one timer task per runtime (only
//! while deadlines are pending, see `runtime.rs`) settles at each deadline so subscribers get their events on
//! time. Both paths apply the same transition with the deadline as its timestamp, so the result does not depend
//! on who gets there first.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use futures::channel::mpsc::UnboundedSender;
use runtime_api::{RuntimeError, cri};

use crate::ids::{self, IdCodec};
use crate::images::Images;
use crate::ipam::Ipam;
use crate::keymap::KeyMap;
use crate::pairs::{Meta, Pairs};
use crate::script::{Rng, Script};

/// Container states, as CRI numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CState {
    Created,
    Running,
    Exited,
}

impl CState {
    pub(crate) fn cri(self) -> cri::ContainerState {
        match self {
            CState::Created => cri::ContainerState::ContainerCreated,
            CState::Running => cri::ContainerState::ContainerRunning,
            CState::Exited => cri::ContainerState::ContainerExited,
        }
    }
}

/// Why a container is in its state (the CRI `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    None,
    Completed,
    Error,
    OomKilled,
    StartError,
}

impl Reason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::None => "",
            Reason::Completed => "Completed",
            Reason::Error => "Error",
            Reason::OomKilled => "OOMKilled",
            Reason::StartError => "StartError",
        }
    }
}

/// Exit code of a process killed by SIGKILL.
pub(crate) const KILLED: i32 = 137;

/// A planned end of a running container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Planned {
    pub(crate) at: i64,
    pub(crate) exit_code: i32,
    pub(crate) oom: bool,
}

#[derive(Debug)]
pub(crate) struct Sandbox {
    /// name, uid, namespace, runtime handler, log directory (see [`Sandbox::new_meta`]); labels, annotations.
    pub(crate) meta: Meta<5>,
    /// The log directory is the kubelet's `<root>/<namespace>_<name>_<uid>` and only its root is kept.
    pub(crate) log_dir_derived: bool,
    pub(crate) attempt: u32,
    pub(crate) ready: bool,
    pub(crate) created: i64,
    /// Pod IPs while the network is up (primary first); empty for host-network pods and after stop.
    pub(crate) ips: Ips,
    /// Network, PID and IPC namespace modes (CRI `NamespaceMode` numbers).
    pub(crate) namespaces: [u8; 3],
}

impl Sandbox {
    pub(crate) fn name(&self) -> &str {
        self.meta.get(0)
    }
    pub(crate) fn uid(&self) -> &str {
        self.meta.get(1)
    }
    pub(crate) fn namespace(&self) -> &str {
        self.meta.get(2)
    }
    pub(crate) fn runtime_handler(&self) -> &str {
        self.meta.get(3)
    }
    pub(crate) fn labels(&self) -> Pairs<'_> {
        self.meta.labels()
    }
    pub(crate) fn annotations(&self) -> Pairs<'_> {
        self.meta.annotations()
    }
    pub(crate) fn log_directory(&self) -> std::borrow::Cow<'_, str> {
        let dir = self.meta.get(4);
        if self.log_dir_derived {
            format!(
                "{dir}/{}",
                pod_dir_name(self.namespace(), self.name(), self.uid())
            )
            .into()
        } else {
            dir.into()
        }
    }

    /// The record's strings and maps, and whether the log directory is kept as its root only: the kubelet
    /// names it after the pod's namespace, name and UID, which the sandbox keeps anyway (no second copy of them).
    pub(crate) fn new_meta(
        [name, uid, namespace, handler, log_directory]: [&str; 5],
        labels: HashMap<String, String>,
        annotations: HashMap<String, String>,
    ) -> (Meta<5>, bool) {
        let root = log_directory
            .strip_suffix(pod_dir_name(namespace, name, uid).as_str())
            .and_then(|r| r.strip_suffix('/'))
            .filter(|r| !r.is_empty());
        let (dir, derived) = match root {
            Some(root) => (root, true),
            None => (log_directory, false),
        };
        (
            Meta::new([name, uid, namespace, handler, dir], labels, annotations),
            derived,
        )
    }
}

/// `<namespace>_<name>_<uid>`, a pod's log directory under the root.
fn pod_dir_name(namespace: &str, name: &str, uid: &str) -> String {
    format!("{namespace}_{name}_{uid}")
}

/// The addresses of a sandbox: the primary inline, the rest (dual stack) boxed.
#[derive(Debug, Default)]
pub(crate) struct Ips {
    primary: Option<IpAddr>,
    more: Box<[IpAddr]>,
}

impl Ips {
    pub(crate) fn new(ips: Vec<IpAddr>) -> Self {
        let mut ips = ips.into_iter();
        Ips {
            primary: ips.next(),
            more: ips.collect(),
        }
    }

    pub(crate) fn to_vec(&self) -> Vec<IpAddr> {
        self.primary.iter().chain(self.more.iter()).copied().collect()
    }
}

#[derive(Debug)]
pub(crate) struct Container {
    pub(crate) sandbox: u64,
    /// name, log path; labels, annotations.
    pub(crate) meta: Meta<2>,
    pub(crate) attempt: u32,
    pub(crate) image: Arc<crate::images::ImageMeta>,
    pub(crate) state: CState,
    pub(crate) created: i64,
    pub(crate) started: i64,
    pub(crate) finished: i64,
    pub(crate) exit_code: i32,
    pub(crate) reason: Reason,
    pub(crate) message: Option<Box<str>>,
    pub(crate) planned: Option<Planned>,
    /// `LinuxContainerResources` as protobuf bytes (a tenth of the decoded message's size).
    pub(crate) resources: Option<Box<[u8]>>,
    pub(crate) script: Arc<Script>,
}

impl Container {
    pub(crate) fn name(&self) -> &str {
        self.meta.get(0)
    }

    pub(crate) fn log_path(&self) -> &str {
        self.meta.get(1)
    }

    pub(crate) fn labels(&self) -> Pairs<'_> {
        self.meta.labels()
    }

    pub(crate) fn annotations(&self) -> Pairs<'_> {
        self.meta.annotations()
    }
    /// The resources the container was created with.
    pub(crate) fn resources(&self) -> Option<cri::LinuxContainerResources> {
        self.resources
            .as_deref()
            .and_then(|bytes| prost::Message::decode(bytes).ok())
    }
}

/// Which object an event is about.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Subject {
    Sandbox(u64),
    Container(u64),
}

/// Planned transitions and the timer task's bookkeeping (see `runtime.rs`); boxed in the state, made at the first
/// plan (most runtimes of a fleet plan none).
#[derive(Debug, Default)]
pub(crate) struct Timers {
    /// Planned container ends, earliest first: (Unix nanoseconds, container key).
    pub(crate) deadlines: BinaryHeap<Reverse<(i64, u64)>>,
    /// The running timer task (none while nothing is pending).
    pub(crate) task: Option<tokio::task::JoinHandle<()>>,
    pub(crate) wake: Option<Arc<tokio::sync::Notify>>,
}

impl Timers {
    /// Whether a timer task is alive (one whose tokio runtime shut down counts as gone).
    pub(crate) fn running(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished())
    }
}

/// Everything one fake runtime holds, behind its mutex.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) codec: IdCodec,
    pub(crate) next_key: u64,
    /// Boxed records in a vector that grows with them (see [`KeyMap`]).
    pub(crate) sandboxes: KeyMap<Sandbox>,
    pub(crate) containers: KeyMap<Container>,
    pub(crate) images: Images,
    /// `None` until the runtime has a pod CIDR (its pod network is not ready).
    pub(crate) ipam: Option<Ipam>,
    pub(crate) rng: Rng,
    pub(crate) timers: Option<Box<Timers>>,
    /// Boxed events: an event is large, and a stream's queue keeps a node sized by its message even while empty,
    /// so unboxed every node's idle event stream would hold room for one.
    pub(crate) subscribers: Vec<UnboundedSender<Box<cri::ContainerEventResponse>>>,
    pub(crate) runtime_ready: bool,
    pub(crate) network_ready: bool,
    pub(crate) reachable: bool,
    /// Events pushed so far (for benchmarks and tests).
    pub(crate) events_sent: u64,
}

pub(crate) fn container_not_found(id: &str) -> RuntimeError {
    RuntimeError::not_found(format!(
        "an error occurred when try to find container {id:?}: not found"
    ))
}

pub(crate) fn sandbox_not_found(id: &str) -> RuntimeError {
    RuntimeError::not_found(format!(
        "an error occurred when try to find sandbox {id:?}: not found"
    ))
}

impl State {
    pub(crate) fn new(codec: IdCodec, ipam: Option<Ipam>, seed: u64) -> Self {
        State {
            codec,
            next_key: 1,
            sandboxes: KeyMap::default(),
            containers: KeyMap::default(),
            images: Images::default(),
            ipam,
            rng: Rng::new(seed),
            timers: None,
            subscribers: Vec::new(),
            runtime_ready: true,
            network_ready: true,
            reachable: true,
            events_sent: 0,
        }
    }

    pub(crate) fn new_key(&mut self) -> u64 {
        let key = self.next_key;
        self.next_key += 1;
        key
    }

    /// The container an id (or unique id prefix) names.
    pub(crate) fn container_key(&self, id: &str) -> Result<u64, RuntimeError> {
        ids::resolve(&self.codec, id, self.containers.keys().copied(), |k| {
            self.containers.contains_key(&k)
        })
        .ok_or_else(|| container_not_found(id))
    }

    /// The sandbox an id (or unique id prefix) names.
    pub(crate) fn sandbox_key(&self, id: &str) -> Result<u64, RuntimeError> {
        ids::resolve(&self.codec, id, self.sandboxes.keys().copied(), |k| {
            self.sandboxes.contains_key(&k)
        })
        .ok_or_else(|| sandbox_not_found(id))
    }

    /// Apply every planned transition due at `now`. Returns whether anything changed.
    pub(crate) fn settle(&mut self, now: i64) -> bool {
        let mut changed = false;
        while let Some(timers) = self.timers.as_deref_mut()
            && let Some(&Reverse((at, key))) = timers.deadlines.peek()
            && at <= now
        {
            timers.deadlines.pop();
            let due = self
                .containers
                .get(&key)
                .and_then(|c| c.planned.filter(|p| c.state == CState::Running && p.at == at));
            if let Some(plan) = due {
                self.finish(key, plan);
                changed = true;
            }
        }
        changed
    }

    /// Plan the end of a running container, unless an earlier end is already planned. Returns `true` when this
    /// is now the runtime's earliest deadline (the timer must wake up).
    pub(crate) fn plan(&mut self, key: u64, plan: Planned) -> bool {
        let Some(c) = self.containers.get_mut(&key) else {
            return false;
        };
        if c.state != CState::Running || c.planned.is_some_and(|p| p.at <= plan.at) {
            return false;
        }
        c.planned = Some(plan);
        let deadlines = &mut self.timers.get_or_insert_with(Box::default).deadlines;
        let earliest = deadlines.peek().is_none_or(|Reverse((at, _))| plan.at < *at);
        deadlines.push(Reverse((plan.at, key)));
        earliest
    }

    /// A running container ends now as planned: EXITED with the exit code, reason and finish time.
    fn finish(&mut self, key: u64, plan: Planned) {
        let Some(c) = self.containers.get_mut(&key) else {
            return;
        };
        c.state = CState::Exited;
        c.finished = plan.at;
        c.exit_code = plan.exit_code;
        c.reason = if plan.oom {
            Reason::OomKilled
        } else if plan.exit_code == 0 {
            Reason::Completed
        } else {
            Reason::Error
        };
        c.planned = None;
        self.emit(
            Subject::Container(key),
            cri::ContainerEventType::ContainerStoppedEvent,
            plan.at,
        );
    }

    /// Kill a container now (SIGKILL): a running one exits 137; others are left alone.
    pub(crate) fn kill(&mut self, key: u64, now: i64) {
        if self
            .containers
            .get(&key)
            .is_some_and(|c| c.state == CState::Running)
        {
            self.finish(
                key,
                Planned {
                    at: now,
                    exit_code: KILLED,
                    oom: false,
                },
            );
        }
    }

    /// Stop a sandbox: kill its running containers, release its addresses, mark it NOTREADY.
    pub(crate) fn stop_sandbox(&mut self, key: u64, now: i64) {
        let members: Vec<u64> = self.containers_of(key).collect();
        for c in members {
            self.kill(c, now);
        }
        let Some(sb) = self.sandboxes.get_mut(&key) else {
            return;
        };
        let ips = std::mem::take(&mut sb.ips);
        if let Some(ipam) = &mut self.ipam {
            ipam.release(&ips.to_vec());
        }
        if sb.ready {
            sb.ready = false;
            self.emit(
                Subject::Sandbox(key),
                cri::ContainerEventType::ContainerStoppedEvent,
                now,
            );
        }
    }

    /// Remove a container (killing it first if it runs).
    pub(crate) fn remove_container(&mut self, key: u64, now: i64) {
        self.kill(key, now);
        if self.containers.contains_key(&key) {
            self.emit(
                Subject::Container(key),
                cri::ContainerEventType::ContainerDeletedEvent,
                now,
            );
            self.containers.remove(&key);
        }
    }

    /// Remove a sandbox with all its containers (stopping it first if it is ready).
    pub(crate) fn remove_sandbox(&mut self, key: u64, now: i64) {
        self.stop_sandbox(key, now);
        let members: Vec<u64> = self.containers_of(key).collect();
        for c in members {
            self.remove_container(c, now);
        }
        if self.sandboxes.contains_key(&key) {
            self.emit(
                Subject::Sandbox(key),
                cri::ContainerEventType::ContainerDeletedEvent,
                now,
            );
            self.sandboxes.remove(&key);
        }
    }

    pub(crate) fn containers_of(&self, sandbox: u64) -> impl Iterator<Item = u64> + '_ {
        self.containers
            .iter()
            .filter(move |(_, c)| c.sandbox == sandbox)
            .map(|(k, _)| *k)
    }

    /// Push an event to every subscriber (building it only if someone listens), dropping closed subscribers.
    pub(crate) fn emit(&mut self, subject: Subject, kind: cri::ContainerEventType, at: i64) {
        if self.subscribers.is_empty() {
            return;
        }
        let Some(event) = self.event(subject, kind, at) else {
            return;
        };
        let mut subscribers = std::mem::take(&mut self.subscribers);
        subscribers.retain(|tx| tx.unbounded_send(Box::new(event.clone())).is_ok());
        self.events_sent += subscribers.len() as u64;
        self.subscribers = subscribers;
    }

    fn event(
        &self,
        subject: Subject,
        kind: cri::ContainerEventType,
        at: i64,
    ) -> Option<cri::ContainerEventResponse> {
        let (key, sandbox) = match subject {
            Subject::Sandbox(key) => (key, key),
            Subject::Container(key) => (key, self.containers.get(&key)?.sandbox),
        };
        let deleted = matches!(subject, Subject::Container(_))
            && kind == cri::ContainerEventType::ContainerDeletedEvent;
        let containers_statuses = self
            .containers_of(sandbox)
            .filter(|k| !(deleted && matches!(subject, Subject::Container(c) if c == *k)))
            .filter_map(|k| self.container_status(k))
            .collect();
        Some(cri::ContainerEventResponse {
            container_id: self.codec.render(key),
            container_event_type: kind as i32,
            created_at: at,
            pod_sandbox_status: self.sandbox_status(sandbox),
            containers_statuses,
        })
    }
}
