//! Watches of exactly the namespaces in a reconciler's scope.
//!
//! A reconciler with no `spec.namespaces` (or a cluster-scoped kind) watches cluster-wide; with
//! one namespace, that namespace. With two or more, one cluster-wide watch would bring every
//! object of the kind into the cache (memory, CPU, and read rights the host should not need):
//! instead [`watch`] opens one watch per namespace and merges them into one stream of watcher
//! events that a single reflector store can follow.
//!
//! Merging is more than interleaving: kube-runtime's reflector treats `Init`..`InitDone` as "the
//! whole store is being replaced", so per-namespace list phases cannot be passed through as
//! they are. [`merge`] turns them into what one watch of the union would deliver:
//! - the first lists of all namespaces form one `Init`, their `InitApply`s, and one `InitDone`
//!   once every namespace has listed (so the store, and the controller's readiness gate, see the
//!   whole scope at once); events of namespaces that finished early are held until then;
//! - a later relist of one namespace (after its watch expired) becomes `Apply` for what it
//!   lists and `Delete` for the objects of that namespace it no longer lists.
//!
//! # Guarantees
//! - Objects outside the scope never reach the stream (each watch is namespaced).
//! - The merged stream's store ends up with exactly what the namespaces' own stores would hold
//!   together, after the first lists and after every relist.
//! - A relist's `Delete` carries the whole object the cache held (its labels and owner references
//!   reach the controller's mappers), read from the cache through [`Held`], whichever cache
//!   (kube-runtime's store for primaries, [`super::cache::Cache`] for owned and related kinds).
//! - Watch errors of any namespace are passed on as they come (health reporting sees them);
//!   each namespace's watch retries with kube-runtime's default backoff on its own.
//!
//! # Errors
//! Nothing here fails; errors are the watchers'.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use futures::stream::{BoxStream, SelectAll, StreamExt, select_all};
use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use super::cache::Cache;
use crate::discovery::Resolved;
use crate::lean::Lean;
use crate::object::ObjectKey;

/// One watch's events.
pub type Events = BoxStream<'static, Result<watcher::Event<Lean>, watcher::Error>>;

/// One namespace's watch, tagged with its position in the scope.
pub type Tagged = BoxStream<'static, (usize, Result<watcher::Event<Lean>, watcher::Error>)>;

fn key_of(o: &Lean) -> ObjectKey {
    ObjectKey::of(o)
}

/// What the cache a merged stream feeds holds in namespace `ns` apart from the keys `listed`:
/// the objects a relist of `ns` no longer lists. Called once a relist is done, when everything
/// before it has reached the cache.
pub type Held = Arc<dyn Fn(&str, &HashSet<ObjectKey>) -> Vec<Lean> + Send + Sync>;

/// [`Held`] of a kube-runtime reflector store of `K`, whose objects `object` gives as
/// [`Lean`]s (None: skipped).
pub fn held_in_store<K>(store: Store<K>, object: fn(&K) -> Option<Lean>) -> Held
where
    K: kube::Resource + Clone + Send + Sync + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Send + Sync,
{
    Arc::new(move |ns: &str, listed: &HashSet<ObjectKey>| {
        store
            .state_filter(|o| {
                o.namespace().as_deref() == Some(ns) && !listed.contains(&ObjectKey::of(o))
            })
            .into_iter()
            .filter_map(|o| object(&o))
            .collect()
    })
}

/// [`Held`] of a compact [`Cache`].
pub fn held_in_cache(cache: Arc<Cache>) -> Held {
    Arc::new(move |ns: &str, listed: &HashSet<ObjectKey>| {
        cache.held_in(ns, &|k| listed.contains(k))
    })
}

