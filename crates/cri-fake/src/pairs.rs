//! Compact label and annotation maps. CRI hands every object a `HashMap<String, String>`; the fake keeps each
//! map as one byte string instead: entries sorted by key, every key and value either a one-byte code for a
//! string the kubelet writes on (nearly) every pod and container, or a length-prefixed literal. A container's
//! metadata then costs one small allocation instead of a hash table and a string per key and value.

use std::collections::HashMap;

/// Strings the kubelet puts on (nearly) every sandbox and container; a code byte stands for each.
const WELL_KNOWN: &[&str] = &[
    "io.kubernetes.pod.name",
    "io.kubernetes.pod.namespace",
    "io.kubernetes.pod.uid",
    "io.kubernetes.container.name",
    "io.kubernetes.container.hash",
    "io.kubernetes.container.restartCount",
    "io.kubernetes.container.terminationMessagePath",
    "io.kubernetes.container.terminationMessagePolicy",
    "io.kubernetes.container.ports",
    "io.kubernetes.container.preStopHandler",
    "io.kubernetes.pod.terminationGracePeriod",
    "io.kubernetes.pod.deletionGracePeriod",
    "kubernetes.io/config.seen",
    "kubernetes.io/config.source",
    "kubernetes.io/config.hash",
    "kubernetes.io/config.mirror",
    "io.kubernetes.container.logpath",
    "app",
    "pod-template-hash",
    "controller-revision-hash",
    "/dev/termination-log",
    "File",
    "FallbackToLogsOnError",
    "api",
    "file",
    "http",
    "default",
    "kube-system",
    "0",
    "1",
    "30",
    "POD",
    "/var/log/pods",
];

/// Tag byte of a literal; tags above it are `WELL_KNOWN` indices + 1.
const LITERAL: u8 = 0;

fn well_known(s: &str) -> Option<usize> {
    WELL_KNOWN.iter().position(|w| *w == s)
}

fn put(out: &mut Vec<u8>, s: &str) {
    match well_known(s) {
        Some(i) => out.push(i as u8 + 1),
        None => {
            out.push(LITERAL);
            let mut len = s.len();
            loop {
                let byte = (len & 0x7f) as u8;
                len >>= 7;
                if len == 0 {
                    out.push(byte);
                    break;
                }
                out.push(byte | 0x80);
            }
            out.extend_from_slice(s.as_bytes());
        }
    }
}

/// Decode one string at the front of `bytes`, returning it and the rest.
fn take(bytes: &[u8]) -> Option<(&str, &[u8])> {
    let (&tag, mut rest) = bytes.split_first()?;
    if tag != LITERAL {
        return Some((WELL_KNOWN.get(usize::from(tag) - 1)?, rest));
    }
    let mut len = 0usize;
    let mut shift = 0;
    loop {
        let (&byte, tail) = rest.split_first()?;
        rest = tail;
        len |= usize::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            break;
        }
    }
    let (text, rest) = rest.split_at_checked(len)?;
    Some((std::str::from_utf8(text).ok()?, rest))
}

/// An immutable string map, sorted by key, encoded in one allocation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Pairs(Box<[u8]>);

/// Iterator over the entries of [`Pairs`].
#[derive(Clone)]
pub(crate) struct Iter<'a>(&'a [u8]);

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        let (key, rest) = take(self.0)?;
        let (value, rest) = take(rest)?;
        self.0 = rest;
        Some((key, value))
    }
}

impl Pairs {
    /// From a CRI map.
    pub(crate) fn from_map(map: HashMap<String, String>) -> Self {
        let mut entries: Vec<(String, String)> = map.into_iter().collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut out = Vec::with_capacity(entries.iter().map(|(k, v)| k.len() + v.len() + 4).sum());
        for (key, value) in &entries {
            put(&mut out, key);
            put(&mut out, value);
        }
        Pairs(out.into_boxed_slice())
    }

    /// Back to a CRI map.
    pub(crate) fn to_map(&self) -> HashMap<String, String> {
        self.iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
    }

    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// Whether every `key=value` of `selector` is present (the CRI label selector).
    pub(crate) fn matches(&self, selector: &HashMap<String, String>) -> bool {
        selector.iter().all(|(k, v)| self.get(k) == Some(v.as_str()))
    }

    pub(crate) fn iter(&self) -> Iter<'_> {
        Iter(&self.0)
    }
}

/// A fixed list of strings in one allocation (the encoding of [`Pairs`]); missing entries read as "".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Packed(Box<[u8]>);

impl Packed {
    pub(crate) fn new(items: &[&str]) -> Self {
        let mut out = Vec::with_capacity(items.iter().map(|s| s.len() + 2).sum());
        for item in items {
            put(&mut out, item);
        }
        Packed(out.into_boxed_slice())
    }

    pub(crate) fn get(&self, index: usize) -> &str {
        let mut rest: &[u8] = &self.0;
        for _ in 0..index {
            match take(rest) {
                Some((_, tail)) => rest = tail,
                None => return "",
            }
        }
        take(rest).map_or("", |(s, _)| s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_lookup_and_selectors() {
        let long = "x".repeat(300);
        let map: HashMap<String, String> = [
            ("app", "web"),
            ("io.kubernetes.pod.name", "p"),
            ("z", ""),
            ("ünïcode", "\0nul inside"),
            ("long", long.as_str()),
            (
                "io.kubernetes.container.terminationMessagePath",
                "/dev/termination-log",
            ),
        ]
        .map(|(k, v)| (k.into(), v.into()))
        .into();
        let pairs = Pairs::from_map(map.clone());
        assert_eq!(pairs.to_map(), map);
        assert_eq!(pairs.get("app"), Some("web"));
        assert_eq!(pairs.get("long"), Some(long.as_str()));
        assert_eq!(pairs.get("nope"), None);
        let keys: Vec<&str> = pairs.iter().map(|(k, _)| k).collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        assert_eq!(keys, sorted);
        assert!(pairs.matches(&HashMap::new()));
        assert!(pairs.matches(&[("app".into(), "web".into())].into()));
        assert!(!pairs.matches(&[("app".into(), "db".into())].into()));
        assert!(!pairs.matches(&[("app".into(), "web".into()), ("x".into(), "1".into())].into()));
        assert_eq!(Pairs::default().iter().count(), 0);
        assert!(WELL_KNOWN.len() < 255);
    }

    #[test]
    fn packed_lists() {
        let p = Packed::new(&["a", "", "default", "é"]);
        assert_eq!(
            [p.get(0), p.get(1), p.get(2), p.get(3), p.get(4)],
            ["a", "", "default", "é", ""]
        );
    }

    #[test]
    fn well_known_strings_take_one_byte() {
        let map: HashMap<String, String> = [(
            "io.kubernetes.container.terminationMessagePolicy".to_owned(),
            "File".to_owned(),
        )]
        .into();
        assert_eq!(Pairs::from_map(map).0.len(), 2);
    }
}
