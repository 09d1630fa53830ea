//! Readers of one stream of one session: replay and live delivery in one loop.
//!
//! A [`Replay`] is a position in its session's window. `next_into` returns
//! the next event of its stream after that position, or `None` once it has
//! caught up with the writers; the caller then waits (`listen`, or
//! `wait_next`) and calls again. Replaying old events and delivering new
//! ones is the same loop over the same segments (invariant 7 in
//! `docs/invariants.md`), so there is no window between "replay finished" and
//! "live subscription registered" in which an event could be stored but
//! sent nowhere, and no event is delivered twice.
//!
//! The reader only ever reads the window of the session it was made from,
//! and every segment it reads names that session (invariant 2): there is no
//! way to point it at another session's events.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::handle::SessionHandle;
use crate::id::EventId;
use crate::metrics::{Counter, Metrics};
use crate::session::Waiter;
use crate::storage::{Cursor, Read};
use crate::sync::Spin;

/// Why a reader cannot go on from where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplayError {
    /// Events after the reader's position were released before it read
    /// them (retention, or the pool making room): the stream has a gap.
    /// [`Replay::skip_gap`] moves past it.
    Lagged {
        /// The reader's position: the last event it delivered (or its
        /// starting cursor).
        after: EventId,
        /// The first sequence number that could not be read.
        missing_seq: u64,
    },
    /// The session ended (closed, expired, evicted); its events are gone.
    SessionEnded,
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayError::Lagged { after, missing_seq } => write!(
                f,
                "reader lagged: events after {after} (from sequence {missing_seq}) were released"
            ),
            ReplayError::SessionEnded => f.write_str("the session has ended"),
        }
    }
}

impl std::error::Error for ReplayError {}

/// A reader of one stream of one session, from a position onward.
///
/// While it exists the session counts as busy (never evicted).
pub struct Replay {
    handle: SessionHandle,
    stream: u32,
    cursor: Cursor,
    /// Sequence number of the last event delivered (or the start cursor).
    position: u64,
    /// Events and bytes delivered but not yet added to the engine's
    /// counters: two atomic adds per event were half the cost of a hot
    /// replay, so they are added per batch, when the reader catches up,
    /// stops, or is dropped.
    unreported: (u64, u64),
    /// The window's hold slot, once [`hold`](Replay::hold) got one.
    held: Option<usize>,
    /// A [`listen`](Replay::listen) came since the last read that found
    /// nothing: the next such read, if it stops at a frame an appender has
    /// claimed but not published yet, waits for that frame rather than
    /// return (the appender's wake-up check may not have seen the
    /// listener; `Session::listen`). Written only through `&mut self`
    /// apart from `listen`'s store, so its loads are plain.
    listened: AtomicBool,
}

/// A place held in a session without a reader: retention keeps the events
/// after it as for a reader that holds its place ([`Replay::hold`]), up
/// to `reader_hold_bytes`, until the `Hold` is dropped. For a consumer
/// that reads in rounds with a new reader each time (a cluster node
/// copying a session into Redis) and must not lose what it has not copied
/// yet. From [`SessionHandle::hold_after`].
#[derive(Debug)]
pub struct Hold {
    handle: SessionHandle,
    slot: usize,
}

impl Hold {
    /// Everything up to sequence number `after` is consumed: hold the
    /// place after it. Only ever moves forward.
    pub fn advance(&self, after: u64) {
        self.handle
            .session
            .window
            .move_hold(self.slot, after.saturating_add(1));
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.handle.session.window.unhold(self.slot);
    }
}

impl SessionHandle {
    /// Holds the place after sequence number `after` (see [`Hold`]).
    /// `None` when the session's hold slots are all taken.
    pub fn hold_after(&self, after: u64) -> Option<Hold> {
        let slot = self.session.window.hold(after.saturating_add(1))?;
        Some(Hold {
            handle: self.clone(),
            slot,
        })
    }
}

