//! The controller's caches of owned and related kinds, and indexes: which cached objects
//! belong to one primary.
//!
//! A reconcile needs the children of one primary and the related objects of one namespace.
//! Scanning (and cloning) a whole store for that makes one reconcile O(N) and one resync of N
//! primaries O(N^2). Both kinds of cache therefore group their objects' keys by a property (the
//! controller owner's uid, the namespace), fed by the same watch events as the objects, so a
//! lookup costs what it returns:
//! - a [`Cache`] holds an owned or related kind compactly, each object as its JSON text (a
//!   `serde_json::Value` costs several times its text; see `docs/benchmarks.md`, "Cache memory
//!   per object"), with its groups;
//! - an [`Index`] groups the keys of the primaries' kube-runtime reflector store (of
//!   [`super::compact::Compact`]s), which kube-runtime's `Controller` reads (a related change
//!   with `AllPrimaries` finds one namespace's primaries).
//!
//! # Guarantees
//! - Both follow their watch stream: applied objects are (re)grouped, deleted ones dropped,
//!   and a relist replaces the whole contents when it completes, as a reflector store does.
//! - A [`Cache`] lookup returns exactly what the cache holds at that moment (objects and groups
//!   change under one lock). An [`Index`] lookup returns keys; the store is read by key.
//!
//! # Errors
//! Nothing here fails; a poisoned lock yields empty lookups.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use kube::ResourceExt;
use kube::runtime::watcher;

use crate::lean::Lean;
pub use crate::object::ObjectKey;

/// The property an index groups by (None: the object is not indexed).
pub type GroupBy = fn(&Lean) -> Option<String>;

pub use crate::object::controller_uid;

/// An object's namespace, `""` for cluster-scoped objects.
pub fn namespace(o: &Lean) -> Option<String> {
    Some(o.namespace().unwrap_or_default())
}

#[derive(Debug, Default)]
struct Groups {
    members: HashMap<String, HashSet<ObjectKey>>,
    group_of: HashMap<ObjectKey, String>,
}

impl Groups {
    fn insert(&mut self, key: ObjectKey, group: Option<String>) {
        self.remove(&key);
        if let Some(group) = group {
            self.members
                .entry(group.clone())
                .or_default()
                .insert(key.clone());
            self.group_of.insert(key, group);
        }
    }

    fn remove(&mut self, key: &ObjectKey) {
        if let Some(old) = self.group_of.remove(key)
            && let Some(m) = self.members.get_mut(&old)
        {
            m.remove(key);
            if m.is_empty() {
                self.members.remove(&old);
            }
        }
    }
}

#[derive(Debug, Default)]
struct State {
    live: Groups,
    /// A relist in progress: replaces `live` when it completes.
    next: Option<Groups>,
}

/// The keys of one store's objects, grouped by a property.
#[derive(Debug)]
pub struct Index {
    by: GroupBy,
    state: Mutex<State>,
}

fn key_of(o: &Lean) -> ObjectKey {
    ObjectKey::of(o)
}

impl Index {
    /// An empty index grouping by `by`.
    pub fn new(by: GroupBy) -> Arc<Self> {
        Arc::new(Index {
            by,
            state: Mutex::default(),
        })
    }

    /// Follows one event of the watch stream that feeds the store.
    pub fn record(&self, event: &watcher::Event<Lean>) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        match event {
            watcher::Event::Init => state.next = Some(Groups::default()),
            watcher::Event::InitApply(o) => {
                let group = (self.by)(o);
                state
                    .next
                    .get_or_insert_with(Groups::default)
                    .insert(key_of(o), group);
            }
            watcher::Event::InitDone => {
                if let Some(next) = state.next.take() {
                    state.live = next;
                }
            }
            watcher::Event::Apply(o) => {
                let group = (self.by)(o);
                state.live.insert(key_of(o), group);
            }
            watcher::Event::Delete(o) => state.live.remove(&key_of(o)),
        }
    }

    /// The keys in `group`.
    pub fn keys(&self, group: &str) -> Vec<ObjectKey> {
        self.state
            .lock()
            .map(|s| {
                s.live
                    .members
                    .get(group)
                    .map(|m| m.iter().cloned().collect())
                    .unwrap_or_default()
            })
            .unwrap_or_default()
    }
}

/// One cached object of a [`Cache`]: its JSON text (what a reconcile sends the module).
#[derive(Debug, Clone)]
struct Entry {
    group: Option<String>,
    json: Arc<str>,
}

#[derive(Debug, Default)]
struct Contents {
    objects: HashMap<ObjectKey, Entry>,
    groups: HashMap<String, HashSet<ObjectKey>>,
}

