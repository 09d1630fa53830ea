//! Session lifecycle, the pool, admission, eviction, bad input, and the
//! public types' auto traits.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rewind_engine::{
    AppendError, Attachment, Config, ConfigError, EndReason, Engine, OpenError, Replay,
    ReplayError, ResumeRequest, SessionHandle, SessionId,
};

/// Sessions that keep at least `events` events, in a pool of `global`
/// bytes, with small segments and events so small pools are valid.
fn config(events: u64, global: u64) -> Config {
    let mut c = Config::default();
    c.session_events = events;
    c.session_bytes = 1 << 30;
    c.global_bytes = global;
    c.max_segment_bytes = 4096;
    c.max_event_bytes = 16 * 1024;
    c
}

#[test]
fn bad_config_is_refused_with_the_setting_named() {
    let mut c = config(8, 1 << 20);
    c.session_events = 0;
    let e = Engine::new(c).unwrap_err();
    assert_eq!(
        e,
        ConfigError::ZeroRetention {
            setting: "session_events"
        }
    );
    assert!(e.to_string().contains("session_events"));
    let mut c = config(8, 1 << 20);
    c.max_segment_bytes = 1000;
    assert!(matches!(
        Engine::new(c).unwrap_err(),
        ConfigError::SegmentSize { .. }
    ));
    let mut c = config(8, 1 << 20);
    c.max_event_bytes = 4 << 20;
    let e = Engine::new(c).unwrap_err();
    assert!(matches!(e, ConfigError::PoolTooSmall { .. }), "{e}");
    assert!(e.to_string().contains("global_bytes"));
    let mut c = config(8, 1 << 20);
    c.max_sessions = 0;
    assert_eq!(
        Engine::new(c).unwrap_err(),
        ConfigError::ZeroCap {
            setting: "max_sessions"
        }
    );
    let mut c = config(8, 1 << 20);
    c.idle_ttl = Duration::ZERO;
    assert_eq!(Engine::new(c).unwrap_err(), ConfigError::ZeroTtl);
    assert!(
        Engine::new(Config::default()).is_ok(),
        "the defaults are valid"
    );
}

/// A pool larger than the operating system will map is a configuration
/// error that names the setting, not a panic. (Linux with its default
/// overcommit heuristic refuses a 2 TiB private mapping on any machine
/// with less memory and swap than that; where the mapping is granted, the
/// engine must simply start.)
#[test]
fn a_pool_the_os_will_not_map_is_refused_with_the_setting_named() {
    let mut c = Config::default();
    c.global_bytes = 2 << 40;
    match Engine::new(c) {
        Ok(engine) => assert!(engine.metrics().pool_bytes > 1 << 40),
        Err(e) => {
            assert!(matches!(e, ConfigError::PoolMemory { .. }), "{e}");
            assert!(e.to_string().contains("global_bytes"), "{e}");
        }
    }
}

#[test]
fn oversized_event_is_refused_and_consumes_nothing() {
    let e = Engine::new(config(8, 1 << 20)).unwrap();
    let s = e.open(None).unwrap();
    let a = s.append(0, b"a").unwrap();
    let err = s.append(0, &vec![0u8; 40_000]).unwrap_err();
    assert!(
        matches!(err, AppendError::TooLarge { len: 40_000, max } if max >= 16 * 1024),
        "{err}"
    );
    let b = s.append(0, b"b").unwrap();
    assert_eq!(
        b.seq,
        a.seq + 1,
        "a refused append must not consume a sequence number"
    );
    assert_eq!(s.append(u32::MAX, b"x"), Err(AppendError::BadStream));
    assert_eq!(e.metrics().appends_refused, 2);
    assert_eq!(e.metrics().appends, 2);
}

#[test]
fn an_event_larger_than_a_segment_gets_one_of_its_own_and_is_replayed_whole() {
    let e = Engine::new(config(8, 1 << 20)).unwrap();
    let s = e.open(None).unwrap();
    let before = s.append(1, b"small").unwrap();
    let big: Vec<u8> = (0..15_000u32).map(|i| i as u8).collect();
    s.append(1, &big).unwrap();
    s.append(1, b"after").unwrap();
    let mut r = s.subscribe_from(1, before).unwrap();
    let mut buf = Vec::new();
    r.next_into(&mut buf).unwrap().unwrap();
    assert_eq!(buf, big);
    r.next_into(&mut buf).unwrap().unwrap();
    assert_eq!(buf, b"after");
}

