//! One control plane per test binary.
//!
//! The first caller starts it (or, when `NODE_AGENT_CONTROL_PLANE` names the directory of a control plane
//! started by `testenv up`, attaches to that one); later callers get the same. Its processes die with the
//! test binary (see [`crate::process`]). Tests must build their own clients from it, inside their own runtime.

use tokio::sync::OnceCell;

use crate::{ControlPlane, Options};

static SHARED: OnceCell<ControlPlane> = OnceCell::const_new();

/// The test binary's control plane, with default options.
pub async fn shared() -> anyhow::Result<&'static ControlPlane> {
    shared_with(Options::default()).await
}

/// The test binary's control plane; `opts` apply if this call starts it.
pub async fn shared_with(opts: Options) -> anyhow::Result<&'static ControlPlane> {
    SHARED
        .get_or_try_init(|| async move {
            match std::env::var_os("NODE_AGENT_CONTROL_PLANE") {
                Some(dir) => ControlPlane::attach(std::path::Path::new(&dir)),
                None => ControlPlane::start(opts).await,
            }
        })
        .await
}
