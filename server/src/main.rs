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

use axum::serve::ListenerExt as _;
use clap::{ArgMatches, CommandFactory, FromArgMatches};
use rewind_engine::policy::wasm::{
    compile_child_main, ChildCompiler, HostError, PolicyCompiler, PolicyHost, PolicyHostConfig,
};
use rewind_engine::Engine;
use rewind_server::admin::{self, AdminState};
use rewind_server::cli::{self, Cli, Command};
use rewind_server::cluster::{Cluster, ClusterOptions};
use rewind_server::mcp::{self, HostPolicy, McpOptions, OriginPolicy};
use rewind_server::metrics::ServerMetrics;
use rewind_server::policy_store::{PolicyStore, StoredPolicy};
use rewind_server::reference::ReferenceServer;
use rewind_server::settings::{
    HttpSettings, LogFormat, PolicyCompilerSetting, ServeArgs, Settings,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// How long open streams get to end after a shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How often the policy directory catches up with automatic rollbacks.
const POLICY_SYNC_INTERVAL: Duration = Duration::from_secs(5);

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
        Some(Command::Data(command)) => cli::run_data(command).map_err(Into::into),
        Some(Command::Load(args)) => return rewind_load::main(args),
        Some(Command::CompilePolicy) => return compile_child_main(),
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

/// The policy host's configuration: where it compiles, and the child
/// compiler's limits, are its settings.
fn policy_host_config(settings: &Settings) -> PolicyHostConfig {
    match settings.policy_compiler {
        PolicyCompilerSetting::InProcess => PolicyHostConfig::default(),
        PolicyCompilerSetting::Child => {
            // On Linux `/proc/self/exe` is this process's own executable,
            // even if its path has been replaced since it started (an
            // upgrade in place): the child is always the same build. An
            // emulator such as valgrind cannot start `/proc/self/exe` (to
            // it, that names the emulator), so tools that run the server
            // under one (`server/symbol-order.sh`) ask for the path
            // instead with `REWIND_POLICY_COMPILER_BY_PATH=1`.
            let by_path = std::env::var_os("REWIND_POLICY_COMPILER_BY_PATH")
                .is_some_and(|v| !v.is_empty() && v != "0");
            let program = if cfg!(target_os = "linux") && !by_path {
                Some("/proc/self/exe".into())
            } else {
                std::env::current_exe().ok()
            };
            let Some(program) = program else {
                tracing::warn!("cannot find this executable to run as the policy compiler; compiling policies in this process");
                return PolicyHostConfig::default();
            };
            // SAFETY: `program` is this executable (the same build, hence
            // the same wasmtime; by path, unless the file was replaced
            // since start, and wasmtime refuses code from another wasmtime
            // version or configuration anyway), and its `compile-policy`
            // command calls `compile_child_main` and nothing else (see
            // `main`).
            let child = unsafe { ChildCompiler::new(program, ["compile-policy"]) }
                .timeout(settings.policy_compile_timeout)
                .memory_limit(settings.policy_compile_memory);
            PolicyHostConfig::default().compiler(PolicyCompiler::ChildProcess(child))
        }
    }
}

fn serve(args: &ServeArgs, matches: &ArgMatches) -> Result<(), BoxError> {
    let settings = Settings::resolve(args, Some(matches))?;
    init_logs(settings.log_format);

    let host_config = policy_host_config(&settings);
    let host = Arc::new(match &settings.policy {
        None => PolicyHost::new(host_config)?,
        Some(path) => {
            let wasm = std::fs::read(path)
                .map_err(|e| format!("cannot read policy {}: {e}", path.display()))?;
            let name = path
                .file_stem()
                .map_or_else(|| "policy".into(), |s| s.to_string_lossy());
            PolicyHost::with_policy(host_config, &name, &wasm).map_err(|e| {
                let why = match e {
                    HostError::Validation(report) => describe_validation(&report),
                    other => other.to_string(),
                };
                format!("policy {}: {why}", path.display())
            })?
        }
    });
    let store = match &settings.policy_dir {
        None => None,
        Some(dir) => Some(open_policy_store(dir, &host)?),
    };
    let metrics = Arc::new(ServerMetrics::new());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // The node number goes into the engine's ids: claim it first.
    let cluster = match &settings.cluster {
        None => None,
        Some(c) => {
            let options = ClusterOptions {
                idle_ttl: settings.engine.idle_ttl,
                session_events: settings.engine.session_events,
            };
            Some(runtime.block_on(Cluster::connect(c, options, Arc::clone(&metrics)))?)
        }
    };
    let mut engine_config = settings.engine.clone();
    if let Some(c) = &cluster {
        engine_config.node = c.node();
    }
    let engine = Engine::with_policy(engine_config, Arc::clone(&host) as _)?;
    if let Some(report) = engine.recovery() {
        // Restored engine sessions keep their events; the MCP endpoint
        // rebuilds their MCP sessions from the stored `initialize`
        // parameters when its router is built.
        tracing::info!(
            dir = %report.dir.display(),
            boot = report.boot_counter,
            sessions = report.sessions,
            events = report.events,
            bytes = report.bytes,
            ms = report.ms,
            damaged_frames = report.damaged_frames,
            torn_records = report.torn_records,
            machine_restarted = report.machine_restarted,
            unconfirmed_frames = report.unconfirmed_frames,
            "data directory opened: {report}"
        );
    }
    let (token, token_configured) = match &settings.admin_token {
        Some(t) => (t.clone(), true),
        None => (admin::generate_token()?, false),
    };

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
            cluster.clone(),
        )?;
        let mut admin_state = AdminState::new(
            engine.clone(),
            Arc::clone(&host),
            Arc::clone(&metrics),
            token.clone(),
        )
        .with_shutdown(shutdown.clone());
        if let Some((store, _)) = &store {
            admin_state = admin_state.with_store(Arc::clone(store));
        }
        let admin_app = admin::router(admin_state);

        // Before the URLs are printed: whoever sees them may signal at once.
        let signals = cancel_on_signal(shutdown.clone());
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
        if let (Some(c), Some(cs)) = (&cluster, &settings.cluster) {
            writeln!(out, "rewind: cluster node   {} of {}", c.node(), redact(&cs.redis))?;
        }
        if let Some((store, restored)) = &store {
            let what = match restored {
                Some(stored) => format!("restored `{}` from {}", stored.name, stored.path.display()),
                None => "pushed policies are kept here".to_owned(),
            };
            writeln!(out, "rewind: policy dir     {} ({what})", store.dir().display())?;
        }
        out.flush()?;
        drop(out);

        // Every SSE event is a small write: without TCP_NODELAY, Nagle holds
        // each one back until the client's delayed ACK (up to 40 ms) for
        // the one before.
        let mcp_listener = mcp_listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
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
        tokio::spawn(signals);
        if let Some((store, _)) = &store {
            tokio::spawn(sync_policy_dir(
                Arc::clone(store),
                Arc::clone(&host),
                shutdown.clone(),
            ));
        }

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
        if let Some((store, _)) = &store {
            if let Err(e) = store.sync(&host) {
                tracing::warn!("{e}");
            }
        }
        println!("rewind: stopped");
        Ok::<(), BoxError>(())
    })
}