#[test]
fn an_idle_session_holds_no_pool_memory() {
    let e = Engine::new(config(8, 1 << 20)).unwrap();
    let sessions: Vec<_> = (0..1000).map(|_| e.open(None).unwrap()).collect();
    assert_eq!(e.metrics().bytes_held, 0, "nothing is reserved per session");
    sessions[0].append(0, &[7; 300]).unwrap();
    assert_eq!(
        e.metrics().bytes_held,
        512,
        "one event: one smallest segment"
    );
    assert_eq!(sessions[0].held_bytes(), 512);
}

#[test]
fn pool_pressure_evicts_idle_sessions_least_recently_active_first() {
    // 64 KiB of pool: about 120 sessions holding one event each.
    let e = Engine::new(config(8, 64 * 1024)).unwrap();
    let old = e.open(None).unwrap();
    old.append(0, b"oldest").unwrap();
    let busy = e.open(None).unwrap();
    busy.append(0, b"busy").unwrap();
    let reader = busy.subscribe(0);
    std::thread::sleep(Duration::from_millis(20));
    let mut flood = Vec::new();
    for i in 0..400u32 {
        let s = e.open(None).unwrap();
        s.append(0, &i.to_le_bytes()).unwrap();
        flood.push(s);
        let m = e.metrics();
        assert!(m.bytes_held <= m.pool_bytes, "memory stays inside the pool");
    }
    assert!(
        old.is_ended(),
        "the least recently active idle session goes first"
    );
    assert!(
        !busy.is_ended(),
        "a session with an open reader is never evicted"
    );
    assert!(!flood.last().unwrap().is_ended());
    let m = e.metrics();
    assert!(m.sessions_evicted >= 200, "{m:?}");
    assert!(e.session(old.id()).is_none());
    drop(reader);
}

#[test]
fn busy_sessions_lose_their_oldest_events_with_a_gap_not_their_session() {
    let e = Engine::new(config(1_000_000, 64 * 1024)).unwrap();
    let s = e.open(None).unwrap();
    let mut behind = s.subscribe(0);
    let _call = s.begin_call();
    // One busy session fills the whole pool: only its own oldest segments
    // can make room.
    for i in 0..4000u32 {
        s.append(0, &i.to_le_bytes()).unwrap();
    }
    assert!(!s.is_ended());
    let mut buf = Vec::new();
    assert!(matches!(
        behind.next_into(&mut buf),
        Err(ReplayError::Lagged { missing_seq: 1, .. })
    ));
    let oldest = behind.skip_gap();
    assert!(oldest > 1);
    assert!(behind.next_into(&mut buf).unwrap().is_some());
    let m = e.metrics();
    assert!(m.bytes_held <= m.pool_bytes);
    assert!(m.reader_gaps >= 1);
}

#[test]
fn memory_never_exceeds_the_pool_however_many_sessions_open() {
    let mut c = config(8, 64 * 1024);
    c.max_sessions = 2000;
    let e = Engine::new(c).unwrap();
    let refused = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                // 10× what the pool holds at one event per session.
                for i in 0..1200u32 {
                    match e.open(None) {
                        Ok(s) => match s.append(0, &[i as u8; 100]) {
                            Ok(_) | Err(AppendError::SessionEnded) => {}
                            Err(other) => panic!("{other}"),
                        },
                        Err(OpenError::TooManySessions { .. }) => {
                            refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        Err(other) => panic!("{other}"),
                    }
                    let m = e.metrics();
                    assert!(m.bytes_held <= m.pool_bytes);
                    assert!(m.sessions_live <= 2000);
                }
            });
        }
    });
    let m = e.metrics();
    assert!(m.sessions_evicted > 0 || m.sessions_refused > 0);
    assert_eq!(m.sessions_refused, refused.into_inner());
}

#[test]
fn session_caps_refuse_with_a_retry_hint() {
    let mut c = config(8, 1 << 20);
    c.max_sessions = 3;
    c.max_sessions_per_principal = 2;
    let e = Engine::new(c).unwrap();
    let a1 = e.open(Some("alice")).unwrap();
    let _a2 = e.open(Some("alice")).unwrap();
    let err = e.open(Some("alice")).unwrap_err();
    assert!(
        matches!(err, OpenError::PrincipalLimit { cap: 2, .. }),
        "{err}"
    );
    assert!(err.retry_after().is_some());
    let _b = e.open(Some("bob")).unwrap();
    let err = e.open(None).unwrap_err();
    assert!(
        matches!(err, OpenError::TooManySessions { cap: 3, .. }),
        "{err}"
    );
    a1.close();
    assert!(
        e.open(Some("alice")).is_ok(),
        "a closed session frees its slot"
    );
    assert_eq!(e.metrics().sessions_refused, 2);
}

