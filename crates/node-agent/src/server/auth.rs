//! Authentication and authorization of kubelet API requests, as the kubelet does them.
//!
//! * Authentication, first match wins: a client certificate verified against `authentication.x509.clientCAFile`
//!   (the user is its common name, the groups its organizations); a bearer token checked through the TokenReview
//!   API when `authentication.webhook.enabled` (answers cached for `webhook.cacheTTL`); otherwise the request is
//!   anonymous — `system:anonymous` in `system:unauthenticated` when `authentication.anonymous.enabled`, refused
//!   with 401 when not. A token the API server does not accept is refused with 401, and so is a client
//!   certificate that does not verify (another CA, expired, not for client authentication) unless the request's
//!   bearer token authenticates: as in the kubelet, such a certificate is an authentication error, which
//!   anonymous access does not cover.
//! * Authorization (`authorization.mode: Webhook`): one SubjectAccessReview per candidate attribute, resource
//!   `nodes`, name = the node, the verb from the HTTP method and the subresource from the path (see
//!   [`subresources`]); the first allowed one lets the request through, none gives 403. Allowed answers are cached
//!   for `cacheAuthorizedTTL`, denied ones for `cacheUnauthorizedTTL`. `AlwaysAllow` lets every authenticated
//!   request through.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::PostParams;
use tokio::time::Instant;

use crate::api::ApiCalls;
use crate::config::{AuthorizationMode, KubeletConfig};

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct User {
    /// User name.
    pub name: String,
    /// Groups.
    pub groups: Vec<String>,
    /// UID (from TokenReview; empty for certificates).
    pub uid: String,
}

impl User {
    fn anonymous() -> Self {
        Self {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
            uid: String::new(),
        }
    }
}

/// What a connection's client certificate says about who is asking (decided once the TLS handshake is done).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientCertificate {
    /// None was presented, none was asked for, or it chains to the client CA without naming a user.
    Absent,
    /// It chains to the client CA: this user, until the certificate's validity ends.
    Verified {
        /// The user it names.
        user: User,
        /// The end of its validity: afterwards it no longer verifies.
        not_after: std::time::SystemTime,
    },
    /// It does not verify; why.
    Unverified(String),
}

impl ClientCertificate {
    /// The user at `now`: `Ok(None)` when there is no certificate, an error when it does not verify (its
    /// validity over by now included).
    pub(crate) fn user_at(&self, now: std::time::SystemTime) -> Result<Option<&User>, String> {
        match self {
            Self::Absent => Ok(None),
            Self::Verified { user, not_after } if now < *not_after => Ok(Some(user)),
            Self::Verified { user, not_after } => Err(format!(
                "the certificate of {} expired at {}",
                user.name,
                time::OffsetDateTime::from(*not_after)
                    .format(&time::format_description::well_known::Rfc3339)
                    .unwrap_or_default()
            )),
            Self::Unverified(why) => Err(why.clone()),
        }
    }
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No acceptable credentials: 401.
    Unauthorized,
    /// Authenticated but not allowed: 403 with the kubelet's message.
    Forbidden(String),
    /// The authorization check itself failed: 500.
    Error(String),
}

/// Entries kept per cache before expired ones are dropped.
const CACHE_LIMIT: usize = 10_000;

type DecisionKey = (User, &'static str, &'static str, String);

/// The kubelet API's authenticator and authorizer, with their caches. One per server (shared by every node it
/// answers for).
#[derive(Debug)]
pub struct Auth {
    webhook_enabled: bool,
    anonymous_enabled: bool,
    token_ttl: Duration,
    mode: AuthorizationMode,
    allowed_ttl: Duration,
    denied_ttl: Duration,
    tokens: Mutex<HashMap<String, (Instant, Option<User>)>>,
    decisions: Mutex<HashMap<DecisionKey, (Instant, bool)>>,
}

fn lookup<K: std::hash::Hash + Eq, V: Clone>(map: &Mutex<HashMap<K, (Instant, V)>>, key: &K) -> Option<V> {
    let map = map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    map.get(key)
        .filter(|(until, _)| *until > Instant::now())
        .map(|(_, v)| v.clone())
}