/// The stream of a reader of every stream
/// ([`SessionHandle::subscribe_all`](crate::SessionHandle::subscribe_all)).
pub(crate) const ALL_STREAMS: u32 = crate::session::NO_STREAM;

/// Delivered events a reader accumulates before adding them to the
/// engine's counters.
const REPORT_EVERY: u64 = 64;

impl fmt::Debug for Replay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replay")
            .field("session", &self.handle.id())
            .field("stream", &self.stream)
            .field("position", &self.position)
            .finish()
    }
}

impl Replay {
    pub(crate) fn new(handle: SessionHandle, stream: u32, after: u64) -> Replay {
        let cursor = handle.session.window.cursor_after(after);
        Replay::at(handle, stream, cursor)
    }

    /// A reader whose next event is the one `cursor` reads (a cursor the
    /// resume decision already placed in the window).
    pub(crate) fn at(handle: SessionHandle, stream: u32, cursor: Cursor) -> Replay {
        handle.session.busy.fetch_add(1, Ordering::Relaxed);
        Replay {
            position: cursor.seq - 1,
            cursor,
            handle,
            stream,
            unreported: (0, 0),
            held: None,
            listened: AtomicBool::new(false),
        }
    }

    /// Holds this reader's place in its session: until it is dropped,
    /// retention keeps the events it has not read yet, even once newer
    /// events fill the session's `session_events`/`session_bytes`, as long
    /// as the session holds at most `reader_hold_bytes` of segments
    /// ([`Config`](crate::Config)). Past that, or when the pool itself
    /// must make room, events go as for any reader, and this one finds
    /// [`ReplayError::Lagged`].
    ///
    /// For a reader that delivers to a connected client as events come:
    /// a burst written faster than the client reads it is then buffered,
    /// not dropped. Returns `false` when the session's few hold slots are
    /// taken (the reader reads as usual, holding nothing back); `true` if
    /// this reader already held its place.
    pub fn hold(&mut self) -> bool {
        if self.held.is_none() {
            self.held = self.handle.session.window.hold(self.cursor.seq);
        }
        self.held.is_some()
    }

    /// Tells the window where a held reader reads next.
    #[inline]
    fn moved(&self) {
        if let Some(slot) = self.held {
            self.handle.session.window.move_hold(slot, self.cursor.seq);
        }
    }

    /// The session this reader reads.
    pub fn session(&self) -> &SessionHandle {
        &self.handle
    }

    /// The stream this reader delivers.
    pub fn stream(&self) -> u32 {
        self.stream
    }

    /// The id of the last event delivered, or of the starting cursor: what
    /// a client would send as `Last-Event-ID` to continue from here.
    pub fn position(&self) -> EventId {
        self.handle.session.event_id(self.stream, self.position)
    }

    /// The next event of the stream: its id, with its payload in `buf`
    /// (cleared first). `Ok(None)` when caught up with the writers.
    //
    // Inlined into the caller (the window's read stays a call): returned
    // through memory, the id's narrow fields were copied out by the
    // caller with wider loads than their stores, a stall on every event
    // (BENCHMARKS.md, run AL).
    #[inline(always)]
    pub fn next_into(&mut self, buf: &mut Vec<u8>) -> Result<Option<EventId>, ReplayError> {
        let s = &*self.handle.session;
        let metrics = &self.handle.shared.metrics;
        let all = self.stream == ALL_STREAMS;
        let spin = Spin::new();
        let mut waiting = false;
        loop {
            let read = s.window.read(
                &self.handle.shared.pool,
                s.owner(),
                &mut self.cursor,
                (!all).then_some(self.stream),
                buf,
            );
            self.moved();
            match read {
                Read::Event(meta) => {
                    self.position = meta.seq;
                    self.unreported.0 += 1;
                    self.unreported.1 += meta.len as u64;
                    if self.unreported.0 >= REPORT_EVERY {
                        report(metrics, &mut self.unreported);
                    }
                    let stream = if all { meta.stream } else { self.stream };
                    return Ok(Some(s.event_id(stream, meta.seq)));
                }
                Read::Pending
                    if waits_for_writer(&mut self.listened, &self.cursor, &mut waiting) =>
                {
                    spin.snooze()
                }
                other => return self.stopped(other).map(|_| None),
            }
        }
    }

