//! Every row of the decision table (`docs/decision-table.md`), through
//! `Engine::resume`.

use std::time::Duration;

use rewind_engine::{
    Config, CursorFact, Engine, EventId, ResumeAction, ResumeDecision, ResumeRequest, SessionFact,
    SessionHandle, SessionId, SignalKind, Verdict,
};

fn small_config() -> Config {
    let mut c = Config::default();
    c.session_events = 8;
    c.session_bytes = 1 << 30;
    c.global_bytes = 1 << 20;
    c.max_segment_bytes = 4096;
    c.max_event_bytes = 16 * 1024;
    c
}

fn engine() -> Engine {
    Engine::new(small_config()).expect("valid config")
}

fn resume(engine: &Engine, session: Option<&str>, cursor: Option<&str>) -> ResumeDecision {
    engine.resume(ResumeRequest {
        session_id: session,
        last_event_id: cursor,
        principal: None,
    })
}

fn drain(decision: ResumeDecision) -> Vec<Vec<u8>> {
    let ResumeAction::Replay(mut r) = decision.action else {
        panic!("expected a replay, got {:?}", decision.verdict);
    };
    let mut out = Vec::new();
    let mut buf = Vec::new();
    while let Some(_id) = r.next_into(&mut buf).expect("no lag") {
        out.push(buf.clone());
    }
    out
}

fn append_n(s: &SessionHandle, stream: u32, n: usize, prefix: &str) -> Vec<EventId> {
    (0..n)
        .map(|i| {
            s.append(stream, format!("{prefix}{i}").as_bytes())
                .expect("append")
        })
        .collect()
}

fn assert_row(d: &ResumeDecision, session: SessionFact, cursor: CursorFact, verdict: Verdict) {
    assert_eq!(d.facts.session_fact(), Some(session), "session fact");
    assert_eq!(d.facts.cursor_fact(), Some(cursor), "cursor fact");
    assert_eq!(d.verdict, verdict, "verdict");
    assert_eq!(d.fault, None);
}

