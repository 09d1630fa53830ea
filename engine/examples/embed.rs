//! The engine alone, without HTTP: a producer appends to a session's
//! stream, a client reads part of it, disconnects, and resumes with the
//! ids it was given — and the cases the engine refuses.
//!
//! ```text
//! cargo run -p rewind-engine --example embed
//! ```
//!
//! In a server, `session_id` and `last_event_id` are the client's
//! `Mcp-Session-Id` and `Last-Event-ID` headers, and every appended payload
//! is one SSE event whose `id:` is the returned [`EventId`].
//! `Engine::with_policy` takes a WebAssembly policy host instead of the
//! native policy used here.

use std::time::Duration;

use rewind_engine::{Config, Engine, EventId, ResumeAction, ResumeRequest};

const EVENTS: u32 = 10;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = Engine::new(Config::default())?;
    // An unguessable id and a new epoch. All of this session's events come
    // from one producer, so it is opened for a single writer (whose appends
    // skip a CAS); `engine.open(None)` gives a session any thread appends to.
    let mut writer = engine.open_single_writer(None)?;
    let session = writer.handle().clone();
    let stream = session.new_stream().ok_or("no stream left")?;
    let session_id = session.id().to_string();
    println!("session {session_id}, stream {stream}");

    // The producer: a tool reporting progress, one event every 20 ms.
    let producer = {
        std::thread::spawn(move || -> Result<(), rewind_engine::AppendError> {
            for i in 1..=EVENTS {
                writer.append(stream, format!("progress {i}/{EVENTS}").as_bytes())?;
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(())
        })
    };

    // The client reads three events from the start of the stream, then its
    // connection drops. All it keeps is the id of the last event it saw.
    let mut buf = Vec::new();
    let mut reader = session.subscribe_from_start(stream);
    let mut last_seen: Option<EventId> = None;
    for _ in 0..3 {
        let id = reader
            .wait_next(&mut buf, Duration::from_secs(5))?
            .ok_or("the producer stalled")?;
        println!("  live    {id}  {}", String::from_utf8_lossy(&buf));
        last_seen = Some(id);
    }
    drop(reader);
    let cursor = last_seen.ok_or("nothing read")?.to_string();
    println!("disconnected after {cursor}");
    std::thread::sleep(Duration::from_millis(50)); // events keep coming meanwhile

    // Reconnect: the engine checks the cursor against the presented session
    // and replays what was missed, then keeps delivering live events in the
    // same loop, so nothing is lost or doubled at the hand-over.
    let decision = engine.resume(ResumeRequest {
        session_id: Some(&session_id),
        last_event_id: Some(&cursor),
        principal: None,
    });
    let ResumeAction::Replay(mut replay) = decision.action else {
        return Err(format!("expected a replay, got {:?}", decision.verdict).into());
    };
    let mut received = 3;
    while received < EVENTS {
        let id = replay
            .wait_next(&mut buf, Duration::from_secs(5))?
            .ok_or("the producer stalled")?;
        println!("  resumed {id}  {}", String::from_utf8_lossy(&buf));
        received += 1;
    }
    producer.join().map_err(|_| "the producer panicked")??;

    // Another session presenting this cursor gets nothing but a refusal.
    let other = engine.open(None)?;
    let other_id = other.id().to_string();
    let foreign = engine.resume(ResumeRequest {
        session_id: Some(&other_id),
        last_event_id: Some(&cursor),
        principal: None,
    });
    if let ResumeAction::Reject(r) = foreign.action {
        println!(
            "another session with this cursor: {} ({})",
            r.http_status(),
            r.reason
        );
    }

    // After the session ends, its id and cursors name nothing.
    session.close();
    let gone = engine.resume(ResumeRequest {
        session_id: Some(&session_id),
        last_event_id: Some(&cursor),
        principal: None,
    });
    if let ResumeAction::Reject(r) = gone.action {
        println!("the ended session: {} ({})", r.http_status(), r.reason);
    }
    Ok(())
}
