//! The desired pod as the lifecycle keeps it: a compact, immutable extract of a `Pod` object.
//!
//! A hollow fleet holds 100,000 pods in one process, so workers never keep whole API objects. [`DesiredPod`]
//! carries only what syncing, probing, terminating and status generation read again: identity, restart policy,
//! grace periods, readiness gates, and per container the image, command, environment, ports, probes, hooks and
//! resources. Fields that matter only once (node selector, affinity, tolerations) are read by admission from the
//! full object before it is dropped. Named probe ports are resolved here, once.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use k8s_openapi::jiff::Timestamp;

mod extract;
mod policies;
mod small_map;
pub mod volumes;

pub use policies::{PullPolicy, RestartPolicy};
pub use small_map::SmallMap;

use extract::{EnvCtx, container};
pub use volumes::{EnvFrom, MountSpec, ResourceRef, VolumeSpec};

use crate::pods::model::resources::{self, ContainerResources, PodRequests, QosClass};
use crate::pods::model::security::{APPARMOR_ANNOTATION_PREFIX, AppArmor, ContainerSecurity, PodSecurity};

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

/// `spec.dnsPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DnsPolicy {
    /// `ClusterFirst` (the default): cluster DNS, except for host-network pods.
    ClusterFirst,
    /// `ClusterFirstWithHostNet`: cluster DNS, host network or not.
    ClusterFirstWithHostNet,
    /// `Default`: the node's resolver configuration.
    Default,
    /// `None`: only `dnsConfig`.
    None,
}

/// `spec.dnsConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DnsConfig {
    /// Extra name servers.
    pub nameservers: Vec<String>,
    /// Extra search domains.
    pub searches: Vec<String>,
    /// Options as `name` or `name:value`.
    pub options: Vec<(String, Option<String>)>,
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

/// Service account names, one copy each.
static NAMES: crate::density::intern::Interner<str> = crate::density::intern::Interner::new();

fn intern_containers(list: Vec<ContainerSpec>) -> Containers {
    static LISTS: crate::density::intern::Interner<Vec<ContainerSpec>> =
        crate::density::intern::Interner::new();
    LISTS.intern(list)
}

/// A pending deletion of the pod object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deletion {
    /// `metadata.deletionTimestamp`.
    pub at: Timestamp,
    /// `metadata.deletionGracePeriodSeconds`.
    pub grace_secs: Option<i64>,
}

/// The fields of a pod's spec that few pods set (see [`DesiredPod::extras`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodExtras {
    /// `spec.readinessGates` condition types.
    pub readiness_gates: Vec<String>,
    /// Status of each readiness-gate condition as last seen on the object (set by other controllers).
    pub gate_status: Vec<(String, bool)>,
    /// `spec.runtimeClassName`: the RuntimeClass whose `handler` the sandbox runs with.
    pub runtime_class: String,
    /// `spec.subdomain` (the sandbox hostname's domain part).
    pub subdomain: String,
    /// `spec.hostAliases` as (IP, hostnames).
    pub host_aliases: Vec<(String, Vec<String>)>,
    /// `spec.imagePullSecrets` names.
    pub image_pull_secrets: Vec<String>,
    /// `spec.hostname` (empty: the pod's name is its hostname, see [`DesiredPod::hostname`]).
    pub hostname: String,
    /// `spec.hostnameOverride`: the sandbox's hostname in place of `hostname`, the pod's name and the subdomain.
    pub hostname_override: Option<String>,
    /// `spec.setHostnameAsFQDN`: the sandbox's kernel hostname is the pod's FQDN.
    pub hostname_as_fqdn: bool,
    /// `spec.activeDeadlineSeconds`: how long the pod may be active on the node from its start.
    pub active_deadline_secs: Option<i64>,
    /// `spec.overhead` (a RuntimeClass's), added to the containers' requests.
    pub overhead: PodRequests,
    /// Pod-level `spec.resources`: the pod's own requests and limits over its containers'.
    pub pod_level: Option<resources::PodLevel>,
    /// `spec.ephemeralContainers`, added to a running pod (e.g. by `kubectl debug`), in order.
    pub ephemeral: Vec<EphemeralSpec>,
    /// The containers ask for other resources than the node allocated them and the node cannot give them
    /// yet: the pod's containers carry the allocated resources, and this says why.
    pub resize_pending: Option<ResizePending>,
    /// Extended resources (`example.com/gpu`) the init and app containers request, as (container, resource,
    /// count), in spec order.
    pub extended: Vec<(String, String, u64)>,
    /// Huge pages the init and app containers ask for, as (container, page size, bytes), in spec order.
    pub hugepages: Vec<(String, u64, u64)>,
    /// Huge pages of pod-level `spec.resources`, as (page size, bytes).
    pub pod_hugepages: Vec<(u64, u64)>,
    /// `spec.resourceClaims`, each with the ResourceClaim it stands for (`status.resourceClaimStatuses` for
    /// claims generated from templates).
    pub resource_claims: Vec<crate::dra::PodClaim>,
    /// Per container (init, app and ephemeral, by name) that names claims in `resources.claims`, the
    /// (claim, request) pairs it names (an empty request: the whole claim).
    pub container_claims: Vec<(String, Vec<(String, String)>)>,
}

