//! Hollow DRA drivers: a profile's `dra:` section gives each of its nodes a DRA driver of the fleet's, in
//! process. As a real driver's kubelet plugin does, it publishes the node's ResourceSlice (one pool named after
//! the node, `devices` devices `dev-0`, `dev-1`, …) and, when the node's agent prepares a claim, reads the
//! claim's allocation from the API and answers the devices allocated to it with CDI device IDs
//! (`<driver>/hollow=<device>`), after the scripted latency; releasing waits its own latency. With
//! `prepareFailures: N` the first N preparations of each claim on a node fail (the agent reports them as a
//! `FailedPrepareDynamicResources` event and tries again after its back-off), as a driver that cannot reach its
//! device yet would. The agent's own
//! DRA manager does the rest — the claim fetched and checked, the pod's containers given the devices — so the
//! scheduler's DRA plugin and the resource-claim controller meet what a cluster of real DRA nodes gives them.
//!
//! ```yaml
//! profiles:
//!   - name: gpu
//!     count: 10
//!     dra: {driver: gpu.example.com, devices: 8, prepareLatency: 200ms, unprepareLatency: 50ms}
//! ```

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::PostParams;
use node_agent::dra::{ClaimRef, Driver, Prepared, PreparedDevice, Unprepared};
use serde::Deserialize;

/// The driver name when the profile names none.
pub const DEFAULT_DRIVER: &str = "hollow.dra.node-agent.io";

fn default_driver() -> String {
    DEFAULT_DRIVER.to_owned()
}

fn default_devices() -> u32 {
    8
}

/// A profile's `dra:` section.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DraSpec {
    /// The driver's name (a DNS subdomain, as DeviceClasses select it by).
    #[serde(default = "default_driver")]
    pub driver: String,
    /// Devices per node.
    #[serde(default = "default_devices")]
    pub devices: u32,
    /// How long preparing a claim takes.
    #[serde(default, with = "crate::duration::text_opt")]
    pub prepare_latency: Option<Duration>,
    /// How long releasing a claim takes.
    #[serde(default, with = "crate::duration::text_opt")]
    pub unprepare_latency: Option<Duration>,
    /// How many times preparing each claim fails on a node before it succeeds.
    #[serde(default)]
    pub prepare_failures: u32,
}

impl DraSpec {
    /// Why the section cannot be used, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        let d = &self.driver;
        let ok = !d.is_empty()
            && d.len() <= 63
            && d.contains('.')
            && d.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !ok {
            return Err(format!(
                "dra.driver {d:?}: must be a DNS subdomain of at most 63 characters"
            ));
        }
        if self.devices == 0 || self.devices > 128 {
            return Err(format!(
                "dra.devices {}: must be 1 to 128 (one ResourceSlice)",
                self.devices
            ));
        }
        Ok(())
    }

    /// The ResourceSlice a node of this profile publishes.
    pub fn slice(&self, node: &str) -> ResourceSlice {
        let devices: Vec<serde_json::Value> = (0..self.devices)
            .map(|i| serde_json::json!({"name": format!("dev-{i}")}))
            .collect();
        let name = format!("{node}-{}", self.driver.replace('.', "-"));
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {
                "driver": self.driver,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            },
        }))
        .unwrap_or_default()
    }
}

