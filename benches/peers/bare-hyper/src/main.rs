//! `bare-hyper ADDR:PORT`: the ceiling of the comparison, not a competitor.
//!
//! The least a correct server can do per progress event: serialize the
//! notification with serde_json, frame it as one SSE event with an id, and
//! hand it to hyper as its own body chunk. No storage, so no resumption
//! (`GET` answers 405); just enough MCP for `rewind load`: `initialize`
//! (with an `Mcp-Session-Id`), notifications (202), `tools/call
//! progress_stream` (an SSE response), other requests (an empty result),
//! `DELETE` (204).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use serde_json::Value;

type Body = BoxBody<Bytes, Infallible>;

const LISTEN_BACKLOG: u32 = 4096;
const MAX_COUNT: u32 = 100_000;

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

#[derive(Deserialize)]
struct ClientMessage {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    params: Option<Value>,
}

#[derive(Serialize)]
struct Notification<'a> {
    jsonrpc: &'static str,
    method: &'static str,
    params: ProgressParams<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ProgressParams<'a> {
    progress_token: &'a Value,
    progress: u32,
    total: u32,
    message: String,
}

fn full(status: StatusCode, content_type: &str, body: String) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = status;
    if !content_type.is_empty() {
        r.headers_mut()
            .insert("content-type", content_type.parse().expect("static header"));
    }
    r
}

fn result(id: &Value, result: Value) -> String {
    serde_json::json!({ "jsonrpc": "2.0", "id": id, "result": result }).to_string()
}

fn sse_event(id: u64, json: &str) -> Bytes {
    Bytes::from(format!("id: {id}\ndata: {json}\n\n"))
}

/// The SSE body of one `progress_stream` call.
fn progress_stream(id: Value, token: Value, count: u32, interval: Duration, label: String) -> Body {
    let state = (1u32, id, token, label);
    let stream = futures::stream::unfold(Some(state), move |state| async move {
        let (i, id, token, label) = state?;
        if i > count {
            let text = format!("{label} progress_stream done: {count} notifications");
            let res = result(
                &id,
                serde_json::json!({ "content": [{ "type": "text", "text": text }] }),
            );
            return Some((Ok(Frame::data(sse_event(u64::from(i), &res))), None));
        }
        if i > 1 && !interval.is_zero() {
            tokio::time::sleep(interval).await;
        }
        let n = Notification {
            jsonrpc: "2.0",
            method: "notifications/progress",
            params: ProgressParams {
                progress_token: &token,
                progress: i,
                total: count,
                message: format!("{label} step {i}/{count}"),
            },
        };
        let json = serde_json::to_string(&n).unwrap_or_default();
        let frame = Frame::data(sse_event(u64::from(i), &json));
        Some((Ok(frame), Some((i + 1, id, token, label))))
    });
    StreamBody::new(stream).boxed()
}

async fn handle(req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    Ok(match *req.method() {
        Method::POST => post(req).await,
        Method::DELETE => full(StatusCode::NO_CONTENT, "", String::new()),
        _ => full(StatusCode::METHOD_NOT_ALLOWED, "", String::new()),
    })
}

async fn post(req: Request<Incoming>) -> Response<Body> {
    let Ok(body) = req.into_body().collect().await else {
        return full(StatusCode::BAD_REQUEST, "", String::new());
    };
    let Ok(msg) = serde_json::from_slice::<ClientMessage>(&body.to_bytes()) else {
        return full(StatusCode::BAD_REQUEST, "", "parse error".into());
    };
    let (Some(id), Some(method)) = (msg.id, msg.method) else {
        return full(StatusCode::ACCEPTED, "", String::new());
    };
    let params = msg.params.unwrap_or(Value::Null);
    match method.as_str() {
        "initialize" => {
            let version = params
                .get("protocolVersion")
                .cloned()
                .unwrap_or_else(|| "2025-06-18".into());
            let body = result(
                &id,
                serde_json::json!({
                    "protocolVersion": version,
                    "capabilities": { "tools": {} },
                    "serverInfo": { "name": "bare-hyper", "version": env!("CARGO_PKG_VERSION") },
                }),
            );
            let mut r = full(StatusCode::OK, "application/json", body);
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let sid = format!(
                "{nanos:x}{:x}",
                NEXT_SESSION.fetch_add(1, Ordering::Relaxed)
            );
            r.headers_mut()
                .insert("mcp-session-id", sid.parse().expect("hex header"));
            r
        }
        "tools/call" if params.get("name").and_then(Value::as_str) == Some("progress_stream") => {
            let args = params.get("arguments").cloned().unwrap_or(Value::Null);
            let count = args.get("count").and_then(Value::as_u64).unwrap_or(0);
            if count == 0 || count > u64::from(MAX_COUNT) {
                let err = serde_json::json!({ "jsonrpc": "2.0", "id": id,
                    "error": { "code": -32602, "message": "count must be between 1 and 100000" } });
                return full(StatusCode::OK, "application/json", err.to_string());
            }
            let interval =
                Duration::from_millis(args.get("interval_ms").and_then(Value::as_u64).unwrap_or(0));
            let label = args
                .get("label")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            let token = params
                .get("_meta")
                .and_then(|m| m.get("progressToken"))
                .cloned()
                .unwrap_or(Value::Null);
            let mut r = Response::new(progress_stream(id, token, count as u32, interval, label));
            r.headers_mut().insert(
                "content-type",
                "text/event-stream".parse().expect("static header"),
            );
            r.headers_mut()
                .insert("cache-control", "no-cache".parse().expect("static header"));
            r
        }
        _ => full(
            StatusCode::OK,
            "application/json",
            result(&id, serde_json::json!({})),
        ),
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let arg = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8091".to_owned());
    let addr: SocketAddr = arg.parse().unwrap_or_else(|e| {
        eprintln!("usage: bare-hyper ADDR:PORT ({arg:?}: {e})");
        std::process::exit(2)
    });
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    let listener = socket.listen(LISTEN_BACKLOG)?;
    println!(
        "bare-hyper: MCP endpoint http://{}/mcp",
        listener.local_addr()?
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        let (tcp, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(_) => continue,
            },
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = term.recv() => return Ok(()),
        };
        let _ = tcp.set_nodelay(true);
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), hyper::service::service_fn(handle))
                .await;
        });
    }
}
