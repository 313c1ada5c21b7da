//! The tables and the final line of `make bench-scale`.

use std::fmt::Write as _;

use crate::contenders::Contender;
use crate::replicametrics::ReplicaReport;
use crate::run::Measurement;

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The convergence cell: `12.3 s`, or `> 1800.0 s (6021 of 10000)` when the budget ran out.
fn converge_cell(m: &Measurement) -> String {
    let s = m.converge.as_secs_f64();
    if m.finished() {
        format!("{s:.1} s")
    } else {
        format!("> {s:.1} s ({} of {})", m.converged, m.n)
    }
}

/// The readiness cell: first create to the last App ready, `-` when not every App was ready by
/// the end of the run.
fn ready_cell(m: &Measurement) -> String {
    m.ready
        .map_or_else(|| "-".into(), |d| format!("{:.1} s", d.as_secs_f64()))
}

/// A per-minute idle figure with its unit, `-` without an idle window (the run did not
/// converge).
fn idle_cell(value: f64, decimals: usize, unit: &str) -> String {
    if value.is_finite() {
        format!("{value:.decimals$}{unit}")
    } else {
        "-".into()
    }
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
        "| contender | concurrency | converge | every App ready | writes during convergence | writes/min idle | peak RSS converging and idle | peak RSS at start-up | CPU converge | CPU per App | CPU/min idle | client-side limit |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for m in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.0} | {} | {:.0} MiB | {:.0} MiB | {:.2} s | {:.2} ms | {} | {} |",
            m.label(),
            m.tuning.concurrency,
            converge_cell(m),
            ready_cell(m),
            m.converge_writes,
            idle_cell(m.idle_writes_per_min, 1, ""),
            mib(m.at_end.peak_rss),
            mib(m.at_start.peak_rss),
            m.cpu_converge(),
            m.cpu_converge() * 1000.0 / m.n as f64,
            idle_cell(m.cpu_idle_per_min(), 2, " s"),
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
            m.label(),
            m.tuning.concurrency,
            m.idle.as_secs()
        );
    }
    let _ = writeln!(
        out,
        "\nrequests per App by verb and resource (every client's writes and reads of Apps, Deployments, Services and events.k8s.io Events during convergence, as the API server counts them: the scheduler's Events and the garbage collector's `GET apps` included; the bench's App creates left out):"
    );
    for m in rows {
        let per_app = m.converge_requests.per_app_by_kind(n);
        let total: f64 = per_app.iter().map(|(_, v)| v).sum();
        let each = per_app
            .iter()
            .map(|(k, v)| format!("{k} {v:.2}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            out,
            "  {} (c={}): {total:.2} per App: {each}",
            m.label(),
            m.tuning.concurrency
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
        let _ = writeln!(out, "  {} (c={}): {top}", m.label(), m.tuning.concurrency);
    }
    out.push_str(&per_reconcile(rows));
    out
}

/// What each unsharded wasmop host spent per reconcile (host CPU from the first create to
/// convergence over the reconciles its `/metrics` counted by then), its module calls by
/// function with their mean wall time, and the highest linear memory a call reached; with a
/// `wasmop-metacontroller` row, the native module against the same logic as a Metacontroller
/// hook. Empty without such a row.
fn per_reconcile(rows: &[Measurement]) -> String {
    if !rows.iter().any(|m| {
        matches!(
            m.contender,
            Contender::Wasmop | Contender::WasmopMetacontroller
        )
    }) {
        return String::new();
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nper reconcile (wasmop hosts: host CPU converging / reconciles until convergence; module calls by function, mean wall time of a call; highest linear memory of a call):"
    );
    let hosts = rows.iter().filter(|m| {
        matches!(
            m.contender,
            Contender::Wasmop | Contender::WasmopMetacontroller
        )
    });
    for m in hosts {
        let report = m.processes.first().and_then(|p| p.report.as_ref());
        let reconciles = report.and_then(|r| r.reconciles).unwrap_or(0.0);
        let cpu = if reconciles > 0.0 {
            format!("{:.2} ms", m.cpu_converge() * 1000.0 / reconciles)
        } else {
            "-".into()
        };
        let calls = report
            .map(|r| {
                r.calls
                    .iter()
                    .map(|(f, n, s)| format!("{f} {n:.0} ({:.2} ms)", s * 1000.0 / n))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| "none".into());
        let memory = report
            .and_then(|r| r.memory_peak)
            .map(|b| format!("{:.1} MiB", b / (1024.0 * 1024.0)))
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "  {} (c={}): {reconciles:.0} reconciles, {cpu} CPU per reconcile; module calls: {calls}; call memory peak {memory}",
            m.label(),
            m.tuning.concurrency
        );
    }
    out
}

fn each(m: &Measurement, f: impl Fn(&crate::run::Process) -> String) -> String {
    m.processes.iter().map(f).collect::<Vec<_>>().join(", ")
}

fn reported(m: &Measurement, f: impl Fn(&ReplicaReport) -> Option<f64>) -> String {
    each(m, |p| match p.report.as_ref().and_then(&f) {
        Some(v) => format!("{v:.0}"),
        None => "-".into(),
    })
}

/// The wasmop rows per process: the sharded rows (`wasmop xK`) and, for reference, the
/// unsharded `wasmop` row; empty when there is no sharded row. Peak RSS (`VmHWM`) before the
/// Apps is what starting took (the module's compile included), at the end what the whole run
/// took.
pub fn sharded_table(n: usize, rows: &[Measurement]) -> String {
    if !rows.iter().any(|m| m.contender == Contender::WasmopSharded) {
        return String::new();
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nscale-sharded N={n}: per replica (`wasmop xK`: K `wasmop run --shards auto` replicas, Apps spread over namespaces, ShardedListAndWatch on; `wasmop`: one host, Apps in one namespace, for reference)"
    );
    let _ = writeln!(
        out,
        "| row | namespaces | converge | writes during convergence | API requests during convergence | writes/min idle | Lease writes/min idle | peak RSS converging and idle, largest replica | peak RSS converging and idle per replica | peak RSS at start-up | RSS at the end | primaries per replica | cached objects per replica | reconciles per replica until convergence | CPU converge per replica | watch filter |"
    );
    let _ = writeln!(
        out,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    let wasmop_rows = rows
        .iter()
        .filter(|m| matches!(m.contender, Contender::Wasmop | Contender::WasmopSharded));
    for m in wasmop_rows {
        let idle_min = m.idle.as_secs_f64() / 60.0;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} | {:.0} | {} | {:.1} | {:.0} MiB | {} | {} | {} | {} | {} | {} | {} | {} |",
            m.label(),
            m.tuning.layout.count(n),
            converge_cell(m),
            m.converge_writes,
            m.converge_requests.total(),
            idle_cell(m.idle_writes_per_min, 1, ""),
            if idle_min > 0.0 {
                m.idle_requests.lease_writes() / idle_min
            } else {
                0.0
            },
            mib(m.at_end.peak_rss),
            each(m, |p| format!("{:.0}", mib(p.at_end.peak_rss))),
            each(m, |p| format!("{:.0}", mib(p.at_start.peak_rss))),
            each(m, |p| format!("{:.0}", mib(p.at_end.rss))),
            reported(m, |r| r.primaries),
            reported(m, |r| r.cache_objects),
            reported(m, |r| r.reconciles),
            each(m, |p| format!("{:.1} s", p.cpu_converge())),
            each(m, |p| p
                .report
                .as_ref()
                .map(ReplicaReport::filter_text)
                .unwrap_or_else(|| "-".into())),
        );
    }
    out
}

