//! The watch streams of one reconciler: its primaries, each owned kind and each related kind,
//! each feeding its cache and reporting its health on the way to kube-runtime's controller.
//!
//! # Guarantees
//! - Every watch decodes its objects as [`Lean`]s (metadata and text, without
//!   `managedFields`); primaries are kept as [`Compact`]s, owned and related objects in a
//!   [`Cache`].
//! - Every watch reports its errors and recoveries to [`Health`], and keeps
//!   `wasmop_cache_objects` at its cache's size.
//! - The state of primaries that are gone is freed as their watch sees them go
//!   ([`States::forget_gone`]); status-only changes of a primary call for no reconcile, unless
//!   the reconciler's [`Changes`] say so (a Metacontroller hook's, see [`super::predicate`]).
//! - A primary is passed on to the controller only while its store holds it: the objects of a
//!   list at the list's end ([`once_cached`]), so none is dropped as not found.
//! - With sharding, each watch sees only this replica's slice, and reports each list to the
//!   reconciler's [`Listed`] once its cache holds it (gained primaries wait for every cache).

use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::runtime::reflector::store::Writer;
use kube::runtime::{WatchStreamExt, utils::PredicateConfig, watcher};

use super::cache::{Cache, Index};
use super::compact::Compact;
use super::health::Health;
use super::intents::RECONCILER_LABEL;
use super::predicate::Changes;
use super::state::States;
use super::{Related, Settings, Watched, scope};
use crate::contract::Gvk;
use crate::discovery::Resolved;
use crate::lean::Lean;
use crate::object::ObjectKey;
use crate::operations::metrics;
use crate::sharding::{Listed, Lister, Shards, hash};

/// With sharding: the replica's ranges, what the kind's objects shard by, and the watch's
/// handle on what the reconciler's watches have listed.
type Sharding<'a> = (&'a Arc<Shards>, hash::Key, Lister);

type WatchEvents =
    futures::stream::BoxStream<'static, Result<watcher::Event<Lean>, watcher::Error>>;

/// What every watch of one reconciler shares.
pub(super) struct Watches<'a> {
    /// The host's client.
    pub client: &'a Client,
    /// The reconciler's settings.
    pub settings: &'a Settings,
    /// Where the watches report their health.
    pub health: &'a Arc<Health>,
    /// With sharding: what every watch has listed (see [`crate::sharding::listed`]).
    pub listed: Option<Arc<Listed>>,
}

/// What the primaries' watch feeds besides the controller.
pub(super) struct Primaries {
    /// The store kube-runtime's controller reads.
    pub writer: Writer<Compact>,
    /// The primaries by namespace.
    pub by_namespace: Arc<Index>,
    /// The per-object state, freed for primaries that are gone.
    pub states: States,
}

