//! What a cluster node needs from its engine: ids that name the node, a
//! reader of every stream in sequence order (to copy a session's events to
//! the shared tier), sessions adopted from a node that died, and decisions
//! on facts the embedding established itself.

use rewind_engine::{
    Config, CursorFact, Engine, EventId, OpenError, ReplayError, ResumeAction, ResumeFacts,
    ResumeRequest, SessionFact, SessionId, Verdict,
};

fn node(n: u16) -> Engine {
    let mut c = Config::default();
    c.node = n;
    c.session_events = 64;
    c.session_bytes = 1 << 20;
    c.global_bytes = 8 << 20;
    c.max_segment_bytes = 4096;
    c.max_event_bytes = 16 * 1024;
    Engine::new(c).unwrap()
}

#[test]
fn a_node_mints_format_2_ids_and_refuses_other_nodes_cursors_as_foreign() {
    let engine = node(7);
    let s = engine.open(None).unwrap();
    let id = s.append(3, b"x").unwrap();
    assert_eq!(id.node, 7);
    let text = id.to_string();
    assert_eq!(text.split('-').count(), 5, "{text}");
    assert_eq!(EventId::parse(&text).unwrap(), id);
    let sid = s.id().to_string();
    let mine = engine.facts(ResumeRequest {
        session_id: Some(&sid),
        last_event_id: Some(&text),
        principal: None,
    });
    assert_eq!(mine.cursor_fact(), Some(CursorFact::InWindow));
    let other = EventId { node: 8, ..id }.to_string();
    let theirs = engine.facts(ResumeRequest {
        session_id: Some(&sid),
        last_event_id: Some(&other),
        principal: None,
    });
    assert_eq!(theirs.cursor_fact(), Some(CursorFact::Foreign));
}

#[test]
fn subscribe_all_reads_every_stream_once_in_sequence_order() {
    let engine = node(1);
    let s = engine.open(None).unwrap();
    let mut appended = Vec::new();
    // Fewer than the session retains.
    for i in 0..60u32 {
        let stream = i % 5;
        let id = s.append(stream, format!("e{i}").as_bytes()).unwrap();
        appended.push((id, format!("e{i}")));
    }
    // From the start, and from the middle.
    for after in [0u64, 37] {
        let mut r = s.subscribe_all(after);
        let mut buf = Vec::new();
        let mut got = Vec::new();
        while let Some(id) = r.next_into(&mut buf).unwrap() {
            got.push((id, String::from_utf8(buf.clone()).unwrap()));
        }
        let want: Vec<_> = appended
            .iter()
            .filter(|(id, _)| id.seq > after)
            .cloned()
            .collect();
        assert_eq!(got, want, "after {after}");
    }
}

#[test]
fn subscribe_all_reports_events_released_before_they_were_read() {
    let engine = node(1);
    let s = engine.open(None).unwrap();
    let mut r = s.subscribe_all(0);
    for i in 0..2000u32 {
        s.append(i % 3, &[7u8; 100]).unwrap();
    }
    let mut buf = Vec::new();
    match r.next_into(&mut buf) {
        Err(ReplayError::Lagged { missing_seq, .. }) => assert_eq!(missing_seq, 1),
        other => panic!("expected a gap, got {other:?}"),
    }
    let oldest = r.skip_gap();
    assert!(oldest > 1);
    let first = r.next_into(&mut buf).unwrap().unwrap();
    assert_eq!(first.seq, oldest);
}

#[test]
fn an_adopted_session_numbers_its_events_after_the_shared_tiers_and_keeps_tag_and_epoch() {
    let engine = node(3);
    let id = SessionId::generate();
    let s = engine.adopt(id, 0xabc, 77, Some("alice"), 40).unwrap();
    assert_eq!(s.high_water(), 40);
    assert_eq!(s.epoch(), 77);
    assert_eq!(s.principal(), Some("alice"));
    let e = s.append(2, b"after").unwrap();
    assert_eq!(
        (e.tag, e.node, e.epoch, e.stream, e.seq),
        (0xabc, 3, 77, 2, 41)
    );
    let sid = id.to_string();
    let resume = |cursor: EventId| {
        engine.resume(ResumeRequest {
            session_id: Some(&sid),
            last_event_id: Some(&cursor.to_string()),
            principal: Some("alice"),
        })
    };
    // The priming position of a fresh stream after the adoption resumes.
    let d = resume(EventId { seq: 40, ..e });
    assert_eq!(d.verdict, Verdict::Resume);
    let ResumeAction::Replay(mut r) = d.action else {
        panic!("expected a replay")
    };
    let mut buf = Vec::new();
    assert_eq!(r.next_into(&mut buf).unwrap(), Some(e));
    assert_eq!(buf, b"after");
    // Before the adoption: not held here (the shared tier has it).
    assert_eq!(
        resume(EventId { seq: 38, ..e }).facts.cursor_fact(),
        Some(CursorFact::BeforeWindow)
    );
    // The adopted id is taken now.
    assert_eq!(
        engine.adopt(id, 0xabc, 77, Some("alice"), 40).unwrap_err(),
        OpenError::IdTaken
    );
}

#[test]
fn decide_clamps_facts_from_elsewhere_to_the_safe_set() {
    let engine = node(1);
    for (session, cursor, want) in [
        (SessionFact::Remote, CursorFact::InWindow, Verdict::Resume),
        (SessionFact::Remote, CursorFact::Foreign, Verdict::Conflict),
        (
            SessionFact::OwnerLost,
            CursorFact::OlderEpoch,
            Verdict::FreshReset,
        ),
        (
            SessionFact::OwnerLost,
            CursorFact::BeforeWindow,
            Verdict::FreshGap,
        ),
        (SessionFact::Unknown, CursorFact::Unchecked, Verdict::Gone),
        (
            SessionFact::WrongPrincipal,
            CursorFact::Absent,
            Verdict::Conflict,
        ),
    ] {
        let d = engine.decide(ResumeFacts::new(session, cursor));
        assert_eq!(d.verdict, want, "{session:?} {cursor:?}");
        assert!(d.facts.allowed.contains(want));
        assert!(!d.reason().is_empty());
    }
}

#[test]
fn close_all_ends_every_session() {
    let engine = node(1);
    let a = engine.open(None).unwrap();
    let b = engine.open(None).unwrap();
    assert_eq!(engine.close_all(), 2);
    assert!(a.is_ended() && b.is_ended());
    assert_eq!(engine.close_all(), 0);
}
