//! One static pod manifest: decoding it (errors name the field), checking what the agent needs, and turning
//! it into the pod the agent runs with the kubelet's defaults — name `<name>-<node>`, namespace `default`,
//! `spec.nodeName`, a UID hashed from the manifest and where it came from, the `kubernetes.io/config.*`
//! annotations, a NoExecute toleration for file pods, phase Pending.
//!
//! The UID is an FNV-128a hash, as the kubelet's, of the decoded manifest (here its canonical JSON; the
//! kubelet hashes its Go object dump, so the values differ from a kubelet's for the same file) followed by
//! `host:<node>` and `file:<path>` for files, or `url:<url>` for the URL source. A changed manifest is a new
//! pod: the old one stops and the new one starts.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Pod, PodStatus, Toleration};
use k8s_openapi::jiff::Timestamp;

pub use crate::pods::model::spec::SOURCE_ANNOTATION;

/// `kubernetes.io/config.hash`: the static pod's UID.
pub const HASH_ANNOTATION: &str = "kubernetes.io/config.hash";
/// `kubernetes.io/config.mirror`: on a mirror pod, the hash of the static pod it mirrors.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// `kubernetes.io/config.seen`: when the agent first saw the pod (RFC 3339).
pub const SEEN_ANNOTATION: &str = "kubernetes.io/config.seen";

/// Where a manifest came from.
#[derive(Debug, Clone, Copy)]
pub enum Origin<'a> {
    /// A file (its path).
    File(&'a str),
    /// The static pod URL.
    Http(&'a str),
}

impl Origin<'_> {
    /// The `kubernetes.io/config.source` value.
    pub fn source(&self) -> &'static str {
        match self {
            Origin::File(_) => "file",
            Origin::Http(_) => "http",
        }
    }
}

/// Why a manifest was not used. The text names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ManifestError {
    /// The field, as a path (`spec.containers[0].image`), or `(document)` for a syntax error.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl ManifestError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

fn decode_one(value: serde_yaml::Value) -> Result<Pod, ManifestError> {
    serde_path_to_error::deserialize::<_, Pod>(value).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." || path.is_empty() {
            "(document)".to_owned()
        } else {
            path
        };
        ManifestError::new(field, e.into_inner().to_string())
    })
}

fn kind_of(value: &serde_yaml::Value) -> (Option<&str>, Option<&str>) {
    (
        value.get("apiVersion").and_then(|v| v.as_str()),
        value.get("kind").and_then(|v| v.as_str()),
    )
}

/// Decodes a manifest (YAML or JSON): one `v1` Pod, or (when `lists` is true, as for the URL source) a
/// `v1` PodList.
pub fn decode(text: &str, lists: bool) -> Result<Vec<Pod>, ManifestError> {
    let value: serde_yaml::Value =
        serde_yaml::from_str(text).map_err(|e| ManifestError::new("(document)", e.to_string()))?;
    let (api_version, kind) = kind_of(&value);
    if api_version != Some("v1") {
        return Err(ManifestError::new(
            "apiVersion",
            format!(
                "{:?} is not supported; expected \"v1\"",
                api_version.unwrap_or("")
            ),
        ));
    }
    match kind {
        Some("Pod") => Ok(vec![decode_one(value)?]),
        Some("PodList") if lists => {
            let items = value
                .get("items")
                .and_then(|v| v.as_sequence())
                .cloned()
                .unwrap_or_default();
            items
                .into_iter()
                .enumerate()
                .map(|(i, item)| {
                    decode_one(item)
                        .map_err(|e| ManifestError::new(format!("items[{i}].{}", e.field), e.message))
                })
                .collect()
        }
        other => Err(ManifestError::new(
            "kind",
            format!(
                "{:?} is not supported; expected \"Pod\"{}",
                other.unwrap_or(""),
                if lists { " or \"PodList\"" } else { "" }
            ),
        )),
    }
}

