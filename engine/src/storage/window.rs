//! One session's retained window: a chain of pool segments, appended to at
//! the head, released from the oldest end, read by any number of cursors.
//!
//! The window is two words in the session record (`head`, `oldest`, each a
//! packed [`SegRef`]) plus a count of the units it holds; everything else
//! lives in the pool. See the storage module docs for the protocol and its
//! orderings; this file is its implementation.

use super::layout::{
    fits, frame_words, is_gap_marker, mark, mark_len, meta, table_entry, table_offset, SegRef,
    SegmentHeader, State, CLOSED, FRAME_HEADER_WORDS, HEADER_WORDS, RESERVED_STREAM, WORD_BYTES,
};
use super::pool::Pool;
use crate::sync::{fence, AtomicU32, AtomicU64, Ordering, Spin};
use crate::words::{load_words, store_words, tail_word, zero_words};

/// Who a window belongs to: written into every segment it allocates and
/// checked by every reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Owner {
    /// The session's owner tag.
    pub(crate) tag: u64,
    /// The session incarnation's epoch.
    pub(crate) epoch: u64,
}

/// How much a window keeps, and how its segments grow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Retention {
    /// The oldest segment is released once the segments after it hold at
    /// least this many events...
    pub(crate) max_events: u64,
    /// ... or at least this many bytes (segment sizes).
    pub(crate) max_bytes: u64,
    /// Class of a session's first segment (at least; a large first event
    /// takes a larger one).
    pub(crate) first_class: u8,
    /// Segments grow by one class per segment up to this one.
    pub(crate) grow_class: u8,
    /// Past `max_events`/`max_bytes`, the oldest segment is still kept
    /// while a reader that holds its place ([`Window::hold`]) has not read
    /// all of it, as long as the window holds at most this many bytes.
    pub(crate) hold_bytes: u64,
}

/// Why an append stored nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AppendFailure {
    /// No segment class can hold the event.
    TooLarge {
        /// Largest payload any segment can hold.
        max: usize,
    },
    /// The window is closed.
    Ended,
    /// The pool has no segment of the class needed (or larger); free some
    /// and retry.
    PoolFull {
        /// The smallest class that would do.
        class: u8,
    },
}

/// A position of a reader in a window: the next sequence number to read,
/// and where it is, once found.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cursor {
    /// The next sequence number to read (the first is 1).
    pub(crate) seq: u64,
    at: Option<Pos>,
}

/// What [`Window::place`] found.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Placement {
    /// The highest sequence number claimed (0 before the first append).
    pub(crate) high_water: u64,
    /// The oldest sequence number still held; `high_water + 1` when none.
    pub(crate) oldest: u64,
    /// When the cursor's own frame was appended, if it is still held.
    pub(crate) appended_ms: Option<u64>,
    /// A cursor whose first read returns the frame after the cursor.
    pub(crate) cursor: Cursor,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Pos {
    seg: SegRef,
    class: u8,
    first_seq: u64,
    /// Word offset of frame `seq` in the segment; `UNKNOWN` until read
    /// from the table.
    offset: u32,
    /// Frames in the segment once it is known to be sealed; `UNKNOWN`
    /// before.
    sealed_count: u32,
    /// Frames the reader has already seen claimed in this segment (the
    /// count of its last state load). Claims only grow within an
    /// allocation, so frames below it need no state load: their mark and
    /// the stamp check after the copy prove them (a sequential reader of a
    /// segment loads the shared, writer-contended state word once, not once
    /// per event).
    known: u32,
}

const UNKNOWN: u32 = u32::MAX;

impl Pos {
    /// At frame `seq` of `seg`, whose header is `h`: its offset is known
    /// only for the segment's first frame (else read from the table).
    #[inline(always)]
    fn at(seg: SegRef, h: &SegmentHeader, seq: u64) -> Pos {
        let mut pos = Pos::start(seg, h);
        if seq != h.first_seq {
            pos.offset = UNKNOWN;
        }
        pos
    }

    /// At the first frame of `seg`, whose header is `h`.
    #[inline(always)]
    fn start(seg: SegRef, h: &SegmentHeader) -> Pos {
        Pos {
            seg,
            class: h.class(),
            first_seq: h.first_seq,
            offset: HEADER_WORDS as u32,
            sealed_count: UNKNOWN,
            known: 0,
        }
    }
}

/// Metadata of one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FrameMeta {
    /// Its sequence number.
    pub(crate) seq: u64,
    /// Its stream.
    pub(crate) stream: u32,
    /// The engine clock when it was appended.
    pub(crate) appended_ms: u64,
    /// Payload bytes.
    pub(crate) len: usize,
}

/// What a read found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Read {
    /// The next frame of the wanted stream; its payload is in the buffer.
    Event(FrameMeta),
    /// Nothing more yet: the next frame is not claimed or not published.
    Pending,
    /// Frame `missing` was released before it could be read.
    Lagged {
        /// The first sequence number that could not be read.
        missing: u64,
    },
    /// The window is closed and everything readable was read.
    Ended,
}

/// What a pass of [`Window::release_oldest`] did.
#[derive(Clone, Copy, Debug, Default)]
struct Released {
    /// Units released.
    units: u32,
    /// The window holds twice its retention (or more) after its oldest
    /// segment, which it cannot release because a writer that claimed a
    /// frame there has not finished it. Appenders that would grow the
    /// window wait instead: without that, one writer descheduled in the
    /// middle of a frame lets the others fill the whole pool.
    stalled: bool,
}

/// A segment of a closed window that still had a frame being written; the
/// closer could not free it yet.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deferred {
    seg: SegRef,
    class: u8,
    count: u32,
}

impl Deferred {
    /// Frees the segment if its last writer has finished; returns whether
    /// it did.
    pub(crate) fn try_free(&self, pool: &Pool) -> bool {
        if !all_published(pool, self.seg, self.class, self.count) {
            return false;
        }
        pool.free(self.seg, self.class);
        true
    }
}

/// A session's chain of segments.
#[derive(Debug)]
pub(crate) struct Window {
    /// The segment appends go to: a packed [`SegRef`], 0 before the first
    /// append, [`CLOSED`] after close.
    head: AtomicU64,
    /// The oldest segment still held, packed like `head`.
    oldest: AtomicU64,
    /// Units held by the chain (approximate while segments come and go).
    held_units: AtomicU32,
    /// 0 for a window any number of threads append to; else [`SINGLE`]
    /// and the hand-over bits of a single-writer window
    /// ([`WRITER_DONE`], [`CLOSE_DONE`]).
    single: AtomicU32,
    /// The next sequence number of each reader that holds its place
    /// ([`hold`](Self::hold)); 0 is a free slot.
    holds: [AtomicU64; HOLD_SLOTS],
}

/// Places that can be held in one window at once (a session's standalone
/// stream, one call's stream, and a cluster node's copy into Redis, say).
/// More readers read as usual, without holding anything back.
pub(crate) const HOLD_SLOTS: usize = 3;

/// The window has one writer ([`Window::append_single`]).
const SINGLE: u32 = 1;
/// Its writer is gone for good: it appends no more.
const WRITER_DONE: u32 = 2;
/// A close ran while the writer was live and left it the head segment.
const CLOSE_DONE: u32 = 4;

/// The one writer of a single-writer window: where it appends, known
/// without loading anything shared. Only this writer changes the head's
/// state word and the window's head (a close swaps the head to `CLOSED`
/// but leaves the head segment to the writer), so the copy stays true.
#[derive(Debug, Default)]
pub(crate) struct SingleWriter {
    head: Option<WriterHead>,
    done: bool,
}

#[derive(Clone, Copy, Debug)]
struct WriterHead {
    seg: SegRef,
    class: u8,
    /// Words of the segment.
    words: u32,
    first_seq: u64,
    /// Frames and frame bytes claimed: what its state word says.
    count: u32,
    used: u32,
}

impl WriterHead {
    fn new(pool: &Pool, seg: SegRef, class: u8, first_seq: u64) -> WriterHead {
        WriterHead {
            seg,
            class,
            words: pool.shape().class_words(class) as u32,
            first_seq,
            count: 0,
            used: 0,
        }
    }
}

impl SingleWriter {
    pub(crate) fn new() -> SingleWriter {
        SingleWriter::default()
    }
}

impl Default for Window {
    fn default() -> Window {
        Window::new()
    }
}

