//! [`FakeRuntime`]: construction, the control hooks tests and the hollow fleet use (readiness, reachability,
//! probe outcomes, logs), and the timer that turns planned transitions into pushed events.

use std::cmp::Reverse;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use runtime_api::{Code, RuntimeError};
use tokio::sync::Notify;

use crate::clock::{self, Clock};
use crate::ids::IdCodec;
use crate::images::Reference;
use crate::ipam::{CidrError, Ipam};
use crate::script::{NS_PER_SEC, Profile};
use crate::store::{CState, State};

/// The pod CIDR used when none is configured (the range of the usual bridge CNI config).
pub const DEFAULT_POD_CIDR: &str = "10.88.0.0/16";

/// How to build a [`FakeRuntime`]. Cheap to clone: the profile is shared.
#[derive(Debug, Clone)]
pub struct FakeConfig {
    /// `runtime_name` in `Version` (default `cri-fake`).
    pub runtime_name: String,
    /// `runtime_version` in `Version` (default: this crate's version).
    pub runtime_version: String,
    /// The node's pod CIDR(s), comma-separated for dual stack; `UpdateRuntimeConfig` replaces it. `None`: no
    /// pod network yet — like containerd whose CNI config is written from the node's podCIDR, `Status` reports
    /// `NetworkReady=false` (`NetworkPluginNotReady`, "Network plugin returns error: cni plugin not
    /// initialized") and pod sandboxes (other than host-network ones) fail until `UpdateRuntimeConfig` gives
    /// one. The default is [`DEFAULT_POD_CIDR`].
    pub pod_cidr: Option<String>,
    /// Runtime-wide behaviour defaults (see the crate docs for the keys).
    pub profile: Arc<Profile>,
    /// Images present from the start (references such as `registry.k8s.io/pause:3.10`).
    pub images: Vec<String>,
    /// Images present from the start and pinned (`pinned: true` in ListImages and ImageStatus, as containerd
    /// pins its sandbox image): a kubelet's image garbage collector leaves them alone.
    pub pinned_images: Vec<String>,
    /// Seed of the random draws (distributions) and of the id salt; `None` picks one at random.
    pub seed: Option<u64>,
}

impl Default for FakeConfig {
    fn default() -> Self {
        FakeConfig {
            runtime_name: "cri-fake".into(),
            runtime_version: env!("CARGO_PKG_VERSION").into(),
            pod_cidr: Some(DEFAULT_POD_CIDR.into()),
            profile: Arc::new(Profile::default()),
            images: Vec::new(),
            pinned_images: Vec::new(),
            seed: None,
        }
    }
}

/// A [`FakeConfig`] that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The pod CIDR does not parse.
    #[error("invalid pod CIDR in the fake runtime config")]
    PodCidr(#[source] CidrError),
    /// A preloaded image reference does not parse.
    #[error("invalid preloaded image reference {0:?}")]
    Image(String),
}

/// What a probe connects to, as the agent's probe transport describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeTarget<'a> {
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
    /// A gRPC health check of `service` on `port`.
    Grpc {
        /// Container port.
        port: u16,
        /// Health service name (empty for the server as a whole).
        service: &'a str,
    },
}

/// Counters of one fake runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FakeCounts {
    /// Sandboxes present (ready or not).
    pub sandboxes: usize,
    /// Containers present (any state).
    pub containers: usize,
    /// Images present.
    pub images: usize,
    /// Events delivered to subscribers so far (one per subscriber per event).
    pub events_sent: u64,
}

pub(crate) struct Inner {
    state: Mutex<State>,
    pub(crate) clock: Clock,
    /// `runtime_name` and `runtime_version` in `Version`: one copy for the runtimes of one configuration.
    pub(crate) names: Arc<Names>,
    pub(crate) profile: Arc<Profile>,
}

/// A runtime's name and version (`Version`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Names {
    pub(crate) name: Box<str>,
    pub(crate) version: Box<str>,
}

