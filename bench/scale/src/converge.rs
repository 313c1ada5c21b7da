//! Creating the Apps in bulk and watching them converge.
//!
//! An App has converged when its Deployment and its Service (same name) exist and its
//! `status.observedGeneration == metadata.generation`; it is *ready* when it has converged and
//! its Deployment has rolled out (see [`deployment_ready`]), which no controller can claim by
//! writing a status. [`Tracker`] follows watches of the three kinds in the namespace, or in
//! every namespace (never the controller), and counts converged and ready Apps as events
//! arrive. [`Layout`] says where the Apps live: all in one namespace, or spread over many (what
//! sharding by namespace needs).
//!
//! # Guarantees
//! - [`Tracker::start`] returns once the three watches have delivered their initial state, so no
//!   change after it is missed.
//! - [`Tracker::wait`] reports the instant of the watch event that completed convergence;
//!   [`Tracker::all_ready`] the instant of the one that made the last App ready.
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
    /// The Deployment has rolled out ([`deployment_ready`]).
    rolled_out: bool,
}

impl Flags {
    fn ok(self) -> bool {
        self.app && self.deployment && self.service
    }

    fn ready(self) -> bool {
        self.ok() && self.rolled_out
    }

    fn apply(&mut self, change: Change) {
        match change {
            Change::App(converged) => self.app = converged,
            Change::Deployment(present, rolled_out) => {
                self.deployment = present;
                self.rolled_out = rolled_out;
            }
            Change::Service(present) => self.service = present,
        }
    }
}

/// Whether `deployment` has rolled out its current spec: the Deployment controller observed
/// its generation and as many replicas are ready as it asks for (1 when unset).
pub fn deployment_ready(deployment: &Deployment) -> bool {
    let wanted = deployment.spec.replicas.unwrap_or(1);
    deployment.status.as_ref().is_some_and(|s| {
        s.observed_generation.is_some()
            && s.observed_generation == deployment.metadata.generation
            && s.ready_replicas.unwrap_or(0) >= wanted
    })
}

/// What a watch event says of one App's objects.
#[derive(Debug, Clone, Copy)]
enum Change {
    /// The App, converged or not (deleted: not).
    App(bool),
    /// Its Deployment: present, and rolled out.
    Deployment(bool, bool),
    /// Its Service: present.
    Service(bool),
}

/// A watch event: a change by `namespace/name`, or a watch done with its initial list.
enum Seen {
    Object(String, Change),
    Listed,
}

/// Converged and ready Apps so far, and when the counts last changed.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Converged Apps.
    pub converged: usize,
    /// When that count was reached.
    pub at: Instant,
    /// Ready Apps (converged, their Deployment rolled out).
    pub ready: usize,
    /// When that count was reached.
    pub ready_at: Instant,
    /// How many of the three watches have delivered their initial state.
    pub listed: usize,
}

