//! Object ids: 64 hex characters like containerd's, derived from a per-runtime salt and a counter so the fake
//! stores a `u64` per object instead of a string, yet ids differ between runtimes and vary in their first
//! characters (short unique prefixes resolve, as with containerd).

const K: u64 = 0x9e37_79b9_7f4a_7c15;
const K_INV: u64 = inverse(K);

/// The multiplicative inverse of an odd number modulo 2^64 (Newton's iteration).
const fn inverse(k: u64) -> u64 {
    let mut inv = k;
    let mut i = 0;
    while i < 6 {
        inv = inv.wrapping_mul(2u64.wrapping_sub(k.wrapping_mul(inv)));
        i += 1;
    }
    inv
}

/// Turns object numbers into id strings and back, for one runtime.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IdCodec {
    salt: u64,
}

impl IdCodec {
    pub(crate) fn new(salt: u64) -> Self {
        IdCodec { salt }
    }

    fn head(&self, key: u64) -> u64 {
        key.wrapping_add(self.salt).wrapping_mul(K)
    }

    /// The id string of object `key`.
    pub(crate) fn render(&self, key: u64) -> String {
        let head = self.head(key);
        let tail = head ^ self.salt.rotate_left(29);
        format!(
            "{head:016x}{:016x}{tail:016x}{:016x}",
            self.salt,
            tail.wrapping_mul(K) ^ self.salt
        )
    }

    /// The object an exact id names, if it is one of ours.
    pub(crate) fn parse_exact(&self, id: &str) -> Option<u64> {
        if id.len() != 64 {
            return None;
        }
        let head = u64::from_str_radix(id.get(..16)?, 16).ok()?;
        let key = head.wrapping_mul(K_INV).wrapping_sub(self.salt);
        (self.render(key) == id).then_some(key)
    }

    /// Whether `prefix` is a prefix of the id of `key`.
    pub(crate) fn has_prefix(&self, key: u64, prefix: &str) -> bool {
        prefix.len() <= 64 && self.render(key).starts_with(prefix)
    }
}

/// Resolve an id or a unique id prefix among `keys`: exact ids are found without scanning.
pub(crate) fn resolve(
    codec: &IdCodec,
    id: &str,
    keys: impl Iterator<Item = u64>,
    exists: impl Fn(u64) -> bool,
) -> Option<u64> {
    if id.is_empty() {
        return None;
    }
    if let Some(key) = codec.parse_exact(id) {
        return exists(key).then_some(key);
    }
    if id.len() >= 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut found = None;
    for key in keys.filter(|k| codec.has_prefix(*k, id)) {
        if found.is_some() {
            return None; // ambiguous
        }
        found = Some(key);
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_differ_between_runtimes() {
        assert_eq!(K.wrapping_mul(K_INV), 1);
        let a = IdCodec::new(1);
        let b = IdCodec::new(2);
        for key in [0, 1, 2, 1000, u64::MAX] {
            let id = a.render(key);
            assert_eq!(id.len(), 64);
            assert!(id.bytes().all(|c| c.is_ascii_hexdigit()));
            assert_eq!(a.parse_exact(&id), Some(key));
            assert_eq!(b.parse_exact(&id), None, "another runtime's id is unknown here");
            assert_ne!(a.render(key), b.render(key));
        }
        assert_ne!(a.render(1)[..12], a.render(2)[..12], "prefixes vary");
        assert_eq!(a.parse_exact("zz"), None);
    }

    #[test]
    fn prefixes_resolve_when_unique() {
        let c = IdCodec::new(42);
        let keys = [1u64, 2, 3];
        let id2 = c.render(2);
        let found = resolve(&c, &id2[..12], keys.iter().copied(), |_| true);
        assert_eq!(found, Some(2));
        assert_eq!(
            resolve(&c, &id2, keys.iter().copied(), |k| k != 2),
            None,
            "removed"
        );
        assert_eq!(resolve(&c, "", keys.iter().copied(), |_| true), None);
        assert_eq!(resolve(&c, "xyz", keys.iter().copied(), |_| true), None);
        // a one-character prefix shared by all is ambiguous unless only one key exists
        let first = &id2[..1];
        let same: Vec<u64> = keys
            .iter()
            .copied()
            .filter(|k| c.render(*k).starts_with(first))
            .collect();
        let expect = if same.len() == 1 { Some(2) } else { None };
        assert_eq!(resolve(&c, first, keys.iter().copied(), |_| true), expect);
    }
}
