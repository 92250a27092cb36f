//! The container runtime's endpoints: `containerRuntimeEndpoint` and `imageServiceEndpoint` (the former
//! when not given), unix sockets.

use crate::config::check::Check;
use crate::config::file::FileConfig;

/// `containerRuntimeEndpoint` and `imageServiceEndpoint`, checked and defaulted.
pub(super) fn endpoints(c: &mut Check<'_>, f: &FileConfig) -> (String, String) {
    let container_runtime_endpoint = f
        .container_runtime_endpoint
        .clone()
        .unwrap_or_else(|| "unix:///run/containerd/containerd.sock".into());
    for (field, ep) in [
        ("containerRuntimeEndpoint", Some(&container_runtime_endpoint)),
        ("imageServiceEndpoint", f.image_service_endpoint.as_ref()),
    ] {
        if let Some(ep) = ep
            && !ep.is_empty()
            && !ep.starts_with("unix://")
            && !ep.starts_with('/')
        {
            c.err(
                field,
                format!("{ep:?} must be a unix socket endpoint (unix:///path) or an absolute path"),
            );
        }
    }
    if container_runtime_endpoint.is_empty() {
        c.err("containerRuntimeEndpoint", "must not be empty");
    }
    let image_service_endpoint = f
        .image_service_endpoint
        .clone()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| container_runtime_endpoint.clone());
    (container_runtime_endpoint, image_service_endpoint)
}
