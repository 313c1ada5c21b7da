//! Creating the Apps in bulk and watching them converge.
//!
//! An App has converged when its Deployment and its Service (same name) exist and its
//! `status.observedGeneration == metadata.generation`. [`Tracker`] follows watches of the three
//! kinds in the namespace, or in every namespace (never the controller), and counts converged
//! Apps as events arrive. [`Layout`] says where the Apps live: all in one namespace, or spread
//! over many (what sharding by namespace needs).
//!
//! # Guarantees
//! - [`Tracker::start`] returns once the three watches have delivered their initial state, so no
//!   change after it is missed.
//! - [`Tracker::wait`] reports the instant of the watch event that completed convergence.
//! - [`Tracker::history`] holds every change of the converged count the watches saw (for the
//!   chart), taken from the same events: no request of its own.
//!
//! # Errors
//! [`Error::Kube`] for failed creates; [`Error::Timeout`] when the budget runs out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::watch;

use crate::{Error, Result};

/// Apps at once while creating.
pub const CREATE_CONCURRENCY: usize = 16;

/// The App resource.
pub fn app_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(crate::native::GROUP, "v1", "App"),
        "apps",
    )
}

/// Apps in `ns`.
pub fn apps(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &app_resource())
}

/// The name of App `i`.
pub fn app_name(i: usize) -> String {
    format!("app-{i:05}")
}

/// Where the Apps live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// All in [`crate::cluster::NAMESPACE`].
    One,
    /// Round-robin over this many namespaces `0-apps`, `1-apps`, ... (never more than the Apps).
    /// The varying part comes first: FNV-1a, the shard hash, leaves names that differ only in
    /// their last bytes close together in the hash space.
    Spread(usize),
}

impl Layout {
    /// How many namespaces `n` Apps use.
    pub fn count(self, n: usize) -> usize {
        match self {
            Layout::One => 1,
            Layout::Spread(m) => m.clamp(1, n.max(1)),
        }
    }

    /// The namespace of App `i` of `n`.
    pub fn namespace(self, i: usize, n: usize) -> String {
        match self {
            Layout::One => crate::cluster::NAMESPACE.into(),
            Layout::Spread(_) => format!("{}-apps", i % self.count(n)),
        }
    }

    /// Every namespace `n` Apps use.
    pub fn namespaces(self, n: usize) -> Vec<String> {
        (0..self.count(n)).map(|i| self.namespace(i, n)).collect()
    }

    /// The namespace the [`Tracker`] watches: `None` for all.
    pub fn watched(self) -> Option<&'static str> {
        match self {
            Layout::One => Some(crate::cluster::NAMESPACE),
            Layout::Spread(_) => None,
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Flags {
    app: bool,
    deployment: bool,
    service: bool,
}

impl Flags {
    fn ok(self) -> bool {
        self.app && self.deployment && self.service
    }
}

/// A watch event, by `namespace/name`.
enum Seen {
    App(String, bool),
    Deployment(String, bool),
    Service(String, bool),
    Ready,
}

/// Converged Apps so far, and when the count last changed.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Converged Apps.
    pub converged: usize,
    /// When that count was reached.
    pub at: Instant,
    /// How many of the three watches have delivered their initial state.
    pub ready: usize,
}

/// Follows the Apps, Deployments and Services of a namespace.
#[derive(Debug)]
pub struct Tracker {
    progress: watch::Receiver<Progress>,
    history: Arc<Mutex<Vec<(Instant, usize)>>>,
    task: tokio::task::JoinHandle<()>,
}

fn app_converged(app: &DynamicObject) -> bool {
    let observed = app.data["status"]["observedGeneration"].as_i64();
    observed.is_some() && observed == app.metadata.generation
}

/// `namespace/name`.
fn key<K: kube::Resource>(o: &K) -> String {
    format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any())
}

/// The API of a kind in `ns`, or in every namespace.
fn scoped<K>(client: &Client, ns: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The watch events of one kind as [`Seen`] (present or deleted, by name).
fn seen<K, F>(api: Api<K>, f: F) -> impl futures::Stream<Item = Seen> + Send
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default + Clone + Eq + std::hash::Hash,
    F: Fn(String, &K, bool) -> Seen + Send + Clone + 'static,
{
    watcher(api, watcher::Config::default())
        .default_backoff()
        .filter_map(move |e| {
            let f = f.clone();
            async move {
                match e.ok()? {
                    watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                        Some(f(key(&o), &o, true))
                    }
                    watcher::Event::Delete(o) => Some(f(key(&o), &o, false)),
                    watcher::Event::InitDone => Some(Seen::Ready),
                    watcher::Event::Init => None,
                }
            }
        })
}

