//! Recovery on hand-made crash states: a pool is filled through the real
//! append path, its words are copied into a fresh pool (what a restart
//! maps), the crash is simulated on the copy, and recovery runs on it.

use super::backing::Backing;
use super::layout::{
    table_entry, table_offset, SegRef, SegmentHeader, State, FRAME_HEADER_WORDS, HEADER_WORDS,
};
use super::*;
use crate::sync::{AtomicU64, Ordering};

const A: Owner = Owner { tag: 0xa, epoch: 1 };
/// The check the files this build makes give their frames.
const CHECK: FrameCheck = FrameCheck::OwnerStreamAndPayload;

fn shape() -> PoolShape {
    PoolShape {
        units: 16,
        unit_words: 16,
        top_class: 4,
    }
}

fn keep() -> Retention {
    Retention {
        max_events: 1000,
        max_bytes: 1 << 20,
        first_class: 0,
        grow_class: 2,
        roomy_class: 2,
        hold_bytes: 0,
    }
}

/// The words of `p` in a fresh pool with empty free lists.
fn restart(p: &Pool) -> Pool {
    let backing = Backing::in_memory(shape().total_words()).expect("a test pool fits in memory");
    for (to, from) in backing.words().iter().zip(p_words(p)) {
        to.store(from, Ordering::Relaxed);
    }
    Pool::over(backing, shape())
}

fn p_words(p: &Pool) -> Vec<u64> {
    let s = shape();
    let mut out = Vec::new();
    for u in 0..s.units {
        out.push(p.stamp(u).load(Ordering::Relaxed));
    }
    for u in 0..s.units {
        out.push(p.state(u).load(Ordering::Relaxed));
    }
    for u in 0..s.units {
        out.extend(p.segment(u, 0).iter().map(|w| w.load(Ordering::Relaxed)));
    }
    out
}

/// A pool crc-checked like a durable one: every payload's check is its
/// CRC-32.
fn append(w: &Window, p: &Pool, stream: u32, payload: &[u8]) -> u64 {
    w.append(
        p,
        A,
        &keep(),
        stream,
        0,
        payload,
        CHECK.of((A.tag, A.epoch), stream, payload),
    )
    .unwrap()
}

fn read_all(w: &Window, p: &Pool, stream: u32) -> Vec<(u64, Vec<u8>)> {
    let (events, gaps) = read_told(w, p, stream);
    assert!(gaps.is_empty(), "lagged at {gaps:?}");
    events
}

#[test]
fn only_a_pool_that_may_be_recovered_writes_the_header_check() {
    // A heap pool's headers are never verified: no check is computed. A
    // pool that recovery may read (a file's; here a heap one marked so)
    // gets one that verifies for the segment's stamp.
    for checks in [false, true] {
        let p = Pool::new(shape()).expect("a test pool fits in memory");
        let p = if checks { p.with_header_checks() } else { p };
        let w = Window::new();
        append(&w, &p, 1, b"one event");
        let (seg, header) = w.oldest_segment(&p).expect("the event's segment");
        assert_eq!(header.verifies(seg.stamp), checks, "checks: {checks}");
        assert_eq!(header.check == 0, !checks, "checks: {checks}");
    }
}

#[test]
fn a_spare_that_names_the_head_as_predecessor_never_wins_over_the_chain() {
    let p = Pool::new(shape())
        .expect("a test pool fits in memory")
        .with_header_checks();
    // The first allocation of this pool is its lowest unit: the spare
    // below sits before every segment of the chain in recovery's scan.
    let spare = p.alloc(0).unwrap();
    assert_eq!(spare.unit, 0);
    // One event: the chain is one segment, as long as the spare's.
    let w = Window::new();
    append(&w, &p, 1, &[7; 20]);
    let head = SegRef::unpack(w.head_word()).unwrap();
    let high = w.high_water(&p);
    let after = restart(&p);
    // An appender prepared `spare` to follow the head, then died.
    prepare_spare(&after, spare, high + 1, head);
    let r = recover::recover(&after, &[A], CHECK, false);
    let w = r.windows[0].as_ref().expect("proven");
    assert_eq!(w.high_water(&after), high);
    assert_eq!(read_all(w, &after, 1), vec![(1, vec![7; 20])]);
    // It starts right after the head's claims, so it may as well be the
    // successor whose seal was lost: linked after the head, it becomes the
    // (empty) head, and nothing changes for the events or their numbers.
    assert_eq!(r.dropped_segments, 0);
    assert_eq!(
        SegRef::unpack(w.head_word()).map(|s| s.unit),
        Some(0),
        "the spare is the head"
    );
    assert_eq!(append(w, &after, 1, &[8; 20]), high + 1);
    assert_eq!(
        read_all(w, &after, 1),
        vec![(1, vec![7; 20]), (high + 1, vec![8; 20])]
    );
}

#[test]
fn a_spare_prepared_before_appends_that_went_on_in_the_head_is_freed() {
    let p = Pool::new(shape())
        .expect("a test pool fits in memory")
        .with_header_checks();
    let spare = p.alloc(0).unwrap();
    let w = Window::new();
    append(&w, &p, 1, &[7; 20]);
    let head = SegRef::unpack(w.head_word()).unwrap();
    let after = restart(&p);
    // Prepared to follow the head at number 1, when the head was empty;
    // the head's event 1 claimed that number since.
    prepare_spare(&after, spare, 1, head);
    let r = recover::recover(&after, &[A], CHECK, false);
    let w = r.windows[0].as_ref().expect("proven");
    assert_eq!(w.high_water(&after), 1);
    assert_eq!(read_all(w, &after, 1), vec![(1, vec![7; 20])]);
    assert_eq!(r.dropped_segments, 1, "the spare is freed");
    assert_eq!(after.stamp_now(spare.unit, Ordering::Relaxed) & 1, 0);
}

