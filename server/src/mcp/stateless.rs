//! Stateless MCP (protocol revision 2026-07-28).
//!
//! That revision removes protocol sessions: there is no `initialize`
//! handshake (a client learns the server with `server/discover`), no
//! `Mcp-Session-Id`, no standalone `GET` stream and no SSE resumption
//! (`Last-Event-ID` and event ids are gone); every request carries its
//! protocol version, client capabilities and client info in `_meta`, and a
//! server does not send requests of its own to the client (it answers with
//! an input-required result instead). A request is one POST answered with
//! one JSON body or with an SSE stream scoped to that request.
//!
//! A POST is served here when its `MCP-Protocol-Version` header is
//! 2026-07-28, or when its one request is `server/discover` or names
//! 2026-07-28 or later in its `_meta` (an `initialize` always starts a
//! session, whatever version it names). A fresh handler from the
//! endpoint's factory answers it through rmcp's own per-request path
//! (`serve_directly` over a one-shot transport), which also validates the
//! request's `_meta`. `GET` and `DELETE` at that version get 405; inbound
//! `Mcp-Session-Id` and `Last-Event-ID` headers are ignored.
//!
//! **What Rewind adds here: nothing to resume.** The answer is not stored
//! in the engine, its SSE events carry no id, and a cut connection cancels
//! the request; the client simply sends it again. What the endpoint still
//! does for these requests is everything that is not about streams: the
//! `Host`/`Origin` checks, CORS, the body and header limits, the request's
//! `http::request::Parts` in the handler's extensions (so an auth layer's
//! principal reaches tools), the access log and the HTTP metrics.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::future::BoxFuture;
use http::header::{ACCEPT, CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderValue, StatusCode};
use rmcp::model::{
    ClientCapabilities, ClientJsonRpcMessage, ClientRequest, GetExtensions, GetMeta,
    Implementation, InitializeRequestParams, JsonRpcRequest, ProtocolVersion, ServerJsonRpcMessage,
};
use rmcp::service::{serve_directly_with_ct, RoleServer};
use rmcp::transport::OneshotTransport;
use rmcp::ServerHandler;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{RewindMcp, ServeStateless, STATELESS_PROTOCOL_VERSIONS};

/// The first revision served statelessly.
const STATELESS_FROM: &str = STATELESS_PROTOCOL_VERSIONS[0];

/// Builds the endpoint's stateless path from its handler factory: each call
/// answers one request with a fresh handler and returns what it sends.
pub(super) fn starter<H, F>(factory: Arc<F>) -> Box<ServeStateless>
where
    H: ServerHandler,
    F: Fn() -> H + Send + Sync + 'static,
{
    Box::new(
        move |request: JsonRpcRequest<ClientRequest>,
              peer: InitializeRequestParams,
              ct: CancellationToken| {
            let (transport, outbound) =
                OneshotTransport::<RoleServer>::new(ClientJsonRpcMessage::Request(request));
            let running = serve_directly_with_ct(factory(), transport, Some(peer), ct);
            let wait: BoxFuture<'static, ()> = Box::pin(async move {
                let _ = running.waiting().await;
            });
            tokio::spawn(wait);
            outbound
        },
    )
}

/// Whether a POST of `msgs` with this `MCP-Protocol-Version` header is
/// stateless MCP.
pub(super) fn applies(header: Option<&str>, msgs: &[ClientJsonRpcMessage]) -> bool {
    if header.is_some_and(|v| v >= STATELESS_FROM) {
        // An initialize still starts a session (rmcp does the same).
        return !msgs.iter().any(is_initialize);
    }
    match msgs {
        [ClientJsonRpcMessage::Request(r)] => match &r.request {
            ClientRequest::DiscoverRequest(_) => true,
            ClientRequest::InitializeRequest(_) => false,
            other => other
                .get_meta()
                .protocol_version()
                .is_some_and(|v| v.as_str() >= STATELESS_FROM),
        },
        _ => false,
    }
}

fn is_initialize(m: &ClientJsonRpcMessage) -> bool {
    matches!(m, ClientJsonRpcMessage::Request(r) if matches!(r.request, ClientRequest::InitializeRequest(_)))
}

