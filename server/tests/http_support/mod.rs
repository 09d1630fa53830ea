//! In-process HTTP harness for the MCP endpoint: a server on 127.0.0.1:0
//! and a small SSE client with a timeout on every await.
#![allow(
    dead_code,
    missing_debug_implementations,
    reason = "each test binary uses a different part of the harness"
)]

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use rewind_engine::{Config, Engine};
use rewind_server::mcp::{McpOptions, RewindMcp};
use rewind_server::metrics::ServerMetrics;
use rewind_server::tools::ReferenceServer;
use serde_json::{json, Value};

pub(crate) const STEP: Duration = Duration::from_secs(10);

pub(crate) struct TestServer {
    pub(crate) url: String,
    pub(crate) mcp: RewindMcp,
    pub(crate) client: reqwest::Client,
    pub(crate) shutdown: tokio_util::sync::CancellationToken,
}

pub(crate) async fn start(config: Config, options: McpOptions) -> TestServer {
    let engine = Engine::new(config).expect("engine config");
    let shutdown = options.shutdown.clone();
    let mcp = RewindMcp::new(
        engine,
        Arc::new(ServerMetrics::new()),
        options,
        ReferenceServer::new,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = mcp.router();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
            .unwrap();
    });
    TestServer {
        url: format!("http://{addr}/mcp"),
        mcp,
        client: reqwest::Client::new(),
        shutdown,
    }
}

pub(crate) async fn start_default() -> TestServer {
    start(Config::default(), McpOptions::default()).await
}

/// One SSE event (or a field-only block such as `retry:`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Event {
    pub(crate) id: Option<String>,
    pub(crate) event: Option<String>,
    pub(crate) data: Option<String>,
    pub(crate) retry: Option<u64>,
}

impl Event {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(self.data.as_deref().unwrap_or("null")).unwrap_or(Value::Null)
    }
    pub(crate) fn is_priming(&self) -> bool {
        self.id.is_some() && self.data.as_deref() == Some("")
    }
    /// A JSON-RPC response (or error) with this id.
    pub(crate) fn is_response_to(&self, id: i64) -> bool {
        let v = self.json();
        v.get("id") == Some(&json!(id)) && (v.get("result").is_some() || v.get("error").is_some())
    }
    pub(crate) fn progress(&self) -> Option<f64> {
        let v = self.json();
        (v.get("method")? == "notifications/progress").then(|| v["params"]["progress"].as_f64())?
    }
}

/// An SSE response body read event by event.
pub(crate) struct SseBody {
    stream: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buf: String,
    /// Everything received so far, verbatim.
    pub(crate) raw: String,
    pub(crate) ended: bool,
}

impl SseBody {
    pub(crate) fn new(resp: reqwest::Response) -> SseBody {
        SseBody {
            stream: resp.bytes_stream().boxed(),
            buf: String::new(),
            raw: String::new(),
            ended: false,
        }
    }

    /// The next block with fields; `None` once the body ended. Panics after
    /// [`STEP`] without one.
    pub(crate) async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut ev = Event::default();
                let mut fields = false;
                for line in block.lines() {
                    if line.is_empty() || line.starts_with(':') {
                        continue;
                    }
                    let (name, value) = line.split_once(':').unwrap_or((line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value);
                    fields = true;
                    match name {
                        "id" => ev.id = Some(value.to_owned()),
                        "event" => ev.event = Some(value.to_owned()),
                        "retry" => ev.retry = value.parse().ok(),
                        "data" => {
                            let d = ev.data.get_or_insert_with(String::new);
                            if !d.is_empty() {
                                d.push('\n');
                            }
                            d.push_str(value);
                        }
                        _ => {}
                    }
                }
                if fields {
                    return Some(ev);
                }
                continue;
            }
            if self.ended {
                return None;
            }
            match tokio::time::timeout(STEP, self.stream.next()).await {
                Err(_) => panic!("no SSE event within {STEP:?}; got so far: {}", self.raw),
                Ok(None) | Ok(Some(Err(_))) => self.ended = true,
                Ok(Some(Ok(chunk))) => {
                    let s = String::from_utf8_lossy(&chunk).replace("\r\n", "\n");
                    self.raw.push_str(&s);
                    self.buf.push_str(&s);
                }
            }
        }
    }

    /// Events until the body ends.
    pub(crate) async fn read_to_end(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        while let Some(e) = self.next().await {
            out.push(e);
            assert!(out.len() < 100_000, "runaway stream");
        }
        out
    }

    /// Events up to and including the first that satisfies `pred`.
    pub(crate) async fn until(&mut self, pred: impl Fn(&Event) -> bool) -> Vec<Event> {
        let mut out = Vec::new();
        loop {
            let e = self
                .next()
                .await
                .expect("stream ended before the expected event");
            let stop = pred(&e);
            out.push(e);
            if stop {
                return out;
            }
        }
    }
}

