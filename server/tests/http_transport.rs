//! What an rmcp user keeps when adopting Rewind's transport, and the
//! transport's own rules: request `Parts` in tool handlers, JSON answers,
//! stateless 2026-07-28 requests, the standalone-stream delivery rule, a
//! single 16 MiB result, CORS, the header limit, batches, principals, and
//! health probes.

mod http_support;

use std::sync::Arc;
use std::time::Duration;

use http_support::{start, start_default, Event, SseBody, TestServer, STEP};
use rewind_engine::{Config, EventId};
use rewind_server::mcp::{McpOptions, OriginPolicy};
use serde_json::{json, Value};

fn data_events(events: Vec<Event>) -> Vec<Event> {
    events
        .into_iter()
        .filter(|e| e.data.as_deref().is_some_and(|d| !d.is_empty()))
        .collect()
}

fn call(id: i64, name: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": name, "arguments": arguments}})
}

/// A POST whose `Accept` is exactly `accept`.
fn post_accepting(
    server: &TestServer,
    sid: &str,
    accept: &str,
    body: Value,
) -> reqwest::RequestBuilder {
    server
        .client
        .post(&server.url)
        .header("content-type", "application/json")
        .header("accept", accept)
        .header("mcp-protocol-version", "2025-11-25")
        .header("mcp-session-id", sid)
        .json(&body)
}

async fn text_of(resp: reqwest::Response) -> String {
    tokio::time::timeout(STEP, resp.text())
        .await
        .expect("body within the step timeout")
        .expect("body")
}

/// The text of the first content block of the response to `id` among `events`.
fn result_text(events: &[Event], id: i64) -> String {
    let r = events
        .iter()
        .find(|e| e.is_response_to(id))
        .unwrap_or_else(|| panic!("no response to {id} in {events:?}"))
        .json();
    r["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {r}"))
        .to_owned()
}

