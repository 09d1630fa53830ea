//! The MCP flow over HTTP: calls, cuts, resumes, early close, DELETE,
//! DNS-rebinding protection, protocol versions, shutdown.

mod http_support;

use http_support::{start, start_default, Event, SseBody};
use rewind_engine::Config;
use rewind_server::mcp::McpOptions;
use serde_json::json;

fn data_events(events: Vec<Event>) -> Vec<Event> {
    events
        .into_iter()
        .filter(|e| e.data.as_deref().is_some_and(|d| !d.is_empty()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_sent_through_the_sink_or_through_rmcp_arrives_the_same_way() {
    // The reference tool stores its notifications through `SseStream`'s
    // sink by default, or through rmcp's `ctx.peer`: either way every
    // notification arrives once, in order, before the result; and a cut
    // mid-stream resumes with the rest (a retention that holds all 2,000
    // of the cut call's notifications: nobody holds the cut stream's place).
    // Both limits: the default 1,024 events would let the oldest segments
    // go while the resumed reader is still behind a fast tool (an explicit
    // `gap`, correct, but not what this test is about).
    let mut config = Config::default();
    config.session_bytes = 1 << 20;
    config.session_events = 4096;
    let server = start(config, McpOptions::default()).await;
    let sid = server.initialize().await;
    for (id, via) in [(1, "sink"), (2, "peer")] {
        let events = server
            .progress_stream_via(&sid, id, 300, 0, via, via)
            .await
            .read_to_end()
            .await;
        let events = data_events(events);
        let progress: Vec<f64> = events.iter().filter_map(Event::progress).collect();
        assert_eq!(
            progress,
            (1..=300).map(f64::from).collect::<Vec<_>>(),
            "via {via}"
        );
        assert_eq!(
            events.len(),
            301,
            "via {via}: 300 notifications and the result"
        );
        let last = events.last().unwrap();
        assert!(last.is_response_to(id), "via {via}: {last:?}");
        assert!(
            last.json()["result"]["content"][0]["text"]
                .as_str()
                .unwrap()
                .ends_with("progress_stream done: 300 notifications"),
            "via {via}: {last:?}"
        );
    }
    let mut call = server
        .progress_stream_via(&sid, 3, 2000, 0, "cut", "sink")
        .await;
    let seen = call.until(|e| e.progress() == Some(5.0)).await;
    let last_id = seen.last().unwrap().id.clone().unwrap();
    drop(call);
    let resp = server.send(server.get(Some(&sid), Some(&last_id))).await;
    assert_eq!(resp.status(), 200);
    let rest = data_events(SseBody::new(resp).read_to_end().await);
    let progress: Vec<f64> = rest.iter().filter_map(Event::progress).collect();
    assert_eq!(progress, (6..=2000).map(f64::from).collect::<Vec<_>>());
    assert!(rest.last().unwrap().is_response_to(3));
}

#[tokio::test]
async fn cut_mid_stream_then_resume_delivers_the_rest_exactly_once() {
    let server = start_default().await;
    let sid = server.initialize().await;

    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let resp = server.send(server.post(Some(&sid), list)).await;
    assert_eq!(resp.status(), 200);
    let events = SseBody::new(resp).read_to_end().await;
    let tools = events.iter().find(|e| e.is_response_to(1)).unwrap().json();
    let names: Vec<_> = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    for t in [
        "progress_stream",
        "test_simple_text",
        "test_tool_with_logging",
        "test_tool_with_progress",
        "test_error_handling",
        "test_reconnection",
    ] {
        assert!(names.iter().any(|n| n == t), "{t} missing from {names:?}");
    }

    let mut call = server.progress_stream(&sid, 2, 10, 30, "cut").await;
    let seen = call.until(|e| e.progress() == Some(3.0)).await;
    let last_id = seen.last().unwrap().id.clone().unwrap();
    drop(call); // the connection is cut mid-stream

    let resp = server.send(server.get(Some(&sid), Some(&last_id))).await;
    assert_eq!(resp.status(), 200);
    let rest = data_events(SseBody::new(resp).read_to_end().await);
    let progress: Vec<f64> = rest.iter().filter_map(Event::progress).collect();
    assert_eq!(progress, (4..=10).map(f64::from).collect::<Vec<_>>());
    assert!(rest.last().unwrap().is_response_to(2), "{rest:?}");
    assert_eq!(
        rest.len(),
        8,
        "7 notifications and the result, nothing else"
    );
    let result = rest.last().unwrap().json();
    assert!(result["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("done: 10"));
}

#[tokio::test]
async fn result_produced_after_an_early_close_is_delivered_on_resume() {
    let mut options = McpOptions::default();
    options.close_post_streams_after_priming = true;
    let server = start(Config::default(), options).await;
    let sid = server.initialize().await;
    let mut call = server.progress_stream(&sid, 5, 3, 50, "early").await;
    let opening = call.read_to_end().await;
    assert_eq!(
        opening.len(),
        1,
        "the POST stream ends after priming: {opening:?}"
    );
    assert!(opening[0].is_priming() && opening[0].retry.is_some());
    // Let the tool finish while nobody listens.
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let resp = server
        .send(server.get(Some(&sid), opening[0].id.as_deref()))
        .await;
    assert_eq!(resp.status(), 200);
    let rest = data_events(SseBody::new(resp).read_to_end().await);
    let progress: Vec<f64> = rest.iter().filter_map(Event::progress).collect();
    assert_eq!(progress, vec![1.0, 2.0, 3.0]);
    assert!(rest.last().unwrap().is_response_to(5));
}

#[tokio::test]
async fn test_reconnection_closes_its_stream_and_the_result_survives() {
    let server = start_default().await;
    let sid = server.initialize().await;
    let call = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {"name": "test_reconnection", "arguments": {}}});
    let resp = server.send(server.post(Some(&sid), call)).await;
    assert_eq!(resp.status(), 200);
    let events = SseBody::new(resp).read_to_end().await;
    assert!(events.iter().all(|e| !e.is_response_to(9)), "{events:?}");
    let last = events.iter().rev().find_map(|e| e.id.clone()).unwrap();
    let resp = server.send(server.get(Some(&sid), Some(&last))).await;
    assert_eq!(resp.status(), 200);
    let rest = data_events(SseBody::new(resp).read_to_end().await);
    assert_eq!(rest.len(), 1, "{rest:?}");
    assert!(rest[0].is_response_to(9));
}

#[tokio::test]
async fn concurrent_calls_never_share_a_stream() {
    let server = start_default().await;
    let sid = server.initialize().await;
    let (mut a, mut b) = (
        server.progress_stream(&sid, 11, 5, 10, "left").await,
        server.progress_stream(&sid, 12, 5, 10, "right").await,
    );
    let (ea, eb) = tokio::join!(a.read_to_end(), b.read_to_end());
    for (events, raw, mine, other) in [
        (ea, &a.raw, "tok-11", "tok-12"),
        (eb, &b.raw, "tok-12", "tok-11"),
    ] {
        assert!(raw.contains(mine));
        assert!(!raw.contains(other), "{raw}");
        assert_eq!(events.iter().filter_map(Event::progress).count(), 5);
    }
}

#[tokio::test]
async fn logging_during_a_call_travels_on_its_stream() {
    let server = start_default().await;
    let sid = server.initialize().await;
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "test_tool_with_logging", "arguments": {}}});
    let resp = server.send(server.post(Some(&sid), call)).await;
    let events = data_events(SseBody::new(resp).read_to_end().await);
    let logs = events
        .iter()
        .filter(|e| e.json()["method"] == "notifications/message")
        .count();
    assert_eq!(logs, 3, "{events:?}");
    assert!(events.last().unwrap().is_response_to(3));
}

