//! The HTTP face of the endpoint: `POST`, `GET` and `DELETE` on the MCP path,
//! CORS preflights, the header-size limit, the access log and the HTTP
//! metrics.
#![allow(
    clippy::result_large_err,
    reason = "the Err side is the refusal response itself, built once on a cold path; boxing it buys nothing"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use http::header::{ACCEPT, ALLOW, CACHE_CONTROL, CONTENT_TYPE, HOST, ORIGIN};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use rewind_engine::{EventId, Replay, ResumeAction, ResumeRequest, SessionId, SignalKind};
use rmcp::model::{ClientJsonRpcMessage, ClientNotification, ClientRequest};
use serde::de::IgnoredAny;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::session::{McpSession, RegisterError, STANDALONE};
use super::sse::{event_frame, priming_frame, signal_frame, SseReader, Stops};
use super::transport::SessionTransport;
use super::{stateless, RewindMcp, STATELESS_PROTOCOL_VERSIONS, SUPPORTED_PROTOCOL_VERSIONS};
use crate::cluster::remote::Follow;
use crate::cluster::{ForwardReply, Forwarded};
use crate::metrics::verdict_label;

const SESSION_ID: &str = "mcp-session-id";
const PROTOCOL_VERSION: &str = "mcp-protocol-version";
const LAST_EVENT_ID: &str = "last-event-id";

pub(super) fn router(mcp: RewindMcp) -> axum::Router {
    let path = mcp.inner.options.path.clone();
    let mut router = axum::Router::new()
        .route(
            &path,
            post(handle_post).get(handle_get).delete(handle_delete),
        )
        .with_state(mcp.clone());
    if mcp.inner.options.cors {
        router = router.layer(cors(&mcp));
    }
    router.layer(middleware::from_fn_with_state(mcp, edge))
}

/// CORS for the origins the endpoint accepts anyway: browsers may read
/// `Mcp-Session-Id` (and send it back), and preflights are answered.
fn cors(mcp: &RewindMcp) -> tower_http::cors::CorsLayer {
    use tower_http::cors::{AllowOrigin, CorsLayer};
    let check = mcp.clone();
    CorsLayer::new()
        .allow_origin(AllowOrigin::predicate(move |origin, _parts| {
            let o = &check.inner.options;
            origin.to_str().is_ok_and(|v| o.origins.allows(v, &o.hosts))
        }))
        .allow_methods([Method::GET, Method::POST, Method::DELETE])
        .allow_headers([
            CONTENT_TYPE,
            ACCEPT,
            http::header::AUTHORIZATION,
            HeaderName::from_static(SESSION_ID),
            HeaderName::from_static(PROTOCOL_VERSION),
            HeaderName::from_static(LAST_EVENT_ID),
        ])
        .expose_headers([
            HeaderName::from_static(SESSION_ID),
            HeaderName::from_static(PROTOCOL_VERSION),
        ])
        .max_age(Duration::from_secs(600))
}

/// What a handler tells the access log about the request it answered.
#[derive(Debug, Clone, Copy, Default)]
struct Access {
    /// The session's owner tag (the first part of its event ids): safe to
    /// log, unlike the session id, which is the session's credential.
    session: Option<u64>,
    stream: Option<u32>,
    verdict: Option<&'static str>,
}

fn with_access(mut resp: Response, access: Access) -> Response {
    resp.extensions_mut().insert(access);
    resp
}

/// Outermost layer: the header-size limit (431), one access-log line per
/// request at `info`, and the responses-by-status counter.
async fn edge(State(mcp): State<RewindMcp>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    // Each header line is `name: value\r\n`.
    let header_bytes: usize = req
        .headers()
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 4)
        .sum();
    let limit = mcp.inner.options.max_header_bytes;
    let resp = if header_bytes > limit {
        refuse(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            -32600,
            &format!("request headers are {header_bytes} bytes; the limit is {limit}"),
        )
    } else {
        next.run(req).await
    };
    mcp.inner.metrics.observe_response(&method, resp.status());
    let access = resp
        .extensions()
        .get::<Access>()
        .copied()
        .unwrap_or_default();
    let session = access.session.map(|t| format!("{t:016x}"));
    tracing::info!(
        target: "rewind::access",
        method = %method,
        status = resp.status().as_u16(),
        session = session.as_deref().unwrap_or("-"),
        stream = access.stream.map_or_else(|| "-".to_owned(), |s| s.to_string()),
        verdict = access.verdict.unwrap_or("-"),
        // Milliseconds to the microsecond, so a line reads `ms=0.06`.
        ms = (started.elapsed().as_secs_f64() * 1e6).round() / 1e3,
        "request"
    );
    resp
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