impl Window {
    pub(crate) fn new() -> Window {
        Window {
            head: AtomicU64::new(0),
            oldest: AtomicU64::new(0),
            held_units: AtomicU32::new(0),
            single: AtomicU32::new(0),
            holds: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// A window whose events come from one [`SingleWriter`] (through
    /// [`append_single`](Self::append_single)); [`append`](Self::append)
    /// is for when that writer is gone ([`takes_shared_appends`](Self::takes_shared_appends)).
    pub(crate) fn new_single() -> Window {
        Window {
            single: AtomicU32::new(SINGLE),
            ..Window::new()
        }
    }

    /// Whether [`append`](Self::append) may be called: always for a
    /// window of many writers; for a single-writer window once its writer
    /// is done (Acquire: its last stores happen before the caller's).
    #[inline]
    pub(crate) fn takes_shared_appends(&self) -> bool {
        let single = self.single.load(Ordering::Acquire);
        single == 0 || single & WRITER_DONE != 0
    }

    /// A window over a recovered chain from `oldest` to `head` holding
    /// `held_units` (durable pools; `recover` proved the chain; and the
    /// loom models, for a window numbered from far away).
    pub(crate) fn restored(oldest: SegRef, head: SegRef, held_units: u32) -> Window {
        Window {
            head: AtomicU64::new(head.pack()),
            oldest: AtomicU64::new(oldest.pack()),
            held_units: AtomicU32::new(held_units),
            single: AtomicU32::new(0),
            holds: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Claims a slot for a reader whose next sequence number is `next`:
    /// while it holds the slot, retention keeps what it has not read (up
    /// to [`Retention::hold_bytes`]). `None` when every slot is taken.
    ///
    /// A hint, not a lock: a release that loaded the slots before the
    /// claim (or before a [`move_hold`](Self::move_hold)) may still take
    /// the reader's next segment, and the reader then finds it lagged, as
    /// any reader would. The pool's pressure path ignores holds.
    pub(crate) fn hold(&self, next: u64) -> Option<usize> {
        debug_assert!(next > 0, "sequence numbers start at 1");
        self.holds.iter().position(|slot| {
            slot.compare_exchange(0, next, Ordering::Release, Ordering::Relaxed)
                .is_ok()
        })
    }

    /// Moves a held place forward to `next`.
    #[inline]
    pub(crate) fn move_hold(&self, slot: usize, next: u64) {
        self.holds[slot].store(next, Ordering::Release);
    }

    /// Gives a slot back.
    pub(crate) fn unhold(&self, slot: usize) {
        self.holds[slot].store(0, Ordering::Release);
    }

    /// The lowest next sequence number of the readers holding their
    /// place; `u64::MAX` when none does.
    fn lowest_hold(&self) -> u64 {
        self.holds
            .iter()
            .map(|slot| slot.load(Ordering::Acquire))
            .filter(|&next| next != 0)
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Whether the window holds no segment (nothing was ever appended, or
    /// it is closed).
    pub(crate) fn is_empty(&self) -> bool {
        matches!(self.head.load(Ordering::Relaxed), 0 | CLOSED)
    }

    /// The packed head reference (tests poke at its state word).
    #[cfg(test)]
    pub(crate) fn head_word(&self) -> u64 {
        self.head.load(Ordering::Relaxed)
    }

    /// The oldest segment and its header, as a walk from the oldest end
    /// starts with them (tests release segments behind such a walk).
    #[cfg(test)]
    pub(crate) fn oldest_segment(&self, pool: &Pool) -> Option<(SegRef, SegmentHeader)> {
        let oldest = SegRef::unpack(self.oldest.load(Ordering::Acquire))?;
        Some((oldest, read_header(pool, oldest)?))
    }

    /// Units of pool memory the window holds.
    pub(crate) fn held_units(&self) -> u32 {
        self.held_units.load(Ordering::Relaxed)
    }

    /// Appends one frame; returns its sequence number.
    ///
    /// Any number of threads may append at once. Takes no lock; waits only
    /// for another appender that is installing the session's first segment.
    #[allow(
        clippy::too_many_arguments,
        reason = "one hot call; a struct would be built and torn down per event"
    )]
    pub(crate) fn append(
        &self,
        pool: &Pool,
        owner: Owner,
        keep: &Retention,
        stream: u32,
        now_ms: u64,
        payload: &[u8],
        check: u32,
    ) -> Result<u64, AppendFailure> {
        let frame_bytes = frame_words(payload.len()) * WORD_BYTES;
        let Some(need_class) = fit_class(pool, frame_bytes) else {
            return Err(AppendFailure::TooLarge {
                max: max_payload(pool),
            });
        };
        let mut spare: Option<(SegRef, u8)> = None;
        let spin = Spin::new();
        // Whether this append has waited for a stalled writer (counted once).
        let mut stalled = false;
        let result = loop {
            let head_word = self.head.load(Ordering::Acquire);
            let Some(head) = SegRef::unpack(head_word) else {
                if head_word == CLOSED {
                    break Err(AppendFailure::Ended);
                }
                let class = need_class.max(keep.first_class);
                match self.install_first(
                    pool,
                    owner,
                    class,
                    need_class,
                    1,
                    now_ms,
                    &mut spare,
                    Writers::Many,
                ) {
                    Ok(_) => continue,
                    Err(e) => break Err(e),
                }
            };
            let words = pool.segment(head.unit, 0);
            let class = words[INFO].load(Ordering::Relaxed) as u8;
            if !pool.valid(head.unit, class) {
                // A head word we read just before the head moved on.
                spin.snooze();
                continue;
            }
            let state_word = pool.state(head.unit).load(Ordering::Acquire);
            match State::decode(state_word, head.stamp) {
                None => spin.snooze(),
                Some(State::Last { .. }) => break Err(AppendFailure::Ended),
                Some(State::Next { next }) => self.swing(pool, head_word, next),
                Some(State::Open { count, used }) => {
                    let seg_words = pool.shape().class_words(class);
                    if fits(seg_words, count, used, frame_bytes) {
                        let claimed = State::Open {
                            count: count + 1,
                            used: used + frame_bytes as u32,
                        }
                        .encode(head.stamp);
                        // Relaxed is enough for the claim itself: the frame
                        // is published by its mark (Release), and the words
                        // read below were published with the head (Acquire).
                        if pool
                            .state(head.unit)
                            .compare_exchange(
                                state_word,
                                claimed,
                                Ordering::Relaxed,
                                Ordering::Relaxed,
                            )
                            .is_ok()
                        {
                            let segment = pool.segment(head.unit, class);
                            let first_seq = segment[FIRST_SEQ].load(Ordering::Relaxed);
                            let offset = (HEADER_WORDS + used as usize / WORD_BYTES) as u32;
                            write_frame(
                                segment, head.stamp, count, offset, stream, check, now_ms, payload,
                            );
                            break Ok(first_seq + u64::from(count));
                        }
                        spin.snooze();
                        continue;
                    }
                    let wanted = need_class.max(keep.grow_class.min(class + 1));
                    let first_seq = words[FIRST_SEQ].load(Ordering::Relaxed) + u64::from(count);
                    // The head may have been sealed, released and reused by
                    // another session since its state was loaded: then the
                    // word just read is that session's. The seal below would
                    // fail anyway, but a spare prepared with it would carry
                    // a foreign first sequence number until it is freed —
                    // and into recovery if the process died meanwhile.
                    fence(Ordering::Acquire);
                    if pool.stamp_now(head.unit, Ordering::Relaxed) != head.stamp {
                        spin.snooze();
                        continue;
                    }
                    // A writer preempted between its claim and its mark
                    // holds back the release of its segment and of every
                    // one after it. The others grow the window past its
                    // retention meanwhile, up to twice it; then they wait
                    // for that writer, which is inside a copy that takes no
                    // lock and ends as soon as it runs again.
                    if self.release_oldest(pool, keep, false, false).stalled {
                        if !stalled {
                            stalled = true;
                            pool.count_append_stall();
                        }
                        spin.snooze();
                        continue;
                    }
                    let Some((seg, next_class)) = take_spare(pool, &mut spare, wanted, need_class)
                    else {
                        // Retention runs on every install, but a writer
                        // still copying into the oldest segment holds it
                        // back; by now it may have finished.
                        if self.retain(pool, keep, false) > 0 {
                            continue;
                        }
                        break Err(AppendFailure::PoolFull { class: need_class });
                    };
                    init_segment(
                        pool,
                        seg,
                        next_class,
                        owner,
                        first_seq,
                        head,
                        now_ms,
                        Writers::Many,
                    );
                    let sealed = State::Next { next: seg.unit }.encode(head.stamp);
                    // Release: whoever follows `next` (an appender swinging
                    // the head, a reader) sees the successor's header.
                    match pool.state(head.unit).compare_exchange(
                        state_word,
                        sealed,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => {
                            self.held_units
                                .fetch_add(1 << next_class, Ordering::Relaxed);
                            self.swing(pool, head_word, seg.unit);
                            self.retain(pool, keep, false);
                        }
                        Err(_) => spare = Some((seg, next_class)),
                    }
                }
            }
        };
        if let Some((seg, class)) = spare {
            pool.free(seg, class);
        }
        result
    }

    /// Appends one frame as the window's single writer; returns its
    /// sequence number. Only the holder of `w` may append to this window
    /// (see [`new_single`](Self::new_single)).
    ///
    /// Into a head segment with room this is one `Relaxed` load of `head`
    /// (has a close taken the window?), the frame, and the state word
    /// stored after it instead of CASed before it (no other thread writes
    /// the head's state while the writer is live): no locked instruction,
    /// and no word of the segment zeroed beforehand. A new segment costs
    /// the head CAS that tells the writer whether a close came first.
    #[inline]
    #[allow(
        clippy::too_many_arguments,
        reason = "one hot call; a struct would be built and torn down per event"
    )]
    pub(crate) fn append_single(
        &self,
        pool: &Pool,
        owner: Owner,
        keep: &Retention,
        w: &mut SingleWriter,
        stream: u32,
        now_ms: u64,
        payload: &[u8],
        check: u32,
    ) -> Result<u64, AppendFailure> {
        let frame_bytes = frame_words(payload.len()) * WORD_BYTES;
        loop {
            if let Some(h) = w.head.as_mut() {
                // Relaxed: only this writer moves the head, and a close that
                // this load misses leaves the head segment to it (the frame
                // below is then written into memory nobody else holds).
                if self.head.load(Ordering::Relaxed) == h.seg.pack()
                    && fits(h.words as usize, h.count, h.used, frame_bytes)
                {
                    let (count, used) = (h.count, h.used);
                    let offset = (HEADER_WORDS + used as usize / WORD_BYTES) as u32;
                    // The frame first, then its claim: a reader loads the
                    // words of claimed frames only, so it never loads one
                    // before this writer stored it — which is why a
                    // single writer's segment needs no zeroing
                    // (`Writers::One`).
                    write_frame(
                        pool.segment(h.seg.unit, h.class),
                        h.seg.stamp,
                        count,
                        offset,
                        stream,
                        check,
                        now_ms,
                        payload,
                    );
                    h.count += 1;
                    h.used += frame_bytes as u32;
                    // Release: a reader that loads this claim (Acquire)
                    // sees the whole frame and its table entry.
                    pool.state(h.seg.unit).store(
                        State::Open {
                            count: h.count,
                            used: h.used,
                        }
                        .encode(h.seg.stamp),
                        Ordering::Release,
                    );
                    return Ok(h.first_seq + u64::from(count));
                }
            }
            self.make_room_single(pool, owner, keep, w, frame_bytes, now_ms)?;
        }
    }

    /// Gives the single writer a head segment with room for a frame of
    /// `frame_bytes` (installs the first segment, or links the next one),
    /// or says why it cannot: the window was closed, the frame is larger
    /// than any segment, the pool is full.
    #[cold]
    #[inline(never)]
    fn make_room_single(
        &self,
        pool: &Pool,
        owner: Owner,
        keep: &Retention,
        w: &mut SingleWriter,
        frame_bytes: usize,
        now_ms: u64,
    ) -> Result<(), AppendFailure> {
        debug_assert!(self.single.load(Ordering::Relaxed) & SINGLE != 0);
        if w.done {
            return Err(AppendFailure::Ended);
        }
        let Some(need_class) = fit_class(pool, frame_bytes) else {
            return Err(AppendFailure::TooLarge {
                max: max_payload(pool),
            });
        };
        let Some(h) = w.head.as_mut() else {
            let class = need_class.max(keep.first_class);
            let mut spare = None;
            let installed = self.install_first(
                pool,
                owner,
                class,
                need_class,
                1,
                now_ms,
                &mut spare,
                Writers::One,
            );
            // Prepared for a window that was closed first.
            if let Some((seg, class)) = spare {
                pool.free(seg, class);
            }
            return match installed {
                // Only this writer installs: the head is its segment (or a
                // close has taken the head since and left it the segment,
                // which the next append finds).
                Ok(Some((seg, class))) => {
                    w.head = Some(WriterHead::new(pool, seg, class, 1));
                    Ok(())
                }
                Ok(None) => unreachable!("a single-writer window has one installer"),
                // Closed first; the closer freed what was installed.
                Err(AppendFailure::Ended) => {
                    self.writer_done(pool, w);
                    Err(AppendFailure::Ended)
                }
                Err(e) => Err(e),
            };
        };
        if self.head.load(Ordering::Relaxed) != h.seg.pack() {
            self.writer_done(pool, w);
            return Err(AppendFailure::Ended);
        }
        let wanted = need_class.max(keep.grow_class.min(h.class + 1));
        let first_seq = h.first_seq + u64::from(h.count);
        let (seg, class) = loop {
            if let Some(got) = take_spare(pool, &mut None, wanted, need_class) {
                break got;
            }
            if self.release_oldest(pool, keep, false, true).units == 0 {
                return Err(AppendFailure::PoolFull { class: need_class });
            }
        };
        init_segment(
            pool,
            seg,
            class,
            owner,
            first_seq,
            h.seg,
            now_ms,
            Writers::One,
        );
        // A store, not a CAS: nobody else writes the head's state.
        // Release: whoever follows `next` sees the successor's header.
        pool.state(h.seg.unit).store(
            State::Next { next: seg.unit }.encode(h.seg.stamp),
            Ordering::Release,
        );
        self.held_units.fetch_add(1 << class, Ordering::Relaxed);
        // Release publishes the successor to readers; the CAS fails only
        // on a close, which left the old head to this writer — and with it
        // the successor just linked.
        match self.head.compare_exchange(
            h.seg.pack(),
            seg.pack(),
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => {
                *h = WriterHead::new(pool, seg, class, first_seq);
                self.release_oldest(pool, keep, false, true);
                Ok(())
            }
            Err(_) => {
                self.writer_done(pool, w);
                Err(AppendFailure::Ended)
            }
        }
    }

    /// The single writer is gone for good (dropped, or it saw the window
    /// closed). Whichever of it and a close comes second frees the head
    /// segment the close left to the writer, with whatever the writer
    /// linked after it.
    pub(crate) fn writer_done(&self, pool: &Pool, w: &mut SingleWriter) {
        if std::mem::replace(&mut w.done, true) {
            return;
        }
        // Shared appenders may take over the head (`takes_shared_appends`):
        // they claim before they write, so the words after this writer's
        // frames must no longer hold what an earlier owner left there
        // (`Writers::Many`). The writer still owns them: nobody else writes
        // the head until the `fetch_or` below, and nobody frees it before.
        if let Some(h) = &w.head {
            if self.single.load(Ordering::Acquire) & CLOSE_DONE == 0 {
                let segment = pool.segment(h.seg.unit, h.class);
                let frames_end = HEADER_WORDS + h.used as usize / WORD_BYTES;
                let table_low = segment.len() - h.count as usize;
                zero_words(&segment[frames_end..table_low]);
            }
        }
        // AcqRel: Release hands the writer's stores (the zeroes above
        // among them) to the close or to shared appenders; Acquire, when
        // the close came first, its walk to the writer's free.
        let before = self.single.fetch_or(WRITER_DONE, Ordering::AcqRel);
        if before & CLOSE_DONE != 0 {
            if let Some(h) = w.head.take() {
                free_chain(pool, h.seg);
            }
        }
    }

    /// Installs the first segment of a window nothing was appended to
    /// yet, numbered so that the first append gets `after + 1`: the window
    /// of a session that continues elsewhere-numbered events (a cluster
    /// node adopting a session whose events up to `after` are held by the
    /// shared tier). Its high-water mark is `after` from now on, and
    /// nothing is retained before `after + 1`.
    pub(crate) fn start_after(
        &self,
        pool: &Pool,
        owner: Owner,
        class: u8,
        after: u64,
        now_ms: u64,
    ) -> Result<(), AppendFailure> {
        self.install_first(
            pool,
            owner,
            class,
            0,
            after + 1,
            now_ms,
            &mut None,
            Writers::Many,
        )
        .map(|_| ())
    }

    /// Installs the first segment of the window, numbered from `first_seq`.
    #[allow(
        clippy::too_many_arguments,
        reason = "the append path's state, passed through once per window"
    )]
    fn install_first(
        &self,
        pool: &Pool,
        owner: Owner,
        class: u8,
        least: u8,
        first_seq: u64,
        now_ms: u64,
        spare: &mut Option<(SegRef, u8)>,
        writers: Writers,
    ) -> Result<Option<(SegRef, u8)>, AppendFailure> {
        let (seg, class) = take_spare(pool, spare, class, least)
            .ok_or(AppendFailure::PoolFull { class: least })?;
        init_segment(pool, seg, class, owner, first_seq, NO_SEG, now_ms, writers);
        // The segment enters the chain with `oldest`; from then on whoever
        // takes it out of the chain (retention, close) frees it.
        match self
            .oldest
            .compare_exchange(0, seg.pack(), Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                self.held_units.fetch_add(1 << class, Ordering::Relaxed);
                // Release pairs with appenders' and readers' Acquire head
                // loads: the header and state above are visible to them.
                match self.head.compare_exchange(
                    0,
                    seg.pack(),
                    Ordering::Release,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => Ok(Some((seg, class))),
                    // Closed in between; the closer owns the segment now.
                    Err(_) => Err(AppendFailure::Ended),
                }
            }
            Err(now) => {
                *spare = Some((seg, class));
                if now == CLOSED {
                    return Err(AppendFailure::Ended);
                }
                // Another appender is installing: wait for its head.
                let spin = Spin::new();
                while self.head.load(Ordering::Acquire) == 0 {
                    spin.snooze();
                }
                Ok(None)
            }
        }
    }

    /// Moves the head from `head_word` to its sealed successor `next` (any
    /// appender may do it; the first CAS wins).
    fn swing(&self, pool: &Pool, head_word: u64, next: u32) {
        // `next` cannot be released while the head still points before it:
        // releases start at the oldest segment, and a close moves the head
        // to CLOSED first. So its stamp is the one it was installed with.
        let stamp = pool.stamp_now(next, Ordering::Acquire);
        let to = SegRef { unit: next, stamp }.pack();
        let _ = self
            .head
            .compare_exchange(head_word, to, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// Releases the oldest segments while what follows them still meets
    /// `keep` (or, with `force`, releases one oldest segment that is not the
    /// head whatever `keep` says). Returns the units released.
    pub(crate) fn retain(&self, pool: &Pool, keep: &Retention, force: bool) -> u32 {
        self.release_oldest(pool, keep, force, false).units
    }

    /// [`retain`](Self::retain), told by a live single writer that every
    /// frame before the head is published (it finished each before it
    /// moved on): no need to check the marks of the segment released.
    fn release_oldest(
        &self,
        pool: &Pool,
        keep: &Retention,
        force: bool,
        written: bool,
    ) -> Released {
        let mut released = Released::default();
        loop {
            let oldest_word = self.oldest.load(Ordering::Acquire);
            let head_word = self.head.load(Ordering::Acquire);
            if oldest_word == head_word {
                return released;
            }
            let (Some(oldest), Some(_)) = (SegRef::unpack(oldest_word), SegRef::unpack(head_word))
            else {
                return released;
            };
            let Some(old) = read_header(pool, oldest) else {
                return released;
            };
            let Some(State::Next { next }) = State::decode(
                pool.state(oldest.unit).load(Ordering::Acquire),
                oldest.stamp,
            ) else {
                return released;
            };
            let next_ref = SegRef {
                unit: next,
                stamp: pool.stamp_now(next, Ordering::Acquire),
            };
            let Some(following) = read_header(pool, next_ref) else {
                return released;
            };
            let count = following.first_seq.saturating_sub(old.first_seq);
            if count > u64::from(super::layout::MAX_COUNT) {
                return released;
            }
            let old_units = 1u32 << old.class();
            // What would be left after the release; the pressure path
            // (`force`) does not ask.
            let (events_after, bytes_after) = if force {
                (0, 0)
            } else {
                (
                    (self.high_water(pool) + 1).saturating_sub(following.first_seq),
                    u64::from(self.held_units().saturating_sub(old_units))
                        * pool.shape().unit_words as u64
                        * WORD_BYTES as u64,
                )
            };
            if !force {
                if events_after < keep.max_events && bytes_after < keep.max_bytes {
                    return released;
                }
                // A reader holding its place still has to read some of the
                // oldest segment: keep it while the window is within
                // `hold_bytes`.
                if keep.hold_bytes > 0
                    && u64::from(self.held_units())
                        * pool.shape().unit_words as u64
                        * WORD_BYTES as u64
                        <= keep.hold_bytes
                    && self.lowest_hold() < following.first_seq
                {
                    return released;
                }
            }
            if !written && !all_published(pool, oldest, old.class(), count as u32) {
                // A writer that claimed a frame there has not finished; the
                // next install tries again. Past twice the retention, the
                // appenders wait for it (see `Released::stalled`).
                released.stalled = !force
                    && (events_after >= keep.max_events.saturating_mul(2)
                        || bytes_after >= keep.max_bytes.saturating_mul(2));
                return released;
            }
            if self
                .oldest
                .compare_exchange(
                    oldest_word,
                    next_ref.pack(),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                self.held_units.fetch_sub(old_units, Ordering::Relaxed);
                pool.free(oldest, old.class());
                released.units += old_units;
                if force {
                    return released;
                }
            }
        }
    }

    /// Closes the window: no append succeeds afterwards, readers end, and
    /// every segment is freed — except those with a frame still being
    /// written, returned for [`Deferred::try_free`] later.
    ///
    /// A single-writer window whose writer is live is closed up to its
    /// head segment, which is left to the writer: it may be writing there
    /// without a CAS. Whichever of the close and the writer's
    /// [`writer_done`](Self::writer_done) comes second frees it.
    pub(crate) fn close(&self, pool: &Pool) -> Vec<Deferred> {
        let mut deferred = Vec::new();
        // Acquire: a writer done before this load made its last stores
        // visible (the close may then seal and free its head as usual).
        let single = self.single.load(Ordering::Acquire);
        let writer_live = single & SINGLE != 0 && single & WRITER_DONE == 0;
        let head = self.head.swap(CLOSED, Ordering::AcqRel);
        let left = SegRef::unpack(head).filter(|_| writer_live);
        let oldest = self.oldest.swap(CLOSED, Ordering::AcqRel);
        let mut next = SegRef::unpack(oldest);
        let spin = Spin::new();
        while let Some(seg) = next {
            if Some(seg) == left {
                break;
            }
            let Some(header) = read_header(pool, seg) else {
                break;
            };
            let class = header.class();
            let count = loop {
                let word = pool.state(seg.unit).load(Ordering::Acquire);
                match State::decode(word, seg.stamp) {
                    Some(State::Open { count, used }) => {
                        let last = State::Last { count, used }.encode(seg.stamp);
                        if pool
                            .state(seg.unit)
                            .compare_exchange(word, last, Ordering::AcqRel, Ordering::Relaxed)
                            .is_ok()
                        {
                            next = None;
                            break count;
                        }
                        spin.snooze();
                    }
                    Some(State::Last { count, .. }) => {
                        next = None;
                        break count;
                    }
                    Some(State::Next { next: n }) => {
                        let n = SegRef {
                            unit: n,
                            stamp: pool.stamp_now(n, Ordering::Acquire),
                        };
                        let count = read_header(pool, n)
                            .map_or(0, |h| h.first_seq.saturating_sub(header.first_seq));
                        next = Some(n);
                        break count.min(u64::from(super::layout::MAX_COUNT)) as u32;
                    }
                    None => {
                        next = None;
                        break 0;
                    }
                }
            };
            let d = Deferred { seg, class, count };
            if !d.try_free(pool) {
                deferred.push(d);
            }
        }
        if let Some(left) = left {
            // AcqRel: pairs with the writer's `fetch_or` either way round.
            if self.single.fetch_or(CLOSE_DONE, Ordering::AcqRel) & WRITER_DONE != 0 {
                free_chain(pool, left);
            }
        }
        self.held_units.store(0, Ordering::Relaxed);
        deferred
    }

    /// The highest sequence number claimed (0 before the first append).
    pub(crate) fn high_water(&self, pool: &Pool) -> u64 {
        let spin = Spin::new();
        loop {
            let Some(head) = SegRef::unpack(self.head.load(Ordering::Acquire)) else {
                return 0;
            };
            let words = pool.segment(head.unit, 0);
            let first_seq = words[FIRST_SEQ].load(Ordering::Relaxed);
            match State::decode(pool.state(head.unit).load(Ordering::Acquire), head.stamp) {
                Some(State::Open { count, .. } | State::Last { count, .. }) => {
                    return first_seq + u64::from(count) - 1;
                }
                // Sealed, head not swung yet: its successor starts right
                // after its last frame.
                Some(State::Next { next }) => {
                    let n = SegRef {
                        unit: next,
                        stamp: pool.stamp_now(next, Ordering::Acquire),
                    };
                    if let Some(h) = read_header(pool, n) {
                        return h.first_seq - 1;
                    }
                }
                None => {}
            }
            spin.snooze();
        }
    }

    /// The sequence number of the oldest frame still held; `high_water + 1`
    /// when nothing is held.
    pub(crate) fn oldest_retained(&self, pool: &Pool) -> u64 {
        if let Some(oldest) = SegRef::unpack(self.oldest.load(Ordering::Acquire)) {
            if let Some(h) = read_header(pool, oldest) {
                return h.first_seq;
            }
        }
        self.high_water(pool) + 1
    }

    /// A cursor whose first read returns the frame after `after`.
    pub(crate) fn cursor_after(&self, after: u64) -> Cursor {
        Cursor {
            seq: after + 1,
            at: None,
        }
    }

    /// Everything a resume asks of the window, read in one pass: the high
    /// water mark, the oldest retained sequence number, and — for a cursor
    /// `after` in the window — when frame `after` was appended and a cursor
    /// whose first read returns the frame after it, already placed in the
    /// segment that holds it (so the replay does not walk the chain again).
    ///
    /// One pass reads the head's header and state, the oldest segment's
    /// header (the head's, when they are one), and for a cursor in a sealed
    /// segment near the oldest end one state and one successor header —
    /// each header once, where asking `high_water`, `oldest_retained` and
    /// `locate` in turn reads the head and the oldest twice. When the pass
    /// meets anything unusual (the head sealed but not swung yet, a segment
    /// released under it), it answers the slow way, with those calls.
    ///
    /// If the cursor's segment is released before the first read, that
    /// read validates its stamp and reports `Lagged`, as a fresh walk would.
    pub(crate) fn place(&self, pool: &Pool, owner: Owner, after: Option<u64>) -> Placement {
        self.place_fast(pool, owner, after)
            .unwrap_or_else(|| self.place_slow(pool, owner, after))
    }

    /// [`Window::place`] in one pass, or `None` to take the slow way.
    #[inline(always)]
    fn place_fast(&self, pool: &Pool, owner: Owner, after: Option<u64>) -> Option<Placement> {
        let head_word = self.head.load(Ordering::Acquire);
        let Some(head) = SegRef::unpack(head_word) else {
            // Nothing appended yet, or closed: nothing to place.
            return None;
        };
        let hh = read_header(pool, head).filter(|h| is_owner(h, owner))?;
        let head_count =
            match State::decode(pool.state(head.unit).load(Ordering::Acquire), head.stamp)? {
                State::Open { count, .. } | State::Last { count, .. } => count,
                // Sealed, head not swung yet: rare, and `high_water` knows it.
                State::Next { .. } => return None,
            };
        let high_water = hh.first_seq + u64::from(head_count) - 1;
        let oldest_word = self.oldest.load(Ordering::Acquire);
        let (oldest_seg, oh) = if oldest_word == head_word {
            (head, hh)
        } else {
            let seg = SegRef::unpack(oldest_word)?;
            (seg, read_header(pool, seg).filter(|h| is_owner(h, owner))?)
        };
        let mut placement = Placement {
            high_water,
            oldest: oh.first_seq,
            appended_ms: None,
            cursor: self.cursor_after(after.unwrap_or(0)),
        };
        let Some(seq) = after.filter(|&s| s >= oh.first_seq && s <= high_water) else {
            return Some(placement);
        };
        let pos = if seq >= hh.first_seq {
            Pos {
                known: head_count,
                ..Pos::at(head, &hh, seq)
            }
        } else if seq - oh.first_seq < hh.first_seq - seq {
            // Nearer the oldest end: its successor's first number bounds it.
            match walk_forward(pool, owner, seq, oldest_seg, oh)? {
                Locate::At(pos) => pos,
                _ => return None,
            }
        } else {
            return None;
        };
        if let Some((ms, cursor)) = frame_after(pool, seq, pos) {
            placement.appended_ms = Some(ms);
            placement.cursor = cursor;
        }
        Some(placement)
    }

    /// [`Window::place`] by separate calls, each retrying on its own.
    pub(super) fn place_slow(&self, pool: &Pool, owner: Owner, after: Option<u64>) -> Placement {
        let high_water = self.high_water(pool);
        let oldest = self.oldest_retained(pool);
        let mut placement = Placement {
            high_water,
            oldest,
            appended_ms: None,
            cursor: self.cursor_after(after.unwrap_or(0)),
        };
        if let Some(seq) = after.filter(|&s| s >= 1 && s <= high_water) {
            if let Locate::At(pos) = self.locate(pool, owner, seq) {
                if let Some((ms, cursor)) = frame_after(pool, seq, pos) {
                    placement.appended_ms = Some(ms);
                    placement.cursor = cursor;
                }
            }
        }
        placement
    }

    /// Reads the next frame of `stream` (or of any stream) at `cursor`,
    /// copying its payload into `buf` (cleared first). Never blocks, never
    /// spins; frames of other streams are passed over.
    pub(crate) fn read(
        &self,
        pool: &Pool,
        owner: Owner,
        cursor: &mut Cursor,
        stream: Option<u32>,
        buf: &mut Vec<u8>,
    ) -> Read {
        buf.clear();
        if let Some(event) = read_placed(pool, cursor, stream, buf) {
            return Read::Event(event);
        }
        self.read_slow(pool, owner, cursor, stream, buf)
    }

    /// Reads the frames of `stream` at `cursor` that are ready into `buf`,
    /// pushing `(seq, start, end)` — where each payload lies in `buf` — to
    /// `events`, until `events` holds `max_events` or `buf` at least
    /// `max_bytes` (then `None`: more may be ready) or a read finds no
    /// event (then what it found: pending, lagged or ended).
    ///
    /// The frames of one segment are copied in one piece, their headers
    /// with them (a payload is where `events` says, not back to back with
    /// the next), and the run's stamp is validated once: this is what makes
    /// a replay copy-bound. A run whose stamp changed is taken back (`buf`
    /// and `events` truncated) and read again by the general path, which
    /// reports it as lost.
    #[allow(
        clippy::too_many_arguments,
        reason = "the reader's state and its two output buffers, once per batch"
    )]
    pub(crate) fn read_many(
        &self,
        pool: &Pool,
        owner: Owner,
        cursor: &mut Cursor,
        stream: u32,
        buf: &mut Vec<u8>,
        events: &mut Vec<(u64, u32, u32)>,
        max_events: usize,
        max_bytes: usize,
    ) -> Option<Read> {
        loop {
            if events.len() >= max_events || buf.len() >= max_bytes {
                return None;
            }
            if run_placed(pool, cursor, stream, buf, events, max_events, max_bytes) {
                continue;
            }
            // The run stopped at the claims the reader had seen or at the
            // end of a sealed segment: learn more claims, or move on to the
            // successor, and run again without the single-frame path.
            match self.claimed(pool, owner, cursor) {
                Claimed::Not(read) => return Some(read),
                Claimed::At(pos) => {
                    let moved = cursor.at != Some(pos);
                    cursor.at = Some(pos);
                    if moved && run_placed(pool, cursor, stream, buf, events, max_events, max_bytes)
                    {
                        continue;
                    }
                }
            }
            let start = buf.len() as u32;
            match self.read_slow(pool, owner, cursor, Some(stream), buf) {
                Read::Event(event) => events.push((event.seq, start, buf.len() as u32)),
                other => return Some(other),
            }
        }
    }

    /// The general case of a read: places the cursor, follows seals, and
    /// tells pending, lagged and ended apart. Appends the payload to `buf`;
    /// on anything but an event `buf` is as it was.
    fn read_slow(
        &self,
        pool: &Pool,
        owner: Owner,
        cursor: &mut Cursor,
        stream: Option<u32>,
        buf: &mut Vec<u8>,
    ) -> Read {
        let base = buf.len();
        loop {
            let mut pos = match self.claimed(pool, owner, cursor) {
                Claimed::At(pos) => pos,
                Claimed::Not(read) => return read,
            };
            let index = (cursor.seq - pos.first_seq) as u32;
            let segment = pool.segment(pos.seg.unit, pos.class);
            let Some(offset) = frame_offset(segment, pos.seg.stamp, index, pos.offset) else {
                return self.pending_or_lost(pool, cursor, pos);
            };
            pos.offset = offset;
            // Acquire pairs with the appender's Release of the mark: its
            // meta, time and payload stores are visible below.
            let Some(len) = mark_len(
                segment[offset as usize].load(Ordering::Acquire),
                pos.seg.stamp,
            ) else {
                return self.pending_or_lost(pool, cursor, pos);
            };
            let len = len as usize;
            let start = offset as usize + FRAME_HEADER_WORDS;
            let end = start + len.div_ceil(WORD_BYTES);
            if end > segment.len() - (index as usize + 1) {
                // A mark of this allocation never announces that; only a
                // released and reused segment could show it.
                return self.gone(cursor);
            }
            let meta_word = segment[offset as usize + 1].load(Ordering::Relaxed);
            let appended_ms = segment[offset as usize + 2].load(Ordering::Relaxed);
            let frame_stream = (meta_word >> 32) as u32;
            if is_gap_marker(meta_word, appended_ms) {
                // Recovery found this frame damaged: its event is lost to
                // every reader, which must be told. The reader moves past
                // it, so a `skip_gap` goes on after it.
                fence(Ordering::Acquire);
                if pool.stamp_now(pos.seg.unit, Ordering::Relaxed) != pos.seg.stamp {
                    return self.gone(cursor);
                }
                let missing = cursor.seq;
                cursor.seq += 1;
                pos.offset = end as u32;
                cursor.at = Some(pos);
                return Read::Lagged { missing };
            }
            let wanted = stream.is_none_or(|s| s == frame_stream);
            if wanted {
                copy_out(&segment[start..end], len, buf);
            }
            // Pairs with the fence(Release) after every stamp change: if any
            // word above came from a later owner, the stamp has changed.
            fence(Ordering::Acquire);
            if pool.stamp_now(pos.seg.unit, Ordering::Relaxed) != pos.seg.stamp {
                buf.truncate(base);
                return self.gone(cursor);
            }
            let seq = cursor.seq;
            cursor.seq += 1;
            pos.offset = (start + len.div_ceil(WORD_BYTES)) as u32;
            cursor.at = Some(pos);
            if wanted {
                return Read::Event(FrameMeta {
                    seq,
                    stream: frame_stream,
                    appended_ms,
                    len,
                });
            }
        }
    }

    /// Where frame `cursor.seq` is, once it is known to be claimed: the
    /// cursor's position (located first if it has none), with the
    /// segment's claims loaded again when the reader has passed those it
    /// saw, and a sealed segment left for its successor once the reader has
    /// passed its last frame. `Not` is why there is no such frame to read
    /// yet: pending, ended, or lost under the reader.
    #[inline]
    fn claimed(&self, pool: &Pool, owner: Owner, cursor: &mut Cursor) -> Claimed {
        let mut relocations = 0;
        macro_rules! lost {
            () => {
                match self.lost(pool, owner, cursor) {
                    Some(read) => return Claimed::Not(read),
                    None => {
                        relocations += 1;
                        if relocations > MAX_RELOCATIONS {
                            cursor.at = None;
                            return Claimed::Not(Read::Lagged {
                                missing: cursor.seq,
                            });
                        }
                        continue;
                    }
                }
            };
        }
        loop {
            let mut pos = match cursor.at {
                Some(pos) => pos,
                None => match self.locate(pool, owner, cursor.seq) {
                    Locate::At(pos) => pos,
                    Locate::NotYet => return Claimed::Not(Read::Pending),
                    Locate::Gone => {
                        return Claimed::Not(Read::Lagged {
                            missing: cursor.seq,
                        })
                    }
                    Locate::Ended => return Claimed::Not(Read::Ended),
                },
            };
            let index = (cursor.seq - pos.first_seq) as u32;
            if index < pos.known {
                return Claimed::At(pos);
            }
            let state = State::decode(
                pool.state(pos.seg.unit).load(Ordering::Acquire),
                pos.seg.stamp,
            );
            let count = match state {
                None => lost!(),
                Some(State::Open { count, .. } | State::Last { count, .. }) => count,
                Some(State::Next { next }) => {
                    if pos.sealed_count == UNKNOWN {
                        let n = SegRef {
                            unit: next,
                            stamp: pool.stamp_now(next, Ordering::Acquire),
                        };
                        match read_header(pool, n) {
                            Some(h) if h.owner_epoch == owner.epoch && h.prev == pos.seg.pack() => {
                                pos.sealed_count = (h.first_seq - pos.first_seq) as u32;
                            }
                            _ => lost!(),
                        }
                    }
                    pos.sealed_count
                }
            };
            if index < count {
                pos.known = count;
                return Claimed::At(pos);
            }
            match state {
                Some(State::Next { next }) if index == count => {
                    let n = SegRef {
                        unit: next,
                        stamp: pool.stamp_now(next, Ordering::Acquire),
                    };
                    match read_header(pool, n) {
                        Some(h) if is_owner(&h, owner) && h.prev == pos.seg.pack() => {
                            cursor.at = Some(Pos::start(n, &h));
                        }
                        _ => lost!(),
                    }
                }
                Some(State::Last { .. }) => return Claimed::Not(Read::Ended),
                _ => {
                    cursor.at = Some(pos);
                    return Claimed::Not(Read::Pending);
                }
            }
        }
    }

    /// Frame `cursor.seq` is claimed (the state said so) but its table
    /// entry or mark is not this allocation's: either its writer is still
    /// copying (pending), or the segment was released and reused under the
    /// reader, whose new owner's words are what it loaded. The stamp tells
    /// them apart — a reader that loaded a later owner's word and then
    /// fenced sees the later stamp — and it must be checked here: a reader
    /// that has already seen the frame claimed does not load the state word
    /// again (`Pos::known`), so without it a reader of a reused segment
    /// would report pending forever instead of lost.
    fn pending_or_lost(&self, pool: &Pool, cursor: &mut Cursor, pos: Pos) -> Read {
        fence(Ordering::Acquire);
        if pool.stamp_now(pos.seg.unit, Ordering::Relaxed) != pos.seg.stamp {
            return self.gone(cursor);
        }
        cursor.at = Some(pos);
        Read::Pending
    }

    /// The segment holding the cursor's frame was released (or the window
    /// closed) under the reader: that frame is lost to it.
    fn gone(&self, cursor: &mut Cursor) -> Read {
        cursor.at = None;
        if self.head.load(Ordering::Acquire) == CLOSED {
            Read::Ended
        } else {
            Read::Lagged {
                missing: cursor.seq,
            }
        }
    }

    /// The segment under the cursor was released (or the window closed)
    /// before the reader learnt that its frame is there. That loses the
    /// frame only if it was in that segment: a reader that had read all of
    /// it and waited at its end — the usual place of a reader that keeps
    /// up — wants the first frame of the successor, which the window may
    /// well still hold. So the cursor is placed again by its sequence
    /// number: `None` means it was, and the caller reads on; otherwise the
    /// answer (lagged only if the window no longer holds that sequence
    /// number).
    fn lost(&self, pool: &Pool, owner: Owner, cursor: &mut Cursor) -> Option<Read> {
        cursor.at = None;
        // Most often the frame was in the released segment, and the oldest
        // one held starts after it: no need to walk.
        if let Some(oldest) = SegRef::unpack(self.oldest.load(Ordering::Acquire)) {
            if let Some(h) = read_header(pool, oldest) {
                if is_owner(&h, owner) && cursor.seq < h.first_seq {
                    return Some(Read::Lagged {
                        missing: cursor.seq,
                    });
                }
            }
        }
        match self.locate(pool, owner, cursor.seq) {
            Locate::At(pos) => {
                cursor.at = Some(pos);
                None
            }
            Locate::NotYet => Some(Read::Pending),
            Locate::Gone => Some(Read::Lagged {
                missing: cursor.seq,
            }),
            Locate::Ended => Some(Read::Ended),
        }
    }

    /// Finds the segment holding `seq` (or where `seq` will be appended):
    /// the head if `seq` is in it, else by walking the chain from whichever
    /// end is nearer in sequence numbers (back from the head along the
    /// back links, or forward from the oldest along the seals' links).
    /// Each step reads one segment header.
    fn locate(&self, pool: &Pool, owner: Owner, seq: u64) -> Locate {
        let head_word = self.head.load(Ordering::Acquire);
        if head_word == CLOSED {
            return Locate::Ended;
        }
        let Some(head) = SegRef::unpack(head_word) else {
            return Locate::NotYet;
        };
        let Some(head_header) = read_header(pool, head) else {
            return Locate::Gone;
        };
        if !is_owner(&head_header, owner) {
            return Locate::Gone;
        }
        if seq >= head_header.first_seq {
            return Locate::At(Pos::at(head, &head_header, seq));
        }
        // A cursor older than the oldest segment is refused up front rather
        // than after walking the whole chain.
        if let Some(oldest) = SegRef::unpack(self.oldest.load(Ordering::Acquire)) {
            if let Some(h) = read_header(pool, oldest) {
                if is_owner(&h, owner) {
                    if seq < h.first_seq {
                        return Locate::Gone;
                    }
                    if seq - h.first_seq < head_header.first_seq - seq {
                        if let Some(found) = walk_forward(pool, owner, seq, oldest, h) {
                            return found;
                        }
                        // The chain moved under the walk: fall back to the
                        // walk from the head, which only ever meets
                        // segments released *before* `seq`'s.
                    }
                }
            }
        }
        // Each valid link leads to an older segment (a first sequence
        // number no higher), and a chain holds at most one segment per
        // pool unit, so a walk longer than that met a stale link.
        let mut above = head_header.first_seq;
        let mut link = head_header.prev;
        for _ in 0..=pool.shape().units {
            let Some(seg) = SegRef::unpack(link) else {
                return Locate::Gone;
            };
            let Some(header) = read_header(pool, seg) else {
                return Locate::Gone;
            };
            if !is_owner(&header, owner) || header.first_seq > above {
                return Locate::Gone;
            }
            if seq >= header.first_seq {
                return Locate::At(Pos::at(seg, &header, seq));
            }
            above = header.first_seq;
            link = header.prev;
        }
        Locate::Gone
    }
}

