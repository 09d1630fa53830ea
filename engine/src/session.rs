//! Sessions and the registry that finds them.
//!
//! # The registry
//!
//! Live sessions live in a fixed number of shards, each a `papaya::HashMap`
//! keyed by the 128-bit session id. papaya is a lock-free hash table: a
//! lookup is a few atomic loads under an epoch guard and never waits for a
//! writer, and resizing is incremental, so a burst of opens does not stall
//! lookups. Sharding on top spreads inserts and removals (and the eviction
//! scan) over independent tables, so a reconnect storm that opens thousands
//! of sessions does not funnel through one table's resize. There is no global
//! lock anywhere on the lookup path.
//!
//! # Bookkeeping per session
//!
//! An idle session costs its [`Session`] record (id, owner tag, epoch,
//! principal pointer, timestamps, stream counter, flags, the waiter list
//! pointer and the pointer to its boxed ring), its `Arc` header and its
//! registry entry: 174 bytes per session measured with a counting allocator
//! (`engine/tests/memory.rs`, which holds it to 256). The ring,
//! sized by configuration, comes on top.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use event_listener::{Event, EventListener};

use crate::id::{EventId, SessionId};
use crate::ring::SessionRing;

const SHARDS: usize = 16;

/// One live (or just-ended) session.
pub(crate) struct Session {
    pub(crate) id: SessionId,
    /// Keyed tag of `id`; the owner field of every event id it issues.
    pub(crate) tag: u64,
    /// This incarnation's epoch; unique within the engine.
    pub(crate) epoch: u64,
    /// The principal the session is bound to, if any.
    pub(crate) principal: Option<Box<str>>,
    /// Engine-clock milliseconds when the session was opened.
    pub(crate) opened_ms: u64,
    /// Engine-clock milliseconds of the last append, resume or touch.
    /// Monotone non-decreasing (updated with `fetch_max`).
    pub(crate) last_active_ms: AtomicU64,
    /// Next stream id to hand out; starts at 1 (stream 0 is the session's
    /// standalone stream, e.g. MCP's GET stream). Never reaches
    /// `u32::MAX`, which is reserved as "no stream".
    pub(crate) next_stream: AtomicU32,
    /// Set once when the session ends; readers then stop.
    pub(crate) ended: AtomicBool,
    /// Boxed: the ring's hot line is cache-padded (128-byte aligned), and
    /// inline it would pad every session record to that alignment.
    pub(crate) ring: Box<SessionRing>,
    /// Wakes readers waiting for the next append (and for the end).
    pub(crate) appended: Event,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("epoch", &self.epoch)
            .field("ended", &self.ended.load(Ordering::Relaxed))
            .field("high_water", &self.ring.high_water())
            .finish_non_exhaustive()
    }
}

/// Stream id no stream ever has; used to read a slot's header without
/// copying its payload.
pub(crate) const NO_STREAM: u32 = u32::MAX;

impl Session {
    pub(crate) fn new(
        id: SessionId,
        tag: u64,
        epoch: u64,
        principal: Option<&str>,
        now_ms: u64,
        ring: SessionRing,
    ) -> Session {
        Session {
            id,
            tag,
            epoch,
            principal: principal.map(Box::from),
            opened_ms: now_ms,
            last_active_ms: AtomicU64::new(now_ms),
            next_stream: AtomicU32::new(1),
            ended: AtomicBool::new(false),
            ring: Box::new(ring),
            appended: Event::new(),
        }
    }

    /// The id the event `seq` on `stream` has (or will have).
    #[inline]
    pub(crate) fn event_id(&self, stream: u32, seq: u64) -> EventId {
        EventId {
            tag: self.tag,
            epoch: self.epoch,
            stream,
            seq,
        }
    }

    #[inline]
    pub(crate) fn touch(&self, now_ms: u64) {
        // Most appends land in the same millisecond as the previous one: a
        // plain load avoids dirtying the line for them.
        if self.last_active_ms.load(Ordering::Relaxed) < now_ms {
            self.last_active_ms.fetch_max(now_ms, Ordering::Relaxed);
        }
    }

