//! The reference server: the tools the official MCP conformance suite calls,
//! plus `progress_stream`, the workload of Rewind's resume tests and load.
//!
//! Notifications a tool sends while it runs are tagged with
//! [`RelatedRequest`], so they travel on the tool call's own SSE stream and
//! are replayed with it after a reconnect.
#![allow(
    deprecated,
    reason = "MCP logging is deprecated by SEP-2577 in rmcp, but it is part of the 2025-11-25 protocol this server speaks"
)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, LoggingLevel, LoggingMessageNotification,
    LoggingMessageNotificationParam, ProgressNotification, ProgressNotificationParam,
    ServerCapabilities, ServerConfig, ServerNotification, SetLevelRequestParams,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData as McpError, RoleServer, ServerHandler};
use serde::Deserialize;

use crate::mcp::{RelatedRequest, SseStream};

/// Most notifications one `progress_stream` call may send.
pub const MAX_PROGRESS_COUNT: u32 = 100_000;
/// Longest pause between two of them.
pub const MAX_PROGRESS_INTERVAL_MS: u64 = 60_000;

/// Arguments of `progress_stream`.
#[derive(Debug, Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct ProgressStreamArgs {
    /// How many `notifications/progress` to send (1..=100000).
    pub count: u32,
    /// Milliseconds between two of them (0..=60000).
    #[serde(default)]
    pub interval_ms: u64,
    /// Optional text echoed in every progress message and in the result.
    #[serde(default)]
    pub label: Option<String>,
}

/// The reference MCP server of `rewind serve`.
#[derive(Debug, Clone)]
pub struct ReferenceServer {
    /// The minimum level of log notifications (`logging/setLevel`).
    level: Arc<Mutex<LoggingLevel>>,
}

impl Default for ReferenceServer {
    fn default() -> ReferenceServer {
        ReferenceServer::new()
    }
}

fn severity(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

fn text(result: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(result)])
}

impl ReferenceServer {
    /// A server with log level `info`.
    pub fn new() -> ReferenceServer {
        ReferenceServer {
            level: Arc::new(Mutex::new(LoggingLevel::Info)),
        }
    }

    /// Sends a log message on the stream of the request of `ctx`, if
    /// `level` passes the session's filter.
    async fn log(&self, ctx: &RequestContext<RoleServer>, level: LoggingLevel, message: &str) {
        let min = *self.level.lock().unwrap_or_else(|e| e.into_inner());
        if severity(level) < severity(min) {
            return;
        }
        let mut n = LoggingMessageNotification::new(
            LoggingMessageNotificationParam::new(level, serde_json::json!(message))
                .with_logger("rewind-reference"),
        );
        n.extensions.insert(RelatedRequest(ctx.id.clone()));
        let _ = ctx
            .peer
            .send_notification(ServerNotification::LoggingMessageNotification(n))
            .await;
    }

    /// Sends one progress notification for the request of `ctx`, if it
    /// asked for progress.
    async fn progress(
        ctx: &RequestContext<RoleServer>,
        progress: f64,
        total: Option<f64>,
        message: Option<String>,
    ) {
        let Some(token) = ctx.meta.get_progress_token() else {
            return;
        };
        let mut param = ProgressNotificationParam::new(token, progress);
        param.total = total;
        param.message = message;
        let mut n = ProgressNotification::new(param);
        n.extensions.insert(RelatedRequest(ctx.id.clone()));
        let _ = ctx
            .peer
            .send_notification(ServerNotification::ProgressNotification(n))
            .await;
    }
}

#[tool_router]
impl ReferenceServer {
    #[tool(description = "Returns a simple text response")]
    async fn test_simple_text(&self) -> CallToolResult {
        text("This is a simple text response for testing.")
    }

    #[tool(description = "Sends three log notifications while it runs")]
    async fn test_tool_with_logging(&self, ctx: RequestContext<RoleServer>) -> CallToolResult {
        self.log(&ctx, LoggingLevel::Info, "Tool execution started")
            .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.log(&ctx, LoggingLevel::Info, "Tool processing data")
            .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.log(&ctx, LoggingLevel::Info, "Tool execution completed")
            .await;
        text("Tool with logging executed successfully")
    }

    #[tool(description = "Reports progress 0, 50 and 100 of 100")]
    async fn test_tool_with_progress(&self, ctx: RequestContext<RoleServer>) -> CallToolResult {
        for (i, p) in [0.0, 50.0, 100.0].into_iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Self::progress(&ctx, p, Some(100.0), None).await;
        }
        text("Tool with progress executed successfully")
    }

    #[tool(description = "Always fails")]
    async fn test_error_handling(&self) -> CallToolResult {
        CallToolResult::error(vec![ContentBlock::text(
            "This tool intentionally returns an error for testing",
        )])
    }

    #[tool(
        description = "Closes its SSE stream before answering; the client reconnects with Last-Event-ID to get the result"
    )]
    async fn test_reconnection(&self, ctx: RequestContext<RoleServer>) -> CallToolResult {
        if let Some(stream) = ctx.extensions.get::<SseStream>() {
            stream.close();
        }
        // Answer after the client noticed the close, so the result is
        // produced while nobody listens: only the ring keeps it.
        tokio::time::sleep(Duration::from_millis(100)).await;
        text("Reconnection test completed")
    }

    #[tool(
        description = "Sends `count` progress notifications (progress 1..count) spaced `interval_ms` apart, then returns a text result"
    )]
    async fn progress_stream(
        &self,
        Parameters(args): Parameters<ProgressStreamArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        if args.count == 0 || args.count > MAX_PROGRESS_COUNT {
            return CallToolResult::error(vec![ContentBlock::text(format!(
                "count must be between 1 and {MAX_PROGRESS_COUNT}"
            ))]);
        }
        if args.interval_ms > MAX_PROGRESS_INTERVAL_MS {
            return CallToolResult::error(vec![ContentBlock::text(format!(
                "interval_ms must be at most {MAX_PROGRESS_INTERVAL_MS}"
            ))]);
        }
        let label = args.label.unwrap_or_default();
        for i in 1..=args.count {
            if i > 1 && args.interval_ms > 0 {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(args.interval_ms)) => {}
                    _ = ctx.ct.cancelled() => return text("cancelled"),
                }
            }
            let message = format!("{label} step {i}/{}", args.count);
            Self::progress(
                &ctx,
                f64::from(i),
                Some(f64::from(args.count)),
                Some(message),
            )
            .await;
        }
        text(format!(
            "{label} progress_stream done: {} notifications",
            args.count
        ))
    }
}

#[tool_handler]
impl ServerHandler for ReferenceServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_logging()
                .build(),
        )
        .with_server_info(Implementation::new(
            "rewind-reference",
            env!("CARGO_PKG_VERSION"),
        ))
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        *self.level.lock().unwrap_or_else(|e| e.into_inner()) = request.level;
        Ok(())
    }
}
