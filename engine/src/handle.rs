//! [`SessionHandle`]: what an embedding holds to append to a session, open
//! streams on it, and read it.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::id::{EventId, SessionId};
use crate::metrics::Counter;
use crate::replay::Replay;
use crate::session::{Attachment, Session, NO_STREAM};
use crate::shared::Shared;
use crate::storage::{AppendFailure, SingleWriter};

/// Why an append was refused. Nothing was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AppendError {
    /// The payload is larger than any event the engine holds
    /// ([`Config::max_event_bytes`](crate::Config)).
    TooLarge {
        /// The payload's length.
        len: usize,
        /// The largest payload the engine accepts.
        max: usize,
    },
    /// The session has ended (closed, expired or evicted).
    SessionEnded,
    /// The stream id is reserved.
    BadStream,
    /// The pool is full and nothing could be freed: every segment belongs
    /// to a busy session's newest events.
    PoolExhausted,
    /// The session takes its events from its single writer
    /// ([`SessionWriter`]), which is still live.
    SingleWriter,
}

impl fmt::Display for AppendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AppendError::TooLarge { len, max } => {
                write!(
                    f,
                    "event of {len} bytes exceeds the per-event limit of {max} bytes"
                )
            }
            AppendError::SessionEnded => f.write_str("the session has ended"),
            AppendError::BadStream => f.write_str("stream id u32::MAX is reserved"),
            AppendError::PoolExhausted => f.write_str(
                "the event pool is full of busy sessions' newest events; raise global_bytes",
            ),
            AppendError::SingleWriter => f.write_str(
                "the session was opened for a single writer, which is still live: append through its SessionWriter",
            ),
        }
    }
}

impl std::error::Error for AppendError {}

/// A live session: append to it, open streams on it, read it.
///
/// Holding a handle keeps the session's record alive but not the session:
/// after it ends (closed, expired, evicted) appends fail with
/// [`AppendError::SessionEnded`] and readers stop.
#[derive(Clone)]
pub struct SessionHandle {
    pub(crate) session: Arc<Session>,
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for SessionHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.session, f)
    }
}

/// A call in flight on a session, from [`SessionHandle::begin_call`]: while
/// any is held the session is never evicted.
#[derive(Debug)]
pub struct CallGuard {
    session: Arc<Session>,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.session.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

impl SessionHandle {
    /// The session's id (the credential clients present).
    pub fn id(&self) -> SessionId {
        self.session.id
    }

    /// The session's epoch (incarnation).
    pub fn epoch(&self) -> u64 {
        self.session.epoch
    }

    /// The principal the session is bound to, if any.
    pub fn principal(&self) -> Option<&str> {
        self.session.principal.as_deref()
    }

    /// Whether the session has ended.
    pub fn is_ended(&self) -> bool {
        self.session.is_ended()
    }

    /// A new stream id, unique within the session (stream 0 is the
    /// session's standalone stream and is never returned). `None` after
    /// 2³² − 2 streams.
    pub fn new_stream(&self) -> Option<u32> {
        let stream = self.session.new_stream()?;
        if stream.is_multiple_of(crate::shared::STREAM_BLOCK) {
            // A restored session starts one block above the last journaled
            // one, so no stream id handed out before a crash is handed out
            // again (see `Shared::new`).
            let _ = self
                .shared
                .journal(|| crate::durable::journal::Record::Streams {
                    id: self.session.id.bits(),
                    epoch: self.session.epoch,
                    below: stream.saturating_add(crate::shared::STREAM_BLOCK),
                });
        }
        Some(stream)
    }

    /// Whether this session incarnation was restored from the data
    /// directory when the engine started (it lived in an earlier process).
    pub fn is_restored(&self) -> bool {
        self.session.restored.is_some()
    }

    /// Stores `blob` with the session in the data directory's journal (the
    /// server keeps the client's `initialize` parameters there), so that a
    /// restored session can give it back ([`stored_init`]). For a heap
    /// engine nothing is stored and this returns `Ok`.
    ///
    /// [`stored_init`]: SessionHandle::stored_init
    pub fn store_init(&self, blob: &[u8]) -> std::io::Result<()> {
        if let Some(d) = &self.shared.durable {
            // Kept for rewrites of the journal; before the record, so a
            // rewrite in between carries it (a duplicate is harmless).
            d.inits
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(self.session.id.bits(), Box::from(blob));
        }
        self.shared
            .journal(|| crate::durable::journal::Record::Init {
                id: self.session.id.bits(),
                epoch: self.session.epoch,
                blob: Box::from(blob),
            })
    }

    /// What [`store_init`](SessionHandle::store_init) stored before the
    /// restart, for a restored session.
    pub fn stored_init(&self) -> Option<&[u8]> {
        self.session.restored.as_ref()?.init.as_deref()
    }