impl Progress {
    /// The counts after `before` -> `after` of one App, at `now`; whether the converged count
    /// changed.
    fn count(&mut self, before: Flags, after: Flags, now: Instant) -> bool {
        let step = |count: &mut usize, at: &mut Instant, was: bool, is: bool| {
            if was != is {
                *count = if is {
                    *count + 1
                } else {
                    count.saturating_sub(1)
                };
                *at = now;
            }
        };
        step(
            &mut self.ready,
            &mut self.ready_at,
            before.ready(),
            after.ready(),
        );
        let converged = before.ok() != after.ok();
        step(&mut self.converged, &mut self.at, before.ok(), after.ok());
        converged
    }
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
                    watcher::Event::InitDone => Some(Seen::Listed),
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
                        Some(Seen::Object(key(&o), Change::App(app_converged(&o))))
                    }
                    watcher::Event::Delete(o) => Some(Seen::Object(key(&o), Change::App(false))),
                    watcher::Event::InitDone => Some(Seen::Listed),
                    watcher::Event::Init => None,
                }
            });
        let deployments = seen(scoped::<Deployment>(client, ns), |n, d, p| {
            Seen::Object(n, Change::Deployment(p, p && deployment_ready(d)))
        });
        let services = seen(scoped::<Service>(client, ns), |n, _, p| {
            Seen::Object(n, Change::Service(p))
        });
        let mut all =
            futures::stream::select_all([apps.boxed(), deployments.boxed(), services.boxed()]);
        let now = Instant::now();
        let (tx, rx) = watch::channel(Progress {
            converged: 0,
            at: now,
            ready: 0,
            ready_at: now,
            listed: 0,
        });
        let history = Arc::new(Mutex::new(Vec::new()));
        let changes = Arc::clone(&history);
        let task = tokio::spawn(async move {
            let mut state: HashMap<String, Flags> = HashMap::new();
            let mut progress = *tx.borrow();
            while let Some(event) = all.next().await {
                let (name, change) = match event {
                    Seen::Object(name, change) => (name, change),
                    Seen::Listed => {
                        progress.listed += 1;
                        let _ = tx.send(progress);
                        continue;
                    }
                };
                let flags = state.entry(name).or_default();
                let before = *flags;
                flags.apply(change);
                let (after, now) = (*flags, Instant::now());
                let converged = progress.count(before, after, now);
                if converged {
                    changes
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((progress.at, progress.converged));
                }
                if before.ok() != after.ok() || before.ready() != after.ready() {
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
            tracker.progress.wait_for(|p| p.listed >= 3),
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

    /// When the last of `n` Apps became ready (converged, its Deployment rolled out), if all
    /// are ready now.
    pub fn all_ready(&self, n: usize) -> Option<Instant> {
        let p = *self.progress.borrow();
        (p.ready >= n).then_some(p.ready_at)
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

    fn deployment(generation: i64, status: serde_json::Value) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "app-00001", "generation": generation},
            "spec": {"selector": {}, "template": {}},
            "status": status,
        }))
        .unwrap_or_else(|e| panic!("a Deployment: {e}"))
    }

    #[test]
    fn a_deployment_is_ready_once_its_generation_rolled_out() {
        let rolled = json!({"observedGeneration": 2, "readyReplicas": 1});
        assert!(deployment_ready(&deployment(2, rolled.clone())));
        // An older generation's readiness is not this spec's.
        assert!(!deployment_ready(&deployment(3, rolled)));
        assert!(!deployment_ready(&deployment(
            2,
            json!({"observedGeneration": 2})
        )));
        assert!(!deployment_ready(&deployment(
            1,
            json!({"readyReplicas": 1})
        )));
        let mut two = deployment(1, json!({"observedGeneration": 1, "readyReplicas": 1}));
        two.spec.replicas = Some(2);
        assert!(!deployment_ready(&two), "1 of 2 replicas ready");
    }

    #[test]
    fn an_app_counts_as_ready_only_once_converged_and_rolled_out() {
        let t0 = Instant::now();
        let mut p = Progress {
            converged: 0,
            at: t0,
            ready: 0,
            ready_at: t0,
            listed: 3,
        };
        let mut app = Flags::default();
        let step = |p: &mut Progress, app: &mut Flags, change: Change, at: Instant| {
            let before = *app;
            app.apply(change);
            p.count(before, *app, at)
        };
        let t = |ms| t0 + Duration::from_millis(ms);
        // Rolled out before the App's status is current: converged comes later, and ready
        // with it.
        assert!(!step(
            &mut p,
            &mut app,
            Change::Deployment(true, true),
            t(1)
        ));
        assert!(!step(&mut p, &mut app, Change::Service(true), t(2)));
        assert!(step(&mut p, &mut app, Change::App(true), t(3)));
        assert_eq!((p.converged, p.at, p.ready, p.ready_at), (1, t(3), 1, t(3)));
        // A new rollout: still converged, no longer ready, then ready again later.
        assert!(!step(
            &mut p,
            &mut app,
            Change::Deployment(true, false),
            t(4)
        ));
        assert_eq!((p.converged, p.ready), (1, 0));
        assert!(!step(
            &mut p,
            &mut app,
            Change::Deployment(true, true),
            t(5)
        ));
        assert_eq!((p.converged, p.at, p.ready, p.ready_at), (1, t(3), 1, t(5)));
        // The Service gone: neither.
        assert!(step(&mut p, &mut app, Change::Service(false), t(6)));
        assert_eq!((p.converged, p.ready), (0, 0));
    }
}
