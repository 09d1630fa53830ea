//! A policy swapped through the admin surface changes the verdicts of the
//! next resumes without a restart and without dropping open streams — over
//! real loopback HTTP, with the MCP endpoint and the admin surface of one
//! process, as `rewind serve` wires them.

use std::collections::HashMap;
use std::future::IntoFuture as _;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use rewind_engine::policy::wasm::{plugins, PolicyHost};
use rewind_engine::{Config, Engine};
use rewind_server::admin::{self, AdminState};
use rewind_server::mcp::{self, HostPolicy, McpOptions};
use rewind_server::metrics::ServerMetrics;
use rewind_server::tools::ReferenceServer;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "swap-test-token-0123456789";
const PROTOCOL: &str = "2025-06-18";

struct Servers {
    mcp: String,
    admin: String,
    client: reqwest::Client,
    stop: CancellationToken,
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn start() -> Servers {
    let host = Arc::new(PolicyHost::with_default_policy().unwrap());
    let engine = Engine::with_policy(Config::default(), Arc::clone(&host) as _).unwrap();
    let metrics = Arc::new(ServerMetrics::new());
    let stop = CancellationToken::new();

    let mcp_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mcp_addr = mcp_listener.local_addr().unwrap();
    let mut options = McpOptions::default();
    options.hosts = HostPolicy::for_listen_addr(mcp_addr);
    options.shutdown = stop.clone();
    let mcp_app = mcp::router(
        engine.clone(),
        Arc::clone(&metrics),
        options,
        ReferenceServer::new,
    );
    tokio::spawn(
        axum::serve(mcp_listener, mcp_app)
            .with_graceful_shutdown(stop.clone().cancelled_owned())
            .into_future(),
    );

    let admin_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_addr = admin_listener.local_addr().unwrap();
    let admin_app = admin::router(AdminState::new(engine, host, metrics, TOKEN));
    tokio::spawn(
        axum::serve(admin_listener, admin_app)
            .with_graceful_shutdown(stop.clone().cancelled_owned())
            .into_future(),
    );

    Servers {
        mcp: format!("http://{mcp_addr}/mcp"),
        admin: format!("http://{admin_addr}"),
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap(),
        stop,
    }
}

/// One SSE event: its id, name and data.
#[derive(Debug, Clone, Default)]
struct SseEvent {
    id: Option<String>,
    event: Option<String>,
    data: String,
}

/// Reads SSE events off a streaming response body.
struct SseReader {
    body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buf: String,
}

impl SseReader {
    fn new(response: reqwest::Response) -> SseReader {
        SseReader {
            body: response.bytes_stream().boxed(),
            buf: String::new(),
        }
    }

    /// The next event, `None` at the end of the stream.
    async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut event = SseEvent::default();
                let mut any = false;
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        event.id = Some(v.trim_start().to_owned());
                        any = true;
                    } else if let Some(v) = line.strip_prefix("event:") {
                        event.event = Some(v.trim_start().to_owned());
                        any = true;
                    } else if let Some(v) = line.strip_prefix("data:") {
                        if !event.data.is_empty() {
                            event.data.push('\n');
                        }
                        event.data.push_str(v.trim_start());
                        any = true;
                    }
                }
                if any {
                    return Some(event);
                }
                continue; // a comment (keep-alive) or a retry-only block
            }
            match tokio::time::timeout(Duration::from_secs(30), self.body.next()).await {
                Ok(Some(Ok(chunk))) => self.buf.push_str(&String::from_utf8_lossy(&chunk)),
                Ok(_) => return None,
                Err(_) => panic!("no SSE event within 30 s"),
            }
        }
    }

    /// The next event that carries a JSON-RPC message.
    async fn next_message(&mut self) -> Option<(SseEvent, Value)> {
        while let Some(event) = self.next().await {
            if event.data.is_empty() {
                continue; // priming event
            }
            let value: Value = serde_json::from_str(&event.data).unwrap();
            return Some((event, value));
        }
        None
    }
}

impl Servers {
    fn post(&self, session: Option<&str>, body: Value) -> reqwest::RequestBuilder {
        let mut request = self
            .client
            .post(&self.mcp)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .json(&body);
        if let Some(s) = session {
            request = request
                .header("mcp-session-id", s)
                .header("mcp-protocol-version", PROTOCOL);
        }
        request
    }

    /// Opens an MCP session and returns its id.
    async fn initialize(&self) -> String {
        let response = self
            .post(
                None,
                json!({
                    "jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {
                        "protocolVersion": PROTOCOL,
                        "capabilities": {},
                        "clientInfo": {"name": "swap-test", "version": "1"}
                    }
                }),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let session = response.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_owned();
        let mut sse = SseReader::new(response);
        let (_, init) = sse.next_message().await.expect("initialize result");
        assert_eq!(init["id"], 1, "{init}");
        let response = self
            .post(
                Some(&session),
                json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 202);
        session
    }