/// An ephemeral container: started once in the pod's sandbox when it appears, never restarted.
#[derive(Debug, Clone, PartialEq)]
pub struct EphemeralSpec {
    /// The container, read as an app container is.
    pub container: ContainerSpec,
    /// `targetContainerName`: the container whose process namespace it joins.
    pub target: Option<String>,
}

/// The desired pod. Immutable; a new one replaces it on every update from the source.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredPod {
    /// `metadata.uid` (shared with the pod manager's and the status writer's tables, which key on it).
    pub uid: Arc<str>,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `metadata.creationTimestamp`.
    pub created: Option<Timestamp>,
    /// Pod labels (passed to the sandbox; shared by the pods whose labels are equal).
    pub labels: SmallMap,
    /// Pod annotations (passed to the sandbox; the fake runtime reads its script from them).
    pub annotations: SmallMap,
    /// Restart policy.
    pub restart_policy: RestartPolicy,
    /// `spec.terminationGracePeriodSeconds` (default 30).
    pub termination_grace_secs: i64,
    /// Set once the object is being deleted (boxed: a pod carries it only for its last seconds).
    pub deletion: Option<Box<Deletion>>,
    /// Init containers (including sidecars), in order (interned, see [`Containers`]).
    pub init_containers: Containers,
    /// App containers, in order (interned, see [`Containers`]).
    pub containers: Containers,
    /// QoS class.
    pub qos: QosClass,
    /// `spec.hostNetwork`.
    pub host_network: bool,
    /// `spec.enableServiceLinks` (default true): the namespace's Services as environment variables.
    pub service_links: bool,
    /// `spec.volumes` (a boxed slice: collected through `flatten`, a `Vec` kept room for four).
    pub volumes: Box<[VolumeSpec]>,
    /// `spec.serviceAccountName` (tokens of projected volumes are requested for it; one copy per name).
    pub service_account: Arc<str>,
    /// `spec.dnsPolicy`.
    pub dns_policy: DnsPolicy,
    /// `spec.dnsConfig`.
    pub dns_config: Option<Box<DnsConfig>>,
    /// What few pods set (readiness gates, host aliases, pull secrets, a subdomain, a runtime class), kept
    /// apart: `None` for most pods, whose desired state is then a smaller allocation.
    pub extras: Option<Box<PodExtras>>,
    /// `spec.securityContext` and the host namespace switches (`None`: all defaults).
    pub security: Option<Box<PodSecurity>>,
    /// `spec.priority` (0 when unset; for a pod that never went through the API server's priority
    /// admission, e.g. a static pod, the value of a `system-node-critical` / `system-cluster-critical`
    /// `priorityClassName`). Graceful node shutdown orders pods by it.
    pub priority: i32,
}

/// Why an in-place resize waits (the `PodResizePending` condition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResizePending {
    /// `Deferred` (may fit later) or `Infeasible` (never will on this node).
    pub reason: &'static str,
    /// The kubelet's message.
    pub message: String,
    /// The pod generation the decision was made for.
    pub generation: Option<i64>,
    /// When the resize began to wait for this reason, seconds since the epoch.
    pub since: i64,
}

/// `terminationMessagePolicy: FallbackToLogsOnError`, the value that asks for the log tail when a failed container wrote no message.
pub const FALLBACK_TO_LOGS: &str = "FallbackToLogsOnError";

/// `kubernetes.io/config.source`: where a pod came from — `file`, `http` or `api`.
pub const SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";