/// DNS-1123 label (container names) or subdomain (pod names).
fn dns_name(s: &str, max: usize, dots: bool) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
        && (dots || !s.contains('.'))
}

/// What the agent needs of a static pod (a subset of the API server's pod validation).
fn check(pod: &Pod) -> Result<(), ManifestError> {
    let name = pod.metadata.name.as_deref().unwrap_or("");
    if name.is_empty() {
        return Err(ManifestError::new("metadata.name", "name is needed for the pod"));
    }
    if !dns_name(name, 253, true) {
        return Err(ManifestError::new(
            "metadata.name",
            format!("{name:?} is not a lowercase RFC 1123 subdomain"),
        ));
    }
    let Some(spec) = &pod.spec else {
        return Err(ManifestError::new("spec", "required"));
    };
    if spec.containers.is_empty() {
        return Err(ManifestError::new(
            "spec.containers",
            "at least one container is required",
        ));
    }
    let mut names = HashSet::new();
    let all = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| ("spec.initContainers", c))
        .enumerate()
        .chain(spec.containers.iter().map(|c| ("spec.containers", c)).enumerate());
    for (i, (list, c)) in all {
        if !dns_name(&c.name, 63, false) {
            return Err(ManifestError::new(
                format!("{list}[{i}].name"),
                format!("{:?} is not a lowercase RFC 1123 label", c.name),
            ));
        }
        if !names.insert(c.name.as_str()) {
            return Err(ManifestError::new(
                format!("{list}[{i}].name"),
                format!("{:?} is used twice", c.name),
            ));
        }
        if c.image.as_deref().is_none_or(str::is_empty) {
            return Err(ManifestError::new(format!("{list}[{i}].image"), "required"));
        }
    }
    Ok(())
}

/// FNV-128a, as Go's `hash/fnv` `New128a`; the sum as 32 hex digits (big-endian).
fn fnv128a(parts: &[&[u8]]) -> String {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let mut h = OFFSET;
    for b in parts.iter().flat_map(|p| p.iter()) {
        h ^= u128::from(*b);
        h = h.wrapping_mul(PRIME);
    }
    format!("{h:032x}")
}

/// The pod the agent runs for `pod` from `origin` on `node`: checked, then given the kubelet's defaults.
pub fn prepare(mut pod: Pod, origin: Origin<'_>, node: &str) -> Result<Pod, ManifestError> {
    check(&pod)?;
    pod.status = None;
    if pod.metadata.uid.as_deref().is_none_or(str::is_empty) {
        let canonical = serde_json::to_vec(&pod).unwrap_or_default();
        let uid = match origin {
            Origin::File(path) => fnv128a(&[
                &canonical,
                format!("host:{node}").as_bytes(),
                format!("file:{path}").as_bytes(),
            ]),
            Origin::Http(url) => fnv128a(&[&canonical, format!("url:{url}").as_bytes()]),
        };
        pod.metadata.uid = Some(uid);
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let name = pod.metadata.name.take().unwrap_or_default();
    pod.metadata.name = Some(format!("{name}-{}", node.to_lowercase()));
    if pod.metadata.namespace.as_deref().is_none_or(str::is_empty) {
        pod.metadata.namespace = Some("default".into());
    }
    let annotations = pod.metadata.annotations.get_or_insert_with(Default::default);
    annotations.insert(HASH_ANNOTATION.into(), uid);
    annotations.insert(SOURCE_ANNOTATION.into(), origin.source().into());
    annotations.insert(SEEN_ANNOTATION.into(), Timestamp::now().to_string());
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.node_name = Some(node.to_owned());
    if matches!(origin, Origin::File(_)) {
        let all = Toleration {
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            ..Default::default()
        };
        let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
        if !tolerations.contains(&all) {
            tolerations.push(all);
        }
    }
    pod.status = Some(PodStatus {
        phase: Some("Pending".into()),
        ..Default::default()
    });
    Ok(pod)
}

/// Whether `pod` is a static pod (from a file or the URL), by its `kubernetes.io/config.source`.
pub fn is_static(pod: &Pod) -> bool {
    matches!(
        pod.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SOURCE_ANNOTATION))
            .map(String::as_str),
        Some("file" | "http")
    )
}

