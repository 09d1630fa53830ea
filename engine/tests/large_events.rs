//! Events too large for four to fit in a `max_segment_bytes` segment get
//! larger segments, within a quarter of the session's byte retention:
//! more of them retained in about the same memory, each read back whole by
//! single reads and by batches, from either append path, and resumed
//! from anywhere in the window.

use rewind_engine::{
    Batch, Config, Engine, EventId, ReplayError, ResumeAction, ResumeRequest, SessionHandle,
};

const EVENT: usize = 4096;
const SESSION_BYTES: u64 = 256 << 10;

/// The default 8 KiB segment limit (one 4 KiB event each), a session that
/// keeps 256 KiB of segments.
fn engine() -> Engine {
    let mut c = Config::default();
    c.session_events = 1024;
    c.session_bytes = SESSION_BYTES;
    c.global_bytes = 64 << 20;
    Engine::new(c).unwrap()
}

fn payload(i: u64) -> Vec<u8> {
    (0..EVENT).map(|k| (i as usize * 7 + k) as u8).collect()
}

/// What a reader from the start of `stream` finds: the retained events,
/// after one gap for those released.
fn retained(h: &SessionHandle, stream: u32) -> Vec<(u64, Vec<u8>)> {
    let mut r = h.subscribe_from_start(stream);
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let mut gaps = 0;
    for _ in 0..10_000 {
        match r.next_into(&mut buf) {
            Ok(Some(id)) => out.push((id.seq, buf.clone())),
            Ok(None) => return out,
            Err(ReplayError::Lagged { .. }) => {
                gaps += 1;
                assert!(gaps == 1 && out.is_empty(), "a gap inside the window");
                r.skip_gap();
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    panic!("the reader never caught up");
}

#[test]
fn large_events_share_segments_and_read_back_whole() {
    let e = engine();
    let shared = e.open(None).unwrap();
    let mut single = e.open_single_writer(None).unwrap();
    let a = shared.new_stream().unwrap();
    let b = single.handle().new_stream().unwrap();
    for i in 1..=300u64 {
        shared.append(a, &payload(i)).unwrap();
        single.append(b, &payload(i)).unwrap();
    }
    for (h, stream) in [(&shared, a), (single.handle(), b)] {
        let got = retained(h, stream);
        // Capped at 8 KiB, each event took a segment and 256 KiB of them
        // held 32. Segments of 32 KiB hold seven: the retention's eight
        // are at least seven full ones and the head (one event or more).
        assert!(got.len() >= 50, "{} events retained", got.len());
        let first = got[0].0;
        for (k, (seq, body)) in got.iter().enumerate() {
            assert_eq!(*seq, first + k as u64);
            assert_eq!(body, &payload(*seq), "event {seq}");
        }
        assert_eq!(got.last().unwrap().0, 300);
        assert!(
            h.held_bytes() <= SESSION_BYTES + SESSION_BYTES / 4,
            "{} bytes held",
            h.held_bytes()
        );

        // Batches deliver the same, whatever their limits.
        for (max_events, max_bytes) in [(1, usize::MAX), (5, usize::MAX), (64, 10_000)] {
            let before_first = EventId {
                seq: first - 1,
                ..h.cursor_now(stream)
            };
            let mut r = h.subscribe_from(stream, before_first).unwrap();
            let mut batch = Batch::new();
            let mut read = Vec::new();
            loop {
                let n = r.next_batch(&mut batch, max_events, max_bytes).unwrap();
                if n == 0 {
                    break;
                }
                read.extend(batch.iter().map(|(id, p)| (id.seq, p.to_vec())));
            }
            assert_eq!(read, got, "limits {max_events}/{max_bytes}");
        }

        // A resume from any retained event replays from the one after it.
        for after in [first, first + 6, first + 7, 299] {
            let session_id = h.id().to_string();
            let cursor = EventId {
                seq: after,
                ..h.cursor_now(stream)
            }
            .to_string();
            let decision = e.resume(ResumeRequest {
                session_id: Some(&session_id),
                last_event_id: Some(&cursor),
                principal: None,
            });
            let ResumeAction::Replay(mut r) = decision.action else {
                panic!("no replay after {after}: {:?}", decision.verdict);
            };
            let mut buf = Vec::new();
            let id = r.next_into(&mut buf).unwrap().expect("an event after it");
            assert_eq!((id.seq, &buf), (after + 1, &payload(after + 1)));
        }
    }
}