#[test]
fn an_unfinished_frame_between_finished_ones_becomes_a_skipped_placeholder() {
    let p = Pool::new(shape())
        .expect("a test pool fits in memory")
        .with_header_checks();
    let w = Window::new();
    for i in 1..=16u8 {
        append(&w, &p, 1, &[i; 20]);
    }
    // Segments of 1, 3, 8, ... frames. The second one (sealed, events 2 to
    // 4) lost the mark of its middle frame, event 3: its writer was killed
    // after other writers went on.
    let after = restart(&p);
    let second = (0..shape().units)
        .find(|&u| {
            let stamp = after.stamp_now(u, Ordering::Relaxed);
            stamp & 1 == 1 && after.segment(u, 0)[3].load(Ordering::Relaxed) == 2
        })
        .expect("the second segment");
    let stamp = after.stamp_now(second, Ordering::Relaxed);
    let seg = after.segment(second, 1);
    let entry = seg[seg.len() - 2].load(Ordering::Relaxed);
    let offset = table_offset(entry, stamp).unwrap() as usize;
    seg[offset].store(0, Ordering::Relaxed);
    let r = recover::recover(&after, &[A], CHECK, false);
    assert_eq!(r.damaged_frames, 0, "an unfinished frame is not damage");
    let w = r.windows[0].as_ref().expect("proven");
    let seqs: Vec<u64> = read_all(w, &after, 1).iter().map(|(s, _)| *s).collect();
    let want: Vec<u64> = (1..=16).filter(|&s| s != 3).collect();
    assert_eq!(
        seqs, want,
        "every finished event, the unfinished one skipped"
    );
    for (seq, bytes) in read_all(w, &after, 1) {
        assert_eq!(bytes, vec![seq as u8; 20]);
    }
    assert_eq!(append(w, &after, 1, b"next"), 17);
}

/// Makes `spare` what an appender leaves when it dies after preparing a
/// segment to follow `head` at `first_seq`, before sealing: its header
/// (checked) and an open, empty state.
fn prepare_spare(after: &Pool, spare: SegRef, first_seq: u64, head: SegRef) {
    put_header(
        after,
        spare.unit,
        SegmentHeader {
            owner_tag: A.tag,
            owner_epoch: A.epoch,
            first_seq,
            prev: head.pack(),
            ..SegmentHeader::default()
        }
        .checked(spare.stamp),
    );
    after.state(spare.unit).store(
        State::Open { count: 0, used: 0 }.encode(spare.stamp),
        Ordering::Relaxed,
    );
}

/// The unit of the owned segment whose first frame is `first_seq`.
fn segment_starting_at(p: &Pool, first_seq: u64) -> u32 {
    (0..shape().units)
        .find(|&u| {
            p.stamp_now(u, Ordering::Relaxed) & 1 == 1
                && p.segment(u, 0)[3].load(Ordering::Relaxed) == first_seq
        })
        .expect("a segment starting there")
}

/// Writes `header` into `unit`'s header words.
fn put_header(p: &Pool, unit: u32, header: SegmentHeader) {
    for (word, v) in p.segment(unit, 0)[..HEADER_WORDS]
        .iter()
        .zip(header.to_words())
    {
        word.store(v, Ordering::Relaxed);
    }
}

#[test]
fn a_unit_allocated_but_not_yet_written_is_no_candidate_whatever_its_old_words_claim() {
    let p = Pool::new(shape())
        .expect("a test pool fits in memory")
        .with_header_checks();
    let w = Window::new();
    for i in 1..=12u8 {
        append(&w, &p, 1, &[i; 20]);
    }
    let high = w.high_water(&p);
    // A unit on the free list, not inside any segment.
    let free = p.alloc(0).unwrap();
    p.free(free, 0);
    let after = restart(&p);
    // An earlier life of the unit left a header and state of this session
    // claiming far more than the session has; then the unit was allocated
    // again (its stamp made odd) and the process died before the header
    // was written.
    let old = after.stamp_now(free.unit, Ordering::Relaxed) | 1;
    put_header(
        &after,
        free.unit,
        SegmentHeader {
            owner_tag: A.tag,
            owner_epoch: A.epoch,
            first_seq: high + 100,
            ..SegmentHeader::default()
        }
        .checked(old),
    );
    after.state(free.unit).store(
        State::Open { count: 3, used: 96 }.encode(old),
        Ordering::Relaxed,
    );
    after
        .stamp(free.unit)
        .store(u64::from(old + 2), Ordering::Relaxed);
    // After a machine restart the same words could be a successor whose
    // new header never reached the device, its predecessor's seal lost
    // with it: the session is not restored (its numbers past `high` may
    // have been handed out).
    let copy = restart(&after);
    let r = recover::recover(&copy, &[A], CHECK, true);
    assert_eq!(r.unverified_headers, 1);
    assert!(r.windows[0].is_none());
    // After a process crash the page cache kept every write: a unit whose
    // new header was never written received no frames.
    let r = recover::recover(&after, &[A], CHECK, false);
    assert_eq!(r.unverified_headers, 1);
    let w = r.windows[0].as_ref().expect("the session's own chain");
    assert_eq!(w.high_water(&after), high);
    let seqs: Vec<u64> = read_all(w, &after, 1).iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, (1..=high).collect::<Vec<_>>());
    assert_eq!(
        after.stamp_now(free.unit, Ordering::Relaxed) & 1,
        0,
        "freed"
    );
}