/// [`Window::locate`] from the oldest end: follows the seals' forward links
/// from `seg` (whose header `h` has `first_seq <= seq`) until the next
/// segment starts after `seq`.
///
/// `None` when a segment on the way was released (or a link did not hold)
/// before the walk reached `seq`'s segment. That says nothing about `seq`:
/// retention releases from the oldest end, so segments *behind* the walk
/// can go while `seq`'s is still held. Reporting it as gone would tell a
/// reader of a gap that is not there; the caller walks from the head
/// instead.
#[inline(always)]
pub(super) fn walk_forward(
    pool: &Pool,
    owner: Owner,
    seq: u64,
    mut seg: SegRef,
    mut h: SegmentHeader,
) -> Option<Locate> {
    for _ in 0..=pool.shape().units {
        let next = match State::decode(pool.state(seg.unit).load(Ordering::Acquire), seg.stamp)? {
            // Not sealed: the chain ends here, and so does `seq`'s search.
            State::Open { count, .. } | State::Last { count, .. } => {
                return Some(Locate::At(Pos {
                    known: count,
                    ..Pos::at(seg, &h, seq)
                }));
            }
            State::Next { next } => next,
        };
        let n = SegRef {
            unit: next,
            stamp: pool.stamp_now(next, Ordering::Acquire),
        };
        let nh = read_header(pool, n)?;
        if !is_owner(&nh, owner) || nh.prev != seg.pack() || nh.first_seq < h.first_seq {
            return None;
        }
        if seq < nh.first_seq {
            // Sealed: its frames are exactly those before its successor's.
            let count = (nh.first_seq - h.first_seq) as u32;
            return Some(Locate::At(Pos {
                known: count,
                sealed_count: count,
                ..Pos::at(seg, &h, seq)
            }));
        }
        (seg, h) = (n, nh);
    }
    None
}

