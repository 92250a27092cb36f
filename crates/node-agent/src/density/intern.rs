//! One copy of what many nodes or pods hold the same: a value interned here comes back as an `Arc` to the copy
//! already held, if one equal to it is still alive.
//!
//! A hollow fleet runs thousands of agents from one configuration and thousands of pods from a few templates:
//! their allocatable resources, and the volume sources of every pod of a service account (the
//! `kube-api-access` projection: token, root CA, namespace file), are equal by content; so are the image names
//! and digests the runtime reports for their containers ([`Interner::intern_str`]). The interner keeps only
//! weak references, so a value lives as long as someone holds it; dead entries are swept when the table has
//! doubled since the last sweep.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// A table of shared values of one type.
pub struct Interner<T: ?Sized> {
    table: Mutex<Table<T>>,
}

struct Table<T: ?Sized> {
    by_hash: Option<HashMap<u64, Vec<Weak<T>>>>,
    entries: usize,
    sweep_at: usize,
}

impl<T: Hash + Eq + ?Sized> Interner<T> {
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

    /// The copies whose value hashes to `hash`, passed to `f` under the table's lock (with the count of
    /// entries, which `f` raises when it adds one); dead entries are swept first when the table has doubled.
    fn with_copies<R>(&self, hash: u64, f: impl FnOnce(&mut Vec<Weak<T>>, &mut usize) -> R) -> R {
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
        f(by_hash.entry(hash).or_default(), entries)
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

/// The live copy in `copies` equal to `value`.
fn find<T: Eq + ?Sized>(copies: &[Weak<T>], value: &T) -> Option<Arc<T>> {
    copies.iter().filter_map(Weak::upgrade).find(|c| **c == *value)
}

/// Remembers `shared` among `copies` (dropping the dead ones there) and returns it.
fn add<T: ?Sized>(copies: &mut Vec<Weak<T>>, entries: &mut usize, shared: Arc<T>) -> Arc<T> {
    copies.retain(|w| w.strong_count() > 0);
    copies.push(Arc::downgrade(&shared));
    *entries += 1;
    shared
}

fn hash_of<T: Hash + ?Sized>(value: &T) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

impl<T: Hash + Eq> Interner<T> {
    /// The live copy equal to `value`, or `value` itself, now shared.
    pub fn intern(&self, value: T) -> Arc<T> {
        self.with_copies(hash_of(&value), |copies, entries| match find(copies, &value) {
            Some(shared) => shared,
            None => add(copies, entries, Arc::new(value)),
        })
    }
}

impl Interner<str> {
    /// The live copy of `text`, or a new one (a single allocation, shared from now on).
    pub fn intern_str(&self, text: &str) -> Arc<str> {
        self.with_copies(hash_of(text), |copies, entries| match find(copies, text) {
            Some(shared) => shared,
            None => add(copies, entries, Arc::from(text)),
        })
    }
}

impl<T: Hash + Eq> Interner<[T]> {
    /// The live copy of the list `items`, or `items` itself moved into one shared allocation.
    pub fn intern_slice(&self, items: Vec<T>) -> Arc<[T]> {
        self.with_copies(hash_of(items.as_slice()), |copies, entries| {
            match find(copies, items.as_slice()) {
                Some(shared) => shared,
                None => add(copies, entries, Arc::from(items)),
            }
        })
    }
}

impl<T: Hash + Eq + ?Sized> Default for Interner<T> {
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
    fn equal_texts_share_one_allocation() {
        static TEXTS: Interner<str> = Interner::new();
        let a = TEXTS.intern_str("registry.k8s.io/pause:3.10");
        let b = TEXTS.intern_str(&String::from("registry.k8s.io/pause:3.10"));
        let c = TEXTS.intern_str("busybox");
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(&*c, "busybox");
        assert!(!Arc::ptr_eq(&a, &c));
        drop((a, b));
        let d = TEXTS.intern_str("registry.k8s.io/pause:3.10");
        assert_eq!(Arc::strong_count(&d), 1, "the old copy died with its holders");
    }

    #[test]
    fn equal_lists_share_one_allocation() {
        static LISTS: Interner<[(String, String)]> = Interner::new();
        let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        let a = LISTS.intern_slice(vec![pair("app", "web"), pair("tier", "front")]);
        let b = LISTS.intern_slice(vec![pair("app", "web"), pair("tier", "front")]);
        let c = LISTS.intern_slice(vec![pair("app", "web")]);
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(c.len(), 1);
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
