//! The API objects a pod's volumes, environment and sandbox name: ConfigMaps and Secrets read from the API server (as
//! the kubelet's configMap / secret managers read them), service account tokens from the TokenRequest API, and
//! the Services whose links go into containers' environment.
//!
//! This module owns [`PodObjects`], the source every worker of one agent asks, and [`ApiObjects`], its
//! implementation over the agent's client and rate limit. ConfigMaps and Secrets are read as
//! `configMapAndSecretChangeDetectionStrategy` ([`ChangeDetection`]) says: `Watch` follows each object with a watch
//! of its own ([`object_watches`](super::object_watches)), `Cache` keeps a read for the sync period, `Get` reads at
//! every use; changes reach pods at their next sync either way. Under `Cache`, one agent's reads of one object
//! are serialised, so fifty pods starting at once read it once, and an object found missing is not cached: each
//! retry of a pod waiting for it reads again.
//!
//! Services (for service links), RuntimeClasses (for a sandbox's handler) and CSIDrivers come from the node's
//! cluster-wide informers ([`ClusterInformers`]), as the kubelet's listers answer them.
//!
//! PersistentVolumeClaims and PersistentVolumes (and for CSI volumes the VolumeAttachment and the Node's volume
//! status) are read uncached, each time a claim's volume is resolved (see
//! [`claims`](crate::pods::actions::volumes::claims)): only until the volume is set up, as the kubelet's volume
//! manager reads them when it adds a pod's volume.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Secret, ServiceAccount,
};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::api::{ApiCalls, is_not_found};
use crate::informers::ClusterInformers;
pub use crate::informers::ServiceLink;
pub use crate::pods::actions::object_data::{ObjectData, ObjectError, ObjectKind};
use crate::pods::actions::object_data::{config_map_data, secret_data};
use crate::pods::actions::object_watches::ObjectWatches;
use crate::pods::actions::read_cache::ReadCache;

/// How pods' ConfigMaps and Secrets are read (`configMapAndSecretChangeDetectionStrategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeDetection {
    /// Read at every use.
    Get,
    /// A read is kept for the sync period.
    Cache,
    /// Each object followed by a watch of its own (the kubelet's default).
    Watch,
}

/// A token request for a pod.
#[derive(Debug, Clone, Copy)]
pub struct TokenFor<'a> {
    /// The pod's namespace.
    pub namespace: &'a str,
    /// The service account.
    pub service_account: &'a str,
    /// The audience (the API server's own when empty).
    pub audience: &'a str,
    /// Requested lifetime.
    pub expiration_secs: i64,
    /// The pod the token is bound to.
    pub pod_name: &'a str,
    /// Its UID.
    pub pod_uid: &'a str,
}

/// An issued token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// The JWT.
    pub token: String,
    /// When the API server says it expires.
    pub expires: Timestamp,
}

/// One copy of equal Service lists: every node of a fleet lists the same Services of a namespace (the
/// `kubernetes` Service in every one), which would otherwise be a copy per node with pods.
fn shared_links(links: Vec<ServiceLink>) -> Arc<[ServiceLink]> {
    static LINKS: crate::density::intern::Interner<[ServiceLink]> = crate::density::intern::Interner::new();
    LINKS.intern_slice(links)
}

