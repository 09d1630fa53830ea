//! Single-threaded and stress tests of the pool and the window. Sizes
//! shrink under miri.

use super::layout::{SegRef, HEADER_WORDS};
use super::window::{max_payload, Placement};
use super::*;

const A: Owner = Owner { tag: 0xa, epoch: 1 };
const B: Owner = Owner { tag: 0xb, epoch: 2 };

/// 16-word (128-byte) units, classes up to 2^top units.
fn pool(units: u32, top: u8) -> Pool {
    Pool::new(PoolShape {
        units,
        unit_words: 16,
        top_class: top,
    })
    .expect("a test pool fits in memory")
}

fn keep(max_events: u64, max_bytes: u64) -> Retention {
    Retention {
        max_events,
        max_bytes,
        first_class: 0,
        grow_class: 2,
        roomy_class: 2,
        hold_bytes: 0,
    }
}

fn payload(seq: u64, len: usize) -> Vec<u8> {
    (0..len).map(|k| (seq as usize * 31 + k) as u8).collect()
}

fn read_all(
    w: &Window,
    p: &Pool,
    owner: Owner,
    after: u64,
    stream: Option<u32>,
) -> Vec<(u64, Vec<u8>)> {
    let mut c = w.cursor_after(after);
    let mut out = Vec::new();
    let mut buf = Vec::new();
    loop {
        match w.read(p, owner, &mut c, stream, &mut buf) {
            Read::Event(m) => {
                assert_eq!(m.len, buf.len());
                out.push((m.seq, buf.clone()));
            }
            Read::Pending | Read::Ended => return out,
            Read::Lagged { missing } => panic!("lagged at {missing}"),
        }
    }
}

/// Claims the next frame of `head` (an open segment) as a writer's CAS
/// would, `bytes` of it, without writing it: a writer stopped between its
/// claim and its mark.
fn claim_unwritten(p: &Pool, head: SegRef, bytes: u32) {
    use super::layout::State;
    use crate::sync::Ordering;
    let word = p.state(head.unit).load(Ordering::Relaxed);
    let Some(State::Open { count, used }) = State::decode(word, head.stamp) else {
        panic!("open head")
    };
    let claimed = State::Open {
        count: count + 1,
        used: used + bytes,
    };
    p.state(head.unit)
        .store(claimed.encode(head.stamp), Ordering::Relaxed);
}

#[test]
fn alloc_splits_and_coalesce_merges_back() {
    let p = pool(8, 3);
    let total = p.free_bytes();
    assert_eq!(total, 8 * 128);
    let a = p.alloc(0).unwrap();
    assert_eq!(a.unit, 0);
    assert_eq!(a.stamp % 2, 1, "owned stamps are odd");
    assert_eq!(p.free_bytes(), 7 * 128);
    // The split left one free segment of classes 0, 1 and 2.
    assert!(!p.class_is_empty(0) && !p.class_is_empty(1) && !p.class_is_empty(2));
    assert!(
        p.alloc(3).is_none(),
        "no class-3 segment while unit 0 is taken"
    );
    p.free(a, 0);
    assert_eq!(p.stamp_now(0, crate::sync::Ordering::Relaxed), a.stamp + 1);
    assert_eq!(p.free_bytes(), total);
    // Merging happens on demand: class 3 is rebuilt from the four pieces.
    let whole = p.alloc(3).expect("coalesced");
    assert_eq!(whole.unit, 0);
    assert!(whole.stamp > a.stamp, "stamps only grow");
    assert_eq!(p.free_bytes(), 0);
    assert!(p.alloc(0).is_none());
}

#[test]
fn a_pool_that_is_not_a_power_of_two_uses_every_unit() {
    let p = pool(13, 3);
    let mut got = Vec::new();
    while let Some(s) = p.alloc(0) {
        got.push(s.unit);
    }
    got.sort_unstable();
    assert_eq!(got, (0..13).collect::<Vec<_>>());
}

#[test]
fn frames_round_trip_across_word_boundaries_and_segments() {
    let p = pool(64, 4);
    let w = Window::new();
    let k = keep(1 << 20, 1 << 20);
    let mut want = Vec::new();
    for seq in 1..=60u64 {
        let len = (seq as usize * 7) % 90;
        let body = payload(seq, len);
        assert_eq!(w.append(&p, A, &k, 3, seq * 10, &body, 0), Ok(seq));
        want.push((seq, body));
    }
    assert_eq!(w.high_water(&p), 60);
    assert_eq!(read_all(&w, &p, A, 0, None), want);
    // From the middle: the table finds the frame.
    assert_eq!(read_all(&w, &p, A, 37, None), want[37..]);
    assert_eq!(place(&w, &p, A, 41).0.appended_ms, Some(410));
    assert!(w.held_units() > 1, "the chain grew past one segment");
}

/// [`Window::place`] with a cursor of its own: the placement, and the
/// cursor after `after` (placed if the frame was found).
fn place(w: &Window, p: &Pool, owner: Owner, after: u64) -> (Placement, Cursor) {
    let mut c = w.cursor_after(after);
    let placed = w.place(p, owner, Some(after), &mut c);
    (placed, c)
}

/// Reads everything from `c` on (a cursor the test placed).
fn read_from(w: &Window, p: &Pool, c: &mut Cursor) -> Result<Vec<(u64, Vec<u8>)>, u64> {
    let mut out = Vec::new();
    let mut buf = Vec::new();
    loop {
        match w.read(p, A, c, None, &mut buf) {
            Read::Event(m) => out.push((m.seq, buf.clone())),
            Read::Pending | Read::Ended => return Ok(out),
            Read::Lagged { missing } => return Err(missing),
        }
    }
}

#[test]
fn a_cursor_placed_by_place_reads_what_a_fresh_walk_reads() {
    // Small segments (one or two units, a few frames each): positions at
    // a segment's first and last frame, where reading on crosses a seal.
    let p = pool(256, 1);
    let w = Window::new();
    let k = Retention {
        max_events: 1 << 20,
        max_bytes: 1 << 20,
        first_class: 0,
        grow_class: 1,
        roomy_class: 1,
        hold_bytes: 0,
    };
    let mut want = Vec::new();
    for seq in 1..=90u64 {
        let body = payload(seq, 20 + (seq as usize % 3) * 9);
        assert_eq!(w.append(&p, A, &k, 1, seq * 10, &body, 0), Ok(seq));
        want.push((seq, body));
    }
    assert!(w.held_units() > 10, "{} units", w.held_units());
    for after in 1..=90u64 {
        let (placed, mut c) = place(&w, &p, A, after);
        assert_eq!(placed.high_water, 90);
        assert_eq!(placed.oldest, w.oldest_retained(&p));
        assert_eq!(
            placed.appended_ms,
            Some(after * 10),
            "time of frame {after}"
        );
        // The one-pass placement and the separate calls agree.
        let mut slow_cursor = w.cursor_after(after);
        let slow = w.place_slow(&p, A, Some(after), &mut slow_cursor);
        assert_eq!(
            (slow.high_water, slow.oldest, slow.appended_ms),
            (placed.high_water, placed.oldest, placed.appended_ms)
        );
        assert_eq!((c.seq, slow_cursor.seq), (after + 1, after + 1));
        assert_eq!(
            read_from(&w, &p, &mut slow_cursor),
            Ok(want[after as usize..].to_vec()),
            "after {after}, placed the slow way"
        );
        assert_eq!(
            read_from(&w, &p, &mut c),
            Ok(want[after as usize..].to_vec()),
            "after {after}"
        );
    }
    // Placed at the head, then more is appended: the cursor reads it.
    let (_, mut c) = place(&w, &p, A, 90);
    for seq in 91..=120u64 {
        let body = payload(seq, 24);
        assert_eq!(w.append(&p, A, &k, 1, seq * 10, &body, 0), Ok(seq));
        want.push((seq, body));
    }
    assert_eq!(read_from(&w, &p, &mut c), Ok(want[90..].to_vec()));
    // Another owner's cursor is never placed.
    let mut other = w.cursor_after(5);
    assert_eq!(w.place(&p, B, Some(5), &mut other).appended_ms, None);
    assert_eq!(format!("{other:?}"), format!("{:?}", w.cursor_after(5)));
    // Placed, then its segment is released before the read: it lags
    // rather than reading the reused memory.
    let (_, mut c) = place(&w, &p, A, 3);
    let tight = Retention { max_events: 4, ..k };
    for seq in 121..=200u64 {
        w.append(&p, A, &tight, 1, 0, &payload(seq, 24), 0).unwrap();
    }
    assert!(w.oldest_retained(&p) > 4);
    assert_eq!(read_from(&w, &p, &mut c), Err(4));
    w.close(&p);
}