fn remember<K: std::hash::Hash + Eq, V>(
    map: &Mutex<HashMap<K, (Instant, V)>>,
    key: K,
    value: V,
    ttl: Duration,
) {
    if ttl.is_zero() {
        return;
    }
    let now = Instant::now();
    let mut map = map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if map.len() >= CACHE_LIMIT {
        map.retain(|_, (until, _)| *until > now);
        if map.len() >= CACHE_LIMIT {
            map.clear();
        }
    }
    map.insert(key, (now + ttl, value));
}

/// `subpath` is `path` or below it (`/stats` matches `/stats` and `/stats/summary`, not `/statsx`).
fn is_subpath(subpath: &str, path: &str) -> bool {
    let path = path.trim_end_matches('/');
    subpath == path || (subpath.starts_with(path) && subpath.as_bytes().get(path.len()) == Some(&b'/'))
}

/// The `nodes` subresources a request path is checked against, in order (the first allowed one admits the
/// request): a fine-grained one for `/pods`, `/healthz` and `/configz`, then `stats`, `metrics`, `log`
/// (`/logs/`, the node's log files), `checkpoint`, or `proxy` for everything else (`/containerLogs`, `/exec`,
/// `/run`, ... — what `nodes/proxy` has always granted).
pub fn subresources(path: &str) -> Vec<&'static str> {
    let mut out = Vec::with_capacity(2);
    if is_subpath(path, "/pods") || is_subpath(path, "/runningpods/") {
        out.push("pods");
    } else if is_subpath(path, "/healthz") {
        out.push("healthz");
    } else if is_subpath(path, "/configz") {
        out.push("configz");
    }
    out.push(if is_subpath(path, "/stats/") {
        "stats"
    } else if is_subpath(path, "/metrics") {
        "metrics"
    } else if is_subpath(path, "/logs/") {
        "log"
    } else if is_subpath(path, "/checkpoint/") {
        "checkpoint"
    } else if is_subpath(path, "/statusz") {
        "statusz"
    } else if is_subpath(path, "/flagz") {
        "configz"
    } else {
        "proxy"
    });
    out
}

/// The authorization verb of an HTTP method.
pub fn verb(method: &axum::http::Method) -> &'static str {
    match *method {
        axum::http::Method::POST => "create",
        axum::http::Method::GET => "get",
        axum::http::Method::PUT => "update",
        axum::http::Method::PATCH => "patch",
        axum::http::Method::DELETE => "delete",
        _ => "",
    }
}

impl Auth {
    /// The checks `kubelet.authentication` and `kubelet.authorization` ask for.
    pub fn new(kubelet: &KubeletConfig) -> Self {
        let a = &kubelet.authentication;
        let z = &kubelet.authorization;
        Self {
            webhook_enabled: a.webhook_enabled,
            anonymous_enabled: a.anonymous_enabled,
            token_ttl: a.webhook_cache_ttl,
            mode: z.mode,
            allowed_ttl: z.cache_authorized_ttl,
            denied_ttl: z.cache_unauthorized_ttl,
            tokens: Mutex::default(),
            decisions: Mutex::default(),
        }
    }

