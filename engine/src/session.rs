//! Sessions and the registry that finds them.
//!
//! # The registry
//!
//! Live sessions live in shards, each a `papaya::HashMap` keyed by the
//! 128-bit session id: one shard per core, rounded up to a power of two and
//! at most 16 (each papaya table carries its own epoch-reclamation state,
//! 16 KiB of thread-local tables, so a two-core server does not pay for
//! sixteen). papaya is a lock-free hash table: a
//! lookup is a few atomic loads under an epoch guard and never waits for a
//! writer, and resizing is incremental, so a burst of opens does not stall
//! lookups. Sharding on top spreads inserts and removals (and the eviction
//! scan) over independent tables, so a reconnect storm that opens thousands
//! of sessions does not funnel through one table's resize. There is no global
//! lock anywhere on the lookup path. The registry is the one source of truth
//! for liveness: an embedding keeps its own per-session state as an
//! [`Attachment`](crate::Attachment) and hears about every end.
//!
//! # Bookkeeping per session
//!
//! An idle session costs its [`Session`] record (id, owner tag, epoch,
//! the formatted prefix of its event ids (40 bytes, so a resume checks a
//! cursor's owner and epoch by comparing bytes instead of parsing them),
//! principal pointer, timestamps, its [`Window`] — two packed segment
//! references and a unit count —, counters, the waiter list pointer and the
//! attachment), its `Arc` header and its registry entry. A session with no
//! events holds no pool memory at all; `benches/tests/memory.rs` measures
//! the total with a counting allocator.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use event_listener::{Event, EventListener};

use crate::id::{EventId, EventIdError, IdPrefix, SessionId};
use crate::storage::{Owner, Pool, Window};

/// Shards at most (see the module docs).
const MAX_SHARDS: usize = 16;

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EndReason {
    /// Closed by the embedding ([`Engine::close`](crate::Engine::close),
    /// [`SessionHandle::close`](crate::SessionHandle::close), re-opened).
    Closed,
    /// Idle for longer than the TTL.
    Expired,
    /// Ended to make room in the pool (it had no open reader and no call
    /// in flight).
    Evicted,
}

impl EndReason {
    /// A short stable name, for logs and metric labels.
    pub const fn name(self) -> &'static str {
        match self {
            EndReason::Closed => "closed",
            EndReason::Expired => "expired",
            EndReason::Evicted => "evicted",
        }
    }
}

/// Per-session state an embedding keeps with an engine session (the server
/// keeps its MCP session here). The engine holds it weakly and calls
/// [`Attachment::ended`] once when the session ends, whoever ended it.
pub trait Attachment: std::any::Any + Send + Sync {
    /// The session has ended; no append will succeed any more.
    fn ended(&self, why: EndReason);
}

/// One live (or just-ended) session.
///
/// `repr(C)` so the fields a resume and an append read come first, next
/// to each other and to the `Arc`'s count (about two cache lines), and the
/// rest after them: when resumes are spread over many sessions, each one
/// misses the cache on every line of the session it touches.
#[repr(C)]
pub(crate) struct Session {
    /// The retained events.
    pub(crate) window: Window,
    /// Keyed tag of `id`; the owner field of every event id it issues.
    pub(crate) tag: u64,
    /// This incarnation's epoch; unique within the engine.
    pub(crate) epoch: u64,
    /// Engine-clock milliseconds of the last append, resume or touch.
    /// Monotone non-decreasing (updated with `fetch_max`).
    pub(crate) last_active_ms: AtomicU64,
    /// The principal the session is bound to, if any.
    pub(crate) principal: Option<Box<str>>,
    /// Set when the session was restored from a data directory at start
    /// (a pointer, so sessions opened in this process pay 8 bytes for it).
    pub(crate) restored: Option<Box<Restored>>,
    /// Open readers plus calls in flight: a session with any is never
    /// evicted.
    pub(crate) busy: AtomicU32,
    /// Readers parked (or about to park) on `appended`; appends notify only
    /// when it is non-zero. See [`Session::listen`].
    pub(crate) waiters: AtomicU32,
    /// The engine's node number ([`Config::node`](crate::Config::node)),
    /// written into every id the session mints.
    pub(crate) node: u16,
    /// Set once when the session ends; readers then stop.
    pub(crate) ended: AtomicBool,
    /// How every event id this incarnation mints begins (tag, node,
    /// epoch), so a resume recognises its own cursors without parsing
    /// those fields.
    pub(crate) id_prefix: IdPrefix,
    pub(crate) id: SessionId,
    /// Engine-clock milliseconds when the session was opened.
    pub(crate) opened_ms: u64,
    /// Wakes readers waiting for the next append (and for the end).
    pub(crate) appended: Event,
    /// The embedding's state, held weakly (no cycle through the handle it
    /// keeps).
    attachment: OnceLock<Weak<dyn Attachment>>,
    /// Next stream id to hand out; starts at 1 (stream 0 is the session's
    /// standalone stream, e.g. MCP's GET stream). Never reaches
    /// `u32::MAX`, which is reserved as "no stream".
    pub(crate) next_stream: AtomicU32,
}