impl Watches<'_> {
    /// This replica's slice under `key`, with the watch registered in [`Listed`] (None: not
    /// sharded).
    fn sharded_by(&self, key: fn(bool) -> hash::Key) -> Option<Sharding<'_>> {
        let namespaced = self.settings.primary.resolved.namespaced;
        let (shards, listed) = (self.settings.shards.as_ref()?, self.listed.as_ref()?);
        Some((shards, key(namespaced), listed.watch()))
    }

    /// The primaries that call for a reconcile (created, or changed outside their status, or
    /// in it too with [`Changes::WithStatus`]).
    pub(super) fn primaries(
        &self,
        feeds: Primaries,
    ) -> impl Stream<Item = Result<Compact, watcher::Error>> + Send + 'static {
        let Primaries {
            writer,
            by_namespace,
            states,
        } = feeds;
        let primary = &self.settings.primary;
        let store = writer.as_reader();
        let health = self.health.clone();
        let kind = primary.kind.clone();
        let config = watcher::Config::default();
        let held = scope::held_in_store(store.clone(), |c: &Compact| Some(c.lean()));
        let sharding = self.sharded_by(hash::Key::of_primary);
        let lister = sharding.as_ref().map(|(_, _, l)| l.clone());
        let requested = states.clone();
        let changes = self.settings.primary_changes;
        let cached = watch_events(
            self.client,
            primary,
            &self.settings.namespaces,
            (config, held),
            sharding,
        )
        .inspect(move |e| health.watched(&kind, e))
        .inspect(move |e| {
            if let Ok(e) = e {
                by_namespace.record(e);
            }
        })
        .map(move |item| compact_event(item, changes))
        .reflect(writer)
        .inspect(listed_when_cached(lister))
        .inspect(cached(&self.settings.name, &primary.kind, {
            let store = store.clone();
            move || store.len()
        }))
        .inspect(shard_metrics(self.settings, store.clone()))
        .inspect({
            let store = store.clone();
            move |e| states.forget_gone(e, &store)
        });
        calling_for_reconcile(cached, store).inspect(move |o| {
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
    ) -> impl Stream<Item = Result<Lean, watcher::Error>> + Send + 'static {
        let label = format!("{RECONCILER_LABEL}={}", self.settings.name);
        let config = watcher::Config::default().labels(&label);
        let held = scope::held_in_cache(cache.clone());
        let sharding = self.sharded_by(hash::Key::of_children);
        let lister = sharding.as_ref().map(|(_, _, l)| l.clone());
        let events = watch_events(
            self.client,
            owned,
            &self.settings.namespaces,
            (config, held),
            sharding,
        );
        self.cached_objects(events, &owned.kind, cache, lister)
    }

    /// The objects of one related kind (with the administrator's selector), recorded in `cache`.
    pub(super) fn related(
        &self,
        related: &Related,
        cache: &Arc<Cache>,
    ) -> impl Stream<Item = Result<Lean, watcher::Error>> + Send + 'static {
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
        let sharding = if namespaced {
            self.sharded_by(hash::Key::of_primary)
        } else {
            None
        };
        let lister = sharding.as_ref().map(|(_, _, l)| l.clone());
        let watched = &related.watched;
        let events = watch_events(self.client, watched, in_scope, (config, held), sharding);
        self.cached_objects(events, &watched.kind, cache, lister)
    }

    /// `events` of `kind`, stripped, reported to [`Health`] and recorded in `cache` (then to
    /// `lister`, with sharding), as the objects they touch.
    fn cached_objects(
        &self,
        events: WatchEvents,
        kind: &Gvk,
        cache: &Arc<Cache>,
        lister: Option<Lister>,
    ) -> impl Stream<Item = Result<Lean, watcher::Error>> + Send + 'static {
        let (health, watched, len) = (self.health.clone(), kind.clone(), cache.clone());
        events
            .inspect(move |e| health.watched(&watched, e))
            .filter(record_in(cache))
            .inspect(listed_when_cached(lister))
            .inspect(cached(&self.settings.name, kind, move || len.len()))
            .touched_objects()
    }
}

/// The primaries of `events` (already reflected in `store`) that call for a reconcile: each
/// applied primary once `store` holds it ([`once_cached`]), unless its fingerprint
/// ([`Compact::fingerprint`]) did not change since it was last passed on: nothing outside its
/// status changed (the host's own status writes, anyone's status-only changes, a relist of
/// unchanged primaries), or with [`Changes::WithStatus`] nothing but its resourceVersion and
/// managedFields.
fn calling_for_reconcile(
    events: impl Stream<Item = Result<watcher::Event<Compact>, watcher::Error>> + Send + 'static,
    store: Store<Compact>,
) -> impl Stream<Item = Result<Compact, watcher::Error>> + Send + 'static {
    once_cached(events, store)
        .predicate_filter(|c: &Compact| c.fingerprint(), PredicateConfig::default())
}

/// The applied primaries of `events` (already reflected in `store`), each passed on only once
/// `store` holds it: an `Apply` as it comes, the objects of a list at its `InitDone`, read from
/// the store, which holds exactly that list from then on.
///
/// kube-runtime's reflector keeps a list's objects aside until its `InitDone`, and its
/// controller drops a request for an object its store does not hold. Passed on as they came
/// (`applied_objects`), the objects first seen in a list were lost whenever the controller
/// looked them up before the list was done (a list abandoned for the sharded watch's probe, a
/// slow next page), and the predicate filter, having seen them, dropped them in the next list:
/// never reconciled (until a resync).
///
/// # Guarantees
/// - Every primary passed on is in `store` as it is passed on.
/// - Every object of a finished list is passed on (to the predicate filter).
///
/// # Caveats
/// - A list abandoned before its `InitDone` (the sharded watch's probe restart, an error
///   mid-list) passes nothing on: the list that replaces it passes its objects.
/// - A list's objects call for reconciles only once the whole list has arrived.
fn once_cached(
    events: impl Stream<Item = Result<watcher::Event<Compact>, watcher::Error>> + Send + 'static,
    store: Store<Compact>,
) -> impl Stream<Item = Result<Compact, watcher::Error>> + Send + 'static {
    events.flat_map(move |event| futures::stream::iter(applied(event, &store)))
}