#[test]
fn a_long_chain_is_read_from_its_oldest_segment_and_from_anywhere_in_it() {
    // One-unit segments of a few frames each: the retained window is a
    // chain of well over a hundred segments, and every position in it
    // must be found (a seek bounded by a hop count once made a resume
    // from the oldest events lag forever).
    let p = pool(1024, 4);
    let w = Window::new();
    let k = Retention {
        max_events: 1 << 20,
        max_bytes: 1 << 20,
        first_class: 0,
        grow_class: 0,
        roomy_class: 0,
        hold_bytes: 0,
    };
    let mut want = Vec::new();
    for seq in 1..=300u64 {
        let body = payload(seq, 16);
        assert_eq!(w.append(&p, A, &k, 1, seq, &body, 0), Ok(seq));
        want.push((seq, body));
    }
    assert!(w.held_units() > 100, "{} segments", w.held_units());
    assert_eq!(w.oldest_retained(&p), 1);
    assert_eq!(read_all(&w, &p, A, 0, None), want);
    for after in [1u64, 2, 50, 150, 298, 299] {
        assert_eq!(read_all(&w, &p, A, after, None), want[after as usize..]);
    }
    w.close(&p);
}

#[test]
fn other_streams_are_passed_over() {
    let p = pool(16, 3);
    let w = Window::new();
    let k = keep(1 << 20, 1 << 20);
    for seq in 1..=10u64 {
        w.append(&p, A, &k, (seq % 3) as u32, 0, &payload(seq, 5), 0)
            .unwrap();
    }
    let got: Vec<u64> = read_all(&w, &p, A, 0, Some(1))
        .iter()
        .map(|e| e.0)
        .collect();
    assert_eq!(got, [1, 4, 7, 10]);
}

#[test]
fn a_reader_of_another_owner_finds_nothing() {
    let p = pool(16, 3);
    let w = Window::new();
    let k = keep(1 << 20, 1 << 20);
    w.append(&p, A, &k, 0, 0, b"secret", 0).unwrap();
    let mut c = w.cursor_after(0);
    let mut buf = Vec::new();
    assert_eq!(
        w.read(&p, B, &mut c, None, &mut buf),
        Read::Lagged { missing: 1 }
    );
    assert!(buf.is_empty());
}

#[test]
fn empty_window_is_pending_and_holds_nothing() {
    let p = pool(16, 3);
    let w = Window::new();
    assert!(w.is_empty());
    assert_eq!(w.high_water(&p), 0);
    assert_eq!(w.oldest_retained(&p), 1);
    let mut c = w.cursor_after(0);
    assert_eq!(w.read(&p, A, &mut c, None, &mut Vec::new()), Read::Pending);
    assert_eq!(p.free_bytes(), 16 * 128);
}

#[test]
fn retention_releases_the_oldest_segment_and_readers_behind_lag() {
    let p = pool(64, 4);
    let w = Window::new();
    let k = keep(8, 1 << 20);
    let mut c = w.cursor_after(0);
    for seq in 1..=80u64 {
        w.append(&p, A, &k, 0, 0, &payload(seq, 40), 0).unwrap();
    }
    let oldest = w.oldest_retained(&p);
    assert!(oldest > 1, "old segments were released");
    assert!(80 - oldest + 1 >= 8, "at least the newest 8 stay");
    let mut buf = Vec::new();
    assert_eq!(
        w.read(&p, A, &mut c, None, &mut buf),
        Read::Lagged { missing: 1 }
    );
    let kept = read_all(&w, &p, A, oldest - 1, None);
    assert_eq!(kept.first().map(|e| e.0), Some(oldest));
    assert_eq!(kept.last().map(|e| e.0), Some(80));
}

#[test]
fn a_reader_that_holds_its_place_keeps_what_it_has_not_read_up_to_the_hold_cap() {
    let p = pool(256, 4);
    let w = Window::new();
    let unit_bytes = 16 * 8;
    // Retention: 8 events; a held reader may keep up to 64 units.
    let k = Retention {
        hold_bytes: 64 * unit_bytes,
        ..keep(8, 1 << 20)
    };
    let mut held = w.cursor_after(0);
    let slot = w.hold(held.seq).expect("a free slot");
    let others = [w.hold(1), w.hold(1)].map(|o| o.expect("more slots"));
    assert_eq!(w.hold(1), None, "three slots, all taken");
    for o in others {
        w.unhold(o);
    }
    for seq in 1..=40u64 {
        w.append(&p, A, &k, 0, 0, &payload(seq, 40), 0).unwrap();
    }
    assert_eq!(
        w.oldest_retained(&p),
        1,
        "nothing the held reader needs went"
    );
    assert!(u64::from(w.held_units()) * unit_bytes <= k.hold_bytes + 16 * unit_bytes);
    // Another reader, not holding, reads the same events.
    let all = read_all(&w, &p, A, 0, None);
    assert_eq!(all.len(), 40);
    // The held reader reads half, moves its hold; retention follows it.
    let mut buf = Vec::new();
    for seq in 1..=20u64 {
        match w.read(&p, A, &mut held, None, &mut buf) {
            Read::Event(m) => assert_eq!((m.seq, &buf), (seq, &payload(seq, 40))),
            other => panic!("{seq}: {other:?}"),
        }
    }
    w.move_hold(slot, held.seq);
    w.retain(&p, &k, false);
    let oldest = w.oldest_retained(&p);
    assert!(
        oldest > 1 && oldest <= 21,
        "released up to the reader: {oldest}"
    );
    // Past the cap, retention takes what the reader has not read: it lags.
    for seq in 41..=400u64 {
        w.append(&p, A, &k, 0, 0, &payload(seq, 40), 0).unwrap();
    }
    assert!(u64::from(w.held_units()) * unit_bytes <= k.hold_bytes + 16 * unit_bytes);
    assert!(matches!(
        w.read(&p, A, &mut held, None, &mut buf),
        Read::Lagged { missing: 21 }
    ));
    // The place given back, the window shrinks to its retention.
    w.unhold(slot);
    w.retain(&p, &k, false);
    let kept = read_all(&w, &p, A, w.oldest_retained(&p) - 1, None);
    assert!(kept.len() >= 8 && kept.len() < 40, "{} kept", kept.len());
    assert_eq!(kept.last().map(|e| e.0), Some(400));
}

#[test]
fn a_reader_at_the_end_of_a_released_segment_goes_on_in_its_successor() {
    // The readers have read everything and wait at the end of the head
    // segment; the next append seals it, links a successor, and retention
    // (one event) releases it at once; another session's append reuses
    // it. Nothing the readers want was released: they must read on in the
    // successor, not report a gap.
    let p = pool(64, 4);
    let w = Window::new();
    let other = Window::new();
    // One 400-byte event per 512-byte segment: every append links one.
    let k = Retention {
        grow_class: 2,
        roomy_class: 2,
        first_class: 2,
        ..keep(1, 1 << 20)
    };
    let mut single = w.cursor_after(0);
    let mut batched = w.cursor_after(0);
    let mut buf = Vec::new();
    let (mut data, mut events) = (Vec::new(), Vec::new());
    // Two appends between reads: the second one's install releases the
    // segment the readers wait at the end of (an install releases what
    // the segments after it held before the new one).
    for round in 0..100u64 {
        let seqs = [2 * round + 1, 2 * round + 2];
        for seq in seqs {
            w.append(&p, A, &k, 0, 0, &payload(seq, 400), 0).unwrap();
            other
                .append(&p, B, &k, 0, 0, &payload(seq, 400), 0)
                .unwrap();
        }
        for seq in seqs {
            match w.read(&p, A, &mut single, None, &mut buf) {
                Read::Event(m) => assert_eq!((m.seq, &buf), (seq, &payload(seq, 400))),
                other => panic!("event {seq}: {other:?}"),
            }
        }
        assert_eq!(w.read(&p, A, &mut single, None, &mut buf), Read::Pending);
        data.clear();
        events.clear();
        let stopped = w.read_many(&p, A, &mut batched, 0, &mut data, &mut events, 64, 1 << 20);
        assert_eq!(stopped, Some(Read::Pending), "round {round}");
        let read: Vec<u64> = events.iter().map(|e| e.0).collect();
        assert_eq!(read, seqs, "round {round}");
    }
    assert!(
        w.oldest_retained(&p) > 100,
        "segments were released behind the readers"
    );
}