#[tokio::test]
async fn delete_frees_the_session_and_later_requests_get_404() {
    let server = start_default().await;
    let sid = server.initialize().await;
    let _other = server.initialize().await;
    let engine = server.mcp.engine().clone();
    assert_eq!(engine.metrics().sessions_live, 2);
    let resp = server
        .send(
            server
                .client
                .delete(&server.url)
                .header("mcp-session-id", &sid),
        )
        .await;
    assert_eq!(resp.status(), 204);
    assert_eq!(engine.metrics().sessions_live, 1);
    assert_eq!(server.mcp.sessions_live(), 1);
    let ping = json!({"jsonrpc": "2.0", "id": 4, "method": "ping"});
    assert_eq!(
        server.send(server.post(Some(&sid), ping)).await.status(),
        404
    );
    assert_eq!(
        server.send(server.get(Some(&sid), None)).await.status(),
        404
    );
    let resp = server
        .send(
            server
                .client
                .delete(&server.url)
                .header("mcp-session-id", &sid),
        )
        .await;
    assert_eq!(resp.status(), 404);
}

/// Once a burst's sessions are gone, the server's own sweeper gives the
/// pool memory they used back to the operating system (free buddies merged
/// first, so all free memory but a few small blocks ends up given back),
/// and the server goes on serving from it.
#[tokio::test]
async fn the_sweeper_gives_back_the_memory_of_sessions_that_are_gone() {
    let mut config = Config::default();
    config.global_bytes = 64 << 20;
    let retention = config.session_bytes;
    let server = start(config, McpOptions::default()).await;
    let engine = server.mcp.engine().clone();
    // A new session that streams a call of 300 notifications to the end.
    let streamed = async |id: i64, label: &str| {
        let sid = server.initialize().await;
        let events = server
            .progress_stream(&sid, id, 300, 0, label)
            .await
            .read_to_end()
            .await;
        assert!(events.last().unwrap().is_response_to(id), "{label}");
        (sid, events)
    };
    let mut sids = Vec::new();
    for _ in 0..6 {
        sids.push(streamed(1, "burst").await.0);
    }
    let held = engine.metrics().bytes_held;
    assert!(held >= 6 * retention, "{held}");
    for sid in &sids {
        let resp = server
            .send(
                server
                    .client
                    .delete(&server.url)
                    .header("mcp-session-id", sid),
            )
            .await;
        assert_eq!(resp.status(), 204);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let m = engine.metrics();
        // All of it but the few blocks under two pages at the pool's end
        // (one per class at most, 7.5 KiB), so the sessions' too.
        let free = m.pool_bytes - m.bytes_held;
        if m.bytes_held == 0 && m.bytes_released + 8 * 1024 >= free {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the sweeper gave too little back: {m:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (_, events) = streamed(2, "after").await;
    let progress = events.iter().filter_map(Event::progress).count();
    assert_eq!(progress, 300);
}

#[tokio::test]
async fn session_header_rules_for_post() {
    let server = start_default().await;
    let ping = json!({"jsonrpc": "2.0", "id": 4, "method": "ping"});
    assert_eq!(
        server.send(server.post(None, ping.clone())).await.status(),
        400
    );
    let unknown = rewind_engine::SessionId::generate().to_string();
    assert_eq!(
        server
            .send(server.post(Some(&unknown), ping.clone()))
            .await
            .status(),
        404
    );
    assert_eq!(
        server
            .send(server.post(Some("not-a-session"), ping))
            .await
            .status(),
        404
    );
}

#[tokio::test]
async fn foreign_origin_or_host_is_403() {
    let server = start_default().await;
    let init = http_support::initialize_body();
    let resp = server
        .send(
            server
                .post(None, init.clone())
                .header("origin", "http://evil.example"),
        )
        .await;
    assert_eq!(resp.status(), 403);
    let resp = server
        .send(
            server
                .post(None, init.clone())
                .header("host", "evil.example"),
        )
        .await;
    assert_eq!(resp.status(), 403);
    let resp = server
        .send(
            server
                .get(None, None)
                .header("origin", "http://evil.example:8080"),
        )
        .await;
    assert_eq!(resp.status(), 403);
    let resp = server
        .send(
            server
                .post(None, init)
                .header("origin", "http://localhost:5173"),
        )
        .await;
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn unsupported_protocol_version_is_400() {
    let server = start_default().await;
    let sid = server.initialize().await;
    let ping = json!({"jsonrpc": "2.0", "id": 4, "method": "ping"});
    let resp = server
        .send(
            server
                .post(Some(&sid), ping.clone())
                .header("mcp-protocol-version", "1999-01-01"),
        )
        .await;
    assert_eq!(resp.status(), 400);
    for v in ["2025-03-26", "2025-06-18", "2025-11-25"] {
        let resp = server
            .send(
                server
                    .post(Some(&sid), ping.clone())
                    .header("mcp-protocol-version", v),
            )
            .await;
        assert_eq!(resp.status(), 200, "{v}");
        let events = SseBody::new(resp).read_to_end().await;
        assert!(events.iter().any(|e| e.is_response_to(4)));
    }
}

#[tokio::test]
async fn shutdown_ends_open_streams() {
    let server = start_default().await;
    let sid = server.initialize().await;
    let resp = server.send(server.get(Some(&sid), None)).await;
    let mut standalone = SseBody::new(resp);
    assert!(standalone.next().await.unwrap().is_priming());
    let mut call = server.progress_stream(&sid, 6, 1000, 50, "long").await;
    call.next().await.unwrap();
    server.shutdown.cancel();
    standalone.read_to_end().await;
    call.read_to_end().await;
    assert!(standalone.ended && call.ended);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_whose_cursor_fell_out_of_the_window_gets_a_gap_then_the_rest_of_its_call() {
    // A small window (8 events, 4 KiB segments): a call of 1000
    // notifications, one a millisecond, runs on while its client is cut, so the client's
    // cursor falls out of the window. The resume must say so (`gap`) and
    // go on with the call's own stream — the events still held, then live
    // ones, then the result — not switch the client to the standalone
    // stream, where its result would never come.
    let mut config = Config::default();
    config.session_events = 8;
    config.session_bytes = 2048;
    config.max_segment_bytes = 4096;
    let server = start(config, McpOptions::default()).await;
    let sid = server.initialize().await;
    let mut call = server.progress_stream(&sid, 7, 1000, 1, "cut").await;
    let seen = call.until(|e| e.progress() == Some(2.0)).await;
    let last_id = seen.last().unwrap().id.clone().unwrap();
    drop(call);
    let facts = || {
        server.mcp.engine().facts(rewind_engine::ResumeRequest {
            session_id: Some(&sid),
            last_event_id: Some(&last_id),
            principal: None,
        })
    };
    let mut out_of_window = false;
    for _ in 0..500 {
        if facts().cursor_fact() == Some(rewind_engine::CursorFact::BeforeWindow) {
            out_of_window = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(
        out_of_window,
        "the cursor never left the window: {:?}",
        facts()
    );

    let resp = server.send(server.get(Some(&sid), Some(&last_id))).await;
    assert_eq!(resp.status(), 200);
    let events = SseBody::new(resp).read_to_end().await;
    let first = events
        .iter()
        .find(|e| e.event.is_some() || e.data.is_some());
    assert_eq!(
        first.and_then(|e| e.event.as_deref()),
        Some("gap"),
        "{events:?}"
    );
    // Every event after the gap is the call's: progress only grows, a
    // skip is always announced by a gap, and the result comes exactly once,
    // last.
    let mut last = 2.0;
    let mut gap_seen = false;
    let mut results = 0;
    for e in &events {
        if e.event.as_deref() == Some("gap") {
            gap_seen = true;
        } else if let Some(p) = e.progress() {
            assert!(p > last, "progress {p} after {last}");
            assert!(p == last + 1.0 || gap_seen, "{last} → {p} without a gap");
            last = p;
            gap_seen = false;
        } else if e.data.as_deref().is_some_and(|d| !d.is_empty()) {
            assert!(e.is_response_to(7), "an event of another stream: {e:?}");
            results += 1;
        }
    }
    assert_eq!(results, 1, "{events:?}");
    assert!(events.last().unwrap().is_response_to(7));
    assert!(last > 2.0, "nothing of the call after the gap");
}
