//! rmcp 3.11's own Streamable HTTP transport (`StreamableHttpService` with
//! `LocalSessionManager`) serving the comparison's `progress_stream` tool,
//! as an rmcp user would write it. Two binaries differ only in where
//! resumable events are kept: the session manager's built-in per-request
//! cache (`rmcp-builtin`), or one in-memory [`SharedEventStore`] for all
//! sessions, as rmcp's `EventStore` trait is meant to be used
//! (`rmcp-shared-store`).

mod store;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, ProgressNotificationParam, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{tool, tool_handler, tool_router, RoleServer, ServerHandler};
use serde::Deserialize;

pub use store::SharedEventStore;

/// Most notifications one call may send (the same limit as Rewind's tool).
const MAX_COUNT: u32 = 100_000;

/// Arguments of `progress_stream`.
#[derive(Debug, Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct ProgressStreamArgs {
    /// How many notifications (1..=100000).
    pub count: u32,
    /// Milliseconds between two of them.
    #[serde(default)]
    pub interval_ms: u64,
    /// Text echoed in every message and in the result.
    #[serde(default)]
    pub label: Option<String>,
}

/// The server: one `progress_stream` tool.
#[derive(Debug, Clone, Default)]
pub struct PeerServer;

#[tool_router]
impl PeerServer {
    /// A server instance (one per session).
    pub fn new() -> PeerServer {
        PeerServer
    }

    #[tool(
        description = "Sends `count` progress notifications spaced `interval_ms` apart, then returns a text result"
    )]
    async fn progress_stream(
        &self,
        Parameters(args): Parameters<ProgressStreamArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        if args.count == 0 || args.count > MAX_COUNT {
            return CallToolResult::error(vec![ContentBlock::text(format!(
                "count must be between 1 and {MAX_COUNT}"
            ))]);
        }
        let label = args.label.unwrap_or_default();
        if let Some(token) = ctx.meta.get_progress_token() {
            for i in 1..=args.count {
                if i > 1 && args.interval_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(args.interval_ms)).await;
                }
                let mut p = ProgressNotificationParam::new(token.clone(), f64::from(i));
                p.total = Some(f64::from(args.count));
                p.message = Some(format!("{label} step {i}/{}", args.count));
                let _ = ctx.peer.notify_progress(p).await;
            }
        }
        CallToolResult::success(vec![ContentBlock::text(format!(
            "{label} progress_stream done: {} notifications",
            args.count
        ))])
    }
}

#[tool_handler]
impl ServerHandler for PeerServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("rmcp-peer", env!("CARGO_PKG_VERSION")))
    }
}

/// Pending connections queued before accept, the same for every server
/// of the comparison.
const LISTEN_BACKLOG: u32 = 4096;

/// The listen address from the first argument (`127.0.0.1:0` picks a port).
pub fn listen_addr() -> SocketAddr {
    let arg = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8090".to_owned());
    arg.parse().unwrap_or_else(|e| {
        eprintln!("usage: {} ADDR:PORT ({arg:?}: {e})", env!("CARGO_PKG_NAME"));
        std::process::exit(2)
    })
}

/// Serves `/mcp` on `addr` with `manager` until Ctrl-C or SIGTERM.
pub async fn serve(
    addr: SocketAddr,
    manager: LocalSessionManager,
    what: &str,
) -> std::io::Result<()> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    // TCP_NODELAY as every server of the comparison has it (see compare.sh).
    let listener = axum::serve::ListenerExt::tap_io(socket.listen(LISTEN_BACKLOG)?, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let config = StreamableHttpServerConfig::default();
    let ct = config.cancellation_token.clone();
    let service = StreamableHttpService::new(|| Ok(PeerServer::new()), Arc::new(manager), config);
    let app = axum::Router::new().nest_service("/mcp", service);
    println!(
        "{what}: MCP endpoint http://{}/mcp",
        axum::serve::Listener::local_addr(&listener)?
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            ct.cancel();
        })
        .await
}
