//! The table against the JSON schema of the `k8s-openapi` types this node is built against: every field
//! reachable from `PodSpec` through walked fields is classified, no row names a field that is gone, every walked
//! field names the type its schema refers to, and every refused field is found on a pod that carries it. Also
//! `docs/pod-fields.md` against the table.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Map, Value, json};

use super::{FIELDS, Field, Handling, refusals};

const CORE: &str = "io.k8s.api.core.v1.";
const DOC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/pod-fields.md");

/// The schema's definitions of every type reachable from `Pod`, by full name.
fn definitions() -> Map<String, Value> {
    let root = schemars::SchemaGenerator::default().into_root_schema_for::<Pod>();
    let value = serde_json::to_value(root).expect("a schema serialises");
    value["$defs"].as_object().expect("the schema has $defs").clone()
}

/// The core types a property refers to (`$ref`s, also inside `items` and `allOf`), short names.
fn refs(property: &Value) -> Vec<String> {
    let text = property.to_string();
    text.match_indices("#/$defs/")
        .filter_map(|(i, _)| {
            let rest = &text[i + "#/$defs/".len()..];
            let full = &rest[..rest.find('"')?];
            full.strip_prefix(CORE).map(str::to_owned)
        })
        .collect()
}

/// What is wrong between a schema and a table; empty when they agree.
#[derive(Debug, Default, PartialEq)]
struct Report {
    unclassified: Vec<String>,
    stale: Vec<String>,
    wrong_walk: Vec<String>,
    unwalked_object: Vec<String>,
}

impl Report {
    fn is_clean(&self) -> bool {
        *self == Self::default()
    }
}

/// Walks `defs` from `PodSpec` through the table's walked fields.
fn check(defs: &Map<String, Value>, table: &[Field]) -> Report {
    let rows: BTreeMap<(&str, &str), Handling> = table.iter().map(|f| ((f.ty, f.name), f.handling)).collect();
    let mut report = Report::default();
    let mut visited = BTreeSet::new();
    let mut queue = VecDeque::from(["PodSpec".to_owned()]);
    while let Some(ty) = queue.pop_front() {
        if !visited.insert(ty.clone()) {
            continue;
        }
        let props = defs
            .get(&format!("{CORE}{ty}"))
            .and_then(|d| d.get("properties"))
            .and_then(Value::as_object);
        let Some(props) = props else {
            report.stale.push(format!("{ty} (no such type with fields)"));
            continue;
        };
        for (name, property) in props {
            let targets = refs(property);
            match rows.get(&(ty.as_str(), name.as_str())) {
                None => report.unclassified.push(format!("{ty}.{name}")),
                Some(Handling::Walk(child)) => {
                    if targets.iter().any(|t| t == child) {
                        queue.push_back((*child).to_owned());
                    } else {
                        report
                            .wrong_walk
                            .push(format!("{ty}.{name} walks {child}, the schema says {targets:?}"));
                    }
                }
                Some(Handling::Acts) if !targets.is_empty() => {
                    report.unwalked_object.push(format!("{ty}.{name} ({targets:?})"));
                }
                Some(_) => {}
            }
        }
        for row in table.iter().filter(|f| f.ty == ty) {
            if !props.contains_key(row.name) {
                report.stale.push(format!("{ty}.{}", row.name));
            }
        }
    }
    for row in table {
        if !visited.contains(row.ty) {
            report
                .stale
                .push(format!("{}.{} (type not reached)", row.ty, row.name));
        }
    }
    report
}

#[test]
fn every_field_of_the_pod_spec_is_classified() {
    let report = check(&definitions(), FIELDS);
    assert!(
        report.is_clean(),
        "the pod field table and the k8s-openapi schema disagree; decide what the node does with each: {report:#?}"
    );
}

#[test]
fn a_field_the_table_does_not_name_fails_the_check() {
    let mut defs = definitions();
    let container = defs
        .get_mut(&format!("{CORE}Container"))
        .and_then(|c| c.get_mut("properties"))
        .and_then(Value::as_object_mut)
        .expect("Container has properties");
    container.insert("futureField".into(), json!({"type": "string"}));
    let report = check(&defs, FIELDS);
    assert_eq!(report.unclassified, vec!["Container.futureField".to_owned()]);

    // a field nested below a walked one is reached too
    let probe = defs
        .get_mut(&format!("{CORE}HTTPGetAction"))
        .and_then(|c| c.get_mut("properties"))
        .and_then(Value::as_object_mut)
        .expect("HTTPGetAction has properties");
    probe.insert("tlsServerName".into(), json!({"type": "string"}));
    let report = check(&defs, FIELDS);
    assert!(
        report
            .unclassified
            .contains(&"HTTPGetAction.tlsServerName".to_owned())
    );
}

