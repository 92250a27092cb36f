//! One copy of what many nodes or pods hold the same: a value interned here comes back as an `Arc` to the copy
//! already held, if one equal to it is still alive.
//!
//! A hollow fleet runs thousands of agents from one configuration and thousands of pods from a few templates:
//! their allocatable resources, and the volume sources of every pod of a service account (the
//! `kube-api-access` projection: token, root CA, namespace file), are equal by content. The interner keeps only
//! weak references, so a value lives as long as someone holds it; dead entries are swept when the table has
//! doubled since the last sweep.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// A table of shared values of one type.
pub struct Interner<T> {
    table: Mutex<Table<T>>,
}

struct Table<T> {
    by_hash: Option<HashMap<u64, Vec<Weak<T>>>>,
    entries: usize,
    sweep_at: usize,
}

impl<T: Hash + Eq> Interner<T> {
    /// An empty table (usable in a `static`).
    pub const fn new() -> Self {
        Self {
            table: Mutex::new(Table {
                by_hash: None,
                entries: 0,
                sweep_at: 64,
            }),
        }
    }

    /// The live copy equal to `value`, or `value` itself, now shared.
    pub fn intern(&self, value: T) -> Arc<T> {
        let mut hasher = DefaultHasher::new();
        value.hash(&mut hasher);
        let hash = hasher.finish();
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let Table {
            by_hash,
            entries,
            sweep_at,
        } = &mut *table;
        let by_hash = by_hash.get_or_insert_with(HashMap::new);
        if *entries >= *sweep_at {
            by_hash.retain(|_, copies| {
                copies.retain(|w| w.strong_count() > 0);
                !copies.is_empty()
            });
            *entries = by_hash.values().map(Vec::len).sum();
            *sweep_at = (*entries * 2).max(64);
        }
        let copies = by_hash.entry(hash).or_default();
        if let Some(shared) = copies.iter().filter_map(Weak::upgrade).find(|c| **c == value) {
            return shared;
        }
        copies.retain(|w| w.strong_count() > 0);
        let shared = Arc::new(value);
        copies.push(Arc::downgrade(&shared));
        *entries += 1;
        shared
    }

    /// How many entries (live or not yet swept) the table holds.
    pub fn len(&self) -> usize {
        self.table.lock().unwrap_or_else(PoisonError::into_inner).entries
    }

    /// Whether the table holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T: Hash + Eq> Default for Interner<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_one_copy_while_it_lives() {
        let table = Interner::new();
        let a = table.intern(String::from("kube-api-access"));
        let b = table.intern(String::from("kube-api-access"));
        let c = table.intern(String::from("other"));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        drop((a, b));
        // the old copy is gone: a new one is made
        let d = table.intern(String::from("kube-api-access"));
        assert_eq!(*d, "kube-api-access");
        assert_eq!(Arc::strong_count(&d), 1);
    }

    #[test]
    fn dead_entries_are_swept_as_the_table_grows() {
        let table = Interner::new();
        for i in 0..1_000 {
            drop(table.intern(i));
        }
        let kept: Vec<_> = (0..10).map(|i| table.intern(10_000 + i)).collect();
        assert!(table.len() <= 128, "{} entries for 10 live values", table.len());
        assert_eq!(*table.intern(10_003), 10_003);
        assert!(Arc::ptr_eq(&table.intern(10_003), &kept[3]));
    }
}