/// What [`Window::claimed`] found.
enum Claimed {
    /// The frame is claimed; the reader's position, claims up to date.
    At(Pos),
    /// No frame to read: this is the answer.
    Not(Read),
}

pub(super) enum Locate {
    At(Pos),
    NotYet,
    Gone,
    Ended,
}

/// Times one read places its cursor again after the segment under it was
/// released (each time another release came between): past this it
/// reports a gap rather than chase a chain released faster than it reads.
const MAX_RELOCATIONS: u32 = 4;

/// Word indices of header fields read on their own.
const FIRST_SEQ: usize = 3;
const INFO: usize = 5;
pub(super) const NO_SEG: SegRef = SegRef { unit: 0, stamp: 0 };

fn is_owner(h: &SegmentHeader, owner: Owner) -> bool {
    h.owner_epoch == owner.epoch && h.owner_tag == owner.tag
}

/// The header of `seg`, if `seg` is still that allocation.
///
/// The fields are loaded straight into the struct (not through a word
/// array that is then reinterpreted): on the resume path the header is
/// read several times, and an array copied back out with wider loads
/// stalls on store forwarding.
#[inline(always)]
fn read_header(pool: &Pool, seg: SegRef) -> Option<SegmentHeader> {
    if seg.unit >= pool.shape().units {
        return None;
    }
    let w = pool.segment(seg.unit, 0);
    let load = |i: usize| w[i].load(Ordering::Relaxed);
    let header = SegmentHeader {
        link: load(0),
        owner_tag: load(1),
        owner_epoch: load(2),
        first_seq: load(3),
        prev: load(4),
        info: load(5),
        opened_ms: load(6),
        check: load(7),
    };
    fence(Ordering::Acquire);
    (pool.stamp_now(seg.unit, Ordering::Relaxed) == seg.stamp
        && pool.valid(seg.unit, header.class()))
    .then_some(header)
}