/// Whether `pod` (from the API server) is a mirror pod.
pub fn is_mirror(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NGINX: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: nginx\n    image: nginx:1\n";

    #[test]
    fn fnv128a_matches_go() {
        // Go: hex.EncodeToString(fnv.New128a().Sum(nil)) for "" and "a"
        assert_eq!(fnv128a(&[]), "6c62272e07bb014262b821756295c58d");
        assert_eq!(fnv128a(&[b"a"]), "d228cb696f1a8caf78912b704e4a8964");
    }

    #[test]
    fn prepare_names_hashes_and_annotates() {
        let pod = decode(NGINX, false).unwrap().remove(0);
        let a = prepare(
            pod.clone(),
            Origin::File("/etc/kubernetes/manifests/web.yaml"),
            "Node-1",
        )
        .unwrap();
        assert_eq!(a.metadata.name.as_deref(), Some("web-node-1"));
        assert_eq!(a.metadata.namespace.as_deref(), Some("default"));
        let uid = a.metadata.uid.clone().unwrap();
        assert_eq!(uid.len(), 32);
        let ann = a.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[HASH_ANNOTATION], uid);
        assert_eq!(ann[SOURCE_ANNOTATION], "file");
        assert!(ann.contains_key(SEEN_ANNOTATION));
        let spec = a.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("Node-1"));
        assert!(
            spec.tolerations
                .as_ref()
                .unwrap()
                .iter()
                .any(|t| t.effect.as_deref() == Some("NoExecute"))
        );
        assert!(is_static(&a));
        // the same manifest on another node, or from another file, is another pod
        let b = prepare(
            pod.clone(),
            Origin::File("/etc/kubernetes/manifests/web.yaml"),
            "node-2",
        )
        .unwrap();
        let c = prepare(pod.clone(), Origin::File("/other/web.yaml"), "Node-1").unwrap();
        let again = prepare(pod, Origin::File("/etc/kubernetes/manifests/web.yaml"), "Node-1").unwrap();
        assert_ne!(b.metadata.uid, a.metadata.uid);
        assert_ne!(c.metadata.uid, a.metadata.uid);
        assert_eq!(again.metadata.uid, a.metadata.uid);
        // a URL pod: no toleration added
        let pod = decode(NGINX, true).unwrap().remove(0);
        let h = prepare(pod, Origin::Http("http://127.0.0.1/pods"), "node-1").unwrap();
        assert_eq!(
            h.metadata.annotations.as_ref().unwrap()[SOURCE_ANNOTATION],
            "http"
        );
        assert!(h.spec.as_ref().unwrap().tolerations.is_none());
    }

    #[test]
    fn bad_manifests_name_the_field() {
        let typed = NGINX.replace(
            "  - name: nginx\n",
            "  - name: nginx\n    ports:\n    - containerPort: eighty\n",
        );
        let e = decode(&typed, false).unwrap_err();
        assert_eq!(e.field, "spec.containers[0].ports[0].containerPort", "{e}");
        let e = decode(&NGINX.replace("kind: Pod", "kind: Deployment"), false).unwrap_err();
        assert_eq!(e.field, "kind");
        let e = decode("{ not yaml", false).unwrap_err();
        assert_eq!(e.field, "(document)");
        let no_image = decode(&NGINX.replace("    image: nginx:1\n", ""), false)
            .unwrap()
            .remove(0);
        let e = prepare(no_image, Origin::File("f"), "n").unwrap_err();
        assert_eq!(e.field, "spec.containers[0].image");
        let bad_name = decode(&NGINX.replace("name: web", "name: Web_1"), false)
            .unwrap()
            .remove(0);
        assert_eq!(
            prepare(bad_name, Origin::File("f"), "n").unwrap_err().field,
            "metadata.name"
        );
    }

    #[test]
    fn pod_lists_only_where_allowed() {
        let list = format!(
            "apiVersion: v1\nkind: PodList\nitems:\n- {}",
            serde_json::to_string(&serde_yaml::from_str::<serde_json::Value>(NGINX).unwrap()).unwrap()
        );
        assert_eq!(decode(&list, true).unwrap().len(), 1);
        assert_eq!(decode(&list, false).unwrap_err().field, "kind");
    }
}