    pub(crate) fn is_ended(&self) -> bool {
        // Acquire pairs with the Release in `end`: a reader that sees the
        // flag also sees every append that happened before the end.
        self.ended.load(Ordering::Acquire)
    }

    /// Marks the session ended and wakes every waiting reader. Returns
    /// whether this call ended it.
    pub(crate) fn end(&self) -> bool {
        let first = !self.ended.swap(true, Ordering::AcqRel);
        if first {
            self.appended.notify(usize::MAX);
        }
        first
    }

    pub(crate) fn new_stream(&self) -> Option<u32> {
        self.next_stream
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                (s < NO_STREAM - 1).then_some(s + 1)
            })
            .ok()
    }

    pub(crate) fn listen(&self) -> EventListener {
        self.appended.listen()
    }

    pub(crate) fn principal_matches(&self, presented: Option<&str>) -> bool {
        match (&self.principal, presented) {
            (None, _) => true,
            (Some(bound), Some(p)) => constant_time_eq(bound.as_bytes(), p.as_bytes()),
            (Some(_), None) => false,
        }
    }
}

/// Compares without an early exit, so response timing does not reveal how
/// much of a principal matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Hashes a session key by folding its 128 bits to 64.
///
/// Session ids are minted from the OS random source, so their bits are
/// already uniform: running them through SipHash (the std default) would
/// spend a fifth of a resume decision making random bits random. Presented
/// ids that collide only lengthen their own lookup; only minted ids are
/// inserted.
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct FoldKey;

#[derive(Default, Debug)]
pub(crate) struct FoldHasher(u64);

impl std::hash::BuildHasher for FoldKey {
    type Hasher = FoldHasher;

    fn build_hasher(&self) -> FoldHasher {
        FoldHasher(0)
    }
}

impl std::hash::Hasher for FoldHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used by `u128` keys; a correct fallback all the same.
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(29) ^ u64::from_le_bytes(word);
        }
    }

    fn write_u128(&mut self, key: u128) {
        self.0 ^= (key as u64) ^ ((key >> 64) as u64);
    }
}

type Shard = papaya::HashMap<u128, Arc<Session>, FoldKey>;

/// The sharded map of live sessions.
pub(crate) struct Registry {
    shards: Box<[Shard]>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("shards", &self.shards.len())
            .finish()
    }
}

impl Registry {
    pub(crate) fn new() -> Registry {
        Registry {
            shards: (0..SHARDS)
                .map(|_| papaya::HashMap::with_hasher(FoldKey))
                .collect(),
        }
    }

    #[inline]
    fn shard(&self, key: u128) -> &Shard {
        // The id is uniformly random; its top bits pick shards evenly and
        // stay independent of the bits the shard's own table hashes on.
        &self.shards[(key >> 124) as usize % SHARDS]
    }

    #[inline]
    pub(crate) fn get(&self, id: SessionId) -> Option<Arc<Session>> {
        self.shard(id.bits()).pin().get(&id.bits()).cloned()
    }

    /// Inserts a new session. Returns false (and inserts nothing) if the id
    /// is taken — with 128 random bits, only a broken random source does that.
    pub(crate) fn insert(&self, session: Arc<Session>) -> bool {
        let key = session.id.bits();
        self.shard(key).pin().try_insert(key, session).is_ok()
    }

    /// Removes exactly this incarnation (not a newer one under the same id).
    pub(crate) fn remove(&self, session: &Arc<Session>) -> bool {
        let key = session.id.bits();
        let shard = self.shard(key).pin();
        match shard.get(&key) {
            Some(current) if Arc::ptr_eq(current, session) => shard.remove(&key).is_some(),
            _ => false,
        }
    }

    /// Visits every live session.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&Arc<Session>)) {
        for shard in self.shards.iter() {
            for (_, s) in shard.pin().iter() {
                f(s);
            }
        }
    }
}
