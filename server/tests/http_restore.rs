//! A restart on a data directory, in process: the data directory of a
//! running server is copied while nothing is being written (what a
//! `kill -9` at that moment would leave), and a second endpoint opens the
//! copy. The MCP session goes on there without `initialize`; a call that
//! was in flight replays what it stored and then its stream ends; an
//! engine session whose `initialize` was never answered answers 404.

mod http_support;

use std::path::Path;
use std::time::Duration;

use http_support::{start, SseBody, TestServer, STEP};
use rewind_engine::Config;
use rewind_server::mcp::McpOptions;
use serde_json::json;

fn durable(dir: &Path) -> Config {
    let mut c = Config::default();
    c.data_dir = Some(dir.to_owned());
    c.global_bytes = 8 << 20;
    c.max_event_bytes = 64 << 10;
    c
}

/// The files of a crashed process: everything but the lock (whose `flock`
/// belongs to the running one).
fn copy_dir(from: &Path, to: &Path) {
    for name in ["pool", "sessions.journal"] {
        std::fs::copy(from.join(name), to.join(name)).unwrap();
    }
}

async fn ping(server: &TestServer, sid: &str, id: i64) -> reqwest::Response {
    server
        .send(server.post(Some(sid), json!({"jsonrpc":"2.0","id":id,"method":"ping"})))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_session_answers_post_and_get_without_initialize() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = start(durable(a_dir.path()), McpOptions::default()).await;
    let sid = a.initialize().await;
    // A finished call, and one in flight: its first progress is stored,
    // the next comes only after three seconds.
    let mut done = a.progress_stream(&sid, 1, 3, 0, "done").await;
    let finished = done.read_to_end().await;
    assert!(finished.last().unwrap().is_response_to(1), "{finished:?}");
    let mid = finished[1].id.clone().unwrap();
    let mut running = a.progress_stream(&sid, 2, 2, 3000, "running").await;
    let primed = running.next().await.unwrap();
    assert!(primed.is_priming());
    let first = running.next().await.unwrap();
    assert_eq!(first.progress(), Some(1.0), "{first:?}");
    // An engine session whose `initialize` was never answered.
    let bare = a.mcp.engine().open(None).unwrap();
    copy_dir(a_dir.path(), b_dir.path());

    let b = start(durable(b_dir.path()), McpOptions::default()).await;
    assert_eq!(b.mcp.engine().recovery().unwrap().sessions, 2);
    assert_eq!(
        b.mcp.sessions_live(),
        1,
        "the MCP session is rebuilt, the bare one is not"
    );

    // POST without initialize.
    let resp = ping(&b, &sid, 7).await;
    assert_eq!(resp.status(), 200);
    let events = SseBody::new(resp).read_to_end().await;
    assert!(
        events
            .iter()
            .any(|e| e.is_response_to(7) && e.json()["result"] == json!({})),
        "{events:?}"
    );
    // A tool call streams as before the restart.
    let mut again = b.progress_stream(&sid, 8, 2, 0, "after").await;
    let events = again.read_to_end().await;
    assert_eq!(
        events
            .iter()
            .filter_map(|e| e.progress())
            .collect::<Vec<_>>(),
        [1.0, 2.0]
    );
    assert!(events.last().unwrap().is_response_to(8), "{events:?}");

    // Resume the finished call from its first progress: the rest of it,
    // once each, then the end.
    let resp = b.send(b.get(Some(&sid), Some(&mid))).await;
    assert_eq!(resp.status(), 200);
    let replay: Vec<_> = SseBody::new(resp)
        .read_to_end()
        .await
        .into_iter()
        .filter(|e| e.data.is_some())
        .collect();
    assert_eq!(finished[1].progress(), Some(1.0));
    assert_eq!(replay.len(), 3, "{replay:?}");
    assert_eq!(replay[0].progress(), Some(2.0));
    assert_eq!(replay[1].progress(), Some(3.0));
    assert!(replay[2].is_response_to(1));
    assert_eq!(
        replay.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        finished[2..]
            .iter()
            .map(|e| e.id.clone())
            .collect::<Vec<_>>()
    );

    // Resume the call that was in flight: its stored progress, then an
    // explicit error (the call died with the process), then the end.
    let cursor = primed.id.clone().unwrap();
    let resp = b.send(b.get(Some(&sid), Some(&cursor))).await;
    assert_eq!(resp.status(), 200);
    let mut body = SseBody::new(resp);
    let replay = tokio::time::timeout(STEP, body.read_to_end())
        .await
        .expect("the resume of a call that died ends");
    let data: Vec<_> = replay.iter().filter(|e| e.data.is_some()).collect();
    assert_eq!(data.len(), 2, "{replay:?}");
    assert_eq!(data[0].id, first.id);
    assert_eq!(data[0].progress(), Some(1.0));
    let error = data[1].json();
    assert_eq!(error["id"], 2, "{error}");
    assert_eq!(error["error"]["code"], -32603, "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("server restarted"),
        "{error}"
    );
    // Once: a second restart (a copy of the copy) does not answer it again.
    let c_dir = tempfile::tempdir().unwrap();
    copy_dir(b_dir.path(), c_dir.path());
    let c = start(durable(c_dir.path()), McpOptions::default()).await;
    let resp = c.send(c.get(Some(&sid), Some(&cursor))).await;
    assert_eq!(resp.status(), 200);
    let again: Vec<_> = SseBody::new(resp)
        .read_to_end()
        .await
        .into_iter()
        .filter(|e| e.data.is_some())
        .collect();
    assert_eq!(
        again.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        data.iter().map(|e| e.id.clone()).collect::<Vec<_>>()
    );
    c.shutdown.cancel();

    // A GET without Last-Event-ID opens the standalone stream.
    let resp = b.send(b.get(Some(&sid), None)).await;
    assert_eq!(resp.status(), 200);
    let mut standalone = SseBody::new(resp);
    assert!(standalone.next().await.unwrap().is_priming());
    drop(standalone);

    // The bare session did not survive as an MCP session.
    let bare_id = bare.id().to_string();
    assert_eq!(ping(&b, &bare_id, 9).await.status(), 404);
    assert_eq!(b.send(b.get(Some(&bare_id), None)).await.status(), 404);

    // The first server is unaffected; its running call finishes there.
    let rest = tokio::time::timeout(Duration::from_secs(10), running.read_to_end())
        .await
        .unwrap();
    assert!(rest.last().unwrap().is_response_to(2), "{rest:?}");
    a.shutdown.cancel();
    b.shutdown.cancel();
}