#[test]
fn a_successor_released_after_the_reader_found_it_is_reported_lost() {
    // Readers learn a sealed segment's successor when they first load its
    // state, and keep it. If retention releases that successor (and
    // another session reuses its units) before they reach it, they must
    // find it lost at its first read: `Lagged`, never the new owner's
    // bytes, never pending forever.
    let p = pool(16, 2);
    let w = Window::new();
    let other = Window::new();
    // 512-byte segments, three 100-byte events each.
    let k = Retention {
        first_class: 2,
        ..keep(u64::MAX, u64::MAX)
    };
    for seq in 1..=9u64 {
        w.append(&p, A, &k, 0, 0, &payload(seq, 100), 0).unwrap();
    }
    let (first, h) = w.oldest_segment(&p).unwrap();
    assert_eq!(h.first_seq, 1);
    let mut single = w.cursor_after(0);
    let mut batched = w.cursor_after(0);
    let mut buf = Vec::new();
    let (mut data, mut events) = (Vec::new(), Vec::new());
    for seq in 1..=3u64 {
        match w.read(&p, A, &mut single, None, &mut buf) {
            Read::Event(m) => assert_eq!((m.seq, &buf), (seq, &payload(seq, 100))),
            other => panic!("event {seq}: {other:?}"),
        }
    }
    assert_eq!(
        w.read_many(&p, A, &mut batched, 0, &mut data, &mut events, 3, 1 << 20),
        None
    );
    assert_eq!(events.iter().map(|e| e.0).collect::<Vec<_>>(), [1, 2, 3]);
    // Both readers stand at the end of the first segment. Release it and
    // its successor, and let another session take their units.
    assert!(w.retain(&p, &keep(3, u64::MAX), true) > 0);
    assert!(w.retain(&p, &keep(3, u64::MAX), true) > 0);
    assert_eq!(w.oldest_retained(&p), 7);
    let mut taken = 0;
    while other.append(&p, B, &k, 0, 0, &[0xbb; 100], 0).is_ok() && taken < 64 {
        taken += 1;
    }
    assert_ne!(
        p.stamp_now(first.unit, crate::sync::Ordering::Relaxed),
        first.stamp,
        "the released units were reused"
    );
    assert_eq!(
        w.read(&p, A, &mut single, None, &mut buf),
        Read::Lagged { missing: 4 }
    );
    data.clear();
    events.clear();
    assert_eq!(
        w.read_many(&p, A, &mut batched, 0, &mut data, &mut events, 64, 1 << 20),
        Some(Read::Lagged { missing: 4 })
    );
    assert!(events.is_empty());
}

#[test]
fn a_walk_from_the_oldest_end_that_retention_overtakes_does_not_report_a_gap() {
    // A reader that is descheduled after reading the oldest segment's
    // header, while retention releases that segment and the next, must not
    // report a frame that is still held as gone.
    let p = pool(256, 2);
    let w = Window::new();
    let k = keep(u64::MAX, u64::MAX);
    for seq in 1..=200u64 {
        w.append(&p, A, &k, 0, 0, &payload(seq, 40), 0).unwrap();
    }
    let (stale, stale_header) = w.oldest_segment(&p).unwrap();
    assert_eq!(stale_header.first_seq, 1);
    let before = w.oldest_retained(&p);
    assert!(w.retain(&p, &k, true) > 0);
    assert!(w.retain(&p, &k, true) > 0);
    let oldest = w.oldest_retained(&p);
    assert!(oldest > before, "two segments were released");
    // Still held, and nearer the oldest end than the head.
    let seq = oldest + 1;
    assert!(seq - 1 < 200 - seq);
    assert!(
        super::window::walk_forward(&p, A, seq, stale, stale_header).is_none(),
        "a walk over a released segment proves nothing about `seq`"
    );
    let mut c = w.cursor_after(seq - 1);
    let mut buf = Vec::new();
    assert!(matches!(
        w.read(&p, A, &mut c, None, &mut buf),
        Read::Event(m) if m.seq == seq
    ));
    assert_eq!(buf, payload(seq, 40));
}

#[test]
fn a_released_segment_reused_by_another_owner_is_never_read_as_ours() {
    let p = pool(4, 2);
    let wa = Window::new();
    let wb = Window::new();
    let k = keep(1, 1);
    // A fills unit 0 and moves on; retention releases it.
    for seq in 1..=40u64 {
        if wa.append(&p, A, &k, 0, 0, &payload(seq, 24), 0).is_err() {
            break;
        }
    }
    let mut stale = wa.cursor_after(0);
    // B takes whatever is free, likely A's old unit.
    while wb
        .append(&p, B, &k, 0, 0, b"bbbbbbbbbbbbbbbbbbbbbbbb", 0)
        .is_ok()
    {
        if wb.high_water(&p) > 40 {
            break;
        }
    }
    let mut buf = Vec::new();
    loop {
        match wa.read(&p, A, &mut stale, None, &mut buf) {
            Read::Event(_) => assert_ne!(buf, b"bbbbbbbbbbbbbbbbbbbbbbbb"),
            Read::Lagged { .. } => {
                let oldest = wa.oldest_retained(&p);
                stale = wa.cursor_after(oldest - 1);
            }
            Read::Pending | Read::Ended => break,
        }
    }
}

/// A segment's memory may hold words of a larger segment that covered it
/// before a split (or of smaller ones merged into it). Their marks carry
/// that allocation's stamp and no unit: were the new segment's stamp equal
/// to it, a frame claimed but not yet written would read as the stale
/// frame under it — another session's event. Stamps grow across the
/// allocations that cover a unit, so it reads as pending.
#[test]
fn a_stale_mark_from_a_segment_that_covered_this_one_is_never_read_as_a_frame() {
    // 32-word units: room in unit 1 for B's second frame.
    let p = Pool::new(PoolShape {
        units: 4,
        unit_words: 32,
        top_class: 2,
    })
    .unwrap();
    let wa = Window::new();
    let whole = Retention {
        first_class: 2,
        ..keep(1 << 20, 1 << 20)
    };
    // A's one class-2 segment covers units 0..4. Its second frame starts
    // at word 44: unit 1's word 12, where B's second frame will go.
    wa.append(&p, A, &whole, 0, 0, &payload(1, 33 * 8), 0)
        .unwrap();
    wa.append(&p, A, &whole, 0, 0, b"AAAAAAAA", 0).unwrap();
    let a_head = SegRef::unpack(wa.head_word()).unwrap();
    assert_eq!((a_head.unit, a_head.stamp), (0, 1));
    assert!(wa.close(&p).is_empty());
    // Splitting A's segment: unit 0 goes to this allocation, unit 1 to B.
    let lower = p.alloc(0).unwrap();
    assert_eq!(lower.unit, 0);
    let wb = Window::new();
    let k = keep(1 << 20, 1 << 20);
    wb.append(&p, B, &k, 0, 0, b"one", 0).unwrap();
    let b_head = SegRef::unpack(wb.head_word()).unwrap();
    assert_eq!(b_head.unit, 1);
    assert!(
        b_head.stamp > a_head.stamp,
        "B's stamp {} must be above that of A's segment, which covered its unit ({})",
        b_head.stamp,
        a_head.stamp
    );
    let mut c = wb.cursor_after(0);
    let mut buf = Vec::new();
    assert!(matches!(
        wb.read(&p, B, &mut c, None, &mut buf),
        Read::Event(_)
    ));
    // A writer claims B's second frame and has not written it yet.
    claim_unwritten(&p, b_head, 4);
    let read = wb.read(&p, B, &mut c, None, &mut buf);
    assert_eq!(read, Read::Pending, "read {buf:?}");
}

/// Whatever the order of allocations, frees, splits and merges, a new
/// allocation's stamp is above the stamp of every allocation that covered
/// any of its units before (the property the test above relies on).
#[test]
fn a_claimed_frame_reads_as_pending_until_written_whatever_its_words_held_before() {
    // A reader that finds a frame claimed loads its mark before the writer
    // may have stored it. Whatever an earlier owner left in those words —
    // payload can be any bytes, and a meta word `stream << 32 | check` has
    // the shape of a mark — must not pass for this allocation's mark.
    let p = one_unit_pool_full_of_marks();
    let k = keep(1 << 20, 1 << 20);
    let wb = Window::new();
    wb.append(&p, B, &k, 1, 0, b"b's one", 0).unwrap();
    let head = SegRef::unpack(wb.head_word()).unwrap();
    assert_eq!(head.unit, 0, "the same memory");
    // B's second frame: claimed (by hand, as a writer does with its CAS),
    // not written yet.
    claim_unwritten(&p, head, 32);
    assert_reads_one_then_pending(&wb, &p);
}

