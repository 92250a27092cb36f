//! The Node's labels as the agent keeps them: a sorted list of shared strings instead of a map of owned ones.
//!
//! Pod admission reads node labels (nodeSelector, required node affinity), so every agent keeps the labels of
//! its Node for its whole life. Across a fleet (and on one node from one watch event to the next) the keys and
//! nearly every value are the same: they are interned, one copy for all. A value that names the node itself
//! (`kubernetes.io/hostname`) is unique by nature and kept as it is, not interned.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::density::intern::Interner;

/// The label whose value is the node's own hostname: the one value not worth sharing.
const UNIQUE_VALUE: &str = "kubernetes.io/hostname";

/// A Node's labels, sorted by key. Cheap to compare; built from the API object's map.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeLabels(Box<[(Arc<String>, Arc<String>)]>);

fn shared(s: &str) -> Arc<String> {
    static STRINGS: Interner<String> = Interner::new();
    STRINGS.intern(s.to_owned())
}

impl NodeLabels {
    /// The labels of an API object (a Node).
    pub fn of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Self {
        meta.labels.as_ref().map(Self::from).unwrap_or_default()
    }

    /// The value of `key`, if the node has it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| k.as_str().cmp(key))
            .ok()
            .map(|i| self.0[i].1.as_str())
    }

    /// Every label, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// How many labels the node has.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the node has no labels.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<&BTreeMap<String, String>> for NodeLabels {
    fn from(map: &BTreeMap<String, String>) -> Self {
        Self(
            map.iter()
                .map(|(k, v)| {
                    let value = if k == UNIQUE_VALUE {
                        Arc::new(v.clone())
                    } else {
                        shared(v)
                    };
                    (shared(k), value)
                })
                .collect(),
        )
    }
}

#[cfg(test)]
impl<const N: usize> From<[(&str, &str); N]> for NodeLabels {
    fn from(pairs: [(&str, &str); N]) -> Self {
        let map: BTreeMap<String, String> = pairs
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Self::from(&map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looks_up_in_key_order_and_shares_common_strings() {
        let a = NodeLabels::from([
            ("kubernetes.io/os", "linux"),
            ("kubernetes.io/hostname", "node-1"),
            ("zone", "a"),
        ]);
        let b = NodeLabels::from([
            ("kubernetes.io/hostname", "node-2"),
            ("kubernetes.io/os", "linux"),
        ]);
        assert_eq!(a.get("zone"), Some("a"));
        assert_eq!(a.get("kubernetes.io/hostname"), Some("node-1"));
        assert_eq!(b.get("kubernetes.io/hostname"), Some("node-2"));
        assert_eq!(b.get("zone"), None);
        let keys: Vec<&str> = a.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["kubernetes.io/hostname", "kubernetes.io/os", "zone"]);
        assert_eq!(
            (a.len(), b.is_empty(), NodeLabels::default().is_empty()),
            (3, false, true)
        );
        // "kubernetes.io/os" and "linux": one copy for both nodes; the hostnames stay each node's own
        assert!(Arc::ptr_eq(&a.0[1].0, &b.0[1].0));
        assert!(Arc::ptr_eq(&a.0[1].1, &b.0[1].1));
        assert!(Arc::ptr_eq(&a.0[0].0, &b.0[0].0));
        assert_eq!(Arc::strong_count(&a.0[0].1), 1);
    }
}
