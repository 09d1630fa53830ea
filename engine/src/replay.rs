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
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::handle::SessionHandle;
use crate::id::EventId;
use crate::metrics::{Counter, Metrics};
use crate::session::Waiter;
use crate::storage::{Cursor, Read};

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
}

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
    pub fn next_into(&mut self, buf: &mut Vec<u8>) -> Result<Option<EventId>, ReplayError> {
        let s = &*self.handle.session;
        let metrics = &self.handle.shared.metrics;
        let read = s.window.read(
            &self.handle.shared.pool,
            s.owner(),
            &mut self.cursor,
            Some(self.stream),
            buf,
        );
        match read {
            Read::Event(meta) => {
                self.position = meta.seq;
                self.unreported.0 += 1;
                self.unreported.1 += meta.len as u64;
                if self.unreported.0 >= REPORT_EVERY {
                    report(metrics, &mut self.unreported);
                }
                Ok(Some(s.event_id(self.stream, meta.seq)))
            }
            Read::Pending => {
                report(metrics, &mut self.unreported);
                if s.is_ended() {
                    return Err(ReplayError::SessionEnded);
                }
                Ok(None)
            }
            Read::Lagged { missing } => {
                report(metrics, &mut self.unreported);
                if s.is_ended() {
                    return Err(ReplayError::SessionEnded);
                }
                metrics.add(Counter::ReaderGaps, 1);
                Err(ReplayError::Lagged {
                    after: s.event_id(self.stream, self.position),
                    missing_seq: missing,
                })
            }
            Read::Ended => {
                report(metrics, &mut self.unreported);
                Err(ReplayError::SessionEnded)
            }
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
        oldest
    }

    /// A registration for the session's next append (or its end). Create
    /// it, call `next_into` once more, and wait only if that returned
    /// `None`: an append between the two calls is then never missed.
    /// Appenders pay for a wake-up only while a reader is registered.
    pub fn listen(&self) -> Waiter {
        self.handle.session.listen()
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
        self.handle.session.busy.fetch_sub(1, Ordering::Relaxed);
    }
}
