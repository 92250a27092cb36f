//! The service account tokens handed to CSI drivers (their `CSIDriver`'s `tokenRequests`), kept between
//! publishes as the kubelet's token manager keeps them: a token is used again until 80 % of its life has passed
//! (at most 24 h), then a new one is requested — the rule the pod's projected token volumes follow. A driver
//! with `requiresRepublish` is published again at every sync of its pods, and gets the same token each time
//! until it is due.
//!
//! Tokens are kept per request (namespace, service account, audience, lifetime and the pod they are bound
//! to); those of a pod are dropped when its volumes are torn down, and expired ones whenever a token is kept.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The longest a token is used before it is renewed, however long it lives.
pub const MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// What a token was requested for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenKey {
    /// The pod's namespace.
    pub namespace: String,
    /// The service account.
    pub service_account: String,
    /// The audience.
    pub audience: String,
    /// The requested lifetime, seconds.
    pub expiration_secs: i64,
    /// The pod the token is bound to.
    pub pod_uid: String,
}

/// A token kept.
#[derive(Debug, Clone)]
struct Kept {
    token: String,
    /// When the API server said it expires (`expirationTimestamp`, as handed on).
    expires: String,
    /// When it is to be renewed.
    due: Instant,
    /// When it is of no use any more.
    dead: Instant,
}

/// The tokens kept, by request.
#[derive(Debug, Default)]
pub struct TokenCache {
    kept: Mutex<HashMap<TokenKey, Kept>>,
}

/// When a token living `life` from `now` is due for renewal: at 80 % of its life, at most [`MAX_AGE`] on.
pub fn renewal_due(now: Instant, life: Duration) -> Instant {
    now + life.mul_f64(0.8).min(MAX_AGE)
}

impl TokenCache {
    /// The token kept for `key` and its expiry, unless it is due for renewal at `now`.
    pub fn get(&self, key: &TokenKey, now: Instant) -> Option<(String, String)> {
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.get(key)
            .filter(|k| now < k.due)
            .map(|k| (k.token.clone(), k.expires.clone()))
    }

    /// Keeps `token` (expiring at `expires`, `life` from `now`) for `key`; drops the tokens that have expired.
    pub fn keep(&self, key: TokenKey, token: String, expires: String, now: Instant, life: Duration) {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.retain(|_, k| k.dead > now);
        kept.insert(
            key,
            Kept {
                token,
                expires,
                due: renewal_due(now, life),
                dead: now + life,
            },
        );
    }

    /// Drops the tokens bound to pod `uid`.
    pub fn release_pod(&self, uid: &str) {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.retain(|key, _| key.pod_uid != uid);
    }

    /// How many tokens are kept.
    pub fn len(&self) -> usize {
        self.kept.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(pod: &str) -> TokenKey {
        TokenKey {
            namespace: "ns".into(),
            service_account: "default".into(),
            audience: "a".into(),
            expiration_secs: 3600,
            pod_uid: pod.into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_is_kept_until_80_percent_of_its_life() {
        let cache = TokenCache::default();
        let t0 = Instant::now();
        cache.keep(key("p"), "t1".into(), "e1".into(), t0, Duration::from_secs(3600));
        let got = |at| cache.get(&key("p"), at).map(|(t, _)| t);
        assert_eq!(got(t0 + Duration::from_secs(2879)), Some("t1".to_owned()));
        assert_eq!(got(t0 + Duration::from_secs(2880)), None);
        // another pod's request is another token
        assert_eq!(cache.get(&key("q"), t0), None);
        // a token living longer than 30 h is renewed after 24 h
        cache.keep(
            key("q"),
            "t2".into(),
            "e2".into(),
            t0,
            Duration::from_secs(48 * 3600),
        );
        assert!(
            cache
                .get(&key("q"), t0 + MAX_AGE - Duration::from_secs(1))
                .is_some()
        );
        assert!(cache.get(&key("q"), t0 + MAX_AGE).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn expired_tokens_and_a_gone_pods_tokens_are_dropped() {
        let cache = TokenCache::default();
        let t0 = Instant::now();
        cache.keep(key("p"), "t1".into(), "e".into(), t0, Duration::from_secs(60));
        cache.keep(key("q"), "t2".into(), "e".into(), t0, Duration::from_secs(3600));
        assert_eq!(cache.len(), 2);
        cache.release_pod("q");
        assert_eq!(cache.len(), 1);
        // keeping another token past the first one's expiry drops it
        cache.keep(
            key("r"),
            "t3".into(),
            "e".into(),
            t0 + Duration::from_secs(61),
            Duration::from_secs(60),
        );
        assert_eq!(cache.len(), 1);
        assert!(cache.get(&key("r"), t0 + Duration::from_secs(61)).is_some());
    }
}
