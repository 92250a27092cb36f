//! User namespaces of pods with `hostUsers: false`, as the kubelet's user namespace manager gives them: each such
//! pod gets its own range of 65536 host ids (container id 0 maps to the range's first host id, the same range for
//! uids and gids), out of the node's ids from 65536 on, recorded in the pod's directory (`userns`, the kubelet's
//! JSON) so the pod keeps its range across a restart of the agent and no two pods share one. Where the runtime
//! handler does not report user namespace support, the pod cannot be given one: its sandbox is not created, with
//! the kubelet's message ([`unsupported`]).
//!
//! The ranges in use are the files found in the pods directory: a pod's range is free again once its directory
//! is removed, so nothing else has to be released.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use runtime_api::cri;
use serde::{Deserialize, Serialize};

/// How many ids each pod gets (the kubelet's default `userNamespaces.idsPerPod`).
pub const IDS_PER_POD: u32 = 65536;
/// The file in a pod's directory holding its range.
pub const FILE: &str = "userns";

/// One mapping of the kubelet's file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct IdMapping {
    host_id: u32,
    container_id: u32,
    length: u32,
}

/// The kubelet's `userns` file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Mappings {
    uid_mappings: Vec<IdMapping>,
    gid_mappings: Vec<IdMapping>,
}

/// A pod's range: its first host id (container id 0 maps to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// The first host id.
    pub host_id: u32,
}

impl Range {
    /// The CRI option of a pod with its own user namespace.
    pub fn cri(self) -> cri::UserNamespace {
        let map = vec![cri::IdMapping {
            host_id: self.host_id,
            container_id: 0,
            length: IDS_PER_POD,
        }];
        cri::UserNamespace {
            mode: cri::NamespaceMode::Pod as i32,
            uids: map.clone(),
            gids: map,
        }
    }
}

/// The kubelet's message when the runtime handler (`""`: the default one) does not support user namespaces.
pub fn unsupported(handler: &str) -> String {
    if handler.is_empty() {
        "can't set `spec.hostUsers: false`, runtime does not support user namespaces".to_owned()
    } else {
        format!(
            "can't set `spec.hostUsers: false`, RuntimeClass handler {handler:?} does not support user namespaces"
        )
    }
}

/// Whether `handler` supports user namespaces by the handlers and features the runtime's `Status` reported; an
/// error names a handler the runtime did not list, as the kubelet's.
pub fn handler_supports(handlers: &[cri::RuntimeHandler], handler: &str) -> Result<bool, String> {
    if handlers.is_empty() {
        // a runtime too old to list its handlers
        return Ok(false);
    }
    handlers
        .iter()
        .find(|h| h.name == handler)
        .map(|h| h.features.as_ref().is_some_and(|f| f.user_namespaces))
        .ok_or_else(|| format!("the handler {handler:?} is not known"))
}

fn read(file: &Path) -> Result<Option<Range>, String> {
    let text = match std::fs::read(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("user namespace: {e}")),
    };
    let m: Mappings = serde_json::from_slice(&text)
        .map_err(|e| format!("user namespace: invalid user namespace mappings file: {e}"))?;
    let [uid] = m.uid_mappings[..] else {
        return Err(
            "user namespace: invalid user namespace configuration: no more than one mapping allowed.".into(),
        );
    };
    if m.gid_mappings != [uid] {
        return Err(
            "user namespace: invalid user namespace configuration: GID and UID mapping should be identical"
                .into(),
        );
    }
    if uid.container_id != 0 {
        return Err("user namespace: invalid user namespace configuration: UID 0 must be mapped".into());
    }
    if uid.length != IDS_PER_POD || uid.host_id % IDS_PER_POD != 0 || uid.host_id == 0 {
        return Err(format!(
            "user namespace: wrong user namespace range {}+{}",
            uid.host_id, uid.length
        ));
    }
    Ok(Some(Range { host_id: uid.host_id }))
}

/// Allocations are made one at a time across the process (agents of one process have pods directories of their
/// own; the lock is held for a directory scan).
static ALLOCATING: Mutex<()> = Mutex::new(());

