//! `wasmop run`: the operator host.
//!
//! Every flag is documented in `docs/operating.md` (section "Flags").

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;

use super::kubeconfig::Connection;
use super::{CliError, cache_dir};
use crate::admission::config::WebhookTarget;
use crate::crd::parse_duration;
use crate::host::{Host, HostError, HostOptions, WebhookOptions};
use crate::modules::signature::TrustedKey;
use crate::operations::leader::LeaderConfig;
use crate::operations::serving::ServerLimits;

/// Arguments of `run`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// kubectl's connection flags (`--kubeconfig`, `--context`, `--cluster`, `--user`).
    #[command(flatten)]
    pub connection: Connection,
    /// Where compiled modules are cached (default: $WASMOP_CACHE/compiled).
    #[arg(long, env = "WASMOP_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// The most the compiled-module cache directory holds, every file counted (a quantity:
    /// `768Mi`); keep it well under the volume's size.
    #[arg(long, env = "WASMOP_CACHE_MAX_BYTES", default_value = "768Mi")]
    pub cache_max_bytes: String,
    /// Refuse a module (`ModuleQuarantined`) once the host died this many times in a row while
    /// compiling it (an OOM kill, a compiler crash); markers in the cache directory count them.
    /// 0: never refuse.
    #[arg(long, env = "WASMOP_QUARANTINE_AFTER", default_value_t = crate::engine::DEFAULT_QUARANTINE_AFTER)]
    pub quarantine_after: u32,
    /// The most memory the running module calls may be capped at together (a quantity): each
    /// call reserves its `spec.limits.memory`; keep it below the pod's memory limit.
    #[arg(long, env = "WASMOP_MODULE_MEMORY_BUDGET", default_value = "768Mi")]
    pub module_memory_budget: String,
    /// The resync period of WasmReconcilers that do not set one.
    #[arg(long, env = "WASMOP_RESYNC", default_value = "10m")]
    pub resync: String,
    /// How long a status may be held back while the module is in flux (it asked for a
    /// requeue sooner than the resync): a newer one replaces it, and one is written by then.
    /// `0s` writes every status at once. At most 10m.
    #[arg(long, env = "WASMOP_STATUS_DEBOUNCE", default_value = "5s")]
    pub status_debounce: String,
    /// Serve only WasmReconcilers matching this label selector (e.g. `shard=a`).
    #[arg(long, env = "WASMOP_SELECTOR")]
    pub selector: Option<String>,
    /// Where to serve /metrics, /healthz and /readyz (`:8080` is every address; `off`: none).
    #[arg(long, env = "WASMOP_METRICS_ADDR", default_value = ":8080")]
    pub metrics_addr: String,
    /// Open connections the metrics server accepts at most; more are closed at once. Also the
    /// listen backlog, at least 1024 (capped by `net.core.somaxconn`).
    #[arg(long, env = "WASMOP_METRICS_MAX_CONNECTIONS", default_value_t = ServerLimits::PROBES.max_connections)]
    pub metrics_max_connections: usize,
    /// How long a metrics client may take to send a request head; idle connections close after it.
    #[arg(long, env = "WASMOP_METRICS_READ_TIMEOUT", default_value = "5s")]
    pub metrics_read_timeout: String,
    /// Where to serve the admission webhook over HTTPS (`off`: no admission).
    #[arg(long, env = "WASMOP_WEBHOOK_ADDR", default_value = ":9443")]
    pub webhook_addr: String,
    /// Open connections the webhook server accepts at most; more are closed at once. Also the
    /// listen backlog, at least 1024 (capped by `net.core.somaxconn`).
    #[arg(long, env = "WASMOP_WEBHOOK_MAX_CONNECTIONS", default_value_t = ServerLimits::ADMISSION.max_connections)]
    pub webhook_max_connections: usize,
    /// Admission reviews read, parsed and judged at once; more wait up to 1 s, then get 429.
    #[arg(long, env = "WASMOP_WEBHOOK_MAX_REVIEWS", default_value_t = crate::admission::MAX_REVIEWS)]
    pub webhook_max_reviews: usize,
    /// Bytes of admission review bodies held at once, over all reviews (a quantity: `64Mi`); a
    /// review whose bytes are not free within 1 s gets 429.
    #[arg(long, env = "WASMOP_WEBHOOK_MAX_REVIEW_BYTES", default_value = "64Mi")]
    pub webhook_max_review_bytes: String,
    /// Kubernetes built-in kinds that modules may validate, comma-separated `Kind` (core group)
    /// or `group/Kind` (e.g. `ConfigMap,apps/Deployment`); others get no webhook. Leases never.
    #[arg(long, env = "WASMOP_WEBHOOK_BUILTIN_KINDS", default_value = "")]
    pub webhook_builtin_kinds: String,
    /// How long a webhook client may take for the TLS handshake, a request head and a body;
    /// idle connections close after it.
    #[arg(long, env = "WASMOP_WEBHOOK_READ_TIMEOUT", default_value = "10s")]
    pub webhook_read_timeout: String,
    /// The base URL the API server calls the webhook at (e.g. `https://10.0.0.5:9443`).
    #[arg(long, env = "WASMOP_WEBHOOK_URL", conflicts_with = "webhook_service")]
    pub webhook_url: Option<String>,
    /// The Service the API server calls the webhook through: `namespace/name[:port]`.
    #[arg(long, env = "WASMOP_WEBHOOK_SERVICE")]
    pub webhook_service: Option<String>,
    /// A directory with `tls.crt`, `tls.key` and `ca.crt` for the webhook (default: generate).
    #[arg(long, env = "WASMOP_WEBHOOK_CERT_DIR")]
    pub webhook_cert_dir: Option<PathBuf>,
    /// A PEM file of CAs: the webhook accepts only clients presenting a certificate one of them
    /// signed (the API server's webhook client certificate); others fail the TLS handshake.
    /// Read again when it changes.
    #[arg(long, env = "WASMOP_WEBHOOK_CLIENT_CA")]
    pub webhook_client_ca: Option<PathBuf>,
    /// With --webhook-client-ca: the names (comma-separated) one of which the client
    /// certificate must carry, as its common name or a DNS subjectAltName (default: any name).
    #[arg(
        long,
        env = "WASMOP_WEBHOOK_CLIENT_NAME",
        value_delimiter = ',',
        requires = "webhook_client_ca"
    )]
    pub webhook_client_name: Vec<String>,
    /// The host's own namespace, never subject to its webhooks (default: the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// Run reconcilers only while holding the leader Lease.
    #[arg(long, env = "WASMOP_LEADER_ELECT")]
    pub leader_elect: bool,
    /// The leader Lease's namespace (default: the pod's namespace, else `default`).
    #[arg(long, env = "WASMOP_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// The leader Lease's name.
    #[arg(
        long,
        env = "WASMOP_LEADER_ELECTION_ID",
        default_value = "wasmop-leader"
    )]
    pub leader_election_id: String,
    /// How long a leader Lease is valid without renewal.
    #[arg(long, default_value = "15s")]
    pub leader_election_lease_duration: String,
    /// How long the leader tries to renew before giving up leadership.
    #[arg(long, default_value = "10s")]
    pub leader_election_renew_deadline: String,
    /// How often candidates try to acquire and the leader renews.
    #[arg(long, default_value = "2s")]
    pub leader_election_retry_period: String,
    /// Share every WasmReconciler's primaries with the other replicas (`auto`), or not (`off`:
    /// one replica reconciles all, with --leader-elect). See docs/operating.md, "Sharding".
    #[arg(long, env = "WASMOP_SHARDS", default_value = "off", value_parser = ["off", "auto"],
          conflicts_with = "leader_elect")]
    pub shards: String,
    /// The replicas that share the work: one member Lease each, labelled with this group.
    #[arg(long, env = "WASMOP_SHARD_GROUP", default_value = "wasmop")]
    pub shard_group: String,
    /// Where a replica's slice is filtered: `auto` (the API server's shardSelector when it
    /// honours it, detected per kind, else here) or `client` (always here).
    #[arg(long, env = "WASMOP_SHARD_FILTER", default_value = "auto", value_parser = ["auto", "client"])]
    pub shard_filter: String,
    /// How long a member Lease is valid without renewal.
    #[arg(long, default_value = "15s")]
    pub shard_lease_duration: String,
    /// How long a member tries to renew before it stops reconciling (exits).
    #[arg(long, default_value = "10s")]
    pub shard_renew_deadline: String,
    /// How often members renew and rebalance; also the margin before an expired member's
    /// ranges are taken.
    #[arg(long, default_value = "2s")]
    pub shard_retry_period: String,
    /// How long running reconciles may take to finish on SIGTERM/SIGINT.
    #[arg(long, env = "WASMOP_SHUTDOWN_GRACE", default_value = "30s")]
    pub shutdown_grace: String,
    /// How many module calls may run at once, over every WasmReconciler and admission (the
    /// sandbox pool's size). More calls wait in a fair queue, within their deadline.
    #[arg(long, env = "WASMOP_MAX_MODULE_CALLS", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_module_calls: u32,
    /// Serve a new module with a quickly compiled build first and swap the optimized build in
    /// when ready (`on`), or compile it optimized before it serves (`off`).
    #[arg(long, env = "WASMOP_TIERED_COMPILATION", default_value = "on", action = clap::ArgAction::Set,
          value_parser = clap::builder::BoolishValueParser::new())]
    pub tiered_compilation: bool,
    /// How many reconciles may run at once over every WasmReconciler together (each one is also
    /// bound by its own `spec.limits.concurrency`). More wait, first come first served.
    #[arg(long, env = "WASMOP_MAX_CONCURRENT_RECONCILES",
          default_value_t = crate::controller::limit::DEFAULT_MAX as u32,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_concurrent_reconciles: u32,
    /// Requests per second the host sends to the API server, over all its clients (its own and
    /// every module's); more wait. 0 turns the limit off.
    #[arg(long, env = "WASMOP_KUBE_QPS", default_value_t = crate::operations::ratelimit::DEFAULT_QPS)]
    pub kube_qps: f64,
    /// Requests the host may send at once above --kube-qps after a quiet time.
    #[arg(long, env = "WASMOP_KUBE_BURST", default_value_t = crate::operations::ratelimit::DEFAULT_BURST,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub kube_burst: u32,
    /// Record the exact request of every failed reconcile (module error or refused intents) as
    /// a YAML file in this directory; the Warning Event names the file. Replay it with
    /// `wasmop test MODULE --request FILE`. Off unless set.
    #[arg(long, env = "WASMOP_RECORD_FAILURES")]
    pub record_failures: Option<PathBuf>,
    /// With --record-failures: the most files kept (the oldest are deleted first).
    #[arg(long, default_value_t = 100, requires = "record_failures",
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub record_max_files: u32,
    /// With --record-failures: the largest recording (quantity); larger requests are not
    /// recorded.
    #[arg(long, default_value = "1Mi", requires = "record_failures")]
    pub record_max_size: String,
    /// With --record-failures: keep the data of Secrets among the objects instead of redacting
    /// it. Only for clusters whose Secrets may be written to this disk.
    #[arg(long, requires = "record_failures")]
    pub record_secrets: bool,
    /// The largest module the host loads, in bytes (default 64 MiB): pulled from an OCI
    /// registry, read from a ConfigMap or from the host's copy.
    #[arg(long, env = "WASMOP_MAX_MODULE_BYTES", default_value_t = crate::modules::oci::DEFAULT_MAX_MODULE_BYTES,
          value_parser = clap::value_parser!(u64).range(1..=(4u64 << 30)))]
    pub max_module_bytes: u64,
    /// Require every module to come from an OCI registry signed with this public key (a PEM
    /// file, `cosign.pub`): unsigned or wrongly signed modules, and ConfigMap modules, are
    /// refused.
    #[arg(long, env = "WASMOP_REQUIRE_SIGNED_MODULES", value_name = "KEYFILE")]
    pub require_signed_modules: Option<std::path::PathBuf>,
}

