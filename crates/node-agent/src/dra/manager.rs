//! [`DraManager`]: the claims of a pod prepared before its sandbox, their CDI devices handed to its containers,
//! and released after it ends — the kubelet's DRA manager.
//!
//! Preparing first checks everything without changing anything (each claim fetched from the API, allocated,
//! reserved for the pod, owned by it when generated from a template, every driver it names registered), so a
//! pod that cannot start leaves nothing behind to release. Then the pod is recorded on each claim and
//! checkpointed, each driver is asked for the claims not yet prepared in one call, and the devices it returns are
//! checkpointed with the claims marked prepared. A claim shared by several pods is prepared once and released
//! when the last of them ends.

use std::collections::BTreeMap;
use std::sync::Mutex;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;

use super::claims::{ClaimCache, ClaimInfo};
use super::{ClaimRef, Drivers};

/// The pod a claim is prepared for.
#[derive(Debug, Clone, Copy)]
pub struct PodRef<'a> {
    /// The pod's namespace.
    pub namespace: &'a str,
    /// Its name.
    pub name: &'a str,
    /// Its UID.
    pub uid: &'a str,
}

/// One entry of a pod's `spec.resourceClaims`, with the ResourceClaim it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodClaim {
    /// The entry's name (what containers' `resources.claims` name).
    pub name: String,
    /// The ResourceClaim.
    pub claim: ClaimName,
}

/// Which ResourceClaim a pod's claim entry stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimName {
    /// `resourceClaimName`: a claim made by the user.
    Named(String),
    /// `resourceClaimTemplateName`, with the claim generated for this pod (`status.resourceClaimStatuses`).
    Generated(String),
    /// Generated from a template, but the pod's status says no claim was needed.
    NotNeeded,
    /// Generated from a template, and the pod's status does not name the claim yet.
    NotCreatedYet,
    /// Neither a claim nor a template named.
    Unsupported,
}

/// Why preparing or releasing failed (the message is the kubelet's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DraError(pub String);

fn fail<T>(message: impl Into<String>) -> Result<T, DraError> {
    Err(DraError(message.into()))
}

/// The claims prepared on this node and the drivers that prepare them.
pub struct DraManager {
    client: kube::Client,
    drivers: Drivers,
    cache: Mutex<ClaimCache>,
}

impl std::fmt::Debug for DraManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraManager")
            .field("drivers", &self.drivers)
            .finish_non_exhaustive()
    }
}

impl DraManager {
    /// A manager fetching claims through `client`, calling the drivers in `drivers`, keeping claims in `cache`.
    pub fn new(client: kube::Client, drivers: Drivers, cache: ClaimCache) -> Self {
        Self {
            client,
            drivers,
            cache: Mutex::new(cache),
        }
    }