/// What a session restored from disk brings with it.
#[derive(Debug)]
pub(crate) struct Restored {
    /// What the embedding stored with the session before the restart
    /// ([`SessionHandle::store_init`](crate::SessionHandle::store_init)).
    pub(crate) init: Option<Box<[u8]>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("epoch", &self.epoch)
            .field("ended", &self.ended.load(Ordering::Relaxed))
            .field("held_units", &self.window.held_units())
            .finish_non_exhaustive()
    }
}

/// Stream id no stream ever has.
pub(crate) const NO_STREAM: u32 = u32::MAX;

impl Session {
    pub(crate) fn new(
        id: SessionId,
        tag: u64,
        epoch: u64,
        node: u16,
        principal: Option<&str>,
        now_ms: u64,
    ) -> Session {
        Session {
            id,
            tag,
            epoch,
            node,
            id_prefix: IdPrefix::new(tag, node, epoch),
            principal: principal.map(Box::from),
            opened_ms: now_ms,
            last_active_ms: AtomicU64::new(now_ms),
            window: Window::new(),
            next_stream: AtomicU32::new(1),
            waiters: AtomicU32::new(0),
            busy: AtomicU32::new(0),
            ended: AtomicBool::new(false),
            appended: Event::new(),
            attachment: OnceLock::new(),
            restored: None,
        }
    }

    /// A session incarnation recovered from a data directory: its id, tag,
    /// epoch and principal as journaled, its recovered window, stream ids
    /// from `next_stream` on.
    #[allow(
        clippy::too_many_arguments,
        reason = "every field of a journaled session, once at start"
    )]
    pub(crate) fn restored(
        id: SessionId,
        tag: u64,
        epoch: u64,
        node: u16,
        principal: Option<Box<str>>,
        now_ms: u64,
        window: Window,
        next_stream: u32,
        init: Option<Box<[u8]>>,
    ) -> Session {
        Session {
            principal,
            window,
            next_stream: AtomicU32::new(next_stream.clamp(1, NO_STREAM - 1)),
            restored: Some(Box::new(Restored { init })),
            ..Session::new(id, tag, epoch, node, None, now_ms)
        }
    }

    /// What the session's segments are stamped with.
    #[inline]
    pub(crate) fn owner(&self) -> Owner {
        Owner {
            tag: self.tag,
            epoch: self.epoch,
        }
    }

    /// The id the event `seq` on `stream` has (or will have).
    #[inline]
    pub(crate) fn event_id(&self, stream: u32, seq: u64) -> EventId {
        EventId {
            tag: self.tag,
            node: self.node,
            epoch: self.epoch,
            stream,
            seq,
        }
    }

    /// Parses a presented cursor: through the session's own prefix when
    /// it is one of this incarnation's ids, otherwise in full (same answer
    /// either way).
    #[inline(always)]
    pub(crate) fn parse_cursor(&self, raw: &str) -> Result<EventId, EventIdError> {
        match self.id_prefix.parse(raw) {
            Some((stream, seq)) => Ok(self.event_id(stream, seq)),
            None => EventId::parse_outlined(raw),
        }
    }

    #[inline]
    pub(crate) fn touch(&self, now_ms: u64) {
        // Most appends land in the same tick as the previous one: a plain
        // load avoids dirtying the line for them.
        if self.last_active_ms.load(Ordering::Relaxed) < now_ms {
            self.last_active_ms.fetch_max(now_ms, Ordering::Relaxed);
        }
    }

    pub(crate) fn is_ended(&self) -> bool {
        // Acquire pairs with the Release in `end`.
        self.ended.load(Ordering::Acquire)
    }

    /// Marks the session ended and wakes every waiting reader. Returns
    /// whether this call ended it. The caller closes the window.
    pub(crate) fn end(&self) -> bool {
        let first = !self.ended.swap(true, Ordering::AcqRel);
        if first {
            self.appended.notify(usize::MAX);
        }
        first
    }

    /// Tells the attachment, if any is still alive, that the session ended.
    pub(crate) fn tell_ended(&self, why: EndReason) {
        if let Some(a) = self.attachment.get().and_then(Weak::upgrade) {
            a.ended(why);
        }
    }

    /// Sets the attachment; `false` if one was set already.
    pub(crate) fn attach(&self, a: Weak<dyn Attachment>) -> bool {
        self.attachment.set(a).is_ok()
    }

    /// The attachment, if set and still alive.
    pub(crate) fn attachment(&self) -> Option<Arc<dyn Attachment>> {
        self.attachment.get().and_then(Weak::upgrade)
    }

    pub(crate) fn new_stream(&self) -> Option<u32> {
        self.next_stream
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                (s < NO_STREAM - 1).then_some(s + 1)
            })
            .ok()
    }

    /// Registers a waiter for the next append.
    ///
    /// The wake-up protocol (loom models `loom_wake_ups_are_never_lost`,
    /// `loom_a_shared_append_wakes_a_reader_that_announced_itself`): the
    /// reader registers its listener, announces itself with an `AcqRel`
    /// RMW on `waiters`, then with an RMW that changes nothing on the word
    /// the window's next shared claim is CASed on (`Window::announce`),
    /// and only then reads again; it parks only if that read found nothing
    /// claimed that it has not read (a frame claimed but not yet published
    /// it waits for instead: [`Replay`](crate::Replay) does).
    ///
    /// A single writer, which claims nothing, publishes (the state word's
    /// `Release` store), then does an `AcqRel` RMW of `waiters` that leaves
    /// it unchanged, and notifies only if it read non-zero. Both RMWs act
    /// on one word, so one precedes the other in its modification order:
    /// if the reader's comes first, the writer reads it and synchronises
    /// with it, so its notify sees the registered listener; if the
    /// writer's comes first, the reader's RMW reads it and synchronises
    /// with it, so the re-check sees the published event.
    ///
    /// A shared appender pays no locked instruction for the check: its
    /// claim CAS (`Acquire`) is already one, on the word the reader
    /// announced on. If the reader's RMW precedes the claim there, the
    /// claim synchronises with it and a plain load of `waiters` after the
    /// append sees the reader; if the claim precedes it, the reader's
    /// re-check (after its RMW) sees the frame claimed and does not park.
    /// On an Intel Xeon the locked RMW of `waiters` was 4 ns of a 26 ns
    /// shared append (BENCHMARKS.md, run AT); readers pay one or two
    /// locked instructions more per park instead.
    pub(crate) fn listen(self: &Arc<Self>, pool: &Pool) -> Waiter {
        let listener = self.appended.listen();
        self.waiters.fetch_add(1, Ordering::AcqRel);
        // If the head kept moving under the announcement, the waiter is
        // ready at once: the reader reads again rather than park unseen.
        let announced = self.window.announce(pool);
        Waiter {
            listener: announced.then_some(listener),
            session: self.clone(),
        }
    }

    /// After a single writer's append: wakes parked readers, if there are
    /// any.
    #[inline]
    pub(crate) fn wake(&self) {
        // Pairs with the RMW in `listen` (see there). An RMW, not a load:
        // only an RMW is guaranteed to read the latest announcement.
        if self.waiters.fetch_add(0, Ordering::AcqRel) > 0 {
            self.appended.notify(usize::MAX);
        }
    }

    /// After a shared append, whose claim CAS came before this in program
    /// order: wakes parked readers, if there are any. A plain load: the
    /// claim synchronised with every reader that announced itself before
    /// it (see `listen`).
    #[inline]
    pub(crate) fn wake_after_claim(&self) {
        if self.waiters.load(Ordering::Relaxed) > 0 {
            self.appended.notify(usize::MAX);
        }
    }

    pub(crate) fn principal_matches(&self, presented: Option<&str>) -> bool {
        match (&self.principal, presented) {
            (None, _) => true,
            (Some(bound), Some(p)) => constant_time_eq(bound.as_bytes(), p.as_bytes()),
            (Some(_), None) => false,
        }
    }
}

