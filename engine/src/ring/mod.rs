//! Per-session replay ring: a bounded, lossy, multi-producer log of a
//! session's recent events that any number of readers replay without locks.
//!
//! Every session owns one [`SessionRing`]. Producers [`append`] events (any
//! thread, concurrently); a resumed or fresh stream is one read loop that
//! [`read`]s sequence numbers from its cursor onward and waits when it meets
//! [`SlotRead::Pending`] (invariant 7 in `docs/invariants.md`). Old events are silently
//! overwritten; a reader that asks for one gets [`SlotRead::Overwritten`],
//! never torn or stale bytes (invariant 4). Appends and reads take no lock;
//! readers never block or slow down writers (invariant 5).
//!
//! # Algorithm
//!
//! Sequence numbers are claimed as in the LMAX Disruptor's multi-producer
//! sequencer: `head.fetch_add(1) + 1`, so they are unique and dense. Event
//! `seq` lives in slot `seq & (slots - 1)`; its payload lives in a byte arena
//! at a *logical* offset claimed with `arena_claim.fetch_add(len rounded up to
//! a word)` and stored at word `(offset / 8 + k) % arena_words`, wrapping.
//! Slots and arena sit in one allocation of `AtomicU64` words addressed by
//! index, never by pointer, so the layout can move to a memory-mapped file.
//!
//! Each slot is a seqlock (Lamport; made data-race-free as in H.-J. Boehm,
//! "Can seqlocks get along with programming language memory models?", 2012):
//! a stamp word, then a `Pod` header (`SlotHeader`). Stamps:
//! `0` = empty, `2 * seq` = being written by the writer of `seq`,
//! `2 * seq + 1` = `seq` published. Stamps of a slot only grow.
//!
//! Writer of `seq`:
//! 1. claim `seq` and the arena bytes;
//! 2. take the slot: CAS its stamp from any value below `2 * seq` that is not
//!    "being written" to `2 * seq`. An older writer still writing means the
//!    ring lapped it mid-append: wait for it. A stamp already above
//!    `2 * seq + 1` means our event was lapped before being written: it is
//!    lost (readers see `Overwritten`) and `append` still returns `Ok(seq)`;
//! 3. `fence(Release)`;
//! 4. register in the arena chunks the payload touches (below); if a newer
//!    lap owns one, or the arena has already lapped our bytes, publish the
//!    slot with the `LOST_LEN` sentinel and stop;
//! 5. store header and payload words with `Relaxed` atomic stores, leave the
//!    chunks, publish with `stamp.store(2 * seq + 1, Release)`.
//!
//! Reader of `seq` (never waits, never writes):
//! `s1 = stamp.load(Acquire)` (`<= 2 * seq`: `Pending`; `> 2 * seq + 1`:
//! `Overwritten`); load the header words; `fence(Acquire)`; the stamp must
//! still be `s1`, which makes the header consistent. Then, if the stream
//! matches, load the payload words; `fence(Acquire)`; the stamp must still be
//! `s1` and `arena_claim <= header.offset + arena_bytes`, so no later
//! claim can have reached our bytes.
//!
//! ## Arena chunks (a change to the first protocol sketch)
//!
//! The stamp and claim checks only catch *newer* writers. With variable-size
//! payloads an *older* writer can also hit a newer event's bytes: a writer
//! that claimed bytes and was then descheduled while more than an arena's
//! worth of bytes was appended wakes up and copies its payload over the bytes
//! of an event that is already published and passes every reader check (the
//! slot is fine, the claim counter has not moved far enough). No check made
//! by that writer *before* copying can close the race, and nothing it does
//! *after* copying can stop a reader that already returned.
//!
//! So the arena is split into up to 16 chunks of `arena_bytes / chunks`
//! bytes, each with one word `lap << 20 | writers`. Logical chunk position
//! `p = offset / chunk_bytes` maps to chunk `p % chunks` at lap
//! `p / chunks`. Before copying, a writer registers in every chunk its bytes
//! touch, in ascending logical order: same lap → increment; older lap with no
//! writer → move the chunk to our lap; older lap with writers → wait for them
//! (they were lapped mid-append, like the slot case); newer lap → our bytes
//! are gone, give up. After copying it leaves (decrement). Hence every writer
//! that ever writes a word of a chunk at lap `l` has finished before any
//! writer at lap `l + 1` starts, and a lapped writer that has not yet
//! registered never writes. The price is two uncontended-in-the-common-case
//! RMWs per chunk touched (one or two for small payloads), and a payload cap
//! of `arena_bytes - chunk_bytes + 8` bytes (a payload must never need one
//! physical chunk at two laps).
//!
//! # Orderings
//!
//! - `head.fetch_add` and `arena_claim.fetch_add`: `Relaxed`. Only atomicity
//!   (unique, dense, disjoint claims) is needed; both are sequenced before
//!   the writer's `fence(Release)`, which is what publishes them.
//! - Taking a slot: CAS `Acquire`, pairing with the previous owner's
//!   `Release` publish, so our header stores come after its stores in every
//!   word's modification order.
//! - `fence(Release)` after taking the slot, before any data store, pairs
//!   with the readers' `fence(Acquire)`: a reader that loads any word we
//!   store then also sees our stamp `2 * seq` (seqlock validation fails) and
//!   our arena claim (claim check fails).
//! - Publish: `stamp.store(2 * seq + 1, Release)` pairs with the reader's
//!   `Acquire` load of the stamp: all our stores happen-before its loads.
//! - Chunks: enter with CAS `AcqRel`, leave with `fetch_sub(Release)`. The
//!   first writer of lap `l + 1` acquires every lap-`l` writer's release,
//!   so their payload stores happen-before its stores.
//! - Readers: header and payload loads `Relaxed`, followed by
//!   `fence(Acquire)` before the re-checks, which can then be `Relaxed`.
//! - No `SeqCst` anywhere: no decision depends on a single total order.
//!
//! # Progress
//!
//! Readers are wait-free: a bounded number of loads, no retry loop. Writers
//! never wait for readers, but they are not strictly lock-free: a writer may
//! wait for an *older* writer that the ring (slot) or the arena (chunk)
//! lapped mid-append, as the slot protocol of the first sketch already did.
//! There is no deadlock: a writer waits on a slot only before it holds
//! anything, and on a chunk only after it holds its slot. A chunk wait for
//! logical position `p` is for writers holding position `p - k * chunks`
//! (`k >= 1`); their own next position is below `p`, since one payload spans
//! at most `chunks` positions. So positions strictly decrease along any chain
//! of waits, which ends at a writer that is copying. (The one exception, a
//! chunk with 2^20 - 1 writers registered at once, is not reachable with
//! real thread counts.)
//!
//! # Other deviations from the first sketch
//!
//! - `head` and `arena_claim` share one `CachePadded` line: every append
//!   bumps both back to back, so a second line would only add a line
//!   transfer per contended append and 128 bytes per idle session (the
//!   budget is 256).
//! - The reader validates the header (fence + stamp re-check) *before* using
//!   its offset and length, so a torn header can never send it copying
//!   gigabytes or report a wrong stream.
//!
//! # Limits
//!
//! `2 * seq + 1` must fit a `u64`, and arena claims are `u64` byte counts:
//! both would take centuries to overflow. `read` answers `Pending` for any
//! `seq` above [`high_water`], so a forged huge cursor is harmless. A chunk
//! word keeps the lap modulo 2^44; a writer descheduled for 2^43 laps
//! (at least 2^49 bytes) may misjudge it, which the claim check after
//! registering turns into a lost event, never a wrong byte.
//!
//! [`append`]: SessionRing::append
//! [`read`]: SessionRing::read
//! [`high_water`]: SessionRing::high_water