/// A JSON-RPC error answer with no id.
fn refuse(status: StatusCode, code: i64, message: &str) -> Response {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": { "code": code, "message": message },
    });
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// Answers one stateless POST (already past the endpoint's common checks).
pub(super) async fn post(
    mcp: &RewindMcp,
    parts: http::request::Parts,
    header: Option<&str>,
    mut msgs: Vec<ClientJsonRpcMessage>,
) -> Response {
    if msgs.len() != 1 {
        return refuse(
            StatusCode::BAD_REQUEST,
            -32600,
            "JSON-RPC batches are not part of MCP 2025-06-18 and later",
        );
    }
    let Some(msg) = msgs.pop() else {
        return refuse(StatusCode::BAD_REQUEST, -32600, "empty body");
    };
    let mut request = match msg {
        ClientJsonRpcMessage::Request(r) => r,
        // Nothing to deliver a notification to: there is no session.
        ClientJsonRpcMessage::Notification(_) => {
            return Response::builder()
                .status(StatusCode::ACCEPTED)
                .body(Body::empty())
                .unwrap_or_default()
        }
        ClientJsonRpcMessage::Response(_) | ClientJsonRpcMessage::Error(_) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                -32600,
                "a stateless server sends no requests, so it takes no responses",
            )
        }
    };
    let meta = request.request.get_meta();
    let missing = meta.missing_required_keys(&ProtocolVersion::V_2026_07_28);
    if !missing.is_empty() && !matches!(request.request, ClientRequest::DiscoverRequest(_)) {
        return refuse(
            StatusCode::BAD_REQUEST,
            -32602,
            &format!(
                "MCP 2026-07-28 requests carry their context in _meta; missing: {}",
                missing.join(", ")
            ),
        );
    }
    let version = meta
        .protocol_version()
        .or_else(|| header.and_then(|h| serde_json::from_value(h.into()).ok()))
        .unwrap_or(ProtocolVersion::V_2026_07_28);
    if let (Some(h), Some(m)) = (header, meta.protocol_version()) {
        if h != m.as_str() {
            return refuse(
                StatusCode::BAD_REQUEST,
                -32600,
                &format!(
                    "MCP-Protocol-Version header ({h}) does not match the request's _meta protocolVersion ({m})"
                ),
            );
        }
    }
    let peer = InitializeRequestParams::new(
        meta.client_capabilities()
            .unwrap_or_else(ClientCapabilities::default),
        meta.client_info().unwrap_or_else(Implementation::default),
    )
    .with_protocol_version(version);
    let accepts = Accepts::of(&parts.headers);
    request.request.extensions_mut().insert(parts);

    let ct = mcp.inner.options.shutdown.child_token();
    let mut outbound = (mcp.inner.stateless)(request, peer, ct.clone());
    // A client that goes away cancels its request: nobody could resume it.
    let guard = ct.clone().drop_guard();
    let first = tokio::select! {
        m = outbound.recv() => m,
        _ = mcp.inner.options.shutdown.cancelled() => None,
    };
    let Some(first) = first else {
        return refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            -32603,
            "the handler ended without answering",
        );
    };
    let terminal = matches!(
        first,
        ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_)
    );
    if terminal && (accepts.json || !accepts.sse) {
        drop(guard);
        return json(&first);
    }
    if !accepts.sse {
        // The handler sends notifications first and the client takes no
        // SSE: give it the answer alone, as JSON.
        let mut last = first;
        while !matches!(
            last,
            ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_)
        ) {
            match outbound.recv().await {
                Some(m) => last = m,
                None => {
                    return refuse(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        -32603,
                        "the handler ended without answering",
                    )
                }
            }
        }
        drop(guard);
        return json(&last);
    }
    sse(first, outbound, guard, mcp.inner.options.keep_alive)
}

/// What the client takes.
struct Accepts {
    json: bool,
    sse: bool,
}

impl Accepts {
    fn of(headers: &http::HeaderMap) -> Accepts {
        let Some(accept) = headers.get(ACCEPT).and_then(|v| v.to_str().ok()) else {
            return Accepts {
                json: true,
                sse: true,
            };
        };
        let mut a = Accepts {
            json: false,
            sse: false,
        };
        for t in accept.split(',') {
            let t = t.split(';').next().unwrap_or("").trim();
            let any = t == "*/*";
            a.json |= any || t.eq_ignore_ascii_case("application/json") || t == "application/*";
            a.sse |= any || t.eq_ignore_ascii_case("text/event-stream") || t == "text/*";
        }
        a
    }
}

/// The answer as one JSON body; an unsupported protocol version is 400
/// (the revision asks for that), anything else 200.
fn json(msg: &ServerJsonRpcMessage) -> Response {
    let status = match msg {
        ServerJsonRpcMessage::Error(e) if e.error.code.0 == -32022 => StatusCode::BAD_REQUEST,
        _ => StatusCode::OK,
    };
    let mut body = Vec::new();
    match super::encode::encode(msg, &mut body) {
        Ok(()) => {
            let mut r = Response::new(Body::from(body));
            *r.status_mut() = status;
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r
        }
        Err(_) => refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            -32603,
            "cannot serialise the answer",
        ),
    }
}

/// One message as an SSE event without an id: there is nothing to resume.
fn frame(msg: &ServerJsonRpcMessage) -> Option<Bytes> {
    let mut out = b"data: ".to_vec();
    super::encode::encode(msg, &mut out).ok()?;
    out.extend_from_slice(b"\n\n");
    Some(Bytes::from(out))
}

/// The answer as an SSE stream ending after the response; dropping it (the
/// client went away) cancels the request through `guard`.
fn sse(
    first: ServerJsonRpcMessage,
    outbound: mpsc::Receiver<ServerJsonRpcMessage>,
    guard: tokio_util::sync::DropGuard,
    keep_alive: Option<Duration>,
) -> Response {
    struct State {
        first: Option<ServerJsonRpcMessage>,
        outbound: mpsc::Receiver<ServerJsonRpcMessage>,
        done: bool,
        _guard: tokio_util::sync::DropGuard,
        keep_alive: Option<Duration>,
    }
    let state = State {
        first: Some(first),
        outbound,
        done: false,
        _guard: guard,
        keep_alive,
    };
    let body = futures::stream::unfold(state, |mut s| async move {
        if s.done {
            return None;
        }
        let msg = match s.first.take() {
            Some(m) => m,
            None => {
                let tick = async {
                    match s.keep_alive {
                        Some(d) => tokio::time::sleep(d).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    m = s.outbound.recv() => m?,
                    _ = tick => {
                        return Some((Ok::<_, Infallible>(Bytes::from_static(b": keep-alive\n\n")), s));
                    }
                }
            }
        };
        s.done = matches!(
            msg,
            ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_)
        );
        let bytes = frame(&msg).unwrap_or_default();
        Some((Ok(bytes), s))
    });
    let mut r = Response::new(Body::from_stream(body));
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}