    /// Appends an event to `stream` and returns its id. Takes no lock; any
    /// number of threads may append to one session at once. Wakes readers
    /// parked on the session (and only then pays for a wake-up).
    ///
    /// A session opened with [`Engine::open_single_writer`](crate::Engine::open_single_writer)
    /// takes its events from its [`SessionWriter`] and refuses this
    /// ([`AppendError::SingleWriter`]) until the writer is dropped.
    #[inline]
    pub fn append(&self, stream: u32, payload: &[u8]) -> Result<EventId, AppendError> {
        let s = &*self.session;
        if !s.window.takes_shared_appends() {
            self.shared.metrics.add(Counter::AppendsRefused, 1);
            return Err(AppendError::SingleWriter);
        }
        self.append_with::<true>(stream, payload, |shared, now, check| {
            s.window.append(
                &shared.pool,
                s.owner(),
                &shared.keep,
                stream,
                now,
                payload,
                check,
            )
        })
    }

    /// What both append paths share around the window's own: the stream
    /// check, the clock, the durable pool's CRC, making room when the pool
    /// is full, the sync, the activity stamp and the wake-up.
    ///
    /// `SHARED`: the window append was a shared one, whose claim CAS the
    /// wake-up check builds on (`Session::listen`); a single writer's
    /// claims nothing and pays the check's own RMW.
    #[inline(always)]
    fn append_with<const SHARED: bool>(
        &self,
        stream: u32,
        payload: &[u8],
        mut window_append: impl FnMut(&Shared, u64, u32) -> Result<u64, AppendFailure>,
    ) -> Result<EventId, AppendError> {
        let shared = &*self.shared;
        let s = &*self.session;
        let refused = |e| {
            shared.metrics.add(Counter::AppendsRefused, 1);
            Err(e)
        };
        if stream == NO_STREAM {
            return refused(AppendError::BadStream);
        }
        let now = shared.now_ms();
        // A durable pool proves each frame on recovery by its payload's CRC
        // bound to its stream id (a mark alone cannot prove that the payload
        // reached the device, nor that the stream id is the one written).
        let check = shared
            .durable
            .as_ref()
            .map_or(0, |d| d.frame_check.of((s.tag, s.epoch), stream, payload));
        let mut reclaimed = 0;
        let seq = loop {
            match window_append(shared, now, check) {
                Ok(seq) => break seq,
                Err(AppendFailure::TooLarge { max }) => {
                    return refused(AppendError::TooLarge {
                        len: payload.len(),
                        max,
                    })
                }
                Err(AppendFailure::Ended) => return refused(AppendError::SessionEnded),
                Err(AppendFailure::PoolFull { class }) => {
                    // Other appenders may take what a reclaim frees before
                    // this one retries; give up only when a reclaim frees
                    // nothing, or after many rounds.
                    if reclaimed == 16 || !shared.reclaim(class) {
                        return refused(AppendError::PoolExhausted);
                    }
                    reclaimed += 1;
                }
            }
        };
        if shared.durable.as_ref().is_some_and(|d| d.sync_each_append) {
            // Counted on failure; the event is stored (and readable) either
            // way, only its survival of a power loss is in doubt.
            let _ = shared.sync_durable();
        }
        s.touch(now);
        if SHARED {
            s.wake_after_claim();
        } else {
            s.wake();
        }
        Ok(s.event_id(stream, seq))
    }

    /// Marks the session active now (resets its idle TTL), e.g. while a
    /// client holds a stream open with nothing to send.
    pub fn touch(&self) {
        self.session.touch(self.shared.now_ms());
    }

    /// Marks a call in flight until the guard drops: the session is not
    /// evicted meanwhile (open readers count the same way).
    pub fn begin_call(&self) -> CallGuard {
        self.session.busy.fetch_add(1, Ordering::Relaxed);
        CallGuard {
            session: self.session.clone(),
        }
    }

    /// Opens a reader of `stream` that starts after everything appended so
    /// far: the live part of a fresh stream. Its [`Replay::position`] is the
    /// id to send as the stream's priming event; a client resuming from it
    /// gets exactly the events this reader would have delivered.
    pub fn subscribe(&self, stream: u32) -> Replay {
        let from = self.high_water();
        Replay::new(self.clone(), stream, from)
    }

    /// Opens a reader of `stream` positioned after `after`, an id this
    /// session incarnation issued (e.g. the position where an earlier
    /// reader of the stream stopped). `None` if `after` names another
    /// session, another incarnation, another stream, or a sequence number
    /// not issued yet: the engine never positions a reader by a cursor it
    /// did not mint for this session. Events after `after` that are no
    /// longer retained make the reader's first read
    /// [`ReplayError::Lagged`](crate::ReplayError).
    pub fn subscribe_from(&self, stream: u32, after: EventId) -> Option<Replay> {
        let s = &self.session;
        let mine = after.tag == s.tag && after.epoch == s.epoch && after.stream == stream;
        (mine && after.seq <= self.high_water())
            .then(|| Replay::new(self.clone(), stream, after.seq))
    }

