//! An in-memory CRI v1 runtime for hollow nodes, with scriptable behaviour; it can also serve CRI over gRPC on a
//! unix socket (see [`serve`] and the `cri-fake` binary).
//!
//! [`FakeRuntime`] implements [`runtime_api::Runtime`] with the semantics of a real CRI runtime (containerd is the
//! reference: the conformance test in `crates/cri-real/tests` runs one walk-through against both and compares
//! them): sandboxes READY/NOTREADY with pod IPs from the node's pod CIDR; containers CREATED → RUNNING → EXITED
//! with ids, nanosecond timestamps, exit codes, reasons (`Completed`, `Error`, `OOMKilled`, `StartError`) and
//! attempts; labels and annotations returned unchanged; list filters (id or unique id prefix, state, sandbox,
//! label selector); `NotFound` for unknown ids; idempotent stop and remove; images with ids, sizes, tags and
//! digests; stats from scripted usage; container events pushed to `GetContainerEvents` subscribers.
//!
//! It is built to exist ten thousand times in one process: no task per container (timed transitions are
//! evaluated lazily from timestamps, plus one timer task per runtime only while one is pending), compact records,
//! and only `tokio::time`, so everything runs under paused time in tests.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use cri_fake::{FakeConfig, FakeRuntime};
//! use runtime_api::{Runtime, cri};
//! let runtime = FakeRuntime::new(FakeConfig { pod_cidr: Some("10.244.1.0/24".into()), ..Default::default() });
//! let pod = runtime
//!     .run_pod_sandbox(cri::RunPodSandboxRequest {
//!         config: Some(cri::PodSandboxConfig {
//!             metadata: Some(cri::PodSandboxMetadata { name: "web".into(), uid: "u1".into(), ..Default::default() }),
//!             ..Default::default()
//!         }),
//!         ..Default::default()
//!     })
//!     .await
//!     .unwrap();
//! let status = runtime
//!     .pod_sandbox_status(cri::PodSandboxStatusRequest { pod_sandbox_id: pod.pod_sandbox_id, verbose: false })
//!     .await
//!     .unwrap();
//! assert_eq!(status.status.unwrap().network.unwrap().ip, "10.244.1.2");
//! # }
//! ```
//!
//! # Scripted behaviour
//!
//! Behaviour comes from annotations `cri-fake.node-agent.io/<key>` and from the runtime-wide [`Profile`] (same
//! keys, without the prefix). For a container, the first of these that sets a key wins:
//! 1. the container's own annotations (`ContainerConfig.annotations`);
//! 2. a pod annotation naming the container: `cri-fake.node-agent.io/<key>.<container-name>`;
//! 3. a pod annotation `cri-fake.node-agent.io/<key>` (all containers of the pod);
//! 4. the profile; 5. the built-in default.
//!
//! Pulls and sandboxes only see levels 3–5. An unknown key or a bad value fails `RunPodSandbox`,
//! `CreateContainer` or `PullImage` with `InvalidArgument` naming the key.
//!
//! | key | value | default | effect |
//! |---|---|---|---|
//! | `pull-duration` | dist | `0` | time `PullImage` takes |
//! | `pull-error` | text | — | `PullImage` fails (`Unknown`, the kubelet's ErrImagePull) with this message |
//! | `image-size` | quantity | `10Mi` | size of pulled images |
//! | `image-user` | text | (none) | the pulled image config's `User` (`1000`, `nginx`, `1000:1000`): `ImageStatus` uid / username |
//! | `sandbox-latency` | dist | `0` | time `RunPodSandbox` takes |
//! | `create-latency` | dist | `0` | time `CreateContainer` takes |
//! | `start-latency` | dist | `0` | time `StartContainer` takes |
//! | `start-error` | text | — | `StartContainer` fails; the container is EXITED, code 128, reason `StartError` |
//! | `exit-after` | dist or `never` | `never` | the container exits by itself this long after starting |
//! | `exit-code` | int | `0` | its exit code (0 → reason `Completed`, else `Error`) |
//! | `exit-attempts` | int | all | only attempts below this number exit/OOM (a crash loop that heals) |
//! | `oom-after` | dist or `never` | `never` | killed at this time: exit 137, reason `OOMKilled` |
//! | `stop-duration` | dist | `0` | how long it takes to exit after SIGTERM; beyond the grace period it is killed (137) |
//! | `stop-exit-code` | int | `0` | exit code after a graceful stop |
//! | `exec` | JSON | — | `ExecSync` answers, see below |
//! | `probe` | rules | all ok | probe outcomes over time, see below |
//! | `cpu` | timeline of quantities | `1m` | CPU cores in use (stats) |
//! | `memory` | timeline of quantities | `4Mi` | memory working set (stats) |
//! | `disk` | timeline of quantities | `4Ki` | writable layer size (stats) |
//! | `logs` | lines | — | lines the container prints when it starts ([`FakeRuntime::container_logs`]) |
//!
//! Grammars:
//! - *dist*: a duration (`250ms`, `20s`, `1m30s`), `uniform(1s,3s)`, `normal(2s,500ms)` (clamped at 0) or
//!   `exp(2s)` (mean); drawn afresh each time, from the runtime's seeded generator.
//! - *quantity*: Kubernetes style, `250m`, `2`, `64Mi`, `1G`.
//! - *timeline*: `v0, v1@t1, ~v2@t2` — `v0` from the container's start, `v1` from `t1`, then a linear ramp to
//!   `v2` reached at `t2`, constant afterwards. Example: `memory: "50Mi, ~900Mi@10m"` grows into eviction.
//! - *probe rules*: `target=outcomes; target=outcomes`, target `http:8080/healthz`, `http:8080` (any path),
//!   `tcp:5432`, `grpc:9090[/service]`, `http:*` or `*`; outcomes a timeline of `ok`/`fail`, e.g.
//!   `http:8080/ready=fail, ok@20s` (not ready for the first 20 s). The first rule matching the target decides;
//!   no rule means ok. A container that is not running fails every probe. The agent's hollow probe transport asks
//!   [`FakeRuntime::probe_result`].
//! - *exec*: a JSON list of rules `{"cmd": "cat /tmp/ready" | ["cat", "/tmp/ready"] | "*", "exitCode": 0,
//!   "stdout": "", "stderr": "", "after": "20s", "duration": "100ms"}`; the last rule whose `cmd` equals the
//!   argv joined by spaces (or is `*`) and whose `after` (since start) has passed answers. Without a rule `echo`
//!   prints its arguments, `false` exits 1, anything else exits 0 silently. A `duration` longer than the
//!   request's timeout gives `DeadlineExceeded`.
//! - *lines*: one log line per line of the value.
//!
//! A crash loop is just `exit-after: 5s` with `exit-code: 1`: each restarted container (a new attempt) runs the
//! same script; add `exit-attempts: 3` to have attempt 3 onwards stay up.
//!
//! # Control hooks
//!
//! [`FakeRuntime::set_runtime_ready`] and [`FakeRuntime::set_network_ready`] flip the `RuntimeReady` /
//! `NetworkReady` conditions of `Status` (with reason and message); [`FakeRuntime::set_reachable`] makes every
//! call fail with `Unavailable`.

mod clock;
mod ids;
mod images;
mod ipam;
mod keymap;
mod pairs;
mod runtime;
mod script;
mod server;
mod service;
mod store;
mod view;

pub use ipam::CidrError;
pub use runtime::{ConfigError, DEFAULT_POD_CIDR, FakeConfig, FakeCounts, FakeRuntime, ProbeTarget};
pub use script::{ANNOTATION_PREFIX, KEYS, Profile, ScriptError};
pub use server::{CriServer, ServeError, bind, serve, serve_on};

#[cfg(test)]
mod tests;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
