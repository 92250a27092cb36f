//! What the lease renewer keeps of its Lease between renewals.
//!
//! A renewal writes the whole object back (an update with its resourceVersion, as the kubelet does), but most
//! of it is what every renewal sets again: the name and namespace, the holder, the duration, the renew time and
//! the owner reference to the Node. Kept are the server's fields (UID, resourceVersion, creation time) and,
//! only when the object carries anything else (labels, annotations, other owners, an acquire time, ...), the
//! rest of it, written back unchanged. A node's usual Lease then costs two short strings instead of a whole
//! decoded object, held by every node for its whole life.
//!
//! The answer to each renewal is read the same way ([`KeptLease::from_answer`]): a usual Lease is read for those
//! three fields alone, its managed fields skipped unparsed (decoding the whole object every ten seconds per
//! node would be most of a renewal's cost in an idle fleet, after the request itself); anything else is decoded
//! whole.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use serde::Deserialize;
use serde::de::IgnoredAny;

/// The namespace of node leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";

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

    /// Keeps the Lease of the node `node` from the text of the API server's answer: what [`KeptLease::of`]
    /// keeps of the decoded object, without decoding it when it is a usual Lease.
    pub(super) fn from_answer(text: &str, node: &str) -> serde_json::Result<Self> {
        match usual(text, node) {
            Some(kept) => Ok(kept),
            None => serde_json::from_str::<Lease>(text).map(|lease| Self::of(lease, node)),
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

/// A Lease answer holding nothing but what a renewal sets again and the server's fields: any other field fails
/// the read (`deny_unknown_fields`), and so does a string that cannot be borrowed from the text (an escape).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)] // some fields are read only to refuse the others
struct UsualAnswer<'a> {
    #[serde(default)]
    api_version: IgnoredAny,
    #[serde(default)]
    kind: IgnoredAny,
    #[serde(borrow)]
    metadata: UsualMeta<'a>,
    #[serde(default)]
    spec: Option<UsualSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)] // the managed fields are read only to be skipped
struct UsualMeta<'a> {
    name: Option<&'a str>,
    namespace: Option<&'a str>,
    uid: Option<String>,
    resource_version: Option<String>,
    creation_timestamp: Option<Time>,
    #[serde(default)]
    managed_fields: IgnoredAny,
    /// Exactly one reference (an empty or longer list fails the read).
    #[serde(borrow)]
    owner_references: Option<[UsualOwner<'a>; 1]>,
}

/// An owner reference with no `controller` or `blockOwnerDeletion`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)] // some fields are read only to refuse the others
struct UsualOwner<'a> {
    api_version: &'a str,
    kind: &'a str,
    name: &'a str,
    #[serde(default)]
    uid: IgnoredAny,
}

/// A spec holding only what every renewal sets.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)] // some fields are read only to refuse the others
struct UsualSpec {
    #[serde(default)]
    holder_identity: IgnoredAny,
    #[serde(default)]
    lease_duration_seconds: IgnoredAny,
    #[serde(default)]
    renew_time: IgnoredAny,
}

