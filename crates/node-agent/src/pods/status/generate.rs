//! Computing a pod's API status from its spec, what the runtime holds, probe results and the waiting reasons
//! of the last sync — the kubelet's rules:
//!
//! * container statuses: `state` from the newest instance (`waiting` with the last sync's reason while a
//!   restart is pending, e.g. CrashLoopBackOff), `lastState` from the instance before (or the exited one being
//!   restarted), `restartCount` from the instance's annotation, `ready` = running, started and readiness passed
//!   (an init container that completed: exited 0), `started` = running and startup probe passed; app containers sorted by name, init containers in order;
//! * phase: Pending until init containers finish, Running while any app container runs or will restart,
//!   Succeeded / Failed when all are done for good;
//! * conditions PodReadyToStartContainers, Initialized, Ready (with readiness gates), ContainersReady and
//!   PodScheduled, each keeping its lastTransitionTime while its status does not change.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus,
    ContainerUser, HostIP, LinuxContainerUser, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::pods::model::resize;
use crate::pods::model::resources::ContainerResources;
use crate::pods::model::spec::{ContainerSpec, DesiredPod};
use crate::pods::probes::ProbeResults;
use crate::pods::runtime::observed::{CState, ContainerRecord, RuntimeView};

/// A pod phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Not all containers started yet.
    Pending,
    /// Running or restarting.
    Running,
    /// All containers exited 0 and will not restart.
    Succeeded,
    /// All containers exited, some failed, none will restart.
    Failed,
}

impl Phase {
    /// The API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
        }
    }

    /// Parses the API spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "Pending" => Some(Self::Pending),
            "Running" => Some(Self::Running),
            "Succeeded" => Some(Self::Succeeded),
            "Failed" => Some(Self::Failed),
            _ => None,
        }
    }

    /// Succeeded or Failed.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

/// Everything status generation reads.
pub(crate) struct Inputs<'a> {
    pub pod: &'a DesiredPod,
    pub view: &'a RuntimeView,
    pub probes: &'a ProbeResults,
    /// Waiting reason and message per container name, from the last sync.
    pub waiting: &'a BTreeMap<String, (&'static str, String)>,
    pub host_ips: &'a [String],
    pub start_time: Option<Timestamp>,
    /// What the status reported before said (transition times, pod IPs).
    pub old: Option<&'a Previous>,
    pub runtime_type: &'a str,
    /// A phase decided elsewhere (the pod terminated).
    pub terminal: Option<Phase>,
    /// An in-place resize the worker has not finished applying.
    pub resizing: Option<Resizing<'a>>,
}

/// An in-place resize not yet applied to every container.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Resizing<'a> {
    /// Per running container (by runtime ID): the resources it still runs with.
    pub actuated: &'a BTreeMap<String, ContainerResources>,
    /// Why the last attempt failed.
    pub error: Option<&'a str>,
    /// The pod generation the resize was accepted at.
    pub generation: Option<i64>,
    /// When it was accepted, seconds since the epoch.
    pub since: i64,
}

/// What status generation keeps of the status reported before, in place of the whole status: when each
/// condition the agent owns took its value, and the pod IPs (still reported once the sandbox is gone).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Previous {
    /// Per [`OWNED_CONDITIONS`](crate::pods::status::canonical::OWNED_CONDITIONS) entry: its status and last transition
    /// time (seconds since the epoch, the API's resolution).
    conditions: [Seen; 5],
    pod_ips: Box<[String]>,
}

/// A condition's status and last transition second in one word (every running pod keeps five): the second
/// times two, plus one when the status was True; `NONE` when the condition was not reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen(i64);

impl Seen {
    const NONE: Seen = Seen(i64::MIN);

    fn new(ok: bool, second: i64) -> Self {
        // a Timestamp's seconds are within ±2^39, so doubling cannot overflow
        Seen(second * 2 + i64::from(ok))
    }

    fn get(self) -> Option<(bool, i64)> {
        (self != Self::NONE).then_some((self.0 & 1 == 1, self.0 >> 1))
    }
}

impl Default for Seen {
    fn default() -> Self {
        Self::NONE
    }
}