#[cfg(test)]
mod bad_input_tests {
    //! Generated bad manifests: any text, and a valid pod with one field set to a value of a random shape.
    //! Nothing panics, and a refusal names the field at fault.

    use proptest::prelude::*;

    use super::*;

    fn config() -> ProptestConfig {
        ProptestConfig {
            cases: 256,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    /// A value of any shape, near and far from what the fields want.
    fn value() -> impl Strategy<Value = serde_json::Value> {
        prop_oneof![
            any::<i64>().prop_map(serde_json::Value::from),
            any::<bool>().prop_map(serde_json::Value::from),
            Just(serde_json::Value::Null),
            "[a-z0-9.-]{0,70}".prop_map(serde_json::Value::from),
            "\\PC{0,20}".prop_map(serde_json::Value::from),
            prop::collection::vec("[a-z]{0,5}", 0..3).prop_map(|v| serde_json::json!(v)),
            Just(serde_json::json!({"x": 1})),
        ]
    }

    /// Where the value goes (a JSON pointer into the manifest) and the field path a refusal names.
    const PLACES: &[(&str, &str)] = &[
        ("/metadata/name", "metadata.name"),
        ("/metadata/namespace", "metadata.namespace"),
        ("/metadata/labels", "metadata.labels"),
        ("/spec/containers/0/name", "spec.containers[0].name"),
        ("/spec/containers/0/image", "spec.containers[0].image"),
        ("/spec/containers/0/command", "spec.containers[0].command"),
        ("/spec/containers/0/ports", "spec.containers[0].ports"),
        ("/spec/containers", "spec.containers"),
        ("/spec/restartPolicy", "spec.restartPolicy"),
        ("/spec/hostNetwork", "spec.hostNetwork"),
        ("/spec", "spec"),
    ];

    fn base() -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default", "labels": {}},
            "spec": {
                "restartPolicy": "Always",
                "hostNetwork": false,
                "containers": [{"name": "app", "image": "busybox", "command": ["sh"], "ports": []}],
            },
        })
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn any_text_is_decoded_or_refused_naming_a_field(text in "\\PC{0,200}", lists in any::<bool>()) {
            match decode(&text, lists) {
                Ok(pods) => {
                    for pod in pods {
                        let _ = prepare(pod, Origin::File("/etc/kubernetes/manifests/gen.yaml"), "n1");
                    }
                }
                Err(e) => prop_assert!(!e.field.is_empty() && !e.message.is_empty(), "{e:?}"),
            }
        }

        #[test]
        fn a_field_of_any_value_is_taken_or_refused_by_name(
            place in prop::sample::select(PLACES),
            v in value(),
        ) {
            let mut manifest = base();
            *manifest.pointer_mut(place.0).expect("a place of the base manifest") = v.clone();
            let text = serde_json::to_string(&manifest).expect("JSON");
            let result = decode(&text, false).and_then(|pods| {
                pods.into_iter()
                    .map(|p| prepare(p, Origin::File("/etc/kubernetes/manifests/gen.yaml"), "n1"))
                    .collect::<Result<Vec<_>, _>>()
            });
            if let Err(e) = result {
                prop_assert!(
                    e.field.starts_with(place.1) || place.1.starts_with(e.field.as_str()),
                    "{} = {v}: refused as {e}",
                    place.1
                );
            }
        }
    }
}