    /// `GET` with a session and a cursor: a resume.
    async fn resume(&self, session: &str, cursor: &str) -> reqwest::Response {
        self.client
            .get(&self.mcp)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", session)
            .header("mcp-protocol-version", PROTOCOL)
            .header("last-event-id", cursor)
            .send()
            .await
            .unwrap()
    }

    async fn swap(&self, wasm: &'static [u8], name: &str) -> reqwest::Response {
        self.client
            .post(format!("{}/policy?name={name}", self.admin))
            .bearer_auth(TOKEN)
            .body(wasm)
            .send()
            .await
            .unwrap()
    }

    async fn metrics(&self) -> HashMap<String, f64> {
        let text = self
            .client
            .get(format!("{}/metrics", self.admin))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' '))
            .map(|(k, v)| (k.to_owned(), v.parse().unwrap_or(f64::NAN)))
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_changes_the_next_verdicts_and_keeps_open_streams() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let s = start().await;
        let alice = s.initialize().await;
        let bob = s.initialize().await;

        // Alice's tool call streams progress over its POST response: the
        // stream that must survive the swap.
        let count: u32 = 12;
        let response = s
            .post(
                Some(&alice),
                json!({
                    "jsonrpc": "2.0", "id": 7, "method": "tools/call",
                    "params": {
                        "name": "progress_stream",
                        "arguments": {"count": count, "interval_ms": 150},
                        "_meta": {"progressToken": "p-7"}
                    }
                }),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let mut alice_stream = SseReader::new(response);
        let (first, progress) = alice_stream.next_message().await.unwrap();
        assert_eq!(progress["method"], "notifications/progress", "{progress}");
        assert_eq!(progress["params"]["progress"].as_f64(), Some(1.0));
        let alice_cursor = first.id.expect("events carry ids");
        let first_at = std::time::Instant::now();

        // Before the swap: Bob presenting Alice's cursor is a tenant
        // boundary (409), and Alice's own cursor resumes.
        let before = s.resume(&bob, &alice_cursor).await;
        assert_eq!(before.status(), 409);
        let body = before.text().await.unwrap();
        assert!(!body.contains("notifications/progress"), "{body}");

        let swapped = s.swap(plugins::STATUS_400, "status-400").await;
        assert_eq!(swapped.status(), 200);
        let swapped: Value = swapped.json().await.unwrap();
        assert_eq!(swapped["generation"], 2);
        // The tool was still producing when the swap went live, so the
        // open stream below carries events sent under generation 2.
        assert!(
            first_at.elapsed() < Duration::from_millis(150 * u64::from(count - 2)),
            "the swap took too long for this test to show anything"
        );

        // After the swap, the same request is decided by generation 2: 400.
        let after = s.resume(&bob, &alice_cursor).await;
        assert_eq!(after.status(), 400);
        let body = after.text().await.unwrap();
        assert!(!body.contains("notifications/progress"), "{body}");

        // The stream opened before the swap keeps delivering: every
        // remaining progress notification in order, then the result.
        let mut next_progress = 2;
        let result = loop {
            let (_, message) = alice_stream
                .next_message()
                .await
                .expect("the open stream ended before the tool's result");
            if message["method"] == "notifications/progress" {
                assert_eq!(
                    message["params"]["progress"].as_f64(),
                    Some(f64::from(next_progress)),
                    "{message}"
                );
                next_progress += 1;
            } else {
                break message;
            }
        };
        assert_eq!(next_progress, count + 1, "progress lost on the open stream");
        assert_eq!(result["id"], 7, "{result}");
        assert!(result["result"].is_object(), "{result}");

        // Alice's own cursor still resumes under generation 2, replaying
        // after the cursor.
        let own = s.resume(&alice, &alice_cursor).await;
        assert_eq!(own.status(), 200);
        let mut replay = SseReader::new(own);
        let (_, replayed) = replay.next_message().await.unwrap();
        assert_eq!(
            replayed["params"]["progress"].as_f64(),
            Some(2.0),
            "{replayed}"
        );
        drop(replay);

        let m = s.metrics().await;
        assert_eq!(
            m.get("rewind_resume_decisions_total{verdict=\"conflict\",generation=\"1\"}"),
            Some(&1.0),
            "{m:?}"
        );
        assert_eq!(
            m.get("rewind_resume_decisions_total{verdict=\"bad_request\",generation=\"2\"}"),
            Some(&1.0),
            "{m:?}"
        );
        assert_eq!(
            m.get("rewind_resume_decisions_total{verdict=\"resume\",generation=\"2\"}"),
            Some(&1.0),
            "{m:?}"
        );
        assert_eq!(m.get("rewind_policy_live_generation"), Some(&2.0));
    })
    .await
    .expect("the test finished within 120 s");
}
