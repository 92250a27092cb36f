//! A container as the desired pod keeps it: image, command, environment, ports, probes, lifecycle hooks,
//! resources and resize policy, security context and the hash of its spec; and the interned lists of a pod's
//! containers, shared by the pods made from one template.

use std::sync::Arc;
use std::time::Duration;

use super::{DeviceSpec, EnvFrom, MountSpec, PullPolicy, ResourceRef};
use crate::pods::model::resources::{self, ContainerResources};
use crate::pods::model::security::ContainerSecurity;

/// An environment variable's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvValue {
    /// A literal (or a field of the pod resolved when the pod was read).
    Literal(String),
    /// A `value` with `$(VAR)` references, expanded against the variables before it.
    Expand(String),
    /// `status.podIP`, known once the sandbox exists.
    PodIp,
    /// `status.hostIP`.
    HostIp,
    /// A key of a ConfigMap (`configMapKeyRef`), read when the container is created.
    ConfigMapKey(Box<KeyRef>),
    /// A key of a Secret (`secretKeyRef`), read when the container is created.
    SecretKey(Box<KeyRef>),
    /// A request or limit (`resourceFieldRef`), the node's allocatable standing in for a missing limit.
    Resource(Box<ResourceRef>),
}

/// A key of a ConfigMap or Secret named by an environment variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRef {
    /// The object's name.
    pub name: String,
    /// The key.
    pub key: String,
    /// A missing object or key leaves the variable out instead of failing the container.
    pub optional: bool,
}

/// A port, with named ports already resolved against the container's ports.
pub type Port = u16;

/// An HTTP GET target (probes and hooks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpGet {
    /// `HTTP` or `HTTPS`.
    pub https: bool,
    /// Host to connect to; `None` means the pod IP.
    pub host: Option<String>,
    /// Port.
    pub port: Port,
    /// Path, starting with `/`.
    pub path: String,
    /// Extra request headers.
    pub headers: Vec<(String, String)>,
}

/// What a probe or lifecycle hook does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Run a command in the container (runtime `ExecSync`).
    Exec(Vec<String>),
    /// HTTP GET; 200..=399 is success.
    Http(HttpGet),
    /// Open a TCP connection.
    Tcp {
        /// Host; `None` means the pod IP.
        host: Option<String>,
        /// Port.
        port: Port,
    },
    /// gRPC health check (`grpc.health.v1.Health/Check`).
    Grpc {
        /// Port.
        port: Port,
        /// Service name sent in the request.
        service: String,
    },
    /// Sleep (lifecycle hooks only).
    Sleep(Duration),
}

/// A liveness, readiness or startup probe with the kubelet's defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSpec {
    /// What to run.
    pub action: Action,
    /// Wait after the container started before the first probe (default 0).
    pub initial_delay: Duration,
    /// Time between probes (default 10 s).
    pub period: Duration,
    /// Probe timeout (default 1 s).
    pub timeout: Duration,
    /// Consecutive successes to count as passing (default 1).
    pub success_threshold: u32,
    /// Consecutive failures to count as failing (default 3).
    pub failure_threshold: u32,
    /// Probe-level termination grace period, overriding the pod's on a liveness/startup kill.
    pub termination_grace_secs: Option<i64>,
}

/// One container of the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSpec {
    /// Container name.
    pub name: String,
    /// Image reference as written in the spec.
    pub image: String,
    /// When to pull the image.
    pub pull_policy: PullPolicy,
    /// Entrypoint override.
    pub command: Vec<String>,
    /// Arguments.
    pub args: Vec<String>,
    /// Working directory.
    pub working_dir: String,
    /// Environment, in order (resolved when the container is created).
    pub env: Vec<(String, EnvValue)>,
    /// `envFrom` sources, in order (their variables come before `env`'s).
    pub env_from: Vec<EnvFrom>,
    /// Volume mounts.
    pub mounts: Vec<MountSpec>,
    /// `volumeDevices`: block volumes as device nodes (rare: a boxed slice, empty without allocation).
    pub devices: Box<[DeviceSpec]>,
    /// `(containerPort, hostPort, protocol)` triples.
    pub ports: Vec<(i32, i32, String)>,
    /// Readiness probe.
    pub readiness: Option<Box<ProbeSpec>>,
    /// Liveness probe.
    pub liveness: Option<Box<ProbeSpec>>,
    /// Startup probe.
    pub startup: Option<Box<ProbeSpec>>,
    /// postStart hook.
    pub post_start: Option<Box<Action>>,
    /// preStop hook.
    pub pre_stop: Option<Box<Action>>,
    /// For init containers: `restartPolicy: Always`, i.e. a sidecar.
    pub sidecar: bool,
    /// Requests and limits.
    pub resources: ContainerResources,
    /// `resizePolicy`: which resources' in-place resize restarts the container.
    pub resize_restart: ResizeRestart,
    /// Where the container writes its termination message.
    pub termination_message_path: String,
    /// `terminationMessagePolicy: FallbackToLogsOnError`: a failed container's log tail stands in for an empty
    /// message.
    pub termination_fallback_to_logs: bool,
    /// Allocate a TTY.
    pub tty: bool,
    /// Keep stdin open.
    pub stdin: bool,
    /// Close stdin after the first attach.
    pub stdin_once: bool,
    /// The container's own `securityContext`.
    pub security: Option<Box<ContainerSecurity>>,
    /// Hash of the fields whose change restarts the container.
    pub hash: u64,
}

/// A container's `resizePolicy`: `true` where the resource's policy is `RestartContainer` (the default,
/// `NotRequired`, resizes in place).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResizeRestart {
    /// CPU.
    pub cpu: bool,
    /// Memory.
    pub memory: bool,
}

impl ResizeRestart {
    /// Reads a container's `resizePolicy`.
    pub fn from_api(policies: Option<&[k8s_openapi::api::core::v1::ContainerResizePolicy]>) -> Self {
        let restarts = |name: &str| {
            policies
                .into_iter()
                .flatten()
                .any(|p| p.resource_name == name && p.restart_policy == "RestartContainer")
        };
        Self {
            cpu: restarts("cpu"),
            memory: restarts("memory"),
        }
    }
}

/// For interning: equal containers hash equal, since the name, image and restart hash are part of equality.
impl resources::Container for ContainerSpec {
    fn resources(&self) -> &ContainerResources {
        &self.resources
    }

    fn sidecar(&self) -> bool {
        self.sidecar
    }
}

impl std::hash::Hash for ContainerSpec {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
        self.image.hash(state);
        self.hash.hash(state);
    }
}

/// A pod's init or app containers. Pods made from one template (a Deployment's replicas) resolve to equal
/// lists, which are interned: one copy for all of them while any lives.
pub type Containers = Arc<Vec<ContainerSpec>>;

pub(super) fn intern_containers(list: Vec<ContainerSpec>) -> Containers {
    static LISTS: crate::density::intern::Interner<Vec<ContainerSpec>> =
        crate::density::intern::Interner::new();
    LISTS.intern(list)
}

/// `terminationMessagePolicy: FallbackToLogsOnError`, the value that asks for the log tail when a failed container wrote no message.
pub const FALLBACK_TO_LOGS: &str = "FallbackToLogsOnError";
