//! The reference server's tools: the ones the conformance suite calls by
//! name, and the workloads of Rewind's own tests (`progress_stream`,
//! `large_result`, `touch_resource`, `test_request_header`).
#![allow(
    deprecated,
    reason = "MCP logging and sampling are deprecated by SEP-2577 in rmcp, but they are part of the 2025-11-25 protocol this server speaks"
)]

use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, CreateMessageRequestParams, ElicitRequestParams,
    ElicitationSchema, JsonObject, LoggingLevel, LoggingMessageNotification,
    LoggingMessageNotificationParam, ProgressNotification, ProgressNotificationParam,
    ResourceContents, ResourceUpdatedNotificationParam, SamplingMessage, ServerNotification,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use serde::Deserialize;
use serde_json::json;

use super::{resources, ReferenceServer, RED_PIXEL_PNG, SILENT_WAV};
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
    /// How the notifications are sent: `"sink"` (the default) stores each
    /// one directly through [`SseStream::notify_progress`]; `"peer"` sends
    /// each through rmcp's `ctx.peer` and waits for it, as a handler that
    /// does not know it is served by Rewind would.
    #[serde(default)]
    pub via: Via,
}

/// See [`ProgressStreamArgs::via`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(rename_all = "lowercase")]
pub enum Via {
    /// [`SseStream::notify_progress`].
    #[default]
    Sink,
    /// `ctx.peer.send_notification(..).await`.
    Peer,
}

