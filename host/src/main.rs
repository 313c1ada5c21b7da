//! The `wasmop` command.

use std::process::ExitCode;

use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use wasmop::cli::plugin::Invocation;
use wasmop::operations::tracing as traces;

fn main() -> ExitCode {
    // SAFETY: first thing in `main`, before any thread starts.
    #[allow(unsafe_code)]
    unsafe {
        wasmop::engine::skip_error_backtraces();
    }
    let invocation = Invocation::detect(std::env::args_os().next().as_deref());
    if invocation == Invocation::KubectlComplete {
        let words: Vec<String> = std::env::args_os()
            .skip(1)
            .map(|w| w.to_string_lossy().into_owned())
            .collect();
        return wasmop::cli::plugin::kubectl_complete(&words);
    }
    let cli = wasmop::cli::Cli::parse_for(invocation);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("wasmop: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The OTLP exporter's gRPC transport is set up inside the runtime.
    let _inside = runtime.enter();
    // `run` is the host: it exports traces and shuts down on Ctrl-C itself.
    let serving = matches!(cli.command, wasmop::cli::Command::Run(_));
    let traces = match init_logs(&cli.log_format, serving) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("wasmop: {e}");
            return ExitCode::FAILURE;
        }
    };
    if serving {
        match &traces {
            Some(s) => {
                tracing::info!(endpoint = %s.endpoint, transport = ?s.transport, "exporting traces over OTLP")
            }
            None => tracing::info!("not exporting traces (no OTEL_EXPORTER_OTLP_ENDPOINT)"),
        }
    }
    if !serving {
        // Every command but `run` stops at once.
        runtime.spawn(interrupted());
    }
    let code = match runtime.block_on(wasmop::cli::run(cli, invocation)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("wasmop: {e}");
            ExitCode::FAILURE
        }
    };
    // An exit by choice: compiles still under way (a background optimizing compile at SIGTERM)
    // did not crash, so their quarantine markers go.
    wasmop::engine::exiting_process();
    // Spans still queued go out, however the command ended (a no-op when already flushed).
    traces::shutdown();
    code
}

/// Ctrl-C during a command: the process exits at once with 130 (128 + SIGINT, as a shell
/// expects), after deleting the quarantine markers of its compiles under way. Killed by the
/// signal, it left them: each counted as a compile that crashed, and a second Ctrl-C during
/// `wasmop test` or `inspect` quarantined the module in the user's cache. Runs on a worker
/// thread: a command's compile blocks the thread that runs the command.
async fn interrupted() {
    if tokio::signal::ctrl_c().await.is_ok() {
        wasmop::engine::exiting_process();
        eprintln!("wasmop: interrupted");
        std::process::exit(130);
    }
}

/// Whether the logs take `meta`: not kube-runtime's span around each reconcile ("reconciling
/// object"), whose fields the log layer would format for every reconcile (5-7% of an idle host's
/// CPU with 1,000 primaries) to say what the host's own `reconcile` span says (it is a root
/// span, not that one's child). Exported traces never had it (they take only the host's
/// spans), so no layer wants it and kube-runtime's span is not even made.
fn not_kube_runtimes_reconcile_span(meta: &tracing::Metadata<'_>) -> bool {
    !(meta.is_span()
        && meta.name() == "reconciling object"
        && meta.target().starts_with("kube_runtime::controller"))
}

/// The log layer's filter: `env`'s (`RUST_LOG`), less kube-runtime's reconcile span. Its level
/// hint stays `env`'s, so that what is above that level stays off at the callsite (without a
/// hint of its own, the span's filter would lift the hint to `TRACE`: every `debug!` of every
/// crate, and every `log` record of those using `log`, would be weighed, and dropped, each
/// time).
fn log_filter<S>(env: tracing_subscriber::EnvFilter) -> impl tracing_subscriber::layer::Filter<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let span = tracing_subscriber::filter::filter_fn(not_kube_runtimes_reconcile_span)
        .with_max_level_hint(tracing_subscriber::filter::LevelFilter::TRACE);
    tracing_subscriber::filter::FilterExt::and(env, span)
}

/// Logs to stderr (text or JSON, filtered by `RUST_LOG`, default `info`) and, when `exporting`
/// and the environment asks for it, the host's spans over OTLP; returns the OTLP settings.
fn init_logs(
    format: &str,
    exporting: bool,
) -> Result<Option<traces::Settings>, traces::TracingError> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = if format == "json" {
        logs.json()
            .with_current_span(true)
            .with_span_list(false)
            .fmt_fields(wasmop::operations::json_fields::AppendJsonFields)
            .boxed()
    } else {
        logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed()
    };
    let subscriber = tracing_subscriber::registry().with(logs.with_filter(log_filter(filter)));
    let otlp = if exporting { traces::layer()? } else { None };
    let (layer, settings) = match otlp {
        Some((layer, settings)) => (Some(layer), Some(settings)),
        None => (None, None),
    };
    subscriber.with(layer).init();
    Ok(settings)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;

    /// Where the test's log lines go.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|e| std::io::Error::other(e.to_string()))?
                .extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_logs_leave_out_kube_runtimes_reconcile_span_and_nothing_else() {
        let lines = Lines::default();
        let writer = lines.clone();
        let logs = tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .fmt_fields(wasmop::operations::json_fields::AppendJsonFields)
            .with_writer(move || writer.clone())
            .with_filter(super::log_filter(tracing_subscriber::EnvFilter::new(
                "info",
            )));
        let subscriber = tracing_subscriber::registry().with(logs);
        tracing::subscriber::with_default(subscriber, || {
            let kube = tracing::info_span!(target: "kube_runtime::controller", "reconciling object", kube_field = 1);
            kube.in_scope(|| tracing::info!("event in kube-runtime's span"));
            let ours = tracing::info_span!("reconcile", our_field = 2);
            ours.in_scope(|| tracing::info!("event in the host's span"));
            tracing::debug!("a debug event");
        });
        let text = String::from_utf8(lines.0.lock().map(|l| l.clone()).unwrap_or_default())
            .unwrap_or_else(|e| panic!("utf-8: {e}"));
        let line = |message: &str| {
            text.lines()
                .find(|l| l.contains(message))
                .unwrap_or_else(|| panic!("{message} is logged: {text}"))
                .to_string()
        };
        assert!(
            !line("event in kube-runtime's span").contains("kube_field"),
            "{text}"
        );
        assert!(
            line("event in the host's span").contains("\"our_field\":2"),
            "{text}"
        );
        assert!(!text.contains("a debug event"), "{text}");
    }

    #[test]
    fn the_log_filter_keeps_the_level_hint_of_rust_log() {
        use tracing_subscriber::filter::LevelFilter;
        use tracing_subscriber::layer::Filter;
        for (env, hint) in [("info", LevelFilter::INFO), ("warn", LevelFilter::WARN)] {
            let filter = super::log_filter::<tracing_subscriber::Registry>(
                tracing_subscriber::EnvFilter::new(env),
            );
            assert_eq!(filter.max_level_hint(), Some(hint), "RUST_LOG={env}");
        }
    }
}
