//! Every row of the decision table (`docs/decision-table.md`) over HTTP: status, SSE event
//! names, and no byte of another session's events in any response body.

mod http_support;

use http_support::{marker, start, start_default, Event, SseBody, TestServer};
use rewind_engine::{Config, EventId, SessionId};
use rewind_server::mcp::McpOptions;

/// A session that ran one `progress_stream` call (3 notifications + the
/// result), tagged with its own marker.
struct Tenant {
    sid: String,
    marker: String,
    /// Every event id it was sent, in order (priming first).
    ids: Vec<String>,
}

async fn tenant(server: &TestServer, name: &str) -> Tenant {
    let sid = server.initialize().await;
    let marker = marker(name);
    let mut body = server.progress_stream(&sid, 1, 3, 0, &marker).await;
    let events = body.read_to_end().await;
    assert!(events.last().unwrap().is_response_to(1), "{events:?}");
    assert!(body.raw.contains(&marker));
    Tenant {
        sid,
        marker,
        ids: events.iter().filter_map(|e| e.id.clone()).collect(),
    }
}

/// Asserts `body` holds nothing of `others`.
fn no_foreign_bytes(body: &str, others: &[&Tenant]) {
    for t in others {
        assert!(
            !body.contains(&t.marker),
            "body leaks {}'s events: {body}",
            t.marker
        );
    }
}