/// The host-wide signature key, read from `path`.
fn required_key(path: &std::path::Path) -> Result<TrustedKey, CliError> {
    let pem = std::fs::read_to_string(path).map_err(CliError::read(path))?;
    let key = TrustedKey::from_pem(&pem, format!("--require-signed-modules {}", path.display()))
        .map_err(|e| CliError::Other(e.to_string()))?;
    tracing::info!(key = %key.fingerprint, "modules must be signed");
    Ok(key)
}

/// `:8080` (every address), `127.0.0.1:0`, `[::1]:9443`, or `off`.
fn parse_addr(flag: &str, text: &str) -> Result<Option<SocketAddr>, CliError> {
    let t = text.trim();
    if t.is_empty() || t == "off" {
        return Ok(None);
    }
    let bad = || {
        CliError::Other(format!(
            "--{flag}: {text:?} is not an address (e.g. :8080, 127.0.0.1:0, off)"
        ))
    };
    if let Some(port) = t.strip_prefix(':') {
        let port: u16 = port.parse().map_err(|_| bad())?;
        return Ok(Some(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            port,
        )));
    }
    t.parse().map(Some).map_err(|_| bad())
}

fn parse_service(text: &str) -> Result<WebhookTarget, CliError> {
    let bad = || {
        CliError::Other(format!(
            "--webhook-service: {text:?} is not namespace/name[:port]"
        ))
    };
    let (namespace, rest) = text.split_once('/').ok_or_else(bad)?;
    let (name, port) = match rest.split_once(':') {
        Some((n, p)) => (n, p.parse::<i32>().map_err(|_| bad())?),
        None => (rest, 443),
    };
    if namespace.is_empty() || name.is_empty() {
        return Err(bad());
    }
    Ok(WebhookTarget::Service {
        namespace: namespace.into(),
        name: name.into(),
        port,
    })
}

