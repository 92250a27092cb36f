//! The cluster-wide informers a node keeps, as the kubelet keeps them ([`ClusterInformers`]): one list+watch each
//! of
//!
//! * Services with a cluster IP (`fieldSelector=spec.clusterIP!=None`: headless Services give no environment),
//!   for the service-link environment of pods;
//! * RuntimeClasses, for the handler a pod's sandbox runs with;
//! * CSIDrivers, for how a CSI volume is attached and published.
//!
//! Each is held in memory as the watch keeps it and read without asking the API server. A read made before its
//! informer's first list waits for that list (the kubelet refuses to build a pod's environment before its
//! Services are listed once); a read while the first list keeps failing gets the failure, and the pod's sync
//! retries. After the first list, a failing watch keeps what it last held and is retried with its back-off.
//!
//! A real node starts its set when its pod side starts. The nodes of a hollow fleet may share one set (they
//! would hold the same objects): the API server then serves one watch of each kind for the fleet, not one per
//! node — the fleet's traffic differs from as many kubelets' by exactly that.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::storage::v1::CSIDriver;
use serde::de::DeserializeOwned;
use tokio::task::AbortHandle;

use crate::density::lean_watch::{Change, LeanWatch};
use crate::density::watch;

/// A Service with a cluster IP, as its environment variables need it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceLink {
    /// `metadata.name`.
    pub name: String,
    /// `spec.clusterIP` (never empty nor `None`).
    pub cluster_ip: String,
    /// `spec.ports` as (name, port, protocol), in order.
    pub ports: Vec<(String, i32, String)>,
}

impl ServiceLink {
    /// The link of `svc`, or `None` for a Service without a cluster IP (headless, ExternalName).
    pub fn from_api(svc: &Service) -> Option<Self> {
        let spec = svc.spec.as_ref()?;
        let ip = spec
            .cluster_ip
            .as_deref()
            .filter(|ip| !ip.is_empty() && *ip != "None")?;
        Some(Self {
            name: svc.metadata.name.clone()?,
            cluster_ip: ip.to_owned(),
            ports: spec
                .ports
                .iter()
                .flatten()
                .map(|p| {
                    (
                        p.name.clone().unwrap_or_default(),
                        p.port,
                        p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()),
                    )
                })
                .collect(),
        })
    }
}

/// Why an informer could not answer: its first list has not succeeded.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{resource} have not yet been read at least once: {reason}")]
pub struct NotSynced {
    /// The resource, e.g. `services`.
    pub resource: &'static str,
    /// The last failure.
    pub reason: Arc<str>,
}

/// Where an informer stands.
#[derive(Debug, Clone)]
enum Phase {
    /// Its first list is under way.
    Listing,
    /// Its first list failed with this, and is retried.
    Failed(Arc<str>),
    /// Listed at least once.
    Synced,
}

/// The objects of one kind, by key, as one list+watch holds them.
struct Store<T> {
    resource: &'static str,
    items: RwLock<BTreeMap<Box<str>, T>>,
    phase: watch::Receiver<Phase>,
}

impl<T: Clone> Store<T> {
    /// Waits for the first list, then reads the objects.
    async fn read<R>(&self, f: impl FnOnce(&BTreeMap<Box<str>, T>) -> R) -> Result<R, NotSynced> {
        let mut phase = self.phase.clone();
        loop {
            let now = phase.borrow_and_update().clone();
            match now {
                Phase::Synced => break,
                Phase::Failed(reason) => {
                    return Err(NotSynced {
                        resource: self.resource,
                        reason,
                    });
                }
                Phase::Listing => {}
            }
            if phase.changed().await.is_err() {
                return Err(NotSynced {
                    resource: self.resource,
                    reason: "the informer has stopped".into(),
                });
            }
        }
        let items = self.items.read().unwrap_or_else(|e| e.into_inner());
        Ok(f(&items))
    }
}

/// The Services, RuntimeClasses and CSIDrivers of the cluster, each followed by one list+watch. The watches end
/// when the last handle is dropped.
pub struct ClusterInformers {
    /// Services with a cluster IP, under `namespace/name`.
    services: Arc<Store<ServiceLink>>,
    /// RuntimeClass handlers, under the class's name.
    runtime_classes: Arc<Store<String>>,
    /// CSIDrivers, under the driver's name.
    csi_drivers: Arc<Store<CSIDriver>>,
    tasks: [AbortHandle; 3],
}

impl std::fmt::Debug for ClusterInformers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterInformers").finish_non_exhaustive()
    }
}

