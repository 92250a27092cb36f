//! Registry credentials from a pod's `imagePullSecrets`, as the kubelet's keyring finds them: each Secret of
//! type `kubernetes.io/dockerconfigjson` (`.dockerconfigjson`, `{"auths": {...}}`) or `kubernetes.io/dockercfg`
//! (`.dockercfg`) gives entries keyed by registry (a host, optionally with a path, scheme ignored); an image
//! matches an entry when its registry host is the entry's and its repository path starts with the entry's path.
//! The puller tries each matching credential in turn, then an anonymous pull when none matched. A missing
//! secret is skipped (the kubelet logs it and pulls without it).

use std::collections::BTreeMap;

use base64::Engine;
use runtime_api::cri;
use serde::Deserialize;

use crate::pods::actions::objects::{ObjectData, ObjectKind, PodObjects};

#[derive(Debug, Default, Deserialize)]
struct Entry {
    #[serde(default)]
    auth: String,
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default, rename = "identitytoken")]
    identity_token: String,
    #[serde(default, rename = "registrytoken")]
    registry_token: String,
}

#[derive(Debug, Deserialize)]
struct DockerConfigJson {
    #[serde(default)]
    auths: BTreeMap<String, Entry>,
}

/// The registry host and repository path of an image reference (`docker.io` for a name without a host).
pub fn registry_of(image: &str) -> (String, String) {
    let name = image.split('@').next().unwrap_or(image);
    let (first, rest) = match name.split_once('/') {
        Some((first, rest)) if first.contains('.') || first.contains(':') || first == "localhost" => {
            (first.to_owned(), rest)
        }
        _ => ("docker.io".to_owned(), name),
    };
    // the tag belongs to the last path element
    let path = match rest.rsplit_once('/') {
        Some((dir, last)) => format!("{dir}/{}", last.split(':').next().unwrap_or(last)),
        None => rest.split(':').next().unwrap_or(rest).to_owned(),
    };
    (first, path)
}

/// `https://host:port/path/` → (`host:port`, `path`).
fn split_key(key: &str) -> (String, String) {
    let key = key
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .trim_end_matches('/');
    match key.split_once('/') {
        Some((host, path)) => (host.to_owned(), path.to_owned()),
        None => (key.to_owned(), String::new()),
    }
}

fn entries(data: &ObjectData) -> Vec<(String, Entry)> {
    let parsed: Option<BTreeMap<String, Entry>> = if let Some(json) = data.get(".dockerconfigjson") {
        serde_json::from_slice::<DockerConfigJson>(json)
            .ok()
            .map(|c| c.auths)
    } else if let Some(json) = data.get(".dockercfg") {
        serde_json::from_slice(json).ok()
    } else {
        None
    };
    parsed.unwrap_or_default().into_iter().collect()
}

/// The CRI credentials of one entry. `server_address` stays empty as the kubelet leaves it: containerd ignores
/// credentials whose server address does not parse as a URL of the pulled host, and a bare `host:port` does not.
fn auth_config(e: Entry) -> cri::AuthConfig {
    let (mut username, mut password) = (e.username, e.password);
    if username.is_empty()
        && let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(e.auth.trim())
        && let Ok(text) = String::from_utf8(decoded)
        && let Some((u, p)) = text.split_once(':')
    {
        username = u.to_owned();
        password = p.to_owned();
    }
    cri::AuthConfig {
        username,
        password,
        auth: e.auth,
        server_address: String::new(),
        identity_token: e.identity_token,
        registry_token: e.registry_token,
    }
}

/// The credentials of `secrets` (in `namespace`) that match `image`, most specific path first.
pub async fn credentials(
    objects: &dyn PodObjects,
    namespace: &str,
    secrets: &[String],
    image: &str,
) -> Vec<cri::AuthConfig> {
    let (host, path) = registry_of(image);
    let mut found: Vec<(usize, cri::AuthConfig)> = Vec::new();
    for name in secrets {
        let data = match objects.get(ObjectKind::Secret, namespace, name).await {
            Ok(Some(d)) => d,
            Ok(None) => {
                tracing::warn!(%namespace, secret = %name, "image pull secret not found; pulling without it");
                continue;
            }
            Err(error) => {
                tracing::warn!(%namespace, secret = %name, %error, "cannot read image pull secret");
                continue;
            }
        };
        for (key, entry) in entries(&data) {
            let (k_host, k_path) = split_key(&key);
            let host_matches = k_host == host || (k_host == "index.docker.io" && host == "docker.io");
            if host_matches
                && (k_path.is_empty() || path == k_path || path.starts_with(&format!("{k_path}/")))
            {
                found.push((k_path.len(), auth_config(entry)));
            }
        }
    }
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    found.into_iter().map(|(_, a)| a).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registries_and_paths_of_references() {
        assert_eq!(registry_of("busybox"), ("docker.io".into(), "busybox".into()));
        assert_eq!(
            registry_of("library/busybox:1.36"),
            ("docker.io".into(), "library/busybox".into())
        );
        assert_eq!(
            registry_of("127.0.0.1:5000/private/app:1"),
            ("127.0.0.1:5000".into(), "private/app".into())
        );
        assert_eq!(
            registry_of("registry.example/a/b@sha256:00"),
            ("registry.example".into(), "a/b".into())
        );
        assert_eq!(
            registry_of("localhost/busybox:local"),
            ("localhost".into(), "busybox".into())
        );
    }

    #[tokio::test]
    async fn matching_entries_from_both_secret_formats() {
        struct Two;
        #[async_trait::async_trait]
        impl PodObjects for Two {
            async fn get(
                &self,
                _: ObjectKind,
                _: &str,
                name: &str,
            ) -> Result<Option<std::sync::Arc<ObjectData>>, crate::pods::actions::objects::ObjectError>
            {
                let (key, json) = match name {
                    "json" => (
                        ".dockerconfigjson",
                        r#"{"auths": {"https://127.0.0.1:5000/private": {"auth": "YWxpY2U6c2VjcmV0"},
                                      "other.example": {"username": "x", "password": "y"}}}"#,
                    ),
                    "cfg" => (
                        ".dockercfg",
                        r#"{"127.0.0.1:5000": {"username": "bob", "password": "pw"}}"#,
                    ),
                    _ => return Ok(None),
                };
                Ok(Some(std::sync::Arc::new(
                    [(key.to_owned(), json.as_bytes().to_vec())].into(),
                )))
            }

            async fn token(
                &self,
                _: crate::pods::actions::objects::TokenFor<'_>,
            ) -> Result<crate::pods::actions::objects::Token, crate::pods::actions::objects::ObjectError>
            {
                unreachable!()
            }
        }
        let names = ["missing".to_owned(), "cfg".to_owned(), "json".to_owned()];
        let creds = credentials(&Two, "ns", &names, "127.0.0.1:5000/private/app:1").await;
        let users: Vec<(&str, &str)> = creds
            .iter()
            .map(|a| (a.username.as_str(), a.password.as_str()))
            .collect();
        assert_eq!(
            users,
            [("alice", "secret"), ("bob", "pw")],
            "the longer path first"
        );
        let creds = credentials(&Two, "ns", &names, "127.0.0.1:5000/public/app:1").await;
        assert_eq!(creds.len(), 1, "a path outside the entry's does not match");
        assert!(
            credentials(&Two, "ns", &names, "docker.io/library/busybox")
                .await
                .is_empty()
        );
    }
}
