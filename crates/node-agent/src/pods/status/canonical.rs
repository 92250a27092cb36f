//! The kubelet-owned part of a pod status as JSON: the body of the strategic-merge PATCH, and (hashed) the
//! "did anything change" test — computed the same way for a status we generate and for the status the API
//! server holds, so an agent restart that regenerates an identical status writes nothing.
//!
//! Container states list all three of `waiting` / `running` / `terminated`, the absent ones as `null`, so the
//! strategic merge replaces the state instead of merging two of them; `podIPs` and `hostIPs` carry the
//! `$patch: replace` directive; conditions merge by type, so other writers' conditions (readiness gates,
//! DisruptionTarget) survive.

use k8s_openapi::api::core::v1::{ContainerState, ContainerStatus, PodCondition, PodStatus};
use serde::Serialize;
use serde::ser::{SerializeMap, SerializeSeq, Serializer};

/// The condition types the agent owns, in the order it writes them.
pub(crate) const OWNED_CONDITIONS: [&str; 5] = [
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodScheduled",
];

/// The conditions of an in-place resize, also the agent's: reported only while they hold; when absent, the
/// patch deletes them.
const TRANSIENT_CONDITIONS: [&str; 2] = ["PodResizePending", "PodResizeInProgress"];

// Every object below writes its keys in byte order, as a `serde_json::Value` map would hold them: the text is
// canonical whichever way it is made. They serialise straight from the status they borrow: a status write or
// fingerprint builds no JSON tree (a tree is many small allocations, made for every status write and every
// fingerprint, and bursts of them leave the allocator's pages part-used long after).

/// The owned fields of a pod status as a strategic-merge patch of `status`.
#[derive(Debug)]
pub(crate) struct Owned<'a>(pub(crate) &'a PodStatus);

impl Serialize for Owned<'_> {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let s = self.0;
        let ephemeral = s.ephemeral_container_statuses.as_deref();
        let mut m = ser.serialize_map(None)?;
        // the pod's own resources: written once known (a status without them changes nothing there)
        if let Some(allocated) = &s.allocated_resources {
            m.serialize_entry("allocatedResources", allocated)?;
        }
        m.serialize_entry("conditions", &Conditions(s))?;
        m.serialize_entry(
            "containerStatuses",
            &s.container_statuses.as_deref().map(Containers),
        )?;
        // only pods with ephemeral containers carry the list; they cannot be removed from a pod, so it is
        // never written as null to clear it
        if let Some(list) = ephemeral {
            m.serialize_entry("ephemeralContainerStatuses", &Containers(list))?;
        }
        m.serialize_entry("hostIP", &s.host_ip)?;
        m.serialize_entry(
            "hostIPs",
            &s.host_ips
                .as_deref()
                .map(|l| Ips(l.iter().map(|h| h.ip.as_str()))),
        )?;
        m.serialize_entry(
            "initContainerStatuses",
            &s.init_container_statuses.as_deref().map(Containers),
        )?;
        m.serialize_entry("message", &s.message)?;
        m.serialize_entry("observedGeneration", &s.observed_generation)?;
        m.serialize_entry("phase", &s.phase)?;
        m.serialize_entry("podIP", &s.pod_ip)?;
        m.serialize_entry(
            "podIPs",
            &s.pod_ips.as_deref().map(|l| Ips(l.iter().map(|p| p.ip.as_str()))),
        )?;
        m.serialize_entry("qosClass", &s.qos_class)?;
        m.serialize_entry("reason", &s.reason)?;
        if let Some(resources) = &s.resources {
            m.serialize_entry("resources", resources)?;
        }
        m.serialize_entry("startTime", &s.start_time)?;
        m.end()
    }
}

/// The body of a pod status PATCH: the owned fields, and the UID the write is meant for.
#[derive(Debug, Serialize)]
pub(crate) struct PatchBody<'a> {
    metadata: Uid<'a>,
    status: Owned<'a>,
}

#[derive(Debug, Serialize)]
struct Uid<'a> {
    uid: &'a str,
}