#[test]
fn shared_appenders_taking_over_a_single_writers_segment_find_no_earlier_owners_words() {
    // A single writer's segment is not zeroed when prepared: it stores each
    // frame before claiming it, so readers never load a word it has not
    // written. Appenders that take the window over once the writer is done
    // claim first and write after; the writer zeroes the rest of its head
    // when it hands over, or a claimed frame would read as the mark-shaped
    // words an earlier owner left.
    let p = one_unit_pool_full_of_marks();
    let k = keep(1 << 20, 1 << 20);
    let wb = Window::new_single();
    let mut writer = SingleWriter::new();
    assert_eq!(
        wb.append_single(&p, B, &k, &mut writer, 1, 0, b"b's one", 0),
        Ok(1)
    );
    let head = SegRef::unpack(wb.head_word()).unwrap();
    assert_eq!(head.unit, 0, "the same memory");
    assert!(!wb.takes_shared_appends());
    wb.writer_done(&p, &mut writer);
    assert!(wb.takes_shared_appends());
    claim_unwritten(&p, head, 32);
    assert_reads_one_then_pending(&wb, &p);
}

/// A pool of one 64-word unit whose next allocation finds every word after
/// the header looking like one of its own marks, and every table slot like
/// one of its own table entries: what an earlier owner's payload and meta
/// words can look like.
fn one_unit_pool_full_of_marks() -> Pool {
    use super::layout::{mark, table_entry};
    use crate::sync::Ordering;
    let p = Pool::new(PoolShape {
        units: 1,
        unit_words: 64,
        top_class: 0,
    })
    .unwrap();
    let wa = Window::new();
    wa.append(&p, A, &keep(1 << 20, 1 << 20), 0, 0, b"first owner", 0)
        .unwrap();
    assert!(wa.close(&p).is_empty());
    let next = p.stamp_now(0, Ordering::Relaxed) + 1;
    let words = p.segment(0, 0);
    let (data, table) = words[HEADER_WORDS..].split_at(64 - HEADER_WORDS - 4);
    for w in data {
        w.store(mark(next, 8), Ordering::Relaxed);
    }
    for w in table {
        w.store(
            table_entry(next, HEADER_WORDS as u32 + 4),
            Ordering::Relaxed,
        );
    }
    p
}

/// B's window holds event 1 (`b"b's one"`) and a second frame claimed but
/// not written: a reader gets event 1, then pending — from the frame
/// after 1 and from a fresh cursor, which finds the offset in the table.
fn assert_reads_one_then_pending(wb: &Window, p: &Pool) {
    let mut c = wb.cursor_after(0);
    let mut buf = Vec::new();
    assert!(matches!(
        wb.read(p, B, &mut c, None, &mut buf),
        Read::Event(m) if m.seq == 1
    ));
    assert_eq!(buf, b"b's one");
    let mut fresh = wb.cursor_after(1);
    for c in [&mut c, &mut fresh] {
        let read = wb.read(p, B, c, None, &mut buf);
        assert!(matches!(read, Read::Pending), "{read:?}: {buf:?}");
    }
}

#[test]
fn every_allocation_stamp_is_above_those_that_covered_its_units_before() {
    let (units, top) = (16u32, 3u8);
    let p = pool(units, top);
    let mut covered = vec![0u32; units as usize];
    let mut live: Vec<(SegRef, u8)> = Vec::new();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let rounds = if cfg!(miri) { 300 } else { 20_000 };
    for _ in 0..rounds {
        match next() % 8 {
            0..=3 => {
                let class = (next() % u64::from(top + 1)) as u8;
                if let Some(seg) = p.alloc(class) {
                    let span = seg.unit as usize..(seg.unit + (1 << class)) as usize;
                    let before = covered[span.clone()].iter().copied().max().unwrap();
                    assert!(
                        seg.stamp > before,
                        "unit {} class {class}: stamp {} after {before}",
                        seg.unit,
                        seg.stamp
                    );
                    covered[span].fill(seg.stamp);
                    live.push((seg, class));
                }
            }
            4..=5 if !live.is_empty() => {
                let (seg, class) = live.swap_remove((next() % live.len() as u64) as usize);
                p.free(seg, class);
            }
            // A trim pass merges buddies free since its previous pass.
            7 => {
                p.trim(TRIM_PER_PASS);
            }
            _ => p.coalesce(),
        }
    }
}

/// Recovery hands the free units of a file back as large blocks; a
/// block's stamp starts above those its units had, for the same reason.
#[test]
fn a_recovered_free_block_is_stamped_above_every_unit_in_it() {
    use crate::sync::Ordering::Relaxed;
    let shape = PoolShape {
        units: 4,
        unit_words: 16,
        top_class: 2,
    };
    let p = Pool::over(
        super::backing::Backing::in_memory(shape.total_words()).unwrap(),
        shape,
    );
    // Unit 1 was a segment's head six stamps ago; unit 2 was owned when the
    // process died.
    p.stamp(1).store(6, Relaxed);
    p.stamp(2).store(9, Relaxed);
    p.free_unused(&[false; 4], 0);
    let whole = p.alloc(2).expect("the four units are one free block");
    assert_eq!(whole.unit, 0);
    assert!(whole.stamp > 10, "stamp {}", whole.stamp);
}

#[test]
fn close_frees_everything_and_ends_readers_and_writers() {
    let p = pool(64, 4);
    let total = p.free_bytes();
    let w = Window::new();
    let k = keep(1 << 20, 1 << 20);
    for seq in 1..=30u64 {
        w.append(&p, A, &k, 0, 0, &payload(seq, 50), 0).unwrap();
    }
    let mut c = w.cursor_after(10);
    assert!(w.close(&p).is_empty());
    assert_eq!(p.free_bytes(), total, "every segment is back");
    assert_eq!(
        w.append(&p, A, &k, 0, 0, b"late", 0),
        Err(AppendFailure::Ended)
    );
    assert_eq!(w.read(&p, A, &mut c, None, &mut Vec::new()), Read::Ended);
    assert!(w.close(&p).is_empty(), "closing twice is harmless");
}

#[test]
fn too_large_and_pool_full_store_nothing() {
    let p = pool(4, 2);
    let w = Window::new();
    let k = keep(1 << 20, 1 << 20);
    let max = max_payload(&p);
    assert_eq!(max, (64 - HEADER_WORDS - 3 - 1) * 8);
    assert_eq!(
        w.append(&p, A, &k, 0, 0, &vec![1; max + 1], 0),
        Err(AppendFailure::TooLarge { max })
    );
    assert_eq!(w.append(&p, A, &k, 0, 0, &vec![1; max], 0), Ok(1));
    assert_eq!(
        w.append(&p, A, &k, 0, 0, b"x", 0),
        Err(AppendFailure::PoolFull { class: 0 }),
        "the one segment is full and nothing is left"
    );
    assert_eq!(w.high_water(&p), 1, "the refused append claimed nothing");
    assert_eq!(read_all(&w, &p, A, 0, None), vec![(1, vec![1; max])]);
}

#[test]
fn a_frame_claimed_but_not_published_defers_the_free() {
    // Simulate a writer stopped between its claim and its mark by claiming
    // through the state word by hand.
    let p = pool(8, 3);
    let total = p.free_bytes();
    let w = Window::new();
    let k = keep(1 << 20, 1 << 20);
    w.append(&p, A, &k, 0, 0, b"one", 0).unwrap();
    let head = SegRef::unpack(w.head_word()).unwrap();
    claim_unwritten(&p, head, 32);
    let deferred = w.close(&p);
    assert_eq!(deferred.len(), 1);
    assert!(p.free_bytes() < total);
    assert!(!deferred[0].try_free(&p), "still being written");
}

#[test]
#[cfg_attr(miri, ignore = "waits on a thread for real time")]
fn appenders_behind_a_stalled_writer_stop_at_twice_the_retention_instead_of_filling_the_pool() {
    // A writer stopped between its claim and its mark (claimed by hand, as
    // above) keeps its segment, and so every later one, from being
    // released. Another writer goes on appending: the window may grow to
    // twice its retention, then the appender waits rather than taking the
    // whole pool.
    use crate::sync::Ordering;
    use std::sync::atomic::AtomicU64;
    let p = pool(256, 3);
    let total = p.free_bytes();
    let w = Window::new();
    let k = keep(8, 1 << 20);
    w.append(&p, A, &k, 0, 0, b"one", 0).unwrap();
    let head = SegRef::unpack(w.head_word()).unwrap();
    claim_unwritten(&p, head, 32);
    let appended = AtomicU64::new(0);
    std::thread::scope(|s| {
        let appender = s.spawn(|| {
            for seq in 0..10_000 {
                match w.append(&p, A, &k, 0, 0, &payload(seq, 50), 0) {
                    Ok(_) => appended.fetch_add(1, Ordering::Relaxed),
                    Err(e) => return e,
                };
            }
            panic!("10,000 appends went through behind a stalled writer")
        });
        // Give the appender time to run into the bound (bounded: 2 s).
        let mut last = u64::MAX;
        for _ in 0..200 {
            std::thread::sleep(std::time::Duration::from_millis(10));
            let now = appended.load(Ordering::Relaxed);
            if now == last && now > 0 {
                break;
            }
            last = now;
        }
        assert!(!appender.is_finished(), "the appender stopped: {:?}", {
            let n = appended.load(Ordering::Relaxed);
            (n, p.free_bytes())
        });
        let n = appended.load(Ordering::Relaxed);
        // The stalled segment holds a few events; after it, up to twice the
        // retention (16) plus the segment whose install reached that.
        assert!(
            (16..=40).contains(&n),
            "{n} events appended behind the stalled writer"
        );
        assert!(
            p.free_bytes() > total / 2,
            "the window took {} of {total} bytes",
            total - p.free_bytes()
        );
        assert_eq!(p.append_stalls(), 1, "the waiting append is counted, once");
        // The close ends the waiting appender.
        let deferred = w.close(&p);
        assert_eq!(appender.join().unwrap(), AppendFailure::Ended);
        assert_eq!(deferred.len(), 1, "only the stalled segment is kept");
    });
}