async fn body_text(resp: reqwest::Response) -> String {
    tokio::time::timeout(http_support::STEP, resp.text())
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn live_session_without_cursor_opens_the_standalone_stream() {
    let server = start_default().await;
    let (a, b) = (tenant(&server, "a").await, tenant(&server, "b").await);
    let resp = server.send(server.get(Some(&a.sid), None)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = SseBody::new(resp);
    let first = body.next().await.unwrap();
    assert!(first.is_priming(), "{first:?}");
    assert!(first.retry.is_some(), "retry on every stream");
    assert_eq!(first.event, None);
    // A fresh stream replays nothing: not even A's own tool events.
    no_foreign_bytes(&body.raw, &[&a, &b]);
    drop(body);
    server.shutdown.cancel();
}

#[tokio::test]
async fn malformed_cursor_is_400() {
    let server = start_default().await;
    let (a, b) = (tenant(&server, "a").await, tenant(&server, "b").await);
    let resp = server
        .send(server.get(Some(&a.sid), Some("evt-4471")))
        .await;
    assert_eq!(resp.status(), 400);
    no_foreign_bytes(&body_text(resp).await, &[&a, &b]);
}

#[tokio::test]
async fn foreign_cursor_is_409_and_leaks_nothing() {
    let server = start_default().await;
    let (a, b) = (tenant(&server, "a").await, tenant(&server, "b").await);
    // B presents each of A's cursors, including the priming one.
    for cursor in &a.ids {
        let resp = server.send(server.get(Some(&b.sid), Some(cursor))).await;
        assert_eq!(resp.status(), 409, "cursor {cursor}");
        no_foreign_bytes(&body_text(resp).await, &[&a, &b]);
    }
}

#[tokio::test]
async fn cursor_of_an_earlier_incarnation_gets_reset_first() {
    let server = start_default().await;
    let (a, b) = (tenant(&server, "a").await, tenant(&server, "b").await);
    // Re-initialise A under the same id: a new epoch.
    let resp = server
        .send(server.post(Some(&a.sid), http_support::initialize_body()))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["mcp-session-id"], a.sid.as_str());
    let mut init = SseBody::new(resp);
    init.read_to_end().await;
    let resp = server.send(server.get(Some(&a.sid), Some(&a.ids[2]))).await;
    assert_eq!(resp.status(), 200);
    let mut body = SseBody::new(resp);
    let first = body.next().await.unwrap();
    assert_eq!(first.event.as_deref(), Some("reset"), "{first:?}");
    let signal = first.json();
    assert!(signal["reason"]
        .as_str()
        .unwrap()
        .contains("earlier incarnation"));
    let second = body.next().await.unwrap();
    assert!(
        second.is_priming(),
        "then a fresh standalone stream: {second:?}"
    );
    // The old incarnation's events are never replayed, to anyone.
    no_foreign_bytes(&body.raw, &[&a, &b]);
}

#[tokio::test]
async fn cursor_beyond_the_high_water_mark_is_409() {
    let server = start_default().await;
    let (a, b) = (tenant(&server, "a").await, tenant(&server, "b").await);
    let last = EventId::parse(a.ids.last().unwrap()).unwrap();
    let forged = EventId {
        seq: last.seq + 10,
        ..last
    }
    .to_string();
    let resp = server.send(server.get(Some(&a.sid), Some(&forged))).await;
    assert_eq!(resp.status(), 409);
    no_foreign_bytes(&body_text(resp).await, &[&a, &b]);
}

#[tokio::test]
async fn cursor_before_the_retained_window_gets_gap_first() {
    let mut config = Config::default();
    config.session_events = 16;
    let server = start(config, McpOptions::default()).await;
    let b = tenant(&server, "b").await;
    let a_sid = server.initialize().await;
    let a_marker = marker("a");
    // 40 notifications through a 16-slot ring: the first ones are gone.
    // Sent through rmcp's peer, which paces them to the live reader: the
    // sink would store all 40 before that reader ran, and the call's own
    // response would start with a gap instead of the ids used below.
    let mut call = server
        .progress_stream_via(&a_sid, 1, 40, 0, &a_marker, "peer")
        .await;
    let events = call.read_to_end().await;
    assert!(events.last().unwrap().is_response_to(1));
    let a = Tenant {
        sid: a_sid,
        marker: a_marker,
        ids: events.iter().filter_map(|e| e.id.clone()).collect(),
    };
    let resp = server.send(server.get(Some(&a.sid), Some(&a.ids[1]))).await;
    assert_eq!(resp.status(), 200);
    let mut body = SseBody::new(resp);
    let first = body.next().await.unwrap();
    assert_eq!(first.event.as_deref(), Some("gap"), "{first:?}");
    assert!(first.json()["oldest"].is_string(), "{first:?}");
    assert!(body.next().await.unwrap().is_priming());
    no_foreign_bytes(&body.raw, &[&a, &b]);
}

#[tokio::test]
async fn cursor_in_window_replays_exactly_the_missed_events() {
    let server = start_default().await;
    let b = tenant(&server, "b").await;
    let sid = server.initialize().await;
    let a_marker = marker("a");
    let mut call = server.progress_stream(&sid, 7, 5, 0, &a_marker).await;
    let all = call.read_to_end().await;
    // priming, progress 1..5, result
    assert_eq!(all.len(), 7, "{all:?}");
    let a = Tenant {
        sid,
        marker: a_marker,
        ids: all.iter().filter_map(|e| e.id.clone()).collect(),
    };
    // The client saw up to progress 2.
    let resp = server.send(server.get(Some(&a.sid), Some(&a.ids[2]))).await;
    assert_eq!(resp.status(), 200);
    let mut body = SseBody::new(resp);
    let replayed: Vec<Event> = body
        .read_to_end()
        .await
        .into_iter()
        .filter(|e| e.data.is_some())
        .collect();
    let ids: Vec<_> = replayed.iter().map(|e| e.id.clone().unwrap()).collect();
    assert_eq!(
        ids,
        a.ids[3..].to_vec(),
        "exactly the events after the cursor"
    );
    let progress: Vec<_> = replayed.iter().filter_map(Event::progress).collect();
    assert_eq!(progress, vec![3.0, 4.0, 5.0]);
    assert!(replayed.last().unwrap().is_response_to(7));
    assert!(body.raw.contains(&a.marker));
    no_foreign_bytes(&body.raw, &[&b]);
}

#[tokio::test]
async fn unknown_or_ended_session_is_404() {
    let server = start_default().await;
    let (a, b) = (tenant(&server, "a").await, tenant(&server, "b").await);
    let unknown = SessionId::generate().to_string();
    let resp = server
        .send(server.get(Some(&unknown), Some(&a.ids[1])))
        .await;
    assert_eq!(resp.status(), 404);
    no_foreign_bytes(&body_text(resp).await, &[&a, &b]);
    let resp = server.send(server.get(Some(&unknown), None)).await;
    assert_eq!(resp.status(), 404);

    // Ended: A deletes its session, then presents its own cursor.
    let resp = server
        .send(
            server
                .client
                .delete(&server.url)
                .header("mcp-session-id", &a.sid),
        )
        .await;
    assert_eq!(resp.status(), 204);
    let resp = server.send(server.get(Some(&a.sid), Some(&a.ids[1]))).await;
    assert_eq!(resp.status(), 404);
    no_foreign_bytes(&body_text(resp).await, &[&a, &b]);
}

#[tokio::test]
async fn get_without_session_is_400() {
    let server = start_default().await;
    let (a, b) = (tenant(&server, "a").await, tenant(&server, "b").await);
    let resp = server.send(server.get(None, Some(&a.ids[1]))).await;
    assert_eq!(resp.status(), 400);
    no_foreign_bytes(&body_text(resp).await, &[&a, &b]);
    let resp = server.send(server.get(None, None)).await;
    assert_eq!(resp.status(), 400);
}