#[test]
fn a_chain_ending_in_an_unwritten_state_never_wins_over_one_that_can_be_restored() {
    let p = Pool::new(shape())
        .expect("a test pool fits in memory")
        .with_header_checks();
    let w = Window::new();
    for i in 1..=12u8 {
        append(&w, &p, 1, &[i; 20]);
    }
    let high = w.high_water(&p);
    let spare = p.alloc(0).unwrap();
    let after = restart(&p);
    // The process died between writing a fresh segment's header and its
    // state: the header verifies, the state is an earlier allocation's.
    put_header(
        &after,
        spare.unit,
        SegmentHeader {
            owner_tag: A.tag,
            owner_epoch: A.epoch,
            first_seq: high + 50,
            info: 0,
            ..SegmentHeader::default()
        }
        .checked(spare.stamp),
    );
    after.state(spare.unit).store(
        State::Open { count: 0, used: 0 }.encode(spare.stamp + 2),
        Ordering::Relaxed,
    );
    let r = recover::recover(&after, &[A], CHECK, false);
    let w = r.windows[0].as_ref().expect("the restorable chain");
    assert_eq!(w.high_water(&after), high);
    assert_eq!(read_all(w, &after, 1).len() as u64, high);
}

#[test]
fn a_flipped_bit_in_a_sealed_segments_header_drops_it_and_older_and_renumbers_nothing() {
    let p = Pool::new(shape())
        .expect("a test pool fits in memory")
        .with_header_checks();
    let w = Window::new();
    for i in 1..=20u8 {
        append(&w, &p, 1, &[i; 20]);
    }
    let after = restart(&p);
    // Segments of 1, 3, 8, ... frames: the second starts at 2.
    let second = segment_starting_at(&after, 2);
    after.segment(second, 0)[3].fetch_xor(1 << 3, Ordering::Relaxed);
    let r = recover::recover(&after, &[A], CHECK, false);
    assert_eq!(r.unverified_headers, 1);
    let w = r.windows[0].as_ref().expect("the newer segments");
    assert_eq!(w.high_water(&after), 20, "numbers are not reused");
    let kept = read_all_after_gap(w, &after);
    assert!(!kept.is_empty());
    let first = kept[0].0;
    assert!(
        first > 4,
        "nothing at or before the damaged segment: {first}"
    );
    for (seq, bytes) in &kept {
        assert_eq!(*bytes, vec![*seq as u8; 20], "event {seq} renumbered");
    }
    let seqs: Vec<u64> = kept.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, (first..=20).collect::<Vec<_>>());
}

#[test]
fn a_flipped_bit_in_the_heads_header_leaves_the_session_unrestored() {
    let p = Pool::new(shape())
        .expect("a test pool fits in memory")
        .with_header_checks();
    let w = Window::new();
    for i in 1..=20u8 {
        append(&w, &p, 1, &[i; 20]);
    }
    let head = SegRef::unpack(w.head_word()).unwrap();
    let after = restart(&p);
    after.segment(head.unit, 0)[3].fetch_xor(1 << 2, Ordering::Relaxed);
    let r = recover::recover(&after, &[A], CHECK, false);
    assert_eq!(r.unverified_headers, 1);
    assert!(
        r.windows[0].is_none(),
        "the newest numbers are unknown: restoring the older segments would hand them out again"
    );
}

/// Every event of stream 1 from the oldest held (the older ones are gone:
/// a reader from the start would be told of the gap first).
fn read_all_after_gap(w: &Window, p: &Pool) -> Vec<(u64, Vec<u8>)> {
    let mut c = w.cursor_after(w.oldest_retained(p) - 1);
    let mut out = Vec::new();
    let mut buf = Vec::new();
    while let Read::Event(m) = w.read(p, A, &mut c, Some(1), &mut buf) {
        out.push((m.seq, buf.clone()));
    }
    out
}

/// Every event of `stream` a reader from the start gets, and the numbers
/// of the gaps it is told about (each moved past).
fn read_told(w: &Window, p: &Pool, stream: u32) -> (Vec<(u64, Vec<u8>)>, Vec<u64>) {
    let mut c = w.cursor_after(0);
    let (mut events, mut gaps) = (Vec::new(), Vec::new());
    let mut buf = Vec::new();
    for _ in 0..1000 {
        match w.read(p, A, &mut c, Some(stream), &mut buf) {
            Read::Event(m) => events.push((m.seq, buf.clone())),
            Read::Pending | Read::Ended => return (events, gaps),
            Read::Lagged { missing } => {
                // As `Replay::skip_gap`: on from the oldest event held.
                gaps.push(missing);
                let oldest = w.oldest_retained(p).max(c.seq);
                c = w.cursor_after(oldest - 1);
            }
        }
    }
    panic!("a read that never ends");
}

/// Sixteen events of 20 bytes, event `n` filled with byte `n`, streams 1
/// and 2 in turn (odd events on 1): segments of 1, 3, 8 and 4 frames
/// (events 2 to 4 in the second, sealed; 13 to 16 in the head).
fn sixteen() -> Pool {
    let p = Pool::new(shape())
        .expect("a test pool fits in memory")
        .with_header_checks();
    let w = Window::new();
    for i in 1..=16u8 {
        append(&w, &p, 2 - u32::from(i % 2), &[i; 20]);
    }
    p
}