/// Where a pod's referenced objects come from.
#[async_trait]
pub trait PodObjects: Send + Sync {
    /// The object, or `None` when it does not exist.
    async fn get(
        &self,
        kind: ObjectKind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<ObjectData>>, ObjectError>;

    /// A token for the pod's service account, bound to the pod.
    async fn token(&self, request: TokenFor<'_>) -> Result<Token, ObjectError>;

    /// Pod `uid` of `namespace` names the objects `refs` (see [`object_refs`](super::object_refs)), at each of
    /// its syncs: a source that follows objects follows these from now, and lets go of those it named before.
    fn register_pod(&self, uid: &Arc<str>, namespace: &str, refs: &[(ObjectKind, &str)]) {
        let _ = (uid, namespace, refs);
    }

    /// Pod `uid` is terminated: the objects only it named need not be followed any more.
    fn release_pod(&self, uid: &str) {
        let _ = uid;
    }

    /// The `handler` of RuntimeClass `name`, or `None` when it does not exist. A source without an API server
    /// knows no RuntimeClass.
    async fn runtime_handler(&self, name: &str) -> Result<Option<String>, ObjectError> {
        let _ = name;
        Ok(None)
    }

    /// PersistentVolumeClaim `name` of `namespace`, or `None` when it does not exist. A source without an API
    /// server knows none.
    async fn claim(&self, namespace: &str, name: &str) -> Result<Option<PersistentVolumeClaim>, ObjectError> {
        let _ = (namespace, name);
        Ok(None)
    }

    /// PersistentVolume `name`, or `None` when it does not exist.
    async fn persistent_volume(&self, name: &str) -> Result<Option<PersistentVolume>, ObjectError> {
        let _ = name;
        Ok(None)
    }

    /// CSIDriver `name`, or `None` when it does not exist.
    async fn csi_driver(&self, name: &str) -> Result<Option<CSIDriver>, ObjectError> {
        let _ = name;
        Ok(None)
    }

    /// VolumeAttachment `name`, or `None` when it does not exist.
    async fn volume_attachment(&self, name: &str) -> Result<Option<VolumeAttachment>, ObjectError> {
        let _ = name;
        Ok(None)
    }

    /// Node `name` (for its `volumesInUse` and `volumesAttached`), or `None` when it does not exist.
    async fn node(&self, name: &str) -> Result<Option<Node>, ObjectError> {
        let _ = name;
        Ok(None)
    }

    /// The Services of `namespace` that have a cluster IP, or with `name` only that one (empty when it does not
    /// exist or has none). A source without an API server has none.
    async fn services(&self, namespace: &str, name: Option<&str>) -> Result<Arc<[ServiceLink]>, ObjectError> {
        let _ = (namespace, name);
        Ok(Arc::new([]))
    }
}

/// A source with no objects and no tokens (a pod that names none never asks).
#[derive(Debug, Default)]
pub struct NoObjects;

#[async_trait]
impl PodObjects for NoObjects {
    async fn get(&self, _: ObjectKind, _: &str, _: &str) -> Result<Option<Arc<ObjectData>>, ObjectError> {
        Ok(None)
    }

    async fn token(&self, _: TokenFor<'_>) -> Result<Token, ObjectError> {
        Err(ObjectError("no API server to request a token from".into()))
    }
}

/// [`PodObjects`] over the API server, with a per-agent cache.
pub struct ApiObjects {
    client: crate::client::ApiClient,
    api: ApiCalls,
    /// With `Watch`: the objects followed (`None` under `Get` and `Cache`).
    watches: Option<ObjectWatches>,
    /// With `Cache`: how long a read is kept (zero under `Get`).
    ttl: Duration,
    /// ConfigMaps and Secrets read, under `resource/namespace/name`. An object that did not exist is not kept:
    /// a pod waiting for it reads again at its next retry, so the object's creation reaches the pod as soon as
    /// the kubelet's watch would bring it (a kept absence would hold the pod back for the whole time to live).
    cache: Mutex<ReadCache<Arc<ObjectData>>>,
    /// The node's Services, RuntimeClasses and CSIDrivers.
    informers: Arc<ClusterInformers>,
}

impl std::fmt::Debug for ApiObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiObjects")
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl ApiObjects {
    /// Reads through `client` and `api`, ConfigMaps and Secrets as `strategy` says (`Cache` keeps a read for
    /// `sync_period`; a `Watch` stops five sync periods after its last read, as the kubelet's); Services,
    /// RuntimeClasses and CSIDrivers from `informers`.
    pub fn new(
        client: impl Into<crate::client::ApiClient>,
        api: ApiCalls,
        strategy: ChangeDetection,
        sync_period: Duration,
        informers: Arc<ClusterInformers>,
    ) -> Self {
        let client = client.into();
        Self {
            watches: (strategy == ChangeDetection::Watch)
                .then(|| ObjectWatches::new(client.clone(), sync_period * 5)),
            ttl: match strategy {
                ChangeDetection::Cache => sync_period,
                ChangeDetection::Get | ChangeDetection::Watch => Duration::ZERO,
            },
            client,
            api,
            cache: Mutex::default(),
            informers,
        }
    }

    async fn fetch(&self, kind: ObjectKind, namespace: &str, name: &str) -> kube::Result<Option<ObjectData>> {
        let result = match kind {
            ObjectKind::ConfigMap => {
                let api: Api<ConfigMap> = Api::namespaced(self.client.kube(), namespace);
                self.api
                    .run("get", "configmaps", Box::pin(api.get(name)))
                    .await
                    .map(config_map_data)
            }
            ObjectKind::Secret => {
                let api: Api<Secret> = Api::namespaced(self.client.kube(), namespace);
                self.api
                    .run("get", "secrets", Box::pin(api.get(name)))
                    .await
                    .map(secret_data)
            }
        };
        match result {
            Ok(data) => Ok(Some(data)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

#[async_trait]
impl PodObjects for ApiObjects {
    async fn get(
        &self,
        kind: ObjectKind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<ObjectData>>, ObjectError> {
        if let Some(watches) = &self.watches {
            return watches.get(kind, namespace, name).await;
        }
        let key = format!("{}/{namespace}/{name}", kind.resource());
        let mut cache = self.cache.lock().await;
        let now = Instant::now();
        if let Some(data) = cache.fresh(&key, now, self.ttl) {
            return Ok(Some(data));
        }
        // the same object is fetched by every agent of a fleet (a namespace's kube-root-ca.crt for every pod's
        // service account volume): one copy of equal contents, not a CA bundle per node
        static CONTENTS: crate::density::intern::Interner<ObjectData> =
            crate::density::intern::Interner::new();
        let data = self
            .fetch(kind, namespace, name)
            .await
            .map_err(|e| ObjectError(describe(&e)))?
            .map(|data| CONTENTS.intern(data));
        // gone (or never there): a stale copy must not outlive it
        cache.put(&key, now, self.ttl, data.clone());
        Ok(data)
    }

    fn register_pod(&self, uid: &Arc<str>, namespace: &str, refs: &[(ObjectKind, &str)]) {
        if let Some(watches) = &self.watches {
            watches.register(uid, namespace, refs);
        }
    }

    fn release_pod(&self, uid: &str) {
        if let Some(watches) = &self.watches {
            watches.release(uid);
        }
    }

    async fn runtime_handler(&self, name: &str) -> Result<Option<String>, ObjectError> {
        self.informers
            .runtime_handler(name)
            .await
            .map_err(|e| ObjectError(format!("failed to lookup RuntimeClass {name}: {e}")))
    }

    async fn claim(&self, namespace: &str, name: &str) -> Result<Option<PersistentVolumeClaim>, ObjectError> {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.kube(), namespace);
        match self
            .api
            .run("get", "persistentvolumeclaims", Box::pin(api.get(name)))
            .await
        {
            Ok(claim) => Ok(Some(claim)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(ObjectError(describe(&e))),
        }
    }

    async fn csi_driver(&self, name: &str) -> Result<Option<CSIDriver>, ObjectError> {
        self.informers
            .csi_driver(name)
            .await
            .map_err(|e| ObjectError(e.to_string()))
    }

    async fn volume_attachment(&self, name: &str) -> Result<Option<VolumeAttachment>, ObjectError> {
        let api: Api<VolumeAttachment> = Api::all(self.client.kube());
        match self
            .api
            .run("get", "volumeattachments", Box::pin(api.get(name)))
            .await
        {
            Ok(attachment) => Ok(Some(attachment)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(ObjectError(describe(&e))),
        }
    }

    async fn node(&self, name: &str) -> Result<Option<Node>, ObjectError> {
        let api: Api<Node> = Api::all(self.client.kube());
        match self.api.run("get", "nodes", Box::pin(api.get(name))).await {
            Ok(node) => Ok(Some(node)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(ObjectError(describe(&e))),
        }
    }

    async fn persistent_volume(&self, name: &str) -> Result<Option<PersistentVolume>, ObjectError> {
        let api: Api<PersistentVolume> = Api::all(self.client.kube());
        match self
            .api
            .run("get", "persistentvolumes", Box::pin(api.get(name)))
            .await
        {
            Ok(pv) => Ok(Some(pv)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(ObjectError(describe(&e))),
        }
    }

    async fn services(&self, namespace: &str, name: Option<&str>) -> Result<Arc<[ServiceLink]>, ObjectError> {
        let links = match name {
            Some(name) => self
                .informers
                .service(namespace, name)
                .await
                .map(|link| link.into_iter().collect()),
            None => self.informers.services(namespace).await,
        };
        links.map(shared_links).map_err(|e| ObjectError(e.to_string()))
    }

    async fn token(&self, r: TokenFor<'_>) -> Result<Token, ObjectError> {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.kube(), r.namespace);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: (!r.audience.is_empty()).then(|| vec![r.audience.to_owned()]),
                expiration_seconds: Some(r.expiration_secs),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(r.pod_name.to_owned()),
                    uid: Some(r.pod_uid.to_owned()),
                }),
            }),
            ..Default::default()
        };
        let issued = self
            .api
            .run(
                "create",
                "serviceaccounts/token",
                Box::pin(api.create_token_request(r.service_account, &PostParams::default(), &request)),
            )
            .await
            .map_err(|e| ObjectError(describe(&e)))?;
        let status = issued.status.unwrap_or_default();
        match (status.token, status.expiration_timestamp) {
            (Some(token), Some(expires)) => Ok(Token {
                token,
                expires: expires.0,
            }),
            _ => Err(ObjectError("the token request came back without a token".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
    use kube::api::ObjectMeta;

    use super::*;

    fn service(name: &str, ip: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: Some(ip.into()),
                ports: Some(vec![ServicePort {
                    name: Some("https".into()),
                    port: 443,
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn links(services: &[Service]) -> Arc<[ServiceLink]> {
        shared_links(services.iter().filter_map(ServiceLink::from_api).collect())
    }

    #[test]
    fn nodes_listing_the_same_services_share_one_copy() {
        let listed = [service("kubernetes", "10.0.0.1"), service("headless", "None")];
        // two nodes' answers, each decoded on its own
        let (a, b) = (links(&listed), links(&listed));
        assert!(Arc::ptr_eq(&a, &b), "one copy for equal lists");
        assert_eq!(a.len(), 1, "a Service without a cluster IP has no link");
        assert_eq!(
            (a[0].name.as_str(), a[0].cluster_ip.as_str()),
            ("kubernetes", "10.0.0.1")
        );
        assert_eq!(a[0].ports, [("https".to_owned(), 443, "TCP".to_owned())]);
        let other = links(&[service("kubernetes", "10.0.0.2")]);
        assert!(!Arc::ptr_eq(&a, &other), "another list is a copy of its own");
    }
}