impl<'a> PatchBody<'a> {
    pub(crate) fn new(uid: &'a str, status: &'a PodStatus) -> Self {
        Self {
            metadata: Uid { uid },
            status: Owned(status),
        }
    }
}

/// The owned conditions in [`OWNED_CONDITIONS`] order, the resize conditions present, then DisruptionTarget
/// when the agent set it (graceful node shutdown); then a delete directive for each resize condition absent.
struct Conditions<'a>(&'a PodStatus);

impl Serialize for Conditions<'_> {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let all = self.0.conditions.as_deref().unwrap_or_default();
        let disruption = all
            .iter()
            .find(|c| c.type_ == "DisruptionTarget" && c.reason.as_deref() == Some("TerminationByKubelet"));
        let owned = OWNED_CONDITIONS
            .iter()
            .chain(&TRANSIENT_CONDITIONS)
            .filter_map(|t| all.iter().find(|c| c.type_ == *t))
            .chain(disruption);
        let mut seq = ser.serialize_seq(None)?;
        for c in owned {
            seq.serialize_element(&Condition(c))?;
        }
        for t in TRANSIENT_CONDITIONS {
            if !all.iter().any(|c| c.type_ == t) {
                seq.serialize_element(&Delete {
                    patch: "delete",
                    type_: t,
                })?;
            }
        }
        seq.end()
    }
}

/// A strategic-merge directive removing the condition of one type.
#[derive(Serialize)]
struct Delete {
    #[serde(rename = "$patch")]
    patch: &'static str,
    #[serde(rename = "type")]
    type_: &'static str,
}

struct Condition<'a>(&'a PodCondition);

impl Serialize for Condition<'_> {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let c = self.0;
        let mut m = ser.serialize_map(Some(6))?;
        m.serialize_entry("lastTransitionTime", &c.last_transition_time)?;
        m.serialize_entry("message", &c.message)?;
        m.serialize_entry("observedGeneration", &c.observed_generation)?;
        m.serialize_entry("reason", &c.reason)?;
        m.serialize_entry("status", &c.status)?;
        m.serialize_entry("type", &c.type_)?;
        m.end()
    }
}

struct Containers<'a>(&'a [ContainerStatus]);

impl Serialize for Containers<'_> {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        ser.collect_seq(self.0.iter().map(Container))
    }
}

struct Container<'a>(&'a ContainerStatus);

impl Serialize for Container<'_> {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let c = self.0;
        let mut m = ser.serialize_map(None)?;
        m.serialize_entry("allocatedResources", &c.allocated_resources)?;
        m.serialize_entry("containerID", &c.container_id)?;
        m.serialize_entry("image", &c.image)?;
        m.serialize_entry("imageID", &c.image_id)?;
        m.serialize_entry("lastState", &State(c.last_state.as_ref()))?;
        m.serialize_entry("name", &c.name)?;
        m.serialize_entry("ready", &c.ready)?;
        m.serialize_entry("resources", &c.resources)?;
        m.serialize_entry("restartCount", &c.restart_count)?;
        m.serialize_entry("started", &c.started)?;
        m.serialize_entry("state", &State(c.state.as_ref()))?;
        // the identity the runtime reports; a runtime that reports none leaves it out
        if let Some(user) = &c.user {
            m.serialize_entry("user", user)?;
        }
        m.end()
    }
}

/// A container state with all three variants, the absent ones `null`, so the strategic merge replaces the
/// state instead of merging two of them. Absent and empty are the same state (the API server returns
/// `lastState: {}`).
struct State<'a>(Option<&'a ContainerState>);

impl Serialize for State<'_> {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let s = self.0;
        let mut m = ser.serialize_map(Some(3))?;
        m.serialize_entry(
            "running",
            &s.and_then(|s| s.running.as_ref()).map(|r| Running {
                started_at: &r.started_at,
            }),
        )?;
        m.serialize_entry(
            "terminated",
            &s.and_then(|s| s.terminated.as_ref()).map(Terminated),
        )?;
        m.serialize_entry(
            "waiting",
            &s.and_then(|s| s.waiting.as_ref()).map(|w| Waiting {
                message: &w.message,
                reason: &w.reason,
            }),
        )?;
        m.end()
    }
}