/// `scale-sharded N=<n> replicas=<k> converge s: X rss MiB per replica: a,b,c` (peak RSS), one
/// per sharded row.
pub fn sharded_lines(n: usize, rows: &[Measurement]) -> Vec<String> {
    rows.iter()
        .filter(|m| m.contender == Contender::WasmopSharded)
        .map(|m| {
            let rss: Vec<String> = m
                .processes
                .iter()
                .map(|p| format!("{:.0}", mib(p.at_end.peak_rss)))
                .collect();
            format!(
                "scale-sharded N={n} replicas={} converge s: {:.1} rss MiB per replica: {}",
                m.tuning.replicas,
                m.converge.as_secs_f64(),
                rss.join(",")
            )
        })
        .collect()
}

/// The best run of a contender: the fastest that converged, else the one that got furthest.
pub fn best(rows: &[Measurement], contender: Contender) -> Option<&Measurement> {
    rows.iter()
        .filter(|m| m.contender == contender)
        .min_by(|a, b| {
            b.finished()
                .cmp(&a.finished())
                .then(b.converged.cmp(&a.converged))
                .then(a.converge.cmp(&b.converge))
        })
}

/// One ratio of convergence times. A side that ran out of its budget took longer than its
/// recorded time, so the ratio is a bound: `<0.55` when only the other did not converge,
/// `>1.20` when only wasmop did not, `n/a` when neither did or one did not run.
fn ratio(wasmop: Option<&Measurement>, other: Option<&Measurement>) -> String {
    let (Some(w), Some(o)) = (wasmop, other) else {
        return "n/a".into();
    };
    let (ws, os) = (w.converge.as_secs_f64(), o.converge.as_secs_f64());
    if os <= 0.0 {
        return "n/a".into();
    }
    match (w.finished(), o.finished()) {
        (true, true) => format!("{:.2}", ws / os),
        (true, false) => format!("<{:.2}", ws / os),
        (false, true) => format!(">{:.2}", ws / os),
        (false, false) => "n/a".into(),
    }
}