/// What [`once_cached`] passes on for `event`.
type Applied = Box<dyn Iterator<Item = Result<Compact, watcher::Error>> + Send>;

/// The primaries [`once_cached`] passes on for `event` (errors as they come).
fn applied(
    event: Result<watcher::Event<Compact>, watcher::Error>,
    store: &Store<Compact>,
) -> Applied {
    match event {
        Ok(watcher::Event::Apply(o)) => Box::new(std::iter::once(Ok(o))),
        // Cheap clones: a `Compact` shares its text with the store's.
        Ok(watcher::Event::InitDone) => {
            Box::new(store.state().into_iter().map(|o| Ok(Compact::clone(&o))))
        }
        Ok(watcher::Event::Init | watcher::Event::InitApply(_) | watcher::Event::Delete(_)) => {
            Box::new(std::iter::empty())
        }
        Err(e) => Box::new(std::iter::once(Err(e))),
    }
}

/// With sharding: tells `lister` that a list is done once the cache the events passed to the
/// returned closure were recorded in holds it (the gained primaries are then reconciled, see
/// [`crate::sharding::listed`]).
fn listed_when_cached<K>(
    lister: Option<Lister>,
) -> impl Fn(&Result<watcher::Event<K>, watcher::Error>) + Send + 'static {
    move |e| {
        if let (Some(lister), Ok(watcher::Event::InitDone)) = (&lister, e) {
            lister.listed();
        }
    }
}