#[test]
fn live_without_cursor_is_a_fresh_stream() {
    let e = engine();
    let s = e.open(None).unwrap();
    let d = resume(&e, Some(&s.id().to_string()), None);
    assert_row(&d, SessionFact::Live, CursorFact::Absent, Verdict::Fresh);
    match d.action {
        ResumeAction::Fresh {
            session: Some(h),
            signal: None,
        } => assert_eq!(h.id(), s.id()),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn malformed_cursor_is_rejected_400() {
    let e = engine();
    let s = e.open(None).unwrap();
    for bad in [
        "",
        "evt-4471",
        "0",
        "\u{1F600}",
        &"f".repeat(200),
        "0000000000000000-1-2-03",
    ] {
        let d = resume(&e, Some(&s.id().to_string()), Some(bad));
        assert_row(
            &d,
            SessionFact::Live,
            CursorFact::Malformed,
            Verdict::BadRequest,
        );
        match d.action {
            ResumeAction::Reject(r) => assert_eq!(r.http_status(), 400),
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn foreign_cursor_is_rejected_409_and_nothing_leaks() {
    let e = engine();
    let a = e.open(None).unwrap();
    let b = e.open(None).unwrap();
    let ids = append_n(&a, 0, 3, "secret-of-a-");
    let d = resume(&e, Some(&b.id().to_string()), Some(&ids[0].to_string()));
    assert_row(
        &d,
        SessionFact::Live,
        CursorFact::Foreign,
        Verdict::Conflict,
    );
    match d.action {
        ResumeAction::Reject(r) => assert_eq!(r.http_status(), 409),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn older_epoch_gets_a_reset_signal() {
    let e = engine();
    let s = e.open(None).unwrap();
    let old = append_n(&s, 0, 2, "old-");
    let again = e.reopen(s.id(), None).unwrap();
    assert!(again.epoch() > s.epoch());
    assert!(s.is_ended());
    append_n(&again, 0, 2, "new-");
    let d = resume(&e, Some(&again.id().to_string()), Some(&old[1].to_string()));
    assert_row(
        &d,
        SessionFact::Live,
        CursorFact::OlderEpoch,
        Verdict::FreshReset,
    );
    match d.action {
        ResumeAction::Fresh {
            session: Some(h),
            signal: Some(sig),
        } => {
            assert_eq!(h.epoch(), again.epoch());
            assert_eq!(sig.kind, SignalKind::Reset);
            assert_eq!(sig.cursor, Some(old[1]));
            assert!(sig.to_json().contains("\"reason\""));
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn future_sequence_and_future_epoch_are_rejected_409() {
    let e = engine();
    let s = e.open(None).unwrap();
    let ids = append_n(&s, 0, 2, "x");
    let beyond = EventId {
        seq: ids[1].seq + 1,
        ..ids[1]
    };
    let d = resume(&e, Some(&s.id().to_string()), Some(&beyond.to_string()));
    assert_row(&d, SessionFact::Live, CursorFact::Future, Verdict::Conflict);
    let newer = EventId {
        epoch: ids[1].epoch + 1,
        ..ids[1]
    };
    let d = resume(&e, Some(&s.id().to_string()), Some(&newer.to_string()));
    assert_row(&d, SessionFact::Live, CursorFact::Future, Verdict::Conflict);
}

#[test]
fn cursor_before_the_window_gets_a_gap_signal() {
    let e = engine();
    let s = e.open(None).unwrap();
    // At least the newest 8 are kept, at most one segment more: after 200
    // the first ones are gone.
    let ids = append_n(&s, 0, 200, "e");
    let d = resume(&e, Some(&s.id().to_string()), Some(&ids[2].to_string()));
    assert_row(
        &d,
        SessionFact::Live,
        CursorFact::BeforeWindow,
        Verdict::FreshGap,
    );
    match d.action {
        ResumeAction::Fresh {
            signal: Some(sig), ..
        } => {
            assert_eq!(sig.kind, SignalKind::Gap);
            let oldest = sig.oldest.expect("oldest retained id");
            assert!(oldest.seq > ids[2].seq + 1);
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn in_window_cursor_replays_exactly_its_stream_after_the_cursor() {
    let e = engine();
    let s = e.open(None).unwrap();
    let post = s.new_stream().unwrap();
    let a0 = s.append(post, b"p0").unwrap();
    s.append(0, b"get0").unwrap();
    s.append(post, b"p1").unwrap();
    s.append(0, b"get1").unwrap();
    s.append(post, b"p2").unwrap();
    let d = resume(&e, Some(&s.id().to_string()), Some(&a0.to_string()));
    assert_row(&d, SessionFact::Live, CursorFact::InWindow, Verdict::Resume);
    assert_eq!(drain(d), vec![b"p1".to_vec(), b"p2".to_vec()]);
}

#[test]
fn caught_up_cursor_replays_nothing_then_sees_new_events() {
    let e = engine();
    let s = e.open(None).unwrap();
    let last = s.append(0, b"a").unwrap();
    let d = resume(&e, Some(&s.id().to_string()), Some(&last.to_string()));
    assert_row(&d, SessionFact::Live, CursorFact::InWindow, Verdict::Resume);
    let ResumeAction::Replay(mut r) = d.action else {
        panic!()
    };
    let mut buf = Vec::new();
    assert_eq!(r.next_into(&mut buf).unwrap(), None);
    let next = s.append(0, b"b").unwrap();
    assert_eq!(r.next_into(&mut buf).unwrap(), Some(next));
    assert_eq!(buf, b"b");
}

#[test]
fn priming_cursor_resumes_everything_after_the_stream_opened() {
    let e = engine();
    let s = e.open(None).unwrap();
    s.append(0, b"before").unwrap();
    let stream = s.new_stream().unwrap();
    let reader = s.subscribe(stream);
    let priming = reader.position();
    s.append(stream, b"after-1").unwrap();
    s.append(stream, b"after-2").unwrap();
    let d = resume(&e, Some(&s.id().to_string()), Some(&priming.to_string()));
    assert_eq!(drain(d), vec![b"after-1".to_vec(), b"after-2".to_vec()]);
}

#[test]
fn unknown_closed_and_expired_sessions_are_gone_404() {
    let mut c = small_config();
    c.idle_ttl = Duration::from_millis(30);
    let e = Engine::new(c).unwrap();
    let never = SessionId::generate().to_string();
    let d = resume(&e, Some(&never), None);
    assert_row(&d, SessionFact::Unknown, CursorFact::Absent, Verdict::Gone);

    let closed = e.open(None).unwrap();
    let id = closed.append(0, b"x").unwrap();
    assert!(e.close(closed.id()));
    let d = resume(&e, Some(&closed.id().to_string()), Some(&id.to_string()));
    assert_row(
        &d,
        SessionFact::Unknown,
        CursorFact::Unchecked,
        Verdict::Gone,
    );
    match d.action {
        ResumeAction::Reject(r) => assert_eq!(r.http_status(), 404),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(
        closed.append(0, b"late"),
        Err(rewind_engine::AppendError::SessionEnded)
    );

    let idle = e.open(None).unwrap();
    std::thread::sleep(Duration::from_millis(120));
    let d = resume(&e, Some(&idle.id().to_string()), None);
    assert_row(&d, SessionFact::Unknown, CursorFact::Absent, Verdict::Gone);
    assert!(idle.is_ended());
}

#[test]
fn cursor_from_a_previous_boot_is_recognised() {
    let before = engine();
    let s = before.open(None).unwrap();
    let id = s.append(0, b"x").unwrap();
    let mut c = small_config();
    c.boot_epoch = Some(before.boot_epoch() + 1_000_000);
    let after = Engine::new(c).unwrap();
    let d = resume(&after, Some(&s.id().to_string()), Some(&id.to_string()));
    assert_row(
        &d,
        SessionFact::PreviousBoot,
        CursorFact::Unchecked,
        Verdict::Gone,
    );
}

#[test]
fn no_session_id_is_a_bad_request_and_a_malformed_one_is_gone() {
    let e = engine();
    let d = resume(&e, None, Some("0000000000000000-1-0-1"));
    assert_row(
        &d,
        SessionFact::Absent,
        CursorFact::Unchecked,
        Verdict::BadRequest,
    );
    let d = resume(&e, Some("not-a-session"), None);
    assert_row(
        &d,
        SessionFact::Malformed,
        CursorFact::Absent,
        Verdict::Gone,
    );
}

#[test]
fn another_principal_is_rejected_like_a_foreign_cursor() {
    let e = engine();
    let s = e.open(Some("alice")).unwrap();
    let id = s.append(0, b"alice's").unwrap();
    let (sid, cur) = (s.id().to_string(), id.to_string());
    for principal in [Some("bob"), None, Some("alic"), Some("alice ")] {
        let d = e.resume(ResumeRequest {
            session_id: Some(&sid),
            last_event_id: Some(&cur),
            principal,
        });
        assert_row(
            &d,
            SessionFact::WrongPrincipal,
            CursorFact::Unchecked,
            Verdict::Conflict,
        );
        assert!(matches!(d.action, ResumeAction::Reject(_)));
    }
    let d = e.resume(ResumeRequest {
        session_id: Some(&sid),
        last_event_id: Some(&cur),
        principal: Some("alice"),
    });
    assert_eq!(d.verdict, Verdict::Resume);
}

#[test]
fn verdicts_are_counted() {
    let e = engine();
    let s = e.open(None).unwrap();
    let sid = s.id().to_string();
    resume(&e, Some(&sid), None);
    resume(&e, Some(&sid), Some("junk"));
    resume(&e, None, None);
    let m = e.metrics();
    assert_eq!(m.resumes, 3);
    assert_eq!(m.verdict_count(Verdict::Fresh), 1);
    assert_eq!(m.verdict_count(Verdict::BadRequest), 2);
}
