//! Session lifecycle, budgets, bad input, and the public types' auto traits.

use std::time::Duration;

use rewind_engine::{
    AppendError, Config, ConfigError, Engine, OpenError, Replay, ReplayError, ResumeRequest,
    SessionHandle, SessionId,
};

fn config(slots: usize, bytes: usize, global: u64) -> Config {
    let mut c = Config::default();
    c.ring_slots = slots;
    c.session_bytes = bytes;
    c.global_bytes = global;
    c
}

#[test]
fn public_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Engine>();
    send_sync::<SessionHandle>();
    send::<Replay>();
    send_sync::<rewind_engine::ResumeDecision>();
}

#[test]
fn bad_config_is_refused_with_the_setting_named() {
    let e = Engine::new(config(3, 1024, 1 << 20)).unwrap_err();
    assert!(matches!(e, ConfigError::Ring { .. }), "{e}");
    let e = Engine::new(config(8, 1000, 1 << 20)).unwrap_err();
    assert!(matches!(e, ConfigError::Ring { .. }), "{e}");
    let e = Engine::new(config(8, 1024, 10)).unwrap_err();
    assert!(matches!(e, ConfigError::GlobalBudgetTooSmall { .. }), "{e}");
    assert!(e.to_string().contains("global_bytes"));
    let mut c = config(8, 1024, 1 << 20);
    c.idle_ttl = Duration::ZERO;
    assert_eq!(Engine::new(c).unwrap_err(), ConfigError::ZeroTtl);
}

#[test]
fn oversized_event_is_refused_and_consumes_nothing() {
    let e = Engine::new(config(8, 1024, 1 << 20)).unwrap();
    let s = e.open(None).unwrap();
    let a = s.append(0, b"a").unwrap();
    let err = s.append(0, &vec![0u8; 4096]).unwrap_err();
    assert!(
        matches!(err, AppendError::TooLarge { len: 4096, .. }),
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
}

#[test]
fn global_budget_evicts_least_recently_active_sessions() {
    let probe = Engine::new(config(8, 1024, 1 << 30)).unwrap();
    let s = probe.open(None).unwrap();
    let per_session = probe.metrics().bytes_held;
    assert!(per_session >= 1024);
    drop(s);
    let e = Engine::new(config(8, 1024, per_session * 4)).unwrap();
    let old = e.open(None).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let others: Vec<_> = (0..3).map(|_| e.open(None).unwrap()).collect();
    for o in &others {
        o.append(0, b"keep me").unwrap();
    }
    assert_eq!(e.metrics().bytes_held, per_session * 4);
    let newest = e.open(None).unwrap();
    assert!(
        old.is_ended(),
        "the least recently active session is evicted first"
    );
    assert!(!newest.is_ended());
    let m = e.metrics();
    assert!(m.sessions_evicted >= 1);
    assert!(
        m.bytes_held <= per_session * 4,
        "memory stays inside the budget"
    );
    assert_eq!(m.sessions_live * per_session, m.bytes_held);
    assert!(e.session(old.id()).is_none());
}

#[test]
fn budget_never_exceeded_under_churn() {
    let probe = Engine::new(config(4, 256, 1 << 30)).unwrap();
    let per = {
        let _s = probe.open(None).unwrap();
        probe.metrics().bytes_held
    };
    let e = Engine::new(config(4, 256, per * 10)).unwrap();
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                for i in 0..500u32 {
                    match e.open(None) {
                        Ok(s) => {
                            let _ = s.append(0, &i.to_le_bytes());
                        }
                        Err(OpenError::OverBudget { .. }) => {}
                        Err(other) => panic!("{other}"),
                    }
                    assert!(e.metrics().bytes_held <= per * 10);
                }
            });
        }
    });
    let m = e.metrics();
    assert!(m.bytes_held <= per * 10);
    assert_eq!(m.sessions_live * per, m.bytes_held);
}

#[test]
fn close_frees_budget_and_stops_readers() {
    let e = Engine::new(config(8, 1024, 1 << 20)).unwrap();
    let s = e.open(None).unwrap();
    assert!(e.metrics().bytes_held > 0);
    let mut from_start = s.subscribe(0);
    s.append(0, b"one").unwrap();
    let mut caught_up = s.subscribe(0);
    assert!(s.close());
    assert!(!s.close(), "ending twice is a no-op");
    assert_eq!(e.metrics().bytes_held, 0);
    let mut buf = Vec::new();
    // Events appended before the end are still delivered, then the end.
    assert!(from_start.next_into(&mut buf).unwrap().is_some());
    assert_eq!(
        from_start.next_into(&mut buf),
        Err(ReplayError::SessionEnded)
    );
    assert_eq!(
        caught_up.wait_next(&mut buf, Duration::from_secs(5)),
        Err(ReplayError::SessionEnded)
    );
}

#[test]
fn sweep_ends_idle_sessions_only() {
    let mut c = config(8, 1024, 1 << 20);
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
    let e = Engine::new(config(8, 1024, 1 << 20)).unwrap();
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

#[test]
fn lagged_reader_gets_a_typed_error_then_skips_the_gap() {
    let e = Engine::new(config(4, 1024, 1 << 20)).unwrap();
    let s = e.open(None).unwrap();
    let mut r = s.subscribe(0);
    for i in 0..10u8 {
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
    assert_eq!(seen.last(), Some(&9));
    assert!(seen.windows(2).all(|w| w[1] == w[0] + 1));
    assert!(e.metrics().lagged_readers >= 1);
}

#[test]
fn garbage_headers_never_panic() {
    let e = Engine::new(config(8, 1024, 1 << 20)).unwrap();
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
    let e = Engine::new(config(256, 64 * 1024, 1 << 24)).unwrap();
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
    let e = Engine::new(config(8, 1024, 1 << 20)).unwrap();
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

#[test]
fn subscribe_from_start_reports_events_already_gone_as_lagged() {
    let e = Engine::new(config(2, 1024, 1 << 20)).unwrap();
    let s = e.open(None).unwrap();
    for i in 0..5u8 {
        s.append(0, &[i]).unwrap();
    }
    let mut r = s.subscribe_from_start(0);
    let mut buf = Vec::new();
    assert!(matches!(
        r.next_into(&mut buf),
        Err(ReplayError::Lagged { .. })
    ));
    r.skip_gap();
    assert!(r.next_into(&mut buf).unwrap().is_some());
    assert_eq!(buf, [3]);
}