/// `initialize` refused by a session cap: 503 with `Retry-After` (whole
/// seconds, at least 1), so clients back off instead of hammering.
fn session_refused(e: &rewind_engine::OpenError) -> Response {
    tracing::warn!(error = %e, "initialize refused");
    let mut resp = refuse(StatusCode::SERVICE_UNAVAILABLE, -32000, &e.to_string());
    if let Some(after) = e.retry_after() {
        let secs = after.as_secs_f64().ceil().max(1.0) as u64;
        resp.headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
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

/// The protocol revision a request names in its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Revision {
    /// A revision with sessions; `None`: no header (2025-03-26).
    Sessions(Option<&'static str>),
    /// 2026-07-28 or later: stateless ([`stateless`]).
    Stateless,
}

impl Revision {
    /// Whether JSON-RPC batches exist in this revision (removed in
    /// 2025-06-18).
    fn batches(self) -> bool {
        matches!(self, Revision::Sessions(None | Some("2025-03-26")))
    }
}

/// Host/Origin (DNS rebinding) and protocol-version checks shared by every
/// method.
fn check_common(mcp: &RewindMcp, headers: &HeaderMap) -> Result<Revision, Response> {
    let options = &mcp.inner.options;
    let forbidden = || refuse(StatusCode::FORBIDDEN, -32000, "forbidden Host or Origin");
    if let Some(host) = headers.get(HOST) {
        match host.to_str() {
            Ok(h) if options.hosts.allows(h) => {}
            _ => return Err(forbidden()),
        }
    }
    if let Some(origin) = headers.get(ORIGIN) {
        match origin.to_str() {
            Ok(o) if options.origins.allows(o, &options.hosts) => {}
            _ => return Err(forbidden()),
        }
    }
    // Absent means 2025-03-26 (spec); every value present must be supported.
    let mut revision = Revision::Sessions(None);
    for v in headers.get_all(PROTOCOL_VERSION) {
        let v = v.to_str().map(str::trim).unwrap_or("");
        if let Some(known) = SUPPORTED_PROTOCOL_VERSIONS.iter().find(|k| **k == v) {
            revision = Revision::Sessions(Some(known));
        } else if STATELESS_PROTOCOL_VERSIONS.contains(&v) {
            revision = Revision::Stateless;
        } else {
            return Err(bad_request(&format!(
                "unsupported MCP-Protocol-Version; supported: {}, {}",
                SUPPORTED_PROTOCOL_VERSIONS.join(", "),
                STATELESS_PROTOCOL_VERSIONS.join(", ")
            )));
        }
    }
    if options.shutdown.is_cancelled() {
        return Err(refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            -32000,
            "server shutting down",
        ));
    }
    Ok(revision)
}

/// Which media types the client takes (a missing `Accept` takes both).
#[derive(Debug, Clone, Copy)]
struct Accepts {
    json: bool,
    sse: bool,
}

fn accepts(headers: &HeaderMap) -> Accepts {
    let Some(a) = header(headers, ACCEPT.as_str()) else {
        return Accepts {
            json: true,
            sse: true,
        };
    };
    let mut out = Accepts {
        json: false,
        sse: false,
    };
    for t in a.split(',') {
        let t = t.split(';').next().unwrap_or("").trim();
        let any = t == "*/*";
        out.json |= any || t.eq_ignore_ascii_case("application/json") || t == "application/*";
        out.sse |= any || t.eq_ignore_ascii_case("text/event-stream") || t == "text/*";
    }
    out
}

/// GET and DELETE do not exist in the stateless revision.
fn stateless_method_not_allowed() -> Response {
    let mut r = refuse(
        StatusCode::METHOD_NOT_ALLOWED,
        -32600,
        "MCP 2026-07-28 has no sessions: only POST",
    );
    r.headers_mut()
        .insert(ALLOW, HeaderValue::from_static("POST"));
    r
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
    let principal = principal(mcp, parts);
    match mcp.session(id) {
        Some(s) if s.principal == principal => Ok(s),
        Some(_) => Err(wrong_principal(mcp, raw.trim(), principal.as_deref())),
        None => Err(not_found()),
    }
}

/// A live session presented by another principal: the answer a `GET`
/// would get (the policy's, 409 by default), so no method tells more than
/// another about whose the session is.
fn wrong_principal(mcp: &RewindMcp, session_id: &str, principal: Option<&str>) -> Response {
    let started = Instant::now();
    let decision = mcp.inner.engine.resume(ResumeRequest {
        session_id: Some(session_id),
        last_event_id: None,
        principal,
    });
    mcp.inner
        .metrics
        .observe_resume(decision.verdict, decision.generation, started.elapsed());
    let access = Access {
        verdict: Some(verdict_label(decision.verdict)),
        ..Access::default()
    };
    let resp = match decision.action {
        ResumeAction::Reject(r) => {
            let status = StatusCode::from_u16(r.http_status()).unwrap_or(StatusCode::CONFLICT);
            refuse(status, -32000, r.reason)
        }
        // The safe set for another principal's session holds rejections
        // only; anything else here would be a policy host bug.
        _ => refuse(
            StatusCode::CONFLICT,
            -32000,
            "session is bound to another principal",
        ),
    };
    with_access(resp, access)
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
        set_session_header(&mut resp, id);
    }
    resp
}

