//! The HTTP face of the endpoint: `POST`, `GET` and `DELETE` on the MCP path.
#![allow(
    clippy::result_large_err,
    reason = "the Err side is the refusal response itself, built once on a cold path; boxing it buys nothing"
)]

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use http::header::{ACCEPT, CACHE_CONTROL, CONTENT_TYPE, HOST, ORIGIN};
use http::{HeaderMap, StatusCode};
use rewind_engine::{ResumeAction, ResumeRequest, SessionId};
use rmcp::model::{ClientJsonRpcMessage, ClientNotification, ClientRequest};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::session::{McpSession, RegisterError, STANDALONE};
use super::sse::{priming_frame, signal_frame, SseReader, Stops};
use super::transport::SessionTransport;
use super::{RewindMcp, SUPPORTED_PROTOCOL_VERSIONS};

const SESSION_ID: &str = "mcp-session-id";
const PROTOCOL_VERSION: &str = "mcp-protocol-version";
const LAST_EVENT_ID: &str = "last-event-id";
/// Largest POST body accepted.
const MAX_BODY: usize = 4 << 20;

pub(super) fn router(mcp: RewindMcp) -> axum::Router {
    let path = mcp.inner.options.path.clone();
    axum::Router::new()
        .route(
            &path,
            post(handle_post).get(handle_get).delete(handle_delete),
        )
        .with_state(mcp)
}

