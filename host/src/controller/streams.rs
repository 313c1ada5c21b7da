//! The watch streams of one reconciler: its primaries, each owned kind and each related kind,
//! each feeding its cache and reporting its health on the way to kube-runtime's controller.
//!
//! # Guarantees
//! - Cached objects carry no `managedFields` ([`strip`]); primaries are kept as
//!   [`Compact`]s, owned and related objects in a [`Cache`].
//! - Every watch reports its errors and recoveries to [`Health`], and keeps
//!   `wasmop_cache_objects` at its cache's size.
//! - The state of primaries that are gone is freed as their watch sees them go
//!   ([`States::forget_gone`]); status-only changes of a primary call for no reconcile.
//! - With sharding, each watch sees only this replica's slice, and every relist of the
//!   primaries (the active ranges changed) reconciles the primaries listed.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::Client;
use kube::api::{Api, DynamicObject};
use kube::runtime::reflector::store::Writer;
use kube::runtime::{WatchStreamExt, utils::PredicateConfig, watcher};

use super::cache::{Cache, Index};
use super::compact::Compact;
use super::health::Health;
use super::intents::RECONCILER_LABEL;
use super::state::States;
use super::{Related, Settings, Watched, scope};
use crate::contract::Gvk;
use crate::discovery::Resolved;
use crate::object::ObjectKey;
use crate::operations::metrics;
use crate::sharding::{Shards, hash};

type WatchEvents =
    futures::stream::BoxStream<'static, Result<watcher::Event<DynamicObject>, watcher::Error>>;

/// What every watch of one reconciler shares.
pub(super) struct Watches<'a> {
    /// The host's client.
    pub client: &'a Client,
    /// The reconciler's settings.
    pub settings: &'a Settings,
    /// Where the watches report their health.
    pub health: &'a Arc<Health>,
}

/// What the primaries' watch feeds besides the controller.
pub(super) struct Primaries {
    /// The store kube-runtime's controller reads.
    pub writer: Writer<Compact>,
    /// The primaries by namespace.
    pub by_namespace: Arc<Index>,
    /// The per-object state, freed for primaries that are gone.
    pub states: States,
    /// Told after every relist, with sharding.
    pub relisted: futures::channel::mpsc::UnboundedSender<()>,
}