#[derive(Serialize)]
struct Running<'a> {
    #[serde(rename = "startedAt")]
    started_at: &'a Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

#[derive(Serialize)]
struct Waiting<'a> {
    message: &'a Option<String>,
    reason: &'a Option<String>,
}

struct Terminated<'a>(&'a k8s_openapi::api::core::v1::ContainerStateTerminated);

impl Serialize for Terminated<'_> {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let t = self.0;
        let mut m = ser.serialize_map(Some(6))?;
        m.serialize_entry("containerID", &t.container_id)?;
        m.serialize_entry("exitCode", &t.exit_code)?;
        m.serialize_entry("finishedAt", &t.finished_at)?;
        m.serialize_entry("message", &t.message)?;
        m.serialize_entry("reason", &t.reason)?;
        m.serialize_entry("startedAt", &t.started_at)?;
        m.end()
    }
}

/// An IP list replaced whole: a `$patch: replace` directive, then `{"ip": …}` per address.
struct Ips<I>(I);

impl<'a, I: Iterator<Item = &'a str> + Clone> Serialize for Ips<I> {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Ip<'a> {
            ip: &'a str,
        }
        #[derive(Serialize)]
        struct Replace {
            #[serde(rename = "$patch")]
            patch: &'static str,
        }
        let mut seq = ser.serialize_seq(None)?;
        seq.serialize_element(&Replace { patch: "replace" })?;
        for ip in self.0.clone() {
            seq.serialize_element(&Ip { ip })?;
        }
        seq.end()
    }
}

/// A stable fingerprint of the owned fields (FNV-1a over the canonical JSON).
pub(crate) fn fingerprint(s: &PodStatus) -> u64 {
    hash_of(&Owned(s))
}

