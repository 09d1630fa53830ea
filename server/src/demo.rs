//! `rewind demo`: walks an in-process engine, with the embedded default
//! policy running as WASM, through every row of the decision table
//! (`docs/decision-table.md`) and prints what it did.

use std::sync::Arc;

use rewind_engine::policy::wasm::PolicyHost;
use rewind_engine::{Config, Engine, EventId, ResumeAction, ResumeRequest, SessionId};

pub(crate) fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = Config::default();
    config.session_events = 16;
    // The embedded default policy, compiled to wasm32 by the build and run
    // in the sandbox (fuel, deadline, memory cap) on every decision.
    let host = PolicyHost::with_default_policy()?;
    let engine = Engine::with_policy(config, Arc::new(host))?;
    println!(
        "rewind demo: engine with policy {}, {}",
        engine.policy().name(),
        describe(&engine)
    );

    let alice = engine.open(None)?;
    let bob = engine.open(None)?;
    let tool = alice.new_stream().ok_or("out of streams")?;
    let mut alice_ids = Vec::new();
    for i in 1..=5 {
        alice_ids.push(alice.append(tool, format!("alice progress {i}/5").as_bytes())?);
    }
    bob.append(0, b"bob notification")?;
    println!(
        "opened sessions alice and bob; alice's tool stream {tool} has 5 events, last id {}",
        alice_ids[4]
    );

    let (a, b) = (alice.id().to_string(), bob.id().to_string());
    let forged = EventId {
        seq: alice_ids[4].seq + 10,
        ..alice_ids[4]
    }
    .to_string();
    let stale = alice_ids[1].to_string();
    let gone = SessionId::generate().to_string();
    let rows: Vec<(&str, Option<&str>, Option<&str>)> = vec![
        ("alice, no cursor", Some(&a), None),
        ("alice, malformed cursor", Some(&a), Some("evt-4471")),
        ("bob presents alice's cursor", Some(&b), Some(&stale)),
        ("alice, cursor beyond high water", Some(&a), Some(&forged)),
        ("alice, her own cursor (in window)", Some(&a), Some(&stale)),
        ("unknown session", Some(&gone), Some(&stale)),
        ("no session id", None, Some(&stale)),
    ];
    println!(
        "\n{:<36} {:<14} {:<14} {:<11} answer",
        "request", "session", "cursor", "verdict"
    );
    for (label, session_id, last_event_id) in rows {
        let d = engine.resume(ResumeRequest {
            session_id,
            last_event_id,
            principal: None,
        });
        let answer = match d.action {
            ResumeAction::Replay(mut replay) => {
                let mut buf = Vec::new();
                let mut events = Vec::new();
                while let Some(_id) = replay.next_into(&mut buf)? {
                    events.push(String::from_utf8_lossy(&buf).into_owned());
                }
                format!("200, replays {events:?}")
            }
            ResumeAction::Fresh {
                signal: Some(s), ..
            } => format!("200, first event `{}`", s.kind.event_name()),
            ResumeAction::Fresh { signal: None, .. } => "200, fresh stream".to_owned(),
            ResumeAction::Reject(r) => format!("{} ({})", r.http_status(), r.reason),
        };
        println!(
            "{label:<36} {:<14} {:<14} {:<11} {answer}",
            format!("{:?}", d.facts.session_fact().expect("known")),
            format!("{:?}", d.facts.cursor_fact().expect("known")),
            format!("{:?}", d.verdict),
        );
    }

    // The older-epoch and gap rows need history: a new incarnation of
    // alice's session, and a window that moved past a cursor.
    let alice2 = engine.reopen(alice.id(), None)?;
    let d = engine.resume(ResumeRequest {
        session_id: Some(&a),
        last_event_id: Some(&stale),
        principal: None,
    });
    println!(
        "alice re-initialised (epoch {} -> {}), old cursor: {:?}",
        alice.epoch(),
        alice2.epoch(),
        d.verdict
    );
    let first = alice2.append(0, b"e0")?;
    // 16 events are kept (at least); enough more release the oldest
    // segments.
    for i in 1..400 {
        alice2.append(0, format!("e{i}").as_bytes())?;
    }
    let cursor = first.to_string();
    let d = engine.resume(ResumeRequest {
        session_id: Some(&a),
        last_event_id: Some(&cursor),
        principal: None,
    });
    println!("alice's window moved past her cursor: {:?}", d.verdict);

    let m = engine.metrics();
    println!(
        "\nmetrics: {} appends, {} events replayed, {} resumes ({} policy faults), {} sessions live, {} bytes held",
        m.appends,
        m.events_replayed,
        m.resumes,
        m.policy_faults.iter().sum::<u64>(),
        m.sessions_live,
        m.bytes_held
    );
    Ok(())
}

pub(crate) fn describe(engine: &Engine) -> String {
    let c = engine.config();
    format!(
        "at least {} events or {} KiB kept per session, a {} MiB pool shared by all, \
         at most {} sessions, idle TTL {} s",
        c.session_events,
        c.session_bytes / 1024,
        c.global_bytes >> 20,
        c.max_sessions,
        c.idle_ttl.as_secs()
    )
}