#[test]
fn a_row_for_a_field_that_is_gone_fails_the_check() {
    let mut table = FIELDS.to_vec();
    table.push(Field {
        ty: "Container",
        name: "removedField",
        handling: Handling::Acts,
    });
    table.push(Field {
        ty: "Container",
        name: "ports",
        handling: Handling::Walk("Probe"),
    });
    table.retain(|f| {
        !(f.ty == "Container" && f.name == "ports" && f.handling == Handling::Walk("ContainerPort"))
    });
    let report = check(&definitions(), &table);
    assert!(
        report.stale.contains(&"Container.removedField".to_owned()),
        "{report:#?}"
    );
    // the type no longer walked leaves its rows unreached, and the walk names the wrong type
    assert!(
        report
            .stale
            .contains(&"ContainerPort.hostPort (type not reached)".to_owned()),
        "{report:#?}"
    );
    assert_eq!(report.wrong_walk.len(), 1, "{report:#?}");
}

/// A value of `schema`'s type with its required fields filled, for building pods that deserialize.
fn minimal(defs: &Map<String, Value>, schema: &Value, depth: usize) -> Value {
    assert!(depth < 12, "the schema recurses too deep for a minimal value");
    if let Some(target) = refs_direct(schema) {
        // the two scalar types of apimachinery the pod spec uses
        if target.ends_with(".IntOrString") {
            return json!(1);
        }
        if target.ends_with(".Quantity") {
            return json!("1");
        }
        let def = &defs[&target];
        return minimal(defs, def, depth + 1);
    }
    if let Some(items) = schema
        .get("items")
        .filter(|_| schema.get("type").and_then(Value::as_str) == Some("array"))
    {
        return json!([minimal(defs, items, depth + 1)]);
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => json!("x"),
        Some("integer") => json!(1),
        Some("boolean") => json!(true),
        _ => {
            let mut out = Map::new();
            if let (Some(required), Some(props)) = (
                schema.get("required").and_then(Value::as_array),
                schema.get("properties").and_then(Value::as_object),
            ) {
                for name in required.iter().filter_map(Value::as_str) {
                    out.insert(name.to_owned(), minimal(defs, &props[name], depth + 1));
                }
            }
            Value::Object(out)
        }
    }
}

/// [`minimal`], but an object (or the object in a list) with no required field gets its first field, so the
/// value is not empty.
fn nonempty(defs: &Map<String, Value>, schema: &Value) -> Value {
    let mut value = minimal(defs, schema, 0);
    let target = match &mut value {
        Value::Array(items) => items.first_mut(),
        v => Some(v),
    };
    if let Some(Value::Object(obj)) = target
        && obj.is_empty()
    {
        let def = refs_direct(schema)
            .or_else(|| refs_direct(schema.get("items")?))
            .map(|t| defs[&t].clone())
            .unwrap_or_else(|| schema.clone());
        let (name, prop) = def["properties"]
            .as_object()
            .and_then(|p| p.iter().next())
            .expect("an object type has a field");
        obj.insert(name.clone(), minimal(defs, prop, 1));
    }
    value
}

/// The full name of the one definition `schema` is a reference to (directly or through `allOf`).
fn refs_direct(schema: &Value) -> Option<String> {
    let r = schema
        .get("$ref")
        .or_else(|| schema.get("allOf")?.get(0)?.get("$ref"))?;
    r.as_str()?.strip_prefix("#/$defs/").map(str::to_owned)
}

/// The JSON path of field names from `PodSpec` to `ty` through walked fields.
fn route(ty: &str) -> Vec<&'static str> {
    let mut parents: BTreeMap<&str, (&str, &'static str)> = BTreeMap::new();
    let mut queue = VecDeque::from(["PodSpec"]);
    while let Some(t) = queue.pop_front() {
        for row in FIELDS.iter().filter(|f| f.ty == t) {
            if let Handling::Walk(child) = row.handling
                && child != "PodSpec"
                && !parents.contains_key(child)
            {
                parents.insert(child, (t, row.name));
                queue.push_back(child);
            }
        }
    }
    let mut out = Vec::new();
    let mut at = ty;
    while at != "PodSpec" {
        let (parent, name) = parents[at];
        out.push(name);
        at = parent;
    }
    out.reverse();
    out
}