#[tokio::test]
async fn request_parts_reach_tool_handlers() {
    let server = start_default().await;
    let sid = server.initialize().await;
    let resp = server
        .send(
            server
                .post(
                    Some(&sid),
                    call(1, "test_request_header", json!({"name": "x-tenant"})),
                )
                .header("x-tenant", "blue-42"),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let events = SseBody::new(resp).read_to_end().await;
    assert_eq!(result_text(&events, 1), "blue-42");
    // Each request carries its own parts, not the first request's.
    let resp = server
        .send(
            server
                .post(
                    Some(&sid),
                    call(2, "test_request_header", json!({"name": "x-tenant"})),
                )
                .header("x-tenant", "green-7"),
        )
        .await;
    let events = SseBody::new(resp).read_to_end().await;
    assert_eq!(result_text(&events, 2), "green-7");
}

#[tokio::test]
async fn a_client_that_takes_only_json_gets_one_json_body() {
    let server = start_default().await;
    let sid = server.initialize().await;
    let resp = server
        .send(post_accepting(
            &server,
            &sid,
            "application/json",
            call(3, "test_simple_text", json!({})),
        ))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let body: Value = serde_json::from_str(&text_of(resp).await).unwrap();
    assert_eq!(body["id"], 3);
    assert!(body["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("simple text"));

    // A call that reports progress: the JSON body holds the result alone,
    // and the progress notifications wait on the standalone stream.
    let mut progress = call(4, "progress_stream", json!({"count": 3, "interval_ms": 0}));
    progress["params"]["_meta"] = json!({"progressToken": "json-4"});
    let resp = server
        .send(post_accepting(&server, &sid, "application/json", progress))
        .await;
    assert_eq!(resp.headers()["content-type"], "application/json");
    let body: Value = serde_json::from_str(&text_of(resp).await).unwrap();
    assert!(body["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("done: 3"));
    let resp = server.send(server.get(Some(&sid), None)).await;
    let mut standalone = SseBody::new(resp);
    let seen = standalone.until(|e| e.progress() == Some(3.0)).await;
    let progress: Vec<f64> = seen.iter().filter_map(Event::progress).collect();
    assert_eq!(progress, vec![1.0, 2.0, 3.0]);
    assert!(standalone.raw.contains("json-4"));

    // Neither JSON nor SSE accepted: 406.
    let resp = server
        .send(post_accepting(
            &server,
            &sid,
            "text/html",
            call(5, "test_simple_text", json!({})),
        ))
        .await;
    assert_eq!(resp.status(), 406);
}

#[tokio::test]
async fn the_json_response_option_answers_json_unless_the_handler_streams() {
    let mut options = McpOptions::default();
    options.json_response = true;
    let server = start(Config::default(), options).await;
    let sid = server.initialize().await;
    let resp = server
        .send(server.post(Some(&sid), call(6, "test_simple_text", json!({}))))
        .await;
    assert_eq!(resp.headers()["content-type"], "application/json");
    let body: Value = serde_json::from_str(&text_of(resp).await).unwrap();
    assert_eq!(body["id"], 6);

    // Progress before the result: SSE, priming first, nothing lost.
    let mut body = server.progress_stream(&sid, 7, 3, 10, "prefer").await;
    let events = body.read_to_end().await;
    assert!(events[0].is_priming(), "{events:?}");
    let progress: Vec<f64> = events.iter().filter_map(Event::progress).collect();
    assert_eq!(progress, vec![1.0, 2.0, 3.0]);
    assert!(events.last().unwrap().is_response_to(7));
    // And it resumes like any stream: from the first progress event.
    let first = events.iter().find(|e| e.progress() == Some(1.0)).unwrap();
    let resp = server
        .send(server.get(Some(&sid), first.id.as_deref()))
        .await;
    let rest = data_events(SseBody::new(resp).read_to_end().await);
    let progress: Vec<f64> = rest.iter().filter_map(Event::progress).collect();
    assert_eq!(progress, vec![2.0, 3.0]);
    assert!(rest.last().unwrap().is_response_to(7));
}

fn stateless_meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "rewind-test", "version": "1"}
    })
}

fn stateless_post(server: &TestServer, body: Value) -> reqwest::RequestBuilder {
    server
        .client
        .post(&server.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .json(&body)
}

#[tokio::test]
async fn requests_of_2026_07_28_are_served_without_a_session() {
    let server = start_default().await;
    let discover = json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover",
        "params": {"_meta": stateless_meta()}});
    let resp = server.send(stateless_post(&server, discover)).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("mcp-session-id").is_none());
    assert_eq!(resp.headers()["content-type"], "application/json");
    let body: Value = serde_json::from_str(&text_of(resp).await).unwrap();
    let versions = body["result"]["supportedVersions"].to_string();
    assert!(versions.contains("2026-07-28"), "{body}");

    let mut list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}});
    list["params"]["_meta"] = stateless_meta();
    let resp = server
        .send(
            stateless_post(&server, list)
                // Ignored in this revision.
                .header("mcp-session-id", "not-a-session")
                .header("last-event-id", "not-an-id"),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let body: Value = serde_json::from_str(&text_of(resp).await).unwrap();
    assert!(body["result"]["tools"]
        .to_string()
        .contains("progress_stream"));

    let mut call = call(3, "test_request_header", json!({"name": "x-who"}));
    call["params"]["_meta"] = stateless_meta();
    let resp = server
        .send(stateless_post(&server, call).header("x-who", "stateless-caller"))
        .await;
    let body: Value = serde_json::from_str(&text_of(resp).await).unwrap();
    assert_eq!(body["result"]["content"][0]["text"], "stateless-caller");

    // A call that reports progress streams over SSE, with no event ids:
    // there is nothing to resume.
    let mut progress = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
        "params": {"name": "progress_stream", "arguments": {"count": 3, "interval_ms": 0}}});
    progress["params"]["_meta"] = stateless_meta();
    progress["params"]["_meta"]["progressToken"] = json!("s-4");
    let resp = server.send(stateless_post(&server, progress)).await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = SseBody::new(resp);
    let events = body.read_to_end().await;
    assert!(events.iter().all(|e| e.id.is_none()), "{events:?}");
    let progress: Vec<f64> = events.iter().filter_map(Event::progress).collect();
    assert_eq!(progress, vec![1.0, 2.0, 3.0]);
    assert!(events.last().unwrap().is_response_to(4));

    // Nothing was stored and no session exists.
    let m = server.mcp.engine().metrics();
    assert_eq!((m.sessions_opened, m.appends), (0, 0));
    assert_eq!(server.mcp.sessions_live(), 0);

    // No GET stream and no DELETE at this revision.
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let resp = server
            .send(
                server
                    .client
                    .request(method.clone(), &server.url)
                    .header("accept", "text/event-stream")
                    .header("mcp-protocol-version", "2026-07-28"),
            )
            .await;
        assert_eq!(resp.status(), 405, "{method}");
        assert_eq!(resp.headers()["allow"], "POST");
    }

    // A request without the per-request context this revision requires is
    // refused, not served.
    let bare = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": {}});
    let resp = server.send(stateless_post(&server, bare)).await;
    assert_eq!(resp.status(), 400);
    let body: Value = serde_json::from_str(&text_of(resp).await).unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("clientCapabilities"),
        "{body}"
    );

    // This revision has no JSON-RPC batches either.
    let mut one = json!({"jsonrpc": "2.0", "id": 6, "method": "tools/list", "params": {}});
    one["params"]["_meta"] = stateless_meta();
    let resp = server
        .send(stateless_post(&server, json!([one.clone(), one])))
        .await;
    assert_eq!(resp.status(), 400);
    let body: Value = serde_json::from_str(&text_of(resp).await).unwrap();
    assert_eq!(body["error"]["code"], -32600, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("batches"),
        "{body}"
    );
}

