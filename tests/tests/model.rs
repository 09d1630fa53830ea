//! Randomised operation scripts against the engine, checked against a tiny
//! obviously-correct model.
//!
//! The model keeps, per session incarnation, the list of events appended
//! (id, stream, payload). Every payload names its origin (session slot,
//! epoch, stream, counter), so whatever a resume delivers can be traced back.
//! After every resume the script checks:
//!
//! - no delivered event belongs to another session or another epoch;
//! - the verdict is the one the decision table (`docs/decision-table.md`)
//!   gives for the model's facts;
//! - a resume delivers exactly the model's events of the cursor's stream
//!   after the cursor, each once, in order — or the engine said "gap";
//! - retention keeps at least the newest `SLOTS` events of a session (16
//!   in the second run, where the engine grows a session's segments to
//!   hold several of the hog's large events);
//! - under pool pressure (floods of sessions, a busy session filling the
//!   pool) only idle sessions are evicted, an evicted session is gone
//!   everywhere (appends refused, resumes 404), and a busy session loses
//!   its oldest events (a gap), never its session;
//! - sessions opened for a single writer behave the same through their
//!   `SessionWriter` (shared appends refused while it lives, taken once it
//!   is dropped), and however scripts close, evict, restart or drop them,
//!   closing everything at the end leaves no pool byte held.

use std::collections::HashMap;

use proptest::prelude::*;
use rewind_engine::{
    AppendError, Config, Engine, EventId, ResumeAction, ResumeRequest, SessionHandle,
    SessionWriter, Verdict,
};

const SLOTS: usize = 8;
/// Events kept per session in the run where segments grow for large
/// events: the engine does that only from 16 kept events on.
const GROWN_SLOTS: usize = 16;

#[derive(Debug, Clone)]
enum CursorPick {
    None,
    /// The n-th (mod len) event of the presented session's current epoch.
    Own(usize),
    /// The priming cursor of a fresh stream on the presented session.
    Priming,
    /// An event of another session.
    Foreign(usize, usize),
    /// An event of an earlier incarnation of the presented session.
    OldEpoch(usize),
    /// The presented session's tag and epoch, past its high-water mark.
    Future(u64),
    /// Arbitrary bytes.
    Garbage(String),
}

#[derive(Debug, Clone)]
enum Op {
    Open,
    /// Open a session for a single writer: appends go through its writer.
    OpenSingle,
    /// Drop a single-writer session's writer: the session then takes
    /// appends from anyone.
    DropWriter(usize),
    /// Append `n` events on `stream`, from one or two threads at once.
    Append {
        session: usize,
        stream: u32,
        n: usize,
        two_threads: bool,
    },
    Resume {
        session: usize,
        cursor: CursorPick,
    },
    Close(usize),
    Reopen(usize),
    Restart,
    /// Open this many anonymous sessions holding one event each: pool
    /// pressure.
    Flood(usize),
    /// A session with a call in flight appends this many large events:
    /// it alone can fill the pool.
    Hog {
        session: usize,
        n: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let cursor = prop_oneof![
        1 => Just(CursorPick::None),
        4 => any::<usize>().prop_map(CursorPick::Own),
        1 => Just(CursorPick::Priming),
        2 => (any::<usize>(), any::<usize>()).prop_map(|(s, e)| CursorPick::Foreign(s, e)),
        1 => any::<usize>().prop_map(CursorPick::OldEpoch),
        1 => (1u64..1000).prop_map(CursorPick::Future),
        1 => "\\PC{0,80}".prop_map(CursorPick::Garbage),
    ];
    prop_oneof![
        2 => Just(Op::Open),
        1 => Just(Op::OpenSingle),
        1 => (0usize..6).prop_map(Op::DropWriter),
        6 => (0usize..6, 0u32..3, 1usize..12, any::<bool>())
            .prop_map(|(session, stream, n, two_threads)| Op::Append { session, stream, n, two_threads }),
        6 => (0usize..6, cursor).prop_map(|(session, cursor)| Op::Resume { session, cursor }),
        1 => (0usize..6).prop_map(Op::Close),
        1 => (0usize..6).prop_map(Op::Reopen),
        1 => Just(Op::Restart),
        1 => (1usize..400).prop_map(Op::Flood),
        1 => (0usize..6, 1usize..200).prop_map(|(session, n)| Op::Hog { session, n }),
    ]
}

#[derive(Debug, Clone)]
struct ModelEvent {
    id: EventId,
    stream: u32,
    payload: Vec<u8>,
}

/// One session slot of the model: its current incarnation and history.
struct ModelSession {
    handle: SessionHandle,
    /// The session's single writer while it lives.
    writer: Option<SessionWriter>,
    live: bool,
    events: Vec<ModelEvent>,
    old_epochs: Vec<ModelEvent>,
    counter: u64,
}

struct World {
    engine: Engine,
    /// Events retained per session (`Config::session_events`).
    slots: usize,
    sessions: Vec<ModelSession>,
    /// Every event ever appended, by id, with the slot and epoch it belongs to.
    origin: HashMap<Vec<u8>, (usize, u64)>,
}

fn config(boot: u64, slots: usize) -> Config {
    let mut c = Config::default();
    c.session_events = slots as u64;
    c.session_bytes = 1 << 30; // the event count is the limit
                               // About 450 smallest segments: floods and hogs fill it.
    c.global_bytes = 256 * 1024;
    c.max_segment_bytes = 2048;
    c.max_event_bytes = 8 * 1024;
    c.boot_epoch = Some(boot);
    // A key that survives restarts, as with file-backed storage: cursors of
    // an earlier process stay attributable to their session.
    c.tag_key = Some(rewind_engine::TagKey::from_bytes([7; 16]));
    c
}

impl World {
    fn new(slots: usize) -> World {
        World {
            engine: Engine::new(config(1 << 40, slots)).unwrap(),
            slots,
            sessions: Vec::new(),
            origin: HashMap::new(),
        }
    }