#[cfg(loom)]
loom::thread_local! {
    /// Under loom only: the owner and first sequence number of every
    /// segment this thread prepared, so a model can check that none was
    /// given another session's numbers (spares are freed unseen).
    pub(super) static PREPARED: std::cell::RefCell<Vec<(Owner, u64)>> =
        std::cell::RefCell::new(Vec::new());
}

/// Who writes the frames of a segment being prepared: what
/// [`init_segment`] must zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Writers {
    /// Any number of appenders: each claims a frame first and writes it
    /// after, so a reader may load an unwritten mark or table entry.
    Many,
    /// One writer that stores each frame whole before it claims it
    /// ([`Window::append_single`]): no reader loads a word of a frame
    /// before it is written, so what an earlier owner left is never read.
    One,
}

/// Writes the header and an empty open state into a fresh allocation.
#[allow(
    clippy::too_many_arguments,
    reason = "the header's fields, once per segment"
)]
pub(super) fn init_segment(
    pool: &Pool,
    seg: SegRef,
    class: u8,
    owner: Owner,
    first_seq: u64,
    prev: SegRef,
    now_ms: u64,
    writers: Writers,
) {
    let header = SegmentHeader {
        link: 0,
        owner_tag: owner.tag,
        owner_epoch: owner.epoch,
        first_seq,
        prev: if prev == NO_SEG { 0 } else { prev.pack() },
        info: u64::from(class),
        opened_ms: now_ms,
        check: 0,
    }
    .checked(seg.stamp);
    #[cfg(loom)]
    PREPARED.with(|p| p.borrow_mut().push((owner, first_seq)));
    // Relaxed: published by the CAS that links the segment (Release).
    let segment = pool.segment(seg.unit, class);
    for (w, v) in segment[..HEADER_WORDS].iter().zip(header.to_words()) {
        w.store(v, Ordering::Relaxed);
    }
    // For many writers the rest is zeroed: a reader that finds a frame
    // claimed loads its mark (and, not knowing its offset, its table
    // entry) before the writer may have stored them, and what it loads
    // then must not pass for them. A word an earlier owner left there
    // could — a meta word `stream << 32 | check`, or any payload, has the
    // same shape as a mark `stamp << 32 | len` — and the stamp check after
    // the copy cannot see it, since the stamp has not changed. Zero is
    // never a mark or an entry (stamps of owned segments are odd). So every
    // word a reader can load is either zero or written by this
    // allocation's writers, each word by the one writer whose frame or
    // table entry it is. A single writer's segment is zeroed only if it is
    // handed to many writers ([`Window::writer_done`]).
    if writers == Writers::Many {
        zero_words(&segment[HEADER_WORDS..]);
    }
    pool.state(seg.unit).store(
        State::Open { count: 0, used: 0 }.encode(seg.stamp),
        Ordering::Relaxed,
    );
}