/// A refusal with a small JSON-RPC error body.
fn refuse(status: StatusCode, code: i64, message: &str) -> Response {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": { "code": code, "message": message },
    });
    (
        status,
        [(CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn bad_request(message: &str) -> Response {
    refuse(StatusCode::BAD_REQUEST, -32600, message)
}

fn not_found() -> Response {
    refuse(StatusCode::NOT_FOUND, -32001, "session not found")
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Host/Origin (DNS rebinding) and protocol-version checks shared by every
/// method.
fn check_common(mcp: &RewindMcp, headers: &HeaderMap) -> Result<(), Response> {
    let hosts = &mcp.inner.options.hosts;
    let forbidden = || refuse(StatusCode::FORBIDDEN, -32000, "forbidden Host or Origin");
    if let Some(host) = headers.get(HOST) {
        match host.to_str() {
            Ok(h) if hosts.allows(h) => {}
            _ => return Err(forbidden()),
        }
    }
    if let Some(origin) = headers.get(ORIGIN) {
        let authority = origin
            .to_str()
            .ok()
            .and_then(|o| o.split_once("://"))
            .map(|(_, rest)| rest.split('/').next().unwrap_or(rest));
        match authority {
            Some(a) if hosts.allows(a) => {}
            _ => return Err(forbidden()),
        }
    }
    // Absent means 2025-03-26 (spec); every value present must be supported.
    for v in headers.get_all(PROTOCOL_VERSION) {
        let ok = v
            .to_str()
            .is_ok_and(|v| SUPPORTED_PROTOCOL_VERSIONS.contains(&v.trim()));
        if !ok {
            return Err(bad_request(&format!(
                "unsupported MCP-Protocol-Version; supported: {}",
                SUPPORTED_PROTOCOL_VERSIONS.join(", ")
            )));
        }
    }
    if mcp.inner.options.shutdown.is_cancelled() {
        return Err(refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            -32000,
            "server shutting down",
        ));
    }
    Ok(())
}

/// Whether the client takes `text/event-stream` (a missing `Accept` or a
/// wildcard counts).
fn accepts_sse(headers: &HeaderMap) -> bool {
    match header(headers, ACCEPT.as_str()) {
        None => true,
        Some(a) => a.split(',').any(|t| {
            let t = t.split(';').next().unwrap_or("").trim();
            t.eq_ignore_ascii_case("text/event-stream") || t == "*/*" || t == "text/*"
        }),
    }
}

fn principal(mcp: &RewindMcp, parts: &http::request::Parts) -> Option<String> {
    mcp.inner.options.principal.as_ref().and_then(|f| f(parts))
}

/// The session a POST or DELETE names, with the table's answers when none.
fn presented_session(
    mcp: &RewindMcp,
    parts: &http::request::Parts,
) -> Result<Arc<McpSession>, Response> {
    let Some(raw) = header(&parts.headers, SESSION_ID) else {
        return Err(bad_request("missing Mcp-Session-Id"));
    };
    // An id that does not parse names no session: 404 like an unknown one
    // (MCP clients re-initialise only on 404).
    let Ok(id) = SessionId::parse(raw.trim()) else {
        return Err(not_found());
    };
    match mcp.session(id) {
        Some(s) if s.principal == principal(mcp, parts) => Ok(s),
        _ => Err(not_found()),
    }
}

fn sse_response(reader: SseReader, session_id: Option<SessionId>) -> Response {
    let mut resp = Response::new(Body::from_stream(reader.into_stream()));
    let h = resp.headers_mut();
    h.insert(
        CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    h.insert(CACHE_CONTROL, http::HeaderValue::from_static("no-cache"));
    if let Some(id) = session_id {
        if let Ok(v) = http::HeaderValue::from_str(&id.to_string()) {
            h.insert(SESSION_ID, v);
        }
    }
    resp
}

fn parse_messages(body: &[u8]) -> Result<Vec<ClientJsonRpcMessage>, Response> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|_| refuse(StatusCode::BAD_REQUEST, -32700, "parse error"))?;
    let items = match value {
        serde_json::Value::Array(items) if !items.is_empty() => items,
        serde_json::Value::Array(_) => return Err(bad_request("empty batch")),
        single => vec![single],
    };
    items
        .into_iter()
        .map(|v| {
            serde_json::from_value::<ClientJsonRpcMessage>(v)
                .map_err(|e| bad_request(&format!("invalid JSON-RPC message: {e}")))
        })
        .collect()
}

fn is_initialize(m: &ClientJsonRpcMessage) -> bool {
    matches!(m, ClientJsonRpcMessage::Request(r) if matches!(r.request, ClientRequest::InitializeRequest(_)))
}

fn stops(mcp: &RewindMcp, after_opening: bool) -> Stops {
    Stops {
        shutdown: mcp.inner.options.shutdown.clone(),
        keep_alive: mcp.inner.options.keep_alive,
        after_opening,
    }
}

async fn handle_post(State(mcp): State<RewindMcp>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    if let Err(r) = check_common(&mcp, &parts.headers) {
        return r;
    }
    let json = header(&parts.headers, CONTENT_TYPE.as_str()).is_some_and(|c| {
        c.split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
    });
    if !json {
        return refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            -32600,
            "Content-Type must be application/json",
        );
    }
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => return refuse(StatusCode::PAYLOAD_TOO_LARGE, -32600, "body too large"),
    };
    let mut msgs = match parse_messages(&body) {
        Ok(m) => m,
        Err(r) => return r,
    };
    let has_requests = msgs
        .iter()
        .any(|m| matches!(m, ClientJsonRpcMessage::Request(_)));
    if has_requests && !accepts_sse(&parts.headers) {
        return refuse(
            StatusCode::NOT_ACCEPTABLE,
            -32600,
            "Accept must include text/event-stream",
        );
    }
    if msgs.iter().any(is_initialize) {
        if msgs.len() != 1 {
            return bad_request("initialize must not be batched");
        }
        return initialize(&mcp, &parts, msgs).await;
    }
    let session = match presented_session(&mcp, &parts) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let cancelled: Vec<_> = msgs
        .iter()
        .filter_map(|m| match m {
            ClientJsonRpcMessage::Notification(n) => match &n.notification {
                ClientNotification::CancelledNotification(c) => c.params.request_id.clone(),
                _ => None,
            },
            _ => None,
        })
        .collect();
    if !has_requests {
        if session.forward(msgs).await.is_err() {
            return not_found();
        }
        for id in &cancelled {
            session.cancel(id);
        }
        return StatusCode::ACCEPTED.into_response();
    }
    let Some(stream) = session.handle.new_stream() else {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            -32000,
            "session has no stream ids left",
        );
    };
    if let Err(RegisterError::DuplicateId(id)) = session.register(stream, &mut msgs) {
        return bad_request(&format!(
            "request id {id} is already in flight in this session"
        ));
    }
    // Subscribed before the requests go in: the reader starts before any of
    // their answers can be appended.
    let replay = session.handle.subscribe(stream);
    let opening = vec![priming_frame(replay.position(), mcp.inner.options.retry)];
    let after_opening = mcp.inner.options.close_post_streams_after_priming;
    let reader = SseReader::new(
        replay,
        session.clone(),
        opening,
        stops(&mcp, after_opening),
        mcp.inner.metrics.clone(),
        false,
    );
    if session.forward(msgs).await.is_err() {
        return not_found();
    }
    for id in &cancelled {
        session.cancel(id);
    }
    sse_response(reader, None)
}