#[test]
fn close_frees_the_pool_and_stops_readers() {
    let e = Engine::new(config(8, 1 << 20)).unwrap();
    let s = e.open(None).unwrap();
    let mut from_start = s.subscribe(0);
    s.append(0, b"one").unwrap();
    assert!(e.metrics().bytes_held > 0);
    let mut caught_up = s.subscribe(0);
    assert!(s.close());
    assert!(!s.close(), "ending twice is a no-op");
    assert_eq!(e.metrics().bytes_held, 0);
    let mut buf = Vec::new();
    assert_eq!(
        from_start.next_into(&mut buf),
        Err(ReplayError::SessionEnded)
    );
    assert_eq!(
        caught_up.wait_next(&mut buf, Duration::from_secs(5)),
        Err(ReplayError::SessionEnded)
    );
    assert_eq!(s.append(0, b"late"), Err(AppendError::SessionEnded));
}

/// After a burst, memory of segments that stayed free for a whole sweep
/// interval goes back to the operating system; sessions that then reuse
/// it, and the session that lived through it, read exactly what they
/// wrote.
#[test]
fn sweeps_give_back_memory_free_since_the_last_one_and_nothing_is_lost() {
    let mut c = config(1 << 20, 32 << 20);
    c.session_bytes = 256 << 10;
    c.max_segment_bytes = 64 << 10;
    let e = Engine::new(c).unwrap();
    let payload = |session: usize, i: usize| vec![(session * 31 + i) as u8; 1000];
    let fill = |session: usize| {
        let s = e.open(None).unwrap();
        for i in 0..200 {
            s.append(0, &payload(session, i)).unwrap();
        }
        s
    };
    let check = |s: &SessionHandle, session: usize| {
        let mut r = s.subscribe_from_start(0);
        let mut buf = Vec::new();
        let mut i = 0;
        while let Some(id) = r.next_into(&mut buf).unwrap() {
            assert_eq!(id.seq as usize, i + 1);
            assert_eq!(buf, payload(session, i), "session {session} event {i}");
            i += 1;
        }
        assert_eq!(i, 200, "session {session} kept everything");
    };
    let survivor = fill(0);
    let burst: Vec<_> = (1..=20).map(fill).collect();
    for s in &burst {
        s.close();
    }
    // What counts as released before any sweep: the part of the pool no
    // session has touched yet.
    let untouched = e.metrics().bytes_released;
    e.sweep();
    assert_eq!(
        e.metrics().bytes_released,
        untouched,
        "the first sweep only marks"
    );
    let reused = fill(21);
    e.sweep();
    let m = e.metrics();
    assert!(
        m.bytes_released >= untouched + 10 * (256 << 10),
        "most of the burst's segments are given back: {m:?}"
    );
    assert!(m.bytes_released + m.bytes_held <= m.pool_bytes);
    check(&survivor, 0);
    check(&reused, 21);
    // New sessions take the memory given back and read it as written.
    let after: Vec<_> = (22..42).map(fill).collect();
    for (k, s) in after.iter().enumerate() {
        check(s, 22 + k);
    }
    assert!(e.metrics().bytes_released < m.bytes_released);
    check(&survivor, 0);
}

#[test]
fn lagged_reader_gets_a_typed_error_then_skips_the_gap() {
    let e = Engine::new(config(4, 1 << 20)).unwrap();
    let s = e.open(None).unwrap();
    let mut r = s.subscribe(0);
    for i in 0..200u8 {
        s.append(0, &[i]).unwrap();
    }
    let mut buf = Vec::new();
    match r.next_into(&mut buf) {
        Err(ReplayError::Lagged { missing_seq, .. }) => assert_eq!(missing_seq, 1),
        other => panic!("expected lag, got {other:?}"),
    }
    let oldest = r.skip_gap();
    let mut seen = Vec::new();
    while let Some(id) = r.next_into(&mut buf).unwrap() {
        assert!(id.seq >= oldest);
        seen.push(buf[0]);
    }
    assert_eq!(seen.last(), Some(&199));
    assert!(seen.len() >= 4, "at least the retained events");
    assert!(seen.windows(2).all(|w| w[1] == w[0] + 1));
    assert_eq!(e.metrics().reader_gaps, 1);
}