#[test]
fn stress_two_writers_one_reader_with_retention() {
    let per_writer: u64 = if cfg!(miri) { 40 } else { 20_000 };
    let p = std::sync::Arc::new(pool(if cfg!(miri) { 32 } else { 512 }, 4));
    let w = std::sync::Arc::new(Window::new());
    let k = keep(16, 2048);
    let writers_done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..2u32)
        .map(|stream| {
            let (p, w) = (p.clone(), w.clone());
            std::thread::spawn(move || {
                for i in 0..per_writer {
                    let body = payload(i, (i as usize % 40) + 1);
                    loop {
                        match w.append(&p, A, &k, stream, i, &body, 0) {
                            Ok(_) => break,
                            Err(AppendFailure::PoolFull { .. }) => std::thread::yield_now(),
                            Err(e) => panic!("{e:?}"),
                        }
                    }
                }
            })
        })
        .collect();
    let reader = {
        let (p, w, done) = (p.clone(), w.clone(), writers_done.clone());
        std::thread::spawn(move || {
            let mut c = w.cursor_after(0);
            let mut buf = Vec::new();
            let mut next = [0u64; 2];
            let mut seen = 0u64;
            let mut lagged = 0u64;
            let mut final_look = false;
            loop {
                match w.read(&p, A, &mut c, None, &mut buf) {
                    Read::Event(m) => {
                        let i = m.appended_ms;
                        let s = m.stream as usize;
                        assert!(i >= next[s], "stream {s} went back: {i} after {}", next[s]);
                        next[s] = i + 1;
                        assert_eq!(buf, payload(i, (i as usize % 40) + 1), "torn frame");
                        seen += 1;
                    }
                    Read::Pending => {
                        // Caught up after the writers finished: done. (A
                        // stream's last events may have been released
                        // while this reader lagged, so waiting for them
                        // could wait forever.)
                        if next == [per_writer; 2] || final_look {
                            break;
                        }
                        // Seen after the writers finished: the next
                        // `Pending` is final.
                        final_look = done.load(std::sync::atomic::Ordering::SeqCst);
                        std::thread::yield_now();
                    }
                    Read::Lagged { .. } => {
                        lagged += 1;
                        c = w.cursor_after(w.oldest_retained(&p) - 1);
                    }
                    Read::Ended => panic!("not closed"),
                }
                if next == [per_writer; 2] {
                    break;
                }
            }
            // Every lag skips at least the frame it reports missing, so
            // more lags than unseen frames means a gap reported that was
            // not there.
            assert!(
                seen > 0 && seen + lagged <= 2 * per_writer,
                "seen {seen}, lagged {lagged} times, of {} frames",
                2 * per_writer
            );
        })
    };
    for t in writers {
        t.join().unwrap();
    }
    writers_done.store(true, std::sync::atomic::Ordering::SeqCst);
    reader.join().unwrap();
    assert_eq!(w.high_water(&p), 2 * per_writer);
    let total = p.capacity_bytes();
    w.close(&p);
    assert_eq!(p.free_bytes(), total);
}

#[test]
fn the_pool_never_hands_out_a_unit_twice_under_contention() {
    use std::sync::atomic::AtomicU8;
    let p = std::sync::Arc::new(pool(48, 4));
    let owned: std::sync::Arc<Vec<AtomicU8>> =
        std::sync::Arc::new((0..256).map(|_| AtomicU8::new(0)).collect());
    let ts: Vec<_> = (0..2u64)
        .map(|t| {
            let (p, owned) = (p.clone(), owned.clone());
            std::thread::spawn(move || {
                let mut held: Vec<(SegRef, u8)> = Vec::new();
                let mut x = t + 1;
                for _ in 0..if cfg!(miri) { 300 } else { 200_000 } {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    if held.len() < 20 && x >> 60 < 9 {
                        let class = ((x >> 40) % 4) as u8;
                        if let Some(s) = p.alloc(class) {
                            for u in s.unit..s.unit + (1 << class) {
                                assert_eq!(
                                    owned[u as usize].swap(1, std::sync::atomic::Ordering::SeqCst),
                                    0,
                                    "unit {u} handed out twice"
                                );
                            }
                            held.push((s, class));
                        }
                    } else if let Some((s, class)) = held.pop() {
                        for u in s.unit..s.unit + (1 << class) {
                            owned[u as usize].store(0, std::sync::atomic::Ordering::SeqCst);
                        }
                        p.free(s, class);
                    }
                }
            })
        })
        .collect();
    for t in ts {
        t.join().unwrap();
    }
}

#[test]
fn a_recovered_pool_hands_out_its_untouched_part_after_its_lists_and_never_twice() {
    // 64 units, top class 2 (4 units): as after a recovery whose mark was
    // at unit 41 with units 50 and 51 in use, units 0..40 are the untouched
    // region (41 rounded down to a block) and 40..64 minus the used ones go
    // on the lists.
    let shape = PoolShape {
        units: 64,
        unit_words: 16,
        top_class: 2,
    };
    let p = Pool::over(
        backing::Backing::in_memory(shape.total_words()).expect("a test pool fits in memory"),
        shape,
    );
    let mut used = vec![false; 64];
    used[50] = true;
    used[51] = true;
    p.free_unused(&used, 41);
    assert_eq!(p.free_bytes(), 62 * 16 * 8, "every unit but the used two");
    assert!(p.has_room_for(2));
    let mut owner = [None; 64];
    let mut order = Vec::new();
    while let Some(seg) = p.alloc(0) {
        let u = seg.unit as usize;
        assert!(!used[u], "unit {u} is in use");
        assert!(
            owner[u].replace(seg.stamp).is_none(),
            "unit {u} handed out twice"
        );
        order.push(u);
    }
    assert_eq!(order.len(), 62, "every free unit, once");
    assert_eq!(p.free_bytes(), 0);
    assert!(!p.has_room_for(0));
    // The lists first (units 40 and up), then the untouched region from
    // its top down.
    let first_untouched = order.iter().position(|&u| u < 40).unwrap();
    assert!(order[..first_untouched].iter().all(|&u| u >= 40));
    assert_eq!(first_untouched, 22);
    assert!(order[first_untouched..].iter().all(|&u| u < 40));
    assert_eq!(
        order[first_untouched] / 4,
        9,
        "the untouched region's top block first"
    );
}

#[test]
fn a_single_writer_appends_what_a_shared_writer_would_across_segments() {
    let p = pool(256, 4);
    let shared = Window::new();
    let single = Window::new_single();
    let mut writer = SingleWriter::new();
    let k = keep(1 << 20, 1 << 20);
    assert!(!single.takes_shared_appends(), "its writer is live");
    for seq in 1..=60u64 {
        let body = payload(seq, (seq as usize * 7) % 90);
        assert_eq!(shared.append(&p, A, &k, 3, seq * 10, &body, 0), Ok(seq));
        assert_eq!(
            single.append_single(&p, B, &k, &mut writer, 3, seq * 10, &body, 0),
            Ok(seq)
        );
    }
    assert_eq!(single.high_water(&p), 60);
    assert_eq!(single.held_units(), shared.held_units(), "same chain shape");
    assert_eq!(
        read_all(&single, &p, B, 0, None),
        read_all(&shared, &p, A, 0, None)
    );
    assert_eq!(read_all(&single, &p, B, 37, None).len(), 23);
    assert_eq!(place(&single, &p, B, 41).0.appended_ms, Some(410));
    // Retention applies to its chain as to any.
    let small = keep(4, 1 << 20);
    for seq in 61..=200u64 {
        single
            .append_single(&p, B, &small, &mut writer, 3, 0, &payload(seq, 40), 0)
            .unwrap();
    }
    assert!(single.oldest_retained(&p) > 100, "old segments released");
}

