//! `rewind`: the Rewind program.
//!
//! `rewind` (or `rewind serve`) runs the MCP server with Rewind's resumption
//! and its admin surface; `rewind policy check|push|status|rollback` checks
//! and operates policy plugins; `rewind demo` walks an in-process engine
//! through the decision table. See `rewind --help`.

mod demo;

use std::future::IntoFuture as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{ArgMatches, CommandFactory, FromArgMatches};
use rewind_engine::policy::wasm::{HostError, PolicyHost, PolicyHostConfig};
use rewind_engine::Engine;
use rewind_server::admin::{self, AdminState};
use rewind_server::cli::{self, Cli, Command};
use rewind_server::mcp::{self, HostPolicy, McpOptions, OriginPolicy};
use rewind_server::metrics::ServerMetrics;
use rewind_server::reference::ReferenceServer;
use rewind_server::settings::{HttpSettings, LogFormat, ServeArgs, Settings};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// How long open streams get to end after a shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let result = match cli.command {
        None => serve(&cli.serve, &matches),
        Some(Command::Serve(args)) => serve(
            &args,
            matches.subcommand_matches("serve").unwrap_or(&matches),
        ),
        Some(Command::Policy(command)) => cli::run_policy(command).map_err(Into::into),
        Some(Command::Demo) => demo::run(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rewind: {e}");
            ExitCode::FAILURE
        }
    }
}

type BoxError = Box<dyn std::error::Error>;

fn serve(args: &ServeArgs, matches: &ArgMatches) -> Result<(), BoxError> {
    let settings = Settings::resolve(args, Some(matches))?;
    init_logs(settings.log_format);

    let host = Arc::new(match &settings.policy {
        None => PolicyHost::with_default_policy()?,
        Some(path) => {
            let wasm = std::fs::read(path)
                .map_err(|e| format!("cannot read policy {}: {e}", path.display()))?;
            let name = path
                .file_stem()
                .map_or_else(|| "policy".into(), |s| s.to_string_lossy());
            PolicyHost::with_policy(PolicyHostConfig::default(), &name, &wasm).map_err(|e| {
                let why = match e {
                    HostError::Validation(report) => {
                        let mut why = admin::describe_report(&report);
                        for failure in &report.failures {
                            why.push_str("\n  - ");
                            why.push_str(&admin::describe_failure(failure));
                        }
                        why
                    }
                    other => other.to_string(),
                };
                format!("policy {}: {why}", path.display())
            })?
        }
    });
    let engine = Engine::with_policy(settings.engine.clone(), Arc::clone(&host) as _)?;
    let metrics = Arc::new(ServerMetrics::new());
    let (token, token_configured) = match &settings.admin_token {
        Some(t) => (t.clone(), true),
        None => (admin::generate_token()?, false),
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let mcp_listener = bind(settings.listen, "the MCP endpoint", "--listen", "REWIND_LISTEN").await?;
        let admin_listener = bind(
            settings.admin_listen,
            "the admin surface",
            "--admin-listen",
            "REWIND_ADMIN_LISTEN",
        )
        .await?;
        let mcp_addr = mcp_listener.local_addr()?;
        let admin_addr = admin_listener.local_addr()?;
        if !settings.admin_listen.ip().is_loopback() {
            tracing::warn!(%admin_addr, "the admin surface listens on a non-loopback address");
        }

        let shutdown = CancellationToken::new();
        let mcp_app = mcp_router(
            engine.clone(),
            Arc::clone(&metrics),
            mcp_addr,
            &settings.http,
            shutdown.clone(),
        )?;
        let admin_app = admin::router(
            AdminState::new(
                engine.clone(),
                Arc::clone(&host),
                Arc::clone(&metrics),
                token.clone(),
            )
            .with_shutdown(shutdown.clone()),
        );

        let mut out = std::io::stdout().lock();
        writeln!(out, "rewind: MCP endpoint   http://{mcp_addr}/mcp")?;
        writeln!(
            out,
            "rewind: admin surface  http://{admin_addr} (GET /metrics, GET|POST /policy, POST /policy/rollback, GET /healthz /readyz)"
        )?;
        if token_configured {
            writeln!(out, "rewind: admin token    (configured)")?;
        } else {
            writeln!(out, "rewind: admin token    {token}")?;
        }
        writeln!(
            out,
            "rewind: policy `{}` (generation {}); {}",
            host.live_name(),
            host.live_generation(),
            demo::describe(&engine)
        )?;
        out.flush()?;
        drop(out);

        let mcp_server = tokio::spawn(
            axum::serve(mcp_listener, mcp_app)
                .with_graceful_shutdown(shutdown.clone().cancelled_owned())
                .into_future(),
        );
        let admin_server = tokio::spawn(
            axum::serve(admin_listener, admin_app)
                .with_graceful_shutdown(shutdown.clone().cancelled_owned())
                .into_future(),
        );
        tokio::spawn(cancel_on_signal(shutdown.clone()));

        shutdown.cancelled().await;
        tracing::info!("shutting down: ending streams");
        let ended = tokio::time::timeout(SHUTDOWN_GRACE, async {
            let _ = tokio::join!(mcp_server, admin_server);
        })
        .await;
        if ended.is_err() {
            tracing::warn!(
                "some connections did not end within {} s; exiting anyway",
                SHUTDOWN_GRACE.as_secs()
            );
        }
        println!("rewind: stopped");
        Ok::<(), BoxError>(())
    })
}