/// `scale N=<n> wasmop/floor: X.XX wasmop/kube-rs: Y.YY wasmop/controller-runtime: Z.ZZ`
/// (ratios of convergence time; a bound `<X.XX` / `>X.XX` when one side did not converge in
/// its budget, `n/a` for a contender that did not run), and when the `wasmop-metacontroller`
/// row ran, ` wasmop-metacontroller/wasmop: R.RR` (the hook against the native module).
pub fn final_line(n: usize, rows: &[Measurement]) -> String {
    let wasmop = best(rows, Contender::Wasmop);
    let of = |other| ratio(wasmop, best(rows, other));
    let mut line = format!(
        "scale N={n} wasmop/floor: {} wasmop/kube-rs: {} wasmop/controller-runtime: {}",
        of(Contender::Floor),
        of(Contender::KubeRs),
        of(Contender::ControllerRuntime)
    );
    if let Some(hook) = best(rows, Contender::WasmopMetacontroller) {
        line.push_str(&format!(
            " wasmop-metacontroller/wasmop: {}",
            ratio(Some(hook), wasmop)
        ));
    }
    line
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::apimetrics::Requests;
    use crate::contenders::Tuning;
    use crate::procstat::ProcStat;
    use crate::run::Process;

    const MIB: u64 = 1024 * 1024;

    fn stat(peak_mib: u64, cpu: f64) -> ProcStat {
        ProcStat {
            peak_rss: peak_mib * MIB,
            rss: peak_mib * MIB / 2,
            cpu_seconds: cpu,
        }
    }

    fn row(contender: Contender, replicas: usize, converge: f64, peaks: &[u64]) -> Measurement {
        let processes: Vec<Process> = peaks
            .iter()
            .map(|p| Process {
                at_start: stat(40, 1.0),
                at_converge: stat(*p, 3.0),
                at_end: stat(*p, 4.0),
                report: (contender != Contender::Floor).then(|| ReplicaReport {
                    primaries: Some(100.0 / replicas as f64),
                    cache_objects: Some(300.0 / replicas as f64),
                    reconciles: Some(7.0),
                    filter: vec![("server".into(), 3.0)],
                    ..Default::default()
                }),
            })
            .collect();
        let combine = |f: fn(&Process) -> ProcStat| {
            crate::procstat::combine(&processes.iter().map(f).collect::<Vec<_>>())
        };
        Measurement {
            contender,
            n: 100,
            tuning: Tuning {
                concurrency: 16,
                resync: Duration::from_secs(30),
                replicas,
                layout: contender.layout(10),
            },
            converge: Duration::from_secs_f64(converge),
            converged: 100,
            ready: Some(Duration::from_secs_f64(converge + 1.5)),
            converge_requests: Requests::default(),
            converge_writes: 300.0,
            idle_requests: Requests::default(),
            idle_writes_per_min: 0.0,
            idle: Duration::from_secs(70),
            at_converge: combine(|p| p.at_converge),
            at_start: combine(|p| p.at_start),
            at_idle_start: combine(|p| p.at_converge),
            at_end: combine(|p| p.at_end),
            processes,
            series: Default::default(),
        }
    }

    #[test]
    fn sharded_rows_are_labelled_and_reported_per_replica() {
        let rows = vec![
            row(Contender::Floor, 1, 10.0, &[20]),
            row(Contender::Wasmop, 1, 20.0, &[90]),
            row(Contender::WasmopSharded, 1, 21.0, &[92]),
            row(Contender::WasmopSharded, 3, 12.5, &[50, 62, 48]),
        ];
        let main = table(100, &rows);
        assert!(
            main.contains("| wasmop x3 | 16 | 12.5 s | 14.0 s |"),
            "{main}"
        );
        // The main table's peak RSS of a sharded row is its largest replica's; CPU the sum,
        // 60 ms for each of the 100 Apps.
        assert!(
            main.contains("| 62 MiB | 40 MiB | 6.00 s | 60.00 ms |"),
            "{main}"
        );
        let sharded = sharded_table(100, &rows);
        let lines: Vec<&str> = sharded
            .lines()
            .filter(|l| l.starts_with("| wasmop"))
            .collect();
        assert_eq!(
            lines.len(),
            3,
            "wasmop, x1 and x3, not the floor: {sharded}"
        );
        assert!(lines[0].starts_with("| wasmop | 1 | 20.0 s |"), "{sharded}");
        let x3 = lines[2];
        assert!(x3.starts_with("| wasmop x3 | 10 | 12.5 s |"), "{x3}");
        assert!(
            x3.contains(
                "| 62 MiB | 50, 62, 48 | 40, 40, 40 | 25, 31, 24 | 33, 33, 33 | 100, 100, 100 | 7, 7, 7 |"
            ),
            "{x3}"
        );
        assert!(
            x3.ends_with("| 2.0 s, 2.0 s, 2.0 s | server, server, server |"),
            "{x3}"
        );
        assert_eq!(
            sharded_lines(100, &rows),
            vec![
                "scale-sharded N=100 replicas=1 converge s: 21.0 rss MiB per replica: 92",
                "scale-sharded N=100 replicas=3 converge s: 12.5 rss MiB per replica: 50,62,48",
            ]
        );
        // Without sharded rows, no sharded table.
        assert_eq!(sharded_table(100, &rows[..2]), "");
        // The final line compares the unsharded wasmop row.
        assert!(final_line(100, &rows).starts_with("scale N=100 wasmop/floor: 2.00 "));
    }

    #[test]
    fn the_metacontroller_row_has_its_ratio_and_its_cost_per_reconcile() {
        let mut rows = vec![
            row(Contender::Floor, 1, 10.0, &[20]),
            row(Contender::Wasmop, 1, 20.0, &[90]),
            row(Contender::KubeRs, 1, 40.0, &[30]),
            row(Contender::ControllerRuntime, 1, 25.0, &[40]),
        ];
        // Without the row, the wasmop row's cost per reconcile only.
        let main = table(100, &rows);
        assert!(main.contains("  wasmop (c=16): 7 reconciles"), "{main}");
        assert!(!main.contains("wasmop-metacontroller (c=16)"), "{main}");
        assert_eq!(
            final_line(100, &rows),
            "scale N=100 wasmop/floor: 2.00 wasmop/kube-rs: 0.50 wasmop/controller-runtime: 0.80"
        );
        let mut hook = row(Contender::WasmopMetacontroller, 1, 30.0, &[120]);
        if let Some(r) = hook.processes[0].report.as_mut() {
            r.reconciles = Some(400.0);
            r.calls = vec![("reconcile".into(), 200.0, 0.4)];
            r.memory_peak = Some(12.0 * 1024.0 * 1024.0);
        }
        rows.push(hook);
        assert_eq!(
            final_line(100, &rows),
            "scale N=100 wasmop/floor: 2.00 wasmop/kube-rs: 0.50 wasmop/controller-runtime: 0.80 wasmop-metacontroller/wasmop: 1.50"
        );
        let main = table(100, &rows);
        assert!(
            main.contains("| wasmop-metacontroller | 16 | 30.0 s | 31.5 s | 300 | 0.0 | 120 MiB |"),
            "{main}"
        );
        // 2 s of CPU: 7 reconciles (the wasmop row), 400 (the hook's).
        assert!(
            main.contains("  wasmop (c=16): 7 reconciles, 285.71 ms CPU per reconcile; module calls: none; call memory peak -"),
            "{main}"
        );
        assert!(
            main.contains("  wasmop-metacontroller (c=16): 400 reconciles, 5.00 ms CPU per reconcile; module calls: reconcile 200 (2.00 ms); call memory peak 12.0 MiB"),
            "{main}"
        );
    }

    fn unfinished(mut m: Measurement, converged: usize) -> Measurement {
        m.converged = converged;
        m.ready = None;
        m.idle = Duration::ZERO;
        m.idle_writes_per_min = f64::NAN;
        m
    }

    #[test]
    fn a_run_out_of_budget_is_a_row_and_its_ratios_are_bounds() {
        let rows = vec![
            row(Contender::Floor, 1, 10.0, &[20]),
            row(Contender::Wasmop, 1, 20.0, &[90]),
            unfinished(row(Contender::KubeRs, 1, 40.0, &[30]), 61),
            row(Contender::ControllerRuntime, 1, 25.0, &[40]),
        ];
        let main = table(100, &rows);
        assert!(
            main.contains(
                "| kube-rs | 16 | > 40.0 s (61 of 100) | - | 300 | - | 30 MiB | 40 MiB | 2.00 s | 20.00 ms | - |"
            ),
            "{main}"
        );
        assert_eq!(
            final_line(100, &rows),
            "scale N=100 wasmop/floor: 2.00 wasmop/kube-rs: <0.50 wasmop/controller-runtime: 0.80"
        );
        let late = vec![
            row(Contender::Floor, 1, 10.0, &[20]),
            unfinished(row(Contender::Wasmop, 1, 40.0, &[90]), 99),
            unfinished(row(Contender::KubeRs, 1, 40.0, &[30]), 61),
        ];
        assert_eq!(
            final_line(100, &late),
            "scale N=100 wasmop/floor: >4.00 wasmop/kube-rs: n/a wasmop/controller-runtime: n/a"
        );
        // The best of several tries converged, whatever the others' times.
        let floors = vec![
            unfinished(row(Contender::Floor, 1, 5.0, &[20]), 50),
            row(Contender::Floor, 1, 8.0, &[20]),
        ];
        assert!(best(&floors, Contender::Floor).is_some_and(Measurement::finished));
    }
}
