//! Waiting for RBAC bindings a test has just made to take effect. The API server authenticates bootstrap tokens
//! from a Secret informer and authorizes from RBAC informers, so a request made right after the Secret or the
//! binding was created may still meet a 401 or a 403. Tests whose subject under test gives up on such an answer
//! (a node's TLS bootstrap exits on a refused request, as the kubelet's does) wait here first.

use std::time::{Duration, Instant};

use anyhow::bail;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;

/// The attributes of `verb` on `resource` (and `subresource`) in API group `group`, cluster-wide.
pub fn attributes(group: &str, resource: &str, subresource: Option<&str>, verb: &str) -> ResourceAttributes {
    ResourceAttributes {
        group: Some(group.into()),
        resource: Some(resource.into()),
        subresource: subresource.map(str::to_owned),
        verb: Some(verb.into()),
        ..Default::default()
    }
}

/// What a bootstrapping node needs: to file certificate signing requests, and to have its `nodeclient` requests
/// approved (what the controller-manager's approver asks the authorizer on its behalf).
pub fn node_bootstrap() -> [ResourceAttributes; 2] {
    let csrs = |subresource| {
        attributes(
            "certificates.k8s.io",
            "certificatesigningrequests",
            subresource,
            "create",
        )
    };
    [csrs(None), csrs(Some("nodeclient"))]
}

/// Waits until `client`'s identity authenticates and is allowed every one of `wanted` (self access reviews),
/// for at most `timeout`. A 401 or 403 on the review itself counts as "not yet".
pub async fn wait_allowed(
    client: &kube::Client,
    wanted: &[ResourceAttributes],
    timeout: Duration,
) -> anyhow::Result<()> {
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    loop {
        let mut missing = None;
        for attributes in wanted {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(attributes.clone()),
                    ..Default::default()
                },
                ..Default::default()
            };
            let allowed = match reviews.create(&PostParams::default(), &review).await {
                Ok(review) => review.status.is_some_and(|s| s.allowed),
                Err(kube::Error::Api(s)) if s.code == 401 || s.code == 403 => false,
                Err(e) => return Err(e.into()),
            };
            if !allowed {
                missing = Some(attributes);
                break;
            }
        }
        let Some(missing) = missing else {
            return Ok(());
        };
        if Instant::now() >= deadline {
            bail!(
                "still not allowed after {timeout:?}: {} {}{} in group {:?}",
                missing.verb.as_deref().unwrap_or_default(),
                missing.resource.as_deref().unwrap_or_default(),
                missing
                    .subresource
                    .as_deref()
                    .map(|s| format!("/{s}"))
                    .unwrap_or_default(),
                missing.group.as_deref().unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
