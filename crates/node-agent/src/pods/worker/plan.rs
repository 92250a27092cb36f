//! Deciding what one sync of a running pod must do — a pure function of the desired pod, the runtime view
//! and probe results, so the ordering rules are unit-tested without a runtime:
//!
//! 1. no ready sandbox → (stop what is left and) create a new one, unless the pod must not restart;
//! 2. init containers one at a time, in order: a regular one must exit 0 before the next starts (a failure
//!    restarts it, or fails the pod under `restartPolicy: Never`); a sidecar (`restartPolicy: Always`) must be
//!    running — and past its startup probe — before the next starts, and is restarted whenever it exits;
//! 3. then every app container: start what never ran, restart what exited when the policy says so, replace
//!    what changed spec or failed liveness/startup;
//! 4. when every app container exited for good, the pod is terminal (Succeeded or Failed);
//!
//! and, once the sandbox is ready, each ephemeral container that never ran is started, once.

use tokio::time::Instant;

use crate::pods::model::spec::{DesiredPod, RestartPolicy};
use crate::pods::probes::{ProbeKind, ProbeResults};
use crate::pods::runtime::observed::{CState, RuntimeView};
use crate::pods::status::Phase;
use crate::pods::status::generate::initialized;

/// A container to stop.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Kill {
    pub id: String,
    pub name: String,
    /// The Killing event message (default "Stopping container <name>").
    pub message: Option<String>,
    /// A probe-level grace period.
    pub grace_secs: Option<i64>,
}

/// A container to (re)start.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Start {
    pub name: String,
    pub init: bool,
    pub restart_count: u32,
    /// When the instance it replaces was seen exited (the back-off clock); `None` for a first start.
    pub exited: Option<Instant>,
}

/// What one sync does.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Plan {
    /// Create a sandbox with this attempt number (after killing `kill`).
    pub create_sandbox: Option<u32>,
    pub kill: Vec<Kill>,
    pub start: Vec<Start>,
    /// The pod is done: nothing will run again.
    pub terminal: Option<Phase>,
}

fn next_restart_count(view: &RuntimeView, name: &str) -> u32 {
    view.latest(name).map_or(0, |r| r.restart_count + 1)
}

fn probe_kill(pod: &DesiredPod, probes: &ProbeResults, id: &str, name: &str) -> Option<Kill> {
    let kind = probes.failed(id)?;
    let c = pod.container(name)?;
    let (word, spec) = match kind {
        ProbeKind::Startup => ("startup", c.startup.as_ref()),
        _ => ("liveness", c.liveness.as_ref()),
    };
    Some(Kill {
        id: id.to_owned(),
        name: name.to_owned(),
        message: Some(format!("Container {name} failed {word} probe, will be restarted")),
        grace_secs: spec.and_then(|s| s.termination_grace_secs),
    })
}

/// Whether the newest instances of all app containers exited and none will run again.
fn finished(pod: &DesiredPod, view: &RuntimeView) -> Option<Phase> {
    if pod.restart_policy == RestartPolicy::Always {
        return None;
    }
    let mut all_ok = true;
    for c in pod.containers.iter() {
        let r = view.latest(&c.name)?;
        if r.state != CState::Exited || pod.restart_policy.restarts(r.exit_code) {
            return None;
        }
        all_ok &= r.exit_code == 0;
    }
    Some(if all_ok { Phase::Succeeded } else { Phase::Failed })
}