/// FNV-1a over the JSON form of `value`, written straight into the hash (no text is kept).
pub(crate) fn hash_of(value: &impl serde::Serialize) -> u64 {
    struct Fnv(u64);
    impl std::io::Write for Fnv {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            for b in buf {
                self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    // writing to the hash cannot fail, and these values always serialise
    let _ = serde_json::to_writer(&mut h, value);
    h.0
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn states_null_out_the_other_variants_and_ips_replace() {
        let s: PodStatus = serde_json::from_value(json!({
            "phase": "Running",
            "podIPs": [{"ip": "10.0.0.5"}],
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "example.com/gate", "status": "True"}],
            "containerStatuses": [{"name": "a", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                "state": {"running": {"startedAt": "2024-01-01T00:00:00Z"}}}]
        }))
        .unwrap();
        let v = serde_json::to_value(Owned(&s)).unwrap();
        assert_eq!(v["containerStatuses"][0]["state"]["waiting"], Value::Null);
        assert!(
            v["containerStatuses"][0]["state"]
                .as_object()
                .unwrap()
                .contains_key("waiting")
        );
        assert_eq!(v["podIPs"][0]["$patch"], "replace");
        assert_eq!(
            v["conditions"],
            json!([
                {"type": "Ready", "status": "True", "reason": null, "message": null,
                    "lastTransitionTime": null, "observedGeneration": null},
                {"$patch": "delete", "type": "PodResizePending"},
                {"$patch": "delete", "type": "PodResizeInProgress"},
            ]),
            "foreign conditions are not ours; resize conditions absent are deleted"
        );
        let mut other = s.clone();
        assert_eq!(fingerprint(&s), fingerprint(&other));
        other.phase = Some("Failed".into());
        assert_ne!(fingerprint(&s), fingerprint(&other));
    }

    #[test]
    fn the_patch_is_written_in_canonical_key_order_with_every_owned_field() {
        let s: PodStatus = serde_json::from_value(json!({
            "phase": "Running",
            "reason": "R",
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": "10.0.0.5",
            "podIPs": [{"ip": "10.0.0.5"}, {"ip": "fd00::5"}],
            "startTime": "2024-01-01T00:00:00Z",
            "qosClass": "Burstable",
            "nominatedNodeName": "not ours",
            "allocatedResources": {"cpu": "100m"},
            "resources": {"requests": {"cpu": "100m"}, "limits": {"memory": "64Mi"}},
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2024-01-01T00:00:01Z"},
                {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"},
                {"type": "PodScheduled", "status": "True"},
            ],
            "initContainerStatuses": [{"name": "i", "image": "busybox", "imageID": "sha256:1", "ready": false,
                "restartCount": 0, "containerID": "containerd://1",
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "containerID": "containerd://1",
                    "startedAt": "2024-01-01T00:00:00Z", "finishedAt": "2024-01-01T00:00:01Z"}}}],
            "containerStatuses": [{"name": "a", "image": "i", "imageID": "", "ready": false, "restartCount": 2,
                "user": {"linux": {"uid": 1000, "gid": 50, "supplementalGroups": [50, 4000]}},
                "started": false, "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]
        }))
        .unwrap();
        let text = serde_json::to_string(&PatchBody::new("u-1", &s)).unwrap();
        // a JSON tree holds its keys sorted: the text made straight from the status is that text
        let tree: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(text, tree.to_string());
        assert_eq!(
            tree,
            json!({
                "metadata": {"uid": "u-1"},
                "status": {
                    "phase": "Running", "reason": "R", "message": null, "observedGeneration": null,
                    "hostIP": "127.0.0.1", "hostIPs": [{"$patch": "replace"}, {"ip": "127.0.0.1"}],
                    "podIP": "10.0.0.5",
                    "podIPs": [{"$patch": "replace"}, {"ip": "10.0.0.5"}, {"ip": "fd00::5"}],
                    "startTime": "2024-01-01T00:00:00Z", "qosClass": "Burstable",
                    "allocatedResources": {"cpu": "100m"},
                    "resources": {"requests": {"cpu": "100m"}, "limits": {"memory": "64Mi"}},
                    "conditions": [
                        {"type": "Ready", "status": "True", "reason": null, "message": null,
                            "lastTransitionTime": "2024-01-01T00:00:01Z", "observedGeneration": null},
                        {"type": "PodScheduled", "status": "True", "reason": null, "message": null,
                            "lastTransitionTime": null, "observedGeneration": null},
                        {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                            "message": null, "lastTransitionTime": null, "observedGeneration": null},
                        {"$patch": "delete", "type": "PodResizePending"},
                        {"$patch": "delete", "type": "PodResizeInProgress"},
                    ],
                    "initContainerStatuses": [{"name": "i", "image": "busybox", "imageID": "sha256:1",
                        "containerID": "containerd://1", "ready": false, "started": null, "restartCount": 0,
                        "allocatedResources": null, "resources": null,
                        "state": {"waiting": null, "running": null, "terminated": {"exitCode": 0,
                            "reason": "Completed", "message": null, "containerID": "containerd://1",
                            "startedAt": "2024-01-01T00:00:00Z", "finishedAt": "2024-01-01T00:00:01Z"}},
                        "lastState": {"waiting": null, "running": null, "terminated": null}}],
                    "containerStatuses": [{"name": "a", "image": "i", "imageID": "", "containerID": null,
                        "ready": false, "started": false, "restartCount": 2,
                        "allocatedResources": null, "resources": null,
                        "user": {"linux": {"uid": 1000, "gid": 50, "supplementalGroups": [50, 4000]}},
                        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"},
                            "running": null, "terminated": null},
                        "lastState": {"waiting": null, "running": null, "terminated": {"exitCode": 1,
                            "reason": "Error", "message": null, "containerID": null, "startedAt": null,
                            "finishedAt": null}}}],
                },
            })
        );
        // the fingerprint is the hash of that text
        assert_eq!(fingerprint(&s), hash_of(&tree["status"]));
    }
}