/// Notifications stored through the sink between two yields: a long
/// stream with no pause must not hold its worker thread for all of it.
const SINK_BURST: u32 = 64;

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
    /// Sends a log message on the stream of the request of `ctx`, if
    /// `level` passes the session's filter.
    async fn log(&self, ctx: &RequestContext<RoleServer>, level: LoggingLevel, message: &str) {
        let min = self.state().level;
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

#[tool_router(vis = "pub(super)")]
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
        // produced while nobody listens: only the session's stored events keep it.
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
        let sink = match args.via {
            Via::Sink => ctx.extensions.get::<SseStream>().cloned(),
            Via::Peer => None,
        };
        let token = ctx.meta.get_progress_token();
        for i in 1..=args.count {
            if i > 1 && args.interval_ms > 0 {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(args.interval_ms)) => {}
                    _ = ctx.ct.cancelled() => return text("cancelled"),
                }
            }
            let message = format!("{label} step {i}/{}", args.count);
            match (&sink, &token) {
                (Some(sink), Some(token)) => {
                    let mut param = ProgressNotificationParam::new(token.clone(), f64::from(i));
                    param.total = Some(f64::from(args.count));
                    param.message = Some(message);
                    sink.notify_progress(param);
                    if args.interval_ms == 0 && i % SINK_BURST == 0 {
                        if ctx.ct.is_cancelled() {
                            return text("cancelled");
                        }
                        tokio::task::yield_now().await;
                    }
                }
                _ => {
                    Self::progress(
                        &ctx,
                        f64::from(i),
                        Some(f64::from(args.count)),
                        Some(message),
                    )
                    .await
                }
            }
        }
        text(format!(
            "{label} progress_stream done: {} notifications",
            args.count
        ))
    }

    #[tool(description = "Returns a 1x1 PNG image")]
    async fn test_image_content(&self) -> CallToolResult {
        CallToolResult::success(vec![ContentBlock::image(RED_PIXEL_PNG, "image/png")])
    }

    #[tool(description = "Returns a short WAV clip")]
    async fn test_audio_content(&self) -> CallToolResult {
        CallToolResult::success(vec![ContentBlock::audio(SILENT_WAV, "audio/wav")])
    }

    #[tool(description = "Returns an embedded text resource")]
    async fn test_embedded_resource(&self) -> CallToolResult {
        CallToolResult::success(vec![ContentBlock::resource(
            ResourceContents::text(
                "This is an embedded resource content.",
                "test://embedded-resource",
            )
            .with_mime_type("text/plain"),
        )])
    }

    #[tool(description = "Returns text, an image and an embedded resource in one result")]
    async fn test_multiple_content_types(&self) -> CallToolResult {
        CallToolResult::success(vec![
            ContentBlock::text("Multiple content types test:"),
            ContentBlock::image(RED_PIXEL_PNG, "image/png"),
            ContentBlock::resource(
                ResourceContents::text(
                    json!({"test": "data", "value": 123}).to_string(),
                    "test://mixed-content-resource",
                )
                .with_mime_type("application/json"),
            ),
        ])
    }

    #[tool(
        description = "Asks the client's model for a completion of `prompt` (sampling/createMessage) and returns its answer"
    )]
    async fn test_sampling(
        &self,
        Parameters(args): Parameters<SamplingArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let supported = ctx
            .peer
            .peer_info()
            .is_some_and(|info| info.capabilities.sampling.is_some());
        if !supported {
            return failure("the client does not support sampling (no `sampling` capability)");
        }
        let params =
            CreateMessageRequestParams::new(vec![SamplingMessage::user_text(args.prompt)], 100);
        match ctx.peer.create_message(params).await {
            Ok(answer) => {
                let content = serde_json::to_value(&answer.message)
                    .ok()
                    .and_then(|m| m.get("content").cloned())
                    .unwrap_or_default();
                let said = content
                    .get("text")
                    .and_then(|t| t.as_str())
                    .map_or_else(|| content.to_string(), str::to_owned);
                text(format!("LLM response: {said}"))
            }
            Err(e) => failure(format!("sampling failed: {e}")),
        }
    }

    #[tool(description = "Asks the user for a username and an email address (elicitation/create)")]
    async fn test_elicitation(
        &self,
        Parameters(args): Parameters<ElicitationArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let schema = json!({
            "type": "object",
            "properties": {
                "username": {"type": "string", "description": "User's response"},
                "email": {"type": "string", "description": "User's email address"}
            },
            "required": ["username", "email"]
        });
        match elicit(&ctx, args.message, schema).await {
            Ok(answer) => text(format!("User response: {answer}")),
            Err(result) => result,
        }
    }

    #[tool(
        description = "Asks the user for values of every primitive type, each with a default (SEP-1034)"
    )]
    async fn test_elicitation_sep1034_defaults(
        &self,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let schema = json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "Your name", "default": "John Doe"},
                "age": {"type": "integer", "description": "Your age", "default": 30},
                "score": {"type": "number", "description": "Your score", "default": 95.5},
                "status": {
                    "type": "string", "description": "Your status",
                    "enum": ["active", "inactive", "pending"], "default": "active"
                },
                "verified": {"type": "boolean", "description": "Verified?", "default": true}
            }
        });
        match elicit(&ctx, "Please review the defaults".to_owned(), schema).await {
            Ok(answer) => text(format!("Elicitation completed: {answer}")),
            Err(result) => result,
        }
    }

    #[tool(
        description = "Asks the user to choose from every kind of enum: untitled, titled, legacy, and multi-select (SEP-1330)"
    )]
    async fn test_elicitation_sep1330_enums(
        &self,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let schema = json!({
            "type": "object",
            "properties": {
                "untitledSingle": {
                    "type": "string", "title": "Untitled single",
                    "enum": ["option1", "option2", "option3"]
                },
                "titledSingle": {
                    "type": "string", "title": "Titled single",
                    "oneOf": [
                        {"const": "value1", "title": "First Option"},
                        {"const": "value2", "title": "Second Option"},
                        {"const": "value3", "title": "Third Option"}
                    ]
                },
                "legacyEnum": {
                    "type": "string", "title": "Legacy titled",
                    "enum": ["opt1", "opt2", "opt3"],
                    "enumNames": ["Option One", "Option Two", "Option Three"]
                },
                "untitledMulti": {
                    "type": "array", "title": "Untitled multi",
                    "items": {"type": "string", "enum": ["option1", "option2", "option3"]}
                },
                "titledMulti": {
                    "type": "array", "title": "Titled multi",
                    "items": {"anyOf": [
                        {"const": "value1", "title": "First Choice"},
                        {"const": "value2", "title": "Second Choice"},
                        {"const": "value3", "title": "Third Choice"}
                    ]}
                }
            }
        });
        match elicit(&ctx, "Please choose".to_owned(), schema).await {
            Ok(answer) => text(format!("Elicitation completed: {answer}")),
            Err(result) => result,
        }
    }

    #[tool(
        name = "json_schema_2020_12_tool",
        description = "Tool with JSON Schema 2020-12 features",
        input_schema = json_schema_2020_12()
    )]
    async fn json_schema_2020_12_tool(
        &self,
        Parameters(args): Parameters<JsonObject>,
    ) -> CallToolResult {
        text(format!("received {}", serde_json::Value::Object(args)))
    }

    #[tool(
        description = "Returns one text result of `bytes` bytes (1..=67108864): a single large event to deliver and resume"
    )]
    async fn large_result(&self, Parameters(args): Parameters<LargeResultArgs>) -> CallToolResult {
        let Ok(len) = usize::try_from(args.bytes) else {
            return failure("bytes does not fit this platform");
        };
        if len == 0 || len > MAX_LARGE_RESULT_BYTES {
            return failure(format!(
                "bytes must be between 1 and {MAX_LARGE_RESULT_BYTES}"
            ));
        }
        // A repeating, position-dependent pattern: a client can check every
        // byte arrived in order without the server sending a checksum.
        let body: String = (0..len)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        text(body)
    }

    #[tool(
        description = "Changes resource `uri` and notifies the session if it subscribed (notifications/resources/updated, on the standalone stream)"
    )]
    async fn touch_resource(
        &self,
        Parameters(args): Parameters<TouchResourceArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        if let Err(e) = resources::check_known(&args.uri) {
            return failure(e.message.to_string());
        }
        let (revision, subscribed) = {
            let mut state = self.state();
            state.revision += 1;
            (state.revision, state.subscribed.contains(&args.uri))
        };
        if subscribed {
            // Not tagged with the request: an update belongs to the session,
            // so it goes to the standalone stream.
            let _ = ctx
                .peer
                .notify_resource_updated(ResourceUpdatedNotificationParam::new(args.uri.clone()))
                .await;
        }
        text(format!(
            "{} is at revision {revision}; {}",
            args.uri,
            if subscribed {
                "subscribers notified"
            } else {
                "nobody subscribed"
            }
        ))
    }

    #[tool(
        description = "Returns the value of HTTP request header `name` of this call, read from the request's `http::request::Parts`"
    )]
    async fn test_request_header(
        &self,
        Parameters(args): Parameters<RequestHeaderArgs>,
        Extension(parts): Extension<http::request::Parts>,
    ) -> CallToolResult {
        match parts.headers.get(&args.name).map(|v| v.to_str()) {
            Some(Ok(v)) => text(v),
            Some(Err(_)) => failure(format!("header {} is not visible ASCII", args.name)),
            None => failure(format!("no header {}", args.name)),
        }
    }
}

