//! `Replay::next_batch` delivers exactly what `next_into` delivers, in the
//! same order, across segment seals, interleaved streams, limits, gaps and
//! the session's end.

use rewind_engine::{Batch, Config, Engine, EventId, ReplayError};

fn engine(events: u64) -> Engine {
    let mut c = Config::default();
    c.session_events = events;
    c.session_bytes = 1 << 30;
    c.global_bytes = 8 << 20;
    c.max_segment_bytes = 4096;
    c.max_event_bytes = 3000;
    Engine::new(c).unwrap()
}

/// A payload whose bytes say which event it is, of a length that varies
/// (some events span several words, some are empty).
fn payload(i: usize) -> Vec<u8> {
    let len = (i * 37) % 300;
    (0..len).map(|k| (i + k) as u8).collect()
}

/// Everything `next_into` delivers from the start of stream `stream`.
fn one_by_one(h: &rewind_engine::SessionHandle, stream: u32) -> Vec<(EventId, Vec<u8>)> {
    let mut r = h.subscribe_from_start(stream);
    let mut buf = Vec::new();
    let mut out = Vec::new();
    while let Some(id) = r.next_into(&mut buf).unwrap() {
        out.push((id, buf.clone()));
    }
    out
}

#[test]
fn batches_deliver_what_single_reads_deliver_across_seals_and_streams() {
    let e = engine(100_000);
    let h = e.open(None).unwrap();
    let a = h.new_stream().unwrap();
    let b = h.new_stream().unwrap();
    for i in 0..2000 {
        // Mostly stream a, every third event stream b: a batch of a skips b's.
        let s = if i % 3 == 0 { b } else { a };
        h.append(s, &payload(i)).unwrap();
    }
    for stream in [a, b] {
        let want = one_by_one(&h, stream);
        assert!(want.len() > 600, "the test must span many segments");
        for (max_events, max_bytes) in [
            (1, usize::MAX),
            (7, usize::MAX),
            (64, 1000),
            (usize::MAX, usize::MAX),
        ] {
            let mut r = h.subscribe_from_start(stream);
            let mut batch = Batch::new();
            let mut got = Vec::new();
            loop {
                let n = r.next_batch(&mut batch, max_events, max_bytes).unwrap();
                assert_eq!(n, batch.len());
                if n == 0 {
                    break;
                }
                assert!(n <= max_events);
                let total: usize = batch.iter().map(|(_, p)| p.len()).sum();
                assert_eq!(total, batch.payload_bytes());
                got.extend(batch.iter().map(|(id, p)| (id, p.to_vec())));
                assert_eq!(r.position(), got.last().unwrap().0);
            }
            assert_eq!(
                got, want,
                "stream {stream}, limits {max_events}/{max_bytes}"
            );
        }
    }
}

#[test]
fn a_batch_picks_up_live_appends_and_stops_at_what_is_published() {
    let e = engine(100_000);
    let h = e.open(None).unwrap();
    let s = h.new_stream().unwrap();
    let mut r = h.subscribe(s);
    let mut batch = Batch::new();
    assert_eq!(r.next_batch(&mut batch, 100, usize::MAX).unwrap(), 0);
    let mut next = 0;
    for round in 1..50 {
        for _ in 0..round {
            h.append(s, &payload(next)).unwrap();
            next += 1;
        }
        assert_eq!(r.next_batch(&mut batch, 1000, usize::MAX).unwrap(), round);
        let first = next - round;
        for (k, (id, p)) in batch.iter().enumerate() {
            assert_eq!(p, &payload(first + k)[..]);
            assert_eq!(id.seq, (first + k + 1) as u64);
        }
        assert_eq!(r.next_batch(&mut batch, 1000, usize::MAX).unwrap(), 0);
    }
}