/// Appends event `seq` (40 bytes) to `w`: by its single writer when
/// `writer` is given, else as a shared appender.
fn append_event(
    w: &Window,
    p: &Pool,
    k: &Retention,
    writer: Option<&mut SingleWriter>,
    seq: u64,
) -> Result<u64, AppendFailure> {
    match writer {
        Some(writer) => w.append_single(p, A, k, writer, 0, 0, &payload(seq, 40), 0),
        None => w.append(p, A, k, 0, 0, &payload(seq, 40), 0),
    }
}

/// Appends to `w` ([`append_event`]) until its oldest segment changes;
/// returns the new head's and the released oldest's allocations, and what
/// a cursor placed in the released segment before it went reads next.
fn roll_the_oldest_segment(
    w: &Window,
    p: &Pool,
    k: &Retention,
    mut writer: Option<&mut SingleWriter>,
    next_seq: &mut u64,
) -> (SegRef, SegRef, Read) {
    let (oldest, header) = w.oldest_segment(p).expect("the window holds events");
    let mut c = w.cursor_after(header.first_seq - 1);
    let mut buf = Vec::new();
    assert!(matches!(
        w.read(p, A, &mut c, None, &mut buf),
        Read::Event(_)
    ));
    while w.oldest_segment(p).map(|(seg, _)| seg) == Some(oldest) {
        let appended = append_event(w, p, k, writer.as_deref_mut(), *next_seq);
        assert_eq!(appended, Ok(*next_seq));
        *next_seq += 1;
    }
    let head = SegRef::unpack(w.head_word()).expect("a head");
    (head, oldest, w.read(p, A, &mut c, None, &mut buf))
}

#[test]
fn a_window_opening_a_segment_of_its_oldest_class_reuses_the_oldest_and_its_readers_lag() {
    let k = keep(8, 1 << 20);
    for single in [false, true] {
        let p = pool(64, 4);
        let w = if single {
            Window::new_single()
        } else {
            Window::new()
        };
        let mut writer = SingleWriter::new();
        let first = append_event(&w, &p, &k, single.then_some(&mut writer), 1);
        assert_eq!(first, Ok(1));
        let mut seq = 2;
        // Past the first, smaller segments: the window's classes settle.
        for _ in 0..4 {
            let writer = single.then_some(&mut writer);
            roll_the_oldest_segment(&w, &p, &k, writer, &mut seq);
        }
        let free = p.free_bytes();
        for _ in 0..4 {
            let writer = single.then_some(&mut writer);
            let (head, released, read) = roll_the_oldest_segment(&w, &p, &k, writer, &mut seq);
            assert_eq!(head.unit, released.unit, "single {single}: reused");
            assert_ne!(head.stamp, released.stamp, "a new allocation");
            assert!(
                matches!(read, Read::Lagged { .. }),
                "single {single}: a reader in the released segment lags, got {read:?}"
            );
            assert_eq!(p.free_bytes(), free, "nothing went through the lists");
        }
        let kept = read_all(&w, &p, A, w.oldest_retained(&p) - 1, None);
        assert!(kept.len() >= 8);
        for (n, body) in &kept {
            assert_eq!(body, &payload(*n, 40), "event {n} is its own");
        }
        assert_eq!(kept.last().map(|e| e.0), Some(seq - 1));
    }
}

#[test]
fn segments_grow_to_hold_several_large_events_within_the_roomy_class() {
    // 128-byte units. A 300-byte event's frame (328 bytes) needs a
    // 512-byte segment, which holds one; four need 2 KiB (class 4).
    let p = pool(1024, 6);
    let plain = keep(1 << 20, 1 << 20);
    let roomy = Retention {
        roomy_class: 4,
        ..plain
    };
    let (a, b, c) = (Window::new(), Window::new(), Window::new_single());
    let mut writer = SingleWriter::new();
    for seq in 1..=60u64 {
        let body = payload(seq, 300);
        assert_eq!(a.append(&p, A, &plain, 1, seq, &body, 0), Ok(seq));
        assert_eq!(b.append(&p, B, &roomy, 1, seq, &body, 0), Ok(seq));
        assert_eq!(
            c.append_single(&p, A, &roomy, &mut writer, 1, seq, &body, 0),
            Ok(seq)
        );
    }
    // Without it: one event per 512-byte segment, the rest of it unused.
    assert_eq!(a.held_units(), 60 * 4);
    // With it: 512 bytes (one event), 1 KiB (two), then 2 KiB segments of
    // five: 57 events in twelve, the last one partly filled.
    assert_eq!(b.held_units(), 4 + 8 + 16 * 12);
    assert_eq!(
        c.held_units(),
        b.held_units(),
        "both append paths grow alike"
    );
    let want = read_all(&a, &p, A, 0, None);
    assert_eq!(want.len(), 60);
    assert_eq!(read_all(&b, &p, B, 0, None), want);
    assert_eq!(read_all(&c, &p, A, 0, None), want);
    assert_eq!(read_all(&b, &p, B, 29, None), want[29..]);
    // Small events never reach past `grow_class`: 40-byte frames fill a
    // class-1 segment four at a time already.
    let d = Window::new();
    for seq in 1..=40u64 {
        d.append(&p, B, &roomy, 1, seq, &payload(seq, 16), 0)
            .unwrap();
    }
    assert!(d.held_units() <= 2 * 10 + 2, "{} units", d.held_units());
}

#[test]
fn a_close_leaves_the_live_writers_head_to_it_and_it_frees_it() {
    let p = pool(64, 4);
    let total = p.free_bytes();
    let w = Window::new_single();
    let mut writer = SingleWriter::new();
    let k = keep(1 << 20, 1 << 20);
    for seq in 1..=30u64 {
        w.append_single(&p, A, &k, &mut writer, 0, 0, &payload(seq, 50), 0)
            .unwrap();
    }
    let mut c = w.cursor_after(10);
    let held = total - p.free_bytes();
    assert!(w.close(&p).is_empty());
    let left = total - p.free_bytes();
    assert!(left > 0, "the head segment is still the writer's");
    assert!(left < held, "the segments before it are freed");
    assert_eq!(w.read(&p, A, &mut c, None, &mut Vec::new()), Read::Ended);
    // The writer learns of the close at its next append, and frees it.
    assert_eq!(
        w.append_single(&p, A, &k, &mut writer, 0, 0, b"late", 0),
        Err(AppendFailure::Ended)
    );
    assert_eq!(p.free_bytes(), total, "every segment is back");
    assert_eq!(
        w.append_single(&p, A, &k, &mut writer, 0, 0, b"later", 0),
        Err(AppendFailure::Ended)
    );
    w.writer_done(&p, &mut writer);
    assert!(w.close(&p).is_empty(), "closing twice is harmless");
    assert_eq!(p.free_bytes(), total, "and frees nothing twice");
}

#[test]
fn a_writer_dropped_before_the_close_hands_the_session_to_shared_appends() {
    let p = pool(64, 4);
    let total = p.free_bytes();
    let k = keep(1 << 20, 1 << 20);
    // Dropped after appending: shared appends continue the numbering.
    let w = Window::new_single();
    let mut writer = SingleWriter::new();
    for seq in 1..=5u64 {
        w.append_single(&p, A, &k, &mut writer, 0, 0, &payload(seq, 50), 0)
            .unwrap();
    }
    w.writer_done(&p, &mut writer);
    assert!(w.takes_shared_appends());
    assert_eq!(w.append(&p, A, &k, 0, 0, &payload(6, 50), 0), Ok(6));
    assert_eq!(read_all(&w, &p, A, 0, None).len(), 6);
    assert!(w.close(&p).is_empty());
    assert_eq!(p.free_bytes(), total, "the close freed the whole chain");
    // Closed while the writer is live, then the writer is dropped.
    let w = Window::new_single();
    let mut writer = SingleWriter::new();
    w.append_single(&p, A, &k, &mut writer, 0, 0, b"one", 0)
        .unwrap();
    assert!(w.close(&p).is_empty());
    assert!(p.free_bytes() < total, "left to the writer");
    w.writer_done(&p, &mut writer);
    assert_eq!(p.free_bytes(), total, "the writer freed its head");
    // Never appended: nothing to hand over either way.
    let w = Window::new_single();
    let mut writer = SingleWriter::new();
    assert!(w.close(&p).is_empty());
    assert_eq!(
        w.append_single(&p, A, &k, &mut writer, 0, 0, b"x", 0),
        Err(AppendFailure::Ended)
    );
    assert_eq!(p.free_bytes(), total);
}