/// The range of pod `uid` under `pods_dir`: the one recorded in its directory, else the lowest free one, recorded
/// there before it is returned.
pub fn get_or_allocate(pods_dir: &Path, uid: &str) -> Result<Range, String> {
    let _one_at_a_time = ALLOCATING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = pods_dir.join(uid);
    let file = dir.join(FILE);
    if let Some(r) = read(&file)? {
        return Ok(r);
    }
    let mut used = std::collections::BTreeSet::new();
    if let Ok(entries) = std::fs::read_dir(pods_dir) {
        for e in entries.flatten() {
            // a file that cannot be read holds no range this pod could take safely, but neither does it name one
            if let Ok(Some(r)) = read(&e.path().join(FILE)) {
                used.insert(r.host_id / IDS_PER_POD);
            }
        }
    }
    let slot = (1..=u32::MAX / IDS_PER_POD)
        .find(|s| !used.contains(s))
        .ok_or("create user namespace: could not find an empty slot to allocate a user namespace")?;
    let range = Range {
        host_id: slot * IDS_PER_POD,
    };
    let map = IdMapping {
        host_id: range.host_id,
        container_id: 0,
        length: IDS_PER_POD,
    };
    let text = serde_json::to_vec(&Mappings {
        uid_mappings: vec![map],
        gid_mappings: vec![map],
    })
    .map_err(|e| e.to_string())?;
    write(&dir, &file, &text).map_err(|e| format!("create user namespace: {e}"))?;
    Ok(range)
}

fn write(dir: &Path, file: &PathBuf, text: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{FILE}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, file)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Puts the pod's user namespace into a sandbox config.
pub fn apply_to_sandbox(config: &mut cri::PodSandboxConfig, ns: &cri::UserNamespace) {
    if let Some(options) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
    {
        options.userns_options = Some(ns.clone());
    }
}

/// Puts the pod's user namespace into a container config, and its mappings onto every mount (idmapped mounts,
/// so the files of volumes keep their owners as the container sees them), as the kubelet does.
pub fn apply_to_container(config: &mut cri::ContainerConfig, ns: &cri::UserNamespace) {
    if let Some(options) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
    {
        options.userns_options = Some(ns.clone());
    }
    for m in &mut config.mounts {
        m.uid_mappings = ns.uids.clone();
        m.gid_mappings = ns.gids.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_kept_per_pod_and_never_shared() {
        let dir = tempfile::tempdir().unwrap();
        let a = get_or_allocate(dir.path(), "a").unwrap();
        let b = get_or_allocate(dir.path(), "b").unwrap();
        assert_eq!((a.host_id, b.host_id), (65536, 131072));
        assert_eq!(
            get_or_allocate(dir.path(), "a").unwrap(),
            a,
            "read back from the pod's directory"
        );
        let text = std::fs::read_to_string(dir.path().join("a").join(FILE)).unwrap();
        assert_eq!(
            text,
            r#"{"uidMappings":[{"hostId":65536,"containerId":0,"length":65536}],"gidMappings":[{"hostId":65536,"containerId":0,"length":65536}]}"#
        );
        std::fs::remove_dir_all(dir.path().join("a")).unwrap();
        assert_eq!(
            get_or_allocate(dir.path(), "c").unwrap(),
            a,
            "a removed pod's range is free again"
        );
        let ns = b.cri();
        assert_eq!(ns.mode, cri::NamespaceMode::Pod as i32);
        assert_eq!((ns.uids[0].host_id, ns.uids[0].length), (131072, 65536));
        assert_eq!(ns.uids, ns.gids);
        std::fs::write(
            dir.path().join("b").join(FILE),
            r#"{"uidMappings":[],"gidMappings":[]}"#,
        )
        .unwrap();
        let err = get_or_allocate(dir.path(), "b").unwrap_err();
        assert!(err.contains("no more than one mapping allowed"), "{err}");
    }

    #[test]
    fn support_is_read_per_handler() {
        let handler = |name: &str, userns: bool| cri::RuntimeHandler {
            name: name.into(),
            features: Some(cri::RuntimeHandlerFeatures {
                user_namespaces: userns,
                ..Default::default()
            }),
        };
        let handlers = [handler("", true), handler("runc", true), handler("kata", false)];
        assert_eq!(handler_supports(&handlers, ""), Ok(true));
        assert_eq!(handler_supports(&handlers, "kata"), Ok(false));
        assert_eq!(
            handler_supports(&handlers, "gvisor"),
            Err("the handler \"gvisor\" is not known".into())
        );
        assert_eq!(
            handler_supports(&[], ""),
            Ok(false),
            "a runtime that lists no handlers"
        );
        assert_eq!(
            unsupported(""),
            "can't set `spec.hostUsers: false`, runtime does not support user namespaces"
        );
        assert_eq!(
            unsupported("kata"),
            "can't set `spec.hostUsers: false`, RuntimeClass handler \"kata\" does not support user namespaces"
        );
    }
}