#[test]
fn a_gap_met_mid_batch_is_reported_by_the_next_call_after_the_events_before_it() {
    let e = engine(8);
    let h = e.open(None).unwrap();
    let s = h.new_stream().unwrap();
    let mut r = h.subscribe(s);
    // Small retention: most of these are released before the reader looks.
    for i in 0..500 {
        h.append(s, &payload(i)).unwrap();
    }
    let mut batch = Batch::new();
    match r.next_batch(&mut batch, 1000, usize::MAX) {
        Err(ReplayError::Lagged { missing_seq: 1, .. }) => {}
        other => panic!("expected a gap at 1, got {other:?}"),
    }
    let oldest = r.skip_gap();
    let n = r.next_batch(&mut batch, 1000, usize::MAX).unwrap();
    assert!(n >= 8, "retention keeps at least 8, got {n}");
    let ids: Vec<u64> = batch.iter().map(|(id, _)| id.seq).collect();
    assert_eq!(ids[0], oldest);
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1));
    assert_eq!(*ids.last().unwrap(), 500);
}

#[test]
fn the_end_of_the_session_comes_after_the_events_read_before_it() {
    let e = engine(100_000);
    let h = e.open(None).unwrap();
    let s = h.new_stream().unwrap();
    let mut r = h.subscribe(s);
    h.append(s, b"last words").unwrap();
    let mut batch = Batch::new();
    assert_eq!(r.next_batch(&mut batch, 10, usize::MAX).unwrap(), 1);
    assert_eq!(batch.iter().next().unwrap().1, b"last words");
    h.close();
    assert_eq!(
        r.next_batch(&mut batch, 10, usize::MAX),
        Err(ReplayError::SessionEnded)
    );
    assert!(batch.is_empty());
}

/// A reader batching while its writer appends, its old segments are
/// released and other sessions take them: every event it gets is the one
/// its id names (no torn or foreign bytes from a reused segment), in
/// order, and what it misses is reported as a gap.
#[test]
fn batches_racing_appends_and_segment_reuse_get_whole_events_or_a_gap() {
    let mut c = Config::default();
    c.session_events = 16;
    c.session_bytes = 1 << 30;
    c.global_bytes = 1 << 20;
    c.max_segment_bytes = 4096;
    c.max_event_bytes = 3000;
    let e = Engine::new(c).unwrap();
    let h = e.open(None).unwrap();
    let s = h.new_stream().unwrap();
    const EVENTS: usize = 20_000;
    let written = std::sync::atomic::AtomicUsize::new(0);
    // Subscribed before the writer starts: a reader that subscribes live
    // after the writer has finished has nothing to wait for.
    let mut r = h.subscribe(s);
    std::thread::scope(|scope| {
        let writer = h.clone();
        let written = &written;
        scope.spawn(move || {
            for seq in 1..=EVENTS {
                writer.append(s, &payload(seq)).unwrap();
                written.store(seq, std::sync::atomic::Ordering::Relaxed);
            }
        });
        let churn = e.clone();
        scope.spawn(move || {
            // Other sessions take and give back segments meanwhile.
            for i in 0..2_000 {
                let o = churn.open(None).unwrap();
                let t = o.new_stream().unwrap();
                for k in 0..8 {
                    o.append(t, &payload(i + k)).unwrap();
                }
                o.close();
            }
        });
        let mut batch = Batch::new();
        let (mut last, mut gaps) = (0u64, 0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while last < EVENTS as u64 {
            assert!(
                std::time::Instant::now() < deadline,
                "reader stuck at {last}, writer at {}, position {:?}, next_into {:?}",
                written.load(std::sync::atomic::Ordering::Relaxed),
                r.position(),
                r.next_into(&mut Vec::new())
            );
            match r.next_batch(&mut batch, 64, 16 << 10) {
                Ok(0) => std::thread::yield_now(),
                Ok(_) => {
                    for (id, p) in batch.iter() {
                        assert!(id.seq > last, "{} after {last}", id.seq);
                        assert_eq!(p, &payload(id.seq as usize)[..], "event {}", id.seq);
                        last = id.seq;
                    }
                }
                Err(ReplayError::Lagged { .. }) => {
                    gaps += 1;
                    last = r.skip_gap() - 1;
                }
                Err(other) => panic!("unexpected {other:?}"),
            }
        }
        eprintln!("reader: {gaps} gaps");
    });
}