/// Retention: 4 events; a place held may keep up to 64 KiB.
fn engine_with_holds() -> Engine {
    let mut c = config(4, 1 << 20);
    c.reader_hold_bytes = 64 << 10;
    Engine::new(c).unwrap()
}

#[test]
fn a_reader_that_holds_its_place_gets_a_burst_retention_alone_would_drop() {
    let e = engine_with_holds();
    let s = e.open(None).unwrap();
    let mut held = s.subscribe(0);
    assert!(held.hold());
    let burst_into = |s: &SessionHandle, from: u32| {
        for i in from..from + 200 {
            s.append(0, &i.to_le_bytes()).unwrap();
        }
    };
    let burst = |from: u32| burst_into(&s, from);
    // Nobody holds a place in another session: its reader meets a gap.
    let other = e.open(None).unwrap();
    let mut plain = other.subscribe(0);
    burst_into(&other, 0);
    assert!(matches!(
        plain.next_into(&mut Vec::new()),
        Err(ReplayError::Lagged { .. })
    ));
    burst(0);
    let mut buf = Vec::new();
    for i in 0..200u32 {
        let id = held
            .next_into(&mut buf)
            .unwrap()
            .expect("kept for the held reader");
        assert_eq!(
            (id.seq, buf.as_slice()),
            (u64::from(i) + 1, &i.to_le_bytes()[..])
        );
    }
    assert_eq!(held.next_into(&mut buf).unwrap(), None);
    // Read to the end: the window goes back to its retention at the next
    // sweep, with nothing appended since.
    let during = s.held_bytes();
    e.sweep();
    assert!(
        s.held_bytes() < during,
        "{} bytes after the sweep, {during} before",
        s.held_bytes()
    );
    // Past `reader_hold_bytes` the held reader lags too, and the session
    // stays within the cap (plus the segment being filled).
    for round in 1..=20 {
        burst(round * 200);
        assert!(s.held_bytes() <= (64 << 10) + 4096, "{}", s.held_bytes());
    }
    assert!(matches!(
        held.next_into(&mut buf),
        Err(ReplayError::Lagged { .. })
    ));
    // A dropped reader gives its place back: three can hold at once (a
    // `Hold` without a reader takes a slot too).
    drop(held);
    let mut a = s.subscribe(0);
    let mut b = s.subscribe(0);
    let mut fourth = s.subscribe(0);
    assert!(a.hold() && b.hold());
    let place = s.hold_after(0).expect("a third slot");
    assert!(!fourth.hold(), "every slot taken");
    drop(place);
    assert!(fourth.hold());
}

#[test]
fn a_place_held_without_a_reader_keeps_what_comes_after_it_until_it_moves() {
    let e = engine_with_holds();
    let s = e.open(None).unwrap();
    // A consumer that reads in rounds, each with a new reader (a cluster
    // node copying into Redis), holds its place between them.
    let place = s.hold_after(0).unwrap();
    for i in 0..100u32 {
        s.append(0, &i.to_le_bytes()).unwrap();
    }
    let mut round = s.subscribe_all(0);
    let mut buf = Vec::new();
    let mut copied = 0;
    while let Some(id) = round.next_into(&mut buf).unwrap() {
        assert_eq!(id.seq, copied + 1);
        copied = id.seq;
    }
    drop(round);
    assert_eq!(copied, 100, "nothing released before it was read");
    // Moved on: what it consumed may go; what follows is held again.
    place.advance(copied);
    e.sweep();
    let moved_on = s.held_bytes();
    for i in 100..200u32 {
        s.append(0, &i.to_le_bytes()).unwrap();
    }
    let mut round = s.subscribe_all(copied);
    assert!(
        matches!(round.next_into(&mut buf), Ok(Some(id)) if id.seq == 101),
        "held from where it moved to"
    );
    drop(round);
    let held = s.held_bytes();
    assert!(held > moved_on, "{held} ≤ {moved_on}");
    // Dropped: retention alone (4 events) applies at the next sweep.
    drop(place);
    e.sweep();
    assert!(s.held_bytes() < held, "{} ≥ {held}", s.held_bytes());
}