/// `name` cut to the 63 characters of a kernel hostname, without a trailing `-` or `.` (names reaching here
/// are DNS names, ASCII; a name that cannot be cut on a character boundary is kept whole).
fn truncate_hostname(name: &str) -> &str {
    const HOSTNAME_MAX: usize = 63;
    match name.get(..HOSTNAME_MAX) {
        Some(cut) if name.len() > HOSTNAME_MAX => match cut.trim_end_matches(['-', '.']) {
            "" => name,
            trimmed => trimmed,
        },
        _ => name,
    }
}

/// A DNS-1123 subdomain: at most 253 characters, dot-separated non-empty labels of lower-case letters, digits
/// and `-`, each starting and ending with a letter or digit.
fn is_dns_subdomain(name: &str) -> bool {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    name.len() <= 253 && name.split('.').all(label_ok)
}

/// `system-cluster-critical`'s priority: pods at or above it are critical.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

fn priority(spec: &k8s_openapi::api::core::v1::PodSpec) -> i32 {
    spec.priority
        .unwrap_or(match spec.priority_class_name.as_deref() {
            Some("system-node-critical") => SYSTEM_CRITICAL_PRIORITY + 1000,
            Some("system-cluster-critical") => SYSTEM_CRITICAL_PRIORITY,
            _ => 0,
        })
}

impl DesiredPod {
    /// The AppArmor profile of container `c`: its own `appArmorProfile`, else the pod's deprecated annotation for
    /// it, else the pod's `appArmorProfile`; `None`: the runtime's choice.
    pub fn apparmor<'a>(&'a self, c: &'a ContainerSpec) -> Option<std::borrow::Cow<'a, AppArmor>> {
        use std::borrow::Cow;
        if let Some(a) = c.security.as_deref().and_then(|s| s.apparmor.as_ref()) {
            return Some(Cow::Borrowed(a));
        }
        let annotated = self
            .annotations
            .get(&format!("{APPARMOR_ANNOTATION_PREFIX}{}", c.name))
            .and_then(|v| AppArmor::from_annotation(v));
        if let Some(a) = annotated {
            return Some(Cow::Owned(a));
        }
        self.security
            .as_deref()
            .and_then(|p| p.apparmor.as_ref())
            .map(Cow::Borrowed)
    }
}

impl DesiredPod {
    /// Why a resize of this pod waits, if one does.
    pub fn resize_pending(&self) -> Option<&ResizePending> {
        self.extras.as_ref()?.resize_pending.as_ref()
    }

    /// This pod with each container's resources taken from `resources` by name (containers not named keep
    /// theirs).
    pub fn with_resources(
        &self,
        resources: &std::collections::BTreeMap<String, ContainerResources>,
    ) -> DesiredPod {
        let take = |list: &Containers| {
            let mut out = list.as_ref().clone();
            for c in &mut out {
                if let Some(r) = resources.get(&c.name) {
                    c.resources = *r;
                }
            }
            intern_containers(out)
        };
        let mut pod = self.clone();
        pod.init_containers = take(&self.init_containers);
        pod.containers = take(&self.containers);
        pod
    }

    /// Each container's resources, by name.
    pub fn resources_by_name(&self) -> std::collections::BTreeMap<String, ContainerResources> {
        self.init_containers
            .iter()
            .chain(self.containers.iter())
            .map(|c| (c.name.clone(), c.resources))
            .collect()
    }

    /// This pod with each container's resources taken from the same-named container of `allocated`: what the
    /// node runs while a resize of this pod waits for `pending`.
    pub fn with_allocated(&self, allocated: &DesiredPod, pending: ResizePending) -> DesiredPod {
        let take = |list: &Containers, from: &Containers| {
            let mut out = list.as_ref().clone();
            for c in &mut out {
                if let Some(a) = from.iter().find(|a| a.name == c.name) {
                    c.resources = a.resources;
                }
            }
            intern_containers(out)
        };
        let mut pod = self.clone();
        pod.init_containers = take(&self.init_containers, &allocated.init_containers);
        pod.containers = take(&self.containers, &allocated.containers);
        pod.extras.get_or_insert_default().resize_pending = Some(pending);
        pod
    }