impl Watches<'_> {
    /// This replica's slice under `key` (None: not sharded).
    fn sharded_by(&self, key: fn(bool) -> hash::Key) -> Option<(&Arc<Shards>, hash::Key)> {
        let namespaced = self.settings.primary.resolved.namespaced;
        self.settings.shards.as_ref().map(|s| (s, key(namespaced)))
    }

    /// The primaries that call for a reconcile (created, or changed outside their status).
    pub(super) fn primaries(
        &self,
        feeds: Primaries,
    ) -> impl Stream<Item = Result<Compact, watcher::Error>> + Send + 'static {
        let Primaries {
            writer,
            by_namespace,
            states,
            relisted,
        } = feeds;
        let primary = &self.settings.primary;
        let store = writer.as_reader();
        let health = self.health.clone();
        let kind = primary.kind.clone();
        let config = watcher::Config::default();
        let held = scope::held_in_store(store.clone(), |c: &Compact| c.object().ok());
        let sharding = self.sharded_by(hash::Key::of_primary);
        let requested = states.clone();
        watch_events(
            self.client,
            primary,
            &self.settings.namespaces,
            (config, held),
            sharding,
        )
        .modify(strip)
        .inspect(move |e| health.watched(&kind, e))
        .inspect(move |e| {
            if let Ok(e) = e {
                by_namespace.record(e);
            }
        })
        .filter_map(|item| std::future::ready(compact_event(item)))
        .reflect(writer)
        .inspect(cached(&self.settings.name, &primary.kind, {
            let store = store.clone();
            move || store.len()
        }))
        .inspect(relists(self.settings, store.clone(), relisted))
        .inspect(move |e| states.forget_gone(e, &store))
        .applied_objects()
        // The host's own status writes (and anyone's status-only changes) call for no
        // reconcile.
        .predicate_filter(|c: &Compact| c.outside_status(), PredicateConfig::default())
        .inspect(move |o| {
            if let Ok(o) = o {
                requested.requested(&ObjectKey::of(o));
            }
        })
    }

    /// The children of one owned kind (those labelled with the reconciler), recorded in `cache`.
    pub(super) fn owned(
        &self,
        owned: &Watched,
        cache: &Arc<Cache>,
    ) -> impl Stream<Item = Result<DynamicObject, watcher::Error>> + Send + 'static {
        let label = format!("{RECONCILER_LABEL}={}", self.settings.name);
        let config = watcher::Config::default().labels(&label);
        let held = scope::held_in_cache(cache.clone());
        let sharding = self.sharded_by(hash::Key::of_children);
        let events = watch_events(
            self.client,
            owned,
            &self.settings.namespaces,
            (config, held),
            sharding,
        );
        self.cached_objects(events, &owned.kind, cache)
    }

    /// The objects of one related kind (with the administrator's selector), recorded in `cache`.
    pub(super) fn related(
        &self,
        related: &Related,
        cache: &Arc<Cache>,
    ) -> impl Stream<Item = Result<DynamicObject, watcher::Error>> + Send + 'static {
        let namespaced = self.settings.primary.resolved.namespaced;
        // Related objects of a namespaced primary are looked up in the primary's namespace (see
        // the mappings), so a reconciler scoped to one namespace watches them only there: the
        // host then needs read rights in that namespace, not cluster-wide.
        let in_scope: &[String] = if namespaced {
            &self.settings.namespaces
        } else {
            &[]
        };
        let config = match &related.selector {
            Some(s) if !s.is_empty() => watcher::Config::default().labels(s),
            _ => watcher::Config::default(),
        };
        let held = scope::held_in_cache(cache.clone());
        // Related objects of a namespaced primary live in its namespace: they shard with it.
        // Those of a cluster-scoped primary may concern any primary: every replica sees them.
        let sharding = self
            .sharded_by(hash::Key::of_primary)
            .filter(|_| namespaced);
        let watched = &related.watched;
        let events = watch_events(self.client, watched, in_scope, (config, held), sharding);
        self.cached_objects(events, &watched.kind, cache)
    }

    /// `events` of `kind`, stripped, reported to [`Health`] and recorded in `cache`, as the
    /// objects they touch.
    fn cached_objects(
        &self,
        events: WatchEvents,
        kind: &Gvk,
        cache: &Arc<Cache>,
    ) -> impl Stream<Item = Result<DynamicObject, watcher::Error>> + Send + 'static {
        let (health, watched, len) = (self.health.clone(), kind.clone(), cache.clone());
        events
            .modify(strip)
            .inspect(move |e| health.watched(&watched, e))
            .inspect(record_in(cache))
            .inspect(cached(&self.settings.name, kind, move || len.len()))
            .touched_objects()
    }
}

/// With sharding: tells `relisted` after every relist of the primaries (the primaries gained
/// may have been seen before, so the predicate would drop them), and keeps the shard metrics
/// at the store's size.
fn relists(
    settings: &Settings,
    store: kube::runtime::reflector::Store<Compact>,
    relisted: futures::channel::mpsc::UnboundedSender<()>,
) -> impl Fn(&Result<watcher::Event<Compact>, watcher::Error>) + Send + 'static {
    let (sharded, reconciler) = (settings.shards.is_some(), settings.name.clone());
    move |e| {
        if sharded && let Ok(e) = e {
            if matches!(e, watcher::Event::InitDone) {
                let _ = relisted.unbounded_send(());
            }
            metrics::global()
                .shards()
                .primaries(&reconciler, store.len());
        }
    }
}