/// Event 3's table entry and frame offset, in a restarted copy.
fn event_3(after: &Pool) -> (&[AtomicU64], usize, usize) {
    let second = segment_starting_at(after, 2);
    let seg = after.segment(second, 1);
    let slot = seg.len() - 2;
    let stamp = after.stamp_now(second, Ordering::Relaxed);
    let offset = table_offset(seg[slot].load(Ordering::Relaxed), stamp).unwrap() as usize;
    (seg, slot, offset)
}

/// The head of [`sixteen`]'s chain (events 13 to 16, a class-2 segment) in
/// a restarted copy: its unit and stamp, and its words.
struct Head<'a> {
    unit: u32,
    stamp: u32,
    words: &'a [AtomicU64],
}

impl<'a> Head<'a> {
    fn of(after: &'a Pool) -> Head<'a> {
        let unit = segment_starting_at(after, 13);
        Head {
            unit,
            stamp: after.stamp_now(unit, Ordering::Relaxed),
            words: after.segment(unit, 2),
        }
    }

    /// The table slot of the head's frame `index` (event `13 + index`).
    fn slot(&self, index: usize) -> &AtomicU64 {
        &self.words[self.words.len() - 1 - index]
    }

    /// The word offset of the head's frame `index`, from its table entry.
    fn offset(&self, index: usize) -> usize {
        table_offset(self.slot(index).load(Ordering::Relaxed), self.stamp).expect("a written entry")
            as usize
    }

    /// Makes the head's state word an open segment of `count` frames (and
    /// no room used): what a state word that reached the disk before the
    /// frames after it reads, or a damaged one.
    fn count(&self, after: &Pool, count: u32) {
        after.state(self.unit).store(
            State::Open { count, used: 0 }.encode(self.stamp),
            Ordering::Relaxed,
        );
    }
}

#[test]
fn damage_that_a_missing_mark_could_hide_is_told_and_a_lost_table_entry_is_rebuilt() {
    let p = sixteen();
    let odd = |gaps_at_3: bool| {
        (
            (1..=16u64)
                .filter(|s| s % 2 == 1 && !(gaps_at_3 && *s == 3))
                .collect::<Vec<_>>(),
            if gaps_at_3 { vec![3] } else { vec![] },
        )
    };
    let check = |after: &Pool, want: (Vec<u64>, Vec<u64>), damaged: u64, what: &str| {
        let r = recover::recover(after, &[A], CHECK, false);
        assert_eq!(r.damaged_frames, damaged, "{what}");
        let w = r.windows[0].as_ref().expect("proven");
        let (events, gaps) = read_told(w, after, 1);
        for (seq, bytes) in &events {
            assert_eq!(bytes, &vec![*seq as u8; 20], "{what}: event {seq}");
        }
        let seqs: Vec<u64> = events.iter().map(|(s, _)| *s).collect();
        assert_eq!((seqs, gaps), want, "{what}");
    };

    // The table entry names the wrong place (a flipped bit): the word
    // found there is no mark of this segment, which once read as "never
    // finished" and skipped event 3 without a word.
    let after = restart(&p);
    let (seg, slot, _) = event_3(&after);
    seg[slot].fetch_xor(1, Ordering::Relaxed);
    check(&after, odd(true), 1, "an entry pointing one word off");

    // The mark holds another allocation's stamp: damage too.
    let after = restart(&p);
    let (seg, _, offset) = event_3(&after);
    seg[offset].fetch_xor(1 << 40, Ordering::Relaxed);
    check(&after, odd(true), 1, "a mark of another allocation");

    // The stream id flipped (1 to 3): the check covers it, so event 3
    // neither moves to stream 3 nor vanishes from stream 1.
    let after = restart(&p);
    let (seg, _, offset) = event_3(&after);
    seg[offset + 1].fetch_xor(2 << 32, Ordering::Relaxed);
    check(&after, odd(true), 1, "a flipped stream id");

    // The table entry is gone but the frame stands whole where the
    // claims put it: kept, and its entry written again.
    let after = restart(&p);
    let (seg, slot, offset) = event_3(&after);
    let entry = seg[slot].swap(0, Ordering::Relaxed);
    check(&after, odd(false), 0, "a lost entry");
    assert_eq!(seg[slot].load(Ordering::Relaxed), entry);
    assert_eq!(
        table_offset(entry, (entry >> 32) as u32),
        Some(offset as u32)
    );

    // The entry damaged into another allocation's (a flipped stamp bit)
    // while the frame stands whole where the claims put it: the frame's
    // own mark and check prove it — kept, and its entry written again.
    let after = restart(&p);
    let (seg, slot, offset) = event_3(&after);
    let entry = seg[slot].fetch_xor(1 << 40, Ordering::Relaxed);
    check(&after, odd(false), 0, "a damaged entry");
    assert_eq!(seg[slot].load(Ordering::Relaxed), entry);
    // The same, and the frame's payload damaged too: told as a gap.
    let after = restart(&p);
    let (seg, slot, offset_3) = event_3(&after);
    assert_eq!(offset_3, offset);
    seg[slot].fetch_xor(1 << 40, Ordering::Relaxed);
    seg[offset + 4].fetch_xor(1, Ordering::Relaxed);
    check(&after, odd(true), 1, "a damaged entry and payload");

    // An entry copied over another's: both name one place, and neither
    // frame is trusted.
    let after = restart(&p);
    let (seg, slot, _) = event_3(&after);
    let entry_4 = seg[slot - 1].load(Ordering::Relaxed);
    seg[slot].store(entry_4, Ordering::Relaxed);
    let r = recover::recover(&after, &[A], CHECK, false);
    let w = r.windows[0].as_ref().expect("proven");
    let (events, gaps) = read_told(w, &after, 1);
    assert!(gaps.contains(&3), "{gaps:?}");
    assert!(events.iter().all(|(s, b)| b == &vec![*s as u8; 20]));
    assert_eq!(
        read_told(w, &after, 2).1,
        vec![3, 4],
        "stream 2 is told of both"
    );
}

#[test]
fn a_state_word_claiming_more_frames_than_fit_is_damage_not_a_panic() {
    let p = sixteen();
    let after = restart(&p);
    let head = segment_starting_at(&after, 13);
    let stamp = after.stamp_now(head, Ordering::Relaxed);
    let used = match State::decode(after.state(head).load(Ordering::Relaxed), stamp) {
        Some(State::Open { used, .. }) => used,
        other => panic!("the head is open: {other:?}"),
    };
    after.state(head).store(
        State::Open {
            count: super::layout::MAX_COUNT,
            used,
        }
        .encode(stamp),
        Ordering::Relaxed,
    );
    let r = recover::recover(&after, &[A], CHECK, false);
    // A head whose claims cannot be laid out is emptied and restarts,
    // alone, after the last number it claimed: nothing is delivered that
    // was not proven, and no number is handed out twice.
    let w = r.windows[0].as_ref().expect("restored, emptied");
    let (events, _) = read_told(w, &after, 1);
    assert_eq!(events, vec![], "nothing unproven is delivered");
    assert!(
        w.high_water(&after) >= 16,
        "numbers 1 to 16 are never reused"
    );
    assert!(append(w, &after, 1, b"next") > 16);
}

#[test]
fn a_sealed_segments_damaged_kept_count_is_written_again_from_the_chain() {
    let p = sixteen();
    let after = restart(&p);
    let second = segment_starting_at(&after, 2);
    let stamp = after.stamp_now(second, Ordering::Relaxed);
    let state = after.state(second);
    let Some(State::Next { next, count }) = State::decode(state.load(Ordering::Relaxed), stamp)
    else {
        panic!("the second segment is sealed");
    };
    assert_eq!(count, Some(3), "the seal kept its count");
    // A flipped bit says 5: a reader would look for events 5 and 6 in it,
    // and stop at its end for good.
    state.store(
        State::Next {
            next,
            count: Some(5),
        }
        .encode(stamp),
        Ordering::Relaxed,
    );
    let r = recover::recover(&after, &[A], CHECK, false);
    assert_eq!(r.damaged_frames, 0);
    assert_eq!(
        State::decode(state.load(Ordering::Relaxed), stamp),
        Some(State::Next {
            next,
            count: Some(3)
        }),
        "the count the chain proves"
    );
    let w = r.windows[0].as_ref().expect("proven");
    for stream in [1, 2] {
        let (events, gaps) = read_told(w, &after, stream);
        let seqs: Vec<u64> = events.iter().map(|(s, _)| *s).collect();
        let want: Vec<u64> = (1..=16).filter(|s| (s % 2 == 1) == (stream == 1)).collect();
        assert_eq!((seqs, gaps), (want, vec![]), "stream {stream}");
    }
}

/// Zeroes the mark of the frame the table's entry `index` names in the
/// segment starting at `first_seq`: a frame whose last store never landed
/// — its writer died, or, after a machine restart, the page holding it
/// never reached the device.
fn unmark(after: &Pool, first_seq: u64, index: usize) {
    let unit = segment_starting_at(after, first_seq);
    let stamp = after.stamp_now(unit, Ordering::Relaxed);
    let class = SegmentHeader::from_words(std::array::from_fn(|i| {
        after.segment(unit, 0)[i].load(Ordering::Relaxed)
    }))
    .class();
    let seg = after.segment(unit, class);
    let entry = seg[seg.len() - 1 - index].load(Ordering::Relaxed);
    let offset = table_offset(entry, stamp).expect("a written entry") as usize;
    seg[offset].store(0, Ordering::Relaxed);
}

#[test]
fn after_a_machine_restart_an_unmarked_frame_mid_chain_is_told_as_a_gap_not_skipped() {
    let p = sixteen();
    // Event 3 (stream 1, in the sealed second segment) lost its mark.
    for restarted in [false, true] {
        let after = restart(&p);
        unmark(&after, 2, 1);
        let r = recover::recover(&after, &[A], CHECK, restarted);
        assert_eq!(r.damaged_frames, 0, "restarted: {restarted}");
        assert_eq!(r.unconfirmed_frames, u64::from(restarted));
        let w = r.windows[0].as_ref().expect("proven");
        let (events, gaps) = read_told(w, &after, 1);
        let seqs: Vec<u64> = events.iter().map(|(s, _)| *s).collect();
        let odd: Vec<u64> = (1..=16).filter(|s| s % 2 == 1 && *s != 3).collect();
        assert_eq!(seqs, odd, "restarted: {restarted}");
        for (seq, bytes) in &events {
            assert_eq!(bytes, &vec![*seq as u8; 20]);
        }
        // A process crash: the writer died before its append returned, so
        // nobody was told of event 3 and its number is skipped in silence.
        // A machine restart: event 3 may have been delivered and its words
        // lost with their page, so its readers are told.
        let want_gaps = if restarted { vec![3] } else { vec![] };
        assert_eq!(gaps, want_gaps, "restarted: {restarted}");
        assert_eq!(
            read_told(w, &after, 2).1,
            want_gaps,
            "every stream's readers are told: the lost frame's stream is unknown"
        );
        assert_eq!(append(w, &after, 1, &[17; 20]), 17);
    }
}

#[test]
fn after_a_machine_restart_unmarked_frames_at_the_heads_end_keep_their_numbers() {
    let p = sixteen();
    // The head holds events 13 to 16; the last two lost their marks.
    for restarted in [false, true] {
        let after = restart(&p);
        unmark(&after, 13, 2);
        unmark(&after, 13, 3);
        let r = recover::recover(&after, &[A], CHECK, restarted);
        assert_eq!(r.unconfirmed_frames, if restarted { 2 } else { 0 });
        let w = r.windows[0].as_ref().expect("proven");
        let (events, gaps) = read_told(w, &after, 2);
        let seqs: Vec<u64> = events.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, vec![2, 4, 6, 8, 10, 12, 14]);
        if restarted {
            // 15 and 16 may have been delivered: told, and never numbered
            // again, so a client holding 16 as its cursor cannot mistake
            // a new event 16 for the one it saw.
            assert_eq!(gaps, vec![15, 16]);
            assert_eq!(w.high_water(&after), 16);
            assert_eq!(append(w, &after, 2, &[17; 20]), 17);
        } else {
            // Appends that never returned: dropped, their numbers reused.
            assert!(gaps.is_empty());
            assert_eq!(w.high_water(&after), 14);
            assert_eq!(append(w, &after, 2, &[15; 20]), 15);
        }
        let (events, _) = read_told(w, &after, 2);
        assert_eq!(
            events.last().map(|(_, b)| b[0]),
            Some(if restarted { 17 } else { 15 })
        );
    }
}