/// A spare segment of `class` if there is one, else a new allocation of
/// `class` — or, when the pool has none that large, of the largest smaller
/// class down to `least` (a fragmented pool makes the chain grow in smaller
/// steps, it does not refuse the append). Returns the segment and its
/// class.
fn take_spare(
    pool: &Pool,
    spare: &mut Option<(SegRef, u8)>,
    class: u8,
    least: u8,
) -> Option<(SegRef, u8)> {
    match spare.take() {
        Some((seg, c)) if c == class => return Some((seg, c)),
        Some((seg, c)) => pool.free(seg, c),
        None => {}
    }
    (least..=class)
        .rev()
        .find_map(|c| pool.alloc(c).map(|seg| (seg, c)))
}

/// The smallest class whose empty segment holds a frame of `frame_bytes`.
fn fit_class(pool: &Pool, frame_bytes: usize) -> Option<u8> {
    let shape = pool.shape();
    (0..=shape.top_class).find(|&c| fits(shape.class_words(c), 0, 0, frame_bytes))
}

/// The largest payload the largest class holds.
pub(crate) fn max_payload(pool: &Pool) -> usize {
    let shape = pool.shape();
    let words = shape.class_words(shape.top_class);
    let room = (words - HEADER_WORDS - FRAME_HEADER_WORDS - 1) * WORD_BYTES;
    room.min(super::layout::MAX_USED as usize - FRAME_HEADER_WORDS * WORD_BYTES)
}

