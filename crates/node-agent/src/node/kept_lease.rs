//! What the lease renewer keeps of its Lease between renewals.
//!
//! A renewal writes the whole object back (an update with its resourceVersion, as the kubelet does), but most
//! of it is what every renewal sets again: the name and namespace, the holder, the duration, the renew time and
//! the owner reference to the Node. Kept are the server's fields (UID, resourceVersion, creation time) and,
//! only when the object carries anything else (labels, annotations, other owners, an acquire time, ...), the
//! rest of it, written back unchanged. A node's usual Lease then costs two short strings instead of a decoded
//! object of ~800 bytes, held by every node for its whole life.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

use super::lease::LEASE_NAMESPACE;

/// A Lease reduced to what the next renewal does not set again.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct KeptLease {
    uid: Option<String>,
    resource_version: Option<String>,
    created: Option<Time>,
    /// Everything else the object carried, when it carried anything.
    rest: Option<Box<Lease>>,
}

/// The owner reference a renewal writes: the Node named `node`, nothing more.
fn is_plain_node_owner(r: &OwnerReference, node: &str) -> bool {
    r.api_version == "v1"
        && r.kind == "Node"
        && r.name == node
        && r.controller.is_none()
        && r.block_owner_deletion.is_none()
}

impl KeptLease {
    /// Keeps `lease`, the Lease of the node `node` as the API server returned it.
    pub(super) fn of(mut lease: Lease, node: &str) -> Self {
        let meta = &mut lease.metadata;
        let uid = meta.uid.take();
        let resource_version = meta.resource_version.take();
        let created = meta.creation_timestamp.take();
        meta.managed_fields = None;
        if meta.name.as_deref() == Some(node) {
            meta.name = None;
        }
        if meta.namespace.as_deref() == Some(LEASE_NAMESPACE) {
            meta.namespace = None;
        }
        // one plain reference to a Node of this name: a renewal writes it again (for the Node as registered now)
        if let Some([only]) = meta.owner_references.as_deref()
            && is_plain_node_owner(only, node)
        {
            meta.owner_references = None;
        }
        if let Some(spec) = lease.spec.as_mut() {
            // set by every renewal
            spec.holder_identity = None;
            spec.lease_duration_seconds = None;
            spec.renew_time = None;
            if *spec == LeaseSpec::default() {
                lease.spec = None;
            }
        }
        let rest = (lease != Lease::default()).then(|| {
            // decoding grows a list to four entries; a lease has one
            if let Some(refs) = lease.metadata.owner_references.as_mut() {
                refs.shrink_to_fit();
            }
            Box::new(lease)
        });
        Self {
            uid,
            resource_version,
            created,
            rest,
        }
    }

    /// The object to renew from: what was kept, named `node` in the lease namespace (holder, duration, renew
    /// time and owner are for the caller to set).
    pub(super) fn to_lease(&self, node: &str) -> Lease {
        let mut lease = self.rest.as_deref().cloned().unwrap_or_default();
        let meta = &mut lease.metadata;
        meta.name.get_or_insert_with(|| node.to_owned());
        meta.namespace.get_or_insert_with(|| LEASE_NAMESPACE.to_owned());
        meta.uid.clone_from(&self.uid);
        meta.resource_version.clone_from(&self.resource_version);
        meta.creation_timestamp.clone_from(&self.created);
        lease
    }

    /// Whether anything beyond the usual fields was kept.
    #[cfg(test)]
    pub(super) fn has_rest(&self) -> bool {
        self.rest.is_some()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::Lease;
    use serde_json::json;

    use super::KeptLease;

    fn lease(extra_meta: serde_json::Value, extra_spec: serde_json::Value) -> Lease {
        let mut v = json!({
            "metadata": {
                "name": "n1",
                "namespace": "kube-node-lease",
                "uid": "3f1c",
                "resourceVersion": "812",
                "creationTimestamp": "2026-11-26T08:00:00Z",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "a1"}],
                "managedFields": [{"manager": "node-agent", "operation": "Update"}],
            },
            "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40, "renewTime": "2026-11-26T08:00:10.000000Z"},
        });
        for (k, val) in extra_meta.as_object().unwrap() {
            v["metadata"][k] = val.clone();
        }
        for (k, val) in extra_spec.as_object().unwrap() {
            v["spec"][k] = val.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_usual_lease_keeps_only_the_servers_fields() {
        let kept = KeptLease::of(lease(json!({}), json!({})), "n1");
        assert!(!kept.has_rest(), "{kept:?}");
        let back = kept.to_lease("n1");
        let m = &back.metadata;
        assert_eq!(
            (
                m.name.as_deref(),
                m.namespace.as_deref(),
                m.uid.as_deref(),
                m.resource_version.as_deref()
            ),
            (Some("n1"), Some("kube-node-lease"), Some("3f1c"), Some("812"))
        );
        assert!(m.creation_timestamp.is_some());
        assert!(m.owner_references.is_none(), "the renewal writes the owner again");
        assert!(back.spec.is_none(), "the renewal writes the spec again");
    }

    #[test]
    fn anything_unusual_is_written_back_unchanged() {
        let original = lease(
            json!({
                "labels": {"team": "a"},
                "annotations": {"note": "kept"},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "a1"},
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "c1"},
                ],
            }),
            json!({"acquireTime": "2026-11-26T07:00:00.000000Z", "leaseTransitions": 3}),
        );
        let kept = KeptLease::of(original.clone(), "n1");
        assert!(kept.has_rest());
        let back = kept.to_lease("n1");
        assert_eq!(back.metadata.labels, original.metadata.labels);
        assert_eq!(back.metadata.annotations, original.metadata.annotations);
        assert_eq!(back.metadata.owner_references, original.metadata.owner_references);
        let (spec, was) = (back.spec.unwrap(), original.spec.unwrap());
        assert_eq!(
            (spec.acquire_time, spec.lease_transitions),
            (was.acquire_time, was.lease_transitions)
        );
        assert_eq!(spec.holder_identity, None, "set by the renewal");
        assert_eq!(back.metadata.resource_version.as_deref(), Some("812"));
        assert_eq!(back.metadata.managed_fields, None);
    }

    #[test]
    fn an_owner_that_is_not_the_plain_node_reference_is_kept() {
        let controller = lease(
            json!({"ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "a1", "controller": true}
            ]}),
            json!({}),
        );
        let kept = KeptLease::of(controller.clone(), "n1");
        assert_eq!(
            kept.to_lease("n1").metadata.owner_references,
            controller.metadata.owner_references
        );
        let other_name = lease(
            json!({"ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n2", "uid": "b2"}]}),
            json!({}),
        );
        assert!(KeptLease::of(other_name, "n1").has_rest());
    }
}
