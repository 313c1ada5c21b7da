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
    let exporting = matches!(cli.command, wasmop::cli::Command::Run(_));
    let traces = match init_logs(&cli.log_format, exporting) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("wasmop: {e}");
            return ExitCode::FAILURE;
        }
    };
    if exporting {
        match &traces {
            Some(s) => {
                tracing::info!(endpoint = %s.endpoint, transport = ?s.transport, "exporting traces over OTLP")
            }
            None => tracing::info!("not exporting traces (no OTEL_EXPORTER_OTLP_ENDPOINT)"),
        }
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
            .boxed()
    } else {
        logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed()
    };
    let subscriber = tracing_subscriber::registry().with(logs.with_filter(filter));
    let otlp = if exporting { traces::layer()? } else { None };
    let (layer, settings) = match otlp {
        Some((layer, settings)) => (Some(layer), Some(settings)),
        None => (None, None),
    };
    subscriber.with(layer).init();
    Ok(settings)
}