    /// The sandbox hostname: `spec.hostnameOverride`, else `spec.hostname`, else the pod's name; as the
    /// kubelet, one longer than the 63 characters a kernel hostname holds is cut to 63 and stripped of a
    /// trailing `-` or `.`.
    pub fn hostname(&self) -> &str {
        if let Some(name) = self.hostname_override() {
            return truncate_hostname(name);
        }
        let name = match self.extras.as_ref().map_or("", |e| &e.hostname) {
            "" => &self.name,
            set => set,
        };
        truncate_hostname(name)
    }

    /// `spec.hostnameOverride`.
    pub fn hostname_override(&self) -> Option<&str> {
        self.extras.as_ref().and_then(|e| e.hostname_override.as_deref())
    }

    /// `spec.activeDeadlineSeconds`.
    pub fn active_deadline_secs(&self) -> Option<i64> {
        self.extras.as_ref().and_then(|e| e.active_deadline_secs)
    }

    /// `spec.setHostnameAsFQDN`.
    pub fn hostname_as_fqdn(&self) -> bool {
        self.extras.as_ref().is_some_and(|e| e.hostname_as_fqdn)
    }

    /// The kernel hostname the sandbox gets, as the kubelet makes it: the [`hostname`](Self::hostname), or with
    /// `setHostnameAsFQDN` and a subdomain the pod's FQDN `<hostname>.<subdomain>.<namespace>.svc.<domain>`,
    /// refused when longer than the 64 characters the kernel's node name holds.
    pub fn kernel_hostname(&self, cluster_domain: &str) -> Result<String, String> {
        const FQDN_MAX: usize = 64;
        if let Some(name) = self.hostname_override()
            && !is_dns_subdomain(name)
        {
            return Err(format!(
                "pod HostnameOverride {name:?} is not a valid DNS subdomain: lower case alphanumeric \
                 characters, '-' or '.', starting and ending with an alphanumeric character, at most 253"
            ));
        }
        let hostname = self.hostname();
        if !self.hostname_as_fqdn() || self.subdomain().is_empty() {
            return Ok(hostname.to_owned());
        }
        let fqdn = format!(
            "{hostname}.{}.{}.svc.{cluster_domain}",
            self.subdomain(),
            self.namespace
        );
        if fqdn.len() > FQDN_MAX {
            return Err(format!(
                "failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is too long \
                 ({FQDN_MAX} characters is the max, {} characters requested)",
                fqdn.len()
            ));
        }
        Ok(fqdn)
    }

    /// Effective requests, for admission accounting: computed from the (shared) container lists and the
    /// overhead, not kept in every pod's state.
    pub fn requests(&self) -> PodRequests {
        let overhead = self.overhead();
        let requests = resources::pod_requests(&self.init_containers, &self.containers, overhead);
        match self.pod_level() {
            Some(p) if p.requests_set() => p.over_requests(requests, overhead),
            _ => requests,
        }
    }

    /// `spec.overhead` as requests.
    pub fn overhead(&self) -> PodRequests {
        self.extras
            .as_ref()
            .map_or_else(PodRequests::default, |e| e.overhead)
    }

    /// Pod-level `spec.resources`, when the pod has them.
    pub fn pod_level(&self) -> Option<&resources::PodLevel> {
        self.extras.as_ref()?.pod_level.as_ref()
    }

    /// The limits the pod's cgroup gets: pod-level ones where set, else those every container declares.
    pub fn limits(&self) -> resources::PodLimits {
        let own = resources::pod_requests(&self.init_containers, &self.containers, self.overhead());
        let limits = resources::pod_limits(&self.init_containers, &self.containers, own);
        match self.pod_level() {
            Some(p) if p.is_set() => p.over_limits(limits, self.overhead()),
            _ => limits,
        }
    }

