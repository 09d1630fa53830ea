//! Every profile of `rewind load` against an in-process Rewind MCP endpoint
//! on 127.0.0.1 (the same router `rewind serve` runs): zero violations,
//! zero errors, and the work each profile exists for actually done.

use std::sync::Arc;
use std::time::Duration;

use rewind_engine::policy::wasm::PolicyHost;
use rewind_engine::{Config, Engine};
use rewind_load::{Expect, LoadArgs, Profile, Report};
use rewind_server::mcp::{self, HostPolicy, McpOptions};
use rewind_server::metrics::ServerMetrics;
use rewind_server::tools::ReferenceServer;
use tokio_util::sync::CancellationToken;

/// Starts the endpoint; returns its URL and the token that stops it.
async fn serve() -> (String, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let host = Arc::new(PolicyHost::with_default_policy().unwrap());
    // The defaults: sessions cost what they hold, so the profiles' sessions
    // fit the default pool.
    let engine = Engine::with_policy(Config::default(), host).unwrap();
    let mut options = McpOptions::default();
    options.hosts = HostPolicy::for_listen_addr(addr);
    let shutdown = options.shutdown.clone();
    let app = mcp::router(
        engine,
        Arc::new(ServerMetrics::new()),
        options,
        ReferenceServer::new,
    );
    let stop = shutdown.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
            .unwrap();
    });
    (format!("http://{addr}/mcp"), shutdown)
}

async fn load(profile: Profile, tweak: impl FnOnce(&mut LoadArgs)) -> Report {
    let (url, shutdown) = serve().await;
    let mut args = LoadArgs::new(vec![url], profile);
    args.sessions = 8;
    args.duration = Duration::from_millis(1500);
    args.count = Some(20);
    args.seed = Some(7);
    args.timeout = Duration::from_secs(10);
    tweak(&mut args);
    let report = tokio::time::timeout(Duration::from_secs(60), rewind_load::run(&args))
        .await
        .expect("the run ends")
        .expect("the run starts");
    shutdown.cancel();
    let text = report.render(20);
    assert_eq!(report.violation_count, 0, "{text}");
    assert_eq!(report.error_count, 0, "{text}");
    assert!(report.passed(), "{text}");
    assert_eq!(report.sessions_opened, 8, "{text}");
    assert!(
        report.decision_table_checked,
        "Rewind is recognised: {text}"
    );
    report
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn throughput_delivers_every_event_once() {
    let r = runtime().block_on(load(Profile::Throughput, |_| {}));
    assert!(r.calls.completed >= 8, "{}", r.render(0));
    assert_eq!(r.events.delivered, r.calls.completed * 20);
    assert_eq!(r.calls.resumes, 0);
}

#[test]
fn a_pause_after_each_call_bounds_the_offered_load() {
    // 8 sessions, 1.5 s, a 500 ms pause: a session starts its first call
    // within one pause and then at most one call per pause, so at most 4
    // calls each however fast the server is (a closed loop makes hundreds).
    let r = runtime().block_on(load(Profile::Throughput, |a| {
        a.think = Duration::from_millis(500);
    }));
    assert!(r.calls.completed >= 8, "{}", r.render(0));
    assert!(r.calls.completed <= 8 * 4, "{}", r.render(0));
    assert_eq!(r.think_ms, 500);
    assert!(r.render(0).contains("500 ms pause after each call"));
}

#[test]
fn resume_replays_after_the_cursor_at_both_delays() {
    let r = runtime().block_on(load(Profile::Resume, |a| {
        a.resume_delay = vec![Duration::ZERO, Duration::from_millis(20)];
    }));
    assert!(r.calls.resumes > 0, "{}", r.render(0));
    assert!(
        r.resume.iter().all(|d| d.first_event.is_some()),
        "{}",
        r.render(0)
    );
    assert_eq!(r.calls.failed, 0);
}

#[test]
fn a_storm_cuts_and_resumes_every_session() {
    let r = runtime().block_on(load(Profile::Storm, |a| {
        a.resume_delay = vec![Duration::from_millis(20)];
    }));
    assert!(!r.storm.is_empty());
    let first = &r.storm[0];
    assert_eq!(first.resumed, 8, "{}", r.render(0));
    assert_eq!(first.completed, 8, "{}", r.render(0));
    assert!(first.finished);
}

#[test]
fn adversarial_probes_get_the_decision_tables_answers() {
    let r = runtime().block_on(load(Profile::Adversarial, |a| a.expect = Expect::Table));
    for kind in ["foreign", "future", "malformed", "stale", "dead"] {
        let t = r
            .probes
            .get(kind)
            .unwrap_or_else(|| panic!("no {kind} probe: {}", r.render(0)));
        assert!(t.sent > 0);
        assert_eq!(t.foreign_events, 0, "{kind}");
    }
    assert_eq!(
        r.probes["foreign"].answers.get(&409).copied(),
        Some(r.probes["foreign"].sent)
    );
    assert_eq!(
        r.probes["dead"].answers.get(&404).copied(),
        Some(r.probes["dead"].sent)
    );
    assert_eq!(r.probes["stale"].signalled, r.probes["stale"].sent);
}

#[test]
fn soak_churns_sessions() {
    let r = runtime().block_on(load(Profile::Soak, |a| a.interval = Some(Duration::ZERO)));
    assert!(r.session_counts.opened > 8, "{}", r.render(0));
    assert!(r.session_counts.deleted + r.session_counts.abandoned > 0);
}

#[test]
fn mixed_streams_resumes_and_probes() {
    let r = runtime().block_on(load(Profile::Mixed, |_| {}));
    assert!(
        r.calls.completed > 0 && r.session_counts.probes > 0,
        "{}",
        r.render(0)
    );
}

#[test]
fn idle_sessions_stay_alive() {
    let r = runtime().block_on(load(Profile::Idle, |a| a.count = None));
    let idle = r.idle.expect("idle figures");
    assert_eq!(idle.sessions, 8);
    assert_eq!(idle.alive, idle.sampled);
}
