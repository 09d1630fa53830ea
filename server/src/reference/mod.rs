//! The reference server: everything the official MCP conformance suite
//! (0.1.13) asks a server for, plus the tools Rewind's own resume tests and
//! load use (`progress_stream`, `large_result`, `touch_resource`).
//!
//! | part | what |
//! |---|---|
//! | [`tools`] | text, image, audio, embedded-resource and mixed content; logging and progress while running; an error; a stream that closes itself (SSE polling); sampling and elicitation requests sent to the client and awaited; a JSON Schema 2020-12 input schema; large results |
//! | [`resources`] | static text and binary resources, a URI template, subscriptions with `notifications/resources/updated` |
//! | [`prompts`] | a simple prompt, one with arguments, one embedding a resource, one with an image; argument completion |
//!
//! Notifications a tool sends while it runs are tagged with
//! [`RelatedRequest`](crate::mcp::RelatedRequest), so they travel on the tool
//! call's own SSE stream and are replayed with it after a reconnect. Server
//! requests a tool sends (sampling, elicitation) travel on the same stream
//! (rmcp marks them with the originating request); the client answers them
//! with a POST, which may arrive on any connection, even after a cut and a
//! resume. Resource updates belong to no request: they go to the session's
//! standalone stream, which keeps them for the next `GET`.
//!
//! One [`ReferenceServer`] serves one MCP session; its log level and
//! resource subscriptions are that session's.
#![allow(
    deprecated,
    reason = "MCP logging is deprecated by SEP-2577 in rmcp, but it is part of the 2025-11-25 protocol this server speaks"
)]

pub mod prompts;
pub mod resources;
pub mod tools;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use rmcp::handler::server::router::prompt::PromptRouter;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{
    CompleteRequestParams, CompleteResult, CompletionInfo, Implementation,
    ListResourceTemplatesResult, ListResourcesResult, LoggingLevel, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, Reference, ServerCapabilities, ServerConfig,
    SetLevelRequestParams, SubscribeRequestParams, UnsubscribeRequestParams,
};
use rmcp::service::RequestContext;
use rmcp::{prompt_handler, tool_handler, ErrorData as McpError, RoleServer, ServerHandler};

pub use tools::{
    LargeResultArgs, ProgressStreamArgs, Via, MAX_LARGE_RESULT_BYTES, MAX_PROGRESS_COUNT,
    MAX_PROGRESS_INTERVAL_MS,
};

/// A 1×1 red PNG, base64: the image of the image tools, prompt and binary resource.
pub const RED_PIXEL_PNG: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC";
/// Eight samples of 8 kHz mono silence as a WAV file, base64.
pub const SILENT_WAV: &str =
    "UklGRiwAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQgAAACAgICAgICAgA==";

/// The reference MCP server of `rewind serve`.
#[derive(Debug, Clone)]
pub struct ReferenceServer {
    state: Arc<Mutex<SessionState>>,
}

/// What one session changes: its log level and its subscriptions.
#[derive(Debug)]
struct SessionState {
    /// The minimum level of log notifications (`logging/setLevel`).
    level: LoggingLevel,
    /// Resource URIs the client subscribed to.
    subscribed: BTreeSet<String>,
    /// How often `touch_resource` changed each resource (its content says so).
    revision: u64,
}

impl Default for ReferenceServer {
    fn default() -> ReferenceServer {
        ReferenceServer::new()
    }
}

impl ReferenceServer {
    /// A server with log level `info` and no subscriptions.
    pub fn new() -> ReferenceServer {
        ReferenceServer {
            state: Arc::new(Mutex::new(SessionState {
                level: LoggingLevel::Info,
                subscribed: BTreeSet::new(),
                revision: 0,
            })),
        }
    }

    /// The tools, built once for the process. `#[tool_handler]` would
    /// otherwise call `Self::tool_router()` on every `tools/call` and
    /// `tools/list`: a hash map and every tool's JSON schema (about 10 KiB)
    /// built and dropped per call, which under load is peak heap and
    /// allocator churn for nothing, since the tools never change.
    fn tools() -> &'static ToolRouter<ReferenceServer> {
        static TOOLS: OnceLock<ToolRouter<ReferenceServer>> = OnceLock::new();
        TOOLS.get_or_init(ReferenceServer::tool_router)
    }

    /// The prompts, built once for the process (as [`Self::tools`]).
    fn prompts() -> &'static PromptRouter<ReferenceServer> {
        static PROMPTS: OnceLock<PromptRouter<ReferenceServer>> = OnceLock::new();
        PROMPTS.get_or_init(ReferenceServer::prompt_router)
    }

    fn state(&self) -> MutexGuard<'_, SessionState> {
        // Plain values; a panic elsewhere cannot leave them half-written.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[tool_handler(router = Self::tools())]
#[prompt_handler(router = Self::prompts())]
impl ServerHandler for ReferenceServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_logging()
                .enable_completions()
                .enable_prompts()
                .enable_resources()
                .enable_resources_subscribe()
                .enable_tools()
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
        self.state().level = request.level;
        Ok(())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        Ok(ListResourcesResult::with_all_items(resources::list()))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(
            resources::templates(),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let revision = self.state().revision;
        resources::read(&request.uri, revision).map(Into::into)
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        resources::check_known(&request.uri)?;
        self.state().subscribed.insert(request.uri);
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.state().subscribed.remove(&request.uri);
        Ok(())
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        let values = match &request.r#ref {
            Reference::Prompt(p) => {
                prompts::complete(&p.name, &request.argument.name, &request.argument.value)
            }
            Reference::Resource(r) => {
                resources::complete(&r.uri, &request.argument.name, &request.argument.value)
            }
            _ => Vec::new(),
        };
        let info = CompletionInfo::with_all_values(values)
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        Ok(CompleteResult::new(info))
    }
}