/// When frame `seq`, which `pos` places in its segment, was appended, and
/// a cursor placed right after it; `None` if the frame is not published or
/// the segment was released meanwhile.
#[inline(always)]
fn frame_after(pool: &Pool, seq: u64, pos: Pos) -> Option<(u64, Cursor)> {
    let segment = pool.segment(pos.seg.unit, pos.class);
    let index = (seq - pos.first_seq) as u32;
    let offset = frame_offset(segment, pos.seg.stamp, index, pos.offset)?;
    // Acquire pairs with the appender's Release of the mark.
    let len = mark_len(
        segment.get(offset as usize)?.load(Ordering::Acquire),
        pos.seg.stamp,
    )?;
    let end = offset as usize + FRAME_HEADER_WORDS + (len as usize).div_ceil(WORD_BYTES);
    if end > segment.len() - (index as usize + 1) {
        return None;
    }
    let ms = segment[offset as usize + 2].load(Ordering::Relaxed);
    // As in a read: a word from a later owner shows as a changed stamp.
    fence(Ordering::Acquire);
    if pool.stamp_now(pos.seg.unit, Ordering::Relaxed) != pos.seg.stamp {
        return None;
    }
    // Frame `seq + 1` starts where frame `seq` ends. Below the claims
    // `pos` already knows of, a read takes it without loading the state;
    // past them (or past a sealed segment's last frame) the general read
    // loads the state or follows the seal.
    let cursor = Cursor {
        seq: seq + 1,
        at: Some(Pos {
            offset: end as u32,
            ..pos
        }),
    };
    Some((ms, cursor))
}

/// The word offset of frame `index`: `known` if the reader already knows
/// it, else from the table (`None` until the frame's writer stored it).
fn frame_offset(segment: &[AtomicU64], stamp: u32, index: u32, known: u32) -> Option<u32> {
    if known != UNKNOWN {
        return Some(known);
    }
    let slot = segment.len().checked_sub(index as usize + 1)?;
    let offset = table_offset(segment[slot].load(Ordering::Acquire), stamp)?;
    ((offset as usize) < slot).then_some(offset)
}