fn duration(flag: &str, text: &str) -> Result<std::time::Duration, CliError> {
    parse_duration(text).map_err(|e| CliError::Other(format!("--{flag}: {e}")))
}

/// The limits of server `prefix` (`metrics` or `webhook`) from its flags.
fn limits(
    prefix: &str,
    max_connections: usize,
    read_timeout: &str,
) -> Result<ServerLimits, CliError> {
    ServerLimits {
        max_connections,
        read_timeout: duration(&format!("{prefix}-read-timeout"), read_timeout)?,
    }
    .checked(prefix)
    .map_err(|e| CliError::Other(e.to_string()))
}

/// `--webhook-max-review-bytes`: at least one largest review (8 MiB), below 4 GiB.
fn review_bytes(text: &str) -> Result<usize, CliError> {
    let bytes = crate::crd::parse_quantity(text)
        .map_err(|e| CliError::Other(format!("--webhook-max-review-bytes: {e}")))?;
    let range = (crate::admission::MAX_BODY as u64)..(4u64 << 30);
    if !range.contains(&bytes) {
        return Err(CliError::Other(format!(
            "--webhook-max-review-bytes must be at least 8Mi (one largest review) and below 4Gi, not {text}"
        )));
    }
    usize::try_from(bytes).map_err(|e| CliError::Other(e.to_string()))
}

