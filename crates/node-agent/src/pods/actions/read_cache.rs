//! The per-agent cache of API reads ([`ReadCache`]): what one agent read of ConfigMaps and Secrets, each
//! kept for a time to live.
//!
//! An agent reads a handful of objects (every pod of a namespace mounts the same `kube-root-ca.crt`), and a
//! hollow fleet holds one cache per node: the entries sit in one allocation sized to them, each under one key
//! string. A hash table would allocate buckets for several entries to hold a single one, plus a string per
//! part of the key; a lookup here walks the entries, which costs nothing next to the read it saves.

use std::time::Duration;

use tokio::time::Instant;

/// Entries read at some instant, kept for a time to live.
#[derive(Debug)]
pub(crate) struct ReadCache<V> {
    entries: Vec<(Box<str>, Instant, V)>,
}

impl<V> Default for ReadCache<V> {
    fn default() -> Self {
        Self { entries: Vec::new() }
    }
}

impl<V: Clone> ReadCache<V> {
    /// The value under `key`, when it was read less than `ttl` before `now`.
    pub(crate) fn fresh(&self, key: &str, now: Instant, ttl: Duration) -> Option<V> {
        self.entries
            .iter()
            .find(|(k, at, _)| **k == *key && now.saturating_duration_since(*at) < ttl)
            .map(|(_, _, value)| value.clone())
    }

    /// Records what a read at `now` found under `key`: `Some` is kept (unless `ttl` is zero), `None` forgets
    /// the key. Entries older than `ttl` are dropped on the way.
    pub(crate) fn put(&mut self, key: &str, now: Instant, ttl: Duration, value: Option<V>) {
        self.entries
            .retain(|(k, at, _)| **k != *key && now.saturating_duration_since(*at) < ttl);
        if let Some(value) = value.filter(|_| !ttl.is_zero()) {
            self.entries.push((key.into(), now, value));
        }
        // a push doubles the allocation: give back what the entries do not use
        self.entries.shrink_to_fit();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.entries.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(60);

    #[test]
    fn a_read_is_kept_for_its_time_to_live() {
        let start = Instant::now();
        let mut cache = ReadCache::default();
        cache.put("configmaps/default/kube-root-ca.crt", start, TTL, Some(1));
        let later = start + Duration::from_secs(59);
        assert_eq!(
            cache.fresh("configmaps/default/kube-root-ca.crt", later, TTL),
            Some(1)
        );
        assert_eq!(cache.fresh("secrets/default/kube-root-ca.crt", later, TTL), None);
        assert_eq!(
            cache.fresh("configmaps/default/kube-root-ca.crt", start + TTL, TTL),
            None
        );
    }

    #[test]
    fn a_new_read_replaces_the_old_and_an_absence_forgets_it() {
        let start = Instant::now();
        let mut cache = ReadCache::default();
        cache.put("a", start, TTL, Some(1));
        cache.put("b", start, TTL, Some(2));
        cache.put("a", start + Duration::from_secs(1), TTL, Some(3));
        assert_eq!(cache.fresh("a", start + Duration::from_secs(2), TTL), Some(3));
        assert_eq!(cache.len(), 2);
        cache.put("b", start + Duration::from_secs(3), TTL, None);
        assert_eq!(cache.fresh("b", start + Duration::from_secs(3), TTL), None);
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn stale_entries_go_at_the_next_read_and_nothing_is_kept_without_a_time_to_live() {
        let start = Instant::now();
        let mut cache = ReadCache::default();
        cache.put("a", start, TTL, Some(1));
        cache.put("b", start + TTL, TTL, Some(2));
        assert_eq!(cache.len(), 1, "the entry read a time to live ago is gone");
        cache.put("c", start + TTL, Duration::ZERO, Some(3));
        assert_eq!(cache.fresh("c", start + TTL, Duration::ZERO), None);
        assert_eq!(cache.len(), 0, "a zero time to live keeps nothing");
    }

    #[test]
    fn the_entries_take_no_more_room_than_they_need() {
        let start = Instant::now();
        let mut cache = ReadCache::default();
        for (i, key) in ["a", "b", "c"].into_iter().enumerate() {
            cache.put(key, start, TTL, Some(i));
            assert_eq!(cache.capacity(), i + 1);
        }
    }
}