use std::fmt;

use crossbeam_utils::CachePadded;

use crate::sync::{fence, AtomicU64, Ordering};

mod arena;
mod config;
mod slot;

#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(all(test, not(loom)))]
mod tests;

use arena::Arena;
use config::{Layout, WORD_BYTES};
pub use config::{RingConfig, RingConfigError};
use slot::{SlotHeader, HEADER_WORDS, LOST_LEN, SLOT_WORDS};

/// Why an append was refused. Nothing was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppendError {
    /// The payload is larger than the ring's arena can ever hold.
    TooLarge {
        /// The refused payload's length in bytes.
        len: usize,
        /// The largest payload this ring accepts ([`SessionRing::max_payload`]).
        max: usize,
    },
}

impl fmt::Display for AppendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AppendError::TooLarge { len, max } => {
                write!(
                    f,
                    "event payload of {len} bytes exceeds the ring's limit of {max} bytes"
                )
            }
        }
    }
}

impl std::error::Error for AppendError {}

/// Metadata of an event read from a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventMeta {
    /// The event's sequence number in its ring (the first is 1).
    pub seq: u64,
    /// The stream the event was appended on.
    pub stream: u32,
    /// The time the appender passed to [`SessionRing::append`].
    pub appended_ms: u64,
    /// Payload length in bytes.
    pub len: usize,
}