    /// Extracts the desired pod from an API object. Fails only when the object has no UID or name.
    pub fn from_pod(pod: &Pod) -> Option<Arc<Self>> {
        let meta = &pod.metadata;
        let uid = meta.uid.clone()?;
        let name = meta.name.clone()?;
        let namespace = meta.namespace.clone().unwrap_or_else(|| "default".to_owned());
        let spec = pod.spec.as_ref()?;
        let mut ctx = EnvCtx {
            name: &name,
            namespace: &namespace,
            uid: &uid,
            node: spec.node_name.as_deref().unwrap_or_default(),
            service_account: spec.service_account_name.as_deref().unwrap_or_default(),
            labels: meta.labels.as_ref(),
            annotations: meta.annotations.as_ref(),
            volumes: spec.volumes.as_deref().unwrap_or_default(),
        };
        let init_containers: Vec<ContainerSpec> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| container(c, true, &mut ctx))
            .collect();
        let containers: Vec<ContainerSpec> = spec
            .containers
            .iter()
            .map(|c| container(c, false, &mut ctx))
            .collect();
        let readiness_gates: Vec<String> = spec
            .readiness_gates
            .iter()
            .flatten()
            .map(|g| g.condition_type.clone())
            .collect();
        let conditions: &[PodCondition] = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        let gate_status = readiness_gates
            .iter()
            .filter_map(|gate| {
                conditions
                    .iter()
                    .find(|c| &c.type_ == gate)
                    .map(|c| (gate.clone(), c.status == "True"))
            })
            .collect();
        let extras = PodExtras {
            readiness_gates,
            gate_status,
            runtime_class: spec.runtime_class_name.clone().unwrap_or_default(),
            subdomain: spec.subdomain.clone().unwrap_or_default(),
            host_aliases: spec
                .host_aliases
                .iter()
                .flatten()
                .map(|a| (a.ip.clone(), a.hostnames.clone().unwrap_or_default()))
                .collect(),
            image_pull_secrets: spec
                .image_pull_secrets
                .iter()
                .flatten()
                .map(|s| s.name.clone())
                .collect(),
            hostname: spec.hostname.clone().unwrap_or_default(),
            hostname_override: spec.hostname_override.clone(),
            hostname_as_fqdn: spec.set_hostname_as_fqdn.unwrap_or(false),
            active_deadline_secs: spec.active_deadline_seconds,
            overhead: resources::overhead(spec.overhead.as_ref()),
            pod_level: resources::PodLevel::from_api(spec.resources.as_ref()),
            ephemeral: spec
                .ephemeral_containers
                .iter()
                .flatten()
                .map(|e| EphemeralSpec {
                    container: container(&extract::as_container(e), false, &mut ctx),
                    target: e.target_container_name.clone(),
                })
                .collect(),
            resize_pending: None,
            extended: resources::extended_requests(
                spec.init_containers
                    .iter()
                    .flatten()
                    .chain(spec.containers.iter())
                    .map(|c| (c.name.as_str(), c.resources.as_ref())),
            ),
            hugepages: spec
                .init_containers
                .iter()
                .flatten()
                .chain(spec.containers.iter())
                .flat_map(|c| {
                    resources::hugepages_of(c.resources.as_ref())
                        .into_iter()
                        .map(|(size, bytes)| (c.name.clone(), size, bytes))
                })
                .collect(),
            pod_hugepages: resources::hugepages_of(spec.resources.as_ref()),
            resource_claims: extract::resource_claims(pod),
            container_claims: extract::container_claims(spec),
        };
        let extras = (extras != PodExtras::default()).then(|| Box::new(extras));
        // as the kubelet: pod-level resources, where the pod has them, decide alone
        let qos = match extras.as_ref().and_then(|e| e.pod_level.as_ref()) {
            Some(p) => p.qos(),
            None => resources::qos_class(init_containers.iter().chain(&containers)),
        };
        Some(Arc::new(Self {
            uid: uid.into(),
            name,
            namespace,
            generation: meta.generation,
            created: meta.creation_timestamp.as_ref().map(|t| t.0),
            labels: meta.labels.as_ref().map(SmallMap::shared).unwrap_or_default(),
            annotations: meta.annotations.as_ref().map(SmallMap::from).unwrap_or_default(),
            restart_policy: RestartPolicy::parse(spec.restart_policy.as_deref()),
            termination_grace_secs: spec.termination_grace_period_seconds.unwrap_or(30).max(0),
            deletion: meta.deletion_timestamp.as_ref().map(|t| {
                Box::new(Deletion {
                    at: t.0,
                    grace_secs: meta.deletion_grace_period_seconds,
                })
            }),
            init_containers: intern_containers(init_containers),
            containers: intern_containers(containers),
            qos,
            host_network: spec.host_network.unwrap_or(false),
            service_links: spec.enable_service_links.unwrap_or(true),
            priority: priority(spec),
            volumes: spec.volumes.iter().flatten().map(VolumeSpec::from_api).collect(),
            service_account: NAMES.intern_str(spec.service_account_name.as_deref().unwrap_or_default()),
            dns_policy: match spec.dns_policy.as_deref() {
                Some("ClusterFirstWithHostNet") => DnsPolicy::ClusterFirstWithHostNet,
                Some("Default") => DnsPolicy::Default,
                Some("None") => DnsPolicy::None,
                _ => DnsPolicy::ClusterFirst,
            },
            dns_config: spec.dns_config.as_ref().map(|c| {
                Box::new(DnsConfig {
                    nameservers: c.nameservers.clone().unwrap_or_default(),
                    searches: c.searches.clone().unwrap_or_default(),
                    options: c
                        .options
                        .iter()
                        .flatten()
                        .filter_map(|o| Some((o.name.clone()?, o.value.clone())))
                        .collect(),
                })
            }),
            security: PodSecurity::from_api(spec),
            extras,
        }))
    }

    /// `spec.readinessGates` condition types.
    pub fn readiness_gates(&self) -> &[String] {
        self.extras.as_ref().map_or(&[], |e| &e.readiness_gates)
    }

    /// The status of each readiness gate's condition as last seen on the object.
    pub fn gate_status(&self) -> &[(String, bool)] {
        self.extras.as_ref().map_or(&[], |e| &e.gate_status)
    }

    /// `spec.resourceClaims`, resolved to their ResourceClaims.
    pub fn resource_claims(&self) -> &[crate::dra::PodClaim] {
        self.extras.as_ref().map_or(&[], |e| &e.resource_claims)
    }

    /// The (claim, request) pairs container `name` names in `resources.claims`.
    pub fn container_claims(&self, name: &str) -> &[(String, String)] {
        self.extras
            .as_ref()
            .and_then(|e| e.container_claims.iter().find(|(c, _)| c == name))
            .map_or(&[], |(_, claims)| claims)
    }

    /// `spec.runtimeClassName` (empty: the runtime's default handler).
    pub fn runtime_class(&self) -> &str {
        self.extras.as_ref().map_or("", |e| &e.runtime_class)
    }

    /// `spec.subdomain`, the hostname's domain part; none when `spec.hostnameOverride` names the hostname
    /// whole (as the kubelet, which then gives the pod no domain).
    pub fn subdomain(&self) -> &str {
        match &self.extras {
            Some(e) if e.hostname_override.is_none() => &e.subdomain,
            _ => "",
        }
    }

    /// `spec.hostAliases` as (IP, hostnames).
    pub fn host_aliases(&self) -> &[(String, Vec<String>)] {
        self.extras.as_ref().map_or(&[], |e| &e.host_aliases)
    }

    /// `spec.imagePullSecrets` names.
    pub fn image_pull_secrets(&self) -> &[String] {
        self.extras.as_ref().map_or(&[], |e| &e.image_pull_secrets)
    }

    /// `name_namespace(uid)`, the kubelet's way of naming a pod in messages.
    pub fn display(&self) -> String {
        format!("{}_{}({})", self.name, self.namespace, self.uid)
    }

    /// The grace period for terminating the whole pod: the deletion's, else the spec's.
    pub fn grace_secs(&self) -> i64 {
        self.deletion
            .as_deref()
            .and_then(|d| d.grace_secs)
            .unwrap_or(self.termination_grace_secs)
            .max(0)
    }

    /// Looks a container (init, app or ephemeral) up by name.
    pub fn container(&self, name: &str) -> Option<&ContainerSpec> {
        self.init_containers
            .iter()
            .chain(self.containers.iter())
            .chain(self.ephemeral().iter().map(|e| &e.container))
            .find(|c| c.name == name)
    }

    /// The extended resources the init and app containers request: (container, resource, count).
    pub fn extended_requests(&self) -> &[(String, String, u64)] {
        self.extras.as_ref().map_or(&[], |e| &e.extended)
    }

    /// The pod's effective request of each extended resource, as the scheduler and the kubelet's resource
    /// predicate count it: the app containers' and sidecars' sum, or the largest plain init container's
    /// request when that is more.
    pub fn extended_effective(&self) -> std::collections::BTreeMap<String, i64> {
        let mut sum: std::collections::BTreeMap<String, i64> = std::collections::BTreeMap::new();
        let mut init_max: std::collections::BTreeMap<String, i64> = std::collections::BTreeMap::new();
        for (container, resource, count) in self.extended_requests() {
            let count = i64::try_from(*count).unwrap_or(i64::MAX);
            let plain_init = self
                .init_containers
                .iter()
                .any(|c| &c.name == container && !c.sidecar);
            if plain_init {
                let m = init_max.entry(resource.clone()).or_default();
                *m = (*m).max(count);
            } else {
                *sum.entry(resource.clone()).or_default() += count;
            }
        }
        for (resource, m) in init_max {
            let s = sum.entry(resource).or_default();
            *s = (*s).max(m);
        }
        sum
    }

    /// The huge pages the init and app containers ask for: (container, page size, bytes).
    pub fn hugepage_requests(&self) -> &[(String, u64, u64)] {
        self.extras.as_ref().map_or(&[], |e| &e.hugepages)
    }

    /// The huge pages of pod-level `spec.resources`: (page size, bytes).
    pub fn pod_level_hugepages(&self) -> &[(u64, u64)] {
        self.extras.as_ref().map_or(&[], |e| &e.pod_hugepages)
    }

    /// The pod's huge pages by page size, as its cgroup is limited to them and admission charges them: the app
    /// containers' and sidecars' sum, or the largest plain init container's (with the sidecars started before
    /// it, counted as for other resources) when that is more; a size the pod level names is the pod's own.
    pub fn hugepages(&self) -> std::collections::BTreeMap<u64, u64> {
        use std::collections::BTreeMap;
        let mut running: BTreeMap<u64, u64> = BTreeMap::new();
        let mut sidecars: BTreeMap<u64, u64> = BTreeMap::new();
        let mut init_peak: BTreeMap<u64, u64> = BTreeMap::new();
        let requests = self.hugepage_requests();
        let of = |name: &str| -> Vec<(u64, u64)> {
            requests
                .iter()
                .filter(|(c, _, _)| c == name)
                .map(|(_, size, bytes)| (*size, *bytes))
                .collect()
        };
        for c in self.init_containers.iter() {
            for (size, bytes) in of(&c.name) {
                let peak = init_peak.entry(size).or_default();
                if c.sidecar {
                    let side = sidecars.entry(size).or_default();
                    *side += bytes;
                    *peak = (*peak).max(*side);
                } else {
                    *peak = (*peak).max(sidecars.get(&size).copied().unwrap_or(0) + bytes);
                }
            }
        }
        for c in self.containers.iter() {
            for (size, bytes) in of(&c.name) {
                *running.entry(size).or_default() += bytes;
            }
        }
        for (size, bytes) in sidecars {
            *running.entry(size).or_default() += bytes;
        }
        for (size, peak) in init_peak {
            let r = running.entry(size).or_default();
            *r = (*r).max(peak);
        }
        if self.pod_level().is_some() {
            running.extend(self.pod_level_hugepages().iter().copied());
        }
        running
    }

    /// The huge pages limits of container `name`: its own, over the pod-level ones.
    pub fn container_hugepages(&self, name: &str) -> std::collections::BTreeMap<u64, u64> {
        let mut out: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
        if self.pod_level().is_some() {
            out.extend(self.pod_level_hugepages().iter().copied());
        }
        out.extend(
            self.hugepage_requests()
                .iter()
                .filter(|(c, _, _)| c == name)
                .map(|(_, size, bytes)| (*size, *bytes)),
        );
        out
    }

    /// `spec.ephemeralContainers`.
    pub fn ephemeral(&self) -> &[EphemeralSpec] {
        self.extras.as_ref().map_or(&[], |e| &e.ephemeral)
    }

    /// The ephemeral container named `name`, if it is one.
    pub fn ephemeral_named(&self, name: &str) -> Option<&EphemeralSpec> {
        self.ephemeral().iter().find(|e| e.container.name == name)
    }

    /// Whether `name` is an init container (sidecars included).
    pub fn is_init(&self, name: &str) -> bool {
        self.init_containers.iter().any(|c| c.name == name)
    }

    /// The API field path of a container, for event `involvedObject.fieldPath`.
    pub fn field_path(&self, name: &str) -> String {
        if self.is_init(name) {
            format!("spec.initContainers{{{name}}}")
        } else if self.ephemeral_named(name).is_some() {
            format!("spec.ephemeralContainers{{{name}}}")
        } else {
            format!("spec.containers{{{name}}}")
        }
    }

    /// Whether any container has a probe.
    pub fn has_probes(&self) -> bool {
        self.init_containers
            .iter()
            .chain(self.containers.iter())
            .any(|c| c.readiness.is_some() || c.liveness.is_some() || c.startup.is_some())
    }
}

#[cfg(test)]
mod tests;
