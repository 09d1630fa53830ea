//! Your own rmcp server on Rewind's router, with the engine's native policy.
//!
//! ```text
//! cargo run -p rewind-server --example router_native -- [PORT]
//! ```
//!
//! Serves `http://127.0.0.1:PORT/mcp` (PORT 0, the default, picks a free
//! one) until Ctrl-C. The handler is ordinary rmcp code; the only Rewind
//! detail in it is [`RelatedRequest`]: tagging a notification with the
//! request it belongs to sends it on that request's SSE stream, so it is
//! replayed with the stream after a reconnect.

use std::sync::Arc;
use std::time::Duration;

use rewind_engine::{Config, Engine};
use rewind_server::mcp::{self, HostPolicy, McpOptions, RelatedRequest};
use rewind_server::metrics::ServerMetrics;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, ProgressNotification, ProgressNotificationParam,
    ServerCapabilities, ServerConfig, ServerNotification,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, RoleServer, ServerHandler};
use serde::Deserialize;

/// Arguments of `count`.
#[derive(Debug, Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct CountArgs {
    /// How far to count (1..=1000).
    to: u32,
}

/// One instance per MCP session.
#[derive(Debug, Clone, Default)]
struct Counter;

#[tool_router]
impl Counter {
    #[tool(description = "Counts to `to`, one progress notification every 100 ms")]
    async fn count(
        &self,
        Parameters(CountArgs { to }): Parameters<CountArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        if !(1..=1000).contains(&to) {
            return CallToolResult::error(vec![ContentBlock::text("`to` must be 1 to 1000")]);
        }
        if let Some(token) = ctx.meta.get_progress_token() {
            for i in 1..=to {
                let mut param = ProgressNotificationParam::new(token.clone(), f64::from(i));
                param.total = Some(f64::from(to));
                let mut notification = ProgressNotification::new(param);
                // On this call's stream, not the standalone GET stream.
                notification
                    .extensions
                    .insert(RelatedRequest(ctx.id.clone()));
                let _ = ctx
                    .peer
                    .send_notification(ServerNotification::ProgressNotification(notification))
                    .await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        CallToolResult::success(vec![ContentBlock::text(format!("counted to {to}"))])
    }
}

#[tool_handler]
impl ServerHandler for Counter {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("counter", env!("CARGO_PKG_VERSION")))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = match std::env::args().nth(1) {
        Some(port) => port.parse().map_err(|e| format!("PORT {port:?}: {e}"))?,
        None => 0,
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;

    // The native policy: the default decision table, in Rust.
    let engine = Engine::new(Config::default())?;
    let mut options = McpOptions::default();
    // Only localhost Host/Origin headers (DNS-rebinding protection).
    options.hosts = HostPolicy::for_listen_addr(addr);
    // End idle sessions (engine and rmcp service) once a second.
    options.sweep_interval = Some(Duration::from_secs(1));
    let shutdown = options.shutdown.clone();
    let app = mcp::router(
        engine,
        Arc::new(ServerMetrics::new()),
        options,
        Counter::default,
    );

    println!("MCP endpoint http://{addr}/mcp (Ctrl-C stops it)");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = tokio::signal::ctrl_c().await;
            shutdown.cancel(); // ends every SSE stream and rmcp service
        })
        .await?;
    Ok(())
}
