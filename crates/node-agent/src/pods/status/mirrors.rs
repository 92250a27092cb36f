//! Which pods are static (defined on the node, not in the API server) and which mirror pod stands for each in
//! the API server: a static pod's status is written to its mirror pod's object. The static pod sources fill
//! it; the status manager reads it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Static pod UIDs known to the agent, each with its mirror pod's UID once that exists.
#[derive(Debug, Clone, Default)]
pub(crate) struct Mirrors(Arc<Mutex<HashMap<String, Option<String>>>>);

/// What [`Mirrors::lookup`] knows of a pod.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum MirrorOf {
    /// Not a static pod: its status goes to its own object.
    NotStatic,
    /// A static pod without a mirror pod (yet).
    Missing,
    /// A static pod whose mirror pod has this UID.
    Mirror(String),
}

impl Mirrors {
    pub(crate) fn lookup(&self, uid: &str) -> MirrorOf {
        let Ok(map) = self.0.lock() else {
            return MirrorOf::NotStatic;
        };
        match map.get(uid) {
            None => MirrorOf::NotStatic,
            Some(None) => MirrorOf::Missing,
            Some(Some(m)) => MirrorOf::Mirror(m.clone()),
        }
    }

    /// Whether `uid` is a static pod.
    pub(crate) fn is_static(&self, uid: &str) -> bool {
        self.lookup(uid) != MirrorOf::NotStatic
    }

    pub(crate) fn add_static(&self, uid: &str) {
        if let Ok(mut map) = self.0.lock() {
            map.entry(uid.to_owned()).or_insert(None);
        }
    }

    pub(crate) fn remove_static(&self, uid: &str) {
        if let Ok(mut map) = self.0.lock() {
            map.remove(uid);
        }
    }

    /// Records the mirror of static pod `uid`; whether it changed.
    pub(crate) fn set_mirror(&self, uid: &str, mirror: Option<String>) -> bool {
        let Ok(mut map) = self.0.lock() else {
            return false;
        };
        match map.get_mut(uid) {
            Some(cur) if *cur != mirror => {
                *cur = mirror;
                true
            }
            _ => false,
        }
    }
}