impl Names {
    /// The shared copy of `name` and `version` (a fleet makes thousands of runtimes with the same).
    fn shared(name: String, version: String) -> Arc<Names> {
        static LAST: Mutex<Option<Arc<Names>>> = Mutex::new(None);
        let names = Names {
            name: name.into(),
            version: version.into(),
        };
        let mut last = LAST.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match last.as_ref() {
            Some(kept) if **kept == names => kept.clone(),
            _ => last.insert(Arc::new(names)).clone(),
        }
    }
}

/// An in-memory CRI v1 runtime. Cheap to clone (shared state); implements [`runtime_api::Runtime`].
#[derive(Clone)]
pub struct FakeRuntime {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for FakeRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeRuntime")
            .field("name", &self.inner.names.name)
            .finish_non_exhaustive()
    }
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

impl FakeRuntime {
    /// A fake runtime. An invalid pod CIDR falls back to [`DEFAULT_POD_CIDR`] and invalid preloaded image
    /// references are skipped (both logged); use [`FakeRuntime::try_new`] to get an error instead.
    pub fn new(config: FakeConfig) -> FakeRuntime {
        let ipam = config.pod_cidr.as_deref().map(|cidr| {
            Ipam::new(cidr).unwrap_or_else(|error| {
                tracing::warn!(%error, "cri-fake: using {DEFAULT_POD_CIDR}");
                Ipam::fallback()
            })
        });
        let images = config
            .images
            .iter()
            .chain(&config.pinned_images)
            .filter_map(|image| {
                let reference = Reference::parse(image);
                if reference.is_none() {
                    tracing::warn!(image, "cri-fake: skipping invalid preloaded image reference");
                }
                reference
            })
            .collect();
        Self::build(config, ipam, images)
    }