/// Computes the plan.
pub(crate) fn plan(pod: &DesiredPod, view: &RuntimeView, probes: &ProbeResults) -> Plan {
    let mut plan = Plan::default();
    let sandbox = view.sandbox().filter(|s| s.ready);
    let Some(sandbox) = sandbox else {
        // containers that ran must not run again under Never: let the pod end instead
        let ran = !view.containers.is_empty();
        if ran && pod.restart_policy == RestartPolicy::Never {
            plan.terminal = Some(finished_never(pod, view));
            return plan;
        }
        if let Some(done) = finished(pod, view) {
            plan.terminal = Some(done);
            return plan;
        }
        plan.kill = running_kills(view, |_| true);
        plan.create_sandbox = Some(view.sandbox().map_or(0, |s| s.attempt + 1));
        return plan;
    };

    // anything running outside the current sandbox, or no longer in the spec, goes
    plan.kill = running_kills(view, |r| {
        r.sandbox_id != sandbox.id || pod.container(&r.name).is_none()
    });

    // as the kubelet: an ephemeral container starts once, whether or not initialization is complete
    for e in pod.ephemeral() {
        if view.latest(&e.container.name).is_none() {
            plan.start.push(Start {
                name: e.container.name.clone(),
                init: false,
                restart_count: 0,
                exited: None,
            });
        }
    }

    if !initialized(pod, view, probes) {
        for c in pod.init_containers.iter() {
            match view.latest_in(&c.name, &sandbox.id) {
                None => {
                    plan.start.push(Start {
                        name: c.name.clone(),
                        init: true,
                        restart_count: next_restart_count(view, &c.name),
                        exited: None,
                    });
                    break;
                }
                Some(r) => match r.state {
                    CState::Running if c.sidecar => {
                        if let Some(k) = probe_kill(pod, probes, &r.id, &c.name) {
                            plan.kill.push(k);
                            break;
                        }
                        if c.startup.is_some() && !probes.started(&r.id) {
                            break;
                        }
                    }
                    CState::Running => break,
                    CState::Exited if !c.sidecar && r.exit_code == 0 => {}
                    CState::Exited if !c.sidecar && pod.restart_policy == RestartPolicy::Never => {
                        plan.terminal = Some(Phase::Failed);
                        plan.kill = running_kills(view, |_| true);
                        break;
                    }
                    CState::Exited => {
                        plan.start.push(Start {
                            name: c.name.clone(),
                            init: true,
                            restart_count: r.restart_count + 1,
                            exited: r.exited_seen,
                        });
                        break;
                    }
                    CState::Created | CState::Unknown => {
                        replace_unstarted(&mut plan, r, true);
                        break;
                    }
                },
            }
        }
        return plan;
    }

    // initialized: keep sidecars up, then the app containers
    for c in pod.init_containers.iter().filter(|c| c.sidecar) {
        match view.latest_in(&c.name, &sandbox.id) {
            Some(r) if r.running() => plan.kill.extend(probe_kill(pod, probes, &r.id, &c.name)),
            Some(r) if r.state == CState::Exited => plan.start.push(Start {
                name: c.name.clone(),
                init: true,
                restart_count: r.restart_count + 1,
                exited: r.exited_seen,
            }),
            None => plan.start.push(Start {
                name: c.name.clone(),
                init: true,
                restart_count: next_restart_count(view, &c.name),
                exited: None,
            }),
            Some(r) => replace_unstarted(&mut plan, r, true),
        }
    }
    if let Some(done) = finished(pod, view) {
        plan.terminal = Some(done);
        plan.start.clear();
        plan.kill = running_kills(view, |_| true);
        return plan;
    }
    for c in pod.containers.iter() {
        match view.latest_in(&c.name, &sandbox.id) {
            None => {
                // ran in an earlier sandbox and must not run again
                if view
                    .latest(&c.name)
                    .is_some_and(|r| r.state == CState::Exited && !pod.restart_policy.restarts(r.exit_code))
                {
                    continue;
                }
                plan.start.push(Start {
                    name: c.name.clone(),
                    init: false,
                    restart_count: next_restart_count(view, &c.name),
                    exited: None,
                });
            }
            Some(r) => match r.state {
                CState::Running => {
                    if r.hash.is_some_and(|h| h != c.hash) {
                        plan.kill.push(Kill {
                            id: r.id.to_string(),
                            name: c.name.clone(),
                            message: Some(format!(
                                "Container {} definition changed, will be restarted",
                                c.name
                            )),
                            grace_secs: None,
                        });
                    } else {
                        plan.kill.extend(probe_kill(pod, probes, &r.id, &c.name));
                    }
                }
                CState::Exited if pod.restart_policy.restarts(r.exit_code) => plan.start.push(Start {
                    name: c.name.clone(),
                    init: false,
                    restart_count: r.restart_count + 1,
                    exited: r.exited_seen,
                }),
                CState::Exited => {}
                CState::Created | CState::Unknown => replace_unstarted(&mut plan, r, false),
            },
        }
    }
    plan
}

