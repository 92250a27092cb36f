//! Graceful node shutdown started by the machine's shutdown, as systemd-logind announces it — the kubelet's
//! shutdown manager on Linux. node-agent holds a *delay* inhibitor lock on `shutdown`, so logind waits (up to
//! its `InhibitDelayMaxSec`) before the machine goes down; its `PrepareForShutdown(true)` signal starts the
//! pods' shutdown by priority group, and the lock is released when that is done, letting the shutdown go on.
//! `PrepareForShutdown(false)` (the shutdown called off) makes the node Ready again and takes the lock again.
//!
//! When logind's `InhibitDelayMaxSec` is shorter than the shutdown periods, it is raised as the kubelet raises
//! it: `/etc/systemd/logind.conf.d/99-kubelet.conf`, then SIGHUP to `systemd-logind.service` through systemd,
//! then the value read back until it has taken effect. A lost connection to the system bus is made again after
//! a second, as the kubelet does.
//!
//! A plain SIGTERM (a service restart, an upgrade) does not come through here: the pods keep running.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use futures::StreamExt;
use node_agent::RunningAgent;
use zbus::proxy::CacheProperties;
use zbus::zvariant::OwnedFd;

/// Where the override of logind's settings is written (the kubelet's file, so a machine switching between the
/// two keeps one).
pub const LOGIND_CONF: &str = "/etc/systemd/logind.conf.d/99-kubelet.conf";

/// How long after a lost connection to the system bus it is made again.
const RECONNECT: Duration = Duration::from_secs(1);

#[zbus::proxy(
    interface = "org.freedesktop.login1.Manager",
    default_service = "org.freedesktop.login1",
    default_path = "/org/freedesktop/login1",
    gen_blocking = false
)]
trait Login {
    /// Takes an inhibitor lock; it holds while the returned descriptor is open.
    fn inhibit(&self, what: &str, who: &str, why: &str, mode: &str) -> zbus::Result<OwnedFd>;

    /// The longest a delay lock may hold up a shutdown, µs.
    #[zbus(property, name = "InhibitDelayMaxUSec")]
    fn inhibit_delay_max_usec(&self) -> zbus::Result<u64>;

    /// Sent when the machine is about to shut down (`true`) or the shutdown was called off (`false`).
    #[zbus(signal)]
    fn prepare_for_shutdown(&self, start: bool) -> zbus::Result<()>;
}

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1",
    gen_blocking = false
)]
trait Systemd {
    /// Sends `signal` to the unit's processes (`who`: `main`, `control` or `all`).
    fn kill_unit(&self, name: &str, who: &str, signal: i32) -> zbus::Result<()>;
}

/// The kubelet's logind override file's content for a delay of `period` (whole seconds, rounded).
pub fn override_conf(period: Duration) -> String {
    let secs = period.as_secs_f64();
    format!("# node-agent (kubelet) graceful node shutdown\n[Login]\nInhibitDelayMaxSec={secs:.0}\n")
}

/// One connection to logind: the lock and the stream of its shutdown signals.
struct Session {
    login: LoginProxy<'static>,
    signals: PrepareForShutdownStream,
    lock: Option<OwnedFd>,
}

impl Session {
    /// Connects, raises logind's delay to `period` when it is shorter, subscribes to the shutdown signal and
    /// takes the lock.
    async fn open(period: Duration) -> anyhow::Result<Self> {
        let bus = zbus::Connection::system()
            .await
            .context("connecting to the system bus")?;
        let login = LoginProxy::builder(&bus)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .context("reaching systemd-logind")?;
        let delay = current_delay(&login).await?;
        if period > delay {
            raise_delay(&bus, &login, period, delay).await?;
        }
        // subscribed before the lock is taken: no shutdown can start unseen once it holds
        let signals = login
            .receive_prepare_for_shutdown()
            .await
            .context("subscribing to logind's PrepareForShutdown")?;
        let mut session = Self {
            login,
            signals,
            lock: None,
        };
        session.acquire().await?;
        Ok(session)
    }

