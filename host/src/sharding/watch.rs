//! Watches of one replica's slice: list and watch only the objects whose shard hash is in the
//! active ranges, and list again whenever the active ranges change.
//!
//! Server-side when the API server honours KEP-5866's `shardSelector`: kube's `ListParams` has
//! no field for it, so the watch runs through a [`Client`] that adds the `shardSelector` query
//! parameter to each of its requests ([`with_selector`]). Whether the server honours it is
//! detected per resource, never assumed ([`server_filters`]): a list with the selector must echo
//! it back in `metadata.shardInfo`; a server without the `ShardedListAndWatch` feature gate
//! ignores the parameter and echoes nothing. Otherwise, and for keys the server cannot hash
//! (the owner's uid of a cluster-scoped primary's children), the events are filtered here.
//! Either way only the slice reaches the reflector, so each replica's cache holds ~1/k of the
//! objects; server-side, the watch traffic shrinks by as much.
//!
//! # Guarantees
//! - Every event passed on is of an object in the active ranges, or a `Delete` (an `Apply` of an
//!   object outside them is passed on as a `Delete`).
//! - Until the server's support is known (a custom resource kind with no object yet), the first
//!   object seen restarts the watch once to probe the server with it. If that object came in a
//!   list, the list is abandoned before its `InitDone` and the new watch lists it again: take a
//!   list's objects as cached only at its `InitDone` (the primaries' stream does, see
//!   `controller::streams::once_cached`).
//! - A change of the active ranges restarts the watch with a full list (`Init` .. `InitDone`),
//!   which replaces the reflector's store; while nothing is active the stream reports an empty
//!   list and waits. Each list's ranges are reported to the spec's [`Lister`] as it starts.
//!
//! # Errors
//! The watcher's errors, passed on as they come (it retries with its backoff).

use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::api::{Api, ListParams};
use kube::client::Body;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio::sync::watch as channel;

use super::assignment::Shards;
use super::hash::Key;
use super::listed::Lister;
use super::ranges::{Ranges, SPACE_END};
use crate::lean::Lean;

type Events = BoxStream<'static, Result<watcher::Event<Lean>, watcher::Error>>;

/// A client that sends `shardSelector=<selector>` with every request (lists and watches).
pub fn with_selector(client: Client, selector: &str) -> Client {
    let query: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("shardSelector", selector)
        .finish();
    let namespace = client.default_namespace().to_string();
    let service = tower::service_fn(move |mut request: http::Request<Body>| {
        let client = client.clone();
        let uri = request.uri().to_string();
        let sep = if uri.contains('?') { '&' } else { '?' };
        let rewritten = format!("{uri}{sep}{query}").parse::<http::Uri>();
        async move {
            match rewritten {
                Ok(uri) => {
                    *request.uri_mut() = uri;
                    client.send(request).await
                }
                Err(e) => Err(kube::Error::Service(Box::new(e))),
            }
        }
    });
    Client::new(service, namespace)
}

/// Whether the API server filters `make_api`'s kind by `key` (None: cannot tell yet).
///
/// A list with a selector over the whole space that echoes it in `metadata.shardInfo` says yes
/// (built-in kinds). Lists of custom resources are filtered but carry no `shardInfo` (an
/// unstructured list has no such field), so without the echo the host probes: it lists one
/// object, then lists with a selector of a range that excludes that object's hash; a server that
/// filters leaves the object out, one that ignores the selector returns it again. With no
/// object to probe with, it cannot tell (the caller filters on the client and asks again at the
/// next relist).
pub async fn server_filters(
    client: &Client,
    make_api: &(dyn Fn(Client) -> Api<Lean> + Send + Sync),
    key: Key,
) -> Option<bool> {
    let field = key.server_field()?;
    let whole = Ranges::all().selector(field)?;
    let one = ListParams::default().limit(1);
    let echoed = match make_api(with_selector(client.clone(), &whole))
        .list(&one)
        .await
    {
        Ok(list) => list
            .metadata
            .shard_info
            .is_some_and(|i| i.selector == whole),
        Err(e) => {
            tracing::info!(error = %e, "a list with a shard selector failed; filtering on the client");
            return Some(false);
        }
    };
    if echoed {
        return Some(true);
    }
    let first = make_api(client.clone())
        .list(&one)
        .await
        .ok()?
        .items
        .into_iter()
        .next()?;
    let h = u128::from(key.hash(&first));
    let elsewhere = Ranges::from_ranges([((h + 1) % SPACE_END, (h + 1) % SPACE_END + 1)]);
    let probe = elsewhere.selector(field)?;
    let got = make_api(with_selector(client.clone(), &probe))
        .list(&one)
        .await
        .ok()?;
    Some(!got.items.iter().any(|o| o.uid() == first.uid()))
}

/// What the sharded watch of one kind needs.
pub struct Sharded {
    /// The host's client.
    pub client: Client,
    /// The kind's `Api` over a given client (all namespaces, or the reconciler's one).
    pub make_api: Arc<dyn Fn(Client) -> Api<Lean> + Send + Sync>,
    /// The watcher's configuration (label selectors).
    pub config: watcher::Config,
    /// What an object's shard hash is taken from.
    pub key: Key,
    /// The replica's active ranges.
    pub shards: Arc<Shards>,
    /// For logs: the kind.
    pub kind: String,
    /// Told the ranges of every list this watch starts (the caller reports when its cache
    /// holds it, see [`super::listed`]).
    pub lister: Lister,
}

