//! Which resource serves a kind, and whether it is namespaced: asked of the API server once per
//! kind and remembered.
//!
//! # Errors
//! [`DiscoveryError`] when the API server does not serve a kind (a missing CRD, a typo in an
//! apiVersion) or cannot be asked.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::Client;
use kube::api::{ApiResource, GroupVersionKind};
use kube::discovery::Scope;

use crate::contract::Gvk;
use crate::grant::Scopes;

/// A discovery failure.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "the API server does not serve {kind}: {detail} (install its CustomResourceDefinition, or fix the apiVersion/kind)"
)]
pub struct DiscoveryError {
    /// The kind.
    pub kind: Gvk,
    /// The server's answer.
    pub detail: String,
}

/// A resolved kind.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The resource (group, version, plural...).
    pub resource: ApiResource,
    /// Whether objects of it live in namespaces.
    pub namespaced: bool,
}

/// Resolves kinds through the API server, caching answers.
#[derive(Clone)]
pub struct Discovery {
    client: Client,
    cache: Arc<Mutex<HashMap<Gvk, Resolved>>>,
}

fn gvk_of(kind: &Gvk) -> GroupVersionKind {
    GroupVersionKind::gvk(kind.group(), kind.version(), &kind.kind)
}

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery").finish_non_exhaustive()
    }
}

impl Discovery {
    /// A resolver using `client`.
    pub fn new(client: Client) -> Self {
        Discovery {
            client,
            cache: Arc::default(),
        }
    }

    /// The client it asks with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Resolves `kind`.
    ///
    /// # Errors
    /// [`DiscoveryError`] when it is not served.
    pub async fn resolve(&self, kind: &Gvk) -> Result<Resolved, DiscoveryError> {
        if let Some(r) = self.cached(kind) {
            return Ok(r);
        }
        self.refresh(kind).await
    }

    /// Asks the API server again (a CRD may have changed) and replaces the cached answer for
    /// `kind`. The cache is shared by every reconciler: an answer is replaced, never dropped, so
    /// another reconciler never finds the scope of one of its kinds unknown.
    ///
    /// # Errors
    /// [`DiscoveryError`] when it is not served (the cached answer, if any, is kept).
    pub async fn refresh(&self, kind: &Gvk) -> Result<Resolved, DiscoveryError> {
        let resolved = self.ask(kind).await?;
        if let Ok(mut cache) = self.cache.lock() {
            cache.insert(kind.clone(), resolved.clone());
        }
        Ok(resolved)
    }

    async fn ask(&self, kind: &Gvk) -> Result<Resolved, DiscoveryError> {
        let (resource, caps) = kube::discovery::pinned_kind(&self.client, &gvk_of(kind))
            .await
            .map_err(|e| DiscoveryError {
                kind: kind.clone(),
                detail: e.to_string(),
            })?;
        Ok(Resolved {
            resource,
            namespaced: matches!(caps.scope, Scope::Namespaced),
        })
    }

    fn cached(&self, kind: &Gvk) -> Option<Resolved> {
        self.cache.lock().ok()?.get(kind).cloned()
    }
}

impl Scopes for Discovery {
    fn namespaced(&self, kind: &Gvk) -> Option<bool> {
        self.cached(kind).map(|r| r.namespaced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refresh_that_fails_keeps_every_answer_other_reconcilers_use() {
        crate::install_crypto_provider();
        // Nothing listens on port 9: every question fails at once.
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"));
        let discovery = Discovery::new(Client::try_from(config).expect("a client"));
        let role = Gvk::new("rbac.authorization.k8s.io/v1", "ClusterRole");
        let resolved = Resolved {
            resource: ApiResource::from_gvk_with_plural(&gvk_of(&role), "clusterroles"),
            namespaced: false,
        };
        if let Ok(mut cache) = discovery.cache.lock() {
            cache.insert(role.clone(), resolved);
        }
        assert!(discovery.refresh(&Gvk::new("v1", "Missing")).await.is_err());
        assert!(discovery.refresh(&role).await.is_err());
        assert_eq!(discovery.namespaced(&role), Some(false));
    }
}