fn set_session_header(resp: &mut Response, id: SessionId) {
    if let Ok(v) = http::HeaderValue::from_str(&id.to_string()) {
        resp.headers_mut().insert(SESSION_ID, v);
    }
}

/// One JSON body holding `payloads` (one message, or an array of them for a
/// batch).
fn json_response(payloads: Vec<Vec<u8>>, batch: bool, session_id: Option<SessionId>) -> Response {
    let body = if batch {
        let mut b = Vec::with_capacity(payloads.iter().map(|p| p.len() + 1).sum::<usize>() + 2);
        b.push(b'[');
        for (i, p) in payloads.iter().enumerate() {
            if i > 0 {
                b.push(b',');
            }
            b.extend_from_slice(p);
        }
        b.push(b']');
        b
    } else {
        payloads.into_iter().next().unwrap_or_default()
    };
    let mut resp = Response::new(Body::from(body));
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(id) = session_id {
        set_session_header(&mut resp, id);
    }
    resp
}

fn parse_messages(body: &[u8]) -> Result<(Vec<ClientJsonRpcMessage>, bool), Response> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|_| refuse(StatusCode::BAD_REQUEST, -32700, "parse error"))?;
    let (items, batch) = match value {
        serde_json::Value::Array(items) if !items.is_empty() => (items, true),
        serde_json::Value::Array(_) => return Err(bad_request("empty batch")),
        single => (vec![single], false),
    };
    items
        .into_iter()
        .map(|v| {
            serde_json::from_value::<ClientJsonRpcMessage>(v)
                .map_err(|e| bad_request(&format!("invalid JSON-RPC message: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(|m| (m, batch))
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

/// How a POST carrying requests is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// An SSE stream of the requests' stream (the default).
    Sse,
    /// One JSON body: the client takes no SSE. Whatever else the requests
    /// cause (progress, logs, server requests) goes to the standalone
    /// stream, where a `GET` picks it up.
    Json,
    /// JSON if the first thing on the stream is the one request's response,
    /// else SSE from there on ([`McpOptions::json_response`](super::McpOptions::json_response)).
    PreferJson,
}

fn answer_mode(mcp: &RewindMcp, accepts: Accepts, requests: usize) -> Answer {
    if !accepts.sse {
        Answer::Json
    } else if mcp.inner.options.json_response && accepts.json && requests == 1 {
        Answer::PreferJson
    } else {
        Answer::Sse
    }
}

/// Whether a stored message is a response (it has no `method`).
fn is_response(payload: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Probe {
        method: Option<IgnoredAny>,
    }
    serde_json::from_slice::<Probe>(payload).is_ok_and(|p| p.method.is_none())
}

/// Serves `reader` as `answer` says.
async fn respond(
    reader: SseReader,
    answer: Answer,
    batch: bool,
    session_id: Option<SessionId>,
) -> Response {
    match answer {
        Answer::Sse => sse_response(reader, session_id),
        Answer::Json => {
            let payloads = reader.collect().await;
            if payloads.is_empty() {
                return refuse(
                    StatusCode::SERVICE_UNAVAILABLE,
                    -32000,
                    "the session or the server ended before the answer",
                );
            }
            json_response(payloads, batch, session_id)
        }
        Answer::PreferJson => match reader.first_event().await {
            Ok((_, payload, _)) if is_response(&payload) => {
                json_response(vec![payload], false, session_id)
            }
            Ok((id, payload, mut reader)) => {
                reader.push_opening(event_frame(id, &payload));
                sse_response(reader, session_id)
            }
            Err(reader) => sse_response(reader, session_id),
        },
    }
}

async fn handle_post(State(mcp): State<RewindMcp>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let revision = match check_common(&mcp, &parts.headers) {
        Ok(r) => r,
        Err(r) => return r,
    };
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
    let limit = mcp.inner.options.max_body_bytes;
    let body = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(_) => {
            return refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                -32600,
                &format!("body over the limit of {limit} bytes"),
            )
        }
    };
    if let Some(c) = &mcp.inner.options.cluster {
        c.verify_if_suspect().await;
    }
    let (mut msgs, batch) = match parse_messages(&body) {
        Ok(m) => m,
        Err(r) => return r,
    };
    if batch && !revision.batches() {
        return bad_request("JSON-RPC batches are not part of MCP 2025-06-18 and later");
    }
    let version = header(&parts.headers, PROTOCOL_VERSION).map(str::trim);
    if stateless::applies(version, &msgs) {
        let version = version.map(str::to_owned);
        return stateless::post(&mcp, parts, version.as_deref(), msgs).await;
    }
    let requests = msgs
        .iter()
        .filter(|m| matches!(m, ClientJsonRpcMessage::Request(_)))
        .count();
    let accepts = accepts(&parts.headers);
    if requests > 0 && !accepts.sse && !accepts.json {
        return refuse(
            StatusCode::NOT_ACCEPTABLE,
            -32600,
            "Accept must include text/event-stream or application/json",
        );
    }
    let answer = answer_mode(&mcp, accepts, requests);
    if let Some(id) = remote_session(&mcp, &parts) {
        return forward(&mcp, id, parts, body).await;
    }
    if msgs.iter().any(is_initialize) {
        if msgs.len() != 1 {
            return bad_request("initialize must not be batched");
        }
        // The session's first answer is JSON only for a client that takes
        // nothing else; otherwise it primes the session's first stream.
        let answer = if answer == Answer::Json {
            Answer::Json
        } else {
            Answer::Sse
        };
        return initialize(&mcp, &parts, msgs, answer).await;
    }
    let session = match presented_session(&mcp, &parts) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let mut access = Access {
        session: Some(session.tag()),
        ..Access::default()
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
    if requests == 0 {
        if session
            .register(STANDALONE, STANDALONE, &parts, &mut msgs)
            .is_err()
            || session.forward(msgs).await.is_err()
        {
            return not_found();
        }
        for id in &cancelled {
            session.cancel(id);
        }
        return with_access(StatusCode::ACCEPTED.into_response(), access);
    }
    let Some(stream) = session.handle.new_stream() else {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            -32000,
            "session has no stream ids left",
        );
    };
    access.stream = Some(stream);
    let side = if answer == Answer::Json {
        STANDALONE
    } else {
        stream
    };
    if let Err(RegisterError::DuplicateId(id)) = session.register(stream, side, &parts, &mut msgs) {
        return bad_request(&format!(
            "request id {id} is already in flight in this session"
        ));
    }
    // Subscribed before the requests go in: the reader starts before any of
    // their answers can be appended.
    let replay = session.handle.subscribe(stream);
    let opening = vec![priming_frame(replay.position(), mcp.inner.options.retry)];
    let after_opening = mcp.inner.options.close_post_streams_after_priming && answer == Answer::Sse;
    let reader = SseReader::new(
        replay,
        session.clone(),
        opening,
        stops(&mcp, after_opening),
        mcp.inner.metrics.clone(),
        false,
    );
    let position = reader_position(&reader);
    if session.forward(msgs).await.is_err() {
        return not_found();
    }
    for id in &cancelled {
        session.cancel(id);
    }
    let resp = respond(reader, answer, batch, None).await;
    with_access(
        with_post_stream(resp, stream, position, after_opening),
        access,
    )
}

/// Where a POST's SSE answer started: what a node that forwarded the POST
/// needs to serve the same answer from Redis.
#[derive(Debug, Clone, Copy)]
struct PostStream {
    stream: u32,
    position: EventId,
    /// The answer ends after its opening frames (SSE polling).
    after_opening: bool,
}

fn reader_position(reader: &SseReader) -> EventId {
    reader.position()
}

fn with_post_stream(
    mut resp: Response,
    stream: u32,
    position: EventId,
    after_opening: bool,
) -> Response {
    let sse = resp
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if sse {
        resp.extensions_mut().insert(PostStream {
            stream,
            position,
            after_opening,
        });
    }
    resp
}

async fn initialize(
    mcp: &RewindMcp,
    parts: &http::request::Parts,
    mut msgs: Vec<ClientJsonRpcMessage>,
    answer: Answer,
) -> Response {
    let principal = principal(mcp, parts);
    // `initialize` naming a live session re-initialises it: a new
    // incarnation (epoch) under the same id, so cursors of the old one are
    // answered with `reset`, never replayed.
    let reopen = match parts.headers.contains_key(SESSION_ID) {
        true => match presented_session(mcp, parts) {
            Ok(old) => {
                mcp.end_session(old.handle.id());
                Some((old.handle.id(), old.handle.epoch()))
            }
            Err(r) => return r,
        },
        false => None,
    };
    let opened = match reopen {
        Some((id, _)) => mcp.inner.engine.reopen(id, principal.as_deref()),
        None => mcp.inner.engine.open(principal.as_deref()),
    };
    let handle = match opened {
        Ok(h) => h,
        Err(e) => return session_refused(&e),
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
    let durable = mcp.inner.engine.recovery().is_some();
    let cluster = mcp.inner.options.cluster.as_ref();
    if let Some(c) = cluster {
        // Before the client learns the id: every node must know it then.
        if let Err(e) = c
            .write_record(&handle, reopen.map(|(_, epoch)| epoch))
            .await
        {
            tracing::warn!(
                error = %e,
                "cluster: session record not written; other nodes will not know this session"
            );
        }
    }
    let session = Arc::new(McpSession::new(
        handle.clone(),
        principal,
        tx,
        service_ct,
        durable,
        cluster.map(|c| c.replica(&handle)),
    ));
    if session.register(stream, stream, parts, &mut msgs).is_err() {
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
    let position = reader_position(&reader);
    mcp.start_session(
        session.clone(),
        SessionTransport::new(session.clone(), rx),
        None,
    );
    if session.forward(msgs).await.is_err() {
        handle.close();
        return refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            -32603,
            "session service failed",
        );
    }
    let access = Access {
        session: Some(session.tag()),
        stream: Some(stream),
        verdict: None,
    };
    let resp = respond(reader, answer, false, Some(handle.id())).await;
    with_access(with_post_stream(resp, stream, position, false), access)
}

async fn handle_get(State(mcp): State<RewindMcp>, req: Request) -> Response {
    let (parts, _body) = req.into_parts();
    match check_common(&mcp, &parts.headers) {
        Ok(Revision::Stateless) => return stateless_method_not_allowed(),
        Ok(Revision::Sessions(_)) => {}
        Err(r) => return r,
    }
    if !accepts(&parts.headers).sse {
        return refuse(
            StatusCode::NOT_ACCEPTABLE,
            -32600,
            "Accept must include text/event-stream",
        );
    }
    if let Some(c) = &mcp.inner.options.cluster {
        c.verify_if_suspect().await;
    }
    let principal = principal(&mcp, &parts);
    let session_id = header(&parts.headers, SESSION_ID).map(str::trim);
    let last_event_id = header(&parts.headers, LAST_EVENT_ID).map(str::trim);
    if let Some(id) = remote_get_session(&mcp, &parts, last_event_id) {
        match remote_get(&mcp, id, last_event_id, principal.as_deref()).await {
            Ok(resp) => return resp,
            // Its owner is gone: take it over, then serve it as a local
            // session (or, if another node took it first, from there).
            Err(record) => {
                if mcp.take_over(id, &record).await.is_none()
                    || remote_get_session(&mcp, &parts, last_event_id).is_some()
                {
                    return match remote_get(&mcp, id, last_event_id, principal.as_deref()).await {
                        Ok(resp) => resp,
                        Err(_) => owner_gone(),
                    };
                }
            }
        }
    }
    let started = Instant::now();
    let decision = mcp.inner.engine.resume(ResumeRequest {
        session_id,
        last_event_id,
        principal: principal.as_deref(),
    });
    mcp.inner
        .metrics
        .observe_resume(decision.verdict, decision.generation, started.elapsed());
    let mut access = Access {
        verdict: Some(verdict_label(decision.verdict)),
        ..Access::default()
    };
    let retry = mcp.inner.options.retry;
    let resp = match decision.action {
        ResumeAction::Reject(r) => {
            let status = StatusCode::from_u16(r.http_status()).unwrap_or(StatusCode::NOT_FOUND);
            refuse(status, -32000, r.reason)
        }
        ResumeAction::Replay(replay) => {
            // The engine replays only the presented session's own events;
            // the replay names the session it reads.
            let Some(session) = RewindMcp::mcp_session(replay.session()) else {
                return with_access(not_found(), access);
            };
            access.session = Some(session.tag());
            access.stream = Some(replay.stream());
            session.close_readers(replay.stream());
            let opening = vec![bytes_retry(retry)];
            get_stream(&mcp, replay, session, opening, true)
        }
        ResumeAction::Fresh {
            session: Some(handle),
            signal,
        } => {
            let Some(session) = RewindMcp::mcp_session(&handle) else {
                return with_access(not_found(), access);
            };
            access.session = Some(session.tag());
            // A `gap` on a call's stream goes on with that stream: the
            // events after the cursor that were released are lost (the
            // signal says so), the ones still held and the call's result
            // are not. Answering with the standalone stream instead would
            // leave the client on a stream its call never writes to, and
            // the result would never arrive.
            let gap_on_call = signal
                .as_ref()
                .filter(|s| s.kind == SignalKind::Gap)
                .and_then(|s| s.cursor.map(|c| (c, s.oldest)))
                .filter(|(c, _)| c.stream != STANDALONE);
            let (replay, resumed) = match gap_on_call {
                Some((cursor, oldest)) => {
                    // From the oldest event still held (or, with none
                    // held, from what comes next).
                    let replay = oldest
                        .and_then(|o| {
                            let after = EventId {
                                seq: o.seq.saturating_sub(1),
                                ..cursor
                            };
                            handle.subscribe_from(cursor.stream, after)
                        })
                        .unwrap_or_else(|| handle.subscribe(cursor.stream));
                    session.close_readers(replay.stream());
                    (replay, true)
                }
                None => (session.standalone_replay(), false),
            };
            access.stream = Some(replay.stream());
            let opening = signal
                .iter()
                .map(|s| signal_frame(s, retry))
                .chain([priming_frame(replay.position(), retry)])
                .collect();
            get_stream(&mcp, replay, session, opening, resumed)
        }
        // A fresh stream needs a live session; without one the client must
        // initialise again (404) or name a session at all (400).
        ResumeAction::Fresh { session: None, .. } => match session_id {
            Some(_) => not_found(),
            None => bad_request("missing Mcp-Session-Id"),
        },
    };
    with_access(resp, access)
}

/// The SSE answer to a GET: `opening` first, then `replay` read on.
fn get_stream(
    mcp: &RewindMcp,
    replay: Replay,
    session: Arc<McpSession>,
    opening: Vec<Bytes>,
    resumed: bool,
) -> Response {
    let reader = SseReader::new(
        replay,
        session,
        opening,
        stops(mcp, false),
        mcp.inner.metrics.clone(),
        resumed,
    );
    sse_response(reader, None)
}

fn bytes_retry(retry: std::time::Duration) -> Bytes {
    Bytes::from(format!("retry: {}\n\n", retry.as_millis()))
}

async fn handle_delete(State(mcp): State<RewindMcp>, req: Request) -> Response {
    let (parts, _body) = req.into_parts();
    match check_common(&mcp, &parts.headers) {
        Ok(Revision::Stateless) => return stateless_method_not_allowed(),
        Ok(Revision::Sessions(_)) => {}
        Err(r) => return r,
    }
    if let Some(c) = &mcp.inner.options.cluster {
        c.verify_if_suspect().await;
    }
    if let Some(id) = remote_session(&mcp, &parts) {
        return forward(&mcp, id, parts, Bytes::new()).await;
    }
    match presented_session(&mcp, &parts) {
        Ok(s) => {
            let access = Access {
                session: Some(s.tag()),
                ..Access::default()
            };
            if let Some(c) = &mcp.inner.options.cluster {
                // Gone on every node before the client hears it is.
                if let Err(e) = c.drop_record(s.handle.id(), s.handle.epoch()).await {
                    tracing::warn!(
                        error = %e,
                        "cluster: session record not deleted; other nodes see the session end \
                         once Redis answers"
                    );
                }
            }
            s.handle.close();
            with_access(StatusCode::NO_CONTENT.into_response(), access)
        }
        Err(r) => r,
    }
}

// ---------------------------------------------------------------------------
// Cluster mode: requests for sessions another node owns.

/// How long a forwarded request waits for its owner's reply. SSE answers
/// reply at once (the events come through Redis); a JSON answer replies
/// once the response is in.
const FORWARD_WAIT: Duration = Duration::from_secs(120);

/// In cluster mode, the session a request names when this node does not
/// hold it (another node may).
fn remote_session(mcp: &RewindMcp, parts: &http::request::Parts) -> Option<SessionId> {
    mcp.inner.options.cluster.as_ref()?;
    let id = SessionId::parse(header(&parts.headers, SESSION_ID)?.trim()).ok()?;
    match mcp.session(id) {
        Some(_) => None,
        None => Some(id),
    }
}

/// In cluster mode, the session of a `GET` served from Redis: one this
/// node does not hold, or one it took over whose cursor another node
/// minted (its event is in Redis, not in this node's engine).
fn remote_get_session(
    mcp: &RewindMcp,
    parts: &http::request::Parts,
    last_event_id: Option<&str>,
) -> Option<SessionId> {
    let remote = remote_session(mcp, parts);
    if remote.is_some() || mcp.inner.options.cluster.is_none() {
        return remote;
    }
    let id = SessionId::parse(header(&parts.headers, SESSION_ID)?.trim()).ok()?;
    let cursor = EventId::parse(last_event_id?).ok()?;
    (cursor.node != mcp.inner.engine.node()).then_some(id)
}

fn redis_unreachable() -> Response {
    refuse(
        StatusCode::SERVICE_UNAVAILABLE,
        -32000,
        "this session is served by another node, and the cluster's Redis is unreachable",
    )
}

fn owner_gone() -> Response {
    refuse(
        StatusCode::SERVICE_UNAVAILABLE,
        -32000,
        "the node that owned this session is gone",
    )
}

/// Forwards a `POST` or `DELETE` for session `id` to the node that owns
/// it, and answers with the owner's answer (an SSE answer served from the
/// session's Redis Stream).
async fn forward(
    mcp: &RewindMcp,
    id: SessionId,
    parts: http::request::Parts,
    body: Bytes,
) -> Response {
    let Some(cluster) = mcp.inner.options.cluster.as_ref() else {
        return not_found();
    };
    let (record, alive) = match cluster.record_and_owner(id).await {
        Ok(Some(r)) => r,
        Ok(None) => return not_found(),
        Err(_) => return redis_unreachable(),
    };
    let principal = principal(mcp, &parts);
    if record.principal != principal {
        return remote_refusal(
            mcp,
            rewind_engine::ResumeFacts::new(
                rewind_engine::SessionFact::WrongPrincipal,
                rewind_engine::CursorFact::Absent,
            ),
        );
    }
    if !alive {
        // Take it over and serve the request here (or, if another node was
        // first, forward it there).
        if mcp.take_over(id, &record).await.is_some() {
            let req = Request::from_parts(parts, Body::from(body));
            return if req.method() == Method::DELETE {
                Box::pin(handle_delete(State(mcp.clone()), req)).await
            } else {
                Box::pin(handle_post(State(mcp.clone()), req)).await
            };
        }
        return match cluster.record(id).await {
            Ok(Some(r)) if r.boot != record.boot => Box::pin(forward(mcp, id, parts, body)).await,
            Ok(_) => not_found(),
            Err(_) => redis_unreachable(),
        };
    }
    let access = Access {
        session: Some(record.tag),
        ..Access::default()
    };
    let req = Forwarded {
        method: parts.method.clone(),
        headers: parts.headers.clone(),
        body,
    };
    let reply = match cluster.forward(record.owner, req, FORWARD_WAIT).await {
        Ok(r) => r,
        Err(crate::cluster::ForwardError::Unreachable) => return redis_unreachable(),
        Err(crate::cluster::ForwardError::Timeout) => {
            return refuse(
                StatusCode::GATEWAY_TIMEOUT,
                -32000,
                "the node that owns this session did not answer",
            )
        }
    };
    with_access(forwarded_response(mcp, id, reply), access)
}

/// The answer to a forwarded request, as the owner gave it.
fn forwarded_response(mcp: &RewindMcp, id: SessionId, reply: ForwardReply) -> Response {
    let sse = reply
        .sse
        .as_ref()
        .and_then(|(stream, position, after_opening)| {
            Some((*stream, EventId::parse(position).ok()?, *after_opening))
        });
    let mut resp = match (sse, mcp.inner.options.cluster.as_ref()) {
        (Some((stream, position, after_opening)), Some(cluster)) => {
            let opening = vec![priming_frame(position, mcp.inner.options.retry)];
            if after_opening {
                Response::new(Body::from_stream(futures::stream::iter(
                    opening.into_iter().map(Ok::<_, std::convert::Infallible>),
                )))
            } else {
                let follow = Follow {
                    session: id,
                    epoch: position.epoch,
                    tag: position.tag,
                    node: position.node,
                    stream,
                    after: position.seq,
                    ends_on_close: true,
                    ends_when_caught_up: false,
                };
                Response::new(cluster.follow_body(
                    follow,
                    opening,
                    mcp.inner.options.keep_alive,
                    mcp.inner.options.shutdown.clone(),
                ))
            }
        }
        _ => Response::new(Body::from(reply.body)),
    };
    *resp.status_mut() = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::BAD_GATEWAY);
    for (n, v) in &reply.headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(n.as_bytes()),
            HeaderValue::from_str(v),
        ) {
            resp.headers_mut().append(n, v);
        }
    }
    resp
}