impl TestServer {
    pub(crate) fn post(&self, session: Option<&str>, body: Value) -> reqwest::RequestBuilder {
        let mut r = self
            .client
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .json(&body);
        if let Some(s) = session {
            r = r.header("mcp-session-id", s);
        }
        r
    }

    pub(crate) fn get(
        &self,
        session: Option<&str>,
        last_event_id: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let mut r = self
            .client
            .get(&self.url)
            .header("accept", "text/event-stream")
            .header("mcp-protocol-version", "2025-11-25");
        if let Some(s) = session {
            r = r.header("mcp-session-id", s);
        }
        if let Some(l) = last_event_id {
            r = r.header("last-event-id", l);
        }
        r
    }

    pub(crate) async fn send(&self, r: reqwest::RequestBuilder) -> reqwest::Response {
        tokio::time::timeout(STEP, r.send())
            .await
            .expect("response within the step timeout")
            .expect("HTTP request")
    }

    /// `initialize` + `notifications/initialized`; the session id.
    pub(crate) async fn initialize(&self) -> String {
        let resp = self.send(self.post(None, initialize_body())).await;
        assert_eq!(resp.status(), 200);
        let sid = resp
            .headers()
            .get("mcp-session-id")
            .expect("Mcp-Session-Id")
            .to_str()
            .unwrap()
            .to_owned();
        let mut body = SseBody::new(resp);
        let events = body.read_to_end().await;
        assert!(events[0].is_priming(), "{events:?}");
        assert!(events.iter().any(|e| e.is_response_to(0)), "{events:?}");
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let resp = self.send(self.post(Some(&sid), note)).await;
        assert_eq!(resp.status(), 202);
        sid
    }

    /// Calls `progress_stream` and returns the open SSE body.
    pub(crate) async fn progress_stream(
        &self,
        sid: &str,
        id: i64,
        count: u32,
        interval_ms: u64,
        label: &str,
    ) -> SseBody {
        self.progress_stream_via(sid, id, count, interval_ms, label, "sink")
            .await
    }

    /// [`progress_stream`](Self::progress_stream) sending its notifications
    /// `via` the tool's `"sink"` (the default) or rmcp's `"peer"`.
    pub(crate) async fn progress_stream_via(
        &self,
        sid: &str,
        id: i64,
        count: u32,
        interval_ms: u64,
        label: &str,
        via: &str,
    ) -> SseBody {
        let body = json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {
                "name": "progress_stream",
                "arguments": {"count": count, "interval_ms": interval_ms, "label": label, "via": via},
                "_meta": {"progressToken": format!("tok-{id}")}
            }
        });
        let resp = self.send(self.post(Some(sid), body)).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers().get("content-type").unwrap(),
            "text/event-stream"
        );
        SseBody::new(resp)
    }
}

pub(crate) fn initialize_body() -> Value {
    json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "rewind-test", "version": "1"}
        }
    })
}

/// A marker unique to one session, put into its tool output.
pub(crate) fn marker(name: &str) -> String {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).unwrap();
    format!("MARK-{name}-{}", u64::from_le_bytes(b))
}
