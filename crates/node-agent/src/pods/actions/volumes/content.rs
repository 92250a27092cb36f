//! What the files of a configMap, secret, downward API or projected volume hold, computed from the pod and the
//! objects it names — the same in both modes (a real node writes them, a hollow node only computes them, so
//! a missing object or key fails the same way).

use std::collections::BTreeMap;

use crate::pods::model::node_view::NodeView;
use crate::pods::model::spec::volumes::{DownwardField, DownwardFile, KeyPath, ObjectVolume, ResourceRef};
use crate::pods::model::spec::{ContainerSpec, DesiredPod};
use crate::quantity::Quantity;

/// One file of a volume: relative path, content, mode, and the user that owns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    /// Path relative to the volume's root.
    pub path: String,
    /// Content.
    pub data: Vec<u8>,
    /// Mode bits.
    pub mode: u32,
    /// The user that owns the file (and its visible link); `None`: the node's (root). Only service account
    /// tokens have one: the pod's single `runAsUser` (see `volumes::fs_user`).
    pub owner: Option<u32>,
}

/// The files of one object-backed volume source: `items` when given (each key must exist unless the source is
/// optional), else every key under its own name. `data` is `None` when the object does not exist.
pub fn object_files(
    kind: &str,
    v: &ObjectVolume,
    data: Option<&BTreeMap<String, Vec<u8>>>,
    default_mode: u32,
) -> Result<Vec<File>, String> {
    let Some(data) = data else {
        if v.optional {
            return Ok(Vec::new());
        }
        // the kubelet's default (watching) object managers name the resource in the singular
        let resource = if kind == "Secret" { "secret" } else { "configmap" };
        return Err(format!("{resource} \"{}\" not found", v.name));
    };
    if v.items.is_empty() {
        return Ok(data
            .iter()
            .map(|(k, d)| File {
                path: k.clone(),
                data: d.clone(),
                mode: default_mode,
                owner: None,
            })
            .collect());
    }
    let mut files = Vec::with_capacity(v.items.len());
    for KeyPath { key, path, mode } in &v.items {
        match data.get(key) {
            Some(d) => files.push(File {
                path: path.clone(),
                data: d.clone(),
                mode: mode.unwrap_or(default_mode),
                owner: None,
            }),
            None if v.optional => {}
            None if kind == "Secret" => return Err(format!("references non-existent secret key: {key}")),
            None => return Err(format!("configmap references non-existent config key: {key}")),
        }
    }
    Ok(files)
}

/// `key="value"` lines sorted by key, the value quoted as Go's `strconv.Quote` does (the kubelet's format
/// for `metadata.labels` and `metadata.annotations`).
pub fn format_map<'a>(pairs: impl IntoIterator<Item = (&'a String, &'a String)>) -> String {
    let mut out = String::new();
    for (k, v) in pairs {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(k);
        out.push('=');
        go_quote(v, &mut out);
    }
    out
}