#[test]
fn frames_past_a_state_word_that_counts_too_few_are_kept() {
    let p = sixteen();
    // The head holds events 13 to 16; its state word counts two of them:
    // it reached the disk before the frames after it (the state words
    // live apart from the segments, and pages are written back in no
    // particular order), or a damaged word reads so.
    for restarted in [false, true] {
        let after = restart(&p);
        Head::of(&after).count(&after, 2);
        let r = recover::recover(&after, &[A], CHECK, restarted);
        let w = r.windows[0].as_ref().expect("proven");
        let (events, gaps) = read_told(w, &after, 2);
        assert!(gaps.is_empty());
        for (seq, bytes) in &events {
            assert_eq!(bytes, &vec![*seq as u8; 20]);
        }
        let seqs: Vec<u64> = events.iter().map(|(s, _)| *s).collect();
        // 15 and 16 stand whole past the count, their table entries this
        // allocation's: claimed again, their numbers kept.
        assert_eq!(
            seqs,
            vec![2, 4, 6, 8, 10, 12, 14, 16],
            "restarted: {restarted}"
        );
        assert_eq!(r.events, 16);
        assert_eq!(append(w, &after, 1, &[17; 20]), 17);
    }
    // Past the count, frames a writer of this allocation finished, in
    // order, whatever became of their table entries: event 15's entry
    // lost (zero) or damaged (another allocation's), or the state word
    // lost as well (zero: an open segment of no frames, for the first
    // stamps) — 15 stands whole right after 14, then 16 after it. Both are
    // kept and their entries written again; no number is handed out
    // twice.
    for (state, entry) in [(2, 0), (2, 2 << 32), (0, 2 << 32)] {
        for restarted in [false, true] {
            let after = restart(&p);
            let head = Head::of(&after);
            if state == 0 {
                after.state(head.unit).store(0, Ordering::Relaxed);
                // So says only a state word of the first stamps (its
                // generation bits zero); a later stamp's zero word is
                // another allocation's, and the head is then no head.
                assert_eq!(
                    State::decode(0, head.stamp),
                    Some(State::Open { count: 0, used: 0 })
                );
            } else {
                head.count(&after, state);
            }
            let off = head.offset(2);
            head.slot(2).store(entry, Ordering::Relaxed);
            let r = recover::recover(&after, &[A], CHECK, restarted);
            let case = format!("state {state}, entry {entry:#x}, restarted {restarted}");
            let w = r.windows[0].as_ref().expect("proven");
            assert_eq!(w.high_water(&after), 16, "{case}");
            assert_eq!(r.events, 16, "{case}");
            assert_eq!((r.damaged_frames, r.unconfirmed_frames), (0, 0), "{case}");
            assert_eq!(head.offset(2), off, "{case}: the entry is written again");
            let (events, gaps) = read_told(w, &after, 1);
            assert!(gaps.is_empty(), "{case}");
            assert_eq!(
                events.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
                vec![1, 3, 5, 7, 9, 11, 13, 15],
                "{case}"
            );
            assert_eq!(append(w, &after, 1, &[17; 20]), 17, "{case}");
        }
    }
    // No evidence, no claim: past the count, a frame whose check fails
    // (event 15's payload damaged) or that has no mark ends the search —
    // nothing says its writer finished, or that event 16 came after it in
    // turn. (The limit docs/durability.md names: a frame with no trace of
    // its claim left.)
    for unmarked in [false, true] {
        let after = restart(&p);
        let head = Head::of(&after);
        head.count(&after, 2);
        let off = head.offset(2);
        head.slot(2).store(0, Ordering::Relaxed);
        if unmarked {
            head.words[off].store(0, Ordering::Relaxed);
        } else {
            head.words[off + 4].fetch_xor(1, Ordering::Relaxed);
        }
        let r = recover::recover(&after, &[A], CHECK, true);
        let w = r.windows[0].as_ref().expect("proven");
        assert_eq!(w.high_water(&after), 14, "unmarked: {unmarked}");
        assert_eq!(r.events, 14, "unmarked: {unmarked}");
    }
}

