//! Slot records: the stamp word and the `Pod` header that follows it.

use bytemuck::{Pod, Zeroable};

use crate::sync::{spin_wait, AtomicU64, Ordering};

/// Header of one event, stored as [`HEADER_WORDS`] atomic words right after
/// the slot's stamp. Plain old data addressed by offsets, so the same layout
/// can live in a memory-mapped file.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub(super) struct SlotHeader {
    /// Logical arena offset of the payload's first byte (bytes appended to the
    /// ring before it, each payload rounded up to a word).
    pub(super) offset: u64,
    /// Caller-supplied append time.
    pub(super) appended_ms: u64,
    /// Stream the event was sent on.
    pub(super) stream: u32,
    /// Payload length in bytes, or [`LOST_LEN`].
    pub(super) len: u32,
}

/// Words per header.
pub(super) const HEADER_WORDS: usize = size_of::<SlotHeader>() / 8;
/// Words per slot record: the stamp, then the header.
pub(super) const SLOT_WORDS: usize = 1 + HEADER_WORDS;

// No padding bytes: the header is exactly its words.
const _: () = assert!(size_of::<SlotHeader>() == HEADER_WORDS * 8);

/// `len` of a slot whose writer published without a payload because the
/// arena lapped it mid-append: readers answer `Overwritten`.
pub(super) const LOST_LEN: u32 = u32::MAX;

impl SlotHeader {
    pub(super) fn to_words(self) -> [u64; HEADER_WORDS] {
        bytemuck::cast(self)
    }

    pub(super) fn from_words(words: [u64; HEADER_WORDS]) -> SlotHeader {
        bytemuck::cast(words)
    }
}

/// Stamp of a slot being written by the writer of `seq`.
pub(super) fn writing(seq: u64) -> u64 {
    2 * seq
}

/// Stamp of a slot holding the published event `seq`.
pub(super) fn published(seq: u64) -> u64 {
    2 * seq + 1
}

/// Takes `stamp` for the writer of `seq`; `false` if a newer sequence number
/// already holds or held the slot (the event is lost).
///
/// Waits while an older writer is still writing the slot: this only happens
/// when the ring laps during that writer's append, and that writer never
/// waits for us (it already holds its slot and only waits on arena chunks of
/// older laps; see "Progress" in the module docs).
pub(super) fn take(stamp: &AtomicU64, seq: u64) -> bool {
    let mine = writing(seq);
    let mut current = stamp.load(Ordering::Relaxed);
    loop {
        if current >= mine {
            return false;
        }
        if current != 0 && current.is_multiple_of(2) {
            spin_wait();
            current = stamp.load(Ordering::Relaxed);
            continue;
        }
        // Acquire pairs with the previous owner's `Release` publish: its
        // header stores happen-before ours, so ours come later in every
        // word's modification order and no reader of our event sees them.
        match stamp.compare_exchange_weak(current, mine, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(actual) => current = actual,
        }
    }
}
