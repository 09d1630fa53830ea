//! A session opened for a single writer: its events read, resume and end
//! like any session's; shared appends are refused while the writer lives;
//! a close while it lives loses no memory.

use std::time::Duration;

use rewind_engine::{AppendError, Config, Engine, ReplayError};

fn engine() -> Engine {
    let mut c = Config::default();
    c.session_events = 1 << 20;
    c.session_bytes = 1 << 20;
    c.global_bytes = 64 << 20;
    c.max_segment_bytes = 4096;
    Engine::new(c).unwrap()
}

fn payload(i: usize) -> Vec<u8> {
    let len = (i * 37) % 300;
    (0..len).map(|k| (i + k) as u8).collect()
}

#[test]
fn a_single_writers_events_are_read_from_the_start_and_from_a_cursor() {
    let e = engine();
    let mut w = e.open_single_writer(None).unwrap();
    let h = w.handle().clone();
    let a = h.new_stream().unwrap();
    let b = h.new_stream().unwrap();
    let mut ids = Vec::new();
    for i in 0..2_000 {
        let stream = if i % 3 == 0 { b } else { a };
        let id = w.append(stream, &payload(i)).unwrap();
        assert_eq!(id.seq, i as u64 + 1, "dense sequence numbers");
        assert_eq!(id.stream, stream);
        ids.push((id, i));
    }
    let wanted: Vec<_> = ids.iter().filter(|(id, _)| id.stream == a).collect();
    let mut r = h.subscribe_from_start(a);
    let mut buf = Vec::new();
    for (id, i) in &wanted {
        assert_eq!(r.next_into(&mut buf).unwrap(), Some(*id));
        assert_eq!(buf, payload(*i));
    }
    assert_eq!(r.next_into(&mut buf).unwrap(), None);
    // From a cursor in the middle, as a resume positions its reader.
    let (mid, _) = wanted[700];
    let mut r = h.subscribe_from(a, *mid).unwrap();
    let mut n = 0;
    while let Some(id) = r.next_into(&mut buf).unwrap() {
        assert_eq!(id, wanted[701 + n].0);
        n += 1;
    }
    assert_eq!(n, wanted.len() - 701);
}

#[test]
fn shared_appends_are_refused_while_the_writer_lives_and_taken_after() {
    let e = engine();
    let mut w = e.open_single_writer(None).unwrap();
    let h = w.handle().clone();
    assert_eq!(w.append(0, b"one").unwrap().seq, 1);
    assert_eq!(h.append(0, b"stray"), Err(AppendError::SingleWriter));
    assert_eq!(h.high_water(), 1, "the refused append stored nothing");
    assert_eq!(e.metrics().appends_refused, 1);
    drop(w);
    assert_eq!(h.append(0, b"two").unwrap().seq, 2);
    let mut r = h.subscribe_from_start(0);
    let mut buf = Vec::new();
    r.next_into(&mut buf).unwrap();
    assert_eq!(buf, b"one");
    r.next_into(&mut buf).unwrap();
    assert_eq!(buf, b"two");
    // Any session opened the ordinary way takes appends from anywhere.
    let other = e.open(None).unwrap();
    assert!(other.append(0, b"x").is_ok());
}

#[test]
fn a_close_while_the_writer_lives_loses_no_memory() {
    let e = engine();
    let mut w = e.open_single_writer(None).unwrap();
    for i in 0..500 {
        w.append(0, &payload(i)).unwrap();
    }
    let held = e.metrics().bytes_held;
    assert!(w.handle().close());
    let left = e.metrics().bytes_held;
    assert!(left > 0, "the head segment is left to the writer");
    assert!(left < held, "the rest of the chain is freed at once");
    assert_eq!(w.append(0, b"late"), Err(AppendError::SessionEnded));
    assert_eq!(e.metrics().bytes_held, 0, "the writer freed its head");
    // Evicted, closed or dropped in any order: nothing stays held.
    let w = e.open_single_writer(None).unwrap();
    let mut w2 = e.open_single_writer(None).unwrap();
    w2.append(0, b"x").unwrap();
    drop(w);
    let h2 = w2.handle().clone();
    drop(w2);
    assert!(
        e.metrics().bytes_held > 0,
        "an open session keeps its events"
    );
    assert!(h2.close());
    assert_eq!(e.metrics().bytes_held, 0);
}

#[test]
fn a_reader_on_another_thread_is_woken_for_every_event() {
    let e = engine();
    let mut w = e.open_single_writer(None).unwrap();
    let h = w.handle().clone();
    let n = 20_000;
    let reader = std::thread::spawn(move || {
        let mut r = h.subscribe_from_start(0);
        let mut buf = Vec::new();
        let mut next = 1;
        while next <= n {
            match r.wait_next(&mut buf, Duration::from_secs(10)) {
                Ok(Some(id)) => {
                    assert_eq!(id.seq, next);
                    assert_eq!(buf, (next as u32).to_le_bytes());
                    next += 1;
                }
                Ok(None) => panic!("no event {next} within 10 s: a lost wake-up"),
                // Retention is far larger than the test writes.
                Err(ReplayError::Lagged { .. }) => panic!("lagged at {next}"),
                Err(err) => panic!("{err:?} at {next}"),
            }
        }
    });
    for i in 1..=n {
        w.append(0, &(i as u32).to_le_bytes()).unwrap();
        if i % 1000 == 0 {
            std::thread::yield_now();
        }
    }
    reader.join().unwrap();
}
