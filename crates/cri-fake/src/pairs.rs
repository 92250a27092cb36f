//! Compact label and annotation maps. CRI hands every object a `HashMap<String, String>`; the fake keeps each
//! map as one byte string instead: entries sorted by key, every key and value either a one-byte code for a
//! string the kubelet writes on (nearly) every pod and container, or a length-prefixed literal. A sandbox's or
//! container's own strings, labels and annotations then cost one small allocation ([`Meta`]) instead of a hash
//! table and a string per key and value.

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
            put_len(out, s.len());
            out.extend_from_slice(s.as_bytes());
        }
    }
}

/// Decode one string at the front of `bytes`, returning it and the rest.
fn take(bytes: &[u8]) -> Option<(&str, &[u8])> {
    let (&tag, rest) = bytes.split_first()?;
    if tag != LITERAL {
        return Some((WELL_KNOWN.get(usize::from(tag) - 1)?, rest));
    }
    let (len, rest) = take_len(rest)?;
    let (text, rest) = rest.split_at_checked(len)?;
    Some((std::str::from_utf8(text).ok()?, rest))
}

/// An object's fixed strings (`N` of them), labels and annotations, encoded in one allocation: the strings,
/// then the labels' byte length and the labels, then the annotations. One allocation instead of three, and
/// one pointer in the record instead of three.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Meta<const N: usize>(Box<[u8]>);

/// A string map inside a [`Meta`]: entries sorted by key.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Pairs<'a>(&'a [u8]);

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

fn put_len(out: &mut Vec<u8>, mut len: usize) {
    loop {
        let byte = (len & 0x7f) as u8;
        len >>= 7;
        if len == 0 {
            out.push(byte);
            break;
        }
        out.push(byte | 0x80);
    }
}

fn take_len(mut bytes: &[u8]) -> Option<(usize, &[u8])> {
    let mut len = 0usize;
    let mut shift = 0;
    loop {
        let (&byte, tail) = bytes.split_first()?;
        bytes = tail;
        len |= usize::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return Some((len, bytes));
        }
    }
}

/// Appends `map`'s entries sorted by key.
fn put_map(out: &mut Vec<u8>, map: HashMap<String, String>) {
    let mut entries: Vec<(String, String)> = map.into_iter().collect();
    entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    for (key, value) in &entries {
        put(out, key);
        put(out, value);
    }
}

impl<const N: usize> Meta<N> {
    /// From the record's strings and its CRI label and annotation maps.
    pub(crate) fn new(
        strings: [&str; N],
        labels: HashMap<String, String>,
        annotations: HashMap<String, String>,
    ) -> Self {
        let mut out = Vec::new();
        for s in strings {
            put(&mut out, s);
        }
        let mut label_bytes = Vec::new();
        put_map(&mut label_bytes, labels);
        put_len(&mut out, label_bytes.len());
        out.extend_from_slice(&label_bytes);
        put_map(&mut out, annotations);
        Meta(out.into_boxed_slice())
    }

    /// String `index` (< `N`).
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

    /// The labels and the annotations.
    fn maps(&self) -> (&[u8], &[u8]) {
        let mut rest: &[u8] = &self.0;
        for _ in 0..N {
            match take(rest) {
                Some((_, tail)) => rest = tail,
                None => return (&[], &[]),
            }
        }
        match take_len(rest) {
            Some((len, rest)) if len <= rest.len() => rest.split_at(len),
            _ => (&[], &[]),
        }
    }

    pub(crate) fn labels(&self) -> Pairs<'_> {
        Pairs(self.maps().0)
    }

    pub(crate) fn annotations(&self) -> Pairs<'_> {
        Pairs(self.maps().1)
    }
}

impl<'a> Pairs<'a> {
    /// Back to a CRI map.
    pub(crate) fn to_map(self) -> HashMap<String, String> {
        self.iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
    }

    pub(crate) fn get(self, key: &str) -> Option<&'a str> {
        self.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// Whether every `key=value` of `selector` is present (the CRI label selector).
    pub(crate) fn matches(self, selector: &HashMap<String, String>) -> bool {
        selector.iter().all(|(k, v)| self.get(k) == Some(v.as_str()))
    }

    pub(crate) fn iter(self) -> Iter<'a> {
        Iter(self.0)
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
        let notes: HashMap<String, String> = [("note".to_owned(), long.clone())].into();
        let meta = Meta::<2>::new(["a", "é"], map.clone(), notes.clone());
        let pairs = meta.labels();
        assert_eq!(pairs.to_map(), map);
        assert_eq!(meta.annotations().to_map(), notes);
        assert_eq!(pairs.get("app"), Some("web"));
        assert_eq!(pairs.get("long"), Some(long.as_str()));
        assert_eq!(pairs.get("nope"), None);
        assert_eq!(
            meta.annotations().get("app"),
            None,
            "labels and annotations apart"
        );
        let keys: Vec<&str> = pairs.iter().map(|(k, _)| k).collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        assert_eq!(keys, sorted);
        assert!(pairs.matches(&HashMap::new()));
        assert!(pairs.matches(&[("app".into(), "web".into())].into()));
        assert!(!pairs.matches(&[("app".into(), "db".into())].into()));
        assert!(!pairs.matches(&[("app".into(), "web".into()), ("x".into(), "1".into())].into()));
        assert_eq!((meta.get(0), meta.get(1)), ("a", "é"));
        let empty = Meta::<1>::new([""], HashMap::new(), HashMap::new());
        assert_eq!(
            (empty.labels().iter().count(), empty.annotations().iter().count()),
            (0, 0)
        );
        assert!(WELL_KNOWN.len() < 255);
    }

    #[test]
    fn strings_before_the_maps() {
        let p = Meta::<4>::new(
            ["a", "", "default", "é"],
            HashMap::new(),
            [("k".to_owned(), "v".to_owned())].into(),
        );
        assert_eq!(
            [p.get(0), p.get(1), p.get(2), p.get(3)],
            ["a", "", "default", "é"]
        );
        assert_eq!(p.annotations().get("k"), Some("v"));
    }

    #[test]
    fn well_known_strings_take_one_byte() {
        let map: HashMap<String, String> = [(
            "io.kubernetes.container.terminationMessagePolicy".to_owned(),
            "File".to_owned(),
        )]
        .into();
        // a code for the well-known string, the labels' length, and a code each for key and value
        assert_eq!(Meta::<1>::new(["default"], map, HashMap::new()).0.len(), 4);
    }
}
