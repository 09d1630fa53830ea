//! Baselines and shared bodies for the criterion benchmarks.
//!
//! Every implementation — Rewind and the stores people use today — sits
//! behind the same two traits, [`AppendStore`] and [`ReplayStore`], and one
//! bench body in [`bodies`] drives them all, so a group compares like with
//! like in the same process (absolute times on shared 2-core machines are
//! noise; ratios within one run are the result).
//!
//! The baselines ([`stores`]) are small, faithful re-creations:
//!
//! | store | re-creates |
//! |---|---|
//! | [`SharedMutexStore`] | the Python/TypeScript SDK example stores: one `Mutex<HashMap<SessionKey, VecDeque<_>>>` for every session, bounded per session |
//! | [`ScanSortStore`] | the TypeScript SDK example `InMemoryEventStore`: one global event list, scanned, filtered and sorted on every replay |
//! | [`GoStyleStore`] | the Go SDK's `MemoryEventStore`: one global mutex, per-stream chunk lists, a global byte budget |
//! | [`BroadcastPerSession`] | a `tokio::sync::broadcast` channel per session |
//! | [`RewindStore`] | the engine itself, through its public API only |
//! | [`FloorStore`] | the physical floor of an append: `memcpy` + one release store |
//!
//! Where a re-creation departs from its original, it departs in the
//! baseline's favour (pre-parsed cursors, filter before sort, …); each store's
//! docs say how.

pub mod alloc;
pub mod bodies;
pub mod scale;
pub mod stores;

pub use stores::{
    BroadcastPerSession, FloorStore, GoStyleStore, RewindPerEventStore, RewindSingleWriterStore,
    RewindStore, ScanSortStore, SessionKey, SharedMutexStore,
};

/// Something events can be appended to, one session per writer.
pub trait AppendStore: Send + Sync {
    /// A writer's handle on one session (a key for the baselines, a
    /// `SessionHandle` for Rewind). Cloning it (where possible) gives a
    /// second writer on the *same* session.
    type Writer: Send;

    /// The name used in bench ids.
    const NAME: &'static str;

    /// Opens a new session and returns a writer for it.
    fn open(&self) -> Self::Writer;

    /// Appends one event with `payload` to the writer's session.
    fn append(&self, writer: &mut Self::Writer, payload: &[u8]);
}

/// A store that can also replay after a cursor and decide a resume.
pub trait ReplayStore: AppendStore {
    /// What a reconnecting client presents, in the form this store wants it
    /// (Rewind gets the raw header strings; baselines get pre-parsed keys,
    /// which favours them).
    type Cursor: Send + Sync;

    /// Appends one event and returns the cursor naming it (setup only).
    fn append_for_cursor(&self, writer: &mut Self::Writer, payload: &[u8]) -> Self::Cursor;

    /// Ends the writer's session and frees what it held.
    fn close(&self, writer: Self::Writer);

    /// Replays every event after `cursor` on the cursor's stream. Each
    /// payload is copied into `buf` (cleared first) and passed through
    /// [`std::hint::black_box`], as an SSE writer would copy it into its
    /// output. Returns how many events were delivered.
    fn replay_after(&self, cursor: &Self::Cursor, buf: &mut Vec<u8>) -> usize;

    /// The resume decision: look the session up, find the cursor's position,
    /// and deliver the first event after it into `buf`. Returns whether an
    /// event was delivered.
    fn resume_first(&self, cursor: &Self::Cursor, buf: &mut Vec<u8>) -> bool;

    /// Restores what a replay consumed, outside the timed region. Only
    /// stores whose replay is destructive (broadcast) need it.
    fn rearm(&self, cursor: &Self::Cursor, payload: &[u8]) {
        let _ = (cursor, payload);
    }

    /// Whether [`ReplayStore::rearm`] does anything; if not, the bench
    /// times whole batches instead of single replays.
    fn needs_rearm(&self) -> bool {
        false
    }
}

/// Copies `payload` into `buf` as one delivered event.
#[inline]
pub fn deliver(buf: &mut Vec<u8>, payload: &[u8]) {
    buf.clear();
    buf.extend_from_slice(payload);
    std::hint::black_box(&*buf);
}

/// A JSON-RPC-looking payload of exactly `len` bytes (a progress
/// notification, padded), so every store copies the same bytes.
pub fn payload(len: usize) -> Vec<u8> {
    let head =
        br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":7,"progress":42,"message":""#;
    let mut p: Vec<u8> = head.iter().copied().take(len).collect();
    while p.len() + 3 < len {
        p.push(b'x');
    }
    p.extend_from_slice(&br#""}}"#[..len.saturating_sub(p.len()).min(3)]);
    p.resize(len, b' ');
    p
}