/// A pod carrying `value` at `field` of a `ty` reached from the spec, everything else minimal.
fn pod_with(defs: &Map<String, Value>, ty: &str, field: &str, value: Value) -> Pod {
    let spec_def = &defs[&format!("{CORE}PodSpec")];
    let mut spec = minimal(defs, spec_def, 0);
    let mut at = &mut spec;
    let mut at_ty = "PodSpec".to_owned();
    for name in route(ty) {
        let prop = defs[&format!("{CORE}{at_ty}")]["properties"][name].clone();
        let child = refs(&prop)
            .into_iter()
            .next()
            .expect("a walked field refers to a type");
        let obj = at.as_object_mut().expect("an object");
        if !obj.contains_key(name) {
            obj.insert(name.to_owned(), minimal(defs, &prop, 0));
        }
        at = obj.get_mut(name).expect("just set");
        if let Value::Array(items) = at {
            at = &mut items[0];
        }
        at_ty = child;
    }
    at.as_object_mut()
        .expect("an object")
        .insert(field.to_owned(), value);
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec});
    serde_json::from_value(pod).unwrap_or_else(|e| panic!("a pod with {ty}.{field} deserializes: {e}"))
}

#[test]
fn every_refused_field_is_refused_on_a_pod_that_carries_it() {
    let defs = definitions();
    let mut checked = 0;
    for row in FIELDS {
        let Handling::Refused { unless, .. } = row.handling else {
            continue;
        };
        let prop = &defs[&format!("{CORE}{}", row.ty)]["properties"][row.name];
        let mut value = nonempty(&defs, prop);
        if let Some(u) = unless {
            let harmless: Value = serde_json::from_str(u).expect("unless is JSON");
            if value == harmless {
                value = match harmless {
                    Value::Bool(b) => Value::Bool(!b),
                    _ => json!("Something"),
                };
            }
            let quiet = pod_with(&defs, row.ty, row.name, harmless);
            assert!(
                refusals(&quiet).is_empty(),
                "{}.{} = {u} must not be refused: {:?}",
                row.ty,
                row.name,
                refusals(&quiet)
            );
        }
        let pod = pod_with(&defs, row.ty, row.name, value);
        let found = refusals(&pod);
        assert!(
            found.iter().any(|r| r.path.ends_with(&format!(".{}", row.name))),
            "a pod with {}.{} set is not refused: {found:?}",
            row.ty,
            row.name
        );
        checked += 1;
    }
    assert!(checked >= 4, "only {checked} refused fields checked");
}

#[test]
fn a_plain_pod_is_refused_nothing() {
    let defs = definitions();
    let pod = pod_with(&defs, "Container", "image", json!("busybox"));
    assert_eq!(refusals(&pod), Vec::new());
}

/// The table as docs/pod-fields.md shows it.
fn rendered() -> String {
    let mut out = String::new();
    let mut ty = "";
    for row in FIELDS {
        if row.ty != ty {
            ty = row.ty;
            out.push_str(&format!(
                "\n### {ty}\n\n| field | what the node does | why |\n|---|---|---|\n"
            ));
        }
        let (what, why) = match row.handling {
            Handling::Acts => ("acts".to_owned(), String::new()),
            Handling::Walk(child) => (
                "acts".to_owned(),
                format!("its fields: [{child}](#{})", child.to_lowercase()),
            ),
            Handling::Control(why) => ("control plane".to_owned(), why.to_owned()),
            Handling::Inert(why) => ("inert on Linux".to_owned(), why.to_owned()),
            Handling::FailsMount => (
                "mount fails".to_owned(),
                "this volume kind is not mounted: `FailedMount` events, the pod stays in `ContainerCreating`"
                    .to_owned(),
            ),
            Handling::Refused { unless: None, why } => ("refused".to_owned(), why.to_owned()),
            Handling::Refused { unless: Some(u), why } => (format!("refused unless `{u}`"), why.to_owned()),
        };
        out.push_str(&format!("| `{}` | {what} | {why} |\n", row.name));
    }
    out
}

#[test]
fn the_docs_table_is_the_table() {
    let expected = rendered();
    if std::env::var_os("NODE_AGENT_WRITE_DOCS").is_some() {
        let doc = std::fs::read_to_string(DOC_PATH).expect("docs/pod-fields.md exists");
        let head = doc.find("\n### ").map_or(doc.as_str(), |i| &doc[..i]);
        std::fs::write(DOC_PATH, format!("{head}{expected}")).expect("docs/pod-fields.md written");
    }
    let doc = std::fs::read_to_string(DOC_PATH).expect("docs/pod-fields.md exists");
    assert!(
        doc.ends_with(&expected),
        "docs/pod-fields.md does not end with the table of pods::model::fields; rerun this test with \
         NODE_AGENT_WRITE_DOCS=1 to rewrite it"
    );
}
