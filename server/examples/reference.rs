//! Serves the reference MCP server over Rewind on loopback.
//!
//! ```text
//! cargo run -p rewind-server --example reference -- [PORT] [--close-after-priming] [--session-events N]
//! ```
//!
//! Prints the MCP URL, then serves until Ctrl-C. Point the official
//! conformance suite at it:
//! `npx -y @modelcontextprotocol/conformance@0.1.13 server --url http://127.0.0.1:PORT/mcp`.

use std::sync::Arc;

use rewind_engine::{Config, Engine};
use rewind_server::mcp::{self, HostPolicy, McpOptions};
use rewind_server::metrics::ServerMetrics;
use rewind_server::tools::ReferenceServer;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut port = 0u16;
    let mut options = McpOptions::default();
    let mut config = Config::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--close-after-priming" => options.close_post_streams_after_priming = true,
            "--session-events" => {
                config.session_events = args
                    .next()
                    .ok_or("--session-events needs a value")?
                    .parse()?;
            }
            other => port = other.parse()?,
        }
    }
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    options.hosts = HostPolicy::for_listen_addr(addr);
    let path = options.path.clone();
    let shutdown = options.shutdown.clone();
    let engine = Engine::new(config)?;
    let app = mcp::router(
        engine,
        Arc::new(ServerMetrics::new()),
        options,
        ReferenceServer::new,
    );
    println!("rewind reference MCP server on http://{addr}{path}");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = tokio::signal::ctrl_c().await;
            shutdown.cancel();
        })
        .await?;
    Ok(())
}