    async fn acquire(&mut self) -> anyhow::Result<()> {
        let fd = self
            .login
            .inhibit(
                "shutdown",
                "kubelet",
                "Kubelet needs time to handle node shutdown",
                "delay",
            )
            .await
            .context("taking logind's shutdown inhibitor lock")?;
        // the new lock first, then the old one goes
        self.lock = Some(fd);
        Ok(())
    }

    /// Releases the lock: logind may go on with the shutdown.
    fn release(&mut self) {
        self.lock = None;
    }
}

async fn current_delay(login: &LoginProxy<'_>) -> anyhow::Result<Duration> {
    let usec = login
        .inhibit_delay_max_usec()
        .await
        .context("reading logind's InhibitDelayMaxUSec")?;
    Ok(Duration::from_micros(usec))
}

/// Writes the override, has logind reload its settings, and reads the delay back (100 ms, doubling, five
/// times) until it is at least `period`.
async fn raise_delay(
    bus: &zbus::Connection,
    login: &LoginProxy<'_>,
    period: Duration,
    was: Duration,
) -> anyhow::Result<()> {
    let path = Path::new(LOGIND_CONF);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, override_conf(period)).with_context(|| format!("writing {}", path.display()))?;
    SystemdProxy::new(bus)
        .await
        .context("reaching systemd")?
        .kill_unit("systemd-logind.service", "all", nix::libc::SIGHUP)
        .await
        .context("having systemd-logind reload its settings")?;
    let mut wait = Duration::from_millis(100);
    let mut now = was;
    for _ in 0..5 {
        tokio::time::sleep(wait).await;
        now = current_delay(login).await?;
        if now >= period {
            tracing::info!(was = ?was, now = ?now, conf = LOGIND_CONF, "raised logind's InhibitDelayMaxSec to the shutdown period");
            return Ok(());
        }
        wait *= 2;
    }
    bail!(
        "logind's InhibitDelayMaxSec stays {now:?} after {LOGIND_CONF} asked for {period:?} (shutdownGracePeriod); \
         another logind.conf.d file may set it later"
    )
}

/// Watches logind for the machine's shutdown and shuts the node's pods down when it comes, until dropped.
/// `period` is the total of the shutdown periods. Failures to reach logind are logged by name and tried again
/// every second; the agent runs on meanwhile (without graceful shutdown).
pub async fn watch(agent: &RunningAgent, period: Duration) {
    let mut warned = false;
    loop {
        match Session::open(period).await {
            Ok(session) => {
                tracing::info!(
                    ?period,
                    "graceful node shutdown armed: holding logind's delay inhibitor lock"
                );
                warned = false;
                follow(agent, session).await;
                tracing::warn!("the system bus connection ended; watching for the machine's shutdown again");
            }
            Err(error) if !warned => {
                tracing::error!(
                    error = format!("{error:#}"),
                    "graceful node shutdown is not armed: systemd-logind cannot be used (a machine without \
                     logind takes --shutdown-trigger=sigterm); trying again every second"
                );
                warned = true;
            }
            Err(error) => tracing::debug!(error = format!("{error:#}"), "logind still unusable"),
        }
        tokio::time::sleep(RECONNECT).await;
    }
}

/// Acts on the session's signals until its stream ends.
async fn follow(agent: &RunningAgent, mut session: Session) {
    while let Some(signal) = session.signals.next().await {
        let start = match signal.args() {
            Ok(args) => args.start,
            Err(error) => {
                tracing::error!(%error, "a PrepareForShutdown signal without its argument");
                continue;
            }
        };
        if start {
            tracing::info!("logind announces the machine's shutdown");
            agent.shut_down_pods().await;
            session.release();
            tracing::info!("pods shut down; logind's inhibitor lock released, the machine may go down");
        } else {
            tracing::info!("logind called the shutdown off");
            agent.cancel_shutdown();
            if let Err(error) = session.acquire().await {
                tracing::error!(
                    error = format!("{error:#}"),
                    "graceful node shutdown is not armed again"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_is_the_kubelets() {
        assert_eq!(
            override_conf(Duration::from_secs(30)),
            "# node-agent (kubelet) graceful node shutdown\n[Login]\nInhibitDelayMaxSec=30\n"
        );
        assert!(override_conf(Duration::from_millis(7_600)).ends_with("InhibitDelayMaxSec=8\n"));
    }
}
