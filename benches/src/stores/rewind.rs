//! Rewind, through its public API only.

use std::hint::black_box;

use std::cell::RefCell;

use rewind_engine::{
    Batch, Config, Engine, Replay, ResumeAction, ResumeRequest, SessionHandle, SessionWriter,
};

use crate::{AppendStore, ReplayStore};

/// The engine behind the bench traits. A writer is a `SessionHandle` and a
/// stream; a cursor is what a client sends — the session id and
/// `Last-Event-ID` header strings — so replay and resume pay for parsing,
/// lookup, classification and the native policy's decision.
#[derive(Debug)]
pub struct RewindStore {
    engine: Engine,
}

/// A writer on one stream of one Rewind session.
#[derive(Debug, Clone)]
pub struct RewindWriter {
    handle: SessionHandle,
    stream: u32,
}

/// The headers a reconnecting client presents.
#[derive(Debug, Clone)]
pub struct RewindCursor {
    session_id: String,
    last_event_id: String,
}

impl RewindStore {
    /// An engine whose sessions keep at least `session_events` events, with
    /// a pool no bench fills (3 GiB, committed only as sessions use it).
    pub fn new(session_events: u64) -> RewindStore {
        let mut config = Config::default();
        config.session_events = session_events;
        config.session_bytes = 1 << 30;
        config.global_bytes = 3 << 30;
        config.max_sessions = 1 << 22;
        RewindStore {
            engine: Engine::new(config).expect("bench config is valid"),
        }
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    fn request<'a>(cursor: &'a RewindCursor) -> ResumeRequest<'a> {
        ResumeRequest {
            session_id: Some(&cursor.session_id),
            last_event_id: Some(&cursor.last_event_id),
            principal: None,
        }
    }

    /// Resumes from `cursor` and, if the decision is a replay, runs `read`
    /// on the reader where the decision holds it; `None` otherwise.
    ///
    /// Not moved out first: a move right after the decision copies the
    /// reader in wider pieces than its fields were just stored in, and on
    /// the AMD hosts here such a load waits for those stores to drain —
    /// 14–17 ns a resume (BENCHMARKS.md, run AM). A caller that does any
    /// work between the two (the server records the decision's metrics
    /// first) does not wait; a bench that moves at once measures its own
    /// move.
    #[inline(always)]
    fn with_replay<R>(
        &self,
        cursor: &RewindCursor,
        read: impl FnOnce(&mut Replay) -> R,
    ) -> Option<R> {
        let mut decision = self.engine.resume(Self::request(cursor));
        match &mut decision.action {
            ResumeAction::Replay(replay) => Some(read(replay)),
            _ => None,
        }
    }
}

impl Default for RewindStore {
    /// Sessions of 64 events, as in the replay group.
    fn default() -> Self {
        RewindStore::new(64)
    }
}

impl AppendStore for RewindStore {
    type Writer = RewindWriter;
    const NAME: &'static str = "Rewind";

    fn open(&self) -> RewindWriter {
        let handle = self
            .engine
            .open(None)
            .expect("global budget is unreachable");
        let stream = handle.new_stream().expect("fresh session has streams");
        RewindWriter { handle, stream }
    }

    #[inline]
    fn append(&self, w: &mut RewindWriter, payload: &[u8]) {
        black_box(w.handle.append(w.stream, payload).expect("append"));
    }
}

impl ReplayStore for RewindStore {
    type Cursor = RewindCursor;

    fn append_for_cursor(&self, w: &mut RewindWriter, payload: &[u8]) -> RewindCursor {
        let id = w.handle.append(w.stream, payload).expect("append");
        RewindCursor {
            session_id: w.handle.id().to_string(),
            last_event_id: id.to_string(),
        }
    }

    fn close(&self, w: RewindWriter) {
        w.handle.close();
    }

    /// Replays in whole batches (`next_batch`): each segment run copied
    /// once into the batch's buffer. (`rewind serve` reads one event per
    /// call, as [`RewindPerEventStore`] measures: it frames and writes each
    /// event as it goes.)
    fn replay_after(&self, cursor: &RewindCursor, _buf: &mut Vec<u8>) -> usize {
        self.with_replay(cursor, |replay| {
            BATCH.with_borrow_mut(|batch| {
                let mut n = 0;
                while let Ok(k) = replay.next_batch(batch, usize::MAX, usize::MAX) {
                    if k == 0 {
                        break;
                    }
                    for event in batch.iter() {
                        black_box(event);
                    }
                    n += k;
                }
                n
            })
        })
        .unwrap_or(0)
    }

    fn resume_first(&self, cursor: &RewindCursor, buf: &mut Vec<u8>) -> bool {
        self.with_replay(cursor, |replay| {
            matches!(replay.next_into(buf), Ok(Some(id)) if { black_box((id, &*buf)); true })
        })
        .unwrap_or(false)
    }
}

thread_local! {
    /// The batch each bench thread replays into (a server keeps one per
    /// stream).
    static BATCH: RefCell<Batch> = RefCell::new(Batch::new());
}

/// Rewind replaying one event per call (`next_into`), for comparison with
/// the batched reads of [`RewindStore`]: the cost a caller pays per event
/// when it does not batch.
#[derive(Debug, Default)]
pub struct RewindPerEventStore(pub RewindStore);

impl AppendStore for RewindPerEventStore {
    type Writer = RewindWriter;
    const NAME: &'static str = "RewindPerEvent";

    fn open(&self) -> RewindWriter {
        self.0.open()
    }

    #[inline]
    fn append(&self, w: &mut RewindWriter, payload: &[u8]) {
        self.0.append(w, payload);
    }
}

impl ReplayStore for RewindPerEventStore {
    type Cursor = RewindCursor;

    fn append_for_cursor(&self, w: &mut RewindWriter, payload: &[u8]) -> RewindCursor {
        self.0.append_for_cursor(w, payload)
    }

    fn close(&self, w: RewindWriter) {
        self.0.close(w);
    }

    fn replay_after(&self, cursor: &RewindCursor, buf: &mut Vec<u8>) -> usize {
        self.0
            .with_replay(cursor, |replay| {
                let mut n = 0;
                while let Ok(Some(id)) = replay.next_into(buf) {
                    black_box((id, &*buf));
                    n += 1;
                }
                n
            })
            .unwrap_or(0)
    }

    fn resume_first(&self, cursor: &RewindCursor, buf: &mut Vec<u8>) -> bool {
        self.0.resume_first(cursor, buf)
    }
}

/// Rewind with each session opened for one writer
/// ([`Engine::open_single_writer`]): appends without the claim CAS, for an
/// embedding whose output for a session comes from one task.
#[derive(Debug, Default)]
pub struct RewindSingleWriterStore(pub RewindStore);

/// The one writer of a Rewind session, on one stream.
#[derive(Debug)]
pub struct RewindSingleWriter {
    writer: SessionWriter,
    stream: u32,
}

impl AppendStore for RewindSingleWriterStore {
    type Writer = RewindSingleWriter;
    const NAME: &'static str = "RewindSingleWriter";

    fn open(&self) -> RewindSingleWriter {
        let writer = self
            .0
            .engine
            .open_single_writer(None)
            .expect("global budget is unreachable");
        let stream = writer
            .handle()
            .new_stream()
            .expect("fresh session has streams");
        RewindSingleWriter { writer, stream }
    }

    #[inline]
    fn append(&self, w: &mut RewindSingleWriter, payload: &[u8]) {
        black_box(w.writer.append(w.stream, payload).expect("append"));
    }
}