#[derive(Default)]
struct Observer {
    ended: Mutex<Vec<EndReason>>,
}

impl Attachment for Observer {
    fn ended(&self, why: EndReason) {
        self.ended.lock().unwrap().push(why);
    }
}

#[test]
fn attachments_hear_every_end_and_come_back_typed() {
    let mut c = config(8, 64 * 1024);
    c.idle_ttl = Duration::from_millis(30);
    let e = Engine::new(c).unwrap();
    let closed = e.open(None).unwrap();
    let expired = e.open(None).unwrap();
    let watchers: Vec<Arc<Observer>> = (0..2).map(|_| Arc::default()).collect();
    for (s, w) in [&closed, &expired].into_iter().zip(&watchers) {
        let weak: std::sync::Weak<Observer> = Arc::downgrade(w);
        assert!(s.attach(weak));
    }
    assert!(
        !closed.attach(Arc::downgrade(&watchers[1]) as std::sync::Weak<Observer>),
        "set once"
    );
    let back: Arc<Observer> = closed.attachment().expect("typed");
    assert!(Arc::ptr_eq(&back, &watchers[0]));
    closed.close();
    std::thread::sleep(Duration::from_millis(60));
    e.sweep();
    assert_eq!(*watchers[0].ended.lock().unwrap(), [EndReason::Closed]);
    assert_eq!(*watchers[1].ended.lock().unwrap(), [EndReason::Expired]);
    drop(watchers);
    assert!(expired.attachment::<Observer>().is_none(), "held weakly");
}

#[test]
fn subscribe_from_start_reports_events_already_gone_as_lagged() {
    let e = Engine::new(config(2, 1 << 20)).unwrap();
    let s = e.open(None).unwrap();
    for i in 0..100u8 {
        s.append(0, &[i]).unwrap();
    }
    let mut r = s.subscribe_from_start(0);
    let mut buf = Vec::new();
    assert!(matches!(
        r.next_into(&mut buf),
        Err(ReplayError::Lagged { .. })
    ));
    let oldest = r.skip_gap();
    assert!(r.next_into(&mut buf).unwrap().is_some());
    assert_eq!(u64::from(buf[0]) + 1, oldest);
}

#[test]
fn public_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Engine>();
    send_sync::<SessionHandle>();
    send::<Replay>();
    send::<rewind_engine::Waiter>();
    send_sync::<rewind_engine::CallGuard>();
    send_sync::<rewind_engine::ResumeDecision>();
}

#[test]
fn sweep_ends_idle_sessions_only() {
    let mut c = config(64, 1 << 20);
    c.idle_ttl = Duration::from_millis(50);
    let e = Engine::new(c).unwrap();
    let idle = e.open(None).unwrap();
    let busy = e.open(None).unwrap();
    for _ in 0..15 {
        std::thread::sleep(Duration::from_millis(10));
        busy.append(0, b"tick").unwrap();
    }
    assert_eq!(e.sweep(), 1);
    assert!(idle.is_ended());
    assert!(!busy.is_ended());
    assert_eq!(e.metrics().sessions_expired, 1);
}

#[test]
fn blocking_reader_wakes_on_append_from_another_thread() {
    let e = Engine::new(config(64, 1 << 20)).unwrap();
    let s = e.open(None).unwrap();
    let mut r = s.subscribe(0);
    let writer = {
        let s = s.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            s.append(0, b"hello").unwrap()
        })
    };
    let mut buf = Vec::new();
    let got = r.wait_next(&mut buf, Duration::from_secs(10)).unwrap();
    assert_eq!(got, Some(writer.join().unwrap()));
    assert_eq!(buf, b"hello");
    assert_eq!(
        r.wait_next(&mut buf, Duration::from_millis(10)).unwrap(),
        None
    );
}

