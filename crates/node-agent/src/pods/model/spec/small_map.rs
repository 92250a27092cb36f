//! A small, read-only string map for a pod's labels and annotations.
//!
//! A `BTreeMap` allocates a whole node (eleven slots) for its first entry, and most pods carry one to
//! three labels and few annotations; this keeps exactly the pairs, sorted by key, in one allocation, none when
//! empty. The replicas of a template carry equal labels: [`SmallMap::shared`] gives them one copy.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::density::intern::Interner;

/// String pairs sorted by key, looked up by binary search.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmallMap(Option<Arc<[(String, String)]>>);

impl SmallMap {
    /// The pairs of `map`, shared with every live map equal to it (for labels, which a template's replicas
    /// share; annotations often name the pod and are copied with `From`).
    pub fn shared(map: &BTreeMap<String, String>) -> Self {
        static MAPS: Interner<[(String, String)]> = Interner::new();
        Self((!map.is_empty()).then(|| MAPS.intern_slice(pairs(map))))
    }

    fn pairs(&self) -> &[(String, String)] {
        self.0.as_deref().unwrap_or_default()
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&String> {
        let pairs = self.pairs();
        pairs
            .binary_search_by(|(k, _)| k.as_str().cmp(key))
            .ok()
            .map(|i| &pairs[i].1)
    }

    /// The pairs in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &String)> {
        self.pairs().iter().map(|(k, v)| (k, v))
    }

    /// Whether `self` and `other` are one copy (both empty counts as one).
    pub fn same_copy(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (a, b) => a.is_none() && b.is_none(),
        }
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }
}

fn pairs(map: &BTreeMap<String, String>) -> Vec<(String, String)> {
    map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

impl From<&BTreeMap<String, String>> for SmallMap {
    fn from(map: &BTreeMap<String, String>) -> Self {
        Self((!map.is_empty()).then(|| Arc::from(pairs(map))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looks_up_and_iterates_in_key_order() {
        let map: BTreeMap<String, String> = [("b", "2"), ("a", "1"), ("c", "3"), ("a", "one")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let m = SmallMap::from(&map);
        assert_eq!(m.get("a").map(String::as_str), Some("one"));
        assert_eq!(m.get("c").map(String::as_str), Some("3"));
        assert_eq!(m.get("d"), None);
        let keys: Vec<&str> = m.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c"]);
        assert!(SmallMap::default().is_empty() && SmallMap::default().get("a").is_none());
        assert!(size_of::<SmallMap>() <= 16);
        assert!(
            SmallMap::from(&BTreeMap::new()).0.is_none(),
            "an empty map allocates nothing"
        );
    }

    #[test]
    fn equal_shared_maps_are_one_copy() {
        let map: BTreeMap<String, String> = [("app".to_owned(), "web".to_owned())].into();
        let (a, b) = (SmallMap::shared(&map), SmallMap::shared(&map.clone()));
        assert!(a.same_copy(&b));
        assert_eq!(a.get("app").map(String::as_str), Some("web"));
        let own = SmallMap::from(&map);
        assert!(!a.same_copy(&own));
        assert_eq!(own, a);
        assert!(SmallMap::shared(&BTreeMap::new()).is_empty());
    }
}