/// The sharding configuration from the flags (None with `--shards off`).
fn shard_config(
    args: &Args,
    namespace: Option<String>,
) -> Result<Option<crate::sharding::ShardConfig>, CliError> {
    if args.shards != "auto" {
        return Ok(None);
    }
    let member = crate::sharding::MemberConfig {
        namespace: namespace.unwrap_or_else(crate::operations::leader::default_namespace),
        group: args.shard_group.clone(),
        // The pod's name (HOSTNAME) and a per-process suffix.
        identity: crate::operations::leader::identity(),
        lease_duration: duration("shard-lease-duration", &args.shard_lease_duration)?,
        renew_deadline: duration("shard-renew-deadline", &args.shard_renew_deadline)?,
        retry_period: duration("shard-retry-period", &args.shard_retry_period)?,
    };
    if member.renew_deadline >= member.lease_duration
        || member.retry_period >= member.renew_deadline
    {
        return Err(CliError::Other(
            "sharding needs --shard-retry-period < --shard-renew-deadline < --shard-lease-duration"
                .into(),
        ));
    }
    if member.lease_duration > crate::sharding::membership::MAX_LEASE_DURATION {
        return Err(CliError::Other(format!(
            "--shard-lease-duration: at most {:?} (other members would not wait longer)",
            crate::sharding::membership::MAX_LEASE_DURATION
        )));
    }
    tracing::info!(identity = %member.identity, group = %member.group, namespace = %member.namespace, "sharding on");
    Ok(Some(crate::sharding::ShardConfig {
        member,
        server_side: args.shard_filter == "auto",
    }))
}

