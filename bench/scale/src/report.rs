//! The tables and the final line of `make bench-scale`.

use std::fmt::Write as _;

use crate::contenders::Contender;
use crate::run::Measurement;

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The table of one N (one row per measurement, floor rows for each concurrency tried).
pub fn table(n: usize, rows: &[Measurement]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nscale N={n}: {n} Apps (replicas 1) -> {n} Deployments + {n} Services + status, fresh control plane per row"
    );
    let _ = writeln!(
        out,
        "| contender | concurrency | converge | writes during convergence | writes/min idle | peak RSS | CPU converge | CPU/min idle | client-side limit |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    for m in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} s | {:.0} | {:.1} | {:.0} MiB | {:.2} s | {:.2} s | {} |",
            m.contender.name(),
            m.tuning.concurrency,
            m.converge.as_secs_f64(),
            m.converge_writes,
            m.idle_writes_per_min,
            mib(m.at_end.peak_rss),
            m.cpu_converge(),
            m.cpu_idle_per_min(),
            m.contender.client_limit(),
        );
    }
    let _ = writeln!(
        out,
        "\ncontroller writes by verb and resource (during convergence, incl. the bench's {n} App creates | idle window):"
    );
    for m in rows {
        let converge = m
            .converge_requests
            .controller_writes_by_kind()
            .iter()
            .map(|(k, v)| format!("{k} {v:.0}"))
            .collect::<Vec<_>>()
            .join(", ");
        let idle = m
            .idle_requests
            .controller_writes_by_kind()
            .iter()
            .map(|(k, v)| format!("{k} {v:.0}"))
            .collect::<Vec<_>>()
            .join(", ");
        let idle = if idle.is_empty() {
            "none".to_string()
        } else {
            idle
        };
        let _ = writeln!(
            out,
            "  {} (c={}): {converge} | idle {} s: {idle}",
            m.contender.name(),
            m.tuning.concurrency,
            m.idle.as_secs()
        );
    }
    let _ = writeln!(
        out,
        "\nall API requests during convergence, top 12 by verb and resource:"
    );
    for m in rows {
        let top = m
            .converge_requests
            .by_verb_resource()
            .into_iter()
            .take(12)
            .map(|(k, v)| format!("{k} {v:.0}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            out,
            "  {} (c={}): {top}",
            m.contender.name(),
            m.tuning.concurrency
        );
    }
    out
}

/// The best (fastest) run of a contender.
pub fn best(rows: &[Measurement], contender: Contender) -> Option<&Measurement> {
    rows.iter()
        .filter(|m| m.contender == contender)
        .min_by(|a, b| a.converge.cmp(&b.converge))
}

/// `scale N=<n> wasmop/floor: X.XX wasmop/kube-rs: Y.YY wasmop/controller-runtime: Z.ZZ`
/// (ratios of convergence time; `n/a` for a contender that did not run).
pub fn final_line(n: usize, rows: &[Measurement]) -> String {
    let wasmop = best(rows, Contender::Wasmop).map(|m| m.converge.as_secs_f64());
    let ratio =
        |other: Contender| match (wasmop, best(rows, other).map(|m| m.converge.as_secs_f64())) {
            (Some(w), Some(o)) if o > 0.0 => format!("{:.2}", w / o),
            _ => "n/a".into(),
        };
    format!(
        "scale N={n} wasmop/floor: {} wasmop/kube-rs: {} wasmop/controller-runtime: {}",
        ratio(Contender::Floor),
        ratio(Contender::KubeRs),
        ratio(Contender::ControllerRuntime)
    )
}
