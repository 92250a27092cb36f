//! The desired pod as the lifecycle keeps it: a compact, immutable extract of a `Pod` object.
//!
//! A hollow fleet holds 100,000 pods in one process, so workers never keep whole API objects. [`DesiredPod`]
//! carries only what syncing, probing, terminating and status generation read again: identity, restart policy,
//! grace periods, readiness gates, and per container the image, command, environment, ports, probes, hooks and
//! resources. Fields that matter only once (node selector, affinity, tolerations) are read by admission from the
//! full object before it is dropped. Named probe ports are resolved here, once.
//!
//! This module holds the desired pod and what it keeps beside its containers; a container is in `container`,
//! the reading of the API object in `read` (containers, environment and probes in `extract`, volumes in
//! [`volumes`]), the pod's hostname and DNS settings in `dns`, and what the pod asks of the node in `requests`.

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;

mod container;
mod dns;
mod extract;
mod policies;
mod read;
mod requests;
mod small_map;
pub mod volumes;

pub use container::{
    Action, ContainerSpec, Containers, EnvValue, FALLBACK_TO_LOGS, HttpGet, KeyRef, Port, ProbeSpec,
    ResizeRestart,
};
pub use dns::{DnsConfig, DnsPolicy};
pub use policies::{PullPolicy, RestartPolicy};
pub use read::SYSTEM_CRITICAL_PRIORITY;
pub use requests::ResizePending;
pub use small_map::SmallMap;
pub use volumes::{DeviceSpec, EnvFrom, MountSpec, ResourceRef, VolumeSpec};

use crate::pods::model::resources::{self, PodRequests, QosClass};
use crate::pods::model::security::{APPARMOR_ANNOTATION_PREFIX, AppArmor, PodSecurity};

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

/// `kubernetes.io/config.source`: where a pod came from — `file`, `http` or `api`.
pub const SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";

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