/// Leadership or shard membership was lost: another replica may take over as soon as the
/// lease lapses, so the process ends now. Returning would let the runtime's tasks (the
/// supervisors finishing their reconciles) run on while `main` flushes the traces (up to 5 s
/// with an OTLP endpoint): writes of two replicas at once. The queued spans are lost.
fn lost(e: &dyn std::fmt::Display) -> ! {
    tracing::error!(error = %e, "exiting now: another replica may take over");
    eprintln!("wasmop: {e}");
    crate::engine::exiting_process();
    std::process::exit(1)
}

/// `--webhook-client-ca` and `--webhook-client-name`: who may call the webhook.
fn client_auth(args: &Args) -> Option<crate::tls::ClientAuth> {
    let ca_file = args.webhook_client_ca.clone()?;
    let names = args
        .webhook_client_name
        .iter()
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .collect();
    Some(crate::tls::ClientAuth { ca_file, names })
}

/// Refuses `--shards auto` with admission served from a generated certificate: every replica
/// serves the webhook, each would generate its own CA, and the webhook configuration can trust
/// only one, so the API server's calls to the others would fail their TLS check.
fn shared_certificate(args: &Args) -> Result<(), CliError> {
    let webhook_on = parse_addr("webhook-addr", &args.webhook_addr)?.is_some();
    if args.shards == "auto" && webhook_on && args.webhook_cert_dir.is_none() {
        return Err(CliError::Other(
            "--shards auto serves admission from every replica, so they need one serving certificate: set --webhook-cert-dir (deploy/ mounts one), or --webhook-addr off".into(),
        ));
    }
    Ok(())
}

