//! A pod's restart policy and a container's image pull policy, as the spec states them.

/// The pod-level restart policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    /// Restart every container whenever it exits (the default).
    Always,
    /// Restart containers that exit with a non-zero code.
    OnFailure,
    /// Never restart.
    Never,
}

impl RestartPolicy {
    pub(crate) fn parse(value: Option<&str>) -> Self {
        match value {
            Some("Never") => Self::Never,
            Some("OnFailure") => Self::OnFailure,
            _ => Self::Always,
        }
    }

    /// Whether a container that exited with `exit_code` is started again.
    pub fn restarts(self, exit_code: i32) -> bool {
        match self {
            Self::Always => true,
            Self::OnFailure => exit_code != 0,
            Self::Never => false,
        }
    }
}

/// When to pull a container's image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPolicy {
    /// Pull on every container start.
    Always,
    /// Pull only when the runtime lacks the image.
    IfNotPresent,
    /// Never pull; fail when the image is absent.
    Never,
}

impl PullPolicy {
    pub(crate) fn parse(value: Option<&str>, image: &str) -> Self {
        match value {
            Some("Always") => Self::Always,
            Some("Never") => Self::Never,
            Some("IfNotPresent") => Self::IfNotPresent,
            // the API server defaults it; mirror its rule for objects that skipped defaulting
            _ if image_tag_is_latest(image) => Self::Always,
            _ => Self::IfNotPresent,
        }
    }
}

/// Whether `image` names the `latest` tag, written or implied (no tag, no digest).
fn image_tag_is_latest(image: &str) -> bool {
    if image.contains('@') {
        return false;
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.rsplit_once(':') {
        Some((_, tag)) => tag == "latest",
        None => true,
    }
}