    /// The registered drivers.
    pub fn drivers(&self) -> &Drivers {
        &self.drivers
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, ClaimCache> {
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The claim `namespace/name` as this node knows it.
    pub fn claim(&self, namespace: &str, name: &str) -> Option<ClaimInfo> {
        self.cache().get(namespace, name).cloned()
    }

    /// Every claim this node knows.
    pub fn claims(&self) -> Vec<ClaimInfo> {
        self.cache().iter().cloned().collect()
    }

    /// Whether the pod `uid` uses a claim that is (or may be) prepared.
    pub fn might_need_unprepare(&self, uid: &str) -> bool {
        self.cache().used_by(uid)
    }

    /// Prepares the pod's claims (see the module documentation). The error says what blocks the pod; the
    /// caller tries again later.
    pub async fn prepare(&self, pod: PodRef<'_>, claims: &[PodClaim]) -> Result<(), DraError> {
        self.prepare_inner(pod, claims)
            .await
            .map_err(|e| DraError(format!("prepare dynamic resources: {e}")))
    }

    async fn prepare_inner(&self, pod: PodRef<'_>, claims: &[PodClaim]) -> Result<(), DraError> {
        // the checking pass: nothing changes until every claim is known to be usable
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), pod.namespace);
        let mut wanted: Vec<(ClaimRef, Vec<String>)> = Vec::new();
        for pc in claims {
            let (name, generated) = match &pc.claim {
                ClaimName::Named(name) => (name, false),
                ClaimName::Generated(name) => (name, true),
                ClaimName::NotNeeded => continue,
                ClaimName::NotCreatedYet => {
                    return fail(format!(
                        "pod \"{}/{}\": ResourceClaim not created yet",
                        pod.namespace, pod.name
                    ));
                }
                ClaimName::Unsupported => {
                    return fail(format!(
                        "pod \"{}/{}\", spec.resourceClaim {:?}: none of the supported fields are set",
                        pod.namespace, pod.name, pc.name
                    ));
                }
            };
            let claim = api
                .get(name)
                .await
                .map_err(|e| DraError(format!("fetch ResourceClaim {name}: {}", api_error(&e))))?;
            let uid = claim.metadata.uid.clone().unwrap_or_default();
            if generated {
                let owned = claim
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.controller == Some(true) && o.uid == pod.uid);
                if !owned {
                    return fail(format!(
                        "ResourceClaim {}/{name} was not created for Pod {}/{} (Pod is not owner)",
                        pod.namespace, pod.namespace, pod.name
                    ));
                }
            }
            let status = claim.status.as_ref();
            let reserved = status
                .and_then(|s| s.reserved_for.as_ref())
                .is_some_and(|r| r.iter().any(|c| c.uid == pod.uid));
            if !reserved {
                return fail(format!(
                    "pod {} ({}) is not allowed to use ResourceClaim {name} ({uid})",
                    pod.name, pod.uid
                ));
            }
            let Some(allocation) = status.and_then(|s| s.allocation.as_ref()) else {
                return fail(format!("ResourceClaim {name}: not allocated"));
            };
            let mut drivers: Vec<String> = allocation
                .devices
                .as_ref()
                .and_then(|d| d.results.as_ref())
                .into_iter()
                .flatten()
                .map(|r| r.driver.clone())
                .collect();
            drivers.sort();
            drivers.dedup();
            for driver in &drivers {
                if driver.is_empty() {
                    return fail("DRA driver name is empty");
                }
                if self.drivers.get(driver).is_none() {
                    return fail(format!("DRA driver {driver} is not registered"));
                }
            }
            let claim = ClaimRef {
                namespace: pod.namespace.to_owned(),
                name: name.clone(),
                uid,
            };
            wanted.push((claim, drivers));
        }
        // record the pod on each claim before any driver is called, so a restart still releases it
        let mut batches: BTreeMap<String, Vec<ClaimRef>> = BTreeMap::new();
        {
            let mut cache = self.cache();
            for (claim, drivers) in &wanted {
                match cache.get_mut(&claim.namespace, &claim.name) {
                    Some(info) if info.claim.uid != claim.uid => {
                        return fail(format!(
                            "old ResourceClaim with same name {} and different UID {} still exists (previous pod force-deleted?!)",
                            claim.name, info.claim.uid
                        ));
                    }
                    Some(info) => {
                        info.pods.insert(pod.uid.to_owned());
                    }
                    None => cache.insert(ClaimInfo {
                        claim: claim.clone(),
                        drivers: drivers.iter().map(|d| (d.clone(), Vec::new())).collect(),
                        prepared: false,
                        pods: [pod.uid.to_owned()].into(),
                    }),
                }
                let info = cache.get(&claim.namespace, &claim.name);
                if info.is_some_and(|i| !i.prepared) {
                    for driver in drivers {
                        batches.entry(driver.clone()).or_default().push(claim.clone());
                    }
                }
            }
            cache
                .save()
                .map_err(|e| DraError(format!("checkpoint ResourceClaim cache: {e}")))?;
        }
        let mut done: BTreeMap<String, ClaimRef> = BTreeMap::new();
        for (driver_name, batch) in &batches {
            let Some(driver) = self.drivers.get(driver_name) else {
                return fail(format!("DRA driver {driver_name} is not registered"));
            };
            let answer = driver
                .prepare(batch)
                .await
                .map_err(|e| DraError(format!("NodePrepareResources: {e}")))?;
            let answered = answer.len();
            for (uid, result) in answer {
                let Some(claim) = batch.iter().find(|c| c.uid == uid) else {
                    return fail(format!(
                        "NodePrepareResources returned result for unknown claim UID {uid}"
                    ));
                };
                let devices = result.map_err(|e| {
                    DraError(format!(
                        "NodePrepareResources failed for ResourceClaim {}: {e}",
                        claim.name
                    ))
                })?;
                let mut cache = self.cache();
                let Some(info) = cache.get_mut(&claim.namespace, &claim.name) else {
                    return fail(format!(
                        "internal error: unable to get claim info for ResourceClaim {} in namespace {}",
                        claim.name, claim.namespace
                    ));
                };
                info.drivers.insert(driver_name.clone(), devices);
                done.insert(claim.uid.clone(), claim.clone());
            }
            if answered != batch.len() {
                return fail(format!(
                    "NodePrepareResources skipped {} ResourceClaims",
                    batch.len().saturating_sub(answered)
                ));
            }
        }
        let mut cache = self.cache();
        for claim in done.values() {
            if let Some(info) = cache.get_mut(&claim.namespace, &claim.name) {
                info.prepared = true;
            }
        }
        cache
            .save()
            .map_err(|e| DraError(format!("checkpoint ResourceClaim state: {e}")))
    }

    /// The CDI device IDs for a container whose `resources.claims` are `uses` (pod claim name, request name;
    /// an empty request: the whole claim), in the pod's namespace with the pod's `claims`.
    pub fn cdi_devices(
        &self,
        namespace: &str,
        claims: &[PodClaim],
        uses: &[(String, String)],
    ) -> Result<Vec<String>, DraError> {
        let cache = self.cache();
        let mut ids = Vec::new();
        for pc in claims {
            let name = match &pc.claim {
                ClaimName::Named(n) | ClaimName::Generated(n) => n,
                _ => continue,
            };
            for (_, request) in uses.iter().filter(|(c, _)| *c == pc.name) {
                let Some(info) = cache.get(namespace, name) else {
                    return fail(format!(
                        "internal error: unable to get claim info for ResourceClaim {name} in namespace {namespace}"
                    ));
                };
                ids.extend(info.cdi_ids(request).map(str::to_owned));
            }
        }
        Ok(ids)
    }

    /// Releases the claims the pod `uid` uses: the pod is taken off claims other pods still use; claims it
    /// alone used are released by their drivers and forgotten. Nothing to do returns at once; the error leaves
    /// the claims recorded, to be tried again.
    pub async fn unprepare(&self, uid: &str) -> Result<(), DraError> {
        self.unprepare_inner(uid)
            .await
            .map_err(|e| DraError(format!("unprepare dynamic resources: {e}")))
    }

    async fn unprepare_inner(&self, uid: &str) -> Result<(), DraError> {
        let mut batches: BTreeMap<String, Vec<ClaimRef>> = BTreeMap::new();
        let mut last: Vec<ClaimRef> = Vec::new();
        {
            let mut cache = self.cache();
            let used: Vec<ClaimRef> = cache
                .iter()
                .filter(|c| c.pods.contains(uid))
                .map(|c| c.claim.clone())
                .collect();
            if used.is_empty() {
                return Ok(());
            }
            for claim in used {
                let Some(info) = cache.get_mut(&claim.namespace, &claim.name) else {
                    continue;
                };
                if info.pods.len() > 1 {
                    info.pods.remove(uid);
                    continue;
                }
                for driver in info.drivers.keys() {
                    batches.entry(driver.clone()).or_default().push(claim.clone());
                }
                last.push(claim);
            }
        }
        for (driver_name, batch) in &batches {
            let Some(driver) = self.drivers.get(driver_name) else {
                return fail(format!("DRA driver {driver_name} is not registered"));
            };
            let answer = driver
                .unprepare(batch)
                .await
                .map_err(|e| DraError(format!("NodeUnprepareResources: {e}")))?;
            for (claim_uid, result) in &answer {
                let Some(claim) = batch.iter().find(|c| c.uid == *claim_uid) else {
                    return fail(format!(
                        "NodeUnprepareResources returned result for unknown claim UID {claim_uid}"
                    ));
                };
                if let Err(e) = result {
                    return fail(format!(
                        "NodeUnprepareResources failed for ResourceClaim {}: {e}",
                        claim.name
                    ));
                }
            }
            if answer.len() != batch.len() {
                return fail(format!(
                    "NodeUnprepareResources skipped {} ResourceClaims",
                    batch.len().saturating_sub(answer.len())
                ));
            }
        }
        let mut cache = self.cache();
        for claim in &last {
            cache.remove(&claim.namespace, &claim.name);
        }
        cache
            .save()
            .map_err(|e| DraError(format!("checkpoint ResourceClaim state: {e}")))
    }

    /// The pods recorded on claims that are not among `active` (pods that ended while the agent was down, or
    /// whose release failed): each is released, as the kubelet's reconcile loop does. Returns the pods released.
    pub async fn release_inactive(&self, active: &dyn Fn(&str) -> bool) -> Vec<String> {
        let stale: std::collections::BTreeSet<String> = self
            .cache()
            .iter()
            .flat_map(|c| c.pods.iter())
            .filter(|uid| !active(uid))
            .cloned()
            .collect();
        let mut released = Vec::new();
        for uid in stale {
            match self.unprepare(&uid).await {
                Ok(()) => released.push(uid),
                Err(error) => {
                    tracing::warn!(pod_uid = %uid, %error, "releasing the claims of a pod that is gone")
                }
            }
        }
        released
    }
}

fn api_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}