impl ClusterInformers {
    /// Starts the three list+watches over `client` (on the current tokio runtime).
    pub fn start(client: impl Into<crate::client::ApiClient>) -> Arc<Self> {
        let client = client.into();
        let (services, services_task) = follow(
            LeanWatch::<Service>::new(client.clone(), "spec.clusterIP!=None"),
            "services",
            |svc: Service| {
                let key = format!(
                    "{}/{}",
                    svc.metadata.namespace.as_deref().unwrap_or_default(),
                    svc.metadata.name.as_deref().unwrap_or_default()
                );
                (key, ServiceLink::from_api(&svc))
            },
        );
        let (runtime_classes, classes_task) = follow(
            LeanWatch::<RuntimeClass>::new(client.clone(), ""),
            "runtimeclasses",
            |rc: RuntimeClass| (rc.metadata.name.unwrap_or_default(), Some(rc.handler)),
        );
        let (csi_drivers, drivers_task) = follow(
            LeanWatch::<CSIDriver>::new(client, ""),
            "csidrivers",
            |d: CSIDriver| (d.metadata.name.clone().unwrap_or_default(), Some(d)),
        );
        Arc::new(Self {
            services,
            runtime_classes,
            csi_drivers,
            tasks: [services_task, classes_task, drivers_task],
        })
    }

    /// The Services of `namespace` that have a cluster IP, by name.
    pub async fn services(&self, namespace: &str) -> Result<Vec<ServiceLink>, NotSynced> {
        // namespaces hold no `/`, and `0` follows it: the range is the namespace's keys
        let (from, to) = (format!("{namespace}/"), format!("{namespace}0"));
        self.services
            .read(|items| {
                items
                    .range::<str, _>((
                        std::ops::Bound::Included(from.as_str()),
                        std::ops::Bound::Excluded(to.as_str()),
                    ))
                    .map(|(_, link)| link.clone())
                    .collect()
            })
            .await
    }

    /// Service `namespace/name` when it has a cluster IP.
    pub async fn service(&self, namespace: &str, name: &str) -> Result<Option<ServiceLink>, NotSynced> {
        let key = format!("{namespace}/{name}");
        self.services.read(|items| items.get(key.as_str()).cloned()).await
    }

    /// The handler of RuntimeClass `name` (`None`: there is no such class).
    pub async fn runtime_handler(&self, name: &str) -> Result<Option<String>, NotSynced> {
        self.runtime_classes.read(|items| items.get(name).cloned()).await
    }

    /// CSIDriver `name` (`None`: there is none).
    pub async fn csi_driver(&self, name: &str) -> Result<Option<CSIDriver>, NotSynced> {
        self.csi_drivers.read(|items| items.get(name).cloned()).await
    }
}

impl Drop for ClusterInformers {
    fn drop(&mut self) {
        self.tasks.iter().for_each(AbortHandle::abort);
    }
}

/// Starts following the objects of `watch` into a store; `entry` gives an object's key and what is kept of it
/// (`None`: nothing, as if it did not exist).
fn follow<K, T>(
    mut watch: LeanWatch<K>,
    resource: &'static str,
    entry: fn(K) -> (String, Option<T>),
) -> (Arc<Store<T>>, AbortHandle)
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Send + 'static,
    T: Clone + Send + Sync + 'static,
{
    let (phase_tx, phase) = watch::channel(Phase::Listing);
    let store = Arc::new(Store {
        resource,
        items: RwLock::default(),
        phase,
    });
    let writer = store.clone();
    let task = tokio::spawn(async move {
        loop {
            let change = match watch.next().await {
                Ok(change) => change,
                Err(error) => {
                    tracing::warn!(resource, %error, "informer list or watch failed, retrying");
                    phase_tx.send_if_modified(|phase| match phase {
                        Phase::Listing | Phase::Failed(_) => {
                            *phase = Phase::Failed(error.to_string().into());
                            true
                        }
                        Phase::Synced => false,
                    });
                    continue;
                }
            };
            {
                let mut items = writer.items.write().unwrap_or_else(|e| e.into_inner());
                match change {
                    Change::Listed(objects) => {
                        items.clear();
                        for object in objects {
                            if let (key, Some(value)) = entry(object) {
                                items.insert(key.into(), value);
                            }
                        }
                    }
                    Change::Applied(object) => match entry(object) {
                        (key, Some(value)) => {
                            items.insert(key.into(), value);
                        }
                        (key, None) => {
                            items.remove(key.as_str());
                        }
                    },
                    Change::Deleted(object) => {
                        items.remove(entry(object).0.as_str());
                    }
                }
            }
            phase_tx.send_if_modified(|phase| {
                let first = !matches!(phase, Phase::Synced);
                *phase = Phase::Synced;
                first
            });
        }
    });
    (store, task.abort_handle())
}
