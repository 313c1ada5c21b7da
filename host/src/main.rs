//! The `wasmop` command.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = wasmop::cli::Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if cli.log_format == "json" {
        builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .init();
    } else {
        builder.init();
    }
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
    match runtime.block_on(wasmop::cli::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("wasmop: {e}");
            ExitCode::FAILURE
        }
    }
}