impl Previous {
    /// What `status` says about its conditions and pod IPs.
    pub(crate) fn of(status: &PodStatus) -> Self {
        let mut conditions = [Seen::NONE; 5];
        for c in status.conditions.iter().flatten() {
            let Some(i) = crate::pods::status::canonical::OWNED_CONDITIONS
                .iter()
                .position(|t| *t == c.type_)
            else {
                continue;
            };
            if let Some(since) = &c.last_transition_time {
                conditions[i] = Seen::new(c.status == "True", since.0.as_second());
            }
        }
        let pod_ips = status.pod_ips.iter().flatten().map(|p| p.ip.clone()).collect();
        Self { conditions, pod_ips }
    }

    /// The Ready condition: whether it was True and since when (seconds since the epoch), if reported.
    pub(crate) fn ready(&self) -> Option<(bool, i64)> {
        let i = crate::pods::status::canonical::OWNED_CONDITIONS
            .iter()
            .position(|t| *t == "Ready")?;
        self.conditions[i].get()
    }

    /// When condition `type_` became `ok`, if that is what it said.
    fn since(&self, type_: &str, ok: bool) -> Option<Time> {
        let i = crate::pods::status::canonical::OWNED_CONDITIONS
            .iter()
            .position(|t| *t == type_)?;
        let (was, since) = self.conditions[i].get()?;
        (was == ok).then(|| Time(Timestamp::from_second(since).unwrap_or(Timestamp::UNIX_EPOCH)))
    }
}

/// A timestamp with the API's one-second resolution.
pub(crate) fn api_time(t: Timestamp) -> Time {
    Time(Timestamp::from_second(t.as_second()).unwrap_or(t))
}

fn ns_time(ns: i64) -> Option<Time> {
    (ns > 0).then(|| Time(Timestamp::from_second(ns / 1_000_000_000).unwrap_or(Timestamp::UNIX_EPOCH)))
}

fn waiting(reason: &str, message: Option<String>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_owned()),
            message,
        }),
        ..Default::default()
    }
}

/// The terminated state of `r`, its message cut to `max_message` bytes.
fn terminated(r: &ContainerRecord, id: &str, max_message: usize) -> ContainerState {
    let mut message = r.message().to_owned();
    crate::pods::runtime::termination::truncate(&mut message, max_message);
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: r.exit_code,
            reason: Some(r.reason().to_owned())
                .filter(|s| !s.is_empty())
                .or_else(|| Some(if r.exit_code == 0 { "Completed" } else { "Error" }.to_owned())),
            message: Some(message).filter(|s| !s.is_empty()),
            started_at: ns_time(r.started_at),
            finished_at: ns_time(r.finished_at),
            container_id: Some(id.to_owned()),
            signal: None,
        }),
        ..Default::default()
    }
}

/// Whether the pod's init phase is over: an app container exists, or every regular init container succeeded and
/// every sidecar started, in the newest sandbox.
pub(crate) fn initialized(pod: &DesiredPod, view: &RuntimeView, probes: &ProbeResults) -> bool {
    let Some(sandbox) = view.sandbox() else {
        return false;
    };
    if pod
        .containers
        .iter()
        .any(|c| view.latest_in(&c.name, &sandbox.id).is_some())
    {
        return true;
    }
    pod.init_containers
        .iter()
        .all(|c| match view.latest_in(&c.name, &sandbox.id) {
            None => false,
            Some(r) if c.sidecar => r.running() && (c.startup.is_none() || probes.started(&r.id)),
            Some(r) => r.succeeded(),
        })
}

struct Gen<'a> {
    i: &'a Inputs<'a>,
}