    /// A fake runtime, or an error naming the bad configuration value.
    pub fn try_new(config: FakeConfig) -> Result<FakeRuntime, ConfigError> {
        let ipam = match config.pod_cidr.as_deref() {
            None => None,
            Some(cidr) => Some(Ipam::new(cidr).map_err(ConfigError::PodCidr)?),
        };
        let images = config
            .images
            .iter()
            .chain(&config.pinned_images)
            .map(|image| Reference::parse(image).ok_or_else(|| ConfigError::Image(image.clone())))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::build(config, ipam, images))
    }

    fn build(config: FakeConfig, ipam: Option<Ipam>, images: Vec<Reference>) -> FakeRuntime {
        let seed = config.seed.unwrap_or_else(random_seed);
        let mut state = State::new(IdCodec::new(seed.rotate_left(32) ^ 0x5bd1_e995), ipam, seed);
        for reference in &images {
            let script = config.profile.script();
            state
                .images
                .add(reference, script.image_size, script.image_user.as_deref());
        }
        for pinned in &config.pinned_images {
            state.images.pin(pinned);
        }
        FakeRuntime {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
                clock: Clock::new(),
                names: Names::shared(config.runtime_name, config.runtime_version),
                profile: config.profile,
            }),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.lock()
    }

    /// Lock, settle every transition due now, and return the state with the current time.
    pub(crate) fn settled(&self) -> (MutexGuard<'_, State>, i64) {
        let mut st = self.lock();
        let now = self.inner.clock.now();
        st.settle(now);
        (st, now)
    }

    /// Make sure the timer task runs while deadlines are pending; `earliest` wakes it for a new first deadline.
    pub(crate) fn arm(&self, st: &mut State, earliest: bool) {
        let Some(timers) = st.timers.as_deref_mut() else {
            return;
        };
        if timers.running() {
            if earliest && let Some(wake) = &timers.wake {
                wake.notify_one();
            }
            return;
        }
        if timers.deadlines.is_empty() {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let wake = Arc::clone(timers.wake.get_or_insert_with(|| Arc::new(Notify::new())));
        timers.task = Some(handle.spawn(timer(Arc::downgrade(&self.inner), wake)));
    }

    /// Report `RuntimeReady` as `ready` in `Status` (the agent turns a false one into node NotReady).
    pub fn set_runtime_ready(&self, ready: bool) {
        self.lock().runtime_ready = ready;
    }

    /// Report `NetworkReady` as `ready` in `Status`. While false, new pod sandboxes (except host-network ones)
    /// fail to set up their network, as with a runtime whose CNI plugin is not initialised.
    pub fn set_network_ready(&self, ready: bool) {
        self.lock().network_ready = ready;
    }

    /// Make every call fail with `Unavailable` (as if the runtime's socket were gone) while `false`.
    pub fn set_reachable(&self, reachable: bool) {
        self.lock().reachable = reachable;
    }

    /// The pod CIDR(s) addresses are allocated from; `None` while the runtime has none (its pod network is
    /// not ready).
    pub fn pod_cidr(&self) -> Option<String> {
        self.lock().ipam.as_ref().map(|ipam| ipam.cidrs().to_owned())
    }

    /// Counters: objects present and events delivered.
    pub fn counts(&self) -> FakeCounts {
        let (st, _) = self.settled();
        FakeCounts {
            sandboxes: st.sandboxes.len(),
            containers: st.containers.len(),
            images: st.images.len(),
            events_sent: st.events_sent,
        }
    }

    /// The outcome of a probe against a container now: `Ok(true)` when it would succeed. A container that is not
    /// running fails every probe; a running one passes unless a `probe` rule matching the target says otherwise
    /// at this time since its start. `NotFound` for an unknown container.
    pub fn probe_result(&self, container_id: &str, target: ProbeTarget<'_>) -> Result<bool, RuntimeError> {
        let (st, now) = self.settled();
        let key = st.container_key(container_id)?;
        let Some(c) = st.containers.get(&key).filter(|c| c.state == CState::Running) else {
            return Ok(false);
        };
        let (kind, port, detail) = match target {
            ProbeTarget::Http { port, path } => ("http", port, path),
            ProbeTarget::Tcp { port } => ("tcp", port, ""),
            ProbeTarget::Grpc { port, service } => ("grpc", port, service),
        };
        let elapsed = now - c.started;
        Ok(c.script
            .probes
            .iter()
            .find(|(m, _)| m.matches(kind, port, detail))
            .is_none_or(|(_, t)| t.at(elapsed) >= 0.5))
    }

    /// The container's log as CRI log lines (`<RFC 3339 time> stdout F <line>`): the scripted `logs` lines,
    /// written when the container started. `NotFound` for an unknown container.
    pub fn container_logs(&self, container_id: &str) -> Result<Vec<String>, RuntimeError> {
        let (st, _) = self.settled();
        let key = st.container_key(container_id)?;
        let Some(c) = st.containers.get(&key).filter(|c| c.state != CState::Created) else {
            return Ok(Vec::new());
        };
        let stamp = clock::rfc3339(c.started);
        Ok(c.script
            .logs
            .iter()
            .map(|line| format!("{stamp} stdout F {line}"))
            .collect())
    }

    /// Fail with `Unavailable` while the runtime is marked unreachable.
    pub(crate) fn check_reachable(&self) -> Result<(), RuntimeError> {
        if self.lock().reachable {
            Ok(())
        } else {
            Err(RuntimeError::new(
                Code::Unavailable,
                "cri-fake: runtime unreachable (set_reachable(false))",
            ))
        }
    }

    /// Wait `ns` nanoseconds of tokio time (no wait at all for zero).
    pub(crate) async fn pause(ns: i64) {
        if ns > 0 {
            tokio::time::sleep(clock::nanos(ns)).await;
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // a panic while holding the lock cannot leave the state half-updated in a way later calls trip over
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The per-runtime timer: sleeps until the earliest planned transition, settles it (pushing its events), and
/// ends when nothing is pending. Holds only a weak reference, so a dropped runtime ends it at its next wake-up.
async fn timer(runtime: Weak<Inner>, wake: Arc<Notify>) {
    loop {
        let next = {
            let Some(inner) = runtime.upgrade() else { return };
            let mut st = inner.lock();
            st.settle(inner.clock.now());
            let Some(timers) = st.timers.as_deref_mut() else {
                return;
            };
            match timers.deadlines.peek() {
                Some(Reverse((at, _))) => inner.clock.instant(*at),
                None => {
                    timers.task = None;
                    return;
                }
            }
        };
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = wake.notified() => {}
        }
    }
}

/// Seconds as nanoseconds, saturating.
pub(crate) fn secs(s: i64) -> i64 {
    s.saturating_mul(NS_PER_SEC)
}
