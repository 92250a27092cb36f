//! The records of one fake runtime by key ([`KeyMap`]): sandboxes and containers, in key (creation) order.
//!
//! A sorted vector of keys and boxed records. A node runs a few pods, and a B-tree allocates a leaf with room
//! for eleven entries with the first; the vector grows with the records and gives its room back when the last
//! record goes.

use std::ops::Index;

/// Records by key, in key order; keys are the runtime's counter, so a new record goes at the end.
#[derive(Debug)]
pub(crate) struct KeyMap<T>(Vec<(u64, Box<T>)>);

impl<T> Default for KeyMap<T> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<T> KeyMap<T> {
    fn find(&self, key: u64) -> Result<usize, usize> {
        self.0.binary_search_by_key(&key, |(k, _)| *k)
    }

    /// The record under `key`.
    pub(crate) fn get(&self, key: &u64) -> Option<&T> {
        self.find(*key).ok().map(|i| &*self.0[i].1)
    }

    /// The record under `key`, to change.
    pub(crate) fn get_mut(&mut self, key: &u64) -> Option<&mut T> {
        self.find(*key).ok().map(|i| &mut *self.0[i].1)
    }

    /// Whether a record is under `key`.
    pub(crate) fn contains_key(&self, key: &u64) -> bool {
        self.find(*key).is_ok()
    }

    /// Puts `record` under `key`; returns the record it replaced.
    pub(crate) fn insert(&mut self, key: u64, record: Box<T>) -> Option<Box<T>> {
        match self.find(key) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, record)),
            Err(i) => {
                self.0.insert(i, (key, record));
                None
            }
        }
    }

    /// Takes the record under `key` out.
    pub(crate) fn remove(&mut self, key: &u64) -> Option<Box<T>> {
        let i = self.find(*key).ok()?;
        let (_, record) = self.0.remove(i);
        if self.0.is_empty() {
            self.0 = Vec::new();
        }
        Some(record)
    }

    /// How many records.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Keys and records, in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&u64, &T)> {
        self.0.iter().map(|(k, r)| (k, &**r))
    }

    /// The keys, in order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &u64> {
        self.0.iter().map(|(k, _)| k)
    }

    /// The records, in key order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.0.iter().map(|(_, r)| &**r)
    }
}

impl<T> Index<&u64> for KeyMap<T> {
    type Output = T;

    fn index(&self, key: &u64) -> &T {
        self.get(key).expect("a record under the key")
    }
}

#[cfg(test)]
mod tests {
    use super::KeyMap;

    #[test]
    fn keeps_key_order_and_gives_room_back() {
        let mut m = KeyMap::default();
        assert!(m.insert(5, Box::new("five")).is_none());
        assert!(m.insert(2, Box::new("two")).is_none());
        assert!(m.insert(9, Box::new("nine")).is_none());
        assert_eq!(m.insert(5, Box::new("FIVE")).as_deref(), Some(&"five"));
        assert_eq!(m.keys().copied().collect::<Vec<_>>(), [2, 5, 9]);
        assert_eq!(m.values().copied().collect::<Vec<_>>(), ["two", "FIVE", "nine"]);
        assert_eq!(m[&9], "nine");
        assert!(m.contains_key(&2) && !m.contains_key(&3));
        *m.get_mut(&2).expect("present") = "TWO";
        assert_eq!(m.iter().next(), Some((&2, &"TWO")));
        assert!(m.remove(&3).is_none());
        for k in [2, 5, 9] {
            assert!(m.remove(&k).is_some());
        }
        assert_eq!(m.len(), 0);
        assert_eq!(m.0.capacity(), 0, "an empty map holds no room");
    }
}