impl Gen<'_> {
    fn status(&self, c: &ContainerSpec) -> ContainerStatus {
        let view = self.i.view;
        // the kubelet's default waiting reason depends only on whether the pod has init containers
        let default_reason = if !self.i.pod.init_containers.is_empty() {
            "PodInitializing"
        } else {
            "ContainerCreating"
        };
        let cached = self.i.waiting.get(&c.name);
        let Some(r) = view.latest(&c.name) else {
            let (reason, message) = cached.map_or((default_reason, None), |(r, m)| (*r, Some(m.clone())));
            return ContainerStatus {
                name: c.name.clone(),
                image: c.image.clone(),
                state: Some(waiting(reason, message.filter(|m| !m.is_empty()))),
                ready: false,
                started: Some(false),
                ..Default::default()
            };
        };
        let id = format!("{}://{}", self.i.runtime_type, r.id);
        let prev = view.previous(&c.name).filter(|p| p.state == CState::Exited);
        // the pod's messages share the status's room, as the kubelet's status manager cuts them
        let pod = self.i.pod;
        let max = crate::pods::runtime::termination::MAX_POD_BYTES
            / (pod.init_containers.len() + pod.containers.len()).max(1);
        let mut last = prev.map(|p| terminated(p, &format!("{}://{}", self.i.runtime_type, p.id), max));
        let state = match r.state {
            CState::Running => ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: ns_time(r.started_at),
                }),
                ..Default::default()
            },
            CState::Created => waiting("ContainerCreating", None),
            CState::Exited => match cached {
                Some((reason, message)) if self.i.terminal.is_none() => {
                    last = Some(terminated(r, &id, max));
                    waiting(reason, Some(message.clone()).filter(|m| !m.is_empty()))
                }
                _ => terminated(r, &id, max),
            },
            CState::Unknown => waiting("ContainerStatusUnknown", None),
        };
        let started = r.running() && (c.startup.is_none() || self.i.probes.started(&r.id));
        // as the kubelet: an ephemeral container is never counted ready
        let ready = started
            && (c.readiness.is_none() || self.i.probes.ready(&r.id) == Some(true))
            && pod.ephemeral_named(&c.name).is_none();
        // as the kubelet: a running container reports the resources it runs with, any other its allocation
        let running_with = match r.state {
            CState::Running => self
                .i
                .resizing
                .and_then(|z| z.actuated.get(&*r.id))
                .copied()
                .unwrap_or(c.resources),
            _ => c.resources,
        };
        ContainerStatus {
            name: c.name.clone(),
            image: if r.image().is_empty() {
                c.image.clone()
            } else {
                r.image().to_string()
            },
            image_id: r.image_ref().to_string(),
            container_id: Some(id),
            state: Some(state),
            last_state: last,
            ready,
            started: Some(started),
            restart_count: i32::try_from(r.restart_count).unwrap_or(i32::MAX),
            resources: Some(resize::requirements(&running_with)),
            allocated_resources: Some(c.resources.requests_api()).filter(|r| !r.is_empty()),
            // as the kubelet: the identity the runtime reports, whatever the policy
            user: r.user().map(|u| ContainerUser {
                linux: Some(LinuxContainerUser {
                    uid: u.uid,
                    gid: u.gid,
                    supplemental_groups: Some(u.supplemental_groups.clone()).filter(|g| !g.is_empty()),
                }),
            }),
            ..Default::default()
        }
    }
}

fn is(state: &Option<ContainerState>, f: impl Fn(&ContainerState) -> bool) -> bool {
    state.as_ref().is_some_and(f)
}

fn phase(pod: &DesiredPod, init: &[ContainerStatus], app: &[ContainerStatus], initialized: bool) -> Phase {
    let never = pod.restart_policy == crate::pods::model::spec::RestartPolicy::Never;
    if !initialized {
        let failed_init = pod.init_containers.iter().zip(init).any(|(c, s)| {
            !c.sidecar
                && is(&s.state, |st| {
                    st.terminated.as_ref().is_some_and(|t| t.exit_code != 0)
                })
        });
        if failed_init && never {
            return Phase::Failed;
        }
        return Phase::Pending;
    }
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for s in app {
        if is(&s.state, |st| st.running.is_some()) {
            running += 1;
        } else if let Some(t) = s.state.as_ref().and_then(|st| st.terminated.as_ref()) {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if s.last_state.as_ref().is_some_and(|l| l.terminated.is_some()) {
            stopped += 1;
        } else {
            waiting += 1;
        }
    }
    if waiting > 0 {
        return Phase::Pending;
    }
    if running > 0 {
        return Phase::Running;
    }
    if stopped == 0 {
        return Phase::Pending;
    }
    match pod.restart_policy {
        crate::pods::model::spec::RestartPolicy::Always => Phase::Running,
        _ if stopped == succeeded => Phase::Succeeded,
        crate::pods::model::spec::RestartPolicy::Never => Phase::Failed,
        crate::pods::model::spec::RestartPolicy::OnFailure => Phase::Running,
    }
}

fn condition(
    old: Option<&Previous>,
    type_: &str,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
    now: Time,
) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    let since = old.and_then(|o| o.since(type_, ok));
    PodCondition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.map(str::to_owned),
        message,
        last_transition_time: Some(since.unwrap_or(now)),
        ..Default::default()
    }
}