fn describe_validation(report: &rewind_engine::policy::wasm::ValidationReport) -> String {
    let mut why = admin::describe_report(report);
    for failure in &report.failures {
        why.push_str("\n  - ");
        why.push_str(&admin::describe_failure(failure));
    }
    why
}

/// Opens the policy directory and swaps in the module it names as live
/// (over the start policy, generation 1), so a restart comes back with
/// the policy that was live. A stored module that no longer loads or
/// validates stops the start: running another policy than the operator
/// pushed, silently, would be worse.
fn open_policy_store(
    dir: &std::path::Path,
    host: &PolicyHost,
) -> Result<(Arc<PolicyStore>, Option<StoredPolicy>), BoxError> {
    let store = PolicyStore::open(dir)?;
    store.record_start(host.live_generation());
    let restored = store.live_policy()?;
    if let Some(stored) = &restored {
        let refused = |why: String| {
            format!(
                "policy directory {}: the live policy {} {why}; put `start` in {} to start with the \
                 start policy instead",
                dir.display(),
                stored.path.display(),
                dir.join(rewind_server::policy_store::LIVE_FILE).display()
            )
        };
        let module = host
            .load(&stored.name, &stored.wasm)
            .map_err(|e| refused(format!("does not load: {e}")))?;
        let generation = host.swap(&module).map_err(|e| {
            refused(match e {
                rewind_engine::policy::wasm::SwapError::Validation(report) => {
                    format!("fails validation: {}", describe_validation(&report))
                }
                other => format!("cannot be swapped in: {other}"),
            })
        })?;
        store.record_restored(generation, stored);
    }
    Ok((Arc::new(store), restored))
}

