//! The admin surface over real loopback HTTP: bearer auth, Prometheus
//! metrics that move, policy swap/rollback changing the next decisions, and
//! refused uploads that leave the live policy alone.

use std::collections::HashMap;
use std::future::IntoFuture as _;
use std::sync::Arc;
use std::time::Duration;

use rewind_engine::policy::wasm::{plugins, PolicyHost};
use rewind_engine::{Config, Engine, ResumeAction, ResumeRequest, SessionHandle, Verdict};
use rewind_server::admin::{self, AdminState, MAX_POLICY_BYTES};
use rewind_server::metrics::ServerMetrics;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "test-token-0123456789abcdef";

struct Admin {
    base: String,
    engine: Engine,
    metrics: Arc<ServerMetrics>,
    client: reqwest::Client,
    stop: CancellationToken,
}

impl Drop for Admin {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn start() -> Admin {
    let host = Arc::new(PolicyHost::with_default_policy().unwrap());
    let mut config = Config::default();
    config.session_events = 64;
    config.session_bytes = 64 * 1024;
    let engine = Engine::with_policy(config, Arc::clone(&host) as _).unwrap();
    let metrics = Arc::new(ServerMetrics::new());
    let app = admin::router(AdminState::new(
        engine.clone(),
        host,
        Arc::clone(&metrics),
        TOKEN,
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    tokio::spawn(
        axum::serve(listener, app)
            .with_graceful_shutdown(stop.clone().cancelled_owned())
            .into_future(),
    );
    Admin {
        base,
        engine,
        metrics,
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap(),
        stop,
    }
}

impl Admin {
    async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
    }

    async fn post(&self, path: &str, body: impl Into<reqwest::Body>) -> reqwest::Response {
        self.client
            .post(format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
            .body(body)
            .send()
            .await
            .unwrap()
    }

    async fn live_generation(&self) -> u64 {
        let status: Value = self.get("/policy").await.json().await.unwrap();
        status["live"]["generation"].as_u64().unwrap()
    }
}

/// `bob` presents `alice`'s cursor: the tenant-boundary row.
fn foreign_resume(engine: &Engine, alice: &SessionHandle, bob: &SessionHandle) -> (Verdict, u64) {
    let cursor = alice.cursor_now(0).to_string();
    let bob_id = bob.id().to_string();
    let d = engine.resume(ResumeRequest {
        session_id: Some(&bob_id),
        last_event_id: Some(&cursor),
        principal: None,
    });
    (d.verdict, d.generation)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_needs_the_bearer_token() {
    let admin = start().await;
    let routes = [
        (reqwest::Method::GET, "/metrics"),
        (reqwest::Method::GET, "/policy"),
        (reqwest::Method::POST, "/policy"),
        (reqwest::Method::POST, "/policy/rollback"),
    ];
    for (method, path) in routes {
        let url = format!("{}{path}", admin.base);
        let none = admin
            .client
            .request(method.clone(), &url)
            .send()
            .await
            .unwrap();
        assert_eq!(none.status(), 401, "{method} {path} without a token");
        assert_eq!(none.headers()["www-authenticate"], "Bearer");
        let wrong = admin
            .client
            .request(method.clone(), &url)
            .bearer_auth("test-token-0123456789abcdeX")
            .body(plugins::STATUS_400)
            .send()
            .await
            .unwrap();
        assert_eq!(wrong.status(), 401, "{method} {path} with a wrong token");
        let basic = admin
            .client
            .request(method.clone(), &url)
            .basic_auth("admin", Some(TOKEN))
            .send()
            .await
            .unwrap();
        assert_eq!(basic.status(), 401, "{method} {path} with basic auth");
    }
    // Nothing was swapped by the refused POSTs.
    assert_eq!(admin.live_generation().await, 1);
    assert_eq!(admin.get("/metrics").await.status(), 200);
}

/// Parses the text exposition format: `# HELP`/`# TYPE`/`# EOF` lines and
/// `name{labels} value` samples. Panics on anything else.
fn parse_prometheus(text: &str) -> HashMap<String, f64> {
    let mut samples = HashMap::new();
    let mut saw_eof = false;
    for line in text.lines() {
        assert!(!saw_eof, "content after # EOF: {line}");
        if line == "# EOF" {
            saw_eof = true;
            continue;
        }
        if line.starts_with("# HELP ") || line.starts_with("# TYPE ") || line.starts_with("# UNIT ")
        {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("not a sample: {line}"));
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line}"
        );
        if name_end < series.len() {
            assert!(series.ends_with('}'), "unterminated labels in {line}");
        }
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        samples.insert(series.to_owned(), value);
    }
    assert!(saw_eof, "no # EOF");
    samples
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_and_move_with_traffic() {
    let admin = start().await;
    let before = parse_prometheus(&admin.get("/metrics").await.text().await.unwrap());
    for name in [
        "rewind_appends_total",
        "rewind_appends_stalled_total",
        "rewind_events_delivered_total",
        "rewind_reader_gaps_total",
        "rewind_sessions_refused_total",
        "rewind_pool_bytes",
        "rewind_sessions_opened_total",
        "rewind_sessions_closed_total",
        "rewind_sessions_expired_total",
        "rewind_sessions_evicted_total",
        "rewind_sessions_live",
        "rewind_bytes_held",
        "rewind_bytes_released",
        "rewind_policy_fallbacks_total{fault=\"trap\"}",
        "rewind_resume_duration_seconds_count",
        "rewind_replay_events_count",
        "rewind_policy_live_generation",
        "rewind_sse_streams_open",
        "rewind_policy_faults_total{generation=\"1\",policy=\"default\",fault=\"trap\"}",
        "rewind_policy_swaps_total",
        "rewind_policy_rollbacks_total{trigger=\"manual\"}",
    ] {
        assert!(before.contains_key(name), "{name} missing from /metrics");
    }
    assert_eq!(before["rewind_appends_total"], 0.0);
    let build = format!(
        "rewind_build_info{{version=\"{}\"}}",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(before.get(&build), Some(&1.0), "{build}");

    let alice = admin.engine.open(None).unwrap();
    let bob = admin.engine.open(None).unwrap();
    for i in 0..5 {
        alice.append(0, format!("event {i}").as_bytes()).unwrap();
    }
    let (verdict, generation) = foreign_resume(&admin.engine, &alice, &bob);
    assert_eq!(verdict, Verdict::Conflict);
    admin
        .metrics
        .observe_resume(verdict, generation, Duration::from_micros(40));
    admin.metrics.observe_replay(3);

    let after = parse_prometheus(&admin.get("/metrics").await.text().await.unwrap());
    assert_eq!(after["rewind_appends_total"], 5.0);
    assert_eq!(after["rewind_sessions_opened_total"], 2.0);
    assert_eq!(after["rewind_sessions_live"], 2.0);
    assert!(after["rewind_bytes_held"] > 0.0);
    // One family per fact: the decisions are counted once, by verdict and
    // generation (no separate resume or verdict totals).
    assert!(!after.keys().any(|k| k.starts_with("rewind_resumes_total")
        || k.starts_with("rewind_verdicts_total")
        || k.starts_with("rewind_policy_decisions_total")));
    assert_eq!(
        after["rewind_resume_decisions_total{verdict=\"conflict\",generation=\"1\"}"],
        1.0
    );
    assert_eq!(after["rewind_resume_duration_seconds_count"], 1.0);
    assert_eq!(after["rewind_replay_events_sum"], 3.0);
    assert_eq!(after["rewind_replay_events_count"], 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_changes_the_next_decisions_and_a_rollback_restores_them() {
    let admin = start().await;
    let alice = admin.engine.open(None).unwrap();
    let bob = admin.engine.open(None).unwrap();
    let first = alice.append(0, b"before the swap").unwrap();
    assert_eq!(
        foreign_resume(&admin.engine, &alice, &bob),
        (Verdict::Conflict, 1)
    );

    // A stream opened before the swap.
    let alice_id = alice.id().to_string();
    let cursor = first.to_string();
    let decision = admin.engine.resume(ResumeRequest {
        session_id: Some(&alice_id),
        last_event_id: Some(&cursor),
        principal: None,
    });
    let ResumeAction::Replay(mut open_stream) = decision.action else {
        panic!("alice's own cursor resumes");
    };

    // A module refused at load: counted, nothing swapped.
    let response = admin
        .post("/policy?name=imports", plugins::fixtures::IMPORTS)
        .await;
    assert_eq!(response.status(), 422);
    let response = admin
        .post("/policy?name=status-400", plugins::STATUS_400)
        .await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["generation"], 2);
    assert_eq!(body["name"], "status-400");

    assert_eq!(
        foreign_resume(&admin.engine, &alice, &bob),
        (Verdict::BadRequest, 2)
    );
    alice.append(0, b"after the swap").unwrap();
    let mut buf = Vec::new();
    assert!(open_stream.next_into(&mut buf).unwrap().is_some());
    assert_eq!(buf, b"after the swap");

    let status: Value = admin.get("/policy").await.json().await.unwrap();
    assert_eq!(status["live"]["generation"], 2);
    assert_eq!(status["live"]["name"], "status-400");
    assert_eq!(status["swaps"], 1);
    assert_eq!(status["generations"][1]["state"], "standby");
    // The first module, the refused one, status-400: counted by outcome.
    assert_eq!(status["loads"]["loaded"], 2);
    assert_eq!(status["loads"]["refused"], 1);
    assert_eq!(status["loads"]["compiler_failed"], 0);
    assert!(status["loads"]["seconds"].as_f64().unwrap() > 0.0);

    let response = admin.post("/policy/rollback", Vec::new()).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["generation"], 1);
    assert_eq!(
        foreign_resume(&admin.engine, &alice, &bob),
        (Verdict::Conflict, 1)
    );
    let response = admin.post("/policy/rollback", Vec::new()).await;
    assert_eq!(response.status(), 409);
    let body: Value = response.json().await.unwrap();
    assert!(body["message"].as_str().unwrap().contains("no earlier"));

    let text = admin.get("/metrics").await.text().await.unwrap();
    let samples = parse_prometheus(&text);
    assert_eq!(samples["rewind_policy_swaps_total"], 1.0);
    // The first module, then the refused one and status-400.
    for (outcome, count) in [("loaded", 2.0), ("refused", 1.0), ("compiler_failed", 0.0)] {
        let name = format!("rewind_policy_loads_total{{outcome=\"{outcome}\"}}");
        assert_eq!(samples.get(&name), Some(&count), "{name}");
    }
    // Three loads, each of them a compile: their time is on the counter.
    let load_seconds = samples["rewind_policy_load_seconds_total"];
    assert!(load_seconds > 0.0 && load_seconds < 600.0, "{load_seconds}");
    assert_eq!(
        samples["rewind_policy_rollbacks_total{trigger=\"manual\"}"],
        1.0
    );
    // The rolled-back generation keeps its series, under labels that did
    // not change when it stopped deciding (its state is in GET /policy).
    assert!(
        text.contains(
            "rewind_policy_faults_total{generation=\"2\",policy=\"status-400\",fault=\"trap\"}"
        ),
        "{text}"
    );
    assert!(!text.contains("state="), "{text}");
    let status: Value = admin.get("/policy").await.json().await.unwrap();
    let rolled_back = status["generations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["generation"] == 2)
        .unwrap();
    assert_eq!(rolled_back["state"], "rolled_back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_uploads_are_refused_and_change_nothing() {
    use rewind_engine::policy::wasm::plugins::fixtures;
    let admin = start().await;

    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "not wasm",
            b"#!/bin/sh\necho hi\n".to_vec(),
            422,
            "not a WebAssembly module",
        ),
        ("empty", Vec::new(), 400, "empty"),
        ("traps", fixtures::TRAP.to_vec(), 422, "trap"),
        ("loops", fixtures::LOOP.to_vec(), 422, "out_of_fuel"),
        (
            "wrong ABI",
            fixtures::WRONG_ABI.to_vec(),
            422,
            "ABI version 999",
        ),
        (
            "imports",
            fixtures::IMPORTS.to_vec(),
            422,
            "imports `env::rewind_host_log`",
        ),
        (
            "resume-all",
            fixtures::RESUME_ALL.to_vec(),
            422,
            "answered Resume",
        ),
        (
            "truncated",
            plugins::STATUS_400[..plugins::STATUS_400.len() / 2].to_vec(),
            422,
            "not a valid WebAssembly module",
        ),
    ];
    for (what, body, status, needle) in cases {
        let response = admin.post("/policy", body).await;
        assert_eq!(response.status(), status, "{what}");
        let text = response.text().await.unwrap();
        assert!(text.contains(needle), "{what}: {text}");
        assert_eq!(
            admin.live_generation().await,
            1,
            "{what} changed the live policy"
        );
    }

    let huge = vec![0u8; MAX_POLICY_BYTES + 1];
    let response = admin.post("/policy", huge).await;
    assert_eq!(response.status(), 413);
    assert!(response.text().await.unwrap().contains("16 MiB"));

    let response = admin
        .post("/policy?name=bad%20name", plugins::STATUS_400)
        .await;
    assert_eq!(response.status(), 400);

    assert_eq!(admin.live_generation().await, 1);
    let status: Value = admin.get("/policy").await.json().await.unwrap();
    assert_eq!(status["swaps"], 0);
    // The host still decides, with the default.
    let alice = admin.engine.open(None).unwrap();
    let bob = admin.engine.open(None).unwrap();
    alice.append(0, b"x").unwrap();
    assert_eq!(
        foreign_resume(&admin.engine, &alice, &bob),
        (Verdict::Conflict, 1)
    );
}
