//! The API server's own request counters (`apiserver_request_total` on `/metrics`), summed by
//! verb, group, resource and subresource, and the differences between two readings.
//!
//! # Guarantees
//! - Counts every request the API server answered, whoever sent it (the bench's own watches and
//!   App creates too; [`Requests::controller_writes`] names what it counts).
//!
//! # Errors
//! [`Error::Kube`] when `/metrics` cannot be read.

use std::collections::BTreeMap;

use kube::Client;

use crate::{Error, Result};

/// One series key: (verb, group, resource, subresource).
pub type Key = (String, String, String, String);

/// Request counts by key.
#[derive(Debug, Clone, Default)]
pub struct Requests(pub BTreeMap<Key, f64>);

/// The verbs that write.
pub const WRITE_VERBS: [&str; 6] = [
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

fn label<'a>(labels: &'a str, name: &str) -> &'a str {
    let pattern = format!("{name}=\"");
    labels
        .split_once(&format!(",{pattern}"))
        .or_else(|| labels.strip_prefix(&pattern).map(|r| ("", r)))
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(v, _)| v)
        .unwrap_or("")
}

/// Whether requests to `group`/`resource`/`sub` are a controller of Apps' own: Apps (and their
/// status), Deployments and Services (not their status, which the controller-manager writes),
/// and `events.k8s.io` Events (the controller-manager's own Events are core/v1).
fn controller_kind(group: &str, resource: &str, sub: &str) -> bool {
    match resource {
        "apps" => group == crate::native::GROUP,
        "deployments" | "services" => sub.is_empty(),
        "events" => group == "events.k8s.io",
        _ => false,
    }
}