    /// What a read that found no event means for the caller.
    fn stopped(&mut self, read: Read) -> Result<(), ReplayError> {
        let s = &*self.handle.session;
        let metrics = &self.handle.shared.metrics;
        report(metrics, &mut self.unreported);
        match read {
            Read::Event(_) | Read::Pending => {
                if s.is_ended() {
                    return Err(ReplayError::SessionEnded);
                }
                Ok(())
            }
            Read::Lagged { missing } => {
                if s.is_ended() {
                    return Err(ReplayError::SessionEnded);
                }
                metrics.add(Counter::ReaderGaps, 1);
                Err(ReplayError::Lagged {
                    after: s.event_id(self.stream, self.position),
                    missing_seq: missing,
                })
            }
            Read::Ended => Err(ReplayError::SessionEnded),
        }
    }

    /// Reads every event of the stream that is ready, up to `max_events`
    /// events or until `batch`'s buffer holds at least `max_bytes` bytes
    /// (payloads and the 24-byte frame header each is stored with), into
    /// `batch` (cleared first).
    /// Returns how many it read; `Ok(0)` when caught up, like `next_into`'s
    /// `None`.
    ///
    /// The same events, in the same order, as calling
    /// [`next_into`](Replay::next_into) that many times, at a fraction of
    /// the cost per event: the frames of one segment are copied in one
    /// piece, as the pool holds them. A gap or the session's end met after
    /// some events were read is returned by the next call, so no event
    /// before it is withheld.
    pub fn next_batch(
        &mut self,
        batch: &mut Batch,
        max_events: usize,
        max_bytes: usize,
    ) -> Result<usize, ReplayError> {
        let s = &*self.handle.session;
        let spin = Spin::new();
        let mut waiting = false;
        loop {
            batch.clear();
            batch.id = s.event_id(self.stream, 0);
            if max_events == 0 {
                return Ok(0);
            }
            // Ends are kept as u32: stop well before 4 GiB.
            let max_bytes = max_bytes.min(1 << 31);
            let Batch { data, events, .. } = batch;
            let stopped = s.window.read_many(
                &self.handle.shared.pool,
                s.owner(),
                &mut self.cursor,
                self.stream,
                data,
                events,
                max_events,
                max_bytes,
            );
            self.moved();
            let n = batch.events.len();
            if let Some(&(last, _, _)) = batch.events.last() {
                self.position = last;
                self.unreported.0 += n as u64;
                self.unreported.1 += batch.payload_bytes() as u64;
                if self.unreported.0 >= REPORT_EVERY {
                    report(&self.handle.shared.metrics, &mut self.unreported);
                }
                return Ok(n);
            }
            return match stopped {
                None => Ok(0),
                Some(Read::Pending)
                    if waits_for_writer(&mut self.listened, &self.cursor, &mut waiting) =>
                {
                    spin.snooze();
                    continue;
                }
                Some(read) => self.stopped(read).map(|_| 0),
            };
        }
    }

    /// After [`ReplayError::Lagged`]: moves to the oldest event the session
    /// still holds and returns its sequence number. Events between are lost
    /// to this reader; tell the client (a `gap` signal).
    pub fn skip_gap(&mut self) -> u64 {
        let s = &self.handle.session;
        let oldest = s
            .window
            .oldest_retained(&self.handle.shared.pool)
            .max(self.cursor.seq);
        self.cursor = s.window.cursor_after(oldest - 1);
        self.moved();
        oldest
    }