/// Keeps `wasmop_cache_objects{reconciler,kind}` at `len()`, the size of the cache the watch
/// events passed to the returned closure were just recorded in.
pub(super) fn cached<K>(
    reconciler: &str,
    kind: &Gvk,
    len: impl Fn() -> usize + Send + 'static,
) -> impl Fn(&Result<watcher::Event<K>, watcher::Error>) + Send + 'static {
    let (reconciler, kind) = (reconciler.to_string(), cache_kind(kind));
    move |event| {
        if matches!(
            event,
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone)
        ) {
            metrics::global().cache_objects(&reconciler, &kind, len());
        }
    }
}

/// Follows the watch events passed to the returned closure in `cache`.
fn record_in(
    cache: &Arc<Cache>,
) -> impl Fn(&Result<watcher::Event<DynamicObject>, watcher::Error>) + Send + 'static {
    let cache = cache.clone();
    move |event| {
        if let Ok(e) = event {
            cache.record(e);
        }
    }
}

/// The `kind` label of `wasmop_cache_objects`: `apiVersion/kind`.
pub(super) fn cache_kind(kind: &Gvk) -> String {
    format!("{}/{}", kind.api_version, kind.kind)
}

/// Drops from a cached object what the host never reads: `managedFields` (often several
/// times the size of the rest).
fn strip(o: &mut DynamicObject) {
    o.metadata.managed_fields = None;
}

/// The primaries' watch event `item` with its objects in their [`Compact`] form (an object that
/// does not serialize is logged and its event dropped; it never happens to one read from JSON).
fn compact_event(
    item: Result<watcher::Event<DynamicObject>, watcher::Error>,
) -> Option<Result<watcher::Event<Compact>, watcher::Error>> {
    let compact = |o: DynamicObject| match Compact::new(&o) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(object = %ObjectKey::of(&o), error = %e, "cannot cache a primary: it does not serialize");
            None
        }
    };
    Some(item.map(|e| {
        Some(match e {
            watcher::Event::Init => watcher::Event::Init,
            watcher::Event::InitDone => watcher::Event::InitDone,
            watcher::Event::InitApply(o) => watcher::Event::InitApply(compact(o)?),
            watcher::Event::Apply(o) => watcher::Event::Apply(compact(o)?),
            watcher::Event::Delete(o) => watcher::Event::Delete(compact(o)?),
        })
    }))
    .and_then(|r| r.transpose())
}

fn api_for(client: &Client, resolved: &Resolved, namespaces: &[String]) -> Api<DynamicObject> {
    match (resolved.namespaced, namespaces) {
        (true, [only]) => Api::namespaced_with(client.clone(), only, &resolved.resource),
        _ => Api::all_with(client.clone(), &resolved.resource),
    }
}

/// The events of one watched kind (with the watcher's backoff): the namespaces in scope
/// ([`scope::watch`], `held` reads the cache they feed), or with
/// sharding only this replica's slice (`key`: what the kind's objects shard by; None: not
/// sharded). A sharded watch of two or more namespaces is one cluster-wide watch.
fn watch_events(
    client: &Client,
    watched: &Watched,
    namespaces: &[String],
    (config, held): (watcher::Config, scope::Held),
    sharding: Option<(&Arc<Shards>, hash::Key)>,
) -> WatchEvents {
    let Some((shards, key)) = sharding else {
        return scope::watch(client, &watched.resolved, namespaces, config, held);
    };
    let (resolved, namespaces) = (watched.resolved.clone(), namespaces.to_vec());
    crate::sharding::watch::watch(crate::sharding::watch::Sharded {
        client: client.clone(),
        make_api: Arc::new(move |c: Client| api_for(&c, &resolved, &namespaces)),
        config,
        key,
        shards: shards.clone(),
        kind: cache_kind(&watched.kind),
    })
    .default_backoff()
    .boxed()
}