    fn run(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Open => {
                let handle = self.engine.open(None).unwrap();
                self.sessions.push(ModelSession {
                    handle,
                    writer: None,
                    live: true,
                    events: vec![],
                    old_epochs: vec![],
                    counter: 0,
                });
            }
            Op::OpenSingle => {
                let writer = self.engine.open_single_writer(None).unwrap();
                self.sessions.push(ModelSession {
                    handle: writer.handle().clone(),
                    writer: Some(writer),
                    live: true,
                    events: vec![],
                    old_epochs: vec![],
                    counter: 0,
                });
            }
            Op::DropWriter(i) => {
                if let Some(slot) = self.pick(*i) {
                    self.sessions[slot].writer = None;
                }
            }
            Op::Append {
                session,
                stream,
                n,
                two_threads: _,
            } if self
                .pick(*session)
                .is_some_and(|slot| self.sessions[slot].writer.is_some()) =>
            {
                let slot = self.pick(*session).unwrap();
                let s = &mut self.sessions[slot];
                let w = s.writer.as_mut().unwrap();
                if s.live && !s.handle.is_ended() {
                    prop_assert_eq!(
                        s.handle.append(*stream, b"stray"),
                        Err(AppendError::SingleWriter)
                    );
                }
                let epoch = s.handle.epoch();
                let mut refused = false;
                for _ in 0..*n {
                    let k = s.counter;
                    s.counter += 1;
                    let p = format!("{slot}:{epoch}:{stream}:{k}").into_bytes();
                    match w.append(*stream, &p) {
                        Ok(id) => {
                            prop_assert!(!refused, "an append after a refusal succeeded");
                            self.origin.insert(p.clone(), (slot, epoch));
                            s.events.push(ModelEvent {
                                id,
                                stream: *stream,
                                payload: p,
                            });
                        }
                        Err(e) => {
                            prop_assert_eq!(e, AppendError::SessionEnded);
                            prop_assert!(
                                !s.live || s.handle.is_ended(),
                                "refused on a live session"
                            );
                            refused = true;
                        }
                    }
                }
                for (i, e) in s.events.iter().enumerate() {
                    prop_assert_eq!(e.id.seq, i as u64 + 1);
                }
            }
            Op::Append {
                session,
                stream,
                n,
                two_threads,
            } => {
                let Some(slot) = self.pick(*session) else {
                    return Ok(());
                };
                let s = &mut self.sessions[slot];
                if !s.live {
                    let refused = s.handle.append(*stream, b"late");
                    // After a restart the handle belongs to the old engine.
                    if s.handle.is_ended() {
                        prop_assert_eq!(refused, Err(rewind_engine::AppendError::SessionEnded));
                    }
                    return Ok(());
                }
                let base = s.counter;
                s.counter += *n as u64 * 2;
                let epoch = s.handle.epoch();
                let payload = |k: u64| format!("{slot}:{epoch}:{stream}:{k}").into_bytes();
                let writer = |from: u64| {
                    let h = s.handle.clone();
                    move || -> Vec<ModelEvent> {
                        (from..from + *n as u64)
                            .map(|k| {
                                let p = payload(k);
                                let res = h.append(*stream, &p);
                                (res, p)
                            })
                            .filter_map(|(res, p)| {
                                res.ok().map(|id| ModelEvent {
                                    id,
                                    stream: *stream,
                                    payload: p,
                                })
                            })
                            .collect()
                    }
                };
                let mut appended = if *two_threads {
                    std::thread::scope(|scope| {
                        let a = scope.spawn(writer(base));
                        let b = scope.spawn(writer(base + *n as u64));
                        let mut v = a.join().unwrap();
                        v.extend(b.join().unwrap());
                        v
                    })
                } else {
                    writer(base)()
                };
                let want = *n * if *two_threads { 2 } else { 1 };
                if appended.len() < want {
                    // Only an eviction (pool pressure from a flood) may
                    // refuse appends to a live session.
                    prop_assert!(s.handle.is_ended(), "appends refused on a live session");
                }
                appended.sort_by_key(|e| e.id.seq);
                for e in &appended {
                    self.origin.insert(e.payload.clone(), (slot, epoch));
                }
                s.events.extend(appended);
                // Sequence numbers are dense and unique within an epoch.
                for (i, e) in s.events.iter().enumerate() {
                    prop_assert_eq!(e.id.seq, i as u64 + 1);
                }
            }
            Op::Close(i) => {
                if let Some(slot) = self.pick(*i) {
                    let s = &mut self.sessions[slot];
                    prop_assert_eq!(self.engine.close(s.handle.id()), s.live);
                    s.live = false;
                }
            }
            Op::Reopen(i) => {
                if let Some(slot) = self.pick(*i) {
                    let s = &mut self.sessions[slot];
                    let handle = self.engine.reopen(s.handle.id(), None).unwrap();
                    prop_assert!(handle.epoch() > s.handle.epoch());
                    s.old_epochs.append(&mut s.events);
                    s.handle = handle;
                    // The new incarnation is an ordinary session; the old
                    // writer is refused from now on.
                    if let Some(mut w) = s.writer.take() {
                        prop_assert_eq!(w.append(0, b"old"), Err(AppendError::SessionEnded));
                    }
                    s.live = true;
                }
            }
            Op::Restart => {
                let boot = self.engine.boot_epoch() + (1 << 30);
                let old = std::mem::replace(
                    &mut self.engine,
                    Engine::new(config(boot, self.slots)).unwrap(),
                );
                for s in &mut self.sessions {
                    // The process died: its sessions are gone with it.
                    old.close(s.handle.id());
                    s.live = false;
                    s.writer = None;
                }
                old.close_all();
                prop_assert_eq!(old.metrics().bytes_held, 0, "a closed engine holds nothing");
            }
            Op::Resume { session, cursor } => self.resume(*session, cursor)?,
            Op::Flood(n) => {
                let mut newest = None;
                for _ in 0..*n {
                    let h = self.engine.open(None).unwrap();
                    h.append(9, &[b'f'; 200]).unwrap();
                    newest = Some(h);
                }
                if let Some(h) = newest {
                    prop_assert!(!h.is_ended(), "the newest session is evicted last");
                }
            }
            Op::Hog { session, n } => {
                let Some(slot) = self.pick(*session) else {
                    return Ok(());
                };
                let s = &mut self.sessions[slot];
                if !s.live || s.handle.is_ended() {
                    return Ok(());
                }
                if s.writer.is_some() {
                    return Ok(());
                }
                let _call = s.handle.begin_call();
                let epoch = s.handle.epoch();
                for _ in 0..*n {
                    let k = s.counter;
                    s.counter += 1;
                    let mut p = format!("{slot}:{epoch}:1:{k}:").into_bytes();
                    p.resize(1500, b'h');
                    let id = s.handle.append(1, &p);
                    prop_assert!(id.is_ok(), "a busy session's append failed: {:?}", id);
                    self.origin.insert(p.clone(), (slot, epoch));
                    s.events.push(ModelEvent {
                        id: id.unwrap(),
                        stream: 1,
                        payload: p,
                    });
                }
                prop_assert!(!s.handle.is_ended(), "a busy session was evicted");
            }
        }
        // Evictions end sessions behind the model's back: follow them.
        for s in &mut self.sessions {
            if s.live && s.handle.is_ended() {
                s.live = false;
            }
        }
        Ok(())
    }