fn finished_never(pod: &DesiredPod, view: &RuntimeView) -> Phase {
    let all_ok = pod
        .containers
        .iter()
        .all(|c| view.latest(&c.name).is_some_and(|r| r.succeeded()));
    if all_ok { Phase::Succeeded } else { Phase::Failed }
}

/// A container that never ran here or whose state the runtime lost (`Created` — e.g. created just before the
/// runtime restarted, which leaves it created for good: stopping it changes nothing — or `Unknown`): as the
/// kubelet, a new instance is started in its place, the unknown one stopped first in case it runs after all.
fn replace_unstarted(plan: &mut Plan, r: &crate::pods::runtime::observed::ContainerRecord, init: bool) {
    if r.state == CState::Unknown {
        plan.kill.push(Kill {
            id: r.id.to_string(),
            name: r.name.clone(),
            message: Some("Container is in \"unknown\" state, try killing it before restart".into()),
            grace_secs: None,
        });
    }
    plan.start.push(Start {
        name: r.name.clone(),
        init,
        restart_count: r.restart_count + 1,
        exited: None,
    });
}

fn running_kills(
    view: &RuntimeView,
    pick: impl Fn(&crate::pods::runtime::observed::ContainerRecord) -> bool,
) -> Vec<Kill> {
    view.containers
        .iter()
        .filter(|r| matches!(r.state, CState::Running | CState::Created | CState::Unknown) && pick(r))
        .map(|r| Kill {
            id: r.id.to_string(),
            name: r.name.clone(),
            message: None,
            grace_secs: None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::runtime::observed::{ContainerRecord, ImageNames, SandboxRecord};
    use serde_json::json;
    use std::sync::Arc;

    fn pod(restart: &str) -> Arc<DesiredPod> {
        let p = serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {
                "restartPolicy": restart,
                "initContainers": [
                    {"name": "init1", "image": "i"},
                    {"name": "side", "image": "i", "restartPolicy": "Always"},
                    {"name": "init2", "image": "i"}
                ],
                "containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "i"}]
            }
        }))
        .unwrap();
        DesiredPod::from_pod(&p).unwrap()
    }

    fn sandbox() -> SandboxRecord {
        SandboxRecord {
            id: "sb".into(),
            attempt: 0,
            ready: true,
            created_at: 1,
            ips: vec!["10.0.0.2".into()],
        }
    }

    fn rec(pod: &DesiredPod, name: &str, state: CState, exit: i32, attempt: u32) -> ContainerRecord {
        ContainerRecord {
            id: format!("{name}-{attempt}").into(),
            name: name.into(),
            sandbox_id: "sb".into(),
            restart_count: attempt,
            hash: pod.container(name).map(|c| c.hash),
            state,
            created_at: i64::from(attempt) + 1,
            started_at: 1,
            finished_at: if state == CState::Exited { 2 } else { 0 },
            exit_code: exit,
            ended: None,
            images: Arc::new(ImageNames {
                image: "i".into(),
                image_ref: "sha256:x".into(),
            }),
            exited_seen: (state == CState::Exited).then(Instant::now),
            started_seen: Some(Instant::now()),
        }
    }

    fn names(p: &Plan) -> Vec<&str> {
        p.start.iter().map(|s| s.name.as_str()).collect()
    }

    #[tokio::test]
    async fn an_ephemeral_container_starts_once_even_before_initialization() {
        let p = serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {
                "initContainers": [{"name": "init1", "image": "i"}],
                "containers": [{"name": "a", "image": "i"}],
                "ephemeralContainers": [{"name": "dbg", "image": "i", "targetContainerName": "a"}]
            }
        }))
        .unwrap();
        let d = DesiredPod::from_pod(&p).unwrap();
        assert_eq!(d.ephemeral()[0].target.as_deref(), Some("a"));
        assert_eq!(d.field_path("dbg"), "spec.ephemeralContainers{dbg}");
        let mut view = RuntimeView::default();
        // no sandbox: nothing starts, the debug container included
        assert!(plan(&d, &view, &ProbeResults::default()).start.is_empty());
        view.sandboxes.push(sandbox());
        view.containers.push(rec(&d, "init1", CState::Running, 0, 0));
        assert_eq!(names(&plan(&d, &view, &ProbeResults::default())), vec!["dbg"]);
        // running, or exited with a failure: it is neither killed nor started again
        view.containers.push(rec(&d, "dbg", CState::Running, 0, 0));
        let p = plan(&d, &view, &ProbeResults::default());
        assert!(p.start.is_empty() && p.kill.is_empty(), "{p:?}");
        view.containers.pop();
        view.containers.push(rec(&d, "dbg", CState::Exited, 1, 0));
        assert!(plan(&d, &view, &ProbeResults::default()).start.is_empty());
    }

    #[tokio::test]
    async fn a_container_created_but_never_started_is_replaced_and_an_unknown_one_stopped_first() {
        let d = pod("Always");
        let mut view = RuntimeView::default();
        view.sandboxes.push(sandbox());
        view.containers.push(rec(&d, "init1", CState::Exited, 0, 0));
        view.containers.push(rec(&d, "side", CState::Running, 0, 0));
        view.containers.push(rec(&d, "init2", CState::Exited, 0, 0));
        // `a` was created when the runtime went away: stopping it would leave it created, so a new one starts
        view.containers.push(rec(&d, "a", CState::Created, 0, 0));
        view.containers.push(rec(&d, "b", CState::Unknown, 0, 0));
        let p = plan(&d, &view, &ProbeResults::default());
        assert_eq!(names(&p), vec!["a", "b"]);
        assert_eq!(
            p.start
                .iter()
                .map(|s| (s.restart_count, s.exited))
                .collect::<Vec<_>>(),
            vec![(1, None), (1, None)],
            "the next attempt, with no back-off: neither ran"
        );
        assert_eq!(
            p.kill.iter().map(|k| k.id.as_str()).collect::<Vec<_>>(),
            vec!["b-0"],
            "only the unknown one is stopped: it may run"
        );

        // the same for an init container, before initialization is complete
        let mut view = RuntimeView::default();
        view.sandboxes.push(sandbox());
        view.containers.push(rec(&d, "init1", CState::Created, 0, 0));
        let p = plan(&d, &view, &ProbeResults::default());
        assert_eq!((names(&p), p.kill.len()), (vec!["init1"], 0));
    }

    #[tokio::test]
    async fn sandbox_first_then_init_containers_one_by_one() {
        let d = pod("Always");
        let mut view = RuntimeView::default();
        let p = plan(&d, &view, &ProbeResults::default());
        assert_eq!(p.create_sandbox, Some(0));
        assert!(p.start.is_empty());

        view.sandboxes.push(sandbox());
        assert_eq!(names(&plan(&d, &view, &ProbeResults::default())), vec!["init1"]);

        view.containers.push(rec(&d, "init1", CState::Running, 0, 0));
        assert!(
            plan(&d, &view, &ProbeResults::default()).start.is_empty(),
            "waits for init1"
        );

        view.containers[0] = rec(&d, "init1", CState::Exited, 0, 0);
        assert_eq!(names(&plan(&d, &view, &ProbeResults::default())), vec!["side"]);

        view.containers.push(rec(&d, "side", CState::Running, 0, 0));
        assert_eq!(
            names(&plan(&d, &view, &ProbeResults::default())),
            vec!["init2"],
            "sidecar started: next init"
        );

        view.containers.push(rec(&d, "init2", CState::Exited, 0, 0));
        assert_eq!(
            names(&plan(&d, &view, &ProbeResults::default())),
            vec!["a", "b"],
            "then all app containers"
        );
    }

    #[tokio::test]
    async fn failed_init_restarts_or_fails_the_pod() {
        for (policy, expect_fail) in [("Always", false), ("Never", true)] {
            let d = pod(policy);
            let view = RuntimeView {
                sandboxes: vec![sandbox()],
                containers: vec![rec(&d, "init1", CState::Exited, 1, 0)],
            };
            let p = plan(&d, &view, &ProbeResults::default());
            if expect_fail {
                assert_eq!(p.terminal, Some(Phase::Failed));
            } else {
                assert_eq!(names(&p), vec!["init1"]);
                assert_eq!(p.start[0].restart_count, 1);
                assert!(p.start[0].exited.is_some());
            }
        }
    }

    fn initialized_view(d: &DesiredPod, a: ContainerRecord, b: ContainerRecord) -> RuntimeView {
        RuntimeView {
            sandboxes: vec![sandbox()],
            containers: vec![
                a,
                b,
                rec(d, "init1", CState::Exited, 0, 0),
                rec(d, "init2", CState::Exited, 0, 0),
                rec(d, "side", CState::Exited, 2, 0),
            ],
        }
    }

    #[tokio::test]
    async fn restart_policy_decides_restarts_and_terminal_phase() {
        let d = pod("OnFailure");
        let view = initialized_view(
            &d,
            rec(&d, "a", CState::Exited, 0, 0),
            rec(&d, "b", CState::Exited, 3, 0),
        );
        let p = plan(&d, &view, &ProbeResults::default());
        assert_eq!(
            names(&p),
            vec!["side", "b"],
            "sidecar always restarts; b failed under OnFailure"
        );

        let d = pod("Never");
        let view = initialized_view(
            &d,
            rec(&d, "a", CState::Exited, 0, 0),
            rec(&d, "b", CState::Exited, 3, 0),
        );
        assert_eq!(
            plan(&d, &view, &ProbeResults::default()).terminal,
            Some(Phase::Failed)
        );

        let view = initialized_view(
            &d,
            rec(&d, "a", CState::Exited, 0, 0),
            rec(&d, "b", CState::Exited, 0, 0),
        );
        let p = plan(&d, &view, &ProbeResults::default());
        assert_eq!(p.terminal, Some(Phase::Succeeded));
        assert!(p.start.is_empty());
    }

    #[tokio::test]
    async fn liveness_failure_kills_with_the_kubelet_message() {
        let p = serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [{"name": "a", "image": "i", "livenessProbe": {"exec": {"command": ["true"]}}}]}
        }))
        .unwrap();
        let d = DesiredPod::from_pod(&p).unwrap();
        let view = RuntimeView {
            sandboxes: vec![sandbox()],
            containers: vec![rec(&d, "a", CState::Running, 0, 0)],
        };
        let mut probes = ProbeResults::default();
        probes.apply(&crate::pods::probes::ProbeUpdate {
            container_id: "a-0".into(),
            container: "a".into(),
            kind: ProbeKind::Liveness,
            ok: false,
        });
        let plan = plan(&d, &view, &probes);
        assert_eq!(plan.kill.len(), 1);
        assert_eq!(
            plan.kill[0].message.as_deref(),
            Some("Container a failed liveness probe, will be restarted")
        );
    }

    #[tokio::test]
    async fn dead_sandbox_is_replaced_unless_never() {
        let d = pod("Always");
        let mut dead = sandbox();
        dead.ready = false;
        let view = RuntimeView {
            sandboxes: vec![dead.clone()],
            containers: vec![rec(&d, "a", CState::Running, 0, 0)],
        };
        let p = plan(&d, &view, &ProbeResults::default());
        assert_eq!(p.create_sandbox, Some(1));
        assert_eq!(p.kill.len(), 1, "old containers stop first");

        let d = pod("Never");
        let view = RuntimeView {
            sandboxes: vec![dead],
            containers: vec![rec(&d, "a", CState::Exited, 0, 0)],
        };
        let p = plan(&d, &view, &ProbeResults::default());
        assert_eq!(p.create_sandbox, None);
        assert_eq!(p.terminal, Some(Phase::Failed), "b never ran");
    }
}
