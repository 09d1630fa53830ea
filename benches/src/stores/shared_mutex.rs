//! One `Mutex<HashMap<SessionKey, VecDeque<_>>>` shared by every session.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Mutex;

use bytes::Bytes;

use super::{new_session_key, SessionKey, BASELINE_EVENTS_PER_SESSION};
use crate::{deliver, AppendStore, ReplayStore};

/// The Python and TypeScript SDK example stores, in Rust: one map of
/// per-session deques behind one lock, bounded per session (Python's
/// `deque(maxlen=…)`).
///
/// Replay finds the cursor by scanning the session's deque for its id (as
/// the Python example does), clones the `Bytes` handles after it under the
/// lock and copies the payloads after releasing it. In its favour: event ids
/// are `u64`s (the originals compare uuid strings), payloads are copied into
/// `Bytes` before the lock is taken, and the cursor arrives pre-parsed.
pub struct SharedMutexStore {
    inner: Mutex<Inner>,
    per_session: usize,
}

struct Inner {
    next_id: u64,
    sessions: HashMap<SessionKey, VecDeque<(u64, Bytes)>>,
}

/// A cursor into a [`SharedMutexStore`]: the session and an event id.
#[derive(Debug, Clone)]
pub struct SharedMutexCursor {
    session: SessionKey,
    event: u64,
}

impl fmt::Debug for SharedMutexStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedMutexStore")
            .field("per_session", &self.per_session)
            .finish_non_exhaustive()
    }
}

impl Default for SharedMutexStore {
    fn default() -> Self {
        SharedMutexStore::new(BASELINE_EVENTS_PER_SESSION)
    }
}

impl SharedMutexStore {
    /// A store keeping the newest `per_session` events of each session.
    pub fn new(per_session: usize) -> SharedMutexStore {
        SharedMutexStore {
            inner: Mutex::new(Inner {
                next_id: 1,
                sessions: HashMap::new(),
            }),
            per_session,
        }
    }

    fn push(&self, session: &SessionKey, payload: &[u8]) -> u64 {
        let event = Bytes::copy_from_slice(payload);
        let mut inner = self.inner.lock().expect("store lock poisoned");
        let id = inner.next_id;
        inner.next_id += 1;
        let deque = match inner.sessions.get_mut(session) {
            Some(d) => d,
            None => inner.sessions.entry(session.clone()).or_default(),
        };
        deque.push_back((id, event));
        if deque.len() > self.per_session {
            deque.pop_front();
        }
        id
    }
}

impl AppendStore for SharedMutexStore {
    type Writer = SessionKey;
    const NAME: &'static str = "SharedMutex";

    fn open(&self) -> SessionKey {
        let key = new_session_key();
        self.inner
            .lock()
            .expect("store lock poisoned")
            .sessions
            .insert(key.clone(), VecDeque::new());
        key
    }

    fn append(&self, writer: &mut SessionKey, payload: &[u8]) {
        self.push(writer, payload);
    }
}

impl ReplayStore for SharedMutexStore {
    type Cursor = SharedMutexCursor;

    fn append_for_cursor(&self, writer: &mut SessionKey, payload: &[u8]) -> SharedMutexCursor {
        SharedMutexCursor {
            session: writer.clone(),
            event: self.push(writer, payload),
        }
    }

    fn close(&self, writer: SessionKey) {
        self.inner
            .lock()
            .expect("store lock poisoned")
            .sessions
            .remove(&writer);
    }

    fn replay_after(&self, cursor: &SharedMutexCursor, buf: &mut Vec<u8>) -> usize {
        let after: Vec<Bytes> = {
            let inner = self.inner.lock().expect("store lock poisoned");
            let Some(deque) = inner.sessions.get(&cursor.session) else {
                return 0;
            };
            match deque.iter().position(|(id, _)| *id == cursor.event) {
                Some(at) => deque.iter().skip(at + 1).map(|(_, b)| b.clone()).collect(),
                None => return 0,
            }
        };
        for event in &after {
            deliver(buf, event);
        }
        after.len()
    }

    fn resume_first(&self, cursor: &SharedMutexCursor, buf: &mut Vec<u8>) -> bool {
        let first = {
            let inner = self.inner.lock().expect("store lock poisoned");
            let Some(deque) = inner.sessions.get(&cursor.session) else {
                return false;
            };
            let Some(at) = deque.iter().position(|(id, _)| *id == cursor.event) else {
                return false;
            };
            deque.get(at + 1).map(|(_, b)| b.clone())
        };
        first.map(|b| deliver(buf, &b)).is_some()
    }
}