    /// A registration for the session's next append (or its end). Create
    /// it, call `next_into` once more, and wait only if that returned
    /// `None`: an append between the two calls is then never missed.
    /// Appenders pay for a wake-up only while a reader is registered.
    pub fn listen(&self) -> Waiter {
        // Relaxed: read by this reader's own next read, through `&mut self`.
        self.listened.store(true, Ordering::Relaxed);
        self.handle.session.listen(&self.handle.shared.pool)
    }

    /// Blocks the thread until the next event, the end of the session, or
    /// `timeout` (then `Ok(None)`). For async code, await [`Replay::listen`]
    /// instead.
    pub fn wait_next(
        &mut self,
        buf: &mut Vec<u8>,
        timeout: Duration,
    ) -> Result<Option<EventId>, ReplayError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(id) = self.next_into(buf)? {
                return Ok(Some(id));
            }
            let waiter = self.listen();
            if let Some(id) = self.next_into(buf)? {
                return Ok(Some(id));
            }
            if !waiter.wait_deadline(deadline) && Instant::now() >= deadline {
                return self.next_into(buf);
            }
        }
    }
}

/// Events of one stream read by [`Replay::next_batch`]: the segment runs
/// they were copied out of, in one buffer, and where each payload lies in
/// it.
///
/// Reuse one per reader: after the first few batches its buffers have
/// grown to the batch size and reading allocates nothing.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Runs of frames as the pool holds them (headers and payloads).
    data: Vec<u8>,
    /// Per event: its sequence number and where its payload is in `data`.
    events: Vec<(u64, u32, u32)>,
    /// The id of the batch's stream with sequence 0; each event's id is
    /// this with its own sequence number.
    id: EventId,
}

impl Default for Batch {
    fn default() -> Batch {
        Batch {
            data: Vec::new(),
            events: Vec::new(),
            id: EventId {
                tag: 0,
                node: 0,
                epoch: 0,
                stream: 0,
                seq: 0,
            },
        }
    }
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Events in the batch.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether the batch holds no event.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Payload bytes in the batch, all events together.
    pub fn payload_bytes(&self) -> usize {
        self.events
            .iter()
            .map(|&(_, start, end)| (end - start) as usize)
            .sum()
    }

    /// The events, in order: each one's id and payload.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (EventId, &[u8])> + '_ {
        // The id and the buffer are copied into the iterator: read through
        // `self` at each step, they are loaded again whenever the caller's
        // loop body might write memory (a call, a `black_box`).
        let (id, data) = (self.id, &self.data[..]);
        self.events.iter().map(move |&(seq, start, end)| {
            let payload = &data[start as usize..end as usize];
            (EventId { seq, ..id }, payload)
        })
    }

    /// Empties the batch, keeping its buffers.
    pub fn clear(&mut self) {
        self.data.clear();
        self.events.clear();
    }
}

/// Adds what a reader delivered since its last report to the engine's
/// counters.
fn report(metrics: &Metrics, unreported: &mut (u64, u64)) {
    let (events, bytes) = std::mem::take(unreported);
    if events > 0 {
        metrics.add_pair(
            Counter::EventsReplayed,
            events,
            Counter::ReplayedBytes,
            bytes,
        );
    }
}

impl Drop for Replay {
    fn drop(&mut self) {
        report(&self.handle.shared.metrics, &mut self.unreported);
        if let Some(slot) = self.held {
            self.handle.session.window.unhold(slot);
        }
        self.handle.session.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// After a read found nothing: whether it stopped at a frame being copied
/// that a reader about to park must wait for (see `Replay::listened`).
/// `waiting` keeps the answer for the reads that follow until the frame is
/// published.
#[inline]
fn waits_for_writer(listened: &mut AtomicBool, cursor: &Cursor, waiting: &mut bool) -> bool {
    *waiting = (*waiting || std::mem::take(listened.get_mut())) && cursor.at_a_claimed_frame();
    *waiting
}