/// A reader's registration for the next append of its session (or its
/// end). Await it, or block on it with [`Waiter::wait_deadline`]; dropping
/// it unregisters.
pub struct Waiter {
    listener: Option<EventListener>,
    session: Arc<Session>,
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter").finish_non_exhaustive()
    }
}

impl Waiter {
    /// Blocks the thread until notified or `deadline`; returns whether it
    /// was notified.
    pub fn wait_deadline(mut self, deadline: std::time::Instant) -> bool {
        use event_listener::Listener;
        self.listener
            .take()
            .is_some_and(|l| l.wait_deadline(deadline).is_some())
    }
}

impl std::future::Future for Waiter {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        match self.listener.as_mut() {
            Some(l) => std::pin::Pin::new(l).poll(cx),
            None => std::task::Poll::Ready(()),
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.session.waiters.fetch_sub(1, Ordering::Relaxed);
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

/// One shard per core, rounded up to a power of two, at most
/// [`MAX_SHARDS`].
fn shard_count() -> usize {
    std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .next_power_of_two()
        .min(MAX_SHARDS)
}

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
            shards: (0..shard_count())
                .map(|_| papaya::HashMap::with_hasher(FoldKey))
                .collect(),
        }
    }

    #[inline]
    fn shard(&self, key: u128) -> &Shard {
        // The id is uniformly random; its top bits pick shards evenly and
        // stay independent of the bits the shard's own table hashes on.
        // The count is a power of two, at most 16.
        &self.shards[(key >> 124) as usize & (self.shards.len() - 1)]
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{shard_count, MAX_SHARDS};

    #[test]
    fn the_shard_count_is_a_power_of_two_from_one_to_the_maximum() {
        let n = shard_count();
        assert!(n.is_power_of_two() && n <= MAX_SHARDS, "{n}");
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        assert!(n >= cores.min(MAX_SHARDS), "{n} shards for {cores} cores");
    }
}