impl Contents {
    fn insert(&mut self, key: ObjectKey, entry: Entry) {
        self.remove(&key);
        if let Some(group) = &entry.group {
            self.groups
                .entry(group.clone())
                .or_default()
                .insert(key.clone());
        }
        self.objects.insert(key, entry);
    }

    fn remove(&mut self, key: &ObjectKey) {
        let Some(old) = self.objects.remove(key) else {
            return;
        };
        if let Some(group) = old.group
            && let Some(members) = self.groups.get_mut(&group)
        {
            members.remove(key);
            if members.is_empty() {
                self.groups.remove(&group);
            }
        }
    }
}

#[derive(Debug, Default)]
struct CacheState {
    live: Contents,
    /// A relist in progress: replaces `live` when it completes.
    next: Option<Contents>,
}

/// The compact cache of one owned or related kind: each object as its JSON text, grouped by a
/// property (children by their controller's uid, related objects by namespace).
///
/// A `serde_json::Value` costs several times its JSON text (every JSON object is a B-tree
/// with its own node allocations), and a reconcile sends the module JSON text anyway; so the
/// cache keeps the text the watch event brought (no `Value` is built for it, see [`Lean`]), and
/// a reconcile parses only the few objects it reads (see `docs/benchmarks.md`, "Cache memory
/// per object").
///
/// # Guarantees
/// - The cache follows its watch stream as kube-runtime's reflector store does: applied objects
///   are (re)stored and (re)grouped, deleted ones dropped, and a relist replaces the whole
///   contents when it completes (until then reads see the contents from before it).
/// - An object's text is exactly the text the stream delivered, without `managedFields`
///   ([`Lean::json`]): no `serde_json::Value` is built for it.
/// - A lookup by group returns exactly the stored objects of that group: the index and the
///   objects change together, under one lock.
///
/// # Errors
/// Nothing here fails: a poisoned lock yields empty lookups.
#[derive(Debug)]
pub struct Cache {
    by: GroupBy,
    state: std::sync::RwLock<CacheState>,
    /// Whether a first list has completed.
    ready: tokio::sync::watch::Sender<bool>,
}

/// One object as the cache holds it: its key and its JSON text.
pub type Text = (ObjectKey, Arc<str>);

/// One kind's objects of a group (a primary's children of that kind), as a cache holds them.
#[derive(Debug, Clone)]
pub struct KindTexts {
    /// The objects' kind.
    pub kind: crate::contract::Gvk,
    /// The objects, sorted by key.
    pub objects: Vec<Text>,
}

impl Cache {
    /// An empty cache grouping by `by`.
    pub fn new(by: GroupBy) -> Arc<Self> {
        Arc::new(Cache {
            by,
            state: std::sync::RwLock::default(),
            ready: tokio::sync::watch::Sender::new(false),
        })
    }

    fn entry(&self, o: &Lean) -> Entry {
        Entry {
            group: (self.by)(o),
            json: o.json().clone(),
        }
    }

    /// Follows one event of the watch stream. Returns false for an object of a relist that
    /// the cache already holds as it is (same text, resourceVersion included): nothing about it
    /// changed, so it calls for no reconcile; true otherwise.
    pub fn record(&self, event: &watcher::Event<Lean>) -> bool {
        let entry = match event {
            watcher::Event::InitApply(o) | watcher::Event::Apply(o) => Some(self.entry(o)),
            _ => None,
        };
        let Ok(mut state) = self.state.write() else {
            return true;
        };
        let changed = match (event, &entry) {
            (watcher::Event::InitApply(o), Some(entry)) => state
                .live
                .objects
                .get(&key_of(o))
                .is_none_or(|held| held.json != entry.json),
            _ => true,
        };
        match (event, entry) {
            (watcher::Event::Init, _) => state.next = Some(Contents::default()),
            (watcher::Event::InitApply(o), Some(entry)) => state
                .next
                .get_or_insert_with(Contents::default)
                .insert(key_of(o), entry),
            (watcher::Event::InitDone, _) => {
                if let Some(next) = state.next.take() {
                    state.live = next;
                }
                drop(state);
                self.ready.send_replace(true);
            }
            (watcher::Event::Apply(o), Some(entry)) => state.live.insert(key_of(o), entry),
            (watcher::Event::Apply(o) | watcher::Event::Delete(o), None) => {
                state.live.remove(&key_of(o))
            }
            (watcher::Event::InitApply(_), None) => {}
            (watcher::Event::Delete(_), Some(_)) => {}
        }
        changed
    }

    /// Resolves once the cache has completed its first list (at once if it has).
    pub async fn ready(&self) {
        let mut ready = self.ready.subscribe();
        // The sender lives as long as `self`: waiting cannot fail.
        let _ = ready.wait_for(|r| *r).await;
    }