/// The watch of `resolved` over `namespaces` (empty: all) with `config`. `held` reads the cache
/// the stream will feed (a namespace's relist reads what it held).
pub fn watch(
    client: &Client,
    resolved: &Resolved,
    namespaces: &[String],
    config: watcher::Config,
    held: Held,
) -> Events {
    let ar = &resolved.resource;
    match (resolved.namespaced, namespaces) {
        (true, [only]) => watcher(
            Api::<Lean>::namespaced_with(client.clone(), only, ar),
            config,
        )
        .default_backoff()
        .boxed(),
        (true, many) if many.len() > 1 => {
            let streams = many
                .iter()
                .enumerate()
                .map(|(i, ns)| {
                    watcher(
                        Api::<Lean>::namespaced_with(client.clone(), ns, ar),
                        config.clone(),
                    )
                    .default_backoff()
                    .map(move |e| (i, e))
                    .boxed()
                })
                .collect();
            merge(streams, many.to_vec(), held)
        }
        _ => watcher(Api::<Lean>::all_with(client.clone(), ar), config)
            .default_backoff()
            .boxed(),
    }
}

/// The first list of the merged stream, while some namespace has not finished it.
#[derive(Default)]
struct FirstList {
    /// Namespaces (by position) whose list has not completed.
    pending: HashSet<usize>,
    /// Keys listed by each namespace's current list attempt.
    listed: HashMap<usize, HashSet<ObjectKey>>,
    /// Keys an earlier, abandoned attempt listed (the list restarted after an error).
    abandoned: HashMap<usize, HashSet<ObjectKey>>,
    /// Events of namespaces that finished listing, replayed after the merged `InitDone`.
    held: Vec<(usize, watcher::Event<Lean>)>,
}

struct Merge {
    namespaces: Vec<String>,
    held: Held,
    out: VecDeque<Result<watcher::Event<Lean>, watcher::Error>>,
    first: Option<FirstList>,
    /// Namespaces relisting after the first list, with the keys listed so far.
    relisting: HashMap<usize, HashSet<ObjectKey>>,
}

/// A stand-in for an object known only by key (deleted before anything else was seen of it).
fn gone(ObjectKey { namespace, name }: &ObjectKey) -> Lean {
    Lean::named(namespace.clone(), name)
}

impl Merge {
    fn take(&mut self, i: usize, item: Result<watcher::Event<Lean>, watcher::Error>) {
        let event = match item {
            Ok(e) => e,
            Err(e) => return self.out.push_back(Err(e)),
        };
        match self.first.as_mut() {
            Some(first) => {
                match event {
                    watcher::Event::Init => {
                        // A (re)start of this namespace's list: what it held or listed so far
                        // is superseded.
                        first.pending.insert(i);
                        first.held.retain(|(j, _)| *j != i);
                        let before = first.listed.remove(&i).unwrap_or_default();
                        first.abandoned.entry(i).or_default().extend(before);
                    }
                    watcher::Event::InitApply(o) => {
                        first.listed.entry(i).or_default().insert(key_of(&o));
                        self.out.push_back(Ok(watcher::Event::InitApply(o)));
                    }
                    watcher::Event::InitDone => {
                        first.pending.remove(&i);
                        if first.pending.is_empty() {
                            self.finish_first_list();
                        }
                    }
                    e @ (watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                        first.held.push((i, e));
                    }
                }
            }
            None => self.after_first_list(i, event),
        }
    }

    fn finish_first_list(&mut self) {
        let Some(first) = self.first.take() else {
            return;
        };
        self.out.push_back(Ok(watcher::Event::InitDone));
        for (i, abandoned) in first.abandoned {
            let listed = first.listed.get(&i);
            for key in abandoned {
                if !listed.is_some_and(|l| l.contains(&key)) {
                    self.out.push_back(Ok(watcher::Event::Delete(gone(&key))));
                }
            }
        }
        self.out.extend(first.held.into_iter().map(|(_, e)| Ok(e)));
    }