/// With sharding: keeps the shard metrics at the primaries' store's size.
fn shard_metrics(
    settings: &Settings,
    store: Store<Compact>,
) -> impl Fn(&Result<watcher::Event<Compact>, watcher::Error>) + Send + 'static {
    let (sharded, reconciler) = (settings.shards.is_some(), settings.name.clone());
    move |e| {
        if sharded && e.is_ok() {
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

/// Follows the watch events passed to the returned filter in `cache`, and keeps them all but
/// the objects of a relist that the cache already held unchanged: a relist (the active ranges
/// changed, a 410 Gone) calls for no reconcile of the primaries whose children or related
/// objects did not change.
fn record_in(
    cache: &Arc<Cache>,
) -> impl FnMut(&Result<watcher::Event<Lean>, watcher::Error>) -> std::future::Ready<bool> + Send + 'static
{
    let cache = cache.clone();
    move |event| {
        std::future::ready(match event {
            Ok(e) => cache.record(e),
            Err(_) => true,
        })
    }
}

/// The `kind` label of `wasmop_cache_objects`: `apiVersion/kind`.
pub(super) fn cache_kind(kind: &Gvk) -> String {
    format!("{}/{}", kind.api_version, kind.kind)
}

/// The primaries' watch event `item` with its objects in their [`Compact`] form, fingerprinted
/// for `changes`.
fn compact_event(
    item: Result<watcher::Event<Lean>, watcher::Error>,
    changes: Changes,
) -> Result<watcher::Event<Compact>, watcher::Error> {
    let compact = |o: Lean| Compact::new(&o, changes);
    item.map(|e| match e {
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
        watcher::Event::InitApply(o) => watcher::Event::InitApply(compact(o)),
        watcher::Event::Apply(o) => watcher::Event::Apply(compact(o)),
        watcher::Event::Delete(o) => watcher::Event::Delete(compact(o)),
    })
}

fn api_for(client: &Client, resolved: &Resolved, namespaces: &[String]) -> Api<Lean> {
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
    sharding: Option<Sharding<'_>>,
) -> WatchEvents {
    let Some((shards, key, lister)) = sharding else {
        return typed(
            scope::watch(client, &watched.resolved, namespaces, config, held),
            &watched.kind,
        );
    };
    let (resolved, namespaces) = (watched.resolved.clone(), namespaces.to_vec());
    let events = crate::sharding::watch::watch(crate::sharding::watch::Sharded {
        client: client.clone(),
        make_api: Arc::new(move |c: Client| api_for(&c, &resolved, &namespaces)),
        config,
        key,
        shards: shards.clone(),
        kind: cache_kind(&watched.kind),
        lister,
    })
    .default_backoff()
    .boxed();
    typed(events, &watched.kind)
}

/// `events` with every object typed as `kind` ([`Lean::with_type`]): the API server sends the
/// items of a list of a built-in kind without their type, and a cache would take each of them,
/// relisted unchanged, as changed (and reconcile its primary).
fn typed(events: WatchEvents, kind: &Gvk) -> WatchEvents {
    let (api_version, kind) = (kind.api_version.clone(), kind.kind.clone());
    events
        .map(move |event| event.map(|e| typed_event(e, &api_version, &kind)))
        .boxed()
}

/// A watch event with its object typed (see [`typed`]).
fn typed_event(event: watcher::Event<Lean>, api_version: &str, kind: &str) -> watcher::Event<Lean> {
    let typed = |o: Lean| o.with_type(api_version, kind);
    match event {
        watcher::Event::InitApply(o) => watcher::Event::InitApply(typed(o)),
        watcher::Event::Apply(o) => watcher::Event::Apply(typed(o)),
        watcher::Event::Delete(o) => watcher::Event::Delete(typed(o)),
        e @ (watcher::Event::Init | watcher::Event::InitDone) => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    use kube::runtime::reflector::ObjectRef;
    use kube::runtime::watcher::Event;

    fn widgets() -> ApiResource {
        ApiResource::from_gvk(&GroupVersionKind::gvk("test.wasmop.dev", "v1", "Widget"))
    }

    fn widget(name: &str) -> Compact {
        widget_at(name, "1", serde_json::json!({}))
    }

    fn widget_at(name: &str, rv: &str, status: serde_json::Value) -> Compact {
        widget_for(Changes::OutsideStatus, name, rv, status)
    }

    /// Widget `name` at `rv` with `status`, fingerprinted for `changes`.
    fn widget_for(changes: Changes, name: &str, rv: &str, status: serde_json::Value) -> Compact {
        let mut o = DynamicObject::new(name, &widgets())
            .within("ns0-shard")
            .data(serde_json::json!({"spec": {"size": 1}, "status": status}));
        o.metadata.uid = Some(format!("uid-{name}"));
        o.metadata.resource_version = Some(rv.into());
        o.metadata.generation = Some(1);
        Compact::new(
            &Lean::of(&o).unwrap_or_else(|e| panic!("lean: {e}")),
            changes,
        )
    }

    /// The primaries `events` pass on to the controller, in name order, each with whether the
    /// store held it as it was passed on (kube-runtime's controller looks it up there and drops
    /// the request when it is not).
    fn passed_on(events: Vec<Event<Compact>>) -> Vec<(String, bool)> {
        let writer = Writer::new(widgets());
        let store: Store<Compact> = writer.as_reader();
        let reflected = futures::stream::iter(events.into_iter().map(Ok)).reflect(writer);
        let held = |o: &Compact| store.get(&ObjectRef::from_obj_with(o, widgets())).is_some();
        let passed = calling_for_reconcile(reflected, store.clone()).map(|o| match o {
            Ok(o) => (o.name_any(), held(&o)),
            Err(e) => panic!("no error was sent: {e}"),
        });
        let mut passed: Vec<(String, bool)> = futures::executor::block_on(passed.collect());
        passed.sort();
        passed
    }

    /// The e2e flake of `a_replica_that_cannot_set_the_reconciler_up_withdraws_its_share`: the
    /// first Widget came in the list of a sharded watch that did not know yet whether the API
    /// server filters, which restarts the watch to probe the server with it and so abandons
    /// that list before its `InitDone`. The Widget was passed on before the store held it (the
    /// controller found nothing and dropped the request) and, unchanged in the next list, the
    /// predicate filter let it through no more: no reconcile, ever.
    #[test]
    fn a_primary_of_a_list_abandoned_for_the_probe_is_passed_on_once_the_store_holds_it() {
        let events = vec![
            // The list after the active ranges changed, before any Widget existed.
            Event::Init,
            Event::InitDone,
            // The next list has the first Widget: the watch restarts to probe the server.
            Event::Init,
            Event::InitApply(widget("w-0")),
            // The list after the probe.
            Event::Init,
            Event::InitApply(widget("w-0")),
            Event::InitApply(widget("w-1")),
            Event::InitDone,
            // A relist of unchanged primaries calls for no reconcile.
            Event::Init,
            Event::InitApply(widget("w-0")),
            Event::InitApply(widget("w-1")),
            Event::InitDone,
        ];
        assert_eq!(
            passed_on(events),
            [("w-0".to_string(), true), ("w-1".to_string(), true)],
            "each primary passed on once, while the store holds it"
        );
    }

    /// Watch events between lists are passed on as they come, unless nothing outside the
    /// status changed.
    #[test]
    fn an_applied_primary_is_passed_on_unless_only_its_status_changed() {
        let status_only = widget_at("w-0", "2", serde_json::json!({"ready": true}));
        let events = vec![
            Event::Init,
            Event::InitDone,
            Event::Apply(widget("w-0")),
            Event::Apply(status_only),
            Event::Apply(widget("w-1")),
        ];
        assert_eq!(
            passed_on(events),
            [("w-0".to_string(), true), ("w-1".to_string(), true)]
        );
    }

    /// A Metacontroller hook's parent (`syncOnStatus`): the host's own status write is passed
    /// on (the hook may act on the status it wrote), and so is anyone's status change; a write
    /// after which the status is as it was (a new resourceVersion only) is not, so the sync
    /// that follows the host's write, answering the same status, ends the chain.
    #[test]
    fn with_status_changes_the_hosts_status_write_is_passed_on_once() {
        let at = |rv: &str, status: serde_json::Value| {
            widget_for(Changes::WithStatus, "w-0", rv, status)
        };
        let events = vec![
            Event::Init,
            Event::InitDone,
            Event::Apply(at("1", serde_json::json!({}))),
            // The host writes the hook's status.
            Event::Apply(at("2", serde_json::json!({"ready": true}))),
            // The same status again, a new resourceVersion.
            Event::Apply(at("3", serde_json::json!({"ready": true}))),
        ];
        assert_eq!(
            passed_on(events),
            [("w-0".to_string(), true), ("w-0".to_string(), true)],
            "the first sight and the status write call for a reconcile, nothing else"
        );
    }

    /// The finding of 2026-11-30: the items of a `ConfigMapList` have no `kind` or
    /// `apiVersion`, the watch events that brought the same children had both, and every child
    /// relisted unchanged (a sharded replica gaining ranges relists its watches) called for
    /// its primary's reconcile. Typed, a relist of what the cache holds is no change.
    #[test]
    fn a_child_relisted_unchanged_is_no_change_for_its_cache() {
        let text = |typed: bool| {
            let head = if typed {
                r#""kind":"ConfigMap","apiVersion":"v1","#
            } else {
                ""
            };
            format!(
                r#"{{{head}"metadata":{{"name":"w-0-out","namespace":"n","uid":"c1","resourceVersion":"9","ownerReferences":[{{"apiVersion":"test.wasmop.dev/v1","kind":"Widget","name":"w-0","uid":"p1","controller":true}}]}},"data":{{"owner":"w-0"}}}}"#
            )
        };
        let child = |typed: bool| Lean::parse(&text(typed)).expect("child");
        let cache = Cache::new(super::super::cache::controller_uid);
        let typed = |e| typed_event(e, "v1", "ConfigMap");
        for e in [Event::Init, Event::InitDone, Event::Apply(child(true))] {
            cache.record(&typed(e));
        }
        // The relist a gained range starts: the list's item comes without its type.
        assert!(cache.record(&typed(Event::Init)));
        assert!(
            !cache.record(&typed(Event::InitApply(child(false)))),
            "the same child, relisted, calls for no reconcile"
        );
        assert!(
            cache.record(&Event::InitApply(child(false))),
            "untyped, the text differs (what the watches did before)"
        );
    }
}