/// Publishes `node`'s ResourceSlice (an existing one is left as it is), trying again while the API refuses.
pub async fn publish(client: kube::Client, spec: &DraSpec, node: &str) {
    let api: Api<ResourceSlice> = Api::all(client);
    let slice = spec.slice(node);
    let mut delay = Duration::from_secs(1);
    loop {
        match api.create(&PostParams::default(), &slice).await {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 409 => return,
            Err(error) => {
                tracing::warn!(%node, %error, "publishing the node's ResourceSlice; trying again");
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(60));
    }
}

/// One node's hollow DRA driver.
pub struct HollowDriver {
    client: kube::Client,
    spec: DraSpec,
    /// Failed preparations so far per claim UID, while `prepare_failures` asks for more (empty without it).
    failed: Mutex<HashMap<String, u32>>,
}

impl HollowDriver {
    /// The driver of `spec`, reading claims through `client`.
    pub fn new(client: kube::Client, spec: DraSpec) -> Self {
        Self {
            client,
            spec,
            failed: Mutex::default(),
        }
    }

    /// The scripted failure of this preparation of `uid`, if one is still due.
    fn scripted_failure(&self, uid: &str) -> Option<String> {
        let wanted = self.spec.prepare_failures;
        if wanted == 0 {
            return None;
        }
        let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        let count = failed.entry(uid.to_owned()).or_insert(0);
        if *count >= wanted {
            return None;
        }
        *count += 1;
        Some(format!("scripted failure {count} of {wanted}"))
    }
}

#[async_trait]
impl Driver for HollowDriver {
    async fn prepare(&self, claims: &[ClaimRef]) -> Result<Prepared, String> {
        if let Some(latency) = self.spec.prepare_latency {
            tokio::time::sleep(latency).await;
        }
        let mut answer = Prepared::new();
        for c in claims {
            if let Some(failure) = self.scripted_failure(&c.uid) {
                answer.insert(c.uid.clone(), Err(failure));
                continue;
            }
            let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &c.namespace);
            let result = match api.get(&c.name).await {
                Err(e) => Err(format!("fetch ResourceClaim {}: {e}", c.name)),
                Ok(claim) if claim.metadata.uid.as_deref() != Some(c.uid.as_str()) => {
                    Err(format!("ResourceClaim {} has another UID now", c.name))
                }
                Ok(claim) => Ok(claim
                    .status
                    .and_then(|s| s.allocation)
                    .and_then(|a| a.devices)
                    .and_then(|d| d.results)
                    .into_iter()
                    .flatten()
                    .filter(|r| r.driver == self.spec.driver)
                    .map(|r| PreparedDevice {
                        cdi_ids: vec![format!("{}/hollow={}", self.spec.driver, r.device)],
                        request_names: vec![r.request],
                        pool: r.pool,
                        device: r.device,
                        share_id: r.share_id,
                    })
                    .collect()),
            };
            answer.insert(c.uid.clone(), result);
        }
        Ok(answer)
    }

    async fn unprepare(&self, claims: &[ClaimRef]) -> Result<Unprepared, String> {
        if let Some(latency) = self.spec.unprepare_latency {
            tokio::time::sleep(latency).await;
        }
        if self.spec.prepare_failures > 0 {
            let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
            for c in claims {
                failed.remove(&c.uid);
            }
        }
        Ok(claims.iter().map(|c| (c.uid.clone(), Ok(()))).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_lists_the_profiles_devices_in_one_pool_named_after_the_node() {
        let spec: DraSpec =
            serde_yaml::from_str("{driver: gpu.example.com, devices: 3, prepareLatency: 200ms}").unwrap();
        assert_eq!(spec.prepare_latency, Some(Duration::from_millis(200)));
        spec.check().unwrap();
        let slice = spec.slice("hollow-7");
        assert_eq!(slice.metadata.name.as_deref(), Some("hollow-7-gpu-example-com"));
        assert_eq!(slice.spec.node_name.as_deref(), Some("hollow-7"));
        assert_eq!(slice.spec.pool.name, "hollow-7");
        let names: Vec<_> = slice.spec.devices.unwrap().into_iter().map(|d| d.name).collect();
        assert_eq!(names, ["dev-0", "dev-1", "dev-2"]);
    }

    #[test]
    fn a_driver_that_is_no_dns_subdomain_or_no_devices_is_refused() {
        let spec = |t: &str| serde_yaml::from_str::<DraSpec>(t).unwrap();
        assert!(
            spec("{driver: Bad_Name}")
                .check()
                .unwrap_err()
                .contains("DNS subdomain")
        );
        assert!(spec("{devices: 0}").check().unwrap_err().contains("1 to 128"));
        assert_eq!(spec("{}").driver, DEFAULT_DRIVER);
        assert!(serde_yaml::from_str::<DraSpec>("{devices: 2, colour: red}").is_err());
    }

    #[tokio::test]
    async fn the_first_preparations_of_each_claim_fail_as_scripted_and_a_released_claim_is_forgotten() {
        // no API server behind it: a preparation that gets past the scripted failures fails fetching the claim
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let spec: DraSpec = serde_yaml::from_str("{prepareFailures: 2}").unwrap();
        let driver = HollowDriver::new(client, spec);
        let claim = |uid: &str| ClaimRef {
            namespace: "ns".to_owned(),
            name: format!("claim-{uid}"),
            uid: uid.to_owned(),
        };
        let error_of = |answer: Prepared, uid: &str| answer[uid].clone().unwrap_err();
        let first = driver.prepare(&[claim("a"), claim("b")]).await.unwrap();
        assert_eq!(error_of(first.clone(), "a"), "scripted failure 1 of 2");
        assert_eq!(error_of(first, "b"), "scripted failure 1 of 2");
        let second = driver.prepare(&[claim("a")]).await.unwrap();
        assert_eq!(error_of(second, "a"), "scripted failure 2 of 2");
        let third = driver.prepare(&[claim("a")]).await.unwrap();
        assert!(error_of(third, "a").starts_with("fetch ResourceClaim claim-a"));
        driver.unprepare(&[claim("a"), claim("b")]).await.unwrap();
        assert!(driver.failed.lock().unwrap().is_empty());
    }
}
