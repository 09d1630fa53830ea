//! Session floods against the MCP endpoint: the memory budget holds, the
//! caps answer 503 with `Retry-After`, evicted sessions answer 404 on every
//! method, and a session with a call in flight is never cut silently — its
//! stream delivers every progress value once and in order, or says `gap`
//! where some were released, and always ends with the result.

mod http_support;

use std::time::Duration;

use futures::StreamExt as _;
use http_support::{initialize_body, start, SseBody, TestServer, STEP};
use rewind_engine::{Config, SessionId};
use rewind_server::mcp::McpOptions;
use serde_json::json;

/// `initialize` without the follow-up notification: the status, and the
/// session id when it was admitted.
async fn try_initialize(server: &TestServer) -> (u16, Option<String>, Option<String>) {
    let resp = server.send(server.post(None, initialize_body())).await;
    let status = resp.status().as_u16();
    let sid = resp
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // Read the answer to its end so the session is idle afterwards.
    let _ = tokio::time::timeout(STEP, resp.bytes()).await;
    (status, sid, retry_after)
}

/// What one `progress_stream` response delivered.
#[derive(Debug, Default)]
struct Delivery {
    progress: Vec<u64>,
    gaps: usize,
    /// Each progress value's index in `progress` right after a `gap`.
    after_gap: Vec<usize>,
    results: usize,
}

