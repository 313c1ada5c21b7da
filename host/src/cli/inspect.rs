//! `wasmop inspect MODULE.wasm`: what a module is.

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::json;

use super::output::{self, Format};
use super::{CliError, engine};
use crate::contract::{WIT_PACKAGE, WIT_VERSION};
use crate::engine::{Compiled, Limits, MAX_CORE_INSTANCES_PER_MODULE, Needs};

/// Arguments of `inspect`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The module (a `.wasm` component).
    pub module: PathBuf,
    /// Print one JSON or YAML document instead of text.
    #[arg(short, long, value_enum)]
    pub output: Option<Format>,
    /// The same as `-o yaml` (kept for scripts written before `-o`).
    #[arg(long, hide = true, conflicts_with = "output")]
    pub yaml: bool,
    /// Do not use the compiled-module cache.
    #[arg(long)]
    pub no_cache: bool,
}

pub(crate) fn run(args: Args) -> Result<ExitCode, CliError> {
    let bytes = std::fs::read(&args.module).map_err(CliError::read(&args.module))?;
    let engine = engine(!args.no_cache)?;
    let module = engine
        .load(&bytes, &Limits::default())
        .map_err(|source| CliError::Load {
            path: args.module.clone(),
            source,
        })?;
    let m = module.metadata();
    let kinds = |ks: &mut dyn Iterator<Item = String>| {
        let v: Vec<String> = ks.collect();
        if v.is_empty() {
            "(none)".to_string()
        } else {
            v.join(", ")
        }
    };
    let format = args.output.or(args.yaml.then_some(Format::Yaml));
    if let Some(format) = format {
        let doc = json!({
            "module": args.module.display().to_string(),
            "contract": format!("{WIT_PACKAGE}@{WIT_VERSION}"),
            "size": module.size(),
            "sha256": module.sha256(),
            "metadata": m,
            "needs": module.needs(),
        });
        print!("{}", output::render(format, &doc)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("module:     {} {}", m.name, m.version);
    println!(
        "file:       {} ({} bytes)",
        args.module.display(),
        module.size()
    );
    println!("sha256:     {}", module.sha256());
    println!("contract:   {WIT_PACKAGE}@{WIT_VERSION}");
    println!("primary:    {}", m.primary);
    println!(
        "owns:       {}",
        kinds(&mut m.owns.iter().map(ToString::to_string))
    );
    println!(
        "related:    {}",
        kinds(&mut m.related.iter().map(|r| {
            let sel = r.selector.to_query();
            if sel.is_empty() {
                r.kind.to_string()
            } else {
                format!("{} [{sel}]", r.kind)
            }
        }))
    );
    println!("finalizes:  {}", if m.finalizes { "yes" } else { "no" });
    println!("validates:  {}", if m.validates { "yes" } else { "no" });
    print_needs(module.needs());
    println!(
        "compiled:   {} in {:.1} ms",
        match module.compiled() {
            Compiled::Fresh => "with Cranelift",
            Compiled::FromCache => "from the cache",
        },
        module.load_time().as_secs_f64() * 1e3
    );
    Ok(ExitCode::SUCCESS)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

/// What one sandbox of the module takes, beside the limits that apply.
fn print_needs(n: &Needs) {
    println!(
        "needs:      {} core instances of {} core modules (at most {MAX_CORE_INSTANCES_PER_MODULE}); \
         {} memories, {} initial ({} largest; the default per-call cap is {}); \
         {} tables (largest {} elements)",
        n.core_instances,
        n.core_modules,
        n.memories,
        mib(n.initial_memory_bytes),
        mib(n.largest_initial_memory_bytes),
        mib(Limits::default().memory_bytes),
        n.tables,
        n.max_table_elements,
    );
}