/// Largest `large_result`: 64 MiB.
pub const MAX_LARGE_RESULT_BYTES: usize = 64 << 20;

/// Arguments of `large_result`.
#[derive(Debug, Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct LargeResultArgs {
    /// Length of the text result in bytes (1..=67108864).
    pub bytes: u64,
}

/// Arguments of `test_sampling`.
#[derive(Debug, Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct SamplingArgs {
    /// The prompt to send to the client's model.
    pub prompt: String,
}

/// Arguments of `test_elicitation`.
#[derive(Debug, Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct ElicitationArgs {
    /// The message to show the user.
    pub message: String,
}

/// Arguments of `touch_resource`.
#[derive(Debug, Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct TouchResourceArgs {
    /// The resource that changed, e.g. `test://watched-resource`.
    pub uri: String,
}

/// Arguments of `test_request_header`.
#[derive(Debug, Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct RequestHeaderArgs {
    /// The header's name, e.g. `user-agent`.
    pub name: String,
}

fn failure(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message)])
}

/// The input schema of `json_schema_2020_12_tool`, written by hand so that
/// `$schema`, `$defs` and `additionalProperties` reach the client as they are.
fn json_schema_2020_12() -> Arc<JsonObject> {
    let schema = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "$defs": {
            "address": {
                "type": "object",
                "properties": {
                    "street": {"type": "string"},
                    "city": {"type": "string"}
                }
            }
        },
        "properties": {
            "name": {"type": "string"},
            "address": {"$ref": "#/$defs/address"}
        },
        "additionalProperties": false
    });
    match schema {
        serde_json::Value::Object(map) => Arc::new(map),
        _ => unreachable!("a JSON object literal"),
    }
}

/// Sends `elicitation/create` with `schema` and waits for the user's answer;
/// `Err` is the tool result to return instead (no capability, refused
/// schema, or the request failed).
async fn elicit(
    ctx: &RequestContext<RoleServer>,
    message: String,
    schema: serde_json::Value,
) -> Result<String, CallToolResult> {
    let supported = ctx
        .peer
        .peer_info()
        .is_some_and(|info| info.capabilities.elicitation.is_some());
    if !supported {
        return Err(failure(
            "the client does not support elicitation (no `elicitation` capability)",
        ));
    }
    let requested_schema: ElicitationSchema = serde_json::from_value(schema).map_err(|e| {
        failure(format!(
            "internal: the elicitation schema does not parse: {e}"
        ))
    })?;
    let params = ElicitRequestParams::FormElicitationParams {
        meta: None,
        message,
        requested_schema,
    };
    match ctx.peer.create_elicitation(params).await {
        Ok(answer) => Ok(format!(
            "action={}, content={}",
            serde_json::to_value(&answer.action)
                .ok()
                .and_then(|a| a.as_str().map(str::to_owned))
                .unwrap_or_default(),
            answer.content.unwrap_or(serde_json::Value::Null)
        )),
        Err(e) => Err(failure(format!("elicitation failed: {e}"))),
    }
}