/// Binds `addr`, turning the usual failures into a sentence that says what
/// to change.
async fn bind(
    addr: SocketAddr,
    what: &str,
    flag: &str,
    env: &str,
) -> Result<TcpListener, BoxError> {
    TcpListener::bind(addr).await.map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => format!(
                "address already in use (is another server running there?); choose another \
                 address with {flag} or {env}"
            ),
            std::io::ErrorKind::PermissionDenied => format!(
                "permission denied (ports below 1024 need privileges); choose another with \
                 {flag} or {env}"
            ),
            _ => e.to_string(),
        };
        format!("cannot listen on {addr} for {what}: {hint}").into()
    })
}

/// Logs on stderr: `RUST_LOG` or `info` (rmcp's per-session chatter only
/// from `warn`; `RUST_LOG=rmcp=debug` brings it back), as text or JSON.
fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        _ => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
}

/// The MCP Streamable HTTP endpoint at `/mcp`, serving the reference
/// tools. Its own sweeper ends idle sessions (engine and rmcp service)
/// every second; `shutdown` ends every stream.
fn mcp_router(
    engine: Engine,
    metrics: Arc<ServerMetrics>,
    listen: SocketAddr,
    http: &HttpSettings,
    shutdown: CancellationToken,
) -> Result<axum::Router, BoxError> {
    let mut options = McpOptions::default();
    options.hosts = match &http.allowed_hosts {
        Some(list) if list.iter().any(|h| h == "*") => {
            tracing::warn!(
                "DNS-REBINDING PROTECTION IS OFF: allowed_hosts is \"*\", so any Host header is \
                 accepted; do this only behind a proxy that checks Host itself, or with \
                 authentication in front of the endpoint"
            );
            HostPolicy::Any
        }
        Some(list) => HostPolicy::Allow(list.clone()),
        None => {
            if !listen.ip().is_loopback() {
                tracing::warn!(
                    %listen,
                    "LISTENING BEYOND LOOPBACK WITH LOOPBACK-ONLY HOSTS: requests whose Host is \
                     not localhost/127.0.0.1/[::1] get 403 (DNS-rebinding protection stays on); \
                     name the hosts clients use with --allowed-hosts (or REWIND_ALLOWED_HOSTS)"
                );
            }
            HostPolicy::for_listen_addr(listen)
        }
    };
    if let Some(origins) = &http.allowed_origins {
        options.origins = OriginPolicy::allow(origins)?;
    }
    options.cors = http.cors;
    options.json_response = http.json_response;
    options.max_body_bytes = http.max_body_bytes;
    options.max_header_bytes = http.max_header_bytes;
    options.shutdown = shutdown;
    options.sweep_interval = Some(Duration::from_secs(1));
    Ok(mcp::router(engine, metrics, options, ReferenceServer::new))
}

async fn cancel_on_signal(shutdown: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(e) => {
                tracing::warn!("cannot watch SIGTERM ({e}); only Ctrl-C stops the server");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
    shutdown.cancel();
}
