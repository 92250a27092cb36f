//! The scripted probe transport: network probes answered by a function instead of the network — how an agent
//! on an in-memory runtime (the hollow fleet, `node-agent --runtime fake`, the tests) lets that runtime's script
//! decide readiness, liveness and startup without sending a packet. The function sees only neutral types
//! ([`NetTarget`]), so the glue to a concrete runtime lives with whoever names that runtime.

use std::time::Duration;

use async_trait::async_trait;

use crate::pods::model::spec::Action;
use crate::pods::probes::{ProbeOutcome, ProbeTarget, ProbeTransport};

/// What a network probe connects to, without the host (a scripted transport answers per container).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetTarget<'a> {
    /// An HTTP GET of `path` on `port`.
    Http {
        /// Container port.
        port: u16,
        /// Request path, e.g. `/healthz`.
        path: &'a str,
    },
    /// A TCP connect to `port`.
    Tcp {
        /// Container port.
        port: u16,
    },
    /// A gRPC health check of `service` (empty: the server as a whole) on `port`.
    Grpc {
        /// Container port.
        port: u16,
        /// Health-checked service name.
        service: &'a str,
    },
}

impl<'a> NetTarget<'a> {
    /// The target of a network action; `None` for exec and sleep actions.
    pub fn of(action: &'a Action) -> Option<Self> {
        match action {
            Action::Http(get) => Some(Self::Http {
                port: get.port,
                path: &get.path,
            }),
            Action::Tcp { port, .. } => Some(Self::Tcp { port: *port }),
            Action::Grpc { port, service } => Some(Self::Grpc { port: *port, service }),
            Action::Exec(_) | Action::Sleep(_) => None,
        }
    }
}

/// A transport answering network probes from `f(container_id, target)`: `Ok(true)` passes, `Ok(false)` fails
/// (`scripted probe failure`), `Err` means the probe could not be run (ignored by the thresholds). Never
/// touches the network.
///
/// ```
/// use node_agent::pods::{NetTarget, ScriptedProbes};
/// // everything passes except HTTP probes of /ready
/// let probes = ScriptedProbes::new(|_id: &str, target: NetTarget<'_>| {
///     Ok(!matches!(target, NetTarget::Http { path: "/ready", .. }))
/// });
/// # let _ = probes;
/// ```
pub struct ScriptedProbes<F>(F);

impl<F> ScriptedProbes<F>
where
    F: Fn(&str, NetTarget<'_>) -> Result<bool, String> + Send + Sync + 'static,
{
    /// Answers with `f`.
    pub fn new(f: F) -> Self {
        Self(f)
    }
}

impl<F> std::fmt::Debug for ScriptedProbes<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScriptedProbes")
    }
}

#[async_trait]
impl<F> ProbeTransport for ScriptedProbes<F>
where
    F: Fn(&str, NetTarget<'_>) -> Result<bool, String> + Send + Sync + 'static,
{
    async fn check(&self, target: &ProbeTarget<'_>, action: &Action, _timeout: Duration) -> ProbeOutcome {
        let Some(net) = NetTarget::of(action) else {
            return ProbeOutcome::Unknown(format!("{action:?} is not a network probe"));
        };
        match (self.0)(target.container_id, net) {
            Ok(true) => ProbeOutcome::Success,
            Ok(false) => ProbeOutcome::Failure("scripted probe failure".into()),
            Err(e) => ProbeOutcome::Unknown(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::model::spec::HttpGet;

    #[tokio::test]
    async fn answers_from_the_function_per_container_and_target() {
        let probes = ScriptedProbes::new(|id: &str, t: NetTarget<'_>| match (id, t) {
            ("gone", _) => Err("container \"gone\" not found".into()),
            (_, NetTarget::Http { port: 8080, path }) => Ok(path != "/ready"),
            (_, NetTarget::Tcp { port }) => Ok(port != 5432),
            (_, NetTarget::Grpc { service, .. }) => Ok(service.is_empty()),
            _ => Ok(true),
        });
        // an address nothing may be sent to: the answers must come from the function alone
        let target = |id| ProbeTarget {
            namespace: "ns",
            pod: "p",
            container: "c",
            container_id: id,
            pod_ip: "10.128.0.7",
        };
        let http = |path: &str| {
            Action::Http(HttpGet {
                https: false,
                host: None,
                port: 8080,
                path: path.into(),
                headers: vec![],
            })
        };
        let t = Duration::from_secs(1);
        let c = target("c1");
        assert_eq!(
            probes.check(&c, &http("/healthz"), t).await,
            ProbeOutcome::Success
        );
        assert_eq!(
            probes.check(&c, &http("/ready"), t).await,
            ProbeOutcome::Failure("scripted probe failure".into())
        );
        let tcp = |port| Action::Tcp { host: None, port };
        assert_eq!(probes.check(&c, &tcp(80), t).await, ProbeOutcome::Success);
        assert!(matches!(
            probes.check(&c, &tcp(5432), t).await,
            ProbeOutcome::Failure(_)
        ));
        let grpc = |service: &str| Action::Grpc {
            port: 9090,
            service: service.into(),
        };
        assert_eq!(probes.check(&c, &grpc(""), t).await, ProbeOutcome::Success);
        assert!(matches!(
            probes.check(&c, &grpc("db"), t).await,
            ProbeOutcome::Failure(_)
        ));
        assert_eq!(
            probes.check(&target("gone"), &tcp(80), t).await,
            ProbeOutcome::Unknown("container \"gone\" not found".into())
        );
        assert!(matches!(
            probes.check(&c, &Action::Exec(vec!["true".into()]), t).await,
            ProbeOutcome::Unknown(_)
        ));
    }
}