    /// Opens a reader of `stream` from the first event the session ever
    /// appended: everything on the stream that is still retained, then live
    /// events. If older events of the session are gone, the first read is
    /// [`ReplayError::Lagged`](crate::ReplayError).
    pub fn subscribe_from_start(&self, stream: u32) -> Replay {
        Replay::new(self.clone(), stream, 0)
    }

    /// Opens a reader of *every* stream of the session, after sequence
    /// number `after` (0: from the first event): each event once, in
    /// sequence order, its id naming its own stream. For an embedding that
    /// copies a session's events elsewhere (a cluster node writing them to
    /// the shared tier). [`Replay::next_into`] and [`Replay::skip_gap`]
    /// work as for one stream; [`Replay::stream`] and the stream of
    /// [`Replay::position`] are `u32::MAX`, which no stream has.
    pub fn subscribe_all(&self, after: u64) -> Replay {
        Replay::new(
            self.clone(),
            crate::replay::ALL_STREAMS,
            after.min(self.high_water()),
        )
    }

    /// The id of the newest event on the session (on any stream) as if it
    /// were on `stream`: a cursor meaning "everything after now".
    pub fn cursor_now(&self, stream: u32) -> EventId {
        self.session.event_id(stream, self.high_water())
    }

    /// The highest sequence number issued on the session (0 before the
    /// first append).
    pub fn high_water(&self) -> u64 {
        self.session.window.high_water(&self.shared.pool)
    }

    /// Bytes of pool memory the session's retained events occupy now.
    pub fn held_bytes(&self) -> u64 {
        u64::from(self.session.window.held_units()) * self.shared.pool.shape().unit_words as u64 * 8
    }

    /// Ends the session (as [`Engine::close`](crate::Engine::close)).
    pub fn close(&self) -> bool {
        self.shared
            .end(&self.session, crate::session::EndReason::Closed)
    }

    /// Time since the session was opened.
    pub fn age(&self) -> Duration {
        Duration::from_millis(self.shared.now_ms().saturating_sub(self.session.opened_ms))
    }

    /// Keeps `attachment` with the session (held weakly); the engine calls
    /// [`Attachment::ended`] on it when the session ends. Returns `false`
    /// if the session already has one. If the session has already ended,
    /// `ended` is called at once.
    pub fn attach(&self, attachment: Weak<dyn Attachment>) -> bool {
        if !self.session.attach(attachment) {
            return false;
        }
        if self.session.is_ended() {
            // Ended between the lookup and now: the end could not tell it.
            self.session.tell_ended(crate::session::EndReason::Closed);
        }
        true
    }

    /// The session's attachment, if it is a `T` and still alive.
    pub fn attachment<T: Attachment>(&self) -> Option<Arc<T>> {
        let any: Arc<dyn std::any::Any + Send + Sync> = self.session.attachment()?;
        any.downcast::<T>().ok()
    }
}

/// The one writer of a session opened with
/// [`Engine::open_single_writer`](crate::Engine::open_single_writer): for
/// an embedding whose output for a session comes from one task.
///
/// Its appends take no locked instruction for the event itself: the
/// session's head segment and its claims are known to the writer, not
/// loaded and CASed as [`SessionHandle::append`] must when any thread may
/// append (the wake-up check is the one RMW left). Everything else is as
/// for any session: readers, resumes, retention, eviction and close work
/// through [`handle`](Self::handle) and the engine.
///
/// While the writer is live, [`SessionHandle::append`] on its session is
/// refused ([`AppendError::SingleWriter`]); once it is dropped, the
/// session takes appends from any thread. A session closed (or evicted)
/// while its writer is live keeps its newest segment until the writer
/// next appends (which fails with [`AppendError::SessionEnded`]) or is
/// dropped: the writer may be writing into it, so the close leaves it to
/// the writer rather than wait for it.
pub struct SessionWriter {
    handle: SessionHandle,
    state: SingleWriter,
}

impl fmt::Debug for SessionWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionWriter")
            .field("session", &self.handle.session)
            .finish_non_exhaustive()
    }
}

impl SessionWriter {
    pub(crate) fn new(handle: SessionHandle) -> SessionWriter {
        SessionWriter {
            handle,
            state: SingleWriter::new(),
        }
    }

    /// The session this writer appends to: open streams on it, read it,
    /// close it. Clone it to hand to readers.
    pub fn handle(&self) -> &SessionHandle {
        &self.handle
    }

    /// Appends an event to `stream` and returns its id, as
    /// [`SessionHandle::append`] does.
    #[inline]
    pub fn append(&mut self, stream: u32, payload: &[u8]) -> Result<EventId, AppendError> {
        let SessionWriter { handle, state } = self;
        let s = &*handle.session;
        handle.append_with::<false>(stream, payload, |shared, now, check| {
            s.window.append_single(
                &shared.pool,
                s.owner(),
                &shared.keep,
                state,
                stream,
                now,
                payload,
                check,
            )
        })
    }
}

impl Drop for SessionWriter {
    fn drop(&mut self) {
        let h = &self.handle;
        h.session
            .window
            .writer_done(&h.shared.pool, &mut self.state);
    }
}