    fn after_first_list(&mut self, i: usize, event: watcher::Event<Lean>) {
        match event {
            watcher::Event::Init => {
                self.relisting.insert(i, HashSet::new());
            }
            watcher::Event::InitApply(o) => {
                self.relisting.entry(i).or_default().insert(key_of(&o));
                self.out.push_back(Ok(watcher::Event::Apply(o)));
            }
            watcher::Event::InitDone => {
                let listed = self.relisting.remove(&i).unwrap_or_default();
                let Some(namespace) = self.namespaces.get(i) else {
                    return;
                };
                // Everything before this event has reached the cache: it holds the
                // namespace's objects from before the relist, and those it relisted.
                let dropped = (self.held)(namespace, &listed);
                self.out
                    .extend(dropped.into_iter().map(|o| Ok(watcher::Event::Delete(o))));
            }
            e => self.out.push_back(Ok(e)),
        }
    }
}

impl Merge {
    fn new(namespaces: Vec<String>, held: Held) -> Self {
        let first = FirstList {
            pending: (0..namespaces.len()).collect(),
            ..FirstList::default()
        };
        Merge {
            namespaces,
            held,
            out: VecDeque::from([Ok(watcher::Event::Init)]),
            first: Some(first),
            relisting: HashMap::new(),
        }
    }
}