#[test]
fn a_single_writer_refuses_what_the_shared_path_refuses() {
    let p = pool(4, 1);
    let w = Window::new_single();
    let mut writer = SingleWriter::new();
    let k = keep(1 << 20, 1 << 20);
    let max = max_payload(&p);
    assert_eq!(
        w.append_single(&p, A, &k, &mut writer, 0, 0, &vec![0; max + 1], 0),
        Err(AppendFailure::TooLarge { max })
    );
    let mut seq = 0;
    let full = loop {
        match w.append_single(&p, A, &k, &mut writer, 0, 0, &[7; 100], 0) {
            Ok(s) => seq = s,
            Err(e) => break e,
        }
    };
    assert!(matches!(full, AppendFailure::PoolFull { .. }), "{full:?}");
    assert_eq!(w.high_water(&p), seq, "nothing half-stored");
    assert_eq!(read_all(&w, &p, A, 0, None).len() as u64, seq);
}

/// Everything `read_many` delivers from `after` on, in calls of at most
/// `max_events` events and `max_bytes` bytes, and what ended the last call.
fn read_all_batched(
    w: &Window,
    p: &Pool,
    after: u64,
    stream: u32,
    max_events: usize,
    max_bytes: usize,
) -> (Vec<(u64, Vec<u8>)>, Read) {
    let mut c = w.cursor_after(after);
    let mut out = Vec::new();
    let (mut buf, mut events) = (Vec::new(), Vec::new());
    loop {
        buf.clear();
        events.clear();
        let stopped = w.read_many(
            p,
            A,
            &mut c,
            stream,
            &mut buf,
            &mut events,
            max_events,
            max_bytes,
        );
        assert!(events.len() <= max_events);
        for &(seq, start, end) in &events {
            out.push((seq, buf[start as usize..end as usize].to_vec()));
        }
        match stopped {
            None => assert!(
                !events.is_empty(),
                "a call that stops at a limit took something"
            ),
            Some(Read::Event(_)) => unreachable!("read_many reports events in `events`"),
            Some(other) => return (out, other),
        }
    }
}

#[test]
fn batched_reads_cross_seals_and_skip_other_streams_as_single_reads_do() {
    let p = pool(64, 4);
    let w = Window::new();
    let k = keep(1 << 20, 1 << 20);
    for seq in 1..=80u64 {
        let len = (seq as usize * 13) % 70;
        let stream = if seq % 3 == 0 { 9 } else { 4 };
        assert_eq!(
            w.append(&p, A, &k, stream, seq, &payload(seq, len), 0),
            Ok(seq)
        );
    }
    assert!(w.held_units() > 4, "the chain crosses several seals");
    for after in [0, 1, 17, 79, 80] {
        let want = read_all(&w, &p, A, after, Some(4));
        for (max_events, max_bytes) in [(usize::MAX, usize::MAX), (1, usize::MAX), (7, 100)] {
            let (got, end) = read_all_batched(&w, &p, after, 4, max_events, max_bytes);
            assert_eq!(got, want, "after {after}, limits {max_events}/{max_bytes}");
            assert!(matches!(end, Read::Pending), "after {after}: {end:?}");
        }
    }
    // Closed: a batch reports the end, as a single read does.
    w.close(&p);
    let (got, end) = read_all_batched(&w, &p, 0, 9, usize::MAX, usize::MAX);
    assert!(got.is_empty(), "{got:?}");
    assert!(matches!(end, Read::Ended), "{end:?}");
}

/// A pool of four top-class segments that each span several release
/// granules (pages; the heap pool of a Miri run releases 8-word granules).
fn trimmable_pool() -> (Pool, u8) {
    #[cfg(miri)]
    let (unit_words, top) = (16, 2);
    // 4 KiB units, 256 KiB segments: several pages even where pages are 64 KiB.
    #[cfg(not(miri))]
    let (unit_words, top) = (512, 6);
    let p = Pool::new(PoolShape {
        units: 4 << top,
        unit_words,
        top_class: top,
    })
    .expect("a test pool fits in memory");
    (p, top)
}

#[test]
fn a_segment_free_for_a_whole_trim_interval_is_given_back_and_comes_back_usable() {
    use crate::sync::Ordering::Relaxed;
    let (p, top) = trimmable_pool();
    let words = p.shape().class_words(top);
    let segs: Vec<_> = (0..4).map(|_| p.alloc(top).expect("four fit")).collect();
    for s in &segs {
        for w in p.segment(s.unit, top) {
            w.store(0xdead_beef, Relaxed);
        }
    }
    p.free(segs[0], top);
    p.free(segs[1], top);
    assert_eq!(
        p.trim(usize::MAX),
        0,
        "the first pass only marks what is free"
    );
    assert_eq!(p.released_bytes(), 0);
    // Reused (and freed again) between the passes: not released by the next.
    let again = p.alloc(top).expect("a free segment");
    assert_eq!(again.unit, segs[1].unit, "the newest free segment first");
    p.free(again, top);

    let released = p.trim(usize::MAX);
    assert!(
        released > 0 && released < words as u64 * 8,
        "one segment released, but not its first granule: {released}"
    );
    assert_eq!(p.released_bytes(), words as u64 * 8);
    assert_eq!(
        p.free_bytes(),
        2 * words as u64 * 8,
        "trimming frees nothing"
    );
    let gone = p.segment(segs[0].unit, top);
    assert_eq!(
        gone[words - 1].load(Relaxed),
        0,
        "released words read as zeros"
    );
    assert_ne!(
        gone[0].load(Relaxed),
        0xdead_beef,
        "the first word is the free list's link"
    );
    for s in &segs[1..] {
        let kept = p.segment(s.unit, top);
        assert_eq!(
            kept[words - 1].load(Relaxed),
            0xdead_beef,
            "unit {}",
            s.unit
        );
    }

    // The warm segment is handed out first, then the released one, which
    // holds what its new owner writes.
    let warm = p.alloc(top).expect("warm");
    assert_eq!(warm.unit, segs[1].unit);
    let cold = p.alloc(top).expect("cold");
    assert_eq!(cold.unit, segs[0].unit);
    assert!(cold.stamp % 2 == 1 && cold.stamp > segs[0].stamp);
    assert_eq!(p.released_bytes(), 0);
    let seg = p.segment(cold.unit, top);
    for (i, w) in seg.iter().enumerate() {
        w.store(i as u64, Relaxed);
    }
    assert!(seg
        .iter()
        .enumerate()
        .all(|(i, w)| w.load(Relaxed) == i as u64));
    assert!(
        p.alloc(top).is_none() && p.alloc(0).is_none(),
        "the pool is full"
    );
}

#[test]
fn a_trim_pass_releases_at_most_its_budget_and_merging_takes_released_segments() {
    let (p, top) = trimmable_pool();
    let words = p.shape().class_words(top) as u64;
    let segs: Vec<_> = (0..4).map(|_| p.alloc(top).expect("four fit")).collect();
    for &s in &segs {
        p.free(s, top);
    }
    assert_eq!(p.trim(1), 0, "the first pass only marks");
    let one = p.trim(1);
    assert!(one > 0);
    assert_eq!(p.released_bytes(), words * 8, "one segment per pass of one");
    assert_eq!(p.trim(0), 0, "a pass without budget releases nothing");
    assert_eq!(p.trim(1), one);
    assert_eq!(p.released_bytes(), 2 * words * 8);
    p.trim(usize::MAX);
    assert_eq!(p.released_bytes(), 4 * words * 8);
    assert_eq!(
        p.trim(usize::MAX),
        0,
        "released segments are not released again"
    );
    // Smaller classes split a released segment; merging puts it together
    // again, from warm and released pieces alike.
    let small: Vec<_> = (0..4).map(|_| p.alloc(top - 1).expect("halves")).collect();
    for &s in &small {
        p.free(s, top - 1);
    }
    let whole: Vec<_> = (0..4).map(|_| p.alloc(top).expect("merged back")).collect();
    assert_eq!(p.free_bytes(), 0);
    assert_eq!(p.released_bytes(), 0);
    for s in whole {
        p.free(s, top);
    }
    assert_eq!(p.free_bytes(), 4 * words * 8);
}

#[test]
fn small_segments_free_for_a_whole_interval_merge_and_are_given_back_as_large_ones() {
    let (p, top) = trimmable_pool();
    let all = p.free_bytes();
    let small: Vec<_> = std::iter::from_fn(|| p.alloc(0)).collect();
    assert_eq!(small.len(), 4 << top);
    // One stays in use: its buddies merge up to it and no further.
    let kept = small[0];
    for &s in &small[1..] {
        p.free(s, 0);
    }
    assert_eq!(p.trim(usize::MAX), 0, "the first pass only marks");
    let released = p.trim(usize::MAX);
    // Three whole top-class segments, and the top-class block around the
    // one in use as one segment of each class below it: each released in
    // one piece wherever it spans two granules.
    let top_bytes = p.shape().class_words(top) as u64 * 8;
    assert!(released > 3 * top_bytes / 2, "{released} of {all}");
    assert!(p.released_bytes() >= 3 * top_bytes);
    // Merged segments carry retired upper stamps: every unit is handed out
    // exactly once again, and the one in use was never touched.
    let seg = p.segment(kept.unit, 0);
    seg[3].store(42, crate::sync::Ordering::Relaxed);
    let mut again: Vec<_> = std::iter::from_fn(|| p.alloc(0)).map(|s| s.unit).collect();
    again.sort_unstable();
    let others: Vec<u32> = (0..4 << top).filter(|&u| u != kept.unit).collect();
    assert_eq!(again, others);
    assert_eq!(seg[3].load(crate::sync::Ordering::Relaxed), 42);
    assert_eq!(p.released_bytes(), 0);
}