    /// How many objects the cache holds.
    pub fn len(&self) -> usize {
        self.state.read().map(|s| s.live.objects.len()).unwrap_or(0)
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The objects in `group`, sorted by key.
    pub fn group(&self, group: &str) -> Vec<Text> {
        let Ok(state) = self.state.read() else {
            return Vec::new();
        };
        let live = &state.live;
        let mut out: Vec<Text> = live
            .groups
            .get(group)
            .into_iter()
            .flatten()
            .filter_map(|k| live.objects.get(k).map(|e| (k.clone(), e.json.clone())))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Every object, sorted by key.
    pub fn all(&self) -> Vec<Text> {
        let Ok(state) = self.state.read() else {
            return Vec::new();
        };
        let mut out: Vec<Text> = state
            .live
            .objects
            .iter()
            .map(|(k, e)| (k.clone(), e.json.clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The objects of `namespace` whose key `keep` rejects, parsed (a namespace's relist, see
    /// [`super::scope`]). An object whose text no longer parses is skipped.
    pub fn held_in(&self, namespace: &str, keep: &dyn Fn(&ObjectKey) -> bool) -> Vec<Lean> {
        let Ok(state) = self.state.read() else {
            return Vec::new();
        };
        state
            .live
            .objects
            .iter()
            .filter(|(k, _)| k.namespace.as_deref() == Some(namespace) && !keep(k))
            .filter_map(|(_, e)| Lean::parse(&e.json).ok())
            .collect()
    }
}

/// The labels of an object given as JSON text (empty when it has none or does not parse).
pub fn labels_of(json: &str) -> std::collections::BTreeMap<String, String> {
    #[derive(serde::Deserialize, Default)]
    struct Meta {
        #[serde(default)]
        labels: Option<std::collections::BTreeMap<String, String>>,
    }
    #[derive(serde::Deserialize)]
    struct Object {
        #[serde(default)]
        metadata: Option<Meta>,
    }
    serde_json::from_str::<Object>(json)
        .ok()
        .and_then(|o| o.metadata)
        .and_then(|m| m.labels)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn child(name: &str, owner: Option<&str>) -> Lean {
        child_at(name, owner, None)
    }

    fn child_at(name: &str, owner: Option<&str>, rv: Option<&str>) -> Lean {
        let refs = owner.map(|uid| {
            json!([{"apiVersion": "v1", "kind": "App", "name": "a", "uid": uid, "controller": true}])
        });
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "ns", "ownerReferences": refs,
                         "resourceVersion": rv}
        }))
        .unwrap_or_else(|e| panic!("literal: {e}"))
    }

    fn names(index: &Index, group: &str) -> Vec<String> {
        let mut n: Vec<String> = index.keys(group).into_iter().map(|k| k.name).collect();
        n.sort();
        n
    }

    #[test]
    fn children_are_grouped_by_their_controller_and_follow_changes() {
        let index = Index::new(controller_uid);
        index.record(&watcher::Event::Init);
        index.record(&watcher::Event::InitApply(child("a1", Some("u1"))));
        index.record(&watcher::Event::InitApply(child("a2", Some("u1"))));
        index.record(&watcher::Event::InitApply(child("b1", Some("u2"))));
        index.record(&watcher::Event::InitApply(child("free", None)));
        assert!(names(&index, "u1").is_empty(), "a relist shows when done");
        index.record(&watcher::Event::InitDone);
        assert_eq!(names(&index, "u1"), ["a1", "a2"]);
        assert_eq!(names(&index, "u2"), ["b1"]);

        // An owner change moves the child; a delete drops it.
        index.record(&watcher::Event::Apply(child("a2", Some("u2"))));
        index.record(&watcher::Event::Delete(child("b1", Some("u2"))));
        assert_eq!(names(&index, "u1"), ["a1"]);
        assert_eq!(names(&index, "u2"), ["a2"]);

        // A relist replaces everything: what it does not list is gone.
        index.record(&watcher::Event::Init);
        index.record(&watcher::Event::InitApply(child("a1", Some("u1"))));
        index.record(&watcher::Event::InitDone);
        assert_eq!(names(&index, "u1"), ["a1"]);
        assert!(names(&index, "u2").is_empty());
    }

    fn texts(cache: &Cache, group: &str) -> Vec<String> {
        cache
            .group(group)
            .into_iter()
            .map(|(k, _)| k.name)
            .collect()
    }

    #[test]
    fn the_cache_keeps_each_object_as_the_json_text_of_what_the_watch_delivered() {
        let cache = Cache::new(controller_uid);
        let sent = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {
                "name": "web", "namespace": "ns", "uid": "d1", "resourceVersion": "42",
                "labels": {"app": "web"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "App", "name": "a", "uid": "u1", "controller": true}]
            },
            "spec": {"replicas": 1, "template": {"metadata": {"labels": {"app": "web"}}}},
            "status": {"conditions": [{"type": "Available", "status": "True"}]}
        });
        let text = sent.to_string();
        let o = Lean::parse(&text).unwrap_or_else(|e| panic!("literal: {e}"));
        cache.record(&watcher::Event::Init);
        cache.record(&watcher::Event::InitApply(o.clone()));
        cache.record(&watcher::Event::InitDone);
        let got = cache.group("u1");
        assert_eq!(got.len(), 1);
        // Byte for byte the text the watch delivered, and the same JSON value.
        assert_eq!(&*got[0].1, text.as_str());
        let back: serde_json::Value =
            serde_json::from_str(&got[0].1).unwrap_or_else(|e| panic!("parse: {e}"));
        assert_eq!(back, sent);
        assert_eq!(
            labels_of(&got[0].1).get("app").map(String::as_str),
            Some("web")
        );
        assert_eq!(cache.all().len(), 1);
    }

    /// Reliability item 8: a relist (a range change, a 410 Gone) reconciles the primaries whose
    /// children changed, not every primary with children.
    #[test]
    fn a_relisted_object_the_cache_held_unchanged_calls_for_nothing() {
        let cache = Cache::new(controller_uid);
        let at = |rv: &str| child_at("a1", Some("u1"), Some(rv));
        assert!(cache.record(&watcher::Event::Init));
        assert!(
            cache.record(&watcher::Event::InitApply(at("1"))),
            "first seen"
        );
        assert!(cache.record(&watcher::Event::InitDone));
        cache.record(&watcher::Event::Init);
        assert!(
            !cache.record(&watcher::Event::InitApply(at("1"))),
            "held as it is"
        );
        assert!(cache.record(&watcher::Event::InitApply(child("b1", Some("u2")))));
        cache.record(&watcher::Event::InitDone);
        cache.record(&watcher::Event::Init);
        assert!(cache.record(&watcher::Event::InitApply(at("2"))), "changed");
        assert!(
            cache.record(&watcher::Event::Apply(at("2"))),
            "a live event"
        );
    }

    #[test]
    fn cache_lookups_return_only_what_the_cache_holds() {
        let cache = Cache::new(controller_uid);
        assert!(cache.group("u1").is_empty(), "empty before any list");
        cache.record(&watcher::Event::Init);
        cache.record(&watcher::Event::InitApply(child("a1", Some("u1"))));
        cache.record(&watcher::Event::InitApply(child("a2", Some("u1"))));
        cache.record(&watcher::Event::InitApply(child("free", None)));
        assert!(cache.group("u1").is_empty(), "a relist shows when done");
        assert_eq!(cache.len(), 0);
        cache.record(&watcher::Event::InitDone);
        assert_eq!(texts(&cache, "u1"), ["a1", "a2"]);
        assert_eq!(cache.len(), 3, "ungrouped objects are held too");

        // A delete drops the object and its group entry; an owner change moves it.
        cache.record(&watcher::Event::Delete(child("a2", Some("u1"))));
        cache.record(&watcher::Event::Apply(child("a1", Some("u2"))));
        assert!(texts(&cache, "u1").is_empty());
        assert_eq!(texts(&cache, "u2"), ["a1"]);
        assert_eq!(cache.len(), 2);

        // A relist replaces everything: what it does not list is gone.
        cache.record(&watcher::Event::Init);
        cache.record(&watcher::Event::InitApply(child("b1", Some("u3"))));
        assert_eq!(
            texts(&cache, "u2"),
            ["a1"],
            "reads see the old contents meanwhile"
        );
        cache.record(&watcher::Event::InitDone);
        assert!(texts(&cache, "u2").is_empty());
        assert_eq!(texts(&cache, "u3"), ["b1"]);
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn a_namespace_relist_reads_what_the_cache_held_as_whole_objects() {
        let cache = Cache::new(controller_uid);
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(child("kept", Some("u1"))),
            watcher::Event::InitApply(child("lost", Some("u1"))),
            watcher::Event::InitDone,
        ] {
            cache.record(&e);
        }
        let listed: HashSet<ObjectKey> = [ObjectKey::new(Some("ns".to_string()), "kept")].into();
        let dropped = cache.held_in("ns", &|k| listed.contains(k));
        assert_eq!(dropped.len(), 1);
        assert_eq!(dropped[0].name_any(), "lost");
        assert_eq!(controller_uid(&dropped[0]).as_deref(), Some("u1"));
        assert!(cache.held_in("other", &|_| false).is_empty());
    }

    #[tokio::test]
    async fn the_cache_is_ready_after_its_first_list() {
        let cache = Cache::new(namespace);
        cache.record(&watcher::Event::Init);
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), cache.ready());
        assert!(waiting.await.is_err(), "not ready while listing");
        cache.record(&watcher::Event::InitDone);
        cache.ready().await;
    }
}