#[test]
fn claims_past_a_state_word_that_counts_too_few_are_proven_like_the_rest() {
    let p = sixteen();
    for restarted in [false, true] {
        // Event 15's payload damaged as well: a mark, a failed check —
        // told as a gap either way, and event 16 after it is kept.
        let after = restart(&p);
        let head = Head::of(&after);
        head.count(&after, 2);
        head.words[head.offset(2) + 4].fetch_xor(1, Ordering::Relaxed);
        let r = recover::recover(&after, &[A], CHECK, restarted);
        assert_eq!(r.damaged_frames, 1, "restarted: {restarted}");
        let w = r.windows[0].as_ref().expect("proven");
        let (events, gaps) = read_told(w, &after, 2);
        let seqs: Vec<u64> = events.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, vec![2, 4, 6, 8, 10, 12, 14, 16]);
        assert_eq!(gaps, vec![15]);
        assert_eq!(append(w, &after, 1, &[17; 20]), 17);

        // Event 16 unmarked past the short count: after a process crash
        // an append that never returned (dropped, its number free); after
        // a machine restart maybe delivered (told, its number kept).
        let after = restart(&p);
        Head::of(&after).count(&after, 2);
        unmark(&after, 13, 3);
        let r = recover::recover(&after, &[A], CHECK, restarted);
        let w = r.windows[0].as_ref().expect("proven");
        let (events, gaps) = read_told(w, &after, 2);
        let seqs: Vec<u64> = events.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, vec![2, 4, 6, 8, 10, 12, 14]);
        if restarted {
            assert_eq!(gaps, vec![16]);
            assert_eq!(append(w, &after, 1, &[17; 20]), 17);
        } else {
            assert!(gaps.is_empty());
            assert_eq!(append(w, &after, 1, &[16; 20]), 16);
        }
    }
}

