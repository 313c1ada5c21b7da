//! wasmop's alerts and dashboard (deploy/monitoring/): `promtool check rules` and `promtool test
//! rules` (a unit test for every alert), every query of the rules and of the dashboard parsed by
//! promtool, and every `wasmop_*` series they name one the host's metrics registry really
//! encodes, so a renamed metric fails here and not on a silent dashboard.
//!
//! promtool is built from the Prometheus Go module and cached like the other tools
//! (`wasmop_testenv::assets::promtool_binary`). No control plane.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::*;
use serde_json::Value;

fn monitoring_dir() -> PathBuf {
    repo().join("deploy/monitoring")
}

async fn promtool() -> anyhow::Result<PathBuf> {
    Ok(tokio::task::spawn_blocking(wasmop_testenv::assets::promtool_binary).await??)
}

/// Runs promtool with `args` in deploy/monitoring/; its output, or an error with it.
fn run_promtool(promtool: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(promtool)
        .args(args)
        .current_dir(monitoring_dir())
        .output()?;
    output_of(&out, &format!("promtool {}", args.join(" ")))
}

/// The rule file's groups.
fn rules() -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(monitoring_dir().join("alerts.yaml"))?;
    Ok(serde_saphyr::from_str(&text)?)
}

/// Every alert's (name, expression).
fn alerts(rules: &Value) -> Vec<(String, String)> {
    rules["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| {
            Some((
                r["alert"].as_str()?.to_string(),
                r["expr"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// Every query of the dashboard's panels, with Grafana's variables given values Prometheus
/// parses (`$__rate_interval` a range, `$reconciler` a regular expression).
fn dashboard_queries() -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(monitoring_dir().join("dashboard.json"))?;
    let dashboard: Value = serde_json::from_str(&text)?;
    let queries: Vec<String> = dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .map(|q| {
            q.replace("$__rate_interval", "5m")
                .replace("$reconciler", ".*")
        })
        .collect();
    anyhow::ensure!(!queries.is_empty(), "the dashboard has no queries");
    Ok(queries)
}

/// Records one sample through every recording method of the host's metrics (reconciler
/// `monitoring-test`), so that every family has a series: the registry encodes a labelled
/// family only once it has one. Returns the work queue, whose gauges live as long as it does.
fn record_every_metric() -> wasmop::operations::metrics::Queue {
    use std::time::Duration;
    let m = wasmop::operations::metrics::global();
    let r = "monitoring-test";
    m.component_ready("monitoring-test", Some(true));
    m.webhook_certificate_expiry(1);
    m.server_connection(r, 0);
    m.server_rejected(r, r);
    m.reconciled(r, false, Duration::from_millis(1));
    drop(m.active(r));
    m.module_call(r, "validate", &wasmop::engine::CallStats::default());
    m.hotswap(r, "refused");
    m.module_active(r, Some("0000"));
    m.admission(r, true);
    m.admission_review(r, "validate", Duration::from_millis(1));
    m.admission_error(r);
    m.cache_objects(r, "v1/ConfigMap", 0);
    m.shards().primaries(r, 0);
    m.shards().handover("gained");
    m.shards().filter("v1/ConfigMap", false);
    let queue = m.queue(r);
    queue.requested("monitoring-test/key".into());
    queue.requeued(true);
    queue
}

/// The series names the host's registry encodes: gauges as named, counters with `_total`,
/// histograms' `_bucket`, `_sum` and `_count` (OpenMetrics `# TYPE` lines name the family).
fn exported() -> anyhow::Result<BTreeSet<String>> {
    let _queue = record_every_metric();
    let text = wasmop::operations::metrics::encode()?;
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("#") || words.next() != Some("TYPE") {
            continue;
        }
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_string());
            }
        }
    }
    anyhow::ensure!(
        names.len() > 20,
        "the host's registry encoded only {names:?}"
    );
    Ok(names)
}

/// The `wasmop_*` names in a query.
fn metric_names(query: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = query;
    while let Some(start) = rest.find("wasmop_") {
        let name: String = rest[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[start + name.len()..];
        names.push(name);
    }
    names
}

#[tokio::test]
async fn the_alert_rules_pass_promtool_and_their_unit_tests() -> anyhow::Result<()> {
    let promtool = promtool().await?;
    let checked = run_promtool(&promtool, &["check", "rules", "alerts.yaml"])?;
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = run_promtool(&promtool, &["test", "rules", "alerts_test.yaml"])?;
    assert!(tested.contains("SUCCESS"), "{tested}");
    // Every alert has a unit test in which it fires.
    let tests: Value = serde_saphyr::from_str(&std::fs::read_to_string(
        monitoring_dir().join("alerts_test.yaml"),
    )?)?;
    let fired: BTreeSet<String> = tests["tests"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| t["alert_rule_test"].as_array().cloned().unwrap_or_default())
        .filter(|t| t["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()))
        .filter_map(|t| t["alertname"].as_str().map(str::to_string))
        .collect();
    let rules = rules()?;
    let untested: Vec<String> = alerts(&rules)
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| !fired.contains(name))
        .collect();
    assert!(
        untested.is_empty(),
        "alerts without a unit test that fires them: {untested:?}"
    );
    // The PrometheusRule (and, through chart::, the chart) carries exactly these groups.
    let rule: Value = serde_saphyr::from_str(&std::fs::read_to_string(
        monitoring_dir().join("prometheusrule.yaml"),
    )?)?;
    assert_eq!(
        rule["spec"], rules,
        "prometheusrule.yaml's groups are not alerts.yaml's"
    );
    Ok(())
}

#[tokio::test]
async fn the_rules_and_the_dashboard_use_only_metrics_the_host_exports() -> anyhow::Result<()> {
    let exported = exported()?;
    let rules = rules()?;
    let mut queries: Vec<(String, String)> = alerts(&rules)
        .into_iter()
        .map(|(name, expr)| (format!("alert {name}"), expr))
        .collect();
    queries.extend(
        dashboard_queries()?
            .into_iter()
            .enumerate()
            .map(|(i, q)| (format!("dashboard query {i}"), q)),
    );
    let mut unknown = Vec::new();
    let mut used = BTreeSet::new();
    for (what, query) in &queries {
        for name in metric_names(query) {
            if !exported.contains(&name) {
                unknown.push(format!("{what}: {name}"));
            }
            used.insert(name);
        }
    }
    assert!(
        unknown.is_empty(),
        "queries name series the host does not export (its registry encodes {exported:?}):\n{}",
        unknown.join("\n")
    );
    assert!(
        used.len() >= 15,
        "the rules and dashboard use only {used:?}"
    );

    // The dashboard's queries are PromQL promtool parses: checked as recording rules.
    let promtool = promtool().await?;
    let dir = tempfile::tempdir()?;
    let rules: Vec<Value> = dashboard_queries()?
        .into_iter()
        .enumerate()
        .map(|(i, expr)| serde_json::json!({"record": format!("wasmop:dashboard_query_{i}"), "expr": expr}))
        .collect();
    let file = dir.path().join("dashboard-queries.yaml");
    std::fs::write(
        &file,
        serde_json::to_vec(
            &serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]}),
        )?,
    )?;
    let checked = run_promtool(&promtool, &["check", "rules", &file.display().to_string()])?;
    assert!(checked.contains("SUCCESS"), "{checked}");
    Ok(())
}
