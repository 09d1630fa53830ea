//! Readers of one stream of one session: replay and live delivery in one loop.
//!
//! A [`Replay`] is a position in its session's ring. `next_into` returns the
//! next event of its stream after that position, or `None` once it has
//! caught up with the writers; the caller then waits (`listen`, or
//! `wait_next`) and calls again. Replaying old events and delivering new
//! ones is the same loop over the same ring (invariant 7 in
//! `docs/invariants.md`), so
//! there is no window between "replay finished" and "live subscription
//! registered" in which an event could be stored but sent nowhere, and no
//! event is delivered twice.
//!
//! The reader only ever reads the ring of the session it was made from
//! (invariant 2): there is no way to point it at another session's events.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use event_listener::{EventListener, Listener};

use crate::engine::Shared;
use crate::id::EventId;
use crate::metrics::Counter;
use crate::ring::SlotRead;
use crate::session::Session;

/// Why a reader cannot go on from where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplayError {
    /// Events after the reader's position were overwritten before it read
    /// them: the stream has a gap. [`Replay::skip_gap`] moves past it.
    Lagged {
        /// The reader's position: the last event it delivered (or its
        /// starting cursor).
        after: EventId,
        /// The first sequence number that could not be read.
        missing_seq: u64,
    },
    /// The session ended (closed, expired, evicted) and every event
    /// appended before the end has been delivered.
    SessionEnded,
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayError::Lagged { after, missing_seq } => write!(
                f,
                "reader lagged: events after {after} (from sequence {missing_seq}) were overwritten"
            ),
            ReplayError::SessionEnded => f.write_str("the session has ended"),
        }
    }
}

impl std::error::Error for ReplayError {}

/// A reader of one stream of one session, from a position onward.
pub struct Replay {
    session: Arc<Session>,
    shared: Arc<Shared>,
    stream: u32,
    /// Next sequence number to look at.
    next_seq: u64,
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
            .field("session", &self.session.id)
            .field("stream", &self.stream)
            .field("position", &self.position)
            .finish()
    }
}

impl Replay {
    pub(crate) fn new(
        session: Arc<Session>,
        shared: Arc<Shared>,
        stream: u32,
        after: u64,
    ) -> Replay {
        Replay {
            session,
            shared,
            stream,
            next_seq: after + 1,
            position: after,
            unreported: (0, 0),
        }
    }

    /// The stream this reader delivers.
    pub fn stream(&self) -> u32 {
        self.stream
    }

    /// The id of the last event delivered, or of the starting cursor: what
    /// a client would send as `Last-Event-ID` to continue from here.
    pub fn position(&self) -> EventId {
        self.session.event_id(self.stream, self.position)
    }

    /// The next event of the stream: its id, with its payload in `buf`
    /// (cleared first). `Ok(None)` when caught up with the writers.
    pub fn next_into(&mut self, buf: &mut Vec<u8>) -> Result<Option<EventId>, ReplayError> {
        let ring = &self.session.ring;
        loop {
            let seq = self.next_seq;
            match ring.read(seq, Some(self.stream), buf) {
                SlotRead::Event(meta) => {
                    self.next_seq = seq + 1;
                    self.position = seq;
                    self.unreported.0 += 1;
                    self.unreported.1 += meta.len as u64;
                    if self.unreported.0 >= REPORT_EVERY {
                        self.report();
                    }
                    return Ok(Some(self.session.event_id(self.stream, seq)));
                }
                SlotRead::OtherStream(_) => self.next_seq = seq + 1,
                SlotRead::Pending => {
                    self.report();
                    // Checked only when caught up: events appended before
                    // the end are still delivered.
                    if self.session.is_ended() {
                        return Err(ReplayError::SessionEnded);
                    }
                    return Ok(None);
                }
                SlotRead::Overwritten => {
                    self.report();
                    self.shared.metrics.add(Counter::Lagged, 1);
                    return Err(ReplayError::Lagged {
                        after: self.position(),
                        missing_seq: seq,
                    });
                }
            }
        }
    }

    /// Adds what this reader delivered since the last report to the
    /// engine's counters.
    fn report(&mut self) {
        let (events, bytes) = std::mem::take(&mut self.unreported);
        if events > 0 {
            self.shared.metrics.add_pair(
                Counter::EventsReplayed,
                events,
                Counter::ReplayedBytes,
                bytes,
            );
        }
    }

    /// After [`ReplayError::Lagged`]: moves to the oldest event the ring
    /// still holds and returns its sequence number. Events between are lost
    /// to this reader; tell the client (a `gap` signal).
    pub fn skip_gap(&mut self) -> u64 {
        let oldest = self.session.ring.oldest_retained().max(self.next_seq);
        self.next_seq = oldest;
        oldest
    }

    /// A listener that fires on the session's next append (or its end).
    /// Create it, call `next_into` once more, and wait only if that returned
    /// `None`: an append between the two calls is then never missed.
    pub fn listen(&self) -> EventListener {
        self.session.listen()
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
            let listener = self.listen();
            if let Some(id) = self.next_into(buf)? {
                return Ok(Some(id));
            }
            if listener.wait_deadline(deadline).is_none() && Instant::now() >= deadline {
                return self.next_into(buf);
            }
        }
    }
}

impl Drop for Replay {
    fn drop(&mut self) {
        self.report();
    }
}