#[test]
fn a_frame_of_another_session_under_this_segments_mark_fails_a_format_5_check() {
    // Stale words: a unit holding another session's frame where this
    // segment's frame was lost, under this allocation's mark (what a
    // stamp written back older than later data can make of a unit after
    // a machine crash). Format 4's check covers stream and payload, both
    // as B wrote them, and so passes; format 5's covers the session too.
    const B: Owner = Owner { tag: 0xb, epoch: 7 };
    for check in [
        FrameCheck::StreamAndPayload,
        FrameCheck::OwnerStreamAndPayload,
    ] {
        let p = Pool::new(shape())
            .expect("a test pool fits in memory")
            .with_header_checks();
        let (wa, wb) = (Window::new(), Window::new());
        for i in 1..=3u8 {
            let a = [i; 20];
            wa.append(&p, A, &keep(), 1, 0, &a, check.of((A.tag, A.epoch), 1, &a))
                .unwrap();
            let b = [0xb0 | i; 20];
            wb.append(&p, B, &keep(), 1, 0, &b, check.of((B.tag, B.epoch), 1, &b))
                .unwrap();
        }
        let after = restart(&p);
        // A's segments: 1 frame, then 3 (events 2 to 4 — here 2 and 3).
        // Event 2 is the second segment's first frame; B's event 2 the
        // same in B's chain. Copy B's meta, time and payload over A's.
        let frame = |owner: Owner| {
            let unit = (0..shape().units)
                .find(|&u| {
                    let w = after.segment(u, 0);
                    after.stamp_now(u, Ordering::Relaxed) & 1 == 1
                        && w[1].load(Ordering::Relaxed) == owner.tag
                        && w[3].load(Ordering::Relaxed) == 2
                })
                .expect("the segment starting at 2");
            let seg = after.segment(unit, 1);
            let stamp = after.stamp_now(unit, Ordering::Relaxed);
            let off = table_offset(seg[seg.len() - 1].load(Ordering::Relaxed), stamp).unwrap();
            (seg, off as usize)
        };
        let (a_seg, a_off) = frame(A);
        let (b_seg, b_off) = frame(B);
        for k in 1..FRAME_WORDS_OF_20 {
            a_seg[a_off + k].store(b_seg[b_off + k].load(Ordering::Relaxed), Ordering::Relaxed);
        }
        let r = recover::recover(&after, &[A, B], check, false);
        let w = r.windows[0].as_ref().expect("proven");
        let (events, gaps) = read_told(w, &after, 1);
        if check == FrameCheck::OwnerStreamAndPayload {
            assert_eq!(gaps, vec![2], "told, not delivered");
            assert!(events.iter().all(|(s, b)| b == &vec![*s as u8; 20]));
        } else {
            // The hazard format 5 closes: B's event read as A's event 2.
            assert!(events.contains(&(2, vec![0xb2; 20])), "{events:?}");
        }
    }
}

/// Words of a frame holding 20 bytes: header, then three payload words.
const FRAME_WORDS_OF_20: usize = FRAME_HEADER_WORDS + 3;