/// Subscribes the session to the watched resource.
async fn subscribe(server: &TestServer, sid: &str, id: i64) {
    let sub = json!({"jsonrpc": "2.0", "id": id, "method": "resources/subscribe",
        "params": {"uri": "test://watched-resource"}});
    let events = SseBody::new(server.send(server.post(Some(sid), sub)).await)
        .read_to_end()
        .await;
    assert!(events.iter().any(|e| e.is_response_to(id)), "{events:?}");
}

async fn touch(server: &TestServer, sid: &str, id: i64) {
    let events = SseBody::new(
        server
            .send(server.post(
                Some(sid),
                call(
                    id,
                    "touch_resource",
                    json!({"uri": "test://watched-resource"}),
                ),
            ))
            .await,
    )
    .read_to_end()
    .await;
    assert!(
        result_text(&events, id).contains("subscribers notified"),
        "{events:?}"
    );
}

fn updates(events: &[Event]) -> usize {
    events
        .iter()
        .filter(|e| e.json()["method"] == "notifications/resources/updated")
        .count()
}

#[tokio::test]
async fn standalone_messages_wait_for_the_next_get_and_are_delivered_once() {
    let server = start_default().await;
    let sid = server.initialize().await;
    subscribe(&server, &sid, 1).await;
    // Before any GET: two updates, stored on the standalone stream.
    touch(&server, &sid, 2).await;
    touch(&server, &sid, 3).await;

    // The first GET (no Last-Event-ID) delivers both, after its priming.
    let resp = server.send(server.get(Some(&sid), None)).await;
    assert_eq!(resp.status(), 200);
    let mut first = SseBody::new(resp);
    let priming = first.next().await.unwrap();
    assert!(priming.is_priming(), "{priming:?}");
    let got = vec![first.next().await.unwrap(), first.next().await.unwrap()];
    assert_eq!(updates(&got), 2, "{got:?}");
    // While it is open, a new update arrives on it live.
    touch(&server, &sid, 4).await;
    let live = first.next().await.unwrap();
    assert_eq!(updates(std::slice::from_ref(&live)), 1, "{live:?}");
    drop(first);

    // Between GETs: one more.
    touch(&server, &sid, 5).await;
    let resp = server.send(server.get(Some(&sid), None)).await;
    let mut second = SseBody::new(resp);
    assert!(second.next().await.unwrap().is_priming());
    let next = second.next().await.unwrap();
    assert_eq!(updates(std::slice::from_ref(&next)), 1, "{next:?}");
    let after_id = next.id.clone().unwrap();

    // A third GET takes over from the second (newest wins) and repeats
    // nothing the second handed over.
    let resp = server.send(server.get(Some(&sid), None)).await;
    let mut third = SseBody::new(resp);
    assert!(third.next().await.unwrap().is_priming());
    second.read_to_end().await;
    assert!(second.ended, "the older standalone response ends");
    touch(&server, &sid, 6).await;
    let newest = third.next().await.unwrap();
    assert_eq!(updates(std::slice::from_ref(&newest)), 1, "{newest:?}");
    // The third GET's first event is the new update, not the one the
    // second already handed over: five updates, each delivered once
    // (2 + 1 to the first GET, 1 to the second, 1 to the third).
    let seq = |id: &str| EventId::parse(id).unwrap().seq;
    assert!(
        seq(newest.id.as_deref().unwrap()) > seq(&after_id),
        "{newest:?}"
    );
}