    /// Ends every session, drops every writer: nothing may stay held.
    fn finish(&mut self) -> Result<(), TestCaseError> {
        self.engine.close_all();
        prop_assert!(
            self.sessions.iter().all(|s| s.handle.is_ended()),
            "close_all left a session"
        );
        for s in &mut self.sessions {
            s.writer = None;
        }
        prop_assert_eq!(self.engine.metrics().bytes_held, 0, "pool bytes leaked");
        Ok(())
    }

    fn pick(&self, i: usize) -> Option<usize> {
        (!self.sessions.is_empty()).then(|| i % self.sessions.len())
    }

    fn resume(&mut self, i: usize, pick: &CursorPick) -> Result<(), TestCaseError> {
        let Some(slot) = self.pick(i) else {
            return Ok(());
        };
        let s = &self.sessions[slot];
        let high_water = s.events.len() as u64;
        let (cursor, expected): (Option<String>, Verdict) = match pick {
            CursorPick::None => (None, Verdict::Fresh),
            CursorPick::Own(n) if !s.events.is_empty() => {
                let c = s.events[n % s.events.len()].id;
                // The newest `slots` events are always retained; older
                // ones may be (at most one segment more): then the engine's
                // oldest retained event decides, checked below.
                let slots = self.slots as u64;
                let surely_held = c.seq + 1 + slots > high_water;
                let oldest = self.engine.facts(ResumeRequest {
                    session_id: Some(&s.handle.id().to_string()),
                    last_event_id: Some(&c.to_string()),
                    principal: None,
                });
                if s.live && high_water >= slots {
                    prop_assert!(
                        oldest.oldest_retained <= high_water + 1 - slots,
                        "fewer than {} events retained: {:?}",
                        slots,
                        oldest
                    );
                }
                let in_window = surely_held || c.seq + 1 >= oldest.oldest_retained;
                (
                    Some(c.to_string()),
                    if in_window {
                        Verdict::Resume
                    } else {
                        Verdict::FreshGap
                    },
                )
            }
            CursorPick::Own(_) | CursorPick::Priming => {
                let c = s.handle.cursor_now(s.handle.new_stream().unwrap_or(0));
                (Some(c.to_string()), Verdict::Resume)
            }
            CursorPick::Foreign(o, n) => {
                let other = o % self.sessions.len();
                let events = &self.sessions[other].events;
                if other == slot || events.is_empty() {
                    return Ok(());
                }
                (
                    Some(events[n % events.len()].id.to_string()),
                    Verdict::Conflict,
                )
            }
            CursorPick::OldEpoch(n) if !s.old_epochs.is_empty() => (
                Some(s.old_epochs[n % s.old_epochs.len()].id.to_string()),
                Verdict::FreshReset,
            ),
            CursorPick::OldEpoch(_) => return Ok(()),
            CursorPick::Future(k) => {
                let c = s.handle.cursor_now(0);
                (
                    Some(
                        EventId {
                            seq: c.seq + k,
                            ..c
                        }
                        .to_string(),
                    ),
                    Verdict::Conflict,
                )
            }
            CursorPick::Garbage(g) => {
                let expected = if EventId::parse(g).is_ok() {
                    Verdict::Conflict
                } else {
                    Verdict::BadRequest
                };
                (Some(g.clone()), expected)
            }
        };
        let sid = s.handle.id().to_string();
        let d = self.engine.resume(ResumeRequest {
            session_id: Some(&sid),
            last_event_id: cursor.as_deref(),
            principal: None,
        });
        let expected = if s.live { expected } else { Verdict::Gone };
        prop_assert_eq!(
            d.verdict,
            expected,
            "facts {:?} cursor {:?}",
            d.facts,
            cursor
        );
        let ResumeAction::Replay(mut replay) = d.action else {
            prop_assert!(expected != Verdict::Resume);
            return Ok(());
        };
        let c = EventId::parse(cursor.as_deref().unwrap()).unwrap();
        let want: Vec<&ModelEvent> = s
            .events
            .iter()
            .filter(|e| e.stream == c.stream && e.id.seq > c.seq)
            .collect();
        let mut got = Vec::new();
        let mut buf = Vec::new();
        loop {
            match replay.next_into(&mut buf) {
                Ok(Some(id)) => {
                    // The invariant: the event is the presented session's,
                    // current epoch, never anyone else's.
                    let origin = self.origin.get(&buf).copied();
                    prop_assert_eq!(
                        origin,
                        Some((slot, s.handle.epoch())),
                        "foreign event delivered"
                    );
                    got.push((id, buf.clone()));
                }
                Ok(None) => break,
                Err(e) => {
                    // A gap is allowed only if it is reported; nothing here
                    // appends concurrently, so it must not happen at all.
                    return Err(TestCaseError::fail(format!("unexpected replay error {e}")));
                }
            }
        }
        prop_assert_eq!(got.len(), want.len(), "exactly once");
        for ((id, payload), w) in got.iter().zip(&want) {
            prop_assert_eq!(*id, w.id);
            prop_assert_eq!(payload, &w.payload);
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn engine_matches_model(ops in proptest::collection::vec(op(), 1..60)) {
        let mut world = World::new(SLOTS);
        for op in &ops {
            world.run(op)?;
        }
        world.finish()?;
    }

    /// The same scripts where sessions keep 16 events: the hog's 1,500-byte
    /// events then make the engine grow its segments past
    /// `max_segment_bytes` (2 KiB) to hold four of them, so retention,
    /// eviction and every resume run over chains of grown segments too.
    #[test]
    fn engine_matches_model_with_segments_grown_for_large_events(
        ops in proptest::collection::vec(op(), 1..60)
    ) {
        let mut world = World::new(GROWN_SLOTS);
        for op in &ops {
            world.run(op)?;
        }
        world.finish()?;
    }
}

/// Resumes racing appends: every resume either delivers a consistent,
/// in-order prefix of the stream's own events or reports a gap; never a
/// foreign byte.
#[test]
fn resumes_racing_two_appenders_never_cross_sessions() {
    let engine = Engine::new(config(1 << 40, SLOTS)).unwrap();
    let a = engine.open(None).unwrap();
    let b = engine.open(None).unwrap();
    a.append(0, b"a:start").unwrap();
    b.append(0, b"b:start").unwrap();
    std::thread::scope(|scope| {
        for (h, tag) in [(&a, "a"), (&b, "b"), (&a, "a")] {
            scope.spawn(move || {
                for i in 0..2000 {
                    h.append(0, format!("{tag}:{i}").as_bytes()).unwrap();
                }
            });
        }
        scope.spawn(|| {
            let sid_b = b.id().to_string();
            let sid_a = a.id().to_string();
            let mut buf = Vec::new();
            for _ in 0..2000 {
                let cursor = a.cursor_now(0).to_string();
                // B presents A's cursor: always refused.
                let d = engine.resume(ResumeRequest {
                    session_id: Some(&sid_b),
                    last_event_id: Some(&cursor),
                    principal: None,
                });
                assert_eq!(d.verdict, Verdict::Conflict);
                // A presents its own: replay only A's bytes, in order.
                let d = engine.resume(ResumeRequest {
                    session_id: Some(&sid_a),
                    last_event_id: Some(&cursor),
                    principal: None,
                });
                if let ResumeAction::Replay(mut r) = d.action {
                    let mut last = 0;
                    for _ in 0..64 {
                        match r.next_into(&mut buf) {
                            Ok(Some(id)) => {
                                assert!(
                                    buf.starts_with(b"a:"),
                                    "foreign bytes {:?}",
                                    String::from_utf8_lossy(&buf)
                                );
                                assert!(id.seq > last);
                                last = id.seq;
                            }
                            Ok(None) | Err(_) => break,
                        }
                    }
                }
            }
        });
    });
}