pub(crate) async fn run(args: Args) -> Result<ExitCode, CliError> {
    let resync = duration("resync", &args.resync)?;
    let status_debounce = duration("status-debounce", &args.status_debounce)?;
    if status_debounce > std::time::Duration::from_secs(600) {
        return Err(CliError::Other(format!(
            "--status-debounce: {} is longer than the maximum of 10m",
            args.status_debounce
        )));
    }
    // Checked before anything starts, with the flag's name in the message.
    crate::operations::ratelimit::RateLimit::new(args.kube_qps, args.kube_burst)
        .map_err(|e| CliError::Other(e.to_string()))?;
    let grace = duration("shutdown-grace", &args.shutdown_grace)?;
    let namespace = args.namespace.clone().or_else(|| {
        std::fs::read_to_string(crate::operations::leader::SA_NAMESPACE_FILE)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    });
    let shards = shard_config(&args, namespace.clone())?;
    shared_certificate(&args)?;
    let webhook = match parse_addr("webhook-addr", &args.webhook_addr)? {
        None => None,
        Some(addr) => Some(WebhookOptions {
            addr,
            target: match (&args.webhook_url, &args.webhook_service) {
                (Some(url), _) => Some(WebhookTarget::Url(url.clone())),
                (None, Some(s)) => Some(parse_service(s)?),
                (None, None) => None,
            },
            cert_dir: args.webhook_cert_dir.clone(),
            host_namespace: namespace.clone(),
            limits: limits(
                "webhook",
                args.webhook_max_connections,
                &args.webhook_read_timeout,
            )?,
            max_reviews: match args.webhook_max_reviews {
                0 => {
                    return Err(CliError::Other(
                        "--webhook-max-reviews must be at least 1".into(),
                    ));
                }
                n => n,
            },
            max_review_bytes: review_bytes(&args.webhook_max_review_bytes)?,
            builtin_kinds: crate::admission::config::BuiltinKinds::parse(
                &args.webhook_builtin_kinds,
            )
            .map_err(|e| CliError::Other(format!("--webhook-builtin-kinds: {e}")))?,
            client_auth: client_auth(&args),
        }),
    };
    let leader = if args.leader_elect {
        let mut c = LeaderConfig::new(
            args.leader_election_namespace.clone().or(namespace),
            Some(args.leader_election_id.clone()),
        );
        c.lease_duration = duration(
            "leader-election-lease-duration",
            &args.leader_election_lease_duration,
        )?;
        c.renew_deadline = duration(
            "leader-election-renew-deadline",
            &args.leader_election_renew_deadline,
        )?;
        c.retry_period = duration(
            "leader-election-retry-period",
            &args.leader_election_retry_period,
        )?;
        if c.renew_deadline >= c.lease_duration || c.retry_period >= c.renew_deadline {
            return Err(CliError::Other(
                "leader election needs retry period < renew deadline < lease duration".into(),
            ));
        }
        if c.lease_duration > crate::operations::leader::MAX_LEASE_DURATION {
            return Err(CliError::Other(format!(
                "--leader-election-lease-duration: at most {:?} (other replicas would not wait longer)",
                crate::operations::leader::MAX_LEASE_DURATION
            )));
        }
        tracing::info!(identity = %c.identity, lease = %format!("{}/{}", c.namespace, c.name), "leader election on");
        Some(c)
    } else {
        None
    };
    let options = HostOptions {
        shards,
        kubeconfig: None,
        config: Some(args.connection.config().await?),
        cache_dir: Some(
            args.cache_dir
                .unwrap_or_else(|| cache_dir().join("compiled")),
        ),
        cache_max_bytes: crate::crd::parse_quantity(&args.cache_max_bytes)
            .map_err(|e| CliError::Other(format!("--cache-max-bytes: {e}")))?,
        quarantine_after: args.quarantine_after,
        module_memory_budget: crate::crd::parse_quantity(&args.module_memory_budget)
            .map_err(|e| CliError::Other(format!("--module-memory-budget: {e}")))?,
        resync,
        status_debounce,
        selector: args.selector,
        metrics_addr: parse_addr("metrics-addr", &args.metrics_addr)?,
        metrics_limits: limits(
            "metrics",
            args.metrics_max_connections,
            &args.metrics_read_timeout,
        )?,
        webhook,
        leader,
        shutdown_grace: grace,
        max_module_calls: args.max_module_calls,
        tiered_compilation: args.tiered_compilation,
        record_failures: match &args.record_failures {
            None => None,
            Some(dir) => Some(crate::controller::record::RecordOptions {
                dir: dir.clone(),
                max_files: usize::try_from(args.record_max_files).unwrap_or(usize::MAX),
                max_bytes: crate::crd::parse_quantity(&args.record_max_size)
                    .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
                    .map_err(|e| CliError::Other(format!("--record-max-size: {e}")))?,
                secrets: args.record_secrets,
            }),
        },
        max_concurrent_reconciles: usize::try_from(args.max_concurrent_reconciles)
            .unwrap_or(usize::MAX),
        kube_qps: args.kube_qps,
        kube_burst: args.kube_burst,
        oci: crate::modules::oci::OciOptions {
            namespace: args.namespace.clone(),
            max_module_bytes: args.max_module_bytes,
            required_key: match &args.require_signed_modules {
                Some(path) => Some(required_key(path)?),
                None => None,
            },
            ..crate::modules::oci::OciOptions::default()
        },
        ..HostOptions::default()
    };
    let mut host = Host::start(options)
        .await
        .map_err(|e| CliError::Other(e.to_string()))?;
    tracing::info!(version = crate::VERSION, "wasmop host started");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| CliError::Other(format!("cannot listen for SIGTERM: {e}")))?;
    tokio::select! {
        r = host.wait() => {
            return match r {
                // Leadership or membership lost: exit at once, without writing anything more;
                // a restart begins clean as a candidate.
                Err(HostError::Leadership(e)) => lost(&e),
                Err(HostError::Sharding(e)) => lost(&e),
                Err(e) => Err(CliError::Other(e.to_string())),
                Ok(()) => Ok(ExitCode::FAILURE),
            };
        }
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!(grace = ?grace, "shutting down: no new reconciles; finishing running ones");
    host.shutdown()
        .await
        .map_err(|e| CliError::Other(e.to_string()))?;
    // The spans of the last reconciles are queued: send them before the process exits.
    let _ = tokio::task::spawn_blocking(crate::operations::tracing::shutdown).await;
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_services_parse() {
        assert_eq!(
            parse_addr("x", ":8080").ok().flatten(),
            Some(SocketAddr::from(([0, 0, 0, 0], 8080)))
        );
        assert_eq!(
            parse_addr("x", "127.0.0.1:0").ok().flatten(),
            Some(SocketAddr::from(([127, 0, 0, 1], 0)))
        );
        assert!(matches!(parse_addr("x", "off"), Ok(None)));
        assert!(parse_addr("x", "nope").is_err());
        assert!(matches!(
            parse_service("ops/wasmop:8443"),
            Ok(WebhookTarget::Service { port: 8443, .. })
        ));
        assert!(matches!(
            parse_service("ops/wasmop"),
            Ok(WebhookTarget::Service { port: 443, .. })
        ));
        assert!(parse_service("wasmop").is_err());
    }

    /// `wasmop run` with `flags`, as clap parses them.
    fn args(flags: &[&str]) -> Args {
        #[derive(clap::Parser)]
        struct Run {
            #[command(flatten)]
            args: Args,
        }
        let argv = std::iter::once("run").chain(flags.iter().copied());
        match <Run as clap::Parser>::try_parse_from(argv) {
            Ok(run) => run.args,
            Err(e) => panic!("{flags:?} do not parse: {e}"),
        }
    }

    #[test]
    fn shards_auto_serving_admission_needs_a_shared_certificate() {
        let refused = shared_certificate(&args(&["--shards", "auto"]));
        let Err(CliError::Other(message)) = refused else {
            panic!("--shards auto with generated certificates was accepted")
        };
        assert!(message.contains("--webhook-cert-dir"), "{message}");
        for ok in [
            &["--shards", "auto", "--webhook-cert-dir", "/etc/tls"][..],
            &["--shards", "auto", "--webhook-addr", "off"][..],
            &[][..],
        ] {
            assert!(shared_certificate(&args(ok)).is_ok(), "{ok:?}");
        }
    }

    #[test]
    fn client_names_need_a_client_ca_and_are_split_on_commas() {
        assert!(client_auth(&args(&[])).is_none());
        let auth = client_auth(&args(&[
            "--webhook-client-ca",
            "/etc/ca.pem",
            "--webhook-client-name",
            "kube-apiserver, apiserver.example",
        ]));
        let Some(auth) = auth else {
            panic!("--webhook-client-ca was not taken")
        };
        assert_eq!(auth.ca_file, PathBuf::from("/etc/ca.pem"));
        assert_eq!(auth.names, ["kube-apiserver", "apiserver.example"]);
        let argv = ["run", "--webhook-client-name", "kube-apiserver"];
        #[derive(clap::Parser)]
        struct Run {
            #[command(flatten)]
            _args: Args,
        }
        assert!(
            <Run as clap::Parser>::try_parse_from(argv).is_err(),
            "a client name without a client CA is refused"
        );
    }
}