/// A refusal decided by the policy on facts established here.
fn remote_refusal(mcp: &RewindMcp, facts: rewind_engine::ResumeFacts) -> Response {
    let d = mcp.inner.engine.decide(facts);
    let status = match d.verdict {
        rewind_engine::Verdict::BadRequest => StatusCode::BAD_REQUEST,
        rewind_engine::Verdict::Conflict => StatusCode::CONFLICT,
        _ => StatusCode::NOT_FOUND,
    };
    let access = Access {
        verdict: Some(verdict_label(d.verdict)),
        ..Access::default()
    };
    with_access(refuse(status, -32000, d.reason()), access)
}

/// A `GET` for session `id`, which another node owns (or owned): decided
/// by the policy on the facts of its record and Redis Stream, and served
/// from that stream.
///
/// `Err(record)`: its owner is gone (the caller takes it over first).
async fn remote_get(
    mcp: &RewindMcp,
    id: SessionId,
    last_event_id: Option<&str>,
    principal: Option<&str>,
) -> Result<Response, crate::cluster::Record> {
    use rewind_engine::SessionFact;
    let Some(cluster) = mcp.inner.options.cluster.as_ref() else {
        return Ok(not_found());
    };
    let started = Instant::now();
    let c = match cluster.classify(id, principal, last_event_id).await {
        Ok(c) => c,
        Err(_) => return Ok(redis_unreachable()),
    };
    if c.facts.session_fact() == Some(SessionFact::OwnerLost) {
        if let Some(r) = c.record {
            return Err(r);
        }
    }
    Ok(remote_answer(mcp, cluster, id, c, started))
}

