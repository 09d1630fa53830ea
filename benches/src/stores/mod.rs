//! The implementations the benches compare: four baselines, Rewind, and the
//! physical floor.

mod broadcast;
mod floor;
mod go_style;
mod rewind;
mod scan_sort;
mod shared_mutex;

pub use broadcast::{BroadcastPerSession, BroadcastWriter};
pub use floor::{FloorStore, FloorWriter};
pub use go_style::{GoCursor, GoStyleStore, GoWriter, GO_DEFAULT_MAX_BYTES};
pub use rewind::{
    RewindCursor, RewindPerEventStore, RewindSingleWriter, RewindSingleWriterStore, RewindStore,
    RewindWriter,
};
pub use scan_sort::{ScanSortCursor, ScanSortStore};
pub use shared_mutex::{SharedMutexCursor, SharedMutexStore};

use std::sync::atomic::{AtomicU64, Ordering};

/// A session id as the SDK example stores key them: a random 32-digit hex
/// string (Python's `uuid4().hex`, a TypeScript `randomUUID()`), hashed with
/// the standard library's default (SipHash) hasher.
pub type SessionKey = String;

/// Events each baseline keeps per session: the 64 a replay returns plus the
/// cursor's own event, which the SDK stores need to find their position.
/// (Rewind's ring holds 64; it positions by sequence number, so the cursor's
/// event itself may already be gone.)
pub const BASELINE_EVENTS_PER_SESSION: usize = 65;

/// A fresh random-looking session key (SplitMix64 over a process-wide
/// counter: unique, cheap, and no dependency on a random crate).
pub fn new_session_key() -> SessionKey {
    static NEXT: AtomicU64 = AtomicU64::new(0x5eed);
    let n = NEXT.fetch_add(2, Ordering::Relaxed);
    format!("{:016x}{:016x}", splitmix(n), splitmix(n + 1))
}

/// SplitMix64: a fixed bijection that scatters consecutive inputs.
pub(crate) fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