async fn initialize(
    mcp: &RewindMcp,
    parts: &http::request::Parts,
    mut msgs: Vec<ClientJsonRpcMessage>,
) -> Response {
    let principal = principal(mcp, parts);
    // `initialize` naming a live session re-initialises it: a new
    // incarnation (epoch) under the same id, so cursors of the old one are
    // answered with `reset`, never replayed.
    let reopen = match parts.headers.contains_key(SESSION_ID) {
        true => match presented_session(mcp, parts) {
            Ok(old) => {
                mcp.end_session(old.handle.id());
                Some(old.handle.id())
            }
            Err(r) => return r,
        },
        false => None,
    };
    let opened = match reopen {
        Some(id) => mcp.inner.engine.reopen(id, principal.as_deref()),
        None => mcp.inner.engine.open(principal.as_deref()),
    };
    let handle = match opened {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(error = %e, "cannot open a session");
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                -32000,
                "no room for a new session",
            );
        }
    };
    let Some(stream) = handle.new_stream() else {
        handle.close();
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            -32000,
            "no stream ids left",
        );
    };
    let (tx, rx) = mpsc::channel(mcp.inner.options.inbound_capacity.max(1));
    let service_ct: CancellationToken = mcp.inner.options.shutdown.child_token();
    let session = Arc::new(McpSession::new(handle.clone(), principal, tx, service_ct));
    if session.register(stream, &mut msgs).is_err() {
        handle.close();
        return bad_request("invalid initialize request");
    }
    let replay = handle.subscribe(stream);
    let opening = vec![priming_frame(replay.position(), mcp.inner.options.retry)];
    // The initialize answer is never cut short: the client needs its
    // session id and capabilities before it can resume anything.
    let reader = SseReader::new(
        replay,
        session.clone(),
        opening,
        stops(mcp, false),
        mcp.inner.metrics.clone(),
        false,
    );
    mcp.start_session(session.clone(), SessionTransport::new(session.clone(), rx));
    if session.forward(msgs).await.is_err() {
        mcp.end_session(handle.id());
        return refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            -32603,
            "session service failed",
        );
    }
    sse_response(reader, Some(handle.id()))
}

async fn handle_get(State(mcp): State<RewindMcp>, req: Request) -> Response {
    let (parts, _body) = req.into_parts();
    if let Err(r) = check_common(&mcp, &parts.headers) {
        return r;
    }
    if !accepts_sse(&parts.headers) {
        return refuse(
            StatusCode::NOT_ACCEPTABLE,
            -32600,
            "Accept must include text/event-stream",
        );
    }
    let principal = principal(&mcp, &parts);
    let session_id = header(&parts.headers, SESSION_ID).map(str::trim);
    let last_event_id = header(&parts.headers, LAST_EVENT_ID).map(str::trim);
    let started = Instant::now();
    let decision = mcp.inner.engine.resume(ResumeRequest {
        session_id,
        last_event_id,
        principal: principal.as_deref(),
    });
    mcp.inner
        .metrics
        .observe_resume(decision.verdict, decision.generation, started.elapsed());
    let retry = mcp.inner.options.retry;
    match decision.action {
        ResumeAction::Reject(r) => {
            let status = StatusCode::from_u16(r.http_status()).unwrap_or(StatusCode::NOT_FOUND);
            refuse(status, -32000, r.reason)
        }
        ResumeAction::Replay(replay) => {
            // The engine replays only the presented session's own ring, so
            // the presented id is the replay's session.
            let Some(session) = session_id
                .and_then(|s| SessionId::parse(s).ok())
                .and_then(|id| mcp.session(id))
            else {
                return not_found();
            };
            session.close_readers(replay.stream());
            let opening = vec![bytes_retry(retry)];
            let reader = SseReader::new(
                replay,
                session,
                opening,
                stops(&mcp, false),
                mcp.inner.metrics.clone(),
                true,
            );
            sse_response(reader, None)
        }
        ResumeAction::Fresh {
            session: Some(handle),
            signal,
        } => {
            let Some(session) = mcp.session(handle.id()) else {
                return not_found();
            };
            session.close_readers(STANDALONE);
            let replay = handle.subscribe(STANDALONE);
            let mut opening = Vec::with_capacity(2);
            if let Some(s) = &signal {
                opening.push(signal_frame(s, retry));
            }
            opening.push(priming_frame(replay.position(), retry));
            let reader = SseReader::new(
                replay,
                session,
                opening,
                stops(&mcp, false),
                mcp.inner.metrics.clone(),
                false,
            );
            sse_response(reader, None)
        }
        // A fresh stream needs a live session; without one the client must
        // initialise again (404) or name a session at all (400).
        ResumeAction::Fresh { session: None, .. } => match session_id {
            Some(_) => not_found(),
            None => bad_request("missing Mcp-Session-Id"),
        },
    }
}

fn bytes_retry(retry: std::time::Duration) -> Bytes {
    Bytes::from(format!("retry: {}\n\n", retry.as_millis()))
}

async fn handle_delete(State(mcp): State<RewindMcp>, req: Request) -> Response {
    let (parts, _body) = req.into_parts();
    if let Err(r) = check_common(&mcp, &parts.headers) {
        return r;
    }
    match presented_session(&mcp, &parts) {
        Ok(s) => {
            mcp.end_session(s.handle.id());
            StatusCode::NO_CONTENT.into_response()
        }
        Err(r) => r,
    }
}