#[test]
fn a_lost_seal_with_a_successor_whose_header_fails_its_check_restores_nothing() {
    let p = sixteen();
    // The head holds events 13 to 16. Its predecessor's seal is lost: the
    // predecessor's state word reads "open" with its own frames (as before
    // the seal, after a machine crash; or damaged so).
    let lose_seal = |after: &Pool| {
        let head = segment_starting_at(after, 13);
        let prev = SegRef::unpack(after.segment(head, 0)[4].load(Ordering::Relaxed)).unwrap();
        let prev_first = after.segment(prev.unit, 0)[3].load(Ordering::Relaxed);
        after.state(prev.unit).store(
            State::Open {
                count: (13 - prev_first) as u32,
                used: 0,
            }
            .encode(prev.stamp),
            Ordering::Relaxed,
        );
        head
    };
    for restarted in [false, true] {
        // With the head's header whole, the lost seal is found again.
        let after = restart(&p);
        lose_seal(&after);
        let r = recover::recover(&after, &[A], CHECK, restarted);
        let w = r.windows[0].as_ref().expect("proven");
        assert_eq!(w.high_water(&after), 16, "restarted: {restarted}");

        // With the head's header damaged as well, the chain seems to end
        // at 12, and restoring it would hand 13 to 16 out again: the
        // session is not restored. One damaged word (the first number,
        // the owner or the link) leaves the other two to say whose
        // successor the head is. With two (the link and the owner), or the
        // header lost whole (the page holding it never reached the
        // device, the stamp's and the frames' did), the head's first frame
        // still stands whole, its check (format 5) says it is this
        // session's, and no header names the head as predecessor: the
        // chain may go on there.
        let damages: [(&str, &[usize]); 5] = [
            ("first number", &[3]),
            ("owner", &[1]),
            ("link", &[4]),
            ("link and owner", &[1, 4]),
            ("header lost", &[]),
        ];
        for (damage, words) in damages {
            let after = restart(&p);
            let head = lose_seal(&after);
            let header = &after.segment(head, 0)[..HEADER_WORDS];
            if words.is_empty() {
                header.iter().for_each(|w| w.store(0, Ordering::Relaxed));
            }
            for &word in words {
                header[word].fetch_xor(1 << 9, Ordering::Relaxed);
            }
            let r = recover::recover(&after, &[A], CHECK, restarted);
            assert_eq!(r.unverified_headers, 1);
            assert!(
                r.windows[0].is_none(),
                "restarted: {restarted}, {damage} damaged: restored with high water {:?}",
                r.windows[0].as_ref().map(|w| w.high_water(&after))
            );
        }
    }
    // The same two words damaged in a sealed segment's header (its
    // successor's seal whole): the successor names it, so it is an older
    // part of the chain, dropped with what is older; the newer part is
    // restored and nothing is numbered again.
    for restarted in [false, true] {
        let after = restart(&p);
        let second = segment_starting_at(&after, 2);
        after.segment(second, 0)[1].fetch_xor(1 << 9, Ordering::Relaxed);
        after.segment(second, 0)[4].fetch_xor(1 << 9, Ordering::Relaxed);
        let r = recover::recover(&after, &[A], CHECK, restarted);
        let w = r.windows[0].as_ref().expect("the newer part is restored");
        assert_eq!(w.high_water(&after), 16, "restarted: {restarted}");
        assert_eq!(w.oldest_retained(&after), 5, "restarted: {restarted}");
    }
    // A spare an appender was preparing when it died: its header not
    // finished (the check word, written last, still zero), naming the
    // head, holding no frames. After a process crash no number reached it
    // and the session is restored; after a machine restart its first
    // frame could have been lost too, and it is not.
    for restarted in [false, true] {
        let p = sixteen();
        let spare = p.alloc(0).unwrap();
        let after = restart(&p);
        let Head { unit, stamp, .. } = Head::of(&after);
        prepare_spare(&after, spare, 17, SegRef { unit, stamp });
        after.segment(spare.unit, 0)[HEADER_WORDS - 1].store(0, Ordering::Relaxed);
        let r = recover::recover(&after, &[A], CHECK, restarted);
        assert_eq!(r.unverified_headers, 1);
        match r.windows[0].as_ref() {
            Some(w) => {
                assert!(!restarted);
                assert_eq!(w.high_water(&after), 16);
            }
            None => assert!(restarted, "refused after a process crash"),
        }
    }
}

#[test]
fn an_entry_naming_a_place_past_the_claimed_room_is_damage_not_an_unfinished_frame() {
    let p = sixteen();
    // The head holds events 13 to 16, its state word whole. Event 15's
    // mark is damaged (so where 16 starts is not known from 15), and 16's
    // table entry names a place past the room the state word says was
    // claimed, where nothing was written: damage, not an append that never
    // returned — its number is kept and told, never handed out again.
    for restarted in [false, true] {
        let after = restart(&p);
        let head = Head::of(&after);
        head.words[head.offset(2)].store(0x4c4f_4f50_444e_5752, Ordering::Relaxed);
        let past = head.offset(3) + 8;
        assert!(
            past + 3 < head.words.len() - 4,
            "inside the segment, before its table"
        );
        head.slot(3)
            .store(table_entry(head.stamp, past as u32), Ordering::Relaxed);
        let r = recover::recover(&after, &[A], CHECK, restarted);
        let w = r.windows[0].as_ref().expect("proven");
        assert_eq!(w.high_water(&after), 16, "restarted: {restarted}");
        assert_eq!(r.damaged_frames, 2, "restarted: {restarted}");
        // A gap marker is told to the readers of every stream.
        assert_eq!(read_told(w, &after, 1).1, vec![15, 16]);
        assert_eq!(read_told(w, &after, 2).1, vec![15, 16]);
        assert_eq!(append(w, &after, 1, &[17; 20]), 17);
    }
}