/// Records automatic rollbacks in the policy directory until shutdown.
async fn sync_policy_dir(
    store: Arc<PolicyStore>,
    host: Arc<PolicyHost>,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(POLICY_SYNC_INTERVAL);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let (store, host) = (Arc::clone(&store), Arc::clone(&host));
        let synced = tokio::task::spawn_blocking(move || store.sync(&host)).await;
        if let Ok(Err(e)) = synced {
            tracing::warn!("{e}");
        }
    }
}

/// Pending connections the listeners queue before accepting them. Tokio's
/// `TcpListener::bind` queues 128, which a reconnect storm of thousands of
/// clients (after a load balancer or a restart) overflows: the SYNs beyond
/// it are dropped and each such client waits a second for its retry. The
/// kernel caps this at `net.core.somaxconn`.
const LISTEN_BACKLOG: u32 = 4096;

/// Binds `addr` with a backlog of [`LISTEN_BACKLOG`].
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Binds `addr`, turning the usual failures into a sentence that says what
/// to change.
async fn bind(
    addr: SocketAddr,
    what: &str,
    flag: &str,
    env: &str,
) -> Result<TcpListener, BoxError> {
    listen(addr).map_err(|e| {
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
    cluster: Option<Cluster>,
) -> Result<axum::Router, BoxError> {
    let mut options = McpOptions::default();
    options.cluster = cluster;
    let (hosts, warning) = HostPolicy::for_listener(listen, http.allowed_hosts.as_deref());
    if let Some(warning) = warning {
        tracing::warn!(%listen, "{warning}");
    }
    options.hosts = hosts;
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

/// A Redis URL without its password, for printing.
fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_owned(),
    }
}

/// Watches SIGTERM and SIGINT (Ctrl-C) and cancels `shutdown` when one
/// arrives. The handlers are installed by this call, not when the future is
/// first polled: a signal sent as soon as the server has printed its URLs
/// must stop it gracefully, not kill it (the default action).
fn cancel_on_signal(shutdown: CancellationToken) -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let signals = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        )
    };
    async move {
        #[cfg(unix)]
        match signals {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            (Err(e), Ok(mut int)) => {
                tracing::warn!("cannot watch SIGTERM ({e}); only Ctrl-C stops the server");
                int.recv().await;
            }
            (Ok(mut term), Err(e)) => {
                tracing::warn!("cannot watch SIGINT ({e}); only SIGTERM stops the server");
                term.recv().await;
            }
            (Err(e), Err(_)) => {
                tracing::warn!(
                    "cannot watch SIGTERM or SIGINT ({e}); stop the server with SIGKILL"
                );
                std::future::pending::<()>().await;
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        shutdown.cancel();
    }
}