/// Shared appenders pay no locked instruction for the wake-up check: the
/// parking reader announces itself on the word they claim on and waits
/// for a frame it finds claimed but not yet written. A reader that parks
/// the moment it has read everything, against two writers that each
/// append the moment it has: every round races the listen with an append
/// (and, every few rounds, with a segment roll). A lost wake-up shows as
/// a `wait_next` that times out. The race it would lose is a few
/// nanoseconds wide, so this checks the whole path end to end (listen,
/// announce, waiting out a frame being copied) rather than proves it: the
/// loom model `loom_a_shared_append_wakes_a_reader_that_announced_itself`
/// does that (and fails without the announcement).
#[test]
fn a_reader_racing_shared_appenders_is_woken_for_every_event() {
    const ROUNDS: u64 = 20_000;
    let e = Engine::new(config(64, 1 << 22)).unwrap();
    let s = e.open(None).unwrap();
    let mut r = s.subscribe(0);
    let (go, turns) = std::sync::mpsc::channel::<u64>();
    let turns = std::sync::Arc::new(std::sync::Mutex::new(turns));
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let (s, turns) = (s.clone(), turns.clone());
            std::thread::spawn(move || loop {
                let Ok(n) = turns.lock().unwrap().recv() else {
                    return;
                };
                let mut payload = n.to_le_bytes().to_vec();
                payload.resize(8 + (n % 5 * 40) as usize, w as u8);
                s.append(0, &payload).unwrap();
            })
        })
        .collect();
    let mut buf = Vec::new();
    for n in 0..ROUNDS {
        go.send(n).unwrap();
        let got = r.wait_next(&mut buf, Duration::from_secs(20)).unwrap();
        assert!(got.is_some(), "round {n}: no wake-up for an appended event");
        assert_eq!(buf[..8], n.to_le_bytes(), "round {n}");
    }
    drop(go);
    for w in writers {
        w.join().unwrap();
    }
}

#[test]
fn garbage_headers_never_panic() {
    let e = Engine::new(config(64, 1 << 20)).unwrap();
    let s = e.open(None).unwrap();
    let sid = s.id().to_string();
    let long = "a".repeat(10_000);
    let inputs: Vec<&str> = vec![
        "",
        " ",
        "\0",
        "\u{202e}",
        &long,
        "----",
        "ffffffffffffffff-ffffffffffffffff-ffffffff-ffffffffffffffff",
    ];
    for a in &inputs {
        for b in &inputs {
            let _ = e.resume(ResumeRequest {
                session_id: Some(a),
                last_event_id: Some(b),
                principal: Some(a),
            });
            let _ = e.resume(ResumeRequest {
                session_id: Some(&sid),
                last_event_id: Some(b),
                principal: None,
            });
        }
    }
    assert!(SessionId::parse(&long).is_err());
}

#[test]
fn delivered_events_are_counted_when_the_reader_catches_up_or_drops() {
    let e = Engine::new(config(256, 1 << 24)).unwrap();
    let s = e.open(None).unwrap();
    let mut caught_up = s.subscribe(0);
    let mut dropped = s.subscribe(0);
    for i in 0..100u8 {
        s.append(0, &[i; 10]).unwrap();
    }
    let mut buf = Vec::new();
    while caught_up.next_into(&mut buf).unwrap().is_some() {}
    assert_eq!(e.metrics().events_replayed, 100);
    assert_eq!(e.metrics().replayed_bytes, 1000);
    for _ in 0..70 {
        dropped.next_into(&mut buf).unwrap();
    }
    assert_eq!(e.metrics().events_replayed, 164, "reported per batch of 64");
    drop(dropped);
    assert_eq!(e.metrics().events_replayed, 170);
}

#[test]
fn subscribe_from_positions_only_by_ids_of_this_incarnation() {
    let e = Engine::new(config(64, 1 << 20)).unwrap();
    let s = e.open(None).unwrap();
    let other = e.open(None).unwrap();
    let first = s.append(0, b"one").unwrap();
    s.append(1, b"elsewhere").unwrap();
    s.append(0, b"two").unwrap();
    let mut buf = Vec::new();

    let mut r = s.subscribe_from(0, first).expect("an id of this session");
    assert!(r.next_into(&mut buf).unwrap().is_some());
    assert_eq!(buf, b"two");
    assert_eq!(r.next_into(&mut buf).unwrap(), None);

    let mut all = s.subscribe_from_start(0);
    assert!(all.next_into(&mut buf).unwrap().is_some());
    assert_eq!(buf, b"one");

    let foreign = other.append(0, b"x").unwrap();
    assert!(
        s.subscribe_from(0, foreign).is_none(),
        "another session's id"
    );
    assert!(
        s.subscribe_from(1, first).is_none(),
        "an id of another stream"
    );
    let mut future = first;
    future.seq = 1_000;
    assert!(s.subscribe_from(0, future).is_none(), "not issued yet");
    let reopened = e.reopen(s.id(), None).unwrap();
    assert!(
        reopened.subscribe_from(0, first).is_none(),
        "an older incarnation"
    );
}
