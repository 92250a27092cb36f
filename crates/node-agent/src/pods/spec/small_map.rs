//! A small, read-only string map for a pod's labels and annotations.
//!
//! A `BTreeMap` allocates a whole node (eleven slots, ~0.5 KiB) for its first entry, and most pods carry one to
//! three labels and few annotations; this keeps exactly the pairs, sorted by key, in one allocation.

use std::collections::BTreeMap;

/// String pairs sorted by key, looked up by binary search.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmallMap(Box<[(String, String)]>);

impl SmallMap {
    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&String> {
        self.0
            .binary_search_by(|(k, _)| k.as_str().cmp(key))
            .ok()
            .map(|i| &self.0[i].1)
    }

    /// The pairs in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &String)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<&BTreeMap<String, String>> for SmallMap {
    fn from(map: &BTreeMap<String, String>) -> Self {
        Self(map.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
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
    }
}