impl Requests {
    /// Parses a Prometheus text exposition.
    pub fn parse(text: &str) -> Self {
        let mut out = BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let Ok(value) = value.trim().parse::<f64>() else {
                continue;
            };
            let key = (
                label(labels, "verb").to_string(),
                label(labels, "group").to_string(),
                label(labels, "resource").to_string(),
                label(labels, "subresource").to_string(),
            );
            *out.entry(key).or_insert(0.0) += value;
        }
        Requests(out)
    }

    /// Reads the counters now.
    ///
    /// # Errors
    /// See the module docs.
    pub async fn read(client: &Client) -> Result<Self> {
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| Error::Other(format!("building GET /metrics: {e}")))?;
        let text = client
            .request_text(request)
            .await
            .map_err(Error::kube("reading the API server's /metrics"))?;
        Ok(Self::parse(&text))
    }

    /// `self - before`, dropping zeros.
    pub fn since(&self, before: &Requests) -> Requests {
        Requests(
            self.0
                .iter()
                .filter_map(|(k, v)| {
                    let d = v - before.0.get(k).copied().unwrap_or(0.0);
                    (d > 0.0).then(|| (k.clone(), d))
                })
                .collect(),
        )
    }

    /// Writes a controller of Apps makes: any write to `apps` (and `apps/status`), to
    /// Deployments and Services (not their status, which the controller-manager writes), and to
    /// `events.k8s.io` Events (the controller-manager's own Events are core/v1).
    pub fn controller_writes(&self) -> f64 {
        self.0
            .iter()
            .filter(|((verb, group, resource, sub), _)| {
                WRITE_VERBS.contains(&verb.as_str()) && controller_kind(group, resource, sub)
            })
            .map(|(_, v)| v)
            // (An empty f64 sum is -0.0.)
            .fold(0.0, |a, b| a + b)
    }

    /// What a controller of Apps costs per App (`apps` of them): its writes (see
    /// [`Requests::controller_writes`]) and its reads (GET) of the same kinds, by
    /// `VERB resource[/sub]`, without the bench's own App creates (`POST apps`, one per App).
    pub fn per_app_by_kind(&self, apps: usize) -> Vec<(String, f64)> {
        let mut out: BTreeMap<String, f64> = BTreeMap::new();
        for ((verb, group, resource, sub), v) in &self.0 {
            let counted = WRITE_VERBS.contains(&verb.as_str()) || verb == "GET";
            if !counted || !controller_kind(group, resource, sub) {
                continue;
            }
            let what = if sub.is_empty() {
                resource.clone()
            } else {
                format!("{resource}/{sub}")
            };
            *out.entry(format!("{verb} {what}")).or_insert(0.0) += v;
        }
        if let Some(creates) = out.get_mut("POST apps") {
            *creates -= apps as f64;
        }
        let apps = apps.max(1) as f64;
        out.into_iter()
            .filter(|(_, v)| *v > 0.0)
            .map(|(k, v)| (k, v / apps))
            .collect()
    }

    /// Every request counted.
    pub fn total(&self) -> f64 {
        self.0.values().fold(0.0, |a, b| a + b)
    }

    /// Writes to `coordination.k8s.io` Leases: sharded replicas' member Leases, and the node
    /// Leases kwok renews for its nodes in every row.
    pub fn lease_writes(&self) -> f64 {
        self.0
            .iter()
            .filter(|((verb, group, resource, _), _)| {
                WRITE_VERBS.contains(&verb.as_str())
                    && group == "coordination.k8s.io"
                    && resource == "leases"
            })
            .map(|(_, v)| v)
            .fold(0.0, |a, b| a + b)
    }

    /// The writes of [`Requests::controller_writes`], by `VERB resource[/sub]`.
    pub fn controller_writes_by_kind(&self) -> Vec<(String, f64)> {
        let mut out: BTreeMap<String, f64> = BTreeMap::new();
        for ((verb, group, resource, sub), v) in &self.0 {
            let single = Requests(
                [(
                    (verb.clone(), group.clone(), resource.clone(), sub.clone()),
                    *v,
                )]
                .into(),
            );
            if single.controller_writes() > 0.0 {
                let what = if sub.is_empty() {
                    resource.clone()
                } else {
                    format!("{resource}/{sub}")
                };
                *out.entry(format!("{verb} {what}")).or_insert(0.0) += v;
            }
        }
        out.into_iter().collect()
    }

    /// All requests by `VERB resource[/sub]`, largest first.
    pub fn by_verb_resource(&self) -> Vec<(String, f64)> {
        let mut out: BTreeMap<String, f64> = BTreeMap::new();
        for ((verb, _, resource, sub), v) in &self.0 {
            let what = if sub.is_empty() {
                resource.clone()
            } else {
                format!("{resource}/{sub}")
            };
            *out.entry(format!("{verb} {what}")).or_insert(0.0) += v;
        }
        let mut out: Vec<_> = out.into_iter().collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_counts_controller_writes() {
        let text = r#"# HELP apiserver_request_total x
apiserver_request_total{code="201",component="apiserver",dry_run="",group="apps",resource="deployments",scope="resource",subresource="",verb="APPLY",version="v1"} 5
apiserver_request_total{code="200",component="apiserver",dry_run="",group="apps",resource="deployments",scope="resource",subresource="status",verb="PUT",version="v1"} 7
apiserver_request_total{code="200",component="apiserver",dry_run="",group="example.wasmop.dev",resource="apps",scope="resource",subresource="status",verb="PUT",version="v1"} 3
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="events",scope="resource",subresource="",verb="POST",version="v1"} 11
apiserver_request_total{code="201",component="apiserver",dry_run="",group="events.k8s.io",resource="events",scope="resource",subresource="",verb="POST",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="services",scope="resource",subresource="",verb="GET",version="v1"} 4
"#;
        let before = Requests::parse(text);
        assert_eq!(before.controller_writes(), 10.0);
        let empty = Requests::default();
        assert_eq!(before.since(&empty).0.len(), 6);
        assert_eq!(before.since(&before).0.len(), 0);
        assert_eq!(before.total(), 32.0);
        assert_eq!(before.lease_writes(), 0.0);
        let leases = Requests::parse(
            r#"apiserver_request_total{code="200",group="coordination.k8s.io",resource="leases",subresource="",verb="PUT",version="v1"} 9
apiserver_request_total{code="200",group="coordination.k8s.io",resource="leases",subresource="",verb="GET",version="v1"} 4
"#,
        );
        assert_eq!(leases.lease_writes(), 9.0);
        assert_eq!(label("a=\"1\",verb=\"GET\"", "verb"), "GET");
        assert_eq!(label("verb=\"GET\",a=\"1\"", "verb"), "GET");
    }

    #[test]
    fn requests_per_app_leave_out_the_bench_creates_and_others_kinds() {
        let group = crate::native::GROUP;
        let text = format!(
            r#"apiserver_request_total{{group="{group}",resource="apps",subresource="",verb="POST"}} 10
apiserver_request_total{{group="{group}",resource="apps",subresource="status",verb="APPLY"}} 10
apiserver_request_total{{group="apps",resource="deployments",subresource="",verb="APPLY"}} 10
apiserver_request_total{{group="apps",resource="deployments",subresource="",verb="GET"}} 5
apiserver_request_total{{group="apps",resource="deployments",subresource="status",verb="PUT"}} 30
apiserver_request_total{{group="",resource="events",subresource="",verb="POST"}} 40
apiserver_request_total{{group="events.k8s.io",resource="events",subresource="",verb="POST"}} 10
"#
        );
        let per_app = Requests::parse(&text).per_app_by_kind(10);
        assert_eq!(
            per_app,
            vec![
                ("APPLY apps/status".to_string(), 1.0),
                ("APPLY deployments".to_string(), 1.0),
                ("GET deployments".to_string(), 0.5),
                ("POST events".to_string(), 1.0),
            ]
        );
    }
}