impl Tracker {
    /// Starts the watches (in `ns`, or in every namespace) and waits until they have delivered
    /// the current state.
    ///
    /// # Errors
    /// [`Error::Other`] if they do not within a minute.
    pub async fn start(client: &Client, ns: Option<&str>) -> Result<Self> {
        let app_api = match ns {
            Some(ns) => apps(client, ns),
            None => Api::all_with(client.clone(), &app_resource()),
        };
        let apps = watcher(app_api, watcher::Config::default())
            .default_backoff()
            .filter_map(|e| async move {
                match e.ok()? {
                    watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                        Some(Seen::App(key(&o), app_converged(&o)))
                    }
                    watcher::Event::Delete(o) => Some(Seen::App(key(&o), false)),
                    watcher::Event::InitDone => Some(Seen::Ready),
                    watcher::Event::Init => None,
                }
            });
        let deployments = seen(scoped::<Deployment>(client, ns), |n, _, p| {
            Seen::Deployment(n, p)
        });
        let services = seen(scoped::<Service>(client, ns), |n, _, p| Seen::Service(n, p));
        let mut all =
            futures::stream::select_all([apps.boxed(), deployments.boxed(), services.boxed()]);
        let (tx, rx) = watch::channel(Progress {
            converged: 0,
            at: Instant::now(),
            ready: 0,
        });
        let history = Arc::new(Mutex::new(Vec::new()));
        let changes = Arc::clone(&history);
        let task = tokio::spawn(async move {
            let mut state: HashMap<String, Flags> = HashMap::new();
            let mut progress = *tx.borrow();
            while let Some(event) = all.next().await {
                let (name, which, value) = match event {
                    Seen::App(n, ok) => (n, 0, ok),
                    Seen::Deployment(n, present) => (n, 1, present),
                    Seen::Service(n, present) => (n, 2, present),
                    Seen::Ready => {
                        progress.ready += 1;
                        let _ = tx.send(progress);
                        continue;
                    }
                };
                let flags = state.entry(name).or_default();
                let before = flags.ok();
                match which {
                    0 => flags.app = value,
                    1 => flags.deployment = value,
                    _ => flags.service = value,
                }
                let after = flags.ok();
                if before != after {
                    if after {
                        progress.converged += 1;
                    } else {
                        progress.converged = progress.converged.saturating_sub(1);
                    }
                    progress.at = Instant::now();
                    changes
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((progress.at, progress.converged));
                    let _ = tx.send(progress);
                }
            }
        });
        let mut tracker = Tracker {
            progress: rx,
            history,
            task,
        };
        tokio::time::timeout(
            Duration::from_secs(60),
            tracker.progress.wait_for(|p| p.ready >= 3),
        )
        .await
        .map_err(|_| {
            Error::Other(
                "the watches of Apps, Deployments and Services did not start within 60 s".into(),
            )
        })?
        .map_err(|_| Error::Other("the watches ended".into()))?;
        Ok(tracker)
    }

    /// Converged Apps now.
    pub fn converged(&self) -> usize {
        self.progress.borrow().converged
    }

    /// Every change of the converged count so far: (when, converged Apps), in time order.
    pub fn history(&self) -> Vec<(Instant, usize)> {
        self.history
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits until `n` Apps have converged; returns when that happened.
    ///
    /// # Errors
    /// [`Error::Timeout`] after `timeout`.
    pub async fn wait(&mut self, contender: &str, n: usize, timeout: Duration) -> Result<Instant> {
        let reached = tokio::time::timeout(timeout, self.progress.wait_for(|p| p.converged >= n))
            .await
            .map(|r| r.map(|p| p.at));
        match reached {
            Ok(Ok(at)) => Ok(at),
            _ => Err(Error::Timeout {
                contender: contender.into(),
                converged: self.converged(),
                n,
                seconds: timeout.as_secs(),
            }),
        }
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Creates Apps `0..n` where `layout` puts them, [`CREATE_CONCURRENCY`] at a time; returns
/// when the first create was sent.
///
/// # Errors
/// The first failed create.
pub async fn create_apps(client: &Client, layout: Layout, n: usize) -> Result<Instant> {
    let started = Instant::now();
    futures::stream::iter((0..n).map(|i| {
        let api = apps(client, &layout.namespace(i, n));
        async move {
            let app: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "example.wasmop.dev/v1", "kind": "App",
                "metadata": {"name": app_name(i)},
                "spec": {"image": "nginx:1.27", "replicas": 1, "port": 8080}
            }))
            .map_err(|e| Error::Other(format!("an App: {e}")))?;
            api.create(&PostParams::default(), &app)
                .await
                .map_err(Error::kube(format!("creating App {}", app_name(i))))?;
            Ok::<_, Error>(())
        }
    }))
    .buffer_unordered(CREATE_CONCURRENCY)
    .try_collect::<Vec<_>>()
    .await?;
    Ok(started)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_place_apps_round_robin() {
        assert_eq!(Layout::One.namespaces(10), vec!["demo"]);
        assert_eq!(Layout::One.namespace(7, 10), "demo");
        assert_eq!(Layout::Spread(4).namespaces(10).len(), 4);
        assert_eq!(Layout::Spread(4).namespace(5, 10), "1-apps");
        // Never more namespaces than Apps, never none.
        assert_eq!(
            Layout::Spread(100).namespaces(3),
            vec!["0-apps", "1-apps", "2-apps"]
        );
        assert_eq!(Layout::Spread(0).count(5), 1);
        assert_eq!(Layout::Spread(100).watched(), None);
    }
}