#[test]
fn a_new_pool_writes_nothing_in_its_whole_top_class_blocks_until_it_hands_them_out() {
    // Four whole blocks of 8 units, then 5 units that go on the lists.
    let p = pool(4 * 8 + 5, 3);
    let untouched = |p: &Pool, units: std::ops::Range<u32>| {
        units.clone().all(|u| {
            p.stamp_now(u, crate::sync::Ordering::Relaxed) == 0
                && p.state(u).load(crate::sync::Ordering::Relaxed) == 0
                && p.segment(u, 0)
                    .iter()
                    .all(|w| w.load(crate::sync::Ordering::Relaxed) == 0)
        })
    };
    assert!(untouched(&p, 0..32), "a new pool wrote into its blocks");
    assert_eq!(p.free_bytes(), 37 * 16 * 8, "every unit counts as free");
    assert_eq!(
        p.released_bytes(),
        32 * 16 * 8,
        "the untouched blocks count as not resident"
    );
    // Trim passes mark and release what is on the lists, never the
    // untouched blocks (marking one writes its stamp word).
    p.trim(usize::MAX);
    p.trim(usize::MAX);
    assert!(
        untouched(&p, 0..32),
        "a trim pass wrote into untouched blocks"
    );
    // The lists' 5 units first, then the blocks from the top down, each
    // unit once; then the pool is full.
    let order: Vec<u32> = std::iter::from_fn(|| p.alloc(0)).map(|s| s.unit).collect();
    assert_eq!(order.len(), 37);
    assert!(order[..5].iter().all(|&u| u >= 32), "{order:?}");
    assert!((24..32).contains(&order[5]), "top block first: {order:?}");
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..37).collect::<Vec<_>>());
    assert_eq!(p.free_bytes(), 0);
    assert_eq!(p.released_bytes(), 0);
}

/// Rewrites every sealed segment's state word of `w` as a word that keeps
/// no count (as one written before counts were kept); returns how many.
fn forget_sealed_counts(w: &Window, p: &Pool) -> usize {
    use super::layout::State;
    use crate::sync::Ordering;
    let mut forgotten = 0;
    let mut seg = w.oldest_segment(p).map(|(seg, _)| seg);
    while let Some(s) = seg {
        let state = p.state(s.unit);
        seg = match State::decode(state.load(Ordering::Relaxed), s.stamp) {
            Some(State::Next { next, count }) => {
                assert!(count.is_some(), "a seal keeps a small count");
                state.store(
                    State::Next { next, count: None }.encode(s.stamp),
                    Ordering::Relaxed,
                );
                forgotten += 1;
                Some(SegRef {
                    unit: next,
                    stamp: p.stamp_now(next, Ordering::Relaxed),
                })
            }
            _ => None,
        };
    }
    forgotten
}

#[test]
fn a_cursor_placed_by_a_sealed_segments_kept_count_reads_on_into_its_successor() {
    // A seal keeps the segment's count in its state word, so a cursor
    // placed inside a sealed segment is placed without its successor's
    // header; the reader loads that header when it reaches the end. Every
    // position, single and batched reads, both append paths — and the
    // same answers from words that keep no count, as older pools have.
    let p = pool(if cfg!(miri) { 128 } else { 512 }, 2);
    let shared = Window::new();
    let single = Window::new_single();
    let mut writer = SingleWriter::new();
    let k = Retention {
        first_class: 0,
        grow_class: 1,
        roomy_class: 1,
        ..keep(1 << 20, 1 << 20)
    };
    // Under Miri a shorter chain, every fifth position.
    let (events, step) = if cfg!(miri) { (30u64, 5) } else { (70, 1) };
    let mut want = Vec::new();
    for seq in 1..=events {
        let body = payload(seq, 10 + (seq as usize * 11) % 40);
        assert_eq!(shared.append(&p, A, &k, 0, seq * 10, &body, 0), Ok(seq));
        assert_eq!(
            single.append_single(&p, A, &k, &mut writer, 0, seq * 10, &body, 0),
            Ok(seq)
        );
        want.push((seq, body));
    }
    for (name, w) in [("shared", &shared), ("single", &single)] {
        for counts_kept in [true, false] {
            if !counts_kept {
                assert!(forget_sealed_counts(w, &p) > 5, "{name}: a long chain");
            }
            for after in (0..=events).filter(|a| a % step == 0 || *a == events) {
                let (placed, mut c) = place(w, &p, A, after);
                assert_eq!(placed.high_water, events);
                if after > 0 {
                    assert_eq!(placed.appended_ms, Some(after * 10), "{name} {after}");
                }
                assert_eq!(
                    read_from(w, &p, &mut c),
                    Ok(want[after as usize..].to_vec()),
                    "{name}, counts kept: {counts_kept}, after {after}"
                );
                assert_eq!(
                    read_all_batched(w, &p, after, 0, 5, 1 << 20),
                    (want[after as usize..].to_vec(), Read::Pending),
                    "{name} batched, counts kept: {counts_kept}, after {after}"
                );
            }
        }
    }
    // Placed inside the sealed oldest segment by its count, then that
    // segment and its successors are released and their units reused by
    // another owner before the first read: the reader lags, it never
    // reads the new owner's bytes.
    let w = Window::new();
    let other = Window::new();
    for seq in 1..=events {
        w.append(&p, A, &k, 0, 0, &payload(seq, 30), 0).unwrap();
    }
    let (_, mut c) = place(&w, &p, A, 1);
    while w.oldest_retained(&p) <= 10 {
        assert!(w.retain(&p, &keep(events - 15, u64::MAX), true) > 0);
    }
    while other.append(&p, B, &k, 0, 0, &[0xbb; 40], 0).is_ok() {}
    let mut buf = Vec::new();
    match w.read(&p, A, &mut c, None, &mut buf) {
        Read::Lagged { missing } => assert_eq!(missing, 2),
        got => panic!("read {got:?} from a released segment"),
    }
    w.close(&p);
    shared.close(&p);
    single.close(&p);
    other.close(&p);
}

/// What the shared appenders' wake-up check asks of a parking reader
/// (`Session::listen`): its announcement lands on the word the next claim
/// is CASed on, whatever state the window is in, and a read that stops at
/// a frame claimed but not written says so, while one that stops where
/// nothing is claimed does not.
#[test]
fn a_reader_tells_a_frame_being_written_from_nothing_claimed() {
    let p = pool(8, 3);
    let k = keep(1 << 20, 1 << 20);
    let w = Window::new();
    let mut c = w.cursor_after(0);
    let mut buf = Vec::new();
    // Empty: the announcement is on the head word, which it leaves as it was.
    assert!(w.announce(&p));
    assert_eq!(w.head_word(), 0);
    assert_eq!(w.read(&p, A, &mut c, None, &mut buf), Read::Pending);
    assert!(!c.at_a_claimed_frame(), "nothing is claimed yet");
    w.append(&p, A, &k, 0, 0, b"one", 0).unwrap();
    assert!(matches!(
        w.read(&p, A, &mut c, None, &mut buf),
        Read::Event(_)
    ));
    assert_eq!(w.read(&p, A, &mut c, None, &mut buf), Read::Pending);
    assert!(
        !c.at_a_claimed_frame(),
        "frame 1 was read, frame 2 not claimed"
    );
    // Open head: announced on its state word, which keeps its value.
    let head = SegRef::unpack(w.head_word()).unwrap();
    let state = p.state(head.unit).load(crate::sync::Ordering::Relaxed);
    assert!(w.announce(&p));
    assert_eq!(
        p.state(head.unit).load(crate::sync::Ordering::Relaxed),
        state
    );
    assert_eq!(w.head_word(), head.pack());
    // A writer claims frame 2 and is still copying it.
    claim_unwritten(&p, head, 32);
    assert_eq!(w.read(&p, A, &mut c, None, &mut buf), Read::Pending);
    assert!(c.at_a_claimed_frame(), "frame 2 is claimed, not written");
    // Closed: nothing to announce on, and the close wakes every reader.
    w.close(&p);
    assert!(w.announce(&p));
}