async fn read_progress(mut body: SseBody, id: i64) -> Delivery {
    let mut d = Delivery::default();
    while let Some(e) = body.next().await {
        if e.event.as_deref() == Some("gap") {
            d.gaps += 1;
            d.after_gap.push(d.progress.len());
        } else if let Some(p) = e.progress() {
            d.progress.push(p as u64);
        } else if e.is_response_to(id) {
            d.results += 1;
        }
    }
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_initializes_evicts_idle_sessions_only_and_never_cuts_a_stream() {
    let mut config = Config::default();
    // Room for a few hundred idle sessions (one 512-byte segment each).
    config.global_bytes = 256 << 10;
    config.max_segment_bytes = 4096;
    config.max_event_bytes = 16 << 10;
    let server = start(config, McpOptions::default()).await;

    let victim = server.initialize().await;
    const COUNT: u64 = 400;
    let stream = server
        .progress_stream(&victim, 7, COUNT as u32, 2, "victim")
        .await;
    let reader = tokio::spawn(async move { read_progress(stream, 7).await });
    // A second victim whose client is between connections: the call in
    // flight alone must keep the session from being evicted.
    let cut = server.initialize().await;
    let mut cut_body = server.progress_stream(&cut, 3, 1000, 10, "cut").await;
    let mut cut_last = None;
    let mut cut_progress = Vec::new();
    while cut_progress.len() < 5 {
        let e = cut_body
            .next()
            .await
            .expect("the cut victim's first events");
        if let Some(p) = e.progress() {
            cut_progress.push(p as u64);
        }
        cut_last = e.id.or(cut_last);
    }
    drop(cut_body);

    let floods: Vec<(u16, Option<String>, Option<String>)> = futures::stream::iter(0..1500)
        .map(|_| try_initialize(&server))
        .buffer_unordered(16)
        .collect()
        .await;
    let admitted: Vec<String> = floods.iter().filter_map(|(_, s, _)| s.clone()).collect();
    for (status, sid, _) in &floods {
        assert_eq!(*status, 200, "a flood under the session cap is admitted");
        assert!(sid.is_some());
    }

    let delivered = tokio::time::timeout(Duration::from_secs(60), reader)
        .await
        .expect("the victim's stream ends")
        .unwrap();
    assert_eq!(
        delivered.results, 1,
        "the result arrives exactly once: {delivered:?}"
    );
    // Every value once and in order; any value skipped is announced by a
    // gap right before the next one delivered.
    let mut expected = 1;
    for (i, p) in delivered.progress.iter().enumerate() {
        assert!(
            *p >= expected,
            "progress {p} out of order or repeated at {i}"
        );
        if *p > expected {
            assert!(
                delivered.after_gap.contains(&i),
                "progress {expected}..{p} skipped without a gap"
            );
        }
        expected = p + 1;
    }
    assert!(
        expected == COUNT + 1 || delivered.gaps > 0,
        "the last values are missing without a gap: {delivered:?}"
    );

    // The cut victim resumes after the flood: its session is still there,
    // and the rest of its call follows, or a gap says what was released.
    let resp = server
        .send(server.get(Some(&cut), cut_last.as_deref()))
        .await;
    assert_eq!(
        resp.status(),
        200,
        "a session with a call in flight was evicted"
    );
    let rest = read_progress(SseBody::new(resp), 3).await;
    assert_eq!(rest.results, 1, "{rest:?}");
    let mut expected = cut_progress.last().unwrap() + 1;
    for (i, p) in rest.progress.iter().enumerate() {
        assert!(
            *p >= expected,
            "cut victim: progress {p} repeated or out of order"
        );
        assert!(
            *p == expected || rest.after_gap.contains(&i),
            "cut victim: silent gap before {p}"
        );
        expected = p + 1;
    }

    let m = server.mcp.engine().metrics();
    assert!(
        m.sessions_evicted > 0,
        "the flood did not press the pool: {m:?}"
    );
    assert!(m.bytes_held <= m.pool_bytes, "{m:?}");
    assert_eq!(m.sessions_opened, 2 + admitted.len() as u64);

    // Once its call ended the victim was idle like the others, and older
    // than the flood's sessions: it may have been evicted since. Whichever
    // it is, every method agrees with the engine.
    let live = server
        .mcp
        .engine()
        .session(SessionId::parse(&victim).unwrap())
        .is_some();
    let ping = json!({"jsonrpc": "2.0", "id": 8, "method": "ping"});
    let status = server.send(server.post(Some(&victim), ping)).await.status();
    assert_eq!(status, if live { 200 } else { 404 });

    // Every evicted session answers 404 on every method.
    let evicted: Vec<&String> = admitted
        .iter()
        .filter(|s| {
            server
                .mcp
                .engine()
                .session(SessionId::parse(s).unwrap())
                .is_none()
        })
        .take(20)
        .collect();
    assert!(!evicted.is_empty());
    for sid in evicted {
        let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
        assert_eq!(
            server.send(server.post(Some(sid), ping)).await.status(),
            404
        );
        assert_eq!(server.send(server.get(Some(sid), None)).await.status(), 404);
        let delete = server
            .client
            .delete(&server.url)
            .header("mcp-session-id", sid.as_str())
            .header("mcp-protocol-version", "2025-11-25");
        assert_eq!(server.send(delete).await.status(), 404);
    }
    server.shutdown.cancel();
}

#[tokio::test]
async fn initialize_beyond_the_session_cap_gets_503_with_retry_after() {
    let mut config = Config::default();
    config.max_sessions = 3;
    let server = start(config, McpOptions::default()).await;
    let mut sids = Vec::new();
    for _ in 0..3 {
        let (status, sid, _) = try_initialize(&server).await;
        assert_eq!(status, 200);
        sids.push(sid.unwrap());
    }
    let (status, sid, retry_after) = try_initialize(&server).await;
    assert_eq!(status, 503);
    assert!(sid.is_none());
    let secs: u64 = retry_after.expect("Retry-After").parse().unwrap();
    assert!(secs >= 1);
    assert_eq!(server.mcp.engine().metrics().sessions_refused, 1);

    // Ending one makes room again.
    let delete = server
        .client
        .delete(&server.url)
        .header("mcp-session-id", sids[0].as_str())
        .header("mcp-protocol-version", "2025-11-25");
    assert_eq!(server.send(delete).await.status(), 204);
    let (status, _, _) = try_initialize(&server).await;
    assert_eq!(status, 200);
    server.shutdown.cancel();
}
