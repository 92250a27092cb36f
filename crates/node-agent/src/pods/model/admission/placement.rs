//! Whether the pod belongs on this node: its node selector and required node affinity against the node's labels
//! and name (`NodeAffinity`), and its tolerations against the node's taints (`TaintToleration`, and the
//! memory-pressure taint admission under pressure asks about).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Toleration};

use crate::pods::model::node_view::NodeView;

pub(super) fn required_terms(
    spec: &k8s_openapi::api::core::v1::PodSpec,
) -> Option<&k8s_openapi::api::core::v1::NodeSelector> {
    spec.affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()
}

pub(super) fn matches_node(
    selector: Option<&BTreeMap<String, String>>,
    required: Option<&k8s_openapi::api::core::v1::NodeSelector>,
    node: &NodeView,
) -> bool {
    let selector_ok = selector.is_none_or(|s| s.iter().all(|(k, v)| node.labels.get(k) == Some(v.as_str())));
    let affinity_ok = required.is_none_or(|r| {
        r.node_selector_terms.iter().any(|term| {
            let exprs = term.match_expressions.as_deref().unwrap_or_default();
            let fields = term.match_fields.as_deref().unwrap_or_default();
            if exprs.is_empty() && fields.is_empty() {
                return false;
            }
            exprs.iter().all(|e| requirement(e, node.labels.get(&e.key)))
                && fields
                    .iter()
                    .all(|f| requirement(f, (f.key == "metadata.name").then_some(node.name.as_str())))
        })
    });
    selector_ok && affinity_ok
}

fn requirement(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(number), values.first().and_then(|s| number(s))), (Some(a), Some(b)) if a > b)
        }
        "Lt" => {
            matches!((value.and_then(number), values.first().and_then(|s| number(s))), (Some(a), Some(b)) if a < b)
        }
        _ => false,
    }
}

pub(super) fn tolerates(t: &Toleration, key: &str, value: &str) -> bool {
    tolerates_effect(t, key, value, "NoExecute")
}

/// Does `t` tolerate a taint `key=value:effect`?
pub(super) fn tolerates_effect(t: &Toleration, key: &str, value: &str, effect: &str) -> bool {
    if t.effect.as_deref().is_some_and(|e| !e.is_empty() && e != effect) {
        return false;
    }
    let tkey = t.key.as_deref().unwrap_or_default();
    match t.operator.as_deref() {
        Some("Exists") => tkey.is_empty() || tkey == key,
        _ => tkey == key && t.value.as_deref().unwrap_or_default() == value,
    }
}