/// Merges the watches of `namespaces` (stream `i` watches `namespaces[i]`) into one stream that a
/// reflector store or a [`Cache`] read by `held` can follow (see the module docs).
pub fn merge(streams: Vec<Tagged>, namespaces: Vec<String>, held: Held) -> Events {
    let state = (Merge::new(namespaces, held), select_all(streams));
    futures::stream::unfold(
        state,
        |(mut merge, mut inner): (Merge, SelectAll<Tagged>)| async move {
            loop {
                if let Some(event) = merge.out.pop_front() {
                    return Some((event, (merge, inner)));
                }
                let (i, item) = inner.next().await?;
                merge.take(i, item);
            }
        },
    )
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ApiResource;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn cm(ns: &str, name: &str, v: &str) -> Lean {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns}, "data": {"v": v}
        }))
        .unwrap_or_else(|e| panic!("literal: {e}"))
    }

    fn value(o: &Lean) -> serde_json::Value {
        serde_json::from_str(o.json()).unwrap_or_default()
    }

    type Step = (usize, Result<Event<Lean>, watcher::Error>);

    /// Feeds `steps` (namespace position, event) in this order through the merge into a
    /// store, and returns the store and the merged events.
    async fn run(namespaces: &[&str], steps: Vec<Step>) -> (Store<Lean>, Vec<Event<Lean>>) {
        let ar = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        let mut writer = Writer::new(ar);
        let store = writer.as_reader();
        let mut merge = Merge::new(
            namespaces.iter().map(|s| s.to_string()).collect(),
            held_in_store(store.clone(), |o: &Lean| Some(o.clone())),
        );
        let mut seen = Vec::new();
        let mut drain = |merge: &mut Merge| {
            while let Some(e) = merge.out.pop_front() {
                if let Ok(e) = e {
                    writer.apply_watcher_event(&e);
                    seen.push(e);
                }
            }
        };
        drain(&mut merge);
        for (i, e) in steps {
            merge.take(i, e);
            drain(&mut merge);
        }
        (store, seen)
    }

    fn contents(store: &Store<Lean>) -> Vec<String> {
        let mut v: Vec<String> = store
            .state()
            .iter()
            .map(|o| {
                format!(
                    "{}/{}={}",
                    o.namespace().unwrap_or_default(),
                    o.name_any(),
                    value(o)["data"]["v"].as_str().unwrap_or_default()
                )
            })
            .collect();
        v.sort();
        v
    }

    fn kinds(events: &[Event<Lean>]) -> Vec<&'static str> {
        events
            .iter()
            .map(|e| match e {
                Event::Init => "Init",
                Event::InitApply(_) => "InitApply",
                Event::InitDone => "InitDone",
                Event::Apply(_) => "Apply",
                Event::Delete(_) => "Delete",
            })
            .collect()
    }

    #[tokio::test]
    async fn first_lists_of_all_namespaces_make_one_list_and_early_events_wait_for_it() {
        let (store, events) = run(
            &["a", "b"],
            vec![
                (0, Ok(Event::Init)),
                (0, Ok(Event::InitApply(cm("a", "x", "1")))),
                (0, Ok(Event::InitDone)),
                // a's watch goes on while b is still listing: held until b is done.
                (0, Ok(Event::Apply(cm("a", "x", "2")))),
                (1, Ok(Event::Init)),
                (1, Ok(Event::InitApply(cm("b", "y", "1")))),
                (1, Ok(Event::InitDone)),
            ],
        )
        .await;
        assert_eq!(
            kinds(&events),
            ["Init", "InitApply", "InitApply", "InitDone", "Apply"]
        );
        assert_eq!(contents(&store), ["a/x=2", "b/y=1"]);
    }

    #[tokio::test]
    async fn a_restarted_first_list_drops_what_only_the_abandoned_attempt_listed() {
        let (store, events) = run(
            &["a", "b"],
            vec![
                (0, Ok(Event::Init)),
                (0, Ok(Event::InitApply(cm("a", "old", "1")))),
                (0, Err(watcher::Error::NoResourceVersion)),
                (0, Ok(Event::Init)),
                (0, Ok(Event::InitApply(cm("a", "new", "1")))),
                (0, Ok(Event::InitDone)),
                (1, Ok(Event::Init)),
                (1, Ok(Event::InitDone)),
            ],
        )
        .await;
        assert_eq!(contents(&store), ["a/new=1"]);
        assert_eq!(
            kinds(&events).iter().filter(|k| **k == "InitDone").count(),
            1
        );
    }

    #[tokio::test]
    async fn a_relist_of_one_namespace_applies_what_it_lists_and_deletes_what_it_lost() {
        let (store, events) = run(
            &["a", "b"],
            vec![
                (0, Ok(Event::Init)),
                (0, Ok(Event::InitApply(cm("a", "keep", "1")))),
                (0, Ok(Event::InitApply(cm("a", "lost", "1")))),
                (0, Ok(Event::InitDone)),
                (1, Ok(Event::Init)),
                (1, Ok(Event::InitApply(cm("b", "other", "1")))),
                (1, Ok(Event::InitDone)),
                // a's watch expired: it lists again.
                (0, Ok(Event::Init)),
                (0, Ok(Event::InitApply(cm("a", "keep", "2")))),
                (0, Ok(Event::InitDone)),
            ],
        )
        .await;
        assert_eq!(contents(&store), ["a/keep=2", "b/other=1"]);
        let tail = kinds(&events[events.len() - 2..]);
        assert_eq!(tail, ["Apply", "Delete"], "{:?}", kinds(&events));
        // Only one store replacement ever: the merged first list.
        assert_eq!(kinds(&events).iter().filter(|k| **k == "Init").count(), 1);
    }

    #[tokio::test]
    async fn a_relist_deletes_whole_objects_read_from_a_compact_cache() {
        let cache = Cache::new(super::super::cache::namespace);
        let mut merge = Merge::new(vec!["a".into()], held_in_cache(cache.clone()));
        let mut seen = Vec::new();
        let steps = [
            Event::Init,
            Event::InitApply(cm("a", "keep", "1")),
            Event::InitApply(cm("a", "lost", "1")),
            Event::InitDone,
            Event::Init,
            Event::InitApply(cm("a", "keep", "2")),
            Event::InitDone,
        ];
        for e in steps {
            merge.take(0, Ok(e));
            while let Some(Ok(e)) = merge.out.pop_front() {
                cache.record(&e);
                seen.push(e);
            }
        }
        let Some(Event::Delete(lost)) = seen.last() else {
            panic!("the relist ends with a Delete: {:?}", kinds(&seen));
        };
        assert_eq!(lost.name_any(), "lost");
        assert_eq!(
            value(lost)["data"]["v"],
            "1",
            "the whole object, not a stand-in"
        );
        let left: Vec<String> = cache.all().into_iter().map(|(k, _)| k.name).collect();
        assert_eq!(left, ["keep"]);
    }
}