impl std::fmt::Debug for Sharded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sharded")
            .field("kind", &self.kind)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

struct State {
    spec: Sharded,
    ranges: channel::Receiver<Ranges>,
    /// The current watch and the ranges it serves.
    inner: Option<(Events, Ranges)>,
    /// Whether the server filters this kind (None: not known yet).
    server: Option<bool>,
    /// An object came while `server` is unknown: restart to probe the server with it.
    probe: bool,
}

impl State {
    async fn start(&mut self) -> (Events, Ranges) {
        let ranges = self.ranges.borrow_and_update().clone();
        self.spec.lister.listing(&ranges);
        if ranges.is_empty() {
            // Nothing to hold: an empty list, then wait for a change.
            let empty: Events = futures::stream::iter([
                Ok::<_, watcher::Error>(watcher::Event::Init),
                Ok(watcher::Event::InitDone),
            ])
            .chain(futures::stream::pending())
            .boxed();
            return (empty, ranges);
        }
        let field = self
            .spec
            .key
            .server_field()
            .filter(|_| self.spec.shards.server_side());
        let server = match (field, self.server) {
            (None, _) => false,
            (Some(_), Some(known)) => known,
            (Some(_), None) => {
                let found =
                    server_filters(&self.spec.client, &*self.spec.make_api, self.spec.key).await;
                let known = found.unwrap_or(false);
                tracing::info!(kind = %self.spec.kind, server_side = known, "sharded watch: {}", match found {
                    Some(true) => "the API server filters by shardSelector",
                    Some(false) => "the API server does not filter; filtering on the client",
                    None => "nothing to probe the API server with yet; filtering on the client",
                });
                crate::operations::metrics::global()
                    .shards()
                    .filter(&self.spec.kind, known);
                self.server = found;
                known
            }
        };
        let client = match (server, field.and_then(|f| ranges.selector(f))) {
            (true, Some(selector)) => with_selector(self.spec.client.clone(), &selector),
            _ => self.spec.client.clone(),
        };
        let events = watcher((self.spec.make_api)(client), self.spec.config.clone()).boxed();
        (events, ranges)
    }
}

/// Keeps or maps one event for `ranges` (see the module's guarantees).
fn filter(event: watcher::Event<Lean>, key: Key, ranges: &Ranges) -> Option<watcher::Event<Lean>> {
    let inside = |o: &Lean| ranges.contains(key.hash(o));
    match event {
        watcher::Event::InitApply(o) if !inside(&o) => None,
        watcher::Event::Apply(o) if !inside(&o) => {
            tracing::trace!(object = %o.name_any(), "an object outside the active ranges");
            Some(watcher::Event::Delete(o))
        }
        e => Some(e),
    }
}

/// The events of `spec`'s kind in the active ranges (see the module docs).
pub fn watch(
    spec: Sharded,
) -> impl Stream<Item = Result<watcher::Event<Lean>, watcher::Error>> + Send + 'static {
    let state = State {
        ranges: spec.shards.subscribe(),
        spec,
        inner: None,
        server: None,
        probe: false,
    };
    futures::stream::unfold(state, |mut state| async move {
        loop {
            if state.probe {
                state.probe = false;
                state.inner = None;
            }
            if state.inner.is_none() {
                state.inner = Some(state.start().await);
            }
            let key = state.spec.key;
            let (events, ranges) = state.inner.as_mut()?;
            tokio::select! {
                changed = state.ranges.changed() => {
                    if changed.is_err() {
                        // The replica is gone: nothing more to watch.
                        return None;
                    }
                    state.inner = None;
                }
                event = events.next() => match event? {
                    Ok(e) => {
                        if let Some(e) = filter(e, key, ranges) {
                            state.probe = state.server.is_none()
                                && key.server_field().is_some()
                                && state.spec.shards.server_side()
                                && matches!(e, watcher::Event::Apply(_) | watcher::Event::InitApply(_));
                            return Some((Ok(e), state));
                        }
                    }
                    Err(e) => return Some((Err(e), state)),
                },
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_ns(ns: &str) -> Lean {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": ns}
        }))
        .unwrap_or_else(|e| panic!("literal: {e}"))
    }

    #[test]
    fn events_outside_the_ranges_are_dropped_or_become_deletes() {
        let h = super::super::hash::fnv1a64("a");
        let ranges = Ranges::from_ranges([(u128::from(h), u128::from(h) + 1)]);
        let key = Key::Namespace;
        assert!(filter(watcher::Event::InitApply(in_ns("a")), key, &ranges).is_some());
        assert!(filter(watcher::Event::InitApply(in_ns("b")), key, &ranges).is_none());
        assert!(matches!(
            filter(watcher::Event::Apply(in_ns("b")), key, &ranges),
            Some(watcher::Event::Delete(_))
        ));
        assert!(matches!(
            filter(watcher::Event::Apply(in_ns("a")), key, &ranges),
            Some(watcher::Event::Apply(_))
        ));
        assert!(matches!(
            filter(watcher::Event::InitDone, key, &ranges),
            Some(watcher::Event::InitDone)
        ));
    }
}