/// What reading one sequence number found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotRead {
    /// The event, whose payload was copied into the caller's buffer.
    Event(EventMeta),
    /// The event belongs to another stream; its payload was not copied.
    OtherStream(EventMeta),
    /// Not published yet: either not claimed (beyond the high-water mark) or
    /// claimed by a writer that has not finished.
    Pending,
    /// Overwritten (the ring or the arena lapped it) or lost before publish.
    Overwritten,
}

/// A bounded multi-producer ring of events with a payload arena.
///
/// See the [module docs](self) for the protocol.
pub struct SessionRing {
    /// The two counters every append bumps, back to back. They share one
    /// padded line: a second line would cost an extra line transfer per
    /// contended append and 128 more bytes per idle session.
    cursors: CachePadded<Cursors>,
    /// Slot records, then the chunk table, then the arena; see [`Layout`].
    /// Every word starts at 0.
    words: Box<[AtomicU64]>,
    layout: Layout,
    config: RingConfig,
}

/// The ring's claim counters.
struct Cursors {
    /// Highest sequence number claimed (0 before the first append). Grows by
    /// one per accepted append; `< 2^63`.
    head: AtomicU64,
    /// Logical payload bytes claimed so far: the sum of every accepted
    /// non-empty payload's length rounded up to a word. Only grows; a
    /// multiple of 8. Event bytes at logical offset `o` are intact while
    /// `arena_claim <= o + arena_bytes`.
    arena_claim: AtomicU64,
}