/// The answer to a `GET` classified against Redis.
fn remote_answer(
    mcp: &RewindMcp,
    cluster: &crate::cluster::Cluster,
    id: SessionId,
    c: crate::cluster::remote::Classified,
    started: Instant,
) -> Response {
    use rewind_engine::{SessionFact, Signal, Verdict};
    let d = mcp.inner.engine.decide(c.facts);
    mcp.inner
        .metrics
        .observe_resume(d.verdict, d.generation, started.elapsed());
    let mut access = Access {
        verdict: Some(verdict_label(d.verdict)),
        ..Access::default()
    };
    let retry = mcp.inner.options.retry;
    let record = match (&c.record, d.verdict) {
        (_, Verdict::BadRequest | Verdict::Conflict | Verdict::Gone) | (None, _) => {
            let status = match d.verdict {
                Verdict::BadRequest => StatusCode::BAD_REQUEST,
                Verdict::Conflict => StatusCode::CONFLICT,
                _ => StatusCode::NOT_FOUND,
            };
            return with_access(refuse(status, -32000, d.reason()), access);
        }
        (Some(r), _) => r,
    };
    access.session = Some(record.tag);
    let owner_lost = d.facts.session_fact() == Some(SessionFact::OwnerLost);
    let id_at = |stream: u32, seq: u64, node: u16| EventId {
        tag: record.tag,
        node,
        epoch: record.epoch,
        stream,
        seq,
    };
    let (follow_stream, after, opening) = match (d.verdict, c.cursor) {
        (Verdict::Resume, Some(cursor)) => (cursor.stream, cursor.seq, vec![bytes_retry(retry)]),
        (Verdict::FreshReset | Verdict::FreshGap | Verdict::Fresh, cursor) => {
            let kind = match d.verdict {
                Verdict::FreshReset => Some(SignalKind::Reset),
                Verdict::FreshGap => Some(SignalKind::Gap),
                _ => None,
            };
            let (hw, hw_node) = c.high_water;
            let oldest = (c.oldest <= hw).then_some(c.oldest);
            let signal = kind.map(|kind| Signal {
                kind,
                reason: d.reason(),
                cursor,
                oldest: oldest.map(|o| id_at(cursor.map_or(0, |c| c.stream), o, record.owner)),
            });
            // A `gap` on a call's stream goes on with that stream (as on
            // the owner); anything else starts the standalone stream now.
            let (stream, after, node) = match (kind, cursor) {
                (Some(SignalKind::Gap), Some(cur)) if cur.stream != STANDALONE => {
                    (cur.stream, oldest.map_or(hw, |o| o - 1), record.owner)
                }
                _ => (STANDALONE, hw, hw_node),
            };
            let opening = signal
                .iter()
                .map(|s| signal_frame(s, retry))
                .chain([priming_frame(id_at(stream, after, node), retry)])
                .collect();
            (stream, after, opening)
        }
        _ => return with_access(not_found(), access),
    };
    access.stream = Some(follow_stream);
    let follow = Follow {
        session: id,
        epoch: record.epoch,
        tag: record.tag,
        node: record.owner,
        stream: follow_stream,
        after,
        ends_on_close: follow_stream != STANDALONE,
        ends_when_caught_up: owner_lost,
    };
    let body = cluster.follow_body(
        follow,
        opening,
        mcp.inner.options.keep_alive,
        mcp.inner.options.shutdown.clone(),
    );
    let mut resp = Response::new(body);
    resp.headers_mut().insert(
        CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    resp.headers_mut()
        .insert(CACHE_CONTROL, http::HeaderValue::from_static("no-cache"));
    with_access(resp, access)
}

/// Runs a request another node forwarded to this one (the session's
/// owner), as if it had arrived here, and says what to answer.
pub(super) async fn serve_forwarded(mcp: RewindMcp, f: Forwarded) -> ForwardReply {
    let mut req = Request::new(Body::from(f.body));
    *req.method_mut() = f.method.clone();
    *req.headers_mut() = f.headers;
    if let Ok(uri) = mcp.inner.options.path.parse() {
        *req.uri_mut() = uri;
    }
    let resp = match f.method {
        Method::POST => handle_post(State(mcp.clone()), req).await,
        Method::DELETE => handle_delete(State(mcp.clone()), req).await,
        _ => StatusCode::METHOD_NOT_ALLOWED.into_response(),
    };
    let status = resp.status();
    mcp.inner.metrics.observe_response(&f.method, status);
    let headers = [
        CONTENT_TYPE,
        CACHE_CONTROL,
        http::header::RETRY_AFTER,
        ALLOW,
    ]
    .iter()
    .map(HeaderName::as_str)
    .chain([SESSION_ID])
    .filter_map(|n| {
        let v = resp.headers().get(n)?.to_str().ok()?;
        Some((n.to_owned(), v.to_owned()))
    })
    .collect();
    let mut reply = ForwardReply {
        status: status.as_u16(),
        headers,
        ..ForwardReply::default()
    };
    if let Some(ps) = resp.extensions().get::<PostStream>() {
        // The events reach the forwarding node through Redis; this
        // response (and its reader) is dropped unread.
        reply.sse = Some((ps.stream, ps.position.to_string(), ps.after_opening));
        return reply;
    }
    let limit = mcp.inner.engine.config().max_event_bytes.saturating_mul(2);
    match axum::body::to_bytes(resp.into_body(), limit).await {
        Ok(b) => reply.body = b.to_vec(),
        Err(_) => {
            reply.status = StatusCode::BAD_GATEWAY.as_u16();
            reply.headers.clear();
        }
    }
    reply
}