/// What [`KeptLease::of`] keeps of the Lease in `text`, when the Lease is a usual one for `node` (named for it,
/// in the lease namespace, owned by the plain reference to its Node, nothing else set); `None` otherwise.
fn usual(text: &str, node: &str) -> Option<KeptLease> {
    let answer: UsualAnswer<'_> = serde_json::from_str(text).ok()?;
    let m = answer.metadata;
    let owner_is_plain = match &m.owner_references {
        None => true,
        Some([o]) => o.api_version == "v1" && o.kind == "Node" && o.name == node,
    };
    let usual = m.name.is_none_or(|n| n == node)
        && m.namespace.is_none_or(|n| n == LEASE_NAMESPACE)
        && owner_is_plain;
    usual.then_some(KeptLease {
        uid: m.uid,
        resource_version: m.resource_version,
        created: m.creation_timestamp,
        rest: None,
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::Lease;
    use serde_json::json;

    use super::KeptLease;

    fn lease(extra_meta: serde_json::Value, extra_spec: serde_json::Value) -> Lease {
        serde_json::from_str(&answer(extra_meta, extra_spec)).unwrap()
    }

    /// The text of a Lease answer for the node `n1`, with `extra_meta` and `extra_spec` set over the usual fields
    /// (a `null` removes one).
    fn answer(extra_meta: serde_json::Value, extra_spec: serde_json::Value) -> String {
        let mut v = json!({
            "kind": "Lease",
            "apiVersion": "coordination.k8s.io/v1",
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
        for (part, extra) in [("metadata", extra_meta), ("spec", extra_spec)] {
            for (k, val) in extra.as_object().unwrap() {
                let fields = v[part].as_object_mut().unwrap();
                if val.is_null() {
                    fields.remove(k);
                } else {
                    fields.insert(k.clone(), val.clone());
                }
            }
        }
        v.to_string()
    }

    #[test]
    fn an_answer_is_kept_as_its_decoded_lease_would_be_and_a_usual_one_is_read_lean() {
        let plain_owner = json!([{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "a1"}]);
        // (extra metadata, extra spec, whether the lean read takes it)
        let cases = [
            (json!({}), json!({}), true),
            (
                json!({"managedFields": null, "ownerReferences": null}),
                json!({}),
                true,
            ),
            (
                json!({"name": null, "namespace": null}),
                json!({"renewTime": null}),
                true,
            ),
            (
                json!({"ownerReferences": plain_owner}),
                json!({"holderIdentity": null}),
                true,
            ),
            (json!({"labels": {"team": "a"}}), json!({}), false),
            (json!({"annotations": {"note": "kept"}}), json!({}), false),
            (json!({"finalizers": ["x/y"]}), json!({}), false),
            (json!({"name": "n2"}), json!({}), false),
            (json!({"namespace": "default"}), json!({}), false),
            (json!({"ownerReferences": []}), json!({}), false),
            (
                json!({"ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n2", "uid": "b2"}]}),
                json!({}),
                false,
            ),
            (
                json!({"ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "a1", "controller": true}
                ]}),
                json!({}),
                false,
            ),
            (
                json!({"ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "a1"},
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "c1"},
                ]}),
                json!({}),
                false,
            ),
            (
                json!({}),
                json!({"acquireTime": "2026-11-26T07:00:00.000000Z"}),
                false,
            ),
            (json!({}), json!({"leaseTransitions": 3}), false),
            (
                json!({}),
                json!({"preferredHolder": "n2", "strategy": "OldestEmulationVersion"}),
                false,
            ),
        ];
        for (meta, spec, lean) in cases {
            let text = answer(meta.clone(), spec.clone());
            let decoded = KeptLease::of(serde_json::from_str(&text).unwrap(), "n1");
            assert_eq!(KeptLease::from_answer(&text, "n1").unwrap(), decoded, "{text}");
            assert_eq!(super::usual(&text, "n1").is_some(), lean, "{text}");
            assert_eq!(decoded.has_rest(), !lean, "{text}");
        }
        // a string the lean read cannot borrow (an escape) sends the answer to the whole decoding
        let escaped = answer(json!({}), json!({})).replace("kube-node-lease", "kube-node-leas\\u0065");
        assert!(super::usual(&escaped, "n1").is_none());
        let kept = KeptLease::from_answer(&escaped, "n1").unwrap();
        assert!(!kept.has_rest());
        assert_eq!(kept, KeptLease::of(serde_json::from_str(&escaped).unwrap(), "n1"));

        let usual = KeptLease::from_answer(&answer(json!({}), json!({})), "n1").unwrap();
        assert_eq!(usual.resource_version.as_deref(), Some("812"));
        assert_eq!(usual.uid.as_deref(), Some("3f1c"));
        assert!(usual.created.is_some());
    }

    #[test]
    fn an_answer_that_is_not_a_lease_is_an_error() {
        let err = KeptLease::from_answer(r#"{"metadata": {"uid": 7}}"#, "n1").unwrap_err();
        assert!(err.is_data(), "{err}");
        assert!(KeptLease::from_answer("not json", "n1").unwrap_err().is_syntax());
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