#[tokio::test]
async fn a_16_mib_result_is_delivered_and_resumable() {
    // The defaults `rewind serve` ships: 256 KiB per session, yet a larger
    // event gets a segment of its own and is kept whole.
    let server = start(Config::default(), McpOptions::default()).await;
    let sid = server.initialize().await;
    let bytes = 16u64 << 20;
    let resp = server
        .send(server.post(Some(&sid), call(9, "large_result", json!({"bytes": bytes}))))
        .await;
    assert_eq!(resp.status(), 200);
    let mut body = SseBody::new(resp);
    let priming = body.next().await.unwrap();
    assert!(priming.is_priming());
    let events = body.read_to_end().await;
    let text = result_text(&events, 9);
    assert_eq!(text.len() as u64, bytes);
    assert!(text
        .bytes()
        .enumerate()
        .all(|(i, b)| b == b'a' + (i % 26) as u8));

    // Cut before the result: resume from the priming id, get all of it.
    let resp = server
        .send(server.get(Some(&sid), priming.id.as_deref()))
        .await;
    assert_eq!(resp.status(), 200);
    let rest = data_events(SseBody::new(resp).read_to_end().await);
    assert_eq!(rest.len(), 1);
    assert_eq!(result_text(&rest, 9).len() as u64, bytes);
}

