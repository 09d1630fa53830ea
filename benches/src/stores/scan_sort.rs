//! One global event list, scanned, filtered and sorted on every replay.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::new_session_key;
use crate::{deliver, AppendStore, ReplayStore};

/// The TypeScript SDK example `InMemoryEventStore`, in Rust: every event of
/// every session in one list (a `Map` there), never evicted; an event id is
/// `${streamId}_${Date.now()}_${random}`; `replayEventsAfter` walks the
/// whole list, keeps the cursor's stream, sorts by id and sends what follows
/// the cursor.
///
/// In its favour: it filters *before* sorting (the original sorts every
/// event of every session, then filters); the stream id is compared as a
/// `u128` instead of a string; and the random part of the id is replaced by
/// a counter, so events of one millisecond keep their order (the original
/// may reorder or skip them — a correctness bug, not a cost).
pub struct ScanSortStore {
    events: Mutex<Vec<ScanSortEvent>>,
    tiebreak: AtomicU64,
}

struct ScanSortEvent {
    stream: u128,
    id: (u64, u64),
    payload: Bytes,
}

/// A cursor into a [`ScanSortStore`]: the event id, which names its stream.
#[derive(Debug, Clone, Copy)]
pub struct ScanSortCursor {
    stream: u128,
    id: (u64, u64),
}

impl fmt::Debug for ScanSortStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScanSortStore").finish_non_exhaustive()
    }
}

impl Default for ScanSortStore {
    fn default() -> Self {
        ScanSortStore {
            events: Mutex::new(Vec::new()),
            tiebreak: AtomicU64::new(0),
        }
    }
}

impl ScanSortStore {
    fn push(&self, stream: u128, payload: &[u8]) -> (u64, u64) {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let id = (now_ms, self.tiebreak.fetch_add(1, Ordering::Relaxed));
        let payload = Bytes::copy_from_slice(payload);
        self.events
            .lock()
            .expect("store lock poisoned")
            .push(ScanSortEvent {
                stream,
                id,
                payload,
            });
        id
    }

    /// The cursor's stream, sorted by id: the whole list is scanned.
    fn sorted_stream(&self, stream: u128) -> Vec<((u64, u64), Bytes)> {
        let mut mine: Vec<((u64, u64), Bytes)> = {
            let events = self.events.lock().expect("store lock poisoned");
            events
                .iter()
                .filter(|e| e.stream == stream)
                .map(|e| (e.id, e.payload.clone()))
                .collect()
        };
        mine.sort_by_key(|e| e.0);
        mine
    }
}

impl AppendStore for ScanSortStore {
    type Writer = u128;
    const NAME: &'static str = "ScanSort";

    fn open(&self) -> u128 {
        u128::from_str_radix(&new_session_key(), 16).expect("hex key")
    }

    fn append(&self, writer: &mut u128, payload: &[u8]) {
        self.push(*writer, payload);
    }
}

impl ReplayStore for ScanSortStore {
    type Cursor = ScanSortCursor;

    fn append_for_cursor(&self, writer: &mut u128, payload: &[u8]) -> ScanSortCursor {
        ScanSortCursor {
            stream: *writer,
            id: self.push(*writer, payload),
        }
    }

    fn close(&self, writer: u128) {
        // The original never removes anything; a closed session's events
        // stay in the list (and in every later scan).
        let _ = writer;
    }

    fn replay_after(&self, cursor: &ScanSortCursor, buf: &mut Vec<u8>) -> usize {
        let mine = self.sorted_stream(cursor.stream);
        let Some(at) = mine.iter().position(|(id, _)| *id == cursor.id) else {
            return 0;
        };
        for (_, payload) in &mine[at + 1..] {
            deliver(buf, payload);
        }
        mine.len() - at - 1
    }

    fn resume_first(&self, cursor: &ScanSortCursor, buf: &mut Vec<u8>) -> bool {
        let mine = self.sorted_stream(cursor.stream);
        let Some(at) = mine.iter().position(|(id, _)| *id == cursor.id) else {
            return false;
        };
        mine.get(at + 1).map(|(_, p)| deliver(buf, p)).is_some()
    }
}