fn go_quote(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A downward API `fieldRef` for a volume file: `None` for a path the kubelet does not offer there.
pub fn field_value(pod: &DesiredPod, path: &str) -> Option<String> {
    let key = |prefix: &str| path.strip_prefix(prefix)?.strip_suffix("']").map(str::to_owned);
    Some(match path {
        "metadata.name" => pod.name.clone(),
        "metadata.namespace" => pod.namespace.clone(),
        "metadata.uid" => pod.uid.to_string(),
        "metadata.labels" => format_map(pod.labels.iter()),
        "metadata.annotations" => format_map(pod.annotations.iter()),
        "spec.nodeName" => String::new(),
        "spec.serviceAccountName" => pod.service_account.to_string(),
        _ => {
            if let Some(k) = key("metadata.labels['") {
                pod.labels.get(&k).cloned().unwrap_or_default()
            } else if let Some(k) = key("metadata.annotations['") {
                pod.annotations.get(&k).cloned().unwrap_or_default()
            } else {
                return None;
            }
        }
    })
}

/// The value of a `resourceFieldRef` for `container` (the one the reference names, else `own`): the request
/// or limit divided by the divisor and rounded up; a missing limit is the node's allocatable.
pub fn resource_value(
    pod: &DesiredPod,
    own: Option<&ContainerSpec>,
    r: &ResourceRef,
    node: Option<&NodeView>,
) -> Result<String, String> {
    let container = if r.container.is_empty() {
        own
    } else {
        pod.container(&r.container)
    }
    .ok_or_else(|| format!("container {:?} not found in pod", r.container))?;
    let res = &container.resources;
    let node_cpu = node.map_or(0, |n| n.cpu_milli);
    let node_memory = node.map_or(0, |n| n.memory);
    let node_ephemeral = node.map_or(0, |n| n.ephemeral);
    // (value in milli-units, whether the resource is cpu)
    let (milli, cpu): (i128, bool) = match r.resource.as_str() {
        "limits.cpu" => (i128::from(res.cpu_limit.unwrap_or(node_cpu)), true),
        "requests.cpu" => (i128::from(res.cpu_request.unwrap_or(0)), true),
        "limits.memory" => (i128::from(res.memory_limit.unwrap_or(node_memory)) * 1000, false),
        "requests.memory" => (i128::from(res.memory_request.unwrap_or(0)) * 1000, false),
        "limits.ephemeral-storage" => (i128::from(node_ephemeral) * 1000, false),
        "requests.ephemeral-storage" => (i128::from(res.ephemeral_request.unwrap_or(0)) * 1000, false),
        other => return Err(format!("unsupported container resource : {other}")),
    };
    let divisor = if r.divisor.is_empty() {
        Quantity::from_units(1, crate::quantity::Format::DecimalSI)
    } else {
        r.divisor
            .parse::<Quantity>()
            .map_err(|e| format!("divisor {:?}: {e}", r.divisor))?
    };
    // the API server defaults an unset divisor to "0", which the kubelet reads as 1
    let d = match divisor.milli() {
        0 => 1000,
        d => d,
    };
    if d < 0 {
        return Err(format!("divisor {:?} must be positive", r.divisor));
    }
    // cpu: ceil(milli / divisor milli), at least 1 for a non-zero cpu (the kubelet's rounding)
    let value = (milli + d - 1).div_euclid(d);
    let value = if cpu && milli > 0 { value.max(1) } else { value };
    Ok(value.to_string())
}

/// The files of a downward API volume (or projected source).
pub fn downward_files(
    pod: &DesiredPod,
    items: &[DownwardFile],
    default_mode: u32,
    node: Option<&NodeView>,
) -> Result<Vec<File>, String> {
    items
        .iter()
        .map(|f| {
            let data = match &f.field {
                DownwardField::Field(path) => field_value(pod, path)
                    .ok_or_else(|| format!("unsupported fieldRef for a volume: {path}"))?,
                DownwardField::Resource(r) => resource_value(pod, None, r, node)?,
            };
            Ok(File {
                path: f.path.clone(),
                data: data.into_bytes(),
                mode: f.mode.unwrap_or(default_mode),
                owner: None,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::model::spec::volumes::{DownwardField, DownwardFile, KeyPath, ObjectVolume};
    use serde_json::json;

    fn pod() -> std::sync::Arc<DesiredPod> {
        let p = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1",
                         "labels": {"app": "x", "tier": "a \"b\""}, "annotations": {"note": "line1\nline2"}},
            "spec": {"serviceAccountName": "sa", "containers": [
                {"name": "app", "image": "i", "resources": {"requests": {"cpu": "250m", "memory": "64Mi"},
                                                           "limits": {"memory": "128Mi"}}}]}
        }))
        .unwrap();
        DesiredPod::from_pod(&p).unwrap()
    }

    #[test]
    fn labels_and_annotations_are_formatted_as_the_kubelet_does() {
        let p = pod();
        assert_eq!(
            field_value(&p, "metadata.labels").unwrap(),
            "app=\"x\"\ntier=\"a \\\"b\\\"\""
        );
        assert_eq!(
            field_value(&p, "metadata.annotations").unwrap(),
            "note=\"line1\\nline2\""
        );
        assert_eq!(field_value(&p, "metadata.labels['app']").unwrap(), "x");
        assert_eq!(field_value(&p, "spec.serviceAccountName").unwrap(), "sa");
        assert_eq!(field_value(&p, "status.podIP"), None);
    }

    #[test]
    fn resources_round_up_and_fall_back_to_the_node() {
        let p = pod();
        let node = NodeView {
            cpu_milli: 4000,
            memory: 8 << 30,
            ..Default::default()
        };
        let r = |resource: &str, divisor: &str| ResourceRef {
            container: "app".into(),
            resource: resource.into(),
            divisor: divisor.into(),
        };
        let v = |resource: &str, divisor: &str| {
            resource_value(&p, None, &r(resource, divisor), Some(&node)).unwrap()
        };
        assert_eq!(v("requests.cpu", ""), "1", "250m rounds up to one core");
        assert_eq!(
            v("requests.cpu", "0"),
            "1",
            "the API server's default divisor is 1"
        );
        assert_eq!(v("limits.memory", "0"), (128u64 << 20).to_string());
        assert_eq!(v("requests.cpu", "1m"), "250");
        assert_eq!(v("limits.cpu", ""), "4", "no limit: the node's allocatable");
        assert_eq!(v("limits.memory", "1Mi"), "128");
        assert_eq!(v("requests.memory", ""), (64u64 << 20).to_string());
        assert!(resource_value(&p, None, &r("limits.gpu", ""), Some(&node)).is_err());
    }

    #[test]
    fn object_items_and_missing_keys() {
        let data: BTreeMap<String, Vec<u8>> =
            [("a".to_owned(), b"1".to_vec()), ("b".to_owned(), b"2".to_vec())].into();
        let all = ObjectVolume {
            name: "cm".into(),
            items: vec![],
            optional: false,
        };
        let files = object_files("ConfigMap", &all, Some(&data), 0o644).unwrap();
        assert_eq!(
            files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        let some = ObjectVolume {
            items: vec![KeyPath {
                key: "b".into(),
                path: "dir/b.txt".into(),
                mode: Some(0o400),
            }],
            ..all.clone()
        };
        let files = object_files("ConfigMap", &some, Some(&data), 0o644).unwrap();
        assert_eq!((files[0].path.as_str(), files[0].mode), ("dir/b.txt", 0o400));
        let missing_key = ObjectVolume {
            items: vec![KeyPath {
                key: "zz".into(),
                path: "zz".into(),
                mode: None,
            }],
            ..all.clone()
        };
        assert_eq!(
            object_files("ConfigMap", &missing_key, Some(&data), 0o644).unwrap_err(),
            "configmap references non-existent config key: zz"
        );
        assert_eq!(
            object_files("Secret", &missing_key, Some(&data), 0o644).unwrap_err(),
            "references non-existent secret key: zz"
        );
        assert_eq!(
            object_files("ConfigMap", &all, None, 0o644).unwrap_err(),
            "configmap \"cm\" not found"
        );
        let optional = ObjectVolume {
            optional: true,
            ..all
        };
        assert!(
            object_files("ConfigMap", &optional, None, 0o644)
                .unwrap()
                .is_empty()
        );
        let downward = downward_files(
            &pod(),
            &[DownwardFile {
                path: "name".into(),
                mode: None,
                field: DownwardField::Field("metadata.name".into()),
            }],
            0o644,
            None,
        )
        .unwrap();
        assert_eq!(downward[0].data, b"web");
    }
}
