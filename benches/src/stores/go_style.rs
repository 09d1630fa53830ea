//! One global mutex over per-stream chunk lists with a global byte budget.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Mutex;

use bytes::Bytes;

use super::{new_session_key, SessionKey};
use crate::{deliver, AppendStore, ReplayStore};

/// The Go SDK's `MemoryEventStore`, in Rust: `session → stream → dataList`
/// behind one `sync.Mutex`; a stream index names an event; `Append` purges
/// before adding while the store is over its byte budget — one pass removes
/// the oldest item of *every* stream of every session — and `After` clones
/// the item list under the lock and yields outside it.
///
/// In its favour: cursors arrive pre-parsed (`(session, stream, index)`), and
/// the benches size the budget so the O(all streams) purge never runs while
/// replays are measured (the append group runs with the Go default, 10 MiB,
/// where it does run, over two streams).
pub struct GoStyleStore {
    inner: Mutex<GoInner>,
}

#[derive(Default)]
struct GoInner {
    max_bytes: usize,
    n_bytes: usize,
    store: HashMap<SessionKey, HashMap<String, DataList>>,
}

/// The Go `dataList`: items of one stream, `first` = index of `data[0]`.
#[derive(Default)]
struct DataList {
    size: usize,
    first: usize,
    data: VecDeque<Bytes>,
}

/// A writer on a [`GoStyleStore`]: the session and stream ids.
#[derive(Debug, Clone)]
pub struct GoWriter {
    session: SessionKey,
    stream: String,
}

/// A cursor into a [`GoStyleStore`]: session, stream and stream index.
#[derive(Debug, Clone)]
pub struct GoCursor {
    session: SessionKey,
    stream: String,
    index: usize,
}

/// The Go SDK's default budget.
pub const GO_DEFAULT_MAX_BYTES: usize = 10 << 20;

impl fmt::Debug for GoStyleStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GoStyleStore").finish_non_exhaustive()
    }
}

impl Default for GoStyleStore {
    fn default() -> Self {
        GoStyleStore::new(GO_DEFAULT_MAX_BYTES)
    }
}

impl GoStyleStore {
    /// A store that purges above `max_bytes` of payload.
    pub fn new(max_bytes: usize) -> GoStyleStore {
        GoStyleStore {
            inner: Mutex::new(GoInner {
                max_bytes,
                ..GoInner::default()
            }),
        }
    }

    fn push(&self, w: &GoWriter, payload: &[u8]) -> usize {
        // Go's caller hands over a freshly marshalled []byte; this is that.
        let data = Bytes::copy_from_slice(payload);
        let mut guard = self.inner.lock().expect("store lock poisoned");
        let inner = &mut *guard;
        inner.init(w);
        inner.purge();
        let dl = inner
            .store
            .get_mut(&w.session)
            .and_then(|s| s.get_mut(&w.stream))
            .expect("initialised above");
        dl.size += data.len();
        dl.data.push_back(data);
        inner.n_bytes += payload.len();
        dl.first + dl.data.len() - 1
    }
}

impl GoInner {
    fn init(&mut self, w: &GoWriter) {
        if !self.store.contains_key(&w.session) {
            self.store.insert(w.session.clone(), HashMap::new());
        }
        let streams = self.store.get_mut(&w.session).expect("inserted above");
        if !streams.contains_key(&w.stream) {
            streams.insert(w.stream.clone(), DataList::default());
        }
    }

    /// Removes the first item of every stream until under budget.
    fn purge(&mut self) {
        while self.n_bytes > self.max_bytes {
            let mut changed = false;
            for streams in self.store.values_mut() {
                for dl in streams.values_mut() {
                    if let Some(d) = dl.data.pop_front() {
                        dl.size -= d.len();
                        dl.first += 1;
                        self.n_bytes -= d.len();
                        changed = true;
                    }
                }
            }
            assert!(changed, "no progress during purge");
        }
    }
}

impl AppendStore for GoStyleStore {
    type Writer = GoWriter;
    const NAME: &'static str = "GoStyle";

    fn open(&self) -> GoWriter {
        let w = GoWriter {
            session: new_session_key(),
            stream: "0".to_owned(),
        };
        self.inner.lock().expect("store lock poisoned").init(&w);
        w
    }

    fn append(&self, writer: &mut GoWriter, payload: &[u8]) {
        self.push(writer, payload);
    }
}

impl ReplayStore for GoStyleStore {
    type Cursor = GoCursor;

    fn append_for_cursor(&self, writer: &mut GoWriter, payload: &[u8]) -> GoCursor {
        let index = self.push(writer, payload);
        GoCursor {
            session: writer.session.clone(),
            stream: writer.stream.clone(),
            index,
        }
    }

    fn close(&self, writer: GoWriter) {
        let mut inner = self.inner.lock().expect("store lock poisoned");
        if let Some(streams) = inner.store.remove(&writer.session) {
            inner.n_bytes -= streams.values().map(|dl| dl.size).sum::<usize>();
        }
    }

    fn replay_after(&self, cursor: &GoCursor, buf: &mut Vec<u8>) -> usize {
        let items: Vec<Bytes> = {
            let inner = self.inner.lock().expect("store lock poisoned");
            let Some(dl) = inner
                .store
                .get(&cursor.session)
                .and_then(|s| s.get(&cursor.stream))
            else {
                return 0;
            };
            let start = cursor.index + 1;
            if dl.first > start {
                return 0; // ErrEventsPurged
            }
            dl.data.iter().skip(start - dl.first).cloned().collect()
        };
        for d in &items {
            deliver(buf, d);
        }
        items.len()
    }

    fn resume_first(&self, cursor: &GoCursor, buf: &mut Vec<u8>) -> bool {
        // `After` clones the whole tail before yielding its first item.
        let items: Vec<Bytes> = {
            let inner = self.inner.lock().expect("store lock poisoned");
            let Some(dl) = inner
                .store
                .get(&cursor.session)
                .and_then(|s| s.get(&cursor.stream))
            else {
                return false;
            };
            let start = cursor.index + 1;
            if dl.first > start {
                return false;
            }
            dl.data.iter().skip(start - dl.first).cloned().collect()
        };
        items.first().map(|d| deliver(buf, d)).is_some()
    }
}
