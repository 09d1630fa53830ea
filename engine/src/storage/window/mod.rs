//! One session's retained window: a chain of pool segments, appended to at
//! the head, released from the oldest end, read by any number of cursors.
//!
//! The window is two words in the session record (`head`, `oldest`, each a
//! packed [`SegRef`]) plus a count of the units it holds; everything else
//! lives in the pool. See the storage module docs for the protocol and its
//! orderings; this module is its implementation: the window's types, its
//! reader holds and the header read both sides share here, the appends,
//! retention and close in `write`, placing and reading in `read`.

use super::layout::{
    fits, frame_words, is_gap_marker, mark, mark_len, meta, table_entry, table_offset, SegRef,
    SegmentHeader, State, CLOSED, FRAME_HEADER_WORDS, HEADER_WORDS, RESERVED_STREAM, WORD_BYTES,
};
use super::pool::Pool;
use crate::sync::{fence, AtomicU32, AtomicU64, Ordering, Spin};
use crate::words::{load_words, store_words, tail_word, zero_words};

mod read;
mod write;

pub(in crate::storage) use read::*;
pub(crate) use write::*;

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
    /// Segments grow by one class per segment up to this one...
    pub(crate) grow_class: u8,
    /// ... or, for events so large that a `grow_class` segment holds fewer
    /// than [`ROOMY_FRAMES`] of them, up to the class that holds that many,
    /// but not past this one (a quarter of `max_bytes`; `grow_class` when
    /// the retention is too small for it). Without it, events of half a
    /// `grow_class` segment each get a segment of their own: half of it
    /// unused, and every event a segment boundary for a replay.
    pub(crate) roomy_class: u8,
    /// Past `max_events`/`max_bytes`, the oldest segment is still kept
    /// while a reader that holds its place ([`Window::hold`]) has not read
    /// all of it, as long as the window holds at most this many bytes.
    pub(crate) hold_bytes: u64,
}

/// Frames of one size a segment is grown to hold, within
/// [`Retention::roomy_class`].
pub(crate) const ROOMY_FRAMES: u32 = 4;

impl Retention {
    /// The class a window asks for after a head segment of `class`, for a
    /// frame of `frame_bytes` (the frame may need a larger one still: the
    /// caller takes the larger of the two).
    pub(crate) fn next_class(&self, pool: &Pool, class: u8, frame_bytes: usize) -> u8 {
        let shape = pool.shape();
        let cap = self.roomy_class.min(shape.top_class);
        let room_for = |c: u8| {
            let earlier = (ROOMY_FRAMES - 1) as usize * frame_bytes;
            u32::try_from(earlier)
                .is_ok_and(|used| fits(shape.class_words(c), ROOMY_FRAMES - 1, used, frame_bytes))
        };
        let mut limit = self.grow_class;
        while limit < cap && !room_for(limit) {
            limit += 1;
        }
        limit.min(class + 1)
    }
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

impl Cursor {
    /// A cursor whose first read returns the frame after `after`, not yet
    /// placed: its first read finds the frame from the window's ends.
    pub(crate) fn after(after: u64) -> Cursor {
        Cursor {
            seq: after + 1,
            at: None,
        }
    }

    /// Whether the last read stopped at a frame it saw claimed but not yet
    /// published: an appender is copying it. A reader that announced
    /// itself ([`Window::announce`]) and then stops here must not park —
    /// that appender's wake-up check may have missed it — but read again
    /// once the copy is done.
    pub(crate) fn at_a_claimed_frame(&self) -> bool {
        self.at.is_some_and(|p| {
            self.seq
                .checked_sub(p.first_seq)
                .is_some_and(|index| index < u64::from(p.known))
        })
    }
}

/// What [`Window::place`] found.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Placement {
    /// The highest sequence number claimed (0 before the first append).
    pub(crate) high_water: u64,
    /// The oldest sequence number still held; `high_water + 1` when none.
    pub(crate) oldest: u64,
    /// When the cursor's own frame was appended, if it is still held (and
    /// then the cursor was placed after it).
    pub(crate) appended_ms: Option<u64>,
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
    /// The successor and its size class, once its header was loaded
    /// (`NO_SEGMENT` before): when the seal kept no count, the header told
    /// it; when the seal did, the cursor was placed without the header, and
    /// it is loaded when the reader reaches the end. A reader that reaches
    /// the sealed segment's end moves on to it without loading the state
    /// word and the successor's header a second time. Everything read from
    /// it is validated against this stamp as from any segment, so a
    /// successor released in between is found lost on the first read, as
    /// it would be by loading its header again.
    next: SegRef,
    next_class: u8,
    /// Frames the reader has already seen claimed in this segment (the
    /// count of its last state load). Claims only grow within an
    /// allocation, so frames below it need no state load: their mark and
    /// the stamp check after the copy prove them (a sequential reader of a
    /// segment loads the shared, writer-contended state word once, not once
    /// per event).
    known: u32,
}

const UNKNOWN: u32 = u32::MAX;

/// [`Pos::next`] before the successor is known (no unit has that number).
const NO_SEGMENT: SegRef = SegRef {
    unit: u32::MAX,
    stamp: 0,
};

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
        Pos::first_of(seg, h.class(), h.first_seq)
    }

    /// At the first frame of `seg`, of size class `class`, whose first
    /// frame is `first_seq`.
    #[inline(always)]
    fn first_of(seg: SegRef, class: u8, first_seq: u64) -> Pos {
        Pos {
            seg,
            class,
            first_seq,
            offset: HEADER_WORDS as u32,
            sealed_count: UNKNOWN,
            next: NO_SEGMENT,
            next_class: 0,
            known: 0,
        }
    }

    /// Records that the segment is sealed with `count` frames, its
    /// successor being `next` with header `h`; `next` is kept only if `h`
    /// is `owner`'s (else a reader that reaches the segment's end finds
    /// its successor lost).
    #[inline(always)]
    fn sealed(&mut self, count: u32, next: SegRef, h: &SegmentHeader, owner: Owner) {
        self.sealed_count = count;
        if is_owner(h, owner) {
            self.next = next;
            self.next_class = h.class();
        }
    }

    /// Past the last frame of a sealed segment whose successor is known:
    /// the successor's first frame.
    #[inline(always)]
    fn successor(&self) -> Option<Pos> {
        (self.next != NO_SEGMENT).then(|| {
            Pos::first_of(
                self.next,
                self.next_class,
                self.first_seq + u64::from(self.sealed_count),
            )
        })
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
    /// The segment released last, allocated again to the caller, when the
    /// caller asked for one of its class ([`Pool::reuse`]).
    reused: Option<SegRef>,
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

/// Rounds of [`Window::announce`] before it gives up on a head that keeps
/// moving (the reader then reads again instead of parking).
const ANNOUNCE_TRIES: u32 = 64;

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
}

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
    let w = pool.header_words(seg.unit);
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
