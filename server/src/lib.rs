//! Rewind for MCP Streamable HTTP servers built on `rmcp`.
//!
//! An rmcp server keeps its `ServerHandler`; Rewind takes over the HTTP
//! transport: sessions are engine sessions, every SSE event is stored in the
//! session's retained window (the engine's segment pool) before it is sent, and every reconnect (`GET` with
//! `Last-Event-ID`) is decided by the engine with the session the client
//! presents — never by cursor alone. See [`mcp`] for how, and
//! [`reference::ReferenceServer`] for the server `rewind serve` runs.
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use rewind_engine::{Config, Engine};
//! use rewind_server::mcp::{self, HostPolicy, McpOptions};
//! use rewind_server::metrics::ServerMetrics;
//! use rewind_server::tools::ReferenceServer;
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//!     let engine = Engine::new(Config::default())?;
//!     let mut options = McpOptions::default();
//!     // Loopback: only localhost Host/Origin headers (DNS-rebinding protection).
//!     options.hosts = HostPolicy::for_listen_addr(listener.local_addr()?);
//!     let shutdown = options.shutdown.clone();
//!     // Any rmcp `ServerHandler` works here; one instance per MCP session.
//!     let app = mcp::router(engine, Arc::new(ServerMetrics::new()), options, ReferenceServer::new);
//!     axum::serve(listener, app)
//!         .with_graceful_shutdown(async move {
//!             let _ = tokio::signal::ctrl_c().await;
//!             shutdown.cancel(); // ends every SSE stream cleanly
//!         })
//!         .await?;
//!     Ok(())
//! }
//! ```
#![cfg_attr(not(test), warn(missing_docs))]

pub mod admin;
pub mod cli;
pub mod cluster;
pub mod mcp;
pub mod metrics;
pub mod policy_store;
pub mod reference;
pub mod settings;

/// The reference server under its earlier name ([`mod@reference`]).
pub use reference as tools;