#[tokio::test]
async fn cors_preflight_and_exposed_session_header_for_allowed_origins_only() {
    let mut options = McpOptions::default();
    options.cors = true;
    options.origins = OriginPolicy::allow(["http://localhost:5173"]).unwrap();
    let server = start(Config::default(), options).await;
    let preflight = |origin: &str| {
        server
            .client
            .request(reqwest::Method::OPTIONS, &server.url)
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "content-type, mcp-session-id, mcp-protocol-version",
            )
    };
    let resp = server.send(preflight("http://localhost:5173")).await;
    assert!(resp.status().is_success(), "{}", resp.status());
    let h = resp.headers();
    assert_eq!(h["access-control-allow-origin"], "http://localhost:5173");
    let allowed = h["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_lowercase();
    assert!(allowed.contains("mcp-session-id"), "{allowed}");

    let resp = server.send(preflight("http://localhost:9999")).await;
    assert!(resp.headers().get("access-control-allow-origin").is_none());

    let resp = server
        .send(
            server
                .post(None, http_support::initialize_body())
                .header("origin", "http://localhost:5173"),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let exposed = resp.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .to_lowercase();
    assert!(exposed.contains("mcp-session-id"), "{exposed}");
    SseBody::new(resp).read_to_end().await;

    // The origin list is exact: same host, other port or scheme → 403.
    for origin in ["http://localhost:9999", "https://localhost:5173"] {
        let resp = server
            .send(
                server
                    .post(None, http_support::initialize_body())
                    .header("origin", origin),
            )
            .await;
        assert_eq!(resp.status(), 403, "{origin}");
    }
}

#[tokio::test]
async fn oversized_request_headers_get_431() {
    let mut options = McpOptions::default();
    options.max_header_bytes = 4096;
    let server = start(Config::default(), options).await;
    let resp = server
        .send(
            server
                .post(None, http_support::initialize_body())
                .header("x-padding", "p".repeat(5000)),
        )
        .await;
    assert_eq!(resp.status(), 431);
    let resp = server
        .send(server.get(None, None).header("x-padding", "p".repeat(5000)))
        .await;
    assert_eq!(resp.status(), 431);
    // Under the limit: served.
    let resp = server
        .send(
            server
                .post(None, http_support::initialize_body())
                .header("x-padding", "p".repeat(1000)),
        )
        .await;
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn batches_only_where_the_revision_has_them() {
    let server = start_default().await;
    let sid = server.initialize().await;
    let batch = json!([
        {"jsonrpc": "2.0", "id": 1, "method": "ping"},
        {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    ]);
    for v in ["2025-06-18", "2025-11-25"] {
        let resp = server
            .send(
                server
                    .post(Some(&sid), batch.clone())
                    .header("mcp-protocol-version", v),
            )
            .await;
        assert_eq!(resp.status(), 400, "{v}");
        assert!(text_of(resp).await.contains("batches"));
    }
    // 2025-03-26 (also: no header) has batches: both answered on one stream.
    let resp = server
        .send(
            server
                .client
                .post(&server.url)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-session-id", &sid)
                .json(&batch),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let events = SseBody::new(resp).read_to_end().await;
    assert!(events.iter().any(|e| e.is_response_to(1)));
    assert!(events.iter().any(|e| e.is_response_to(2)));
}

#[tokio::test]
async fn another_principal_gets_the_same_answer_from_every_method() {
    let mut options = McpOptions::default();
    options.principal = Some(Arc::new(|parts: &http::request::Parts| {
        parts
            .headers
            .get("x-user")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }));
    let server = start(Config::default(), options).await;
    let resp = server
        .send(
            server
                .post(None, http_support::initialize_body())
                .header("x-user", "alice"),
        )
        .await;
    let sid = resp.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    SseBody::new(resp).read_to_end().await;

    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    let post = server
        .send(server.post(Some(&sid), ping).header("x-user", "mallory"))
        .await
        .status();
    let get = server
        .send(server.get(Some(&sid), None).header("x-user", "mallory"))
        .await
        .status();
    let delete = server
        .send(
            server
                .client
                .delete(&server.url)
                .header("mcp-session-id", &sid)
                .header("x-user", "mallory"),
        )
        .await
        .status();
    assert_eq!((post, get, delete), (get, get, get));
    assert_eq!(get, 409);
    // Alice's session is untouched by all that.
    assert_eq!(server.mcp.sessions_live(), 1);
}

#[tokio::test]
async fn health_probes_need_no_token_and_readiness_follows_shutdown() {
    use rewind_engine::policy::wasm::PolicyHost;
    use rewind_engine::Engine;
    use rewind_server::admin::{self, AdminState};
    use rewind_server::metrics::ServerMetrics;

    let host = Arc::new(PolicyHost::with_default_policy().unwrap());
    let engine = Engine::with_policy(Config::default(), Arc::clone(&host) as _).unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let app = admin::router(
        AdminState::new(engine, host, Arc::new(ServerMetrics::new()), "t".repeat(32))
            .with_shutdown(shutdown.clone()),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = reqwest::Client::new();
    let get = |path: &str| {
        let url = format!("{base}{path}");
        let client = client.clone();
        async move {
            tokio::time::timeout(STEP, client.get(url).send())
                .await
                .unwrap()
                .unwrap()
                .status()
        }
    };
    assert_eq!(get("/healthz").await, 200);
    assert_eq!(get("/livez").await, 200);
    assert_eq!(get("/readyz").await, 200);
    assert_eq!(get("/metrics").await, 401, "metrics still need the token");
    shutdown.cancel();
    assert_eq!(get("/readyz").await, 503);
    assert_eq!(get("/healthz").await, 200);
}

#[tokio::test]
async fn responses_and_open_streams_are_counted() {
    let server = start_default().await;
    let metrics = Arc::clone(server.mcp.metrics());
    let sid = server.initialize().await;
    let resp = server.send(server.get(Some(&sid), None)).await;
    let mut standalone = SseBody::new(resp);
    assert!(standalone.next().await.unwrap().is_priming());
    assert_eq!(metrics.sse_streams_open(), 1);
    drop(standalone);
    // The body is dropped with the connection; give the server a moment
    // to notice, bounded.
    for _ in 0..100 {
        if metrics.sse_streams_open() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(metrics.sse_streams_open(), 0);
    let resp = server.send(server.get(None, None)).await;
    assert_eq!(resp.status(), 400);
    let text = rewind_server::metrics::render(
        &server.mcp.engine().metrics(),
        &rewind_engine::policy::wasm::PolicyHost::with_default_policy()
            .unwrap()
            .status(),
        &metrics,
    );
    assert!(
        text.contains(r#"rewind_http_responses_total{method="GET",status="400"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"rewind_http_responses_total{method="POST",status="202"} 1"#),
        "{text}"
    );
}
