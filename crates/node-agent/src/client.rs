//! One API client, shared by every part of an agent (and by the agents of a fleet that share a connection).
//!
//! A `kube::Client` clone carries its request buffer's handle and its default namespace, two small allocations,
//! and an agent's managers would each keep one for their whole life, several per idle agent. [`ApiClient`] is a
//! pointer to one client; a request takes a `kube::Client` clone for as long
//! as it runs ([`ApiClient::kube`]), which is what `kube::Client` does on every request anyway.

use std::ops::Deref;
use std::sync::Arc;

use futures::future::Either;

/// A shared handle on one `kube::Client` (a pointer; clones share the client).
#[derive(Clone)]
pub struct ApiClient(Arc<kube::Client>);

impl ApiClient {
    /// A handle on `client`.
    pub fn new(client: kube::Client) -> Self {
        Self(Arc::new(client))
    }

    /// A `kube::Client` for one request or one `kube::Api` (dropped with it).
    pub fn kube(&self) -> kube::Client {
        (*self.0).clone()
    }

    /// Sends a write whose answer the caller does not use (`request` as `kube::core::Request` builds it): API
    /// errors come back as with `kube::Api`, and the object the server returns is read over without being
    /// kept. Decoding it only to drop it (a Pod with its managed fields is many small allocations) would make every
    /// status write a burst of short-lived allocations beside the long-lived ones. The request is held once,
    /// inside the client's future (an `async fn` would hold it beside that future too).
    pub fn write(
        &self,
        request: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> impl Future<Output = kube::Result<()>> + '_ {
        use futures::FutureExt;
        match request {
            Ok(r) => Either::Left(self.0.request::<serde::de::IgnoredAny>(r).map(|r| r.map(drop))),
            Err(e) => Either::Right(std::future::ready(Err(kube::Error::BuildRequest(e)))),
        }
    }

    /// Sends `request` and returns the text of the answer (API errors as with `kube::Api`), for a caller that
    /// reads only part of the object.
    pub fn text(
        &self,
        request: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> impl Future<Output = kube::Result<String>> + '_ {
        match request {
            Ok(r) => Either::Left(self.0.request_text(r)),
            Err(e) => Either::Right(std::future::ready(Err(kube::Error::BuildRequest(e)))),
        }
    }
}

/// Requests on the objects of kind `K` in `namespace`, for [`ApiClient::write`].
pub fn namespaced<K: kube::Resource<DynamicType = ()>>(namespace: &str) -> kube::core::Request {
    kube::core::Request::new(K::url_path(&(), Some(namespace)))
}

impl From<kube::Client> for ApiClient {
    fn from(client: kube::Client) -> Self {
        Self::new(client)
    }
}

impl Deref for ApiClient {
    type Target = kube::Client;

    fn deref(&self) -> &kube::Client {
        &self.0
    }
}

impl std::fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiClient")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_is_a_pointer_and_clones_share_the_client() {
        assert_eq!(std::mem::size_of::<ApiClient>(), 8);
        assert!(std::mem::size_of::<kube::Client>() > 64);
    }
}