/// Writes one frame — claimed already by a shared appender, about to be
/// claimed by a single writer — and publishes it with its mark.
#[allow(
    clippy::too_many_arguments,
    reason = "the frame's fields, passed once on the hot path"
)]
fn write_frame(
    segment: &[AtomicU64],
    stamp: u32,
    index: u32,
    offset: u32,
    stream: u32,
    check: u32,
    now_ms: u64,
    payload: &[u8],
) {
    let at = offset as usize;
    // Relaxed: all published by the mark's Release below.
    segment[segment.len() - 1 - index as usize]
        .store(table_entry(stamp, offset), Ordering::Relaxed);
    segment[at + 1].store(meta(stream, check), Ordering::Relaxed);
    segment[at + 2].store(now_ms, Ordering::Relaxed);
    let whole = payload.len() / WORD_BYTES;
    let body = &segment[at + FRAME_HEADER_WORDS..][..payload.len().div_ceil(WORD_BYTES)];
    let (words, rest) = payload.split_at(whole * WORD_BYTES);
    store_words(&body[..whole], words);
    if !rest.is_empty() {
        body[whole].store(tail_word(payload, rest), Ordering::Relaxed);
    }
    segment[at].store(mark(stamp, payload.len() as u32), Ordering::Release);
}

/// The common case of [`Window::read`], kept small so it stays in
/// registers: the cursor is placed in a segment at a known offset, below
/// the claims it has already seen there, and the frame is published. Any
/// other case — offset or claims unknown, frame not published, stamp
/// changed — returns `None` and the caller takes the general path, which
/// re-checks from the state word (and reports a changed stamp as lost).
///
/// Per event: the mark load (Acquire), the meta and time loads, the copy,
/// `fence(Acquire)` and the stamp load. No RMW, no store to shared memory.
#[inline]
fn read_placed(
    pool: &Pool,
    cursor: &mut Cursor,
    stream: Option<u32>,
    buf: &mut Vec<u8>,
) -> Option<FrameMeta> {
    let Cursor { seq, at } = cursor;
    let pos = at.as_mut()?;
    let base = buf.len();
    let segment = pool.segment(pos.seg.unit, pos.class);
    loop {
        let index = (*seq - pos.first_seq) as u32;
        if pos.offset == UNKNOWN || index >= pos.known {
            return None;
        }
        let at = pos.offset as usize;
        // Acquire pairs with the appender's Release of the mark.
        let len = mark_len(segment.get(at)?.load(Ordering::Acquire), pos.seg.stamp)? as usize;
        let start = at + FRAME_HEADER_WORDS;
        let end = start + len.div_ceil(WORD_BYTES);
        if end > segment.len() - (index as usize + 1) {
            return None;
        }
        let frame_stream = (segment[at + 1].load(Ordering::Relaxed) >> 32) as u32;
        if frame_stream == RESERVED_STREAM {
            // A placeholder or a gap marker (recovery's): the general
            // path tells them apart.
            return None;
        }
        let appended_ms = segment[at + 2].load(Ordering::Relaxed);
        let wanted = stream.is_none_or(|s| s == frame_stream);
        if wanted {
            copy_out(&segment[start..end], len, buf);
        }
        // As in `Window::read`: a word from a later owner shows as a
        // changed stamp after this fence.
        fence(Ordering::Acquire);
        if pool.stamp_now(pos.seg.unit, Ordering::Relaxed) != pos.seg.stamp {
            buf.truncate(base);
            return None;
        }
        let this = *seq;
        *seq += 1;
        pos.offset = end as u32;
        if wanted {
            return Some(FrameMeta {
                seq: this,
                stream: frame_stream,
                appended_ms,
                len,
            });
        }
    }
}

/// The run of [`Window::read_many`]: frames of the cursor's placed segment
/// below the claims already seen, while published and within the limits.
/// Returns whether it moved the cursor.
///
/// Per frame: the mark load (Acquire), the meta load and a push. Per run:
/// one copy of the words from the first wanted frame to the end of the
/// last (marks acquired first, so every word copied was published), then
/// `fence(Acquire)` and one stamp load.
fn run_placed(
    pool: &Pool,
    cursor: &mut Cursor,
    stream: u32,
    buf: &mut Vec<u8>,
    events: &mut Vec<(u64, u32, u32)>,
    max_events: usize,
    max_bytes: usize,
) -> bool {
    let Cursor { seq, at } = cursor;
    let Some(pos) = at.as_mut() else {
        return false;
    };
    if pos.offset == UNKNOWN {
        return false;
    }
    let segment = pool.segment(pos.seg.unit, pos.class);
    let (buf_base, events_base) = (buf.len(), events.len());
    // The frames below the claims seen, and room for the events the limit
    // allows. The entries are made room for once, so the loop keeps its
    // state in registers instead of re-checking the vector per frame.
    let claimed = (pos.first_seq + u64::from(pos.known)).saturating_sub(*seq);
    let room = max_events.saturating_sub(events_base);
    events.reserve(claimed.min(room as u64) as usize);
    // Words the run may copy before the byte limit stops it (checked before
    // each frame, so a batch may end one frame past the limit).
    let max_words = max_bytes.saturating_sub(buf_base).div_ceil(WORD_BYTES);
    let table_end = segment.len();
    let mut next = *seq;
    let mut at = pos.offset as usize;
    // Words [copy_from, copy_to) of the segment go to `buf` at `buf_base`;
    // `copy_from` is `usize::MAX` until the first wanted frame.
    let mut copy_from = usize::MAX;
    let mut copy_to = at;
    let first_index = (next - pos.first_seq) as usize;
    let mut wanted = 0;
    // `index`: frame `next`'s place in the segment's table.
    for index in first_index..first_index + claimed as usize {
        let copied = if copy_from == usize::MAX {
            0
        } else {
            copy_to - copy_from
        };
        if wanted == room || copied >= max_words {
            break;
        }
        let Some(mark) = segment.get(at) else {
            break;
        };
        // Acquire pairs with the appender's Release of the mark.
        let Some(len) = mark_len(mark.load(Ordering::Acquire), pos.seg.stamp) else {
            break;
        };
        let len = len as usize;
        let start = at + FRAME_HEADER_WORDS;
        let end = start + len.div_ceil(WORD_BYTES);
        // The frame must end before the table entries (one per frame, from
        // the segment's end down).
        if end > table_end - (index + 1) {
            break;
        }
        let frame_stream = (segment[at + 1].load(Ordering::Relaxed) >> 32) as u32;
        if frame_stream == stream {
            if copy_from == usize::MAX {
                copy_from = start;
            }
            let payload = buf_base + (start - copy_from) * WORD_BYTES;
            events.push((next, payload as u32, (payload + len) as u32));
            wanted += 1;
            copy_to = end;
        } else if frame_stream == RESERVED_STREAM {
            // Possibly a gap marker: the general path reports it.
            break;
        }
        next += 1;
        at = end;
    }
    let copy_from = (copy_from != usize::MAX).then_some(copy_from);
    if next == *seq {
        return false;
    }
    if let Some(from) = copy_from {
        copy_out(&segment[from..copy_to], (copy_to - from) * WORD_BYTES, buf);
    }
    // As in `Window::read`, once for the run: a word from a later owner
    // shows as a changed stamp after this fence.
    fence(Ordering::Acquire);
    if pool.stamp_now(pos.seg.unit, Ordering::Relaxed) != pos.seg.stamp {
        buf.truncate(buf_base);
        events.truncate(events_base);
        return false;
    }
    *seq = next;
    pos.offset = at as u32;
    true
}

/// Frees `seg` and the segments linked after it: the head a close left
/// to a single writer, once both are done with it (every frame in it is
/// published: its writer finished).
fn free_chain(pool: &Pool, seg: SegRef) {
    let mut next = Some(seg);
    while let Some(seg) = next {
        let Some(header) = read_header(pool, seg) else {
            return;
        };
        next = match State::decode(pool.state(seg.unit).load(Ordering::Acquire), seg.stamp) {
            Some(State::Next { next }) => Some(SegRef {
                unit: next,
                stamp: pool.stamp_now(next, Ordering::Acquire),
            }),
            _ => None,
        };
        pool.free(seg, header.class());
    }
}

/// Whether all `count` frames of `seg` are published.
fn all_published(pool: &Pool, seg: SegRef, class: u8, count: u32) -> bool {
    let segment = pool.segment(seg.unit, class);
    (0..count).all(|i| {
        frame_offset(segment, seg.stamp, i, UNKNOWN).is_some_and(|o| {
            mark_len(segment[o as usize].load(Ordering::Acquire), seg.stamp).is_some()
        })
    })
}

/// Appends `len` payload bytes out of `words` to `buf`, copied into its
/// spare capacity (no zeroing first; see [`load_words`]).
fn copy_out(words: &[AtomicU64], len: usize, buf: &mut Vec<u8>) {
    let bytes = words.len() * WORD_BYTES;
    debug_assert!(len <= bytes);
    let old = buf.len();
    buf.reserve(bytes);
    load_words(words, &mut buf.spare_capacity_mut()[..bytes]);
    // SAFETY: `load_words` initialised the first `bytes >= len` bytes of
    // the spare capacity, which `reserve` made at least that long, so the
    // first `old + len` bytes of the vector are initialised.
    unsafe { buf.set_len(old + len) };
}