    /// Who is asking: the client certificate's user, else the bearer token's (TokenReview), else anonymous when
    /// allowed — not when a client certificate was presented that does not verify.
    pub async fn authenticate(
        &self,
        api: &ApiCalls,
        client: &kube::Client,
        certificate: &ClientCertificate,
        authorization: Option<&str>,
    ) -> Result<User, Refusal> {
        let unverified = match certificate.user_at(std::time::SystemTime::now()) {
            Ok(Some(user)) => return Ok(user.clone()),
            Ok(None) => None,
            Err(why) => Some(why),
        };
        let token = authorization
            .and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|t| !t.is_empty());
        let Some(token) = token else {
            if let Some(why) = unverified {
                tracing::info!(reason = %why, "kubelet API request refused: its client certificate does not verify");
                return Err(Refusal::Unauthorized);
            }
            return if self.anonymous_enabled {
                Ok(User::anonymous())
            } else {
                Err(Refusal::Unauthorized)
            };
        };
        if !self.webhook_enabled {
            return Err(Refusal::Unauthorized);
        }
        let key = token.to_owned();
        if let Some(cached) = lookup(&self.tokens, &key) {
            return cached.ok_or(Refusal::Unauthorized);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: key.clone(),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let reviews = kube::Api::<TokenReview>::all(client.clone());
        let answer = api
            .run(
                "create",
                "tokenreviews",
                reviews.create(&PostParams::default(), &review),
            )
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "TokenReview failed");
                Refusal::Unauthorized
            })?;
        let user = answer
            .status
            .filter(|s| s.authenticated == Some(true))
            .and_then(|s| {
                let u = s.user?;
                Some(User {
                    name: u.username?,
                    groups: u.groups.unwrap_or_default(),
                    uid: u.uid.unwrap_or_default(),
                })
            });
        remember(&self.tokens, key, user.clone(), self.token_ttl);
        user.ok_or(Refusal::Unauthorized)
    }

    /// Whether `user` may make this request to node `node`.
    pub async fn authorize(
        &self,
        api: &ApiCalls,
        client: &kube::Client,
        user: &User,
        node: &str,
        method: &axum::http::Method,
        path: &str,
    ) -> Result<(), Refusal> {
        if self.mode == AuthorizationMode::AlwaysAllow {
            return Ok(());
        }
        let verb = verb(method);
        let subresources = subresources(path);
        for subresource in &subresources {
            let key = (user.clone(), verb, *subresource, node.to_owned());
            let allowed = match lookup(&self.decisions, &key) {
                Some(allowed) => allowed,
                None => {
                    let allowed = self.review(api, client, user, verb, subresource, node).await?;
                    let ttl = if allowed {
                        self.allowed_ttl
                    } else {
                        self.denied_ttl
                    };
                    remember(&self.decisions, key, allowed, ttl);
                    allowed
                }
            };
            if allowed {
                return Ok(());
            }
        }
        Err(Refusal::Forbidden(format!(
            "Forbidden (user={}, verb={verb}, resource=nodes, subresource(s)=[{}])\n",
            user.name,
            subresources.join(" ")
        )))
    }

    async fn review(
        &self,
        api: &ApiCalls,
        client: &kube::Client,
        user: &User,
        verb: &str,
        subresource: &str,
        node: &str,
    ) -> Result<bool, Refusal> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                groups: Some(user.groups.clone()),
                uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.to_owned()),
                    resource: Some("nodes".into()),
                    subresource: Some(subresource.to_owned()),
                    name: Some(node.to_owned()),
                    group: Some(String::new()),
                    version: Some("v1".into()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let reviews = kube::Api::<SubjectAccessReview>::all(client.clone());
        let answer = api
            .run(
                "create",
                "subjectaccessreviews",
                reviews.create(&PostParams::default(), &review),
            )
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, user = %user.name, "SubjectAccessReview failed");
                Refusal::Error(format!(
                    "Authorization error (user={}, verb={verb}, resource=nodes, subresource={subresource})",
                    user.name
                ))
            })?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_the_kubelets_subresources() {
        assert_eq!(subresources("/stats/summary"), ["stats"]);
        assert_eq!(subresources("/stats"), ["stats"]);
        assert_eq!(subresources("/metrics"), ["metrics"]);
        assert_eq!(subresources("/metrics/resource"), ["metrics"]);
        assert_eq!(subresources("/metrics/probes"), ["metrics"]);
        assert_eq!(subresources("/metricsx"), ["proxy"]);
        assert_eq!(subresources("/pods"), ["pods", "proxy"]);
        assert_eq!(subresources("/healthz"), ["healthz", "proxy"]);
        assert_eq!(subresources("/configz"), ["configz", "proxy"]);
        assert_eq!(subresources("/containerLogs/ns/p/c"), ["proxy"]);
        assert_eq!(subresources("/exec/ns/p/c"), ["proxy"]);
        assert_eq!(subresources("/logs/syslog"), ["log"]);
        assert_eq!(verb(&axum::http::Method::POST), "create");
        assert_eq!(verb(&axum::http::Method::GET), "get");
    }

    #[tokio::test(start_paused = true)]
    async fn cache_entries_expire_after_their_ttl() {
        let map: Mutex<HashMap<String, (Instant, bool)>> = Mutex::default();
        remember(&map, "a".into(), true, Duration::from_secs(30));
        remember(&map, "z".into(), true, Duration::ZERO);
        assert_eq!(lookup(&map, &"a".to_owned()), Some(true));
        assert_eq!(lookup(&map, &"z".to_owned()), None, "a zero TTL caches nothing");
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(lookup(&map, &"a".to_owned()), None);
    }
}