impl fmt::Debug for SessionRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionRing")
            .field("config", &self.config)
            .field("high_water", &self.high_water())
            .field(
                "arena_claim",
                &self.cursors.arena_claim.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

impl SessionRing {
    /// A ring with the given sizes.
    ///
    /// # Panics
    ///
    /// If the config is invalid; use [`RingConfig::validate`] first to
    /// reject it without panicking.
    pub fn new(config: RingConfig) -> SessionRing {
        let layout = match Layout::new(config) {
            Ok(layout) => layout,
            Err(e) => panic!("invalid ring config {config:?}: {e}"),
        };
        let words = (0..layout.total_words).map(|_| AtomicU64::new(0)).collect();
        SessionRing {
            cursors: CachePadded::new(Cursors {
                head: AtomicU64::new(0),
                arena_claim: AtomicU64::new(0),
            }),
            words,
            layout,
            config,
        }
    }

    /// The sizes this ring was made with.
    pub fn config(&self) -> RingConfig {
        self.config
    }

    /// The largest payload [`append`](SessionRing::append) accepts:
    /// `arena_bytes - arena_bytes / min(16, arena_bytes / 8) + 8` (see
    /// "Arena chunks" in the module docs), e.g. 64 for a 64-byte arena and
    /// 61448 for 64 KiB.
    pub fn max_payload(&self) -> usize {
        self.layout.max_payload
    }

    /// Appends an event; returns its sequence number (the first is 1).
    ///
    /// Any number of threads may append concurrently. `Ok(seq)` means `seq`
    /// was consumed; if the ring lapped the event before it could be
    /// written, it is lost and readers see [`SlotRead::Overwritten`].
    pub fn append(
        &self,
        stream: u32,
        appended_ms: u64,
        payload: &[u8],
    ) -> Result<u64, AppendError> {
        let len = payload.len();
        if len > self.layout.max_payload {
            return Err(AppendError::TooLarge {
                len,
                max: self.layout.max_payload,
            });
        }
        let rounded = len.next_multiple_of(WORD_BYTES) as u64;
        let seq = self.cursors.head.fetch_add(1, Ordering::Relaxed) + 1;
        let offset = if rounded == 0 {
            // Stored for completeness only: empty payloads have no bytes.
            self.cursors.arena_claim.load(Ordering::Relaxed)
        } else {
            self.cursors
                .arena_claim
                .fetch_add(rounded, Ordering::Relaxed)
        };
        let stamp = self.stamp(seq);
        if !slot::take(stamp, seq) {
            return Ok(seq);
        }
        // Pairs with the readers' `fence(Acquire)`: whoever loads one of the
        // stores below also sees our stamp and our arena claim.
        fence(Ordering::Release);
        let arena = self.arena();
        let mut header = SlotHeader {
            offset,
            appended_ms,
            stream,
            len: len as u32,
        };
        if rounded == 0 || self.enter_arena(arena, offset, rounded) {
            self.store_header(seq, header);
            arena.write(offset, payload);
            if rounded != 0 {
                arena.leave(offset, rounded);
            }
        } else {
            header.len = LOST_LEN;
            self.store_header(seq, header);
        }
        // Pairs with the readers' `Acquire` load of the stamp.
        stamp.store(slot::published(seq), Ordering::Release);
        Ok(seq)
    }

    /// The highest sequence number claimed so far (0 before the first
    /// append). Claimed is not published: the event may still be `Pending`.
    pub fn high_water(&self) -> u64 {
        // Relaxed: a monotonic counter; coherence already gives every caller
        // a value at least as new as any seq it learned through
        // happens-before.
        self.cursors.head.load(Ordering::Relaxed)
    }

    /// A hint: the oldest sequence number that may still be readable,
    /// `max(1, high_water + 1 - slots)`. Older ones are certainly gone; this
    /// one and newer may be gone too (arena laps, lost appends): [`read`] is
    /// the truth.
    ///
    /// [`read`]: SessionRing::read
    pub fn oldest_retained(&self) -> u64 {
        (self.high_water() + 1)
            .saturating_sub(self.config.slots as u64)
            .max(1)
    }

    /// Reads `seq` and copies the payload into `buf` if the event is on
    /// `stream` (or `stream` is `None`).
    ///
    /// `buf` is cleared first and holds the payload only when this returns
    /// [`SlotRead::Event`]. Never blocks and never spins. `read(0, ..)` is
    /// [`SlotRead::Overwritten`] (sequence numbers start at 1).
    pub fn read(&self, seq: u64, stream: Option<u32>, buf: &mut Vec<u8>) -> SlotRead {
        buf.clear();
        if seq == 0 {
            return SlotRead::Overwritten;
        }
        if seq > self.high_water() {
            return SlotRead::Pending;
        }
        let stamp = self.stamp(seq);
        let published = slot::published(seq);
        // Acquire pairs with the writer's `Release` publish: its header and
        // payload stores happen-before the loads below.
        let seen = stamp.load(Ordering::Acquire);
        if seen <= slot::writing(seq) {
            return SlotRead::Pending;
        }
        if seen != published {
            return SlotRead::Overwritten;
        }
        let header = self.load_header(seq);
        // Pairs with the `fence(Release)` of any newer writer of this slot:
        // if we loaded one of its header words, we now see its stamp.
        fence(Ordering::Acquire);
        if stamp.load(Ordering::Relaxed) != published || header.len == LOST_LEN {
            return SlotRead::Overwritten;
        }
        let meta = EventMeta {
            seq,
            stream: header.stream,
            appended_ms: header.appended_ms,
            len: header.len as usize,
        };
        if stream.is_some_and(|wanted| wanted != header.stream) {
            return SlotRead::OtherStream(meta);
        }
        if meta.len == 0 {
            return SlotRead::Event(meta);
        }
        self.arena().read(header.offset, meta.len, buf);
        // Pairs with the `fence(Release)` of any writer whose bytes we
        // loaded: we now see its arena claim (and its stamp, if it took our
        // slot). Older-lap writers finished before ours started (chunks).
        fence(Ordering::Acquire);
        let claim = self.cursors.arena_claim.load(Ordering::Relaxed);
        if stamp.load(Ordering::Relaxed) != published
            || claim.wrapping_sub(header.offset) > self.layout.arena_bytes
        {
            buf.clear();
            return SlotRead::Overwritten;
        }
        SlotRead::Event(meta)
    }

    /// Bytes of memory this ring holds (slots + chunk table + arena), fixed
    /// at creation. Equals [`SessionRing::memory_bytes_for`] of its config.
    pub fn memory_bytes(&self) -> usize {
        self.layout.memory_bytes()
    }

    /// Bytes of memory a ring with this config would hold (slots + chunk
    /// table + arena): `32 * slots + 8 * min(16, arena_bytes / 8) +
    /// arena_bytes`. For an invalid config (see [`RingConfig::validate`])
    /// returns `usize::MAX`.
    pub fn memory_bytes_for(config: RingConfig) -> usize {
        Layout::new(config).map_or(usize::MAX, |layout| layout.memory_bytes())
    }

    /// Registers in the chunks of `[offset, offset + rounded)`; `false` (and
    /// nothing registered) if the arena already lapped those bytes.
    fn enter_arena(&self, arena: Arena<'_>, offset: u64, rounded: u64) -> bool {
        if !arena.enter(offset, rounded) {
            return false;
        }
        // Readers would reject these bytes anyway, so do not copy them. Also
        // the backstop for `compare_laps` wrapping: whoever moved a chunk to
        // a later lap claimed its bytes before its `AcqRel` CAS, which our
        // `enter` acquired, so Relaxed sees that claim.
        if self
            .cursors
            .arena_claim
            .load(Ordering::Relaxed)
            .wrapping_sub(offset)
            > self.layout.arena_bytes
        {
            arena.leave(offset, rounded);
            return false;
        }
        true
    }

    fn slot_base(&self, seq: u64) -> usize {
        (seq & self.layout.slot_mask) as usize * SLOT_WORDS
    }

    fn stamp(&self, seq: u64) -> &AtomicU64 {
        &self.words[self.slot_base(seq)]
    }

    fn header_words(&self, seq: u64) -> &[AtomicU64] {
        let base = self.slot_base(seq) + 1;
        &self.words[base..base + HEADER_WORDS]
    }

    /// Relaxed: ordered by the caller's fences and stamp accesses.
    fn store_header(&self, seq: u64, header: SlotHeader) {
        for (word, value) in self.header_words(seq).iter().zip(header.to_words()) {
            word.store(value, Ordering::Relaxed);
        }
    }

    /// Relaxed: validated by the caller afterwards.
    fn load_header(&self, seq: u64) -> SlotHeader {
        let mut values = [0u64; HEADER_WORDS];
        for (value, word) in values.iter_mut().zip(self.header_words(seq)) {
            *value = word.load(Ordering::Relaxed);
        }
        SlotHeader::from_words(values)
    }

    fn arena(&self) -> Arena<'_> {
        let chunks = &self.words[self.layout.chunks_base..self.layout.arena_base];
        let words = &self.words[self.layout.arena_base..];
        Arena::new(chunks, words, &self.layout)
    }
}