fn names(list: &[&str]) -> String {
    format!("[{}]", list.join(" "))
}

/// Generates the status; returns it with its phase.
pub(crate) fn generate(i: &Inputs<'_>) -> (PodStatus, Phase) {
    let pod = i.pod;
    let initialized_now = initialized(pod, i.view, i.probes);
    let g = Gen { i };
    let init: Vec<ContainerStatus> = pod
        .init_containers
        .iter()
        .map(|c| {
            let mut s = g.status(c);
            // as the kubelet: an init container that ran to completion is ready (a sidecar is ready as an app
            // container is)
            if !c.sidecar {
                s.ready = is(&s.state, |st| {
                    st.terminated.as_ref().is_some_and(|t| t.exit_code == 0)
                });
            }
            s
        })
        .collect();
    let mut app: Vec<ContainerStatus> = pod.containers.iter().map(|c| g.status(c)).collect();
    let ephemeral: Vec<ContainerStatus> = pod.ephemeral().iter().map(|e| g.status(&e.container)).collect();
    let phase = i
        .terminal
        .unwrap_or_else(|| phase(pod, &init, &app, initialized_now));
    app.sort_by(|a, b| a.name.cmp(&b.name));

    let now = api_time(Timestamp::now());
    let old = i.old;
    let sandbox_ready = i.view.sandbox().is_some_and(|s| s.ready) && !phase.is_terminal();
    let incomplete: Vec<&str> = pod
        .init_containers
        .iter()
        .zip(&init)
        .filter(|(c, s)| {
            if c.sidecar {
                s.started != Some(true)
            } else {
                !is(&s.state, |st| {
                    st.terminated.as_ref().is_some_and(|t| t.exit_code == 0)
                })
            }
        })
        .map(|(c, _)| c.name.as_str())
        .collect();
    let initialized = initialized_now || incomplete.is_empty() || phase == Phase::Succeeded;
    let unready: Vec<&str> = pod
        .init_containers
        .iter()
        .zip(&init)
        .filter(|(c, s)| c.sidecar && !s.ready)
        .map(|(c, _)| c.name.as_str())
        .chain(pod.containers.iter().filter_map(|c| {
            let s = app.iter().find(|s| s.name == c.name)?;
            (!s.ready).then_some(c.name.as_str())
        }))
        .collect();
    let completed = phase == Phase::Succeeded;
    let containers_ready = unready.is_empty() && !phase.is_terminal();
    let (cr_reason, cr_message) = if completed {
        (Some("PodCompleted"), None)
    } else if containers_ready {
        (None, None)
    } else {
        (
            Some("ContainersNotReady"),
            Some(format!("containers with unready status: {}", names(&unready))),
        )
    };
    let gates_pending: Vec<String> = pod
        .readiness_gates()
        .iter()
        .filter_map(|gate| match pod.gate_status().iter().find(|(t, _)| t == gate) {
            None => Some(format!(
                "corresponding condition of pod readiness gate {gate:?} does not exist."
            )),
            Some((_, true)) => None,
            Some((_, false)) => Some(format!(
                "the status of pod readiness gate {gate:?} is not \"True\", but False"
            )),
        })
        .collect();
    let ready = containers_ready && gates_pending.is_empty();
    let (ready_reason, ready_message) = if ready || completed || !containers_ready {
        (cr_reason, cr_message.clone())
    } else {
        (Some("ReadinessGatesNotReady"), Some(gates_pending.join(", ")))
    };
    let mut conditions = vec![
        condition(
            old,
            "PodReadyToStartContainers",
            sandbox_ready,
            None,
            None,
            now.clone(),
        ),
        if initialized {
            condition(
                old,
                "Initialized",
                true,
                completed
                    .then_some("PodCompleted")
                    .filter(|_| !pod.init_containers.is_empty()),
                None,
                now.clone(),
            )
        } else {
            condition(
                old,
                "Initialized",
                false,
                Some("ContainersNotInitialized"),
                Some(format!(
                    "containers with incomplete status: {}",
                    names(&incomplete)
                )),
                now.clone(),
            )
        },
        condition(old, "Ready", ready, ready_reason, ready_message, now.clone()),
        condition(
            old,
            "ContainersReady",
            containers_ready,
            cr_reason,
            cr_message,
            now.clone(),
        ),
        condition(old, "PodScheduled", true, None, None, now.clone()),
    ];
    for c in &mut conditions {
        c.observed_generation = pod.generation;
    }
    // the resize conditions carry the time their cause arose (kept by who holds them, so an unchanged
    // condition is not written again)
    let since = |second: i64| Time(Timestamp::from_second(second).unwrap_or(Timestamp::UNIX_EPOCH));
    if let Some(p) = pod.resize_pending() {
        conditions.push(PodCondition {
            type_: resize::PENDING.to_owned(),
            status: "True".to_owned(),
            reason: Some(p.reason.to_owned()),
            message: Some(p.message.clone()),
            last_transition_time: Some(since(p.since)),
            observed_generation: p.generation,
            ..Default::default()
        });
    }
    if let Some(z) = i.resizing {
        conditions.push(PodCondition {
            type_: resize::IN_PROGRESS.to_owned(),
            status: "True".to_owned(),
            reason: z.error.map(|_| "Error".to_owned()),
            message: z.error.map(str::to_owned),
            last_transition_time: Some(since(z.since)),
            observed_generation: z.generation,
            ..Default::default()
        });
    }

    let mut pod_ips: Vec<String> = i.view.sandbox().map(|s| s.ips.clone()).unwrap_or_default();
    if pod.host_network {
        pod_ips = i.host_ips.to_vec();
    }
    if pod_ips.is_empty() {
        pod_ips = old.map(|o| o.pod_ips.to_vec()).unwrap_or_default();
    }
    let (allocated_resources, resources) = resize::pod_status_resources(pod);
    let status = PodStatus {
        phase: Some(phase.as_str().to_owned()),
        allocated_resources,
        resources,
        conditions: Some(conditions),
        host_ip: i.host_ips.first().cloned(),
        host_ips: (!i.host_ips.is_empty())
            .then(|| i.host_ips.iter().map(|ip| HostIP { ip: ip.clone() }).collect()),
        pod_ip: pod_ips.first().cloned(),
        pod_ips: (!pod_ips.is_empty()).then(|| pod_ips.into_iter().map(|ip| PodIP { ip }).collect()),
        start_time: i.start_time.map(api_time),
        qos_class: Some(pod.qos.as_str().to_owned()),
        init_container_statuses: (!init.is_empty()).then_some(init),
        container_statuses: Some(app),
        ephemeral_container_statuses: (!ephemeral.is_empty()).then_some(ephemeral),
        observed_generation: pod.generation,
        ..Default::default()
    };
    (status, phase)
}

/// The status of a pod admission refused: Failed, with the reason and `Pod was rejected: <message>`.
pub(crate) fn rejected(pod: &DesiredPod, reason: &str, message: &str, start_time: Timestamp) -> PodStatus {
    PodStatus {
        phase: Some(Phase::Failed.as_str().to_owned()),
        reason: Some(reason.to_owned()),
        message: Some(format!("Pod was rejected: {message}")),
        start_time: Some(api_time(start_time)),
        qos_class: Some(pod.qos.as_str().to_owned()),
        observed_generation: pod.generation,
        ..Default::default()
    }
}

#[cfg(test)]
mod seen_tests {
    use crate::pods::status::generate::Seen;

    #[test]
    fn a_packed_condition_gives_back_its_status_and_second() {
        for second in [0, 1, 1_764_000_000, -1, -3, -377_705_116_800, 253_402_300_799] {
            for ok in [true, false] {
                assert_eq!(
                    Seen::new(ok, second).get(),
                    Some((ok, second)),
                    "{ok} at {second}"
                );
            }
        }
        assert_eq!(Seen::default().get(), None);
    }
}
